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
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../ring/ring.h"
#include "rec.h"
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
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, "rk_init: checkpoint nonce");
    /* A spare writes nothing until recovery gives it a rank (ckpt_set_membership). */
    ckpt_config cfg = {.dir = ctx->opt.ckpt_dir, .rank = ctx->is_spare ? 0 : ctx->rank, .world = ctx->is_spare ? 1 : ctx->world,
                       .keep = ctx->opt.keep, .timeout_ms = ctx->opt.timeout_ms, .io = ctx->opt.io, .nonce = nonce,
                       .ev = ctx->ev};
    /* Rank 0 creates the directory and removes dead attempts before anyone writes. */
    int rc = 0, worst = 0;
    if (ctx->rank == 0 && (rc = ckpt_create(&ctx->ckpt, &cfg)) == 0)
        ckpt_clean_dir(ctx->opt.ckpt_dir);
    if ((mrc = MPI_Bcast(&rc, 1, MPI_INT, 0, ctx->comm)) != MPI_SUCCESS)
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, "rk_init: checkpoint directory");
    if (rc) {
        if (ctx->rank != 0)
            rk__set_last_error("rk_init: rank 0 cannot use the checkpoint directory %s (%s)", ctx->opt.ckpt_dir,
                               rk_strerror(rc));
        return rc;
    }
    if (ctx->rank != 0)
        rc = ckpt_create(&ctx->ckpt, &cfg);
    if ((mrc = MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, ctx->comm)) != MPI_SUCCESS)
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, "rk_init: checkpoint engine");
    if (worst) {
        ckpt_destroy(&ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms));
        if (!rc)
            rk__set_last_error("rk_init: another rank cannot use the checkpoint directory (%s)", rk_strerror(worst));
        return worst;
    }
    return 0;
}

/* Waits until the checkpoint in flight is committed or failed, or until the deadline; if
   the detector sees a member go meanwhile, the commit (which would wait for that member's
   shard) is abandoned at once instead of at its deadline. Returns like ckpt_wait. */
static int settle(rk_ctx *ctx, int64_t deadline)
{
    for (;;) {
        int64_t slice = rk__deadline_ns(20);
        if (ckpt_idle_by(ctx->ckpt, slice < deadline ? slice : deadline) || rk__deadline_passed(deadline))
            break;
        if (rec_membership_changed(ctx)) {
            ckpt_abandon(ctx->ckpt);
            break;
        }
    }
    return ckpt_wait(ctx->ckpt, deadline);
}

int rec_ckpt_close(rk_ctx *ctx)
{
    if (!ctx->ckpt)
        return 0;
    int64_t deadline = rk__deadline_ns(ctx->opt.timeout_ms);
    int rc = settle(ctx, deadline);
    int drc = ckpt_destroy(&ctx->ckpt, deadline);
    return drc == RK_E_TIMEOUT || !rc ? drc : rc; /* a writer left behind first (rk_finalize) */
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
    if (!ctx->ckpt)
        return 0;
    return settle(ctx, rk__deadline_ns(ctx->opt.timeout_ms));
}

/* How every rank's attempt at one step ended, ordered so that MAX picks the worst. */
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

/* A collective among the current members, over the ring (which excludes lost ranks),
   abandoned as soon as the detector sees another member go. */
static int ring_call(rk_ctx *ctx, void *v, size_t count, rk_dtype dtype, rk_op op)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    return ring_allreduce(ctx->ring, v, count, dtype, op, &cancel);
}

static int agree(rk_ctx *ctx, void *v, rk_dtype dtype, rk_op op)
{
    return ring_call(ctx, v, 1, dtype, op);
}

/* Restores, on every member, the first checkpoint of ckpt_list's order (the current
   timeline newest first, then the abandoned ones) labelled below `below` that verifies on
   every member, and holds it in memory. Rank 0 proposes each candidate from its listing;
   every member reads it into staging (ckpt_load), and the registered buffers are written
   only once all of them read it whole. Every member returns the same: 0 with *step the
   step restored, or -1 if the directory holds no checkpoint below `below` (buffers
   untouched); RK_E_CORRUPT if it holds some but none verifies everywhere, -errno if a
   member cannot list the directory, RK_E_MISMATCH (buffers untouched in each case).
   Collective over the ring. */
