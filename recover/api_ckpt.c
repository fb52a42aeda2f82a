/*
 * recover/api_ckpt.c - the checkpoint engine's seam into the API: rk_register (the
 * registry is recover/registry.c), rk_resume, rk_checkpoint, rk_wait and the hooks
 * rec_ckpt_open/close/step_done. MPI is used here, on the training thread, and nowhere
 * in ckpt/: the job's nonce, the start-up cleaning and the agreement on the step to
 * restore.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "rec_internal.h"

static uint64_t make_nonce(void)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof(n), GRND_NONBLOCK) != (ssize_t)sizeof(n))
        n = (uint64_t)rk__real_ns() ^ ((uint64_t)getpid() << 32);
    return n ? n : 1;
}

int rec_ckpt_open(rk_ctx *ctx)
{
    if (!ctx->opt.ckpt_dir)
        return 0;
    uint64_t nonce = ctx->rank == 0 ? make_nonce() : 0;
    int mrc = MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, ctx->comm);
    if (mrc != MPI_SUCCESS)
        return rec_mpi_fail(mrc, "rk_init: checkpoint nonce");
    ckpt_config cfg = {.dir = ctx->opt.ckpt_dir, .rank = ctx->rank, .world = ctx->world, .keep = ctx->opt.keep,
                       .timeout_ms = ctx->opt.timeout_ms, .io = ctx->opt.io, .nonce = nonce, .ev = ctx->ev};
    /* Rank 0 creates the directory and removes dead attempts before anyone writes. */
    int rc = 0, worst = 0;
    if (ctx->rank == 0 && (rc = ckpt_create(&ctx->ckpt, &cfg)) == 0)
        ckpt_clean_dir(ctx->opt.ckpt_dir);
    if ((mrc = MPI_Bcast(&rc, 1, MPI_INT, 0, ctx->comm)) != MPI_SUCCESS)
        return rec_mpi_fail(mrc, "rk_init: checkpoint directory");
    if (rc) {
        if (ctx->rank != 0)
            rk__set_last_error("rk_init: rank 0 cannot use the checkpoint directory %s (%s)", ctx->opt.ckpt_dir,
                               rk_strerror(rc));
        return rc;
    }
    if (ctx->rank != 0)
        rc = ckpt_create(&ctx->ckpt, &cfg);
    if ((mrc = MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, ctx->comm)) != MPI_SUCCESS)
        return rec_mpi_fail(mrc, "rk_init: checkpoint engine");
    if (worst) {
        ckpt_destroy(&ctx->ckpt);
        if (!rc)
            rk__set_last_error("rk_init: another rank cannot use the checkpoint directory (%s)", rk_strerror(worst));
        return worst;
    }
    return 0;
}

int rec_ckpt_close(rk_ctx *ctx)
{
    return ckpt_destroy(&ctx->ckpt);
}

/* The registry as the engine sees it; malloc'd (NULL with n == 0 is fine). */
static int tensors_of(rk_ctx *ctx, ckpt_tensor **out)
{
    *out = NULL;
    if (ctx->ntensors == 0)
        return 0;
    ckpt_tensor *t = calloc(ctx->ntensors, sizeof(*t));
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < ctx->ntensors; i++) {
        const struct rec_tensor *r = &ctx->tensors[i];
        t[i] = (ckpt_tensor){.name = r->name, .ptr = r->ptr, .dtype = r->dtype, .ndim = r->ndim, .shape = r->shape,
                             .nbytes = r->nbytes};
    }
    *out = t;
    return 0;
}

static int start(rk_ctx *ctx, int64_t step)
{
    ckpt_tensor *t = NULL;
    int rc = tensors_of(ctx, &t);
    if (!rc)
        rc = ckpt_start(ctx->ckpt, step, t, ctx->ntensors);
    free(t);
    return rc;
}

int rec_ckpt_step_done(rk_ctx *ctx, int64_t step)
{
    if (!ctx->ckpt || ctx->opt.ckpt_every <= 0 || (step + 1) % ctx->opt.ckpt_every != 0)
        return 0;
    /* A checkpoint that cannot start is logged, an event, and reported by rk_wait if it
       is a failure (not a skip); training goes on. */
    start(ctx, step + 1);
    return 0;
}

