/*
 * bench/bench_restore.c - the restore path through the public API against the disk's best
 * raw read of the same bytes, and against memcpy when the file is in the page cache
 * (bench/disk.sh runs it, part 3).
 *
 *   bench_restore DIR MIB [ROUNDS] [NTENSORS] [full|sharded] [OLD_BENCH_RESTORE]
 *       writes one checkpoint of MIB in NTENSORS float32 tensors (registered with flags 0,
 *       or RK_SHARDED: one rank, so its rows are all the rows) under DIR/ck, then each
 *       round, in an order that rotates by round:
 *         cold: the shard file's pages dropped from the page cache first (every file of
 *               the step directory: fsync then POSIX_FADV_DONTNEED, which needs no root
 *               and leaves the rest of the machine's cache alone)
 *           raw O_DIRECT   4 MiB x 32 through io_uring into a touched, aligned buffer
 *           raw buffered   4 MiB x 32 through io_uring (the page cache's readahead)
 *           raw pread      16 MiB preads one after another (as dd)
 *           rk_resume      in a fresh process (rk_init, rk_register of touched buffers,
 *                          then rk_resume timed alone: the checkpoint's open and
 *                          checks, the staging memory, the reads, the copy out)
 *         warm: the step directory's files read into the page cache first
 *           rk_resume      the same, from the page cache
 *           memcpy         of the same bytes, between two touched buffers
 *         rk_resume inplace cold and warm: rk_resume as above with RK_RESTORE=inplace
 *           (read straight into the registered buffers, rekindle.h)
 *         with OLD_BENCH_RESTORE (an older build's bench_restore): its rk_resume cold
 *           and warm too, as two more ways of the same rounds (interleaved pairs, the
 *           same rotation, the checkpoint this build wrote)
 *       and prints per round cold rk_resume / best raw and warm rk_resume / memcpy (and
 *       the old build's), then their medians and a RESULT line. Every rk_resume's bytes
 *       are compared with what was written (outside the time).
 * GB/s are 1e9 bytes per second; the ratios are of the same bytes (the tensors').
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "raw_uring.h"
#include "rekindle.h"

#define MIB       ((size_t)1 << 20)
#define MAXROUNDS 64

static double now_s(void)
{
    return (double)rk__mono_ns() / 1e9;
}

static void die(const char *what, int e)
{
    fprintf(stderr, "bench_restore: %s: %s\n", what, strerror(e));
    exit(2);
}

static char *make_buf(size_t len, bool fill)
{
    char *b;
    if (posix_memalign((void **)&b, 4096, len ? len : 1))
        die("posix_memalign", ENOMEM);
    for (size_t i = 0; i < len; i++)
        b[i] = fill ? (char)(i * 2654435761u >> 13) : 0;
    return b;
}

/* Every file of the step directory: dropped from the page cache (cold) or read into it. */
static void cache_step(const char *step, bool cold)
{
    DIR *d = opendir(step);
    if (!d)
        die(step, errno);
    struct dirent *de;
    char path[4400];
    char *scratch = cold ? NULL : make_buf(16 * MIB, false);
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", step, de->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            die(path, errno);
        if (cold) {
            fdatasync(fd); /* clean pages only are dropped */
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        } else {
            off_t at = 0;
            ssize_t r;
            while ((r = pread(fd, scratch, 16 * MIB, at)) > 0)
                at += r;
        }
        close(fd);
    }
    closedir(d);
    free(scratch);
}

/* ---- the child processes: the checkpoint written once, and each rk_resume -------------- */

static rk_ctx *open_ctx(const char *dir, char *state, size_t per, int nt, unsigned flags)
{
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    rk_options o;
    rk_options_init(&o);
    o.ckpt_dir = ck;
    o.ckpt_every = 0;
    o.keep = 1;
    rk_ctx *ctx = NULL;
    if (rk_init(&ctx, &o) != 0) {
        fprintf(stderr, "bench_restore: rk_init: %s\n", rk_last_error());
        exit(3);
    }
    for (int i = 0; i < nt; i++) {
        char name[32];
        int64_t shape[2] = {(int64_t)(per / 4096), 1024}; /* rows of 4 KiB */
        snprintf(name, sizeof name, "layer%03d/w", i);
        if (rk_register(ctx, name, state + (size_t)i * per, RK_F32, 2, shape, flags) != 0) {
            fprintf(stderr, "bench_restore: rk_register: %s\n", rk_last_error());
            exit(3);
        }
    }
    return ctx;
}

