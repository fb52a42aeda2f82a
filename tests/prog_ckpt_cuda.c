/*
 * tests/prog_ckpt_cuda.c - a worker for the device-tensor checkpoint tests on a GPU
 * (tests/test_ckpt_cuda.c; built only with CUDA, never run without a device). It
 * registers one RK_DEVICE tensor of every dtype (odd sizes, a scalar, a 2-D one) and
 * compares their bytes, copied back with a plain cudaMemcpy, bit for bit with the pattern
 * it wrote (prog_byte_at: random bytes, NaN payloads of the float types included).
 * Prints "ok ..." lines; "FAIL ..." and exit 1 on a wrong result.
 *
 *   persist   one process: state of step s is pattern(s); rk_step_done(0) and (1) with
 *             RK_CKPT_EVERY=1 write checkpoints 1 and 2 from the device; rk_wait; each file's
 *             tensors (rk_reader) are pattern(1) and pattern(2): "ok persist".
 *   generations  one process, RK_CKPT_EVERY=4 (a divisor of GEN_STEPS), one more device
 *             tensor (model/big, BIG bytes, each byte the step's low byte: a cudaMemset):
 *             GEN_STEPS steps, each one cudaMemcpy per tensor (the patterns made
 *             beforehand) and the memset, so the disk writes (BIG bytes each) outlast the
 *             snapshot-only steps between checkpoints and the held snapshot takes a third
 *             staging region (ckpt/snapshot.h S6), pinned like the others (at most 3:
 *             ckpt/copy_cuda.c); rk_wait; every checkpoint left in the directory holds its
 *             step's bytes, the newest the last step's: "ok generations K checkpoints".
 *   restore   one process: the tensors filled with 0xa5, rk_resume: next step 2, the
 *             device holds pattern(2): "ok restore".
 *   rollback V  several ranks: in step s, an allreduce (the gradients), the update to
 *             pattern(s+1), a second allreduce (a metric), rk_step_done(s). At step 4 rank
 *             V dies between the update and the second allreduce; the survivors' second
 *             allreduce returns RK_RECOVERED, and their device tensors must hold
 *             pattern(rk_next_step()) again (from the survivors' memory or the disk:
 *             RK_ROLLBACK); they train on two more steps: "ok rollback next=N world=W".
 */
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prog_common.h"

static int g_rank;

#define FAIL(...) PROG_FAIL(g_rank, __VA_ARGS__)

#define SEED 2727u

static const struct tdef {
    const char *name;
    rk_dtype dtype;
    size_t esize;
    int ndim;
    int64_t shape[2];
} defs[] = {
    {"model/w_f32", RK_F32, 4, 1, {1000003}},
    {"model/scale_f64", RK_F64, 8, 0, {0}},
    {"model/w_f16", RK_F16, 2, 1, {65537}},
    {"model/w_bf16", RK_BF16, 2, 2, {257, 129}},
    {"opt/count_i32", RK_I32, 4, 1, {3}},
    {"opt/step_i64", RK_I64, 8, 1, {1}},
    {"data/bytes_u8", RK_U8, 1, 1, {(1 << 22) + 5}},
};
#define NT (sizeof(defs) / sizeof(defs[0]))

static size_t nbytes(size_t t)
{
    size_t n = defs[t].esize;
    for (int k = 0; k < defs[t].ndim; k++)
        n *= (size_t)defs[t].shape[k];
    return n;
}

static void pattern(size_t t, int64_t step, uint8_t *h)
{
    for (size_t i = 0; i < nbytes(t); i++)
        h[i] = prog_byte_at(t, i, step, SEED);
}

static void *dev[NT];

