/*
 * tests/test_ring_nccl.c - the NCCL ring (ring/ring_nccl.c) on device buffers. Needs a
 * CUDA GPU: without one the suite is skipped (exit 77, reported SKIP). With one, a ring
 * of one process on device 0: exact sum/avg/max of f32 device buffers, bad arguments, and
 * a call cancelled by the membership source (the communicator is then revoked or aborted,
 * and rebuilt fresh, the revoked one freed on a thread of its own, those threads joined at
 * the next rebuild); then mpirun jobs of 2-4 ranks sharing device 0 (tests/prog_ring_nccl.c, each
 * bounded by JOB_S): sum, avg, max and min of f32, f16 and bf16 bit for bit against a host
 * reference on 4 ranks; a member killed between calls on 3 ranks (shrink) and inside a
 * call on 4 (the survivors' call returns within its bound, the communicator revoked, or
 * with RK_NCCL_REVOKE=0 aborted, and the ring over the survivors exact; the timings
 * printed); and rk_allreduce of device and host buffers,
 * with NCCL and through the host staging (RK_NCCL=0).
 * The jobs passed on a GPU (an H200: docs/GPU.md, "What has run on a GPU").
 */
#include <cuda_runtime.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ring/ring.h"
#include "harness.h"

static ring *g_ring;
static ring_nccl *g_nccl;

static void setup(void)
{
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    th_assert_rc(ring_create(&g_ring, MPI_COMM_SELF, NULL, 0, 30000), 0);
    th_assert_rc(ring_nccl_create(&g_nccl, g_ring, 0, 30000, NULL), 0);
}

static void teardown(void)
{
    ring_nccl_destroy(&g_nccl);
    ring_destroy(&g_ring);
    MPI_Finalize();
}

START_TEST(exact_world_of_one)
{
    size_t n = (1u << 20) + 3;
    float *h = malloc(n * 4), *back = malloc(n * 4), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i * 0.5f;
    ck_assert(cudaMalloc((void **)&d, n * 4) == cudaSuccess);
    rk_op ops[] = {RK_SUM, RK_AVG, RK_MAX, RK_MIN};
    for (int k = 0; k < 4; k++) {
        cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
        th_assert_rc(ring_nccl_allreduce(g_nccl, d, n, RK_F32, ops[k], NULL, NULL), 0);
        cudaMemcpy(back, d, n * 4, cudaMemcpyDeviceToHost);
        ck_assert(memcmp(h, back, n * 4) == 0);
    }
    th_assert_rc(ring_nccl_allreduce(g_nccl, d, n, (rk_dtype)99, RK_SUM, NULL, NULL), RK_E_DTYPE);
    th_assert_rc(ring_nccl_allreduce(g_nccl, NULL, n, RK_F32, RK_SUM, NULL, NULL), -22);
    cudaFree(d);
    free(h);
    free(back);
}
END_TEST

static bool yes(void *arg)
{
    (void)arg;
    return true;
}

START_TEST(cancelled_then_rebuilt)
{
    float *d = NULL;
    ck_assert(cudaMalloc((void **)&d, 4096 * 4) == cudaSuccess);
    ring_cancel c = {.deadline_ns = 0, .changed = yes};
    int rc = ring_nccl_allreduce(g_nccl, d, 4096, RK_F32, RK_SUM, NULL, &c);
    /* A world of one may finish before the first poll: success or a clean abort. */
    ck_assert_msg(rc == 0 || rc == RK_E_PEER_LOST, "rc %d", rc);
    th_assert_rc(ring_nccl_rebuild(g_nccl, g_ring, false, NULL), 0);
    th_assert_rc(ring_nccl_allreduce(g_nccl, d, 4096, RK_F32, RK_SUM, NULL, NULL), 0);
    cudaFree(d);
}
END_TEST

/* ---- jobs of several ranks on device 0 (tests/prog_ring_nccl.c) ---------------------- */

/* The threads of this process named rk-nccl-reap: those still inside ncclCommAbort. */
static int reapers_running(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[64], *comm;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", e->d_name);
        if ((comm = th_read_file(path, NULL)) && strncmp(comm, "rk-nccl-reap", 12) == 0)
            n++;
        free(comm);
    }
    if (d)
        closedir(d);
    return n;
}

/* Each rebuild of an intact communicator retires it on a thread of its own (ncclCommAbort,
   ~0.5 s); the next rebuild joins the ones that ended, so their stacks do not pile up
   until the ring is destroyed. 16 rebuilds in a row, then, once every abort has ended, one
   more: it joined all 16 (of the threads not joined, only its own is left). The address
   space, measured here before (VmSize), also held NCCL's and glibc's own growth and the
   aborts' pace under load: 66 MiB once, beside three other suites on the GPU. */
START_TEST(retired_threads_joined_at_next_rebuild)
{
    for (int i = 0; i < 16; i++)
        th_assert_rc(ring_nccl_rebuild(g_nccl, g_ring, false, NULL), 0);
    int pending = ring_nccl_reapers(g_nccl);
    for (int t = 0; t < 600 && reapers_running() > 0; t++)
        usleep(100 * 1000);
    ck_assert_msg(reapers_running() == 0, "%d retired communicators' aborts still run after 60 s", reapers_running());
    th_assert_rc(ring_nccl_rebuild(g_nccl, g_ring, false, NULL), 0);
    printf("retired_threads_joined_at_next_rebuild: %d retiring threads not joined after 16 rebuilds in a row, "
           "%d after one more once they ended\n", pending, ring_nccl_reapers(g_nccl));
    ck_assert_msg(pending >= 1 && ring_nccl_reapers(g_nccl) == 1,
                  "%d retiring threads not joined after a rebuild that followed their end (want 1: its own)",
                  ring_nccl_reapers(g_nccl));
}
END_TEST

