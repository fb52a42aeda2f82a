/*
 * tests/prog_ring_nccl.c - a worker for the NCCL ring's jobs on a GPU, run under mpirun
 * by tests/test_ring_nccl.c (built only with CUDA + NCCL; never run without a device).
 * Every rank uses device 0 (several ranks share one GPU: each names a host of its own for
 * NCCL, ring_nccl_hostid, before any communicator). Prints "ok ..." lines, "FAIL ..." and exits 1 on a wrong result.
 * Modes:
 *   dtypes     (at most 4 ranks) sum, avg (where 1/ranks is exact: 1, 2 or 4 ranks), max
 *              and min of f32, f16 and bf16 device buffers, each compared bit for bit with
 *              the host reference in the same type (tests/ring_exact.h: values exact in
 *              every order, so NCCL's order gives the reference's bits): "ok dtypes".
 *   between V  an exact device allreduce over all ranks; rank V dies between two calls (at
 *              a time agreed beforehand); the survivors (the test-only oracle: /proc)
 *              rebuild the MPI ring, agree on keeping the communicator
 *              (ring_nccl_can_shrink), shrink it (a fresh one where this NCCL has no
 *              ncclCommShrink) and are exact: "ok shrunk"/"ok fresh".
 *   inside V   rank V enters its second device allreduce at a time agreed beforehand,
 *              ~300 ms after the others entered theirs, and dies inside it, its part
 *              enqueued (SIGKILL from its cancellation source, polled right after the
 *              enqueue): the survivors' call returns RK_E_PEER_LOST (the oracle) or
 *              RK_E_TIMEOUT within its bound (CALL_BOUND_MS, plus ABORT_SLACK_MS for the
 *              stop), the communicator revoked (ring_nccl_revokes) or aborted, their buffer
 *              not written after the call returned, and the communicator shrunk (revoked
 *              and quiescent by then at every survivor) or a fresh one (else; always when
 *              aborted: RK_NCCL_REVOKE=0, NCCL < 2.28) over the survivors is exact:
 *              "ok shrunk"/"ok fresh".
 *   api        rk_allreduce of a device buffer and of a host buffer (the MPI ring), each
 *              exact; with RK_NCCL=0 the device buffer goes through the host staging.
 * The kill modes print, per survivor, in ms from the victim's death (the agreed time; it
 * dies within microseconds of it): returned_ms (its call returned: inside only),
 * detect_ms (the oracle saw the death), abort_ms (from detection to the stopped call's
 * return, the revoke or abort included: inside only), rebuild_ms (the MPI ring rebuilt, the agreement and the NCCL
 * communicator shrunk or made fresh), nccl_ms (the NCCL part of it) and first_ms (the
 * first allreduce over the survivors). bench/ring_nccl.sh reports them.
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
#include "ring_exact.h"

static int g_rank, g_world;

#define FAIL(...) PROG_FAIL(g_rank, __VA_ARGS__)

#define N_ELEMS ((size_t)(1u << 20) + 3)
#define KILL_AFTER_MS 300   /* from the agreement to the victim's death */
#define CALL_BOUND_MS 20000 /* the deadline of the survivors' call with a dead member */
#define ABORT_SLACK_MS 10000 /* what ncclCommAbort may add to it */

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
    int64_t seen_ns; /* when it first saw the victim dead; 0: not yet */
};

static bool oracle_changed(void *arg)
{
    struct oracle *o = arg;
    if (!o->seen_ns && prog_pid_dead(o->pids[o->victim]))
        o->seen_ns = rk__mono_ns();
    return o->seen_ns != 0;
}

/* The victim's cancellation source inside its last call: polled right after its part of
   the allreduce was enqueued. */
static bool die_now(void *arg)
{
    (void)arg;
    raise(SIGKILL);
    return true;
}

static double ms_between(int64_t from_ns, int64_t to_ns)
{
    return (double)(to_ns - from_ns) / 1e6;
}

