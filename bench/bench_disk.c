/*
 * bench/bench_disk.c - the checkpoint directory's disk measured the way fio would, and the
 * write path through the public API against it in the same process (bench/disk.sh runs it).
 *
 *   bench_disk matrix DIR MIB [ROUNDS]
 *       every block size {1,4,16 MiB} x queue depth {1,8,32} x {O_DIRECT, buffered}:
 *       MIB of writes through io_uring to a new file, ended by fdatasync (the time runs from
 *       open to the end of fdatasync, as fio's end_fsync=1), then a cold read of it (page
 *       cache dropped first: echo 3 > /proc/sys/vm/drop_caches, root only; said if not);
 *       the order of the 18 cells rotates each round; the median of the rounds per cell.
 *       Then 4 MiB x 32 O_DIRECT on a file made ahead three ways (none, ftruncate to the
 *       final size, fallocate) and an overwrite of a file already written.
 *   bench_disk persist DIR MIB [ROUNDS] [NTENSORS]
 *       rk_init / rk_register (NTENSORS float32 tensors, MIB in all) / rk_step_done /
 *       rk_checkpoint + rk_wait (persist) / rk_finalize on one rank, RK_IO from the
 *       environment; each round also writes the same bytes raw at 4 MiB x 32, O_DIRECT and
 *       buffered (pwrite, as dd) + fdatasync, in a rotating order. Prints per round
 *       persist/best raw, the stall (rk_checkpoint: the copy into staging, ckpt/) and the
 *       write after it (formats/ and the commit) against the same best raw, and a RESULT
 *       line with the medians.
 * GB/s are 1e9 bytes per second.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "raw_uring.h"
#include "rekindle.h"

#define MIB       ((size_t)1 << 20)
#define MAXROUNDS 64

enum prep { PREP_NONE, PREP_TRUNC, PREP_FALLOC, PREP_OVER };
static const char *const prep_name[] = {"new file", "ftruncate first", "fallocate first", "overwrite"};

static double now_s(void)
{
    return (double)rk__mono_ns() / 1e9;
}

static void die(const char *what, int e)
{
    fprintf(stderr, "bench_disk: %s: %s\n", what, strerror(e));
    exit(2);
}

enum way { W_DIRECT, W_BUFFERED, W_DD, W_LEAN };

/* pwrite of bs pieces; lean: sync_file_range(WRITE) every 32 MiB written, and the pages
   dropped from the cache after the fdatasync (what dd conv=fdatasync does, and less). */
static void pwrite_all(int fd, const char *buf, size_t len, size_t bs, bool lean)
{
    size_t synced = 0;
    for (size_t pos = 0; pos < len;) {
        size_t n = len - pos < bs ? len - pos : bs;
        ssize_t w = pwrite(fd, buf + pos, n, (off_t)pos);
        if (w <= 0)
            die("pwrite", w < 0 ? errno : EIO);
        pos += (size_t)w;
        if (lean && pos - synced >= 32 * MIB) {
            sync_file_range(fd, (off_t)synced, (off_t)(pos - synced), SYNC_FILE_RANGE_WRITE);
            synced = pos;
        }
    }
}

/* Seconds from open to the end of fdatasync. */
static double write_file(const char *path, char *buf, size_t len, size_t bs, unsigned qd, enum way w,
                         enum prep p)
{
    bool direct = w == W_DIRECT;
    if (p != PREP_OVER)
        unlink(path);
    double t0 = now_s();
    int fd = open(path, O_WRONLY | O_CREAT | (p == PREP_OVER ? 0 : O_TRUNC) | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0)
        die(direct ? "open O_DIRECT (refused by this file system?)" : "open", errno);
    if (p == PREP_TRUNC && ftruncate(fd, (off_t)len) != 0)
        die("ftruncate", errno);
    if (p == PREP_FALLOC && (errno = posix_fallocate(fd, 0, (off_t)len)) != 0)
        die("posix_fallocate", errno);
    if (w == W_DD || w == W_LEAN)
        pwrite_all(fd, buf, len, bs, w == W_LEAN);
    else
        raw_xfer(fd, false, buf, len, qd, bs);
    if (fdatasync(fd) != 0)
        die("fdatasync", errno);
    if (w == W_LEAN)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return now_s() - t0;
}

static bool drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    bool ok = fd >= 0 && write(fd, "3\n", 2) == 2;
    if (fd >= 0)
        close(fd);
    return ok;
}

