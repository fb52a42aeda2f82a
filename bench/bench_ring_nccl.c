/*
 * bench/bench_ring_nccl.c - the NCCL ring against a bare NCCL communicator, same ranks,
 * same run: rk_allreduce of a device buffer (the public API's NCCL path: recover/
 * api_ring_nccl.c, ring/ring_nccl.c) and ncclAllReduce + a polled cudaStreamQuery on a
 * communicator this program makes itself (ncclGetUniqueId on rank 0, MPI_Bcast,
 * ncclCommInitRank), alternating call by call, f32 sum in place, 1, 4, 16, 64, 256 MiB.
 * Run under mpirun -n N (bench/ring_nccl.sh: 4 ranks sharing device 0). Rank r uses device
 * (local rank mod devices); where ranks outnumber devices each names a host of its own for
 * NCCL (ring_nccl_hostid, as the library does) before either communicator, so both take
 * the same transport.
 *
 * Per size: the median over iterations of the slowest rank's time of each (the buffer is
 * reset from a source copy before every call, untimed), after one warm-up call of each
 * whose results are checked exact (small integers: every order sums exactly). Prints
 *   ring_nccl: 64 MiB: rekindle X ms, bare nccl Y ms, ratio R (bus A / B GB/s)
 * (ratio: rekindle's time / bare's) and a last summary line. Sizes that would not fit in
 * BUDGET_S (estimated from the size before) are reported "not run".
 *   bench_ring_nccl --probe                 (no mpirun) exit 0 if a CUDA device is usable,
 *                                           else 1 with the reason on stdout
 *   bench_ring_nccl [MAX_BYTES [BUDGET_S]]  (default 256 MiB, 30 s)
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ring/ring.h"
#include "rekindle.h"

#define MIB ((size_t)1 << 20)

static int g_rank;

#define DIE(...)                                                                           \
    do {                                                                                   \
        printf("ring_nccl: FAILED at rank %d: ", g_rank);                                  \
        printf(__VA_ARGS__);                                                               \
        printf("\n");                                                                      \
        fflush(stdout);                                                                    \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    } while (0)

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Polls the stream until its work is done (as the library does: no blocking synchronize),
   at most 60 s. */
static void stream_done(cudaStream_t s, const char *what)
{
    double until = MPI_Wtime() + 60;
    cudaError_t e;
    while ((e = cudaStreamQuery(s)) == cudaErrorNotReady)
        if (MPI_Wtime() > until)
            DIE("%s: not done after 60 s", what);
    if (e != cudaSuccess)
        DIE("%s: %s", what, cudaGetErrorString(e));
}

static int probe(void)
{
    int n = 0, v = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 1;
    }
    if (ncclGetVersion(&v) != ncclSuccess) {
        printf("NCCL does not answer ncclGetVersion\n");
        return 1;
    }
    printf("ring_nccl: %d CUDA device(s), NCCL %d.%d.%d\n", n, v / 10000, v / 100 % 100, v % 100);
    return 0;
}