/* Every job's bound (th_run kills its process group then), well inside the case's timeout:
   a hung job never outlives its case, nor keeps the GPU. */
#define JOB_S 60

/* Runs prog_ring_nccl; asserts no FAIL line, `want` lines starting with tag (or with one of
   the tags it lists, separated by '|'), and that the output has (staged) or has not the
   line of device buffers going through host staging. The tagged lines (with the kill
   modes' timings) are printed. */
static void job(int n, bool recovery, char *const args[], const char *const env[], const char *tag, int want,
                bool staged)
{
    char *p = th_prog("prog_ring_nccl"), *out = NULL;
    ck_assert(p);
    int rc = th_mpirun_prog(n, recovery, p, args, env, JOB_S, &out);
    ck_assert_msg(out && !strstr(out, "FAIL"), "prog_ring_nccl %s on %d ranks failed (rc %d):\n%s", args[0], n, rc,
                  out ? out : "");
    int got = 0;
    for (const char *t = tag; *t; t += strcspn(t, "|") + (t[strcspn(t, "|")] == '|')) {
        char one[64];
        snprintf(one, sizeof(one), "%.*s", (int)strcspn(t, "|"), t);
        for (const char *q = out; (q = strstr(q, one)); q++)
            if (q == out || q[-1] == '\n') {
                got++;
                printf("ring_nccl %s: %.*s\n", args[0], (int)strcspn(q, "\n"), q);
            }
    }
    ck_assert_msg(got == want, "%d lines '%s', want %d (rc %d):\n%s", got, tag, want, rc, out);
    if (!recovery)
        ck_assert_msg(rc == 0, "prog_ring_nccl exit %d:\n%s", rc, out);
    ck_assert_msg(!strstr(out, "pinned host staging") == !staged, "staging %s:\n%s", staged ? "expected" : "unexpected",
                  out);
    free(out);
    free(p);
}

/* A member lost between two calls: the survivors keep their communicator, shrunk by
   ncclCommShrink (NCCL >= 2.27), and are exact. */
START_TEST(shrink_after_a_loss_between_calls)
{
    char *args[] = {"between", "1", NULL};
#if defined(RK_HAVE_NCCL_SHRINK)
    job(3, true, args, NULL, "ok shrunk ", 2, false);
#else
    job(3, true, args, NULL, "ok fresh ", 2, false);
#endif
}
END_TEST

/* A member killed inside a call (its part enqueued) on 4 ranks: the survivors' calls
   return within their bound, the communicator revoked (NCCL >= 2.28), nothing writes
   their buffers afterwards, and the communicator shrunk (quiescent by then) or a fresh
   one is exact. */
START_TEST(revoked_after_a_loss_inside_a_call)
{
    char *args[] = {"inside", "2", NULL};
    job(4, true, args, NULL, "ok shrunk |ok fresh ", 3, false);
}
END_TEST

/* The same with RK_NCCL_REVOKE=0: the communicator aborted, a fresh one exact. */
START_TEST(fresh_after_a_loss_inside_a_call)
{
    char *args[] = {"inside", "2", NULL};
    const char *env[] = {"RK_NCCL_REVOKE=0", NULL};
    job(4, true, args, env, "ok fresh ", 3, false);
}
END_TEST

/* Sum, avg, max, min of f32, f16 and bf16 device buffers on 4 ranks, bit for bit against
   the host reference in the same type (tests/ring_exact.h). */
START_TEST(dtypes_exact_on_four_ranks)
{
    char *args[] = {"dtypes", NULL};
    job(4, false, args, NULL, "ok dtypes ", 4, false);
}
END_TEST

/* rk_allreduce: a device buffer through NCCL, a host buffer through the MPI ring. */
START_TEST(api_device_and_host_buffers)
{
    char *args[] = {"api", NULL};
    job(2, false, args, NULL, "ok api ", 2, false);
}
END_TEST

/* RK_NCCL=0: device buffers through pinned host staging and the MPI ring. */
START_TEST(api_staged_without_nccl)
{
    char *args[] = {"api", NULL};
    const char *env[] = {"RK_NCCL=0", NULL};
    job(2, false, args, env, "ok api ", 2, true);
}
END_TEST

int main(void)
{
    char why[160];
    if (!th_have_gpu(why, sizeof(why)))
        th_skip_suite(why);
    Suite *s = suite_create("ring_nccl");
    TCase *tc = tcase_create("device");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, exact_world_of_one);
    tcase_add_test(tc, cancelled_then_rebuilt);
    tcase_add_test(tc, retired_threads_joined_at_next_rebuild);
    suite_add_tcase(s, tc);
    TCase *tj = tcase_create("jobs");
    tcase_set_timeout(tj, JOB_S + 30);
    tcase_add_test(tj, dtypes_exact_on_four_ranks);
    tcase_add_test(tj, shrink_after_a_loss_between_calls);
    tcase_add_test(tj, revoked_after_a_loss_inside_a_call);
    tcase_add_test(tj, fresh_after_a_loss_inside_a_call);
    tcase_add_test(tj, api_device_and_host_buffers);
    tcase_add_test(tj, api_staged_without_nccl);
    suite_add_tcase(s, tj);
    return th_main(s);
}