static double read_file(const char *path, char *buf, size_t len, size_t bs, unsigned qd, bool direct,
                        bool *cold)
{
    *cold = drop_caches();
    double t0 = now_s();
    int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0)
        die("open for read", errno);
    raw_xfer(fd, true, buf, len, qd, bs);
    close(fd);
    return now_s() - t0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static char *make_buf(size_t len)
{
    char *b;
    if (posix_memalign((void **)&b, 4096, len))
        die("posix_memalign", ENOMEM);
    for (size_t i = 0; i < len; i++)
        b[i] = (char)(i * 2654435761u >> 13);
    return b;
}

static int matrix(const char *dir, size_t len, int rounds)
{
    static const size_t bss[] = {1, 4, 16};
    static const unsigned qds[] = {1, 8, 32};
    enum { NC = 18 };
    double w[NC][MAXROUNDS], r[NC][MAXROUNDS], pw[4][MAXROUNDS], pb[2][MAXROUNDS];
    char path[4200];
    snprintf(path, sizeof path, "%s/disk.bin", dir);
    char *buf = make_buf(len);
    bool cold = true, c;
    for (int k = 0; k < rounds; k++) {
        for (int j = 0; j < NC; j++) {
            int i = (j + k * 7) % NC; /* rotate: a burst's slowdown lands on other cells */
            size_t bs = bss[i / 6] * MIB;
            unsigned qd = qds[i / 2 % 3];
            bool direct = i % 2 == 0;
            w[i][k] = (double)len / 1e9 /
                      write_file(path, buf, len, bs, qd, direct ? W_DIRECT : W_BUFFERED, PREP_FALLOC);
            r[i][k] = (double)len / 1e9 / read_file(path, buf, len, bs, qd, direct, &c);
            cold = cold && c;
        }
        for (int j = 0; j < 4; j++) {
            int p = (j + k) % 4;
            if (p == PREP_OVER) /* a file already there, written whole */
                write_file(path, buf, len, 4 * MIB, 32, W_DIRECT, PREP_TRUNC);
            pw[p][k] = (double)len / 1e9 / write_file(path, buf, len, 4 * MIB, 32, W_DIRECT, (enum prep)p);
        }
        for (int j = 0; j < 2; j++) {
            int v = (j + k) % 2;
            pb[v][k] =
                (double)len / 1e9 / write_file(path, buf, len, 4 * MIB, 1, v ? W_LEAN : W_DD, PREP_NONE);
        }
    }
    unlink(path);
    printf("disk: %s, %.2f GiB per file, median of %d rounds (order rotated), io_uring, files fallocated "
           "first (as fio), GB/s\n",
           dir, (double)len / (1 << 30), rounds);
    printf("  %-9s %-6s %-8s %12s %12s\n", "block", "depth", "mode", "write+fsync",
           cold ? "cold read" : "read (WARM)");
    double bw = 0, br = 0;
    int iw = 0, ir = 0;
    for (int i = 0; i < NC; i++) {
        double mw = median(w[i], rounds), mr = median(r[i], rounds);
        printf("  %3zu MiB   %-6u %-8s %12.2f %12.2f\n", bss[i / 6], qds[i / 2 % 3],
               i % 2 == 0 ? "O_DIRECT" : "buffered", mw, mr);
        if (mw > bw)
            bw = mw, iw = i;
        if (mr > br)
            br = mr, ir = i;
    }
    printf("  best write %.2f GB/s (%zu MiB x %u, %s, fdatasync at the end)\n", bw, bss[iw / 6],
           qds[iw / 2 % 3], iw % 2 == 0 ? "O_DIRECT" : "buffered");
    printf("  best read  %.2f GB/s (%zu MiB x %u, %s, %s)\n", br, bss[ir / 6], qds[ir / 2 % 3],
           ir % 2 == 0 ? "O_DIRECT" : "buffered",
           cold ? "page cache dropped before each" : "page cache NOT dropped (not root): warm reads");
    printf("  4 MiB x 32 O_DIRECT, the file made ahead:");
    for (int p = 0; p < 4; p++)
        printf(" %s %.2f%s", prep_name[p], median(pw[p], rounds), p < 3 ? "," : "\n");
    printf("  4 MiB pwrite, buffered: dd-like (then fdatasync) %.2f, lean (sync_file_range every 32 MiB, "
           "fdatasync, FADV_DONTNEED) %.2f\n",
           median(pb[0], rounds), median(pb[1], rounds));
    printf("RESULT best_write_gbs=%.3f best_read_gbs=%.3f\n", bw, br);
    free(buf);
    return 0;
}

