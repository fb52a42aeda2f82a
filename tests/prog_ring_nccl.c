/*
 * tests/prog_ring_nccl.c - a worker for the NCCL ring's jobs on a GPU, run under mpirun
 * by tests/test_ring_nccl.c (built only with CUDA + NCCL; never run without a device).
 * Every rank uses device 0 (several ranks share one GPU: each names a host of its own for
 * NCCL, ring_nccl_hostid, before any communicator). Prints "ok ..." lines, "FAIL ..." and exits 1 on a wrong result.
 * Modes:
 *   between V  an exact device allreduce over all ranks; rank V dies between two calls;
 *              the survivors (the test-only oracle: /proc) rebuild the MPI ring, agree on
 *              keeping the communicator (ring_nccl_can_shrink), shrink it (a fresh one
 *              where this NCCL has no ncclCommShrink) and are exact: "ok shrunk"/"ok fresh".
 *   inside V   rank V dies just before its second device allreduce: the survivors' call
 *              is cancelled by the oracle (RK_E_PEER_LOST, the communicator aborted) or by
 *              its deadline, their buffer is not written after the call returned, and a
 *              fresh communicator over the survivors is exact: "ok fresh".
 *   api        rk_allreduce of a device buffer and of a host buffer (the MPI ring), each
 *              exact; with RK_NCCL=0 the device buffer goes through the host staging.
 */
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prog_common.h"
#include "../ring/ring.h"
#include "rekindle.h"

static int g_rank, g_world;

#define FAIL(...)                                                                          \
    do {                                                                                   \
        printf("FAIL rank %d: ", g_rank);                                                  \
        printf(__VA_ARGS__);                                                               \
        printf("\n");                                                                      \
        fflush(stdout);                                                                    \
        _exit(1);                                                                          \
    } while (0)

#define N_ELEMS ((size_t)(1u << 20) + 3)

/* Small integers in f32: every order of summation gives the same bits. */
static float val(int rank, size_t i)
{
    return (float)(rank + 1) + (float)(i % 7);
}

/* A device buffer of this rank's values. */
static float *device_values(void)
{
    float *h = malloc(N_ELEMS * 4), *d = NULL;
    for (size_t i = 0; i < N_ELEMS; i++)
        h[i] = val(g_rank, i);
    if (cudaMalloc((void **)&d, N_ELEMS * 4) != cudaSuccess || cudaMemcpy(d, h, N_ELEMS * 4, cudaMemcpyHostToDevice) != cudaSuccess)
        FAIL("device buffer: %s", cudaGetErrorString(cudaGetLastError()));
    free(h);
    return d;
}

static void check_sum(const float *d, const int *who, int n, const char *what)
{
    float *h = malloc(N_ELEMS * 4);
    if (cudaMemcpy(h, d, N_ELEMS * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        FAIL("%s: copy back", what);
    for (size_t i = 0; i < N_ELEMS; i++) {
        float want = 0;
        for (int k = 0; k < n; k++)
            want += val(who[k], i);
        if (h[i] != want)
            FAIL("%s: element %zu is %g, want %g", what, i, (double)h[i], (double)want);
    }
    free(h);
}

struct oracle {
    int *pids;
    int victim;
};

static bool oracle_changed(void *arg)
{
    struct oracle *o = arg;
    return prog_pid_dead(o->pids[o->victim]);
}

/* Every rank of these jobs uses device 0, however many the host has: each names a host of
   its own (as the library does where ranks outnumber devices). */
static void name_host(void)
{
    char host[128] = "", id[192];
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    gethostname(host, sizeof(host) - 1);
    if (ring_nccl_hostid(id, sizeof(id), getenv("NCCL_HOSTID"), host, g_rank, ls ? atoi(ls) : 0, 0))
        setenv("NCCL_HOSTID", id, 1);
}

static int mode_kill(int victim, bool inside)
{
    int *pids = malloc((size_t)g_world * sizeof(int)), me = getpid(), *all = malloc((size_t)g_world * sizeof(int));
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < g_world; i++)
        all[i] = i;
    ring *r = NULL;
    ring_nccl *g = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_nccl_create(&g, r, 0, 60000, NULL) != 0)
        FAIL("ring or NCCL communicator: %s", rk_last_error());
    float *d = device_values();
    struct oracle o = {pids, victim};
    ring_cancel c = {.deadline_ns = 0, .changed = oracle_changed, .arg = &o};
    if (ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, &c) != 0)
        FAIL("first allreduce: %s", rk_last_error());
    check_sum(d, all, g_world, "first allreduce");
    printf("ok exact rank %d world %d\n", g_rank, g_world);
    fflush(stdout);
    if (g_rank == victim)
        raise(SIGKILL);
    int64_t until = rk__deadline_ns(30000);
    if (inside) {
        int rc = ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, &c);
        if (rc != RK_E_PEER_LOST && rc != RK_E_TIMEOUT)
            FAIL("allreduce with a dead member: %d (%s)", rc, rk_last_error());
        float *a = malloc(N_ELEMS * 4), *b = malloc(N_ELEMS * 4);
        cudaMemcpy(a, d, N_ELEMS * 4, cudaMemcpyDeviceToHost);
        rk__sleep_ns(200000000);
        cudaMemcpy(b, d, N_ELEMS * 4, cudaMemcpyDeviceToHost);
        if (memcmp(a, b, N_ELEMS * 4) != 0)
            FAIL("the device buffer changed after the aborted call returned");
        free(a);
        free(b);
        printf("ok aborted rank %d\n", g_rank);
    }
    while (!oracle_changed(&o) && !rk__deadline_passed(until))
        rk__sleep_ns(1000000);
    int *surv = malloc((size_t)g_world * sizeof(int)), ns = 0;
    for (int i = 0; i < g_world; i++)
        if (i != victim)
            surv[ns++] = i;
    if (ring_rebuild(r, surv, ns, 1, NULL) != 0)
        FAIL("MPI ring rebuild: %s", rk_last_error());
    int32_t can = ring_nccl_can_shrink(g, r);