/* A ring over MPI_COMM_WORLD and its NCCL communicator on device 0, or FAIL. */
static void open_ring(ring **r, ring_nccl **g)
{
    if (ring_create(r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_nccl_create(g, *r, 0, 60000, NULL) != 0)
        FAIL("ring or NCCL communicator: %s", rk_last_error());
}

/* Sum, avg, max and min of f32, f16 and bf16 device buffers, bit for bit against the host
   reference computed in the same type. */
static int mode_dtypes(void)
{
    if (g_world > 4)
        FAIL("dtypes: at most 4 ranks (tests/ring_exact.h proves exactness for 4)");
    int *all = malloc((size_t)g_world * sizeof(int));
    for (int i = 0; i < g_world; i++)
        all[i] = i;
    ring *r = NULL;
    ring_nccl *g = NULL;
    open_ring(&r, &g);
    rk_dtype types[] = {RK_F32, RK_F16, RK_BF16};
    const char *tname[] = {"f32", "f16", "bf16"};
    rk_op ops[] = {RK_SUM, RK_AVG, RK_MAX, RK_MIN};
    const char *oname[] = {"sum", "avg", "max", "min"};
    size_t n = N_ELEMS;
    void *h = malloc(n * 4), *ref = malloc(n * 4), *tmp = malloc(n * 4), *d = NULL;
    if (!h || !ref || !tmp || cudaMalloc(&d, n * 4) != cudaSuccess)
        FAIL("dtypes: buffers of %zu bytes", n * 4);
    int done = 0;
    bool avg_exact = (g_world & (g_world - 1)) == 0; /* 1/ranks is a power of two */
    for (int k = 0; k < 3; k++)
        for (int o = 0; o < 4; o++) {
            rk_dtype t = types[k];
            size_t bytes = n * (t == RK_F32 ? 4 : 2);
            int span = ring_exact_span(t);
            if (ops[o] == RK_AVG && !avg_exact)
                continue;
            ring_exact_fill(h, n, t, g_rank, span);
            if (cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
                FAIL("dtypes %s %s: copy to the device", tname[k], oname[o]);
            int64_t t0 = rk__mono_ns();
            int rc = ring_nccl_allreduce(g, d, n, t, ops[o], NULL, NULL);
            if (rc != 0)
                FAIL("dtypes %s %s: %d (%s)", tname[k], oname[o], rc, rk_last_error());
            double ms = rk__ms_since(t0);
            if (cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
                FAIL("dtypes %s %s: copy back", tname[k], oname[o]);
            if (ring_exact_reference(ref, tmp, n, t, ops[o], all, g_world, span) != 0)
                FAIL("dtypes %s %s: host reference", tname[k], oname[o]);
            if (memcmp(h, ref, bytes) != 0) {
                size_t i = 0, es = t == RK_F32 ? 4 : 2;
                while (i < n && memcmp((char *)h + i * es, (char *)ref + i * es, es) == 0)
                    i++;
                FAIL("dtypes %s %s: element %zu is %g, want %g (rank's own value %d)", tname[k], oname[o], i,
                     (double)ring_exact_get(h, i, t), (double)ring_exact_get(ref, i, t),
                     ring_exact_int(g_rank, i, span));
            }
            if (g_rank == 0)
                printf("dtypes %s %s: exact, %zu elements, %.2f ms\n", tname[k], oname[o], n, ms);
            done++;
        }
    printf("ok dtypes rank %d world %d: %d reductions bit for bit (f32 f16 bf16 x sum%s max min)\n", g_rank, g_world,
           done, avg_exact ? " avg" : "");
    fflush(stdout);
    cudaFree(d);
    free(h);
    free(ref);
    free(tmp);
    ring_nccl_destroy(&g);
    ring_destroy(&r);
    free(all);
    return 0;
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
    if (victim < 0 || victim >= g_world)
        FAIL("victim %d: not a rank of %d", victim, g_world);
    int *pids = malloc((size_t)g_world * sizeof(int)), me = getpid(), *all = malloc((size_t)g_world * sizeof(int));
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < g_world; i++)
        all[i] = i;
    ring *r = NULL;
    ring_nccl *g = NULL;
    open_ring(&r, &g);
    float *d = device_values();
    struct oracle o = {pids, victim, 0};
    ring_cancel c = {.deadline_ns = 0, .changed = oracle_changed, .arg = &o};
    if (ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, &c) != 0)
        FAIL("first allreduce: %s", rk_last_error());
    check_sum(d, all, g_world, "first allreduce");
    /* The victim's time of death, agreed by all (CLOCK_MONOTONIC is the host's: every
       rank runs here): the latest of the members' now + KILL_AFTER_MS. */
    int64_t kill_ns = rk__mono_ns() + (int64_t)KILL_AFTER_MS * 1000000;
    if (ring_allreduce(r, &kill_ns, 1, RK_I64, RK_MAX, NULL) != 0)
        FAIL("agreeing on the time of death: %s", rk_last_error());
    printf("ok exact rank %d world %d\n", g_rank, g_world);
    fflush(stdout);
    if (g_rank == victim) {
        int64_t left = kill_ns - rk__mono_ns();
        if (left > 0)
            rk__sleep_ns(left);
        if (inside) { /* dies at the first poll after its part is enqueued */
            ring_cancel die = {.deadline_ns = 0, .changed = die_now};
            ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, &die);
        }
        raise(SIGKILL);
    }
    double returned_ms = -1, abort_ms = -1;
    if (inside) {
        ring_cancel cb = {.deadline_ns = rk__deadline_ns(CALL_BOUND_MS), .changed = oracle_changed, .arg = &o};
        int rc = ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, &cb);
        int64_t back = rk__mono_ns();
        if (rc == 0)
            FAIL("the allreduce with a member killed inside it returned 0 (its call ended before its first poll?)");
        if (rc != RK_E_PEER_LOST && rc != RK_E_TIMEOUT)
            FAIL("allreduce with a dead member: %d (%s)", rc, rk_last_error());
        if (back < kill_ns)
            FAIL("the allreduce returned %.1f ms before the victim's death (%s)", ms_between(back, kill_ns),
                 rk_strerror(rc));
        if (back > cb.deadline_ns + (int64_t)ABORT_SLACK_MS * 1000000)
            FAIL("the allreduce returned %.0f ms after its %d ms deadline (%s)", ms_between(cb.deadline_ns, back),
                 CALL_BOUND_MS, rk_strerror(rc));
        if (ring_nccl_ok(g))
            FAIL("the communicator is not marked failed after %s", rk_strerror(rc));
        returned_ms = ms_between(kill_ns, back);
        abort_ms = o.seen_ns ? ms_between(o.seen_ns, back) : -1;
        float *a = malloc(N_ELEMS * 4), *b = malloc(N_ELEMS * 4);
        cudaMemcpy(a, d, N_ELEMS * 4, cudaMemcpyDeviceToHost);
        rk__sleep_ns(200000000);
        cudaMemcpy(b, d, N_ELEMS * 4, cudaMemcpyDeviceToHost);
        if (memcmp(a, b, N_ELEMS * 4) != 0)
            FAIL("the device buffer changed after the aborted call returned");
        free(a);
        free(b);
        printf("ok aborted rank %d: %s after %.1f ms\n", g_rank, rk_strerror(rc), returned_ms);
    }
    int64_t until = rk__deadline_ns(30000);
    while (!oracle_changed(&o) && !rk__deadline_passed(until))
        rk__sleep_ns(1000000);
    if (!o.seen_ns)
        FAIL("rank %d still alive 30 s after its time of death", victim);
    int *surv = malloc((size_t)g_world * sizeof(int)), ns = 0;
    for (int i = 0; i < g_world; i++)
        if (i != victim)
            surv[ns++] = i;
    int64_t t0 = rk__mono_ns();
    if (ring_rebuild(r, surv, ns, 1, NULL) != 0)
        FAIL("MPI ring rebuild: %s", rk_last_error());
    int32_t can = ring_nccl_can_shrink(g, r);