static int persist(const char *dir, size_t len, int rounds, int nt)
{
    size_t per = (len / (size_t)nt) & ~(size_t)3, total = per * (size_t)nt;
    char *state = make_buf(len);
    char raw[4200], ck[4200];
    snprintf(raw, sizeof raw, "%s/raw.bin", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    rk_options o;
    rk_options_init(&o); /* RK_IO from the environment */
    o.ckpt_dir = ck;
    o.ckpt_every = 0;
    o.keep = 1;
    rk_ctx *ctx = NULL;
    if (rk_init(&ctx, &o) != 0) {
        fprintf(stderr, "bench_disk: rk_init: %s\n", rk_last_error());
        return 3;
    }
    for (int i = 0; i < nt; i++) {
        char name[32];
        int64_t shape = (int64_t)(per / 4);
        snprintf(name, sizeof name, "layer%03d/w", i);
        rk_register(ctx, name, state + (size_t)i * per, RK_F32, 1, &shape, 0);
    }
    /* the first checkpoints allocate and touch the staging regions (a generation each,
       two or three); later ones are measured */
    int64_t step = 0;
    for (int i = 0; i < 3; i++)
        if (rk_step_done(ctx, step++) != 0 || rk_checkpoint(ctx) != 0 || rk_wait(ctx) != 0) {
            fprintf(stderr, "bench_disk: first checkpoints: %s\n", rk_last_error());
            return 3;
        }
    double t[3][MAXROUNDS], ratio[MAXROUNDS], stall[MAXROUNDS], wr[MAXROUNDS], wratio[MAXROUNDS];
    const char *io = getenv("RK_IO");
    printf("persist: %.2f GiB in %d tensors, RK_IO=%s, GB/s per round (order rotated)\n",
           (double)total / (1 << 30), nt, io && *io ? io : "auto");
    for (int k = 0; k < rounds; k++) {
        for (int j = 0; j < 3; j++) {
            int m = (j + k) % 3;
            if (m == 2) {
                rk_step_done(ctx, step++);
                double t0 = now_s();
                int rc = rk_checkpoint(ctx);
                stall[k] = now_s() - t0;
                if (rc != 0 || rk_wait(ctx) != 0) {
                    fprintf(stderr, "bench_disk: checkpoint: %s\n", rk_last_error());
                    return 3;
                }
                double el = now_s() - t0;
                t[2][k] = (double)total / 1e9 / el;
                wr[k] = (double)total / 1e9 / (el - stall[k]); /* after rk_checkpoint returned */
            } else {
                /* the same bytes rounded up to a page (O_DIRECT), the file sized first */
                size_t n = (total + 4095) & ~(size_t)4095;
                t[m][k] = (double)total / 1e9 /
                          write_file(raw, state, n, 4 * MIB, 32, m == 0 ? W_DIRECT : W_DD,
                                     m == 0 ? PREP_TRUNC : PREP_NONE);
                unlink(raw);
            }
        }
        double best = t[0][k] > t[1][k] ? t[0][k] : t[1][k];
        ratio[k] = t[2][k] / best;
        wratio[k] = wr[k] / best;
        printf(
            "  round %d: raw O_DIRECT %.2f, raw buffered %.2f, persist %.2f = %.3f x best raw; stall %.3f s, "
            "write after it %.2f = %.3f x best raw\n",
            k + 1, t[0][k], t[1][k], t[2][k], ratio[k], stall[k], wr[k], wratio[k]);
    }
    double md = median(t[0], rounds), mb = median(t[1], rounds), mp = median(t[2], rounds);
    double mr = median(ratio, rounds), ms = median(stall, rounds), mw = median(wr, rounds),
           mwr = median(wratio, rounds);
    printf(
        "  median: raw O_DIRECT %.2f, raw buffered %.2f, persist %.2f; persist/best raw %.3f; stall %.3f s; "
        "write after the stall %.2f = %.3f x best raw\n",
        md, mb, mp, mr, ms, mw, mwr);
    printf("RESULT persist_gbs=%.3f raw_direct_gbs=%.3f raw_buffered_gbs=%.3f ratio=%.3f stall_s=%.3f "
           "write_gbs=%.3f "
           "write_ratio=%.3f\n",
           mp, md, mb, mr, ms, mw, mwr);
    rk_finalize(&ctx);
    free(state);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "matrix") != 0 && strcmp(argv[1], "persist") != 0)) {
        fprintf(stderr, "usage: bench_disk matrix DIR MIB [ROUNDS] | persist DIR MIB [ROUNDS] [NTENSORS]\n");
        return 2;
    }
    size_t len = (size_t)atol(argv[3]) * MIB;
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (len == 0 || rounds < 1 || rounds > MAXROUNDS) {
        fprintf(stderr, "bench_disk: MIB must be > 0 and ROUNDS in 1..%d\n", MAXROUNDS);
        return 2;
    }
    if (strcmp(argv[1], "matrix") == 0)
        return matrix(argv[2], len, rounds);
    int nt = argc > 5 ? atoi(argv[5]) : 71;
    return persist(argv[2], len, rounds, nt > 0 ? nt : 71);
}