static int child(int argc, char **argv)
{
    if (argc < 7)
        return 2;
    const char *mode = argv[1], *dir = argv[2];
    size_t per = (size_t)atol(argv[3]);
    int nt = atoi(argv[4]);
    unsigned flags = strcmp(argv[5], "sharded") == 0 ? RK_SHARDED : 0;
    bool cold = strcmp(argv[6], "cold") == 0;
    size_t total = per * (size_t)nt;
    char *state = make_buf(total, strcmp(mode, "write") == 0);
    if (strcmp(mode, "resume-inplace") == 0)
        setenv("RK_RESTORE", "inplace", 1);
    rk_ctx *ctx = open_ctx(dir, state, per, nt, flags);
    if (strcmp(mode, "write") == 0) {
        if (rk_step_done(ctx, 0) != 0 || rk_checkpoint(ctx) != 0 || rk_wait(ctx) != 0) {
            fprintf(stderr, "bench_restore: checkpoint: %s\n", rk_last_error());
            return 3;
        }
    } else {
        char step[4300];
        snprintf(step, sizeof step, "%s/ck/step-000000000001", dir);
        cache_step(step, cold);
        int64_t next = -1;
        double t0 = now_s();
        int rc = rk_resume(ctx, &next);
        double el = now_s() - t0;
        if (rc != 0 || next != 1) {
            fprintf(stderr, "bench_restore: rk_resume: %d (%s), next step %lld\n", rc, rk_last_error(),
                    (long long)next);
            return 3;
        }
        char *want = make_buf(total, true);
        if (memcmp(state, want, total) != 0) {
            fprintf(stderr, "bench_restore: rk_resume restored other bytes than were written\n");
            return 3;
        }
        free(want);
        printf("resume_s=%.6f\n", el);
    }
    rk_finalize(&ctx);
    free(state);
    return 0;
}

/* Runs this program as a child (mode write or resume) and returns what it printed as
   resume_s (0 for write); exits if it failed. */
