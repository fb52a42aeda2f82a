/*
 * tests/prog_user_cuda.c - a training loop on a GPU written from include/rekindle.h and
 * docs/GPU.md alone (nothing of the examples): a weight vector in device memory registered
 * with RK_DEVICE, a gradient in device memory summed by rk_allreduce, RK_RECOVERED handled
 * as the header says. Run under `rekindle run -n W` with RK_CKPT_DIR set:
 *
 *   prog_user_cuda STEPS KILL_STEP
 *
 * Every rank's gradient is (its rank + 1) in each of N elements, so the sum is
 * W(W+1)/2 exactly (small integers in f32); the update adds sum / W. Rank 1 of the first
 * world kills itself (SIGKILL) before its allreduce of step KILL_STEP (-1: nobody). Each rank
 * checks every allreduce's result, and after a recovery that the restored device weights are
 * exactly the sum of the updates of the steps before the one it resumes from (what it
 * recorded itself). Prints "final rank=R world=W steps=S w=V recovered=K" and exits 0; any
 * check that fails prints "FAIL ..." and exits 1.
 */
#include <cuda_runtime.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rekindle.h>

#define N (1 << 20) /* 4 MiB of f32 */
#define MAX_STEPS 10000

static int fail(const char *what, int rc)
{
    printf("FAIL %s: %d %s (%s)\n", what, rc, rk_strerror(rc), rk_last_error());
    fflush(stdout);
    return 1;
}

static int check_all(const float *h, float want, const char *what, long step)
{
    for (size_t i = 0; i < N; i++)
        if (h[i] != want) {
            printf("FAIL %s at step %ld: element %zu is %.9g, not %.9g\n", what, step, i, h[i], want);
            fflush(stdout);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: prog_user_cuda STEPS KILL_STEP\n"), 2;
    long steps = atol(argv[1]), kill_step = atol(argv[2]);
    if (steps < 1 || steps > MAX_STEPS)
        return fprintf(stderr, "prog_user_cuda: STEPS 1..%d\n", MAX_STEPS), 2;
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o);
    if (rc != 0)
        return fail("rk_init", rc);
    float *w = NULL, *g = NULL, *h = malloc(N * sizeof(float));
    static float added[MAX_STEPS]; /* the update of each step, as this rank applied it */
    if (!h || cudaSetDevice(0) != cudaSuccess || cudaMalloc((void **)&w, N * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&g, N * sizeof(float)) != cudaSuccess || cudaMemset(w, 0, N * sizeof(float)) != cudaSuccess)
        return printf("FAIL cuda setup: %s\n", cudaGetErrorString(cudaGetLastError())), 1;
    int64_t shape[1] = {N};
    if ((rc = rk_register(ctx, "w", w, RK_F32, 1, shape, RK_DEVICE)) != 0)
        return fail("rk_register", rc);
    int64_t step = 0;
    if ((rc = rk_resume(ctx, &step)) != 0)
        return fail("rk_resume", rc);
    int first_world = rk_world(ctx), recovered = 0;
    bool first_rank1 = rk_rank(ctx) == 1;
    while (step < steps) {
        int r = rk_rank(ctx), world = rk_world(ctx);
        for (size_t i = 0; i < N; i++)
            h[i] = (float)(r + 1);
        if (cudaMemcpy(g, h, N * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            return printf("FAIL cudaMemcpy to the device\n"), 1;
        if (first_rank1 && world == first_world && step == kill_step)
            raise(SIGKILL);
        rc = rk_allreduce(ctx, g, N, RK_F32, RK_SUM);
        if (rc == RK_RECOVERED) {
            step = rk_next_step(ctx);
            recovered++;
            float want = 0;
            for (int64_t s = 0; s < step; s++)
                want += added[s];
            if (cudaMemcpy(h, w, N * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess ||
                check_all(h, want, "the restored weights", (long)step))
                return 1;
            continue;
        }
        if (rc != 0)
            return fail("rk_allreduce", rc);
        if (cudaMemcpy(h, g, N * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess ||
            check_all(h, (float)(world * (world + 1) / 2), "the allreduce's sum", (long)step))
            return 1;
        /* The update, after the gradients' allreduce (the copy of the last snapshot is done). */
        added[step] = (float)(world + 1) / 2;
        if (cudaMemcpy(h, w, N * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
            return printf("FAIL cudaMemcpy from the device\n"), 1;
        for (size_t i = 0; i < N; i++)
            h[i] += added[step];
        if (cudaMemcpy(w, h, N * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            return printf("FAIL cudaMemcpy to the device\n"), 1;
        rc = rk_step_done(ctx, step);
        if (rc == RK_RECOVERED) {
            step = rk_next_step(ctx);
            recovered++;
            continue;
        }
        if (rc != 0)
            return fail("rk_step_done", rc);
        step++;
    }
    if ((rc = rk_wait(ctx)) != 0)
        return fail("rk_wait", rc);
    cudaMemcpy(h, w, sizeof(float), cudaMemcpyDeviceToHost);
    printf("final rank=%d world=%d steps=%ld w=%.9g recovered=%d\n", rk_rank(ctx), rk_world(ctx), (long)step, h[0],
           recovered);
    fflush(stdout);
    rc = rk_finalize(&ctx);
    cudaFree(w);
    cudaFree(g);
    free(h);
    return rc == 0 ? 0 : fail("rk_finalize", rc);
}