static int restore_newest(rk_ctx *ctx, const ckpt_tensor *t, int64_t below, int64_t *step)
{
    ckpt_entry *l = NULL;
    size_t n = 0, next = 0;
    int skipped = 0;
    *step = -1;
    int my_list = ckpt_list(ctx->opt.ckpt_dir, &l, &n), list = my_list;
    int rc = agree(ctx, &list, RK_I32, RK_MIN); /* an unreadable directory is never "nothing there" */
    if (!rc && list)
        rc = my_list ? my_list
                     : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, list, "another member cannot list the checkpoint directory %s (%s)",
                                ctx->opt.ckpt_dir, rk_strerror(list));
    while (!rc) {
        int64_t s = INT64_MIN;
        if (ctx->rank == 0) {
            while (next < n && l[next].step >= below)
                next++;
            s = next < n ? l[next++].step : -1;
        }
        if ((rc = agree(ctx, &s, RK_I64, RK_MAX)) != 0)
            break;
        if (s < 0) {
            if (skipped)
                rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CORRUPT,
                              "none of the %d committed checkpoints in %s verifies on every member", skipped,
                              ctx->opt.ckpt_dir);
            break;
        }
        int my = try_class(ckpt_load(ctx->ckpt, s, t, ctx->ntensors)), worst = my;
        if ((rc = agree(ctx, &worst, RK_I32, RK_MAX)) != 0)
            break;
        if (worst == TRY_OK) { /* every member holds it whole: only now the buffers change */
            *step = s;
            ckpt_note_committed(ctx->ckpt, s);
            rc = ckpt_restore_held(ctx->ckpt, t, ctx->ntensors);
            break;
        }
        if (worst == TRY_MISMATCH) {
            rc = my == TRY_MISMATCH ? RK_E_MISMATCH
                                    : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH,
                                               "step %" PRId64 " does not match another rank's tensors", s);
            break;
        }
        if (worst == TRY_FATAL) {
            rc = my == TRY_FATAL ? -ENOMEM : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_ABORTED, "another rank failed");
            break;
        }
        RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 " skipped (%s on some rank), trying an older one", s,
                    my == TRY_OK ? "unreadable" : rk_last_error());
        skipped++;
    }
    free(l);
    return rc;
}

int rk_resume(rk_ctx *ctx, int64_t *next_step)
{
    if (!ctx || !next_step)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_resume: %s is NULL", ctx ? "next_step" : "ctx");
    *next_step = ctx->next_step;
    if (ctx->is_spare) {
        int src = rec_spare_wait(ctx); /* the state comes with the decision that needs us */
        *next_step = ctx->next_step;
        return src;
    }
    if (!ctx->ckpt)
        return 0; /* no checkpoint directory: nothing to restore */
    /* A checkpoint still in flight may commit a newer step first; it gets RK_TIMEOUT_MS,
       then it is abandoned (its failure is reported by rk_wait). */
    if (ckpt_busy(ctx->ckpt) && settle(ctx, rk__deadline_ns(ctx->opt.timeout_ms)) == RK_E_TIMEOUT)
        ckpt_abandon(ctx->ckpt);
    ckpt_tensor *t = NULL;
    int64_t step = -1;
    int rc = tensors_of(ctx, &t);
    if (!rc)
        rc = restore_newest(ctx, t, INT64_MAX, &step);
    if (!rc && step >= 0) {
        ctx->next_step = *next_step = step;
        RK_LOG_INFO(RK_SUB_CKPT, "resumed from step %" PRId64 " in %s", step, ctx->opt.ckpt_dir);
        RK_EVENT(ctx->ev, "resumed", RK_EV_I("step", step), RK_EV_S("from", "disk"),
                 RK_EV_I("epoch", ctx->agreed_epoch));
    } else if (!rc) {
        /* Nothing on disk: hold the state the program starts from, so that a failure before
           the first checkpoint can still roll back in memory. */
        rc = ckpt_hold(ctx->ckpt, ctx->next_step, t, ctx->ntensors);
    }
    free(t);
    return rc;
}

/* ---- recovery's needs (recover/recovery.c) -------------------------------------------- */