static double run_child(const char *self, const char *mode, const char *dir, size_t per, int nt,
                        const char *kind, const char *cache)
{
    char sper[32], snt[16];
    snprintf(sper, sizeof sper, "%zu", per);
    snprintf(snt, sizeof snt, "%d", nt);
    int pfd[2];
    if (pipe(pfd) != 0)
        die("pipe", errno);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", errno);
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execl(self, self, "--child", mode, dir, sper, snt, kind, cache, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char out[256] = "";
    size_t len = 0;
    ssize_t r;
    while (len < sizeof out - 1 && (r = read(pfd[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(pfd[0]);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_restore: the %s child failed (status %d)\n", mode, st);
        exit(1);
    }
    const char *v = strstr(out, "resume_s=");
    return v ? atof(v + 9) : 0;
}

/* ---- the parent: the rounds ------------------------------------------------------------ */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double s[MAXROUNDS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

enum way { RAW_DIRECT, RAW_BUFFERED, RAW_PREAD, RESUME_COLD, RESUME_WARM, MEMCPY, IP_COLD, IP_WARM,
           OLD_COLD, OLD_WARM, NWAYS };
static const char *const way_name[NWAYS] = {"raw O_DIRECT",   "raw buffered",   "raw pread",
                                            "rk_resume cold", "rk_resume warm", "memcpy",
                                            "inplace cold",   "inplace warm",
                                            "old rk_resume cold", "old rk_resume warm"};

static double raw_read(const char *step, const char *shard, char *buf, size_t len, enum way w)
{
    cache_step(step, true);
    double t0 = now_s();
    int fd = open(shard, O_RDONLY | (w == RAW_DIRECT ? O_DIRECT : 0));
    if (fd < 0)
        die(shard, errno);
    if (w == RAW_PREAD) {
        for (size_t at = 0; at < len;) {
            ssize_t r = pread(fd, buf + at, len - at < 16 * MIB ? len - at : 16 * MIB, (off_t)at);
            if (r <= 0)
                die("pread", r < 0 ? errno : EIO);
            at += (size_t)r;
        }
    } else {
        raw_xfer(fd, true, buf, len, 32, 4 * MIB);
    }
    close(fd);
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child(argc - 1, argv + 1);
    if (argc < 3) {
        fprintf(stderr, "usage: bench_restore DIR MIB [ROUNDS] [NTENSORS] [full|sharded] [OLD_BENCH_RESTORE]\n");
        return 2;
    }
    const char *dir = argv[1];
    size_t len = (size_t)atol(argv[2]) * MIB;
    int rounds = argc > 3 ? atoi(argv[3]) : 5, nt = argc > 4 ? atoi(argv[4]) : 71;
    const char *kind = argc > 5 ? argv[5] : "full", *old = argc > 6 ? argv[6] : NULL;
    int nways = old ? NWAYS : OLD_COLD;
    if (len == 0 || rounds < 1 || rounds > MAXROUNDS || nt < 1 ||
        (strcmp(kind, "full") != 0 && strcmp(kind, "sharded") != 0)) {
        fprintf(stderr, "bench_restore: MIB > 0, ROUNDS in 1..%d, NTENSORS > 0, full or sharded\n",
                MAXROUNDS);
        return 2;
    }
    size_t per = (len / (size_t)nt) & ~(size_t)4095, total = per * (size_t)nt;
    char self[4096], step[4300], shard[4400];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        die("/proc/self/exe", errno);
    self[sl] = '\0';
    snprintf(step, sizeof step, "%s/ck/step-000000000001", dir);
    snprintf(shard, sizeof shard, "%s/shard-0.h5", step);
    run_child(self, "write", dir, per, nt, kind, "cold");
    char *buf = make_buf(total, false), *dst = make_buf(total, false);
    size_t rawlen = total & ~(size_t)4095; /* the shard's first bytes: as many as the tensors' */
    double gbs[NWAYS][MAXROUNDS], cold[MAXROUNDS], warm[MAXROUNDS], ocold[MAXROUNDS], owarm[MAXROUNDS];
    double icold[MAXROUNDS], iwarm[MAXROUNDS];
    printf("restore: %.2f GiB in %d %s tensors, one rank, %s; GB/s per round (order rotated)\n",
           (double)total / (1 << 30), nt, kind, dir);
    for (int k = 0; k < rounds; k++) {
        for (int j = 0; j < nways; j++) {
            enum way w = (enum way)((j + k) % nways);
            double s;
            if (w == RESUME_COLD || w == RESUME_WARM)
                s = run_child(self, "resume", dir, per, nt, kind, w == RESUME_COLD ? "cold" : "warm");
            else if (w == IP_COLD || w == IP_WARM)
                s = run_child(self, "resume-inplace", dir, per, nt, kind, w == IP_COLD ? "cold" : "warm");
            else if (w == OLD_COLD || w == OLD_WARM)
                s = run_child(old, "resume", dir, per, nt, kind, w == OLD_COLD ? "cold" : "warm");
            else if (w == MEMCPY) {
                double t0 = now_s();
                memcpy(dst, buf, total);
                s = now_s() - t0;
            } else
                s = raw_read(step, shard, buf, rawlen, w);
            gbs[w][k] = (double)total / 1e9 / s;
        }
        double best = gbs[RAW_DIRECT][k];
        for (int w = RAW_BUFFERED; w <= RAW_PREAD; w++)
            best = gbs[w][k] > best ? gbs[w][k] : best;
        cold[k] = gbs[RESUME_COLD][k] / best;
        warm[k] = gbs[RESUME_WARM][k] / gbs[MEMCPY][k];
        icold[k] = gbs[IP_COLD][k] / best;
        iwarm[k] = gbs[IP_WARM][k] / gbs[MEMCPY][k];
        printf("  round %d:", k + 1);
        for (int w = 0; w < nways; w++)
            printf(" %s %.2f%s", way_name[w], gbs[w][k], w < nways - 1 ? "," : ";");
        printf(" cold/best raw %.3f, warm/memcpy %.3f; inplace: %.3f, %.3f", cold[k], warm[k], icold[k], iwarm[k]);
        if (old) {
            ocold[k] = gbs[OLD_COLD][k] / best;
            owarm[k] = gbs[OLD_WARM][k] / gbs[MEMCPY][k];
            printf("; old: cold/best raw %.3f, warm/memcpy %.3f", ocold[k], owarm[k]);
        }
        printf("\n");
        fflush(stdout);
    }
    printf("  median:");
    for (int w = 0; w < nways; w++)
        printf(" %s %.2f%s", way_name[w], median(gbs[w], rounds), w < nways - 1 ? "," : ";");
    printf(" cold rk_resume/best raw %.3f, warm rk_resume/memcpy %.3f; inplace: cold/best raw %.3f, warm/memcpy %.3f",
           median(cold, rounds), median(warm, rounds), median(icold, rounds), median(iwarm, rounds));
    if (old)
        printf("; old: cold rk_resume/best raw %.3f, warm rk_resume/memcpy %.3f", median(ocold, rounds),
               median(owarm, rounds));
    printf("\n");
    printf("RESULT kind=%s cold_ratio=%.3f warm_ratio=%.3f resume_cold_gbs=%.3f resume_warm_gbs=%.3f "
           "raw_direct_gbs=%.3f raw_buffered_gbs=%.3f raw_pread_gbs=%.3f memcpy_gbs=%.3f inplace_cold_ratio=%.3f "
           "inplace_warm_ratio=%.3f inplace_cold_gbs=%.3f inplace_warm_gbs=%.3f\n",
           kind, median(cold, rounds), median(warm, rounds), median(gbs[RESUME_COLD], rounds),
           median(gbs[RESUME_WARM], rounds), median(gbs[RAW_DIRECT], rounds),
           median(gbs[RAW_BUFFERED], rounds), median(gbs[RAW_PREAD], rounds), median(gbs[MEMCPY], rounds),
           median(icold, rounds), median(iwarm, rounds), median(gbs[IP_COLD], rounds), median(gbs[IP_WARM], rounds));
    free(buf);
    free(dst);
    return 0;
}