/* The sum over n ranks of rank p's value (i + p) % 7 at element i. */
static void check_exact(const float *dev, float *host, size_t cnt, int n, const char *what, size_t bytes)
{
    if (cudaMemcpy(host, dev, cnt * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        DIE("%s: copy back", what);
    for (size_t i = 0; i < cnt; i++) {
        float want = 0;
        for (int p = 0; p < n; p++)
            want += (float)((i + (size_t)p) % 7);
        if (host[i] != want)
            DIE("%s at %zu MiB: element %zu is %g, want %g", what, bytes / MIB, i, (double)host[i], (double)want);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--probe") == 0)
        return probe();
    size_t maxb = argc > 1 ? strtoull(argv[1], NULL, 0) : 256 * MIB;
    double budget = argc > 2 ? atof(argv[2]) : 30;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("ring_nccl: skipped: no CUDA device\n");
        return 0;
    }
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK"), *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int dev = (lr ? atoi(lr) : 0) % ndev;
    if (cudaSetDevice(dev) != cudaSuccess) {
        printf("ring_nccl: FAILED: cudaSetDevice(%d)\n", dev);
        return 1;
    }
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o);
    if (rc != 0) {
        printf("ring_nccl: FAILED: rk_init: %s: %s\n", rk_strerror(rc), rk_last_error());
        return 1;
    }
    g_rank = rk_rank(ctx);
    int n = rk_world(ctx);
    char host[128] = "", id[192];
    gethostname(host, sizeof(host) - 1);
    if (ring_nccl_hostid(id, sizeof(id), getenv("NCCL_HOSTID"), host, g_rank, ls ? atoi(ls) : 0, ndev))
        setenv("NCCL_HOSTID", id, 1);
    if (g_rank == 0)
        printf("ring_nccl: %d ranks, %d device(s) (rank 0 on device %d)%s%s\n", n, ndev, dev,
               getenv("NCCL_HOSTID") ? ", NCCL_HOSTID " : "", getenv("NCCL_HOSTID") ? getenv("NCCL_HOSTID") : "");

    /* The bare communicator and its stream. */
    ncclUniqueId uid;
    memset(&uid, 0, sizeof(uid));
    if (g_rank == 0 && ncclGetUniqueId(&uid) != ncclSuccess)
        DIE("ncclGetUniqueId");
    MPI_Bcast(&uid, (int)sizeof(uid), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    ncclResult_t nr = ncclCommInitRank(&comm, n, uid, g_rank);
    if (nr != ncclSuccess)
        DIE("ncclCommInitRank: %s", ncclGetErrorString(nr));
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        DIE("cudaStreamCreate");

    float *src = NULL, *work = NULL, *h = malloc(maxb);
    if (!h || cudaMalloc((void **)&src, maxb) != cudaSuccess || cudaMalloc((void **)&work, maxb) != cudaSuccess)
        DIE("%zu MiB on the device and the host", maxb / MIB);
    for (size_t i = 0; i < maxb / 4; i++)
        h[i] = (float)((i + (size_t)g_rank) % 7);
    if (cudaMemcpy(src, h, maxb, cudaMemcpyHostToDevice) != cudaSuccess)
        DIE("filling the source");

    double start = MPI_Wtime(), prev_s = 0; /* prev_s: one iteration of both at the size before */
    char summary[512] = "";
    size_t sizes[] = {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB};
    for (int k = 0; k < 5 && sizes[k] <= maxb; k++) {
        size_t b = sizes[k], cnt = b / 4;
        int iters = b <= 4 * MIB ? 20 : b <= 16 * MIB ? 10 : b <= 64 * MIB ? 5 : 3;
        /* Rank 0 decides for all whether this size fits in what is left of the budget. */
        int go = 1;
        if (g_rank == 0)
            go = MPI_Wtime() - start + prev_s * 4 * (iters + 2) < budget;
        MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!go) {
            if (g_rank == 0) {
                printf("ring_nccl: %zu MiB: not run (the %.0f s budget)\n", b / MIB, budget);
                snprintf(summary + strlen(summary), sizeof(summary) - strlen(summary), " %zu MiB not run", b / MIB);
            }
            continue;
        }
        /* Warm-up, each result checked: the first rk_allreduce of a device buffer also
           makes the library's communicator. */
        double w0 = MPI_Wtime();
        cudaMemcpyAsync(work, src, b, cudaMemcpyDeviceToDevice, st);
        stream_done(st, "reset");
        if ((rc = rk_allreduce(ctx, work, cnt, RK_F32, RK_SUM)) != 0)
            DIE("rk_allreduce of %zu MiB: %s: %s", b / MIB, rk_strerror(rc), rk_last_error());
        check_exact(work, h, cnt, n, "rk_allreduce", b);
        cudaMemcpyAsync(work, src, b, cudaMemcpyDeviceToDevice, st);
        if ((nr = ncclAllReduce(work, work, cnt, ncclFloat32, ncclSum, comm, st)) != ncclSuccess)
            DIE("ncclAllReduce: %s", ncclGetErrorString(nr));
        stream_done(st, "ncclAllReduce");
        check_exact(work, h, cnt, n, "bare ncclAllReduce", b);
        double *tr = malloc(sizeof(double) * (size_t)iters), *tb = malloc(sizeof(double) * (size_t)iters);
        for (int i = 0; i < iters; i++) {
            cudaMemcpyAsync(work, src, b, cudaMemcpyDeviceToDevice, st);
            stream_done(st, "reset");
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if ((rc = rk_allreduce(ctx, work, cnt, RK_F32, RK_SUM)) != 0)
                DIE("rk_allreduce of %zu MiB: %s: %s", b / MIB, rk_strerror(rc), rk_last_error());
            double t1 = MPI_Wtime();
            cudaMemcpyAsync(work, src, b, cudaMemcpyDeviceToDevice, st);
            stream_done(st, "reset");
            MPI_Barrier(MPI_COMM_WORLD);
            double t2 = MPI_Wtime();
            if ((nr = ncclAllReduce(work, work, cnt, ncclFloat32, ncclSum, comm, st)) != ncclSuccess)
                DIE("ncclAllReduce: %s", ncclGetErrorString(nr));
            stream_done(st, "ncclAllReduce");
            double t3 = MPI_Wtime();
            tr[i] = t1 - t0;
            tb[i] = t3 - t2;
        }
        /* The slowest rank's time is the collective's: max over ranks, per call. */
        MPI_Allreduce(MPI_IN_PLACE, tr, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, tb, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(tr, (size_t)iters, sizeof(double), cmp_d);
        qsort(tb, (size_t)iters, sizeof(double), cmp_d);
        double r_med = tr[iters / 2], b_med = tb[iters / 2], f = 2.0 * (n - 1) / n * (double)b / 1e9;
        prev_s = (MPI_Wtime() - w0) / (iters + 2);
        if (g_rank == 0) {
            printf("ring_nccl: %zu MiB: rekindle %.3f ms, bare nccl %.3f ms, ratio %.2f (bus %.2f / %.2f GB/s, "
                   "median of %d)\n",
                   b / MIB, r_med * 1e3, b_med * 1e3, r_med / b_med, f / r_med, f / b_med, iters);
            snprintf(summary + strlen(summary), sizeof(summary) - strlen(summary), " %zu MiB %.2f", b / MIB,
                     r_med / b_med);
        }
        free(tr);
        free(tb);
    }
    if (g_rank == 0)
        printf("ring_nccl: %d ranks, rekindle/bare time:%s (%.0f s)\n", n, summary, MPI_Wtime() - start);
    ncclCommDestroy(comm);
    cudaStreamDestroy(st);
    cudaFree(src);
    cudaFree(work);
    free(h);
    rc = rk_finalize(&ctx);
    return rc != 0;
}
