/*
 * bench/bench_zero.c - rebuild of a lost rank's shard of a sharded tensor, from the
 * survivors' memory or from disk (bench/zero.sh runs it under `rekindle run -n 4`).
 *
 *   bench_zero MIB VICTIM [drop]
 *
 * Every rank registers its MIB MiB slice (f32 rows of 4 KiB) of one RK_SHARDED tensor
 * "optim/m", ends two steps (a snapshot each, as a training loop holds them from its second
 * step on: both generations with their partner copies), takes one checkpoint (RK_CKPT_DIR,
 * RK_CKPT_EVERY=0 here) and waits for it to commit. With "drop", rank 0 then drops the page cache (root: /proc/sys/vm/drop_caches).
 * After a barrier rank VICTIM prints "kill_ns=T" (CLOCK_REALTIME) and SIGKILLs itself; every
 * survivor's next rk_allreduce returns RK_RECOVERED (from memory, or from disk under
 * RK_ROLLBACK=disk), it learns its new slice (rk_shard_rows), takes it with rk_rebind into a
 * new buffer, checks one word in every 4 KiB of it, and prints
 *   "survivor R recovered_ns=T rebound_ns=T rows=N hwm=B hwm_before=B ok|BAD" (hwm: its peak
 *   resident set, VmHWM, in bytes; hwm_before: the same before the loss).
 * The new rank 0 then reads the lost rank's shard file of the committed checkpoint with
 * O_DIRECT (4 MiB requests; after dropping the cache again with "drop") and prints
 *   "raw_read bytes=B s=S": the disk's limit for re-reading the lost piece alone.
 * The survivors' event log (RK_EVENT_LOG) has peer_dead, ring_rebuilt and resumed.
 * Exit: 0 ok, 3 an rk_* call failed, 4 wrong data.
 */
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rekindle.h"

enum { ROW_F32 = 1024 }; /* 4 KiB rows */

static int64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Word i (of 8 bytes) of the global tensor. */
static uint64_t word_at(uint64_t i)
{
    uint64_t x = i + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "bench_zero: %s: %s: %s\n", what, rk_strerror(rc), rk_last_error());
    return 3;
}

static long long vm_hwm(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kb = strtoll(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb * 1024;
}

static void drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0 || write(fd, "3", 1) != 1)
        fprintf(stderr, "bench_zero: cannot drop the page cache (not root?)\n");
    if (fd >= 0)
        close(fd);
}

/* O_DIRECT read of the lost rank's shard file; seconds, or -1. */
static double raw_read_shard(const char *dir, int lost, size_t *bytes)
{
    char pat[4200];
    snprintf(pat, sizeof(pat), "%s/step-*/shard-%d.h5", dir, lost);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc == 0)
        return -1;
    int fd = open(g.gl_pathv[g.gl_pathc - 1], O_RDONLY | O_DIRECT);
    globfree(&g);
    if (fd < 0)
        return -1;
    size_t chunk = 4u << 20;
    char *buf;
    if (posix_memalign((void **)&buf, 4096, chunk)) {
        close(fd);
        return -1;
    }
    int64_t t0 = real_ns();
    ssize_t n;
    *bytes = 0;
    while ((n = pread(fd, buf, chunk, (off_t)*bytes)) > 0)
        *bytes += (size_t)n;
    double s = (double)(real_ns() - t0) / 1e9;
    close(fd);
    free(buf);
    return n < 0 ? -1 : s;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_zero MIB VICTIM [drop]\n");
        return 2;
    }
    int64_t rows = (int64_t)atol(argv[1]) * 256;
    int victim = atoi(argv[2]);
    int drop = argc > 3 && strcmp(argv[3], "drop") == 0;
    const char *dir = getenv("RK_CKPT_DIR");
    if (!dir) {
        fprintf(stderr, "bench_zero: RK_CKPT_DIR must be set\n");
        return 2;
    }
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o);
    if (rc)
        return fail("rk_init", rc);
    int r = rk_rank(ctx), status = 0;
    size_t row_bytes = ROW_F32 * sizeof(float);
    uint64_t *buf = malloc((size_t)rows * row_bytes);
    if (!buf)
        return 3;
    uint64_t w0 = (uint64_t)r * (uint64_t)rows * row_bytes / 8, nw = (size_t)rows * row_bytes / 8;
    for (uint64_t i = 0; i < nw; i++)
        buf[i] = word_at(w0 + i);
    int64_t shape[2] = {rows, ROW_F32};
    double one = 1;
    if ((rc = rk_register(ctx, "optim/m", buf, RK_F32, 2, shape, RK_SHARDED)) != 0)
        return fail("rk_register", rc);
    if ((rc = rk_step_done(ctx, 0)) < 0 || (rc = rk_step_done(ctx, 1)) < 0 || (rc = rk_checkpoint(ctx)) != 0 ||
        (rc = rk_wait(ctx)) != 0)
        return fail("checkpoint", rc);
    long long hwm_before = vm_hwm();
    if (drop && r == 0)
        drop_caches();
    if ((rc = rk_allreduce(ctx, &one, 1, RK_F64, RK_SUM)) != 0)
        return fail("barrier", rc);
    if (r == victim) {
        printf("kill_ns=%" PRId64 "\n", real_ns());
        fflush(NULL);
        raise(SIGKILL);
    }
    rc = rk_allreduce(ctx, &one, 1, RK_F64, RK_SUM);
    int64_t t_rec = real_ns();
    if (rc != RK_RECOVERED)
        return fail("the allreduce after the loss (want RK_RECOVERED)", rc);
    int64_t off, nrows;
    if ((rc = rk_shard_rows(ctx, "optim/m", &off, &nrows, NULL)) != 0)
        return fail("rk_shard_rows", rc);
    uint64_t *nb = malloc((size_t)nrows * row_bytes + 1);
    if (!nb || (rc = rk_rebind(ctx, "optim/m", nb)) != 0)
        return fail("rk_rebind", nb ? rc : -12);
    int64_t t_bound = real_ns();
    free(buf);
    w0 = (uint64_t)off * row_bytes / 8;
    nw = (size_t)nrows * row_bytes / 8;
    for (uint64_t i = 0; i < nw && !status; i += 512)
        if (nb[i] != word_at(w0 + i))
            status = 4;
    printf("survivor %d recovered_ns=%" PRId64 " rebound_ns=%" PRId64 " rows=%" PRId64
           " hwm=%lld hwm_before=%lld %s\n",
           rk_rank(ctx), t_rec, t_bound, nrows, vm_hwm(), hwm_before, status ? "BAD" : "ok");
    fflush(NULL);
    if (rk_rank(ctx) == 0) {
        if (drop)
            drop_caches();
        size_t bytes = 0;
        double s = raw_read_shard(dir, victim, &bytes);
        printf("raw_read bytes=%zu s=%.4f\n", bytes, s);
    }
    if ((rc = rk_finalize(&ctx)) != 0 && !status)
        status = fail("rk_finalize", rc);
    free(nb);
    return status;
}