#if defined(RK_HAVE_NCCL_SHRINK)
    if (can != !inside)
        FAIL("ring_nccl_can_shrink %d after a loss %s a call", can, inside ? "inside" : "between");
#endif
    if (ring_allreduce(r, &can, 1, RK_I32, RK_MIN, NULL) != 0)
        FAIL("agreement: %s", rk_last_error());
    if (ring_nccl_rebuild(g, r, can != 0, NULL) != 0)
        FAIL("NCCL rebuild (%s): %s", can ? "shrink" : "fresh", rk_last_error());
    cudaFree(d);
    d = device_values();
    if (ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, NULL) != 0)
        FAIL("allreduce over the survivors: %s", rk_last_error());
    check_sum(d, surv, ns, "allreduce over the survivors");
    printf("ok %s rank %d world %d\n", can ? "shrunk" : "fresh", g_rank, ns);
    fflush(stdout);
    cudaFree(d);
    ring_nccl_destroy(&g);
    ring_destroy(&r);
    free(surv);
    free(all);
    free(pids);
    return 0;
}

static int mode_api(rk_ctx *ctx)
{
    int *all = malloc((size_t)g_world * sizeof(int));
    for (int i = 0; i < g_world; i++)
        all[i] = i;
    float *d = device_values();
    for (int k = 0; k < 2; k++) { /* the second call reuses the epoch's path */
        if (k == 1)
            cudaFree(d), d = device_values();
        int rc = rk_allreduce(ctx, d, N_ELEMS, RK_F32, RK_SUM);
        if (rc != 0)
            FAIL("rk_allreduce of a device buffer: %s", rk_last_error());
        check_sum(d, all, g_world, "rk_allreduce of a device buffer");
    }
    float *h = malloc(N_ELEMS * 4);
    for (size_t i = 0; i < N_ELEMS; i++)
        h[i] = val(g_rank, i);
    if (rk_allreduce(ctx, h, N_ELEMS, RK_F32, RK_SUM) != 0)
        FAIL("rk_allreduce of a host buffer: %s", rk_last_error());
    for (size_t i = 0; i < N_ELEMS; i++) {
        float want = 0;
        for (int k = 0; k < g_world; k++)
            want += val(k, i);
        if (h[i] != want)
            FAIL("host buffer: element %zu is %g, want %g", i, (double)h[i], (double)want);
    }
    printf("ok api rank %d world %d%s\n", g_rank, g_world, getenv("RK_NCCL") ? " staged" : "");
    cudaFree(d);
    free(h);
    free(all);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: prog_ring_nccl between V|inside V|api\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "prog_ring_nccl: no CUDA device\n");
        return 2;
    }
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    g_rank = rk_rank(ctx);
    g_world = rk_world(ctx);
    name_host();
    int rc;
    if ((strcmp(argv[1], "between") == 0 || strcmp(argv[1], "inside") == 0) && argc >= 3) {
        rc = mode_kill(atoi(argv[2]), strcmp(argv[1], "inside") == 0);
        fflush(stdout);
        _exit(rc); /* a member is dead: MPI_Finalize would wait for it */
    } else if (strcmp(argv[1], "api") == 0) {
        rc = mode_api(ctx);
    } else {
        fprintf(stderr, "prog_ring_nccl: unknown mode %s\n", argv[1]);
        rc = 2;
    }
    int frc = rk_finalize(&ctx);
    return rc != 0 ? rc : frc != 0 ? 4 : 0;
}
