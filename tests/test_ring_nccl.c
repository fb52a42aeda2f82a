/*
 * tests/test_ring_nccl.c - the NCCL ring (ring/ring_nccl.c) on device buffers. Needs a
 * CUDA GPU: without one the suite is skipped (exit 77, reported SKIP). With one, a ring
 * of one process on device 0: exact sum/avg/max of f32 and f16 device buffers, bad
 * arguments, and a call cancelled by the membership source (the communicator is then
 * aborted, and rebuilt fresh).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ring/ring.h"
#include "harness.h"

static ring *g_ring;
static ring_nccl *g_nccl;

static void setup(void)
{
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    th_assert_rc(ring_create(&g_ring, MPI_COMM_SELF, NULL, 0, 30000), 0);
    th_assert_rc(ring_nccl_create(&g_nccl, g_ring, 0, 30000), 0);
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
        th_assert_rc(ring_nccl_allreduce(g_nccl, d, n, RK_F32, ops[k], NULL), 0);
        cudaMemcpy(back, d, n * 4, cudaMemcpyDeviceToHost);
        ck_assert(memcmp(h, back, n * 4) == 0);
    }
    th_assert_rc(ring_nccl_allreduce(g_nccl, d, n, (rk_dtype)99, RK_SUM, NULL), RK_E_DTYPE);
    th_assert_rc(ring_nccl_allreduce(g_nccl, NULL, n, RK_F32, RK_SUM, NULL), -22);
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
    int rc = ring_nccl_allreduce(g_nccl, d, 4096, RK_F32, RK_SUM, &c);
    /* A world of one may finish before the first poll: success or a clean abort. */
    ck_assert_msg(rc == 0 || rc == RK_E_PEER_LOST, "rc %d", rc);
    th_assert_rc(ring_nccl_rebuild(g_nccl, g_ring, NULL), 0);
    th_assert_rc(ring_nccl_allreduce(g_nccl, d, 4096, RK_F32, RK_SUM, NULL), 0);
    cudaFree(d);
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
    suite_add_tcase(s, tc);
    return th_main(s);
}
