/*
 * bench/bench_snapshot_cuda.c - a snapshot of device state against its physical limit, the
 * bare copy of the same bytes into pinned host memory (PCIe), in the same run, on one GPU.
 *   bench_snapshot_cuda SIZE [TENSORS]      SIZE: 1G, 4G, 16G, 512M ...; TENSORS (8): the
 *                                           state split as a model's is, into equal tensors
 * Through the public API on one process: RK_CKPT_DIR a fresh temporary directory,
 * checkpoints off (ckpt_every 0), a snapshot held in memory at every step
 * (snapshot_every 1), the tensors registered with RK_DEVICE, the program's work on the
 * legacy default stream (rk_options.cuda_stream NULL). It measures
 *   bare       cudaMemcpyAsync of every tensor into one cudaHostAlloc'd buffer, until done;
 *              best of 3 after a warm-up
 *   first      the first two snapshots (rk_step_done + rk_before_update): each maps its
 *              generation of staging and pins it (cudaHostRegister); a one-time cost
 *   stall      the time inside rk_step_done: what training waits for when the copy
 *              overlaps its next forward and backward passes
 *   to staging from rk_step_done's call until rk_before_update, called at once, returns:
 *              the copy itself (nothing overlaps it); best of 3 against the bare copy's best
 *   overlapped rk_step_done, then GPU work queued on the legacy stream for about 1.5 times
 *              the bare copy (cudaMemsetAsync of a scratch buffer, as a forward and backward
 *              pass would keep the device busy) and waited for, then rk_before_update: the
 *              time inside it should be ~0, and the work as fast as alone
 * Every wait on the device is polled with a deadline (never a blocking synchronize). The
 * event log must show every snapshot taken and none failed.
 * Prints one line per size and a RESULT line for bench/snapshot_cuda.sh. Exit 0 measured,
 * 77 skipped (no CUDA device: the line says why), 3 this size does not fit (the line says
 * why), 1 failed (the line says what), 2 usage.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "rekindle.h"

#define MAX_TENSORS 64
#define REPS        3

static char g_size[32]; /* "4 GiB": the prefix of every line */
static char g_dir[4096]; /* the temporary RK_CKPT_DIR, once made */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void nap_us(long us)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
    nanosleep(&ts, NULL);
}

static void remove_dir(void)
{
    char rm[4200];
    snprintf(rm, sizeof(rm), "rm -rf '%s'", g_dir);
    if (g_dir[0] && system(rm) != 0)
        fprintf(stderr, "snapshot_cuda: could not remove %s\n", g_dir);
    g_dir[0] = '\0';
}

static void fail(const char *what, const char *why)
{
    printf("snapshot_cuda: %s: FAILED: %s: %s\n", g_size, what, why);
    fflush(stdout);
    remove_dir();
    exit(1); /* the process's end releases the device */
}

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fail(what, cudaGetErrorString(e));
}

static void check_rk(int rc, const char *what)
{
    if (rc < 0) {
        char why[600];
        snprintf(why, sizeof(why), "%s (%s)", rk_strerror(rc), rk_last_error());
        fail(what, why);
    }
}

/* Polls ev until it completes, at most limit_ms: a device that stopped answering fails the
   run with a message instead of hanging it. */
static void wait_event(cudaEvent_t ev, double limit_ms, const char *what)
{
    double t0 = now_ms();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            fail(what, cudaGetErrorString(e));
        if (now_ms() - t0 > limit_ms) {
            char why[64];
            snprintf(why, sizeof(why), "not done after %.0f ms", limit_ms);
            fail(what, why);
        }
        nap_us(20);
    }
}

static double best(const double *v, int n)
{
    double b = v[0];
    for (int i = 1; i < n; i++)
        b = v[i] < b ? v[i] : b;
    return b;
}

static double worst(const double *v, int n)
{
    double w = v[0];
    for (int i = 1; i < n; i++)
        w = v[i] > w ? v[i] : w;
    return w;
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb << 10;
}