int64_t rec_ckpt_held_step(rk_ctx *ctx)
{
    if (!ctx->ckpt || ckpt_held_step(ctx->ckpt) < 0)
        return -1;
    /* A snapshot taken before a tensor was registered cannot restore it: not offered. */
    ckpt_tensor *t = NULL;
    if (tensors_of(ctx, &t))
        return -1;
    int64_t step = ckpt_held_matches(ctx->ckpt, t, ctx->ntensors) ? ckpt_held_step(ctx->ckpt) : -1;
    free(t);
    return step;
}

int64_t rec_ckpt_committed_step(rk_ctx *ctx)
{
    return ctx->ckpt ? ckpt_last_committed(ctx->ckpt) : -1;
}

void rec_ckpt_abandon(rk_ctx *ctx)
{
    if (ctx->ckpt)
        ckpt_abandon(ctx->ckpt);
}

/* Every member gets the root's held snapshot: the root contributes its bytes and the
   others zeros to an exact byte-wise MAX over the ring (abortable, unlike MPI_Bcast). */
static int spread_held(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t)
{
    bool root = ctx->rank0 == dec->root;
    bool have = root && ckpt_held_step(ctx->ckpt) == dec->step && ckpt_held_matches(ctx->ckpt, t, ctx->ntensors);
    for (size_t i = 0; i < ctx->ntensors; i++) {
        if (!t[i].nbytes)
            continue;
        if (have)
            memcpy(t[i].ptr, ckpt_held_tensor(ctx->ckpt, i), t[i].nbytes);
        else
            memset(t[i].ptr, 0, t[i].nbytes);
        int rc = ring_call(ctx, t[i].ptr, t[i].nbytes, RK_U8, RK_MAX);
        if (rc)
            return rc;
    }
    if (root && !have) /* the ring calls above still ran: the others are not left waiting */
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL,
                        "rollback: the snapshot of step %" PRId64 " is no longer held for these tensors", dec->step);
    return root ? 0 : ckpt_hold(ctx->ckpt, dec->step, t, ctx->ntensors);
}

int rec_ckpt_rollback(rk_ctx *ctx, const rec_decision *dec)
{
    if (ctx->ntensors == 0)
        return 0; /* no registered state: nothing to roll back, each member goes on */
    if (!ctx->ckpt)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT,
                        "a member was lost and there is no snapshot to roll back to (set RK_CKPT_DIR)");
    /* The commit in flight belonged to the old membership: cancel it, write as the new one. */
    ckpt_set_membership(ctx->ckpt, ctx->rank, ctx->world, dec->epoch);
    ckpt_tensor *t = NULL;
    int rc = tensors_of(ctx, &t);
    if (rc)
        return rc;
    if (dec->source == REC_FROM_MEMORY && dec->all_hold) {
        rc = ckpt_held_step(ctx->ckpt) == dec->step
                 ? ckpt_restore_held(ctx->ckpt, t, ctx->ntensors)
                 : rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: the snapshot of step %" PRId64
                            " is no longer held", dec->step);
        ctx->next_step = dec->step;
    } else if (dec->source == REC_FROM_MEMORY) {
        rc = spread_held(ctx, dec, t);
        ctx->next_step = dec->step;
    } else if (dec->source == REC_FROM_DISK) {
        int64_t step = -1;
        rc = restore_newest(ctx, t, dec->step + 1, &step);
        if (!rc && step < 0)
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT, "rollback: no checkpoint up to step %" PRId64
                          " in %s verifies", dec->step, ctx->opt.ckpt_dir);
        ctx->next_step = step;
    } else {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT, "rollback: no snapshot in memory or on disk");
    }
    /* Rank 0's writer removes what dead attempts left before it writes again (never the
       training thread: recovery does not wait on the disk). */
    int worst = rc ? 1 : 0;
    int arc = agree(ctx, &worst, RK_I32, RK_MAX);
    if (!rc && !arc && !worst && ctx->rank == 0)
        ckpt_request_clean(ctx->ckpt);
    free(t);
    if (rc)
        return rc;
    if (arc)
        return arc;
    return worst ? rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_ABORTED, "rollback failed on another member") : 0;
}