int rk_register(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                const int64_t *shape, unsigned flags)
{
    /* The registry is kept even without checkpoints: rk_resume and recovery use it. */
    return rec_registry_add(ctx, name, ptr, dtype, ndim, shape, flags);
}

int rk_checkpoint(rk_ctx *ctx)
{
    if (!ctx)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_checkpoint: ctx is NULL");
    if (!ctx->ckpt)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "rk_checkpoint: no checkpoint directory (RK_CKPT_DIR)");
    return start(ctx, ctx->next_step);
}

int rk_wait(rk_ctx *ctx)
{
    if (!ctx)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_wait: ctx is NULL");
    return ctx->ckpt ? ckpt_wait(ctx->ckpt) : 0;
}

/* How every rank's attempt at one step ended, ordered so that MPI_MAX picks the worst. */
enum { TRY_OK = 0, TRY_SKIP = 1, TRY_MISMATCH = 2, TRY_FATAL = 3 };

static int try_class(int rc)
{
    if (rc == 0)
        return TRY_OK;
    if (rc == RK_E_MISMATCH)
        return TRY_MISMATCH;
    if (rc == -ENOMEM)
        return TRY_FATAL;
    return TRY_SKIP;
}

int rk_resume(rk_ctx *ctx, int64_t *next_step)
{
    if (!ctx || !next_step)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_resume: %s is NULL", ctx ? "next_step" : "ctx");
    *next_step = ctx->next_step;
    if (!ctx->ckpt)
        return 0; /* no checkpoint directory: nothing to restore */
    ckpt_drain(ctx->ckpt);
    ckpt_tensor *t = NULL;
    int rc = tensors_of(ctx, &t), mrc, skipped = 0;
    if (rc)
        return rc;
    int64_t below = INT64_MAX;
    for (;;) {
        int64_t mine = ckpt_newest_below(ctx->opt.ckpt_dir, below), step = -1;
        if ((mrc = MPI_Allreduce(&mine, &step, 1, MPI_INT64_T, MPI_MIN, ctx->comm)) != MPI_SUCCESS) {
            rc = rec_mpi_fail(mrc, "rk_resume: agreeing on the step");
            break;
        }
        if (step < 0) {
            if (skipped)
                RK_LOG_WARN(RK_SUB_CKPT, "rk_resume: no checkpoint in %s verifies (%d skipped): starting from step %" PRId64,
                            ctx->opt.ckpt_dir, skipped, ctx->next_step);
            rc = 0;
            break;
        }
        int my = try_class(ckpt_restore_step(ctx->opt.ckpt_dir, step, t, ctx->ntensors)), worst = 0;
        if ((mrc = MPI_Allreduce(&my, &worst, 1, MPI_INT, MPI_MAX, ctx->comm)) != MPI_SUCCESS) {
            rc = rec_mpi_fail(mrc, "rk_resume: agreeing on the restore");
            break;
        }
        if (worst == TRY_OK) {
            ctx->next_step = *next_step = step;
            ckpt_note_committed(ctx->ckpt, step);
            RK_LOG_INFO(RK_SUB_CKPT, "resumed from step %" PRId64 " in %s", step, ctx->opt.ckpt_dir);
            RK_EVENT(ctx->ev, "resumed", RK_EV_I("step", step), RK_EV_S("from", "disk"), RK_EV_I("epoch", 0));
            rc = 0;
            break;
        }
        if (worst == TRY_MISMATCH) {
            rc = my == TRY_MISMATCH ? RK_E_MISMATCH
                                    : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH,
                                               "rk_resume: step %" PRId64 " does not match another rank's tensors", step);
            break;
        }
        if (worst == TRY_FATAL) {
            rc = my == TRY_FATAL ? -ENOMEM
                                 : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_ABORTED, "rk_resume: another rank failed");
            break;
        }
        RK_LOG_WARN(RK_SUB_CKPT, "rk_resume: step %" PRId64 " skipped (%s on some rank), trying an older one", step,
                    my == TRY_OK ? "unreadable" : rk_last_error());
        skipped++;
        below = step;
    }
    free(t);
    return rc;
}