/* The bytes of SIZE: "16G", "4g", "512M", "1GiB"; 0 if it is none. */
static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || v == 0)
        return 0;
    if (*end == 'G' || *end == 'g')
        v <<= 30;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    else
        return 0;
    return strcmp(end + 1, "") == 0 || strcmp(end + 1, "iB") == 0 || strcmp(end + 1, "B") == 0 ? (uint64_t)v : 0;
}

/* Counts "snapshot_failed" events and the `taken` of the "snapshots" event in the log. */
static void scan_events(const char *path, int *failed, long *taken)
{
    *failed = 0;
    *taken = -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        if (strstr(line, "\"snapshot_failed\"")) {
            ++*failed;
            printf("snapshot_cuda: %s: event: %s", g_size, line);
        }
        const char *t = strstr(line, "\"taken\": ");
        if (strstr(line, "\"snapshots\"") && t)
            *taken = atol(t + 9);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t total = argc > 1 ? parse_size(argv[1]) : 0;
    int nt = argc > 2 ? atoi(argv[2]) : 8;
    if (argc < 2 || argc > 3 || !total || nt < 1 || nt > MAX_TENSORS) {
        fprintf(stderr, "usage: bench_snapshot_cuda SIZE [TENSORS]   (SIZE: 1G, 4G, 16G, 512M; TENSORS 1..%d, "
                        "default 8)\n", MAX_TENSORS);
        return 2;
    }
    if (total >= (1ull << 30) && total % (1ull << 30) == 0)
        snprintf(g_size, sizeof(g_size), "%llu GiB", (unsigned long long)(total >> 30));
    else
        snprintf(g_size, sizeof(g_size), "%llu MiB", (unsigned long long)(total >> 20));
    uint64_t per = total / (uint64_t)nt / 256 * 256; /* each tensor a whole number of f32, aligned */
    total = per * (uint64_t)nt;

    /* ---- the device ---------------------------------------------------------------- */
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        printf("snapshot_cuda: skipped: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "the runtime sees none");
        return 77;
    }
    double t0 = now_ms();
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaFree(NULL), "creating the CUDA context");
    struct cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    size_t dev_free = 0, dev_total = 0;
    check(cudaMemGetInfo(&dev_free, &dev_total), "cudaMemGetInfo");
    printf("snapshot_cuda: %s: device 0 %s (PCI %04x:%02x:%02x), %.1f of %.1f GiB free, context in %.0f ms; %d "
           "tensors of %.1f MiB\n",
           g_size, prop.name, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID, dev_free / 1073741824.0,
           dev_total / 1073741824.0, now_ms() - t0, nt, per / 1048576.0);
    uint64_t scratch_n = total < (1ull << 30) ? total : (1ull << 30);
    uint64_t need_dev = total + scratch_n + (256ull << 20), need_host = 2 * total + (2ull << 30),
             avail = host_available();
    if (need_dev > dev_free) {
        printf("snapshot_cuda: %s: skipped: needs %.1f GiB of device memory, %.1f GiB free\n", g_size,
               need_dev / 1073741824.0, dev_free / 1073741824.0);
        return 3;
    }
    if (avail && need_host > avail) {
        printf("snapshot_cuda: %s: skipped: needs %.1f GiB of host memory (two generations of staging), %.1f GiB "
               "available\n", g_size, need_host / 1073741824.0, avail / 1073741824.0);
        return 3;
    }
    /* A deadline for every wait: a copy at 1 GB/s, far below any PCIe link, plus 10 s. */
    double limit_ms = 10000.0 + (double)total / 1e6;

    void *dev[MAX_TENSORS];
    for (int i = 0; i < nt; i++) {
        check(cudaMalloc(&dev[i], per), "cudaMalloc of a tensor");
        check(cudaMemsetAsync(dev[i], i + 1, per, NULL), "cudaMemsetAsync of a tensor");
    }
    void *scratch;
    check(cudaMalloc(&scratch, scratch_n), "cudaMalloc of the scratch buffer");
    cudaEvent_t ev;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ev, NULL), "cudaEventRecord");
    wait_event(ev, limit_ms, "filling the tensors");

    /* ---- bare: the same bytes into one pinned buffer --------------------------------- */
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    t0 = now_ms();
    char *host;
    check(cudaHostAlloc((void **)&host, total, cudaHostAllocDefault), "cudaHostAlloc of the bare copy's buffer");
    double alloc_ms = now_ms() - t0;
    double bare[REPS + 1];
    for (int r = 0; r <= REPS; r++) { /* r 0: the warm-up */
        t0 = now_ms();
        for (int i = 0; i < nt; i++)
            check(cudaMemcpyAsync(host + (uint64_t)i * per, dev[i], per, cudaMemcpyDeviceToHost, s),
                  "bare cudaMemcpyAsync D2H");
        check(cudaEventRecord(ev, s), "cudaEventRecord");
        wait_event(ev, limit_ms, "the bare D2H copy");
        bare[r] = now_ms() - t0;
    }
    for (int i = 0; i < nt; i++)
        if (host[(uint64_t)i * per] != (char)(i + 1) || host[(uint64_t)i * per + per - 1] != (char)(i + 1))
            fail("the bare copy", "the bytes copied are not the tensor's");
    check(cudaFreeHost(host), "cudaFreeHost"); /* staging needs the memory */
    double bare_ms = best(bare + 1, REPS), gbs = (double)total / bare_ms / 1e6;
    printf("snapshot_cuda: %s: bare D2H into cudaHostAlloc'd memory: best %.1f ms (%.1f GB/s), worst %.1f ms, "
           "warm-up %.1f ms; cudaHostAlloc %.0f ms\n",
           g_size, bare_ms, gbs, worst(bare + 1, REPS), bare[0], alloc_ms);

    /* ---- the GPU work that models a forward and backward pass ------------------------- */
    double one[REPS];
    for (int r = 0; r < REPS; r++) {
        t0 = now_ms();
        check(cudaMemsetAsync(scratch, r, scratch_n, NULL), "cudaMemsetAsync of the scratch buffer");
        check(cudaEventRecord(ev, NULL), "cudaEventRecord");
        wait_event(ev, limit_ms, "a memset of the scratch buffer");
        one[r] = now_ms() - t0;
    }
    int nwork = (int)(1.5 * bare_ms / best(one, REPS)) + 1;
    nwork = nwork > 100000 ? 100000 : nwork;
    double work_alone[REPS];
    for (int r = 0; r < REPS; r++) {
        t0 = now_ms();
        for (int k = 0; k < nwork; k++)
            check(cudaMemsetAsync(scratch, k, scratch_n, NULL), "cudaMemsetAsync of the scratch buffer");
        check(cudaEventRecord(ev, NULL), "cudaEventRecord");
        wait_event(ev, limit_ms + 3 * bare_ms, "the GPU work alone");
        work_alone[r] = now_ms() - t0;
    }

    /* ---- Rekindle ---------------------------------------------------------------------- */
    const char *tmp = getenv("TMPDIR");
    char dir[4096], evlog[4200], evfile[4300];
    snprintf(dir, sizeof(dir), "%s/rk-bench-snapcuda.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        fail("a temporary directory", strerror(errno));
    snprintf(g_dir, sizeof(g_dir), "%s", dir);
    snprintf(evlog, sizeof(evlog), "%s/ev", dir);
    snprintf(evfile, sizeof(evfile), "%s.0", evlog);
    rk_options o;
    rk_options_init(&o);
    o.ckpt_dir = dir;
    o.ckpt_every = 0;
    o.snapshot_every = 1;
    o.event_log = evlog;
    o.cuda_stream = NULL;
    rk_ctx *ctx = NULL;
    check_rk(rk_init(&ctx, &o), "rk_init");
    for (int i = 0; i < nt; i++) {
        char name[64];
        snprintf(name, sizeof(name), "layer%02d.weight", i);
        int64_t shape[1] = {(int64_t)(per / 4)};
        check_rk(rk_register(ctx, name, dev[i], RK_F32, 1, shape, RK_DEVICE), "rk_register RK_DEVICE");
    }
    int64_t step = 0;
    check_rk(rk_resume(ctx, &step), "rk_resume");
    double first[2], stall[REPS], staging[REPS], ostall[REPS], owait[REPS], owork[REPS];
    for (int r = 0; r < 2; r++, step++) { /* each maps and pins one generation of staging */
        t0 = now_ms();
        check_rk(rk_step_done(ctx, step), "rk_step_done");
        check_rk(rk_before_update(ctx), "rk_before_update");
        first[r] = now_ms() - t0;
    }
    for (int r = 0; r < REPS; r++, step++) {
        t0 = now_ms();
        check_rk(rk_step_done(ctx, step), "rk_step_done");
        stall[r] = now_ms() - t0;
        check_rk(rk_before_update(ctx), "rk_before_update");
        staging[r] = now_ms() - t0;
    }
    for (int r = 0; r < REPS; r++, step++) {
        t0 = now_ms();
        check_rk(rk_step_done(ctx, step), "rk_step_done");
        double t1 = now_ms();
        for (int k = 0; k < nwork; k++)
            check(cudaMemsetAsync(scratch, k, scratch_n, NULL), "cudaMemsetAsync of the scratch buffer");
        check(cudaEventRecord(ev, NULL), "cudaEventRecord");
        wait_event(ev, limit_ms + 3 * bare_ms, "the GPU work beside a snapshot");
        double t2 = now_ms();
        check_rk(rk_before_update(ctx), "rk_before_update");
        ostall[r] = t1 - t0;
        owork[r] = t2 - t1;
        owait[r] = now_ms() - t2;
    }
    long snaps = step;
    t0 = now_ms();
    int frc = rk_finalize(&ctx);
    double fin_ms = now_ms() - t0;
    int failed;
    long taken;
    scan_events(evfile, &failed, &taken);
    remove_dir();
    check_rk(frc, "rk_finalize");
    if (failed || taken != snaps) {
        char why[128];
        snprintf(why, sizeof(why), "%d failed, %ld taken of %ld (event log)", failed, taken, snaps);
        fail("snapshots", why);
    }

    double st = best(stall, REPS), sg = best(staging, REPS), ow = worst(owait, REPS), os = worst(ostall, REPS);
    printf("snapshot_cuda: %s: rk_step_done %.2f ms (worst %.2f); to staging %.1f ms (worst %.1f), %.1f GB/s; first "
           "two snapshots (map + pin a generation each) %.0f + %.0f ms; rk_finalize %.0f ms\n",
           g_size, st, worst(stall, REPS), sg, worst(staging, REPS), (double)total / sg / 1e6, first[0], first[1],
           fin_ms);
    printf("snapshot_cuda: %s: overlapped with %d memsets of %.0f MiB (%.1f ms alone, best of %d): GPU work %.1f ms "
           "beside the copy (worst %.1f), then rk_before_update waited %.3f ms (worst); stall %.3f ms\n",
           g_size, nwork, scratch_n / 1048576.0, best(work_alone, REPS), REPS, best(owork, REPS), worst(owork, REPS),
           ow, os + ow);
    printf("snapshot_cuda: %s: bare D2H %.1f ms (%.1f GB/s); step_done stall %.2f ms, to staging %.1f ms (%.3fx "
           "bare), overlapped wait %.3f ms; first-snapshot pin %.0f ms\n",
           g_size, bare_ms, gbs, st, sg, sg / bare_ms, ow, first[0] + first[1]);
    printf("RESULT size=%s bare_ms=%.3f staging_ms=%.3f ratio=%.4f stall_ms=%.3f overlap_stall_ms=%.3f pin_ms=%.1f\n",
           argv[1], bare_ms, sg, sg / bare_ms, st, os + ow, first[0] + first[1]);
    return 0;
}