static void set_state(int64_t step)
{
    for (size_t t = 0; t < NT; t++) {
        uint8_t *h = malloc(nbytes(t));
        pattern(t, step, h);
        cudaError_t e = cudaMemcpy(dev[t], h, nbytes(t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            FAIL("cudaMemcpy to %s: %s", defs[t].name, cudaGetErrorString(e));
        free(h);
    }
}

/* The device's bytes (cudaMemcpy) against pattern(step), tensor by tensor. */
static void check_state(int64_t step, const char *what)
{
    for (size_t t = 0; t < NT; t++) {
        uint8_t *want = malloc(nbytes(t)), *got = malloc(nbytes(t));
        pattern(t, step, want);
        cudaError_t e = cudaMemcpy(got, dev[t], nbytes(t), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            FAIL("%s: cudaMemcpy from %s: %s", what, defs[t].name, cudaGetErrorString(e));
        if (memcmp(want, got, nbytes(t)) != 0) {
            size_t i = 0;
            while (want[i] == got[i])
                i++;
            FAIL("%s: %s byte %zu of %zu is %#x, want %#x (pattern of step %lld)", what, defs[t].name, i,
                 nbytes(t), got[i], want[i], (long long)step);
        }
        free(want);
        free(got);
    }
}

/* generations only: the big tensor (0 bytes: not registered). */
enum { BIG = 64 << 20 };
static size_t g_big;
static void *g_big_dev;

static rk_ctx *start(void)
{
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        _exit(3);
    g_rank = rk_rank(ctx);
    for (size_t t = 0; t < NT; t++) {
        cudaError_t e = cudaMalloc(&dev[t], nbytes(t));
        if (e != cudaSuccess)
            FAIL("cudaMalloc %s: %s", defs[t].name, cudaGetErrorString(e));
        cudaMemset(dev[t], 0xa5, nbytes(t));
        int rc = rk_register(ctx, defs[t].name, dev[t], defs[t].dtype, defs[t].ndim, defs[t].shape, RK_DEVICE);
        if (rc != 0)
            FAIL("rk_register %s: %s: %s", defs[t].name, rk_strerror(rc), rk_last_error());
    }
    if (g_big) {
        int64_t shape[1] = {(int64_t)g_big};
        if (cudaMalloc(&g_big_dev, g_big) != cudaSuccess)
            FAIL("cudaMalloc model/big");
        int rc = rk_register(ctx, "model/big", g_big_dev, RK_U8, 1, shape, RK_DEVICE);
        if (rc != 0)
            FAIL("rk_register model/big: %s: %s", rk_strerror(rc), rk_last_error());
    }
    return ctx;
}

static void finish(rk_ctx *ctx)
{
    int rc = rk_finalize(&ctx);
    if (rc != 0)
        FAIL("rk_finalize: %s: %s", rk_strerror(rc), rk_last_error());
    for (size_t t = 0; t < NT; t++)
        cudaFree(dev[t]);
    cudaFree(g_big_dev);
    g_big_dev = NULL;
}

/* The tensors of checkpoint `step` in the directory, read with rk_reader: pattern(step).
   False if there is no such checkpoint and `must` is not set. */
static bool check_file_if(int64_t step, bool must)
{
    const char *dir = getenv("RK_CKPT_DIR");
    rk_reader *r = NULL;
    int rc = rk_reader_open(&r, dir, step);
    if (rc == RK_E_NOCKPT && !must)
        return false;
    if (rc != 0)
        FAIL("rk_reader_open %s step %lld: %s: %s", dir, (long long)step, rk_strerror(rc), rk_last_error());
    size_t want_n = NT + (g_big > 0);
    if (rk_reader_count(r) != want_n)
        FAIL("checkpoint %lld holds %zu tensors, want %zu", (long long)step, rk_reader_count(r), want_n);
    for (size_t i = 0; i < want_n; i++) {
        rk_tensor_info info;
        if (rk_reader_info(r, i, &info) != 0)
            FAIL("rk_reader_info %zu", i);
        if (strcmp(info.name, "model/big") == 0) {
            uint8_t *got = malloc(g_big);
            if (info.nbytes != g_big || rk_reader_read(r, i, got, g_big) != 0)
                FAIL("checkpoint %lld: model/big: %llu bytes, or unreadable", (long long)step,
                     (unsigned long long)info.nbytes);
            for (size_t b = 0; b < g_big; b++)
                if (got[b] != (uint8_t)step)
                    FAIL("checkpoint %lld: model/big byte %zu is %#x, want %#x", (long long)step, b, got[b],
                         (uint8_t)step);
            free(got);
            continue;
        }
        size_t t = 0;
        while (t < NT && strcmp(defs[t].name, info.name) != 0)
            t++;
        if (t == NT)
            FAIL("checkpoint %lld holds an unknown tensor %s", (long long)step, info.name);
        if (info.nbytes != nbytes(t) || info.dtype != defs[t].dtype || info.ndim != defs[t].ndim)
            FAIL("checkpoint %lld: %s has %llu bytes, dtype %d, ndim %d", (long long)step, info.name,
                 (unsigned long long)info.nbytes, (int)info.dtype, info.ndim);
        uint8_t *want = malloc(nbytes(t)), *got = malloc(nbytes(t));
        pattern(t, step, want);
        rc = rk_reader_read(r, i, got, nbytes(t));
        if (rc != 0)
            FAIL("rk_reader_read %s: %s", info.name, rk_strerror(rc));
        if (memcmp(want, got, nbytes(t)) != 0)
            FAIL("checkpoint %lld: the file's %s differs from what the device held", (long long)step, info.name);
        free(want);
        free(got);
    }
    rk_reader_close(&r);
    return true;
}

static void check_file(int64_t step)
{
    check_file_if(step, true);
}

/* Steps 0..n-1, each the update to the state of step s + 1 then rk_step_done(s); rk_wait. */
static void train(rk_ctx *ctx, int64_t n, void (*update)(int64_t step))
{
    for (int64_t s = 0; s < n; s++) {
        /* Device tensors may change only once the last snapshot's copy is done: after the
           next rk_allreduce, or here, with no allreduce, after rk_before_update (rekindle.h,
           RK_DEVICE). Without it a checkpoint's copy, still running on the library's
           non-blocking stream, read the next step's bytes (seen on an H200: checkpoint 8 torn). */
        rk_before_update(ctx);
        update(s + 1);
        int rc = rk_step_done(ctx, s);
        if (rc != 0)
            FAIL("rk_step_done(%lld): %s: %s", (long long)s, rk_strerror(rc), rk_last_error());
    }
    int rc = rk_wait(ctx);
    if (rc != 0)
        FAIL("rk_wait: %s: %s", rk_strerror(rc), rk_last_error());
}

static int persist(void)
{
    rk_ctx *ctx = start();
    train(ctx, 2, set_state);
    check_file(1);
    check_file(2);
    check_state(2, "after the checkpoints");
    finish(ctx);
    printf("ok persist %zu device tensors\n", NT);
    return 0;
}

enum { GEN_STEPS = 16 };
static uint8_t *g_pat[GEN_STEPS + 1][NT]; /* pattern(t, step), made beforehand */

/* The state of `step` in a few milliseconds: one cudaMemcpy per tensor, one memset. */
static void gen_update(int64_t step)
{
    for (size_t t = 0; t < NT; t++) {
        cudaError_t e = cudaMemcpy(dev[t], g_pat[step][t], nbytes(t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            FAIL("cudaMemcpy to %s: %s", defs[t].name, cudaGetErrorString(e));
    }
    if (cudaMemset(g_big_dev, (int)(uint8_t)step, g_big) != cudaSuccess)
        FAIL("cudaMemset model/big");
}

static int generations(void)
{
    g_big = BIG;
    rk_ctx *ctx = start();
    for (int64_t s = 1; s <= GEN_STEPS; s++)
        for (size_t t = 0; t < NT; t++) {
            g_pat[s][t] = malloc(nbytes(t));
            pattern(t, s, g_pat[s][t]);
        }
    train(ctx, GEN_STEPS, gen_update);
    check_state(GEN_STEPS, "after the checkpoints");
    /* rk_wait does not wait for the retention that follows the last commit (rekindle.h);
       rk_finalize does: the files are read once nothing removes them any more. */
    finish(ctx);
    int k = 0;
    for (int64_t s = 1; s <= GEN_STEPS; s++)
        k += check_file_if(s, s == GEN_STEPS);
    for (int64_t s = 1; s <= GEN_STEPS; s++)
        for (size_t t = 0; t < NT; t++)
            free(g_pat[s][t]);
    printf("ok generations %d checkpoints\n", k);
    return 0;
}

static int restore(void)
{
    rk_ctx *ctx = start();
    int64_t next = -1;
    int rc = rk_resume(ctx, &next);
    if (rc != 0 || next != 2)
        FAIL("rk_resume: %s (%s), next step %lld, want 2", rk_strerror(rc), rk_last_error(), (long long)next);
    check_state(2, "restored");
    finish(ctx);
    printf("ok restore\n");
    return 0;
}

static int allreduce_one(rk_ctx *ctx)
{
    float x = 1.0f;
    return rk_allreduce(ctx, &x, 1, RK_F32, RK_SUM);
}

static int rollback(int victim)
{
    rk_ctx *ctx = start();
    int64_t next = 0;
    int rc = rk_resume(ctx, &next);
    if (rc != 0 || next != 0)
        FAIL("rk_resume of a fresh job: %s, next %lld", rk_strerror(rc), (long long)next);
    set_state(0);
    bool recovered = false;
    for (int64_t s = 0; s < (recovered ? next + 2 : 8); s++) {
        rc = allreduce_one(ctx);
        if (rc == 0) {
            set_state(s + 1); /* the update, after the gradients' allreduce */
            if (s == 4 && g_rank == victim && !recovered) {
                fflush(stdout);
                raise(SIGKILL);
            }
            rc = allreduce_one(ctx);
        }
        if (rc == RK_RECOVERED) {
            if (recovered)
                FAIL("a second recovery at step %lld", (long long)s);
            recovered = true;
            next = rk_next_step(ctx);
            if (next < 1 || next > 5)
                FAIL("resumed at step %lld", (long long)next);
            check_state(next, "rolled back");
            printf("ok rollback next=%lld world=%d\n", (long long)next, rk_world(ctx));
            fflush(stdout);
            s = next - 1;
            continue;
        }
        if (rc != 0)
            FAIL("allreduce at step %lld: %s: %s", (long long)s, rk_strerror(rc), rk_last_error());
        rc = rk_step_done(ctx, s);
        if (rc != 0)
            FAIL("rk_step_done(%lld): %s: %s", (long long)s, rk_strerror(rc), rk_last_error());
    }
    if (!recovered)
        FAIL("no recovery");
    check_state(next + 2, "two steps after the rollback");
    rk_wait(ctx);
    finish(ctx);
    printf("ok trained on\n");
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "persist") == 0)
        return persist();
    if (argc >= 2 && strcmp(argv[1], "generations") == 0)
        return generations();
    if (argc >= 2 && strcmp(argv[1], "restore") == 0)
        return restore();
    if (argc >= 3 && strcmp(argv[1], "rollback") == 0)
        return rollback(atoi(argv[2]));
    fprintf(stderr, "usage: prog_ckpt_cuda persist | restore | rollback VICTIM\n");
    return 2;
}
