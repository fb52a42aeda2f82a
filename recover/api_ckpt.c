/*
 * recover/api_ckpt.c - the checkpoint engine's seam into the API.
 * rk_register keeps the registry (recover/registry.c). The checkpoint engine (ckpt/,
 * formats/) is not built yet: every function that needs it returns RK_E_NOTAVAIL with a
 * message saying so. Without RK_CKPT_DIR nothing needs it.
 */
#include "rec_internal.h"

static int notavail(const char *fn)
{
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOTAVAIL,
                    "%s: the checkpoint engine is not built yet", fn);
}

int rec_ckpt_open(rk_ctx *ctx)
{
    if (ctx->opt.ckpt_dir)
        return notavail("rk_init (RK_CKPT_DIR is set)");
    return 0;
}

int rec_ckpt_close(rk_ctx *ctx)
{
    (void)ctx;
    return 0;
}

int rec_ckpt_step_done(rk_ctx *ctx, int64_t step)
{
    (void)ctx;
    (void)step;
    return 0; /* no checkpoint engine open: nothing is due */
}

int rk_register(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                const int64_t *shape, unsigned flags)
{
    /* The registry is kept even without checkpoints: rk_resume and recovery use it. */
    return rec_registry_add(ctx, name, ptr, dtype, ndim, shape, flags);
}

int rk_resume(rk_ctx *ctx, int64_t *next_step)
{
    (void)ctx, (void)next_step;
    return notavail("rk_resume");
}

int rk_checkpoint(rk_ctx *ctx)
{
    (void)ctx;
    return notavail("rk_checkpoint");
}

int rk_wait(rk_ctx *ctx)
{
    (void)ctx;
    return notavail("rk_wait");
}
