/*
 * tests/prog_ckpt.c - a worker for the checkpoint engine's integration tests, run alone or
 * under mpirun. Registers a fixed set of tensors (every dtype, odd sizes, nested names),
 * whose contents at step s are a function of (tensor, s, seed).
 *   prog_ckpt write STEPS SEED [big]   runs STEPS steps (checkpoints per RK_CKPT_*), scribbles
 *                                      over every buffer right after each rk_step_done,
 *                                      rk_wait; prints "rank R wrote (peak resident K kB)"
 *                                      (exit 0) or the error
 *   prog_ckpt continue STEPS SEED      rk_resume, then as write from the step it resumed at
 *                                      up to STEPS; also prints "rank R ops OP=N ..." (the
 *                                      file operations counted by RK_FAULT, common/common.h)
 *   prog_ckpt resume EXPECT SEED [big] rk_resume; checks next_step == EXPECT and every byte;
 *                                      prints "rank R resumed S" (exit 0; EXPECT -1: none)
 *                                      and the operations counted, as continue
 *   prog_ckpt perrank STEPS SEED       one per-rank tensor: STEPS steps of rk_allreduce, the
 *                                      update, rk_step_done; then removes RK_FAULT_HOLD's file
 *                                      (a held copy ends), rk_wait (its result printed, not
 *                                      judged), rk_finalize; prints "rank R stepped N" (exit 0)
 *   prog_ckpt other                    registers a different set and calls rk_resume; prints
 *                                      the code's name
 *   prog_ckpt untouched 0 SEED [big]   fills every buffer with 0x5A, rk_resume; prints
 *                                      "rank R resume: CODE next N untouched 0|1" (exit 0),
 *                                      untouched 1 when every buffer still holds only 0x5A
 * Exit: 0 ok, 3 rk_* failed, 4 wrong data.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "prog_common.h"
#include "rekindle.h"

struct spec {
    const char *name;
    rk_dtype dtype;
    int ndim;
    int64_t shape[3];
};

static const struct spec specs[] = {
    {"weights/f32", RK_F32, 2, {3, 7}},      {"weights/f64", RK_F64, 1, {4097}},
    {"half/f16", RK_F16, 1, {33}},           {"half/bf16", RK_BF16, 2, {5, 9}},
    {"ints/i32", RK_I32, 1, {1}},            {"ints/i64", RK_I64, 0, {0}},
    {"bytes", RK_U8, 1, {1000}},             {"empty", RK_F32, 1, {0}},
    {"deep/a/b/c/name with spaces", RK_F32, 1, {4097}},
    {"big", RK_U8, 1, {16 * 1024 * 1024 + 12}},
};

static size_t nspecs(bool big)
{
    return RK_ARRAY_LEN(specs) - (big ? 0 : 1);
}

static uint8_t byte_at(size_t t, uint64_t i, int64_t step, uint64_t seed)
{
    return prog_byte_at(t, i, step, seed);
}

static void fill(uint8_t *p, size_t n, size_t t, int64_t step, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = byte_at(t, i, step, seed);
}

static size_t nbytes_of(const struct spec *s)
{
    size_t n = rk__dtype_size(s->dtype);
    for (int d = 0; d < s->ndim; d++)
        n *= (size_t)s->shape[d];
    return n;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, rk_strerror(rc), rk_last_error());
    return 3;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    bool big = argc > 4 && strcmp(argv[4], "big") == 0;
    int64_t arg = argc > 2 ? strtoll(argv[2], NULL, 10) : 0;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o), status = 0;
    if (rc)
        return fail("rk_init", rc);
    size_t n = nspecs(big);
    uint8_t *buf[RK_ARRAY_LEN(specs)] = {0};
    if (strcmp(mode, "other") == 0) {
        int64_t shape = 5, next = 0;
        static float x[5];
        rk_register(ctx, "weights/f32", x, RK_F32, 1, &shape, 0);
        rc = rk_resume(ctx, &next);
        printf("rank %d resume: %s\n", rk_rank(ctx), rc == RK_E_MISMATCH ? "RK_E_MISMATCH" : rk_strerror(rc));
        printf("untouched %d\n", x[0] == 0.0f && x[4] == 0.0f);
        rk_finalize(&ctx);
        return 0;
    }
    if (strcmp(mode, "perrank") == 0) {
        static float own[4096], grad[16];
        int64_t shape = RK_ARRAY_LEN(own);
        if ((rc = rk_register(ctx, "own", own, RK_F32, 1, &shape, RK_PER_RANK)) != 0)
            return fail("rk_register", rc);
        for (int64_t s = 0; s < arg; s++) {
            if ((rc = rk_allreduce(ctx, grad, RK_ARRAY_LEN(grad), RK_F32, RK_SUM)) < 0)
                return fail("rk_allreduce", rc);
            for (size_t i = 0; i < RK_ARRAY_LEN(own); i++)
                own[i] = (float)(s + 1);
            if ((rc = rk_step_done(ctx, s)) < 0)
                return fail("rk_step_done", rc);
        }
        if (getenv("RK_FAULT_HOLD"))
            unlink(getenv("RK_FAULT_HOLD"));
        rc = rk_wait(ctx);
        printf("rank %d stepped %" PRId64 " (rk_wait: %s)\n", rk_rank(ctx), arg, rk_strerror(rc));
        rc = rk_finalize(&ctx);
        return rc ? fail("rk_finalize", rc) : 0;
    }
    for (size_t t = 0; t < n; t++) {
        buf[t] = malloc(nbytes_of(&specs[t]) + 1);
        if ((rc = rk_register(ctx, specs[t].name, buf[t], specs[t].dtype, specs[t].ndim, specs[t].shape, 0)) != 0)
            return fail("rk_register", rc);
    }
    bool cont = strcmp(mode, "continue") == 0;
    if (strcmp(mode, "write") == 0 || cont) {
        int64_t from = 0;
        if (cont && (rc = rk_resume(ctx, &from)) != 0)
            return fail("rk_resume", rc);
        for (int64_t s = from; s < arg; s++) {
            for (size_t t = 0; t < n; t++)
                fill(buf[t], nbytes_of(&specs[t]), t, s + 1, seed);
            if ((rc = rk_step_done(ctx, s)) < 0)
                return fail("rk_step_done", rc);
            rk_before_update(ctx); /* the step's snapshot may still be copying (rekindle.h) */
            for (size_t t = 0; t < n; t++) /* must not reach the checkpoint */
                memset(buf[t], 0xA5, nbytes_of(&specs[t]));
        }
        rc = rk_wait(ctx);
        if (rc) {
            status = fail("rk_wait", rc);
        } else {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            printf("rank %d wrote (peak resident %ld kB)\n", rk_rank(ctx), ru.ru_maxrss);
        }

    } else if (strcmp(mode, "untouched") == 0) {
        int64_t next = -2;
        bool same = true;
        for (size_t t = 0; t < n; t++)
            memset(buf[t], 0x5A, nbytes_of(&specs[t]));
        rc = rk_resume(ctx, &next);
        for (size_t t = 0; t < n; t++)
            for (size_t i = 0; i < nbytes_of(&specs[t]); i++)
                same &= buf[t][i] == 0x5A;
        printf("rank %d resume: %d next %" PRId64 " untouched %d (%s)\n", rk_rank(ctx), rc, next, same,
               rc ? rk_last_error() : "ok");
    } else if (strcmp(mode, "resume") == 0) {
        int64_t next = -2;
        for (size_t t = 0; t < n; t++)
            memset(buf[t], 0x5A, nbytes_of(&specs[t]));
        if ((rc = rk_resume(ctx, &next)) != 0)
            return fail("rk_resume", rc);
        if (arg < 0 ? next != 0 : next != arg) {
            fprintf(stderr, "next_step %" PRId64 ", want %" PRId64 "\n", next, arg);
            status = 4;
        }
        for (size_t t = 0; arg >= 0 && t < n && !status; t++)
            for (size_t i = 0; i < nbytes_of(&specs[t]); i++)
                if (buf[t][i] != byte_at(t, i, next, seed)) {
                    fprintf(stderr, "tensor %s byte %zu differs\n", specs[t].name, i);
                    status = 4;
                    break;
                }
        if (!status)
            printf("rank %d resumed %" PRId64 "\n", rk_rank(ctx), next);
    }
    int me = rk_rank(ctx);
    rc = rk_finalize(&ctx);
    if (cont || strcmp(mode, "resume") == 0) { /* rk_finalize's file operations count too */
        printf("rank %d ops", me);
        for (int op = 0; op < RK_FAULT_OP_COUNT; op++)
            printf(" %s=%" PRIu64, rk__fault_op_name((enum rk__fault_op)op), rk__fault_count((enum rk__fault_op)op));
        printf("\n");
    }
    for (size_t t = 0; t < n; t++)
        free(buf[t]);
    if (rc && !status)
        status = fail("rk_finalize", rc);
    if (rc == RK_E_TIMEOUT) { /* a writer stuck in HDF5 would hold up its exit handler */
        printf("rank finalized: %s\n", rk_strerror(rc));
        fflush(NULL);
        _exit(status);
    }
    return status;
}