#if defined(RK_HAVE_NCCL_SHRINK)
    /* Inside: a revoked communicator shrinks if NCCL called it quiescent by now at every
       survivor; an aborted one never does. */
    if (inside ? can && !ring_nccl_revokes() : !can)
        FAIL("ring_nccl_can_shrink %d after a loss %s a call (revoke %s)", can, inside ? "inside" : "between",
             ring_nccl_revokes() ? "on" : "off");
#endif
    if (ring_allreduce(r, &can, 1, RK_I32, RK_MIN, NULL) != 0)
        FAIL("agreement: %s", rk_last_error());
    int64_t t1 = rk__mono_ns();
    if (ring_nccl_rebuild(g, r, can != 0, NULL) != 0)
        FAIL("NCCL rebuild (%s): %s", can ? "shrink" : "fresh", rk_last_error());
    int64_t t2 = rk__mono_ns();
    cudaFree(d);
    d = device_values();
    int64_t t3 = rk__mono_ns();
    if (ring_nccl_allreduce(g, d, N_ELEMS, RK_F32, RK_SUM, NULL, NULL) != 0)
        FAIL("allreduce over the survivors: %s", rk_last_error());
    double first_ms = rk__ms_since(t3);
    check_sum(d, surv, ns, "allreduce over the survivors");
    printf("ok %s rank %d world %d returned_ms=%.1f detect_ms=%.1f abort_ms=%.1f rebuild_ms=%.1f nccl_ms=%.1f "
           "first_ms=%.1f\n",
           can ? "shrunk" : "fresh", g_rank, ns, returned_ms, ms_between(kill_ns, o.seen_ns), abort_ms,
           ms_between(t0, t2), ms_between(t1, t2), first_ms);
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
        fprintf(stderr, "usage: prog_ring_nccl dtypes|between V|inside V|api\n");
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
    } else if (strcmp(argv[1], "dtypes") == 0) {
        rc = mode_dtypes();
    } else if (strcmp(argv[1], "api") == 0) {
        rc = mode_api(ctx);
    } else {
        fprintf(stderr, "prog_ring_nccl: unknown mode %s\n", argv[1]);
        rc = 2;
    }
    int frc = rk_finalize(&ctx);
    return rc != 0 ? rc : frc != 0 ? 4 : 0;
}
