/*
 * recover/api_ckpt.c - the checkpoint engine's seam into the API: rk_register (the
 * registry is recover/registry.c), rk_shard_rows, rk_rebind, rk_resume, rk_checkpoint,
 * rk_wait and the hooks rec_ckpt_open/close/step_done/copied/mirror. MPI is used here, on
 * the training thread, and nowhere in ckpt/: the job's nonce, the start-up cleaning, the
 * agreement on registrations and the partner copy. The rollback after a loss, and the
 * restore of the newest checkpoint that verifies everywhere (rk_resume's), are
 * recover/rollback.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../formats/fmt.h"
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

/* Rank 0's *v to every rank, or (min) the minimum of *v over the ranks, through a
   nonblocking collective bounded as rk_init's are (rec_start_wait): *v in, the result out. */
static int start_coll(rk_ctx *ctx, int64_t *v, bool min, const char *what)
{
    int64_t *b = malloc(2 * sizeof(*b)); /* MPI's for good if given up on */
    MPI_Request rq;
    if (!b)
        return -ENOMEM;
    b[0] = b[1] = *v;
    int mrc = min ? MPI_Iallreduce(&b[1], &b[0], 1, MPI_INT64_T, MPI_MIN, ctx->comm, &rq)
                  : MPI_Ibcast(&b[0], 1, MPI_INT64_T, 0, ctx->comm, &rq);
    if (mrc != MPI_SUCCESS) {
        free(b);
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, what);
    }
    int rc = rec_start_wait(ctx, &rq, b, what);
    if (rc == 0) {
        *v = b[0];
        free(b);
    }
    return rc;
}

int rec_ckpt_open(rk_ctx *ctx)
{
    ctx->disk_newest = -1;
    if (!ctx->opt.ckpt_dir)
        return 0;
    bool newcomer = ctx->rank0 >= ctx->world0; /* started later: the nonce came with its welcome */
    uint64_t nonce = newcomer ? ctx->ckpt_nonce : ctx->rank == 0 ? make_nonce() : 0;
    int64_t v = (int64_t)nonce;
    int rc = newcomer ? 0 : start_coll(ctx, &v, false, "rk_init: MPI_Ibcast of the checkpoint nonce");
    if (rc)
        return rc;
    nonce = ctx->ckpt_nonce = (uint64_t)v;
    /* A spare writes nothing until recovery gives it a rank (ckpt_set_membership). */
    ckpt_config cfg = {.dir = ctx->opt.ckpt_dir, .rank = ctx->is_spare ? 0 : ctx->rank, .world = ctx->is_spare ? 1 : ctx->world,
                       .keep = ctx->opt.keep, .timeout_ms = ctx->opt.timeout_ms, .io = ctx->opt.io, .nonce = nonce,
                       .ev = ctx->ev, .member_lost = rec_ring_changed, .member_lost_arg = ctx,
                       .cuda_stream = ctx->opt.cuda_stream, .shared_reads = ctx->host_ranks > 1,
                       .one_copy = ctx->opt.snapshot_every == 0};
    int64_t worst = 0;
    if (newcomer) { /* the directory is the members': no collective with them */
        if ((rc = ckpt_create(&ctx->ckpt, &cfg)) == 0)
            ckpt_newest_below(ctx->opt.ckpt_dir, INT64_MAX, &ctx->disk_newest);
        return rc;
    }
    /* Rank 0 creates the directory and removes dead attempts before anyone writes. */
    if (ctx->rank == 0 && (rc = ckpt_create(&ctx->ckpt, &cfg)) == 0)
        ckpt_clean_dir(ctx->opt.ckpt_dir);
    v = rc;
    if ((rc = start_coll(ctx, &v, false, "rk_init: MPI_Ibcast of rank 0's checkpoint directory")) != 0) {
        ckpt_destroy(&ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms));
        return rc;
    }
    if ((rc = (int)v) != 0) {
        if (ctx->rank != 0)
            rk__set_last_error("rk_init: rank 0 cannot use the checkpoint directory %s (%s)", ctx->opt.ckpt_dir,
                               rk_strerror(rc));
        return rc;
    }
    if (ctx->rank != 0)
        rc = ckpt_create(&ctx->ckpt, &cfg);
    worst = rc;
    int crc = start_coll(ctx, &worst, true, "rk_init: MPI_Iallreduce of the checkpoint engines' start");
    if (crc || worst) {
        ckpt_destroy(&ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms));
        if (crc)
            return crc;
        if (!rc)
            rk__set_last_error("rk_init: another rank cannot use the checkpoint directory (%s)",
                               rk_strerror((int)worst));
        return (int)worst;
    }
    /* A job launched again knows its newest checkpoint from the start (its reports' committed
       step until rk_resume): a loss before rk_resume (the program's first collectives,
       rekindle.elastic's first sync) then rolls back from it, where it found nothing to roll
       back to before. Not the engine's own (ckpt_note_committed): that one would skip a
       label committed again by a job that resumed from an older checkpoint. */
    ckpt_newest_below(ctx->opt.ckpt_dir, INT64_MAX, &ctx->disk_newest);
    return 0;
}

int rec_ckpt_close(rk_ctx *ctx)
{
    if (!ctx->ckpt)
        return 0;
    if (ctx->snap.taken) {
        RK_LOG_INFO(RK_SUB_CKPT, "%lld snapshots held in memory; training waited %.1f ms for their copies in all "
                    "(%.3f ms a snapshot, at most %.1f ms)", (long long)ctx->snap.taken, ctx->snap.wait_ms,
                    ctx->snap.wait_ms / (double)ctx->snap.taken, ctx->snap.max_ms);
        RK_EVENT(ctx->ev, "snapshots", RK_EV_I("taken", ctx->snap.taken), RK_EV_D("wait_ms", ctx->snap.wait_ms),
                 RK_EV_D("max_wait_ms", ctx->snap.max_ms));
    }
    /* A commit that waits for a member the detector saw go is abandoned at once
       (ckpt_config.member_lost), not at the deadline. */
    int64_t deadline = rk__deadline_ns(ctx->opt.timeout_ms);
    int rc = ckpt_wait(ctx->ckpt, deadline);
    int drc = ckpt_destroy(&ctx->ckpt, deadline);
    return drc == RK_E_TIMEOUT || !rc ? drc : rc; /* a writer left behind first (rk_finalize) */
}

int rec_ckpt_tensors(rk_ctx *ctx, ckpt_tensor **out)
{
    *out = NULL;
    if (ctx->ntensors == 0)
        return 0;
    ckpt_tensor *t = calloc(ctx->ntensors, sizeof(*t));
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < ctx->ntensors; i++) {
        const struct rec_tensor *r = &ctx->tensors[i];
        t[i] = (ckpt_tensor){.name = r->name, .ptr = rec_tensor_pending(r) ? NULL : r->ptr, .dtype = r->dtype, .ndim = r->ndim,
                             .shape = r->shape, .nbytes = r->nbytes, .flags = r->flags & ~(RK_DEVICE | RK_FROZEN),
                             .frozen = r->flags & RK_FROZEN,
                             .row0 = r->row0, .rows = r->rows_global, .defer = rec_tensor_pending(r),
                             .device = r->flags & RK_DEVICE};
    }
    *out = t;
    return 0;
}

/* Whether the job has state of one rank alone (sharded or per-rank tensors): then its
   snapshot is partnered (ckpt/snapshot.h S4, rec_report.partnered). */
int rec_ckpt_partnered(const rk_ctx *ctx)
{
    for (size_t i = 0; i < ctx->ntensors; i++)
        if (ctx->tensors[i].flags & (RK_SHARDED | RK_PER_RANK))
            return true;
    return false;
}

/* The partner copy (ckpt/snapshot.h S4): every member sends its snapshot's out region (its sharded
   and per-rank pieces) to its right ring neighbour and keeps its left neighbour's. Collective
   over the ring, called by every member at the same points (after every snapshot of a job
   with such state); a failure leaves no partner copy (recovery then goes to disk). A world
   of one has no neighbour to hold it for (its loss ends the job): nothing is sent, where
   it was its own state copied to itself (1 GiB at a sharded rk_resume on one rank). */
int rec_ckpt_mirror(rk_ctx *ctx)
{
    if (!ctx->ckpt || !rec_ckpt_partnered(ctx) || ctx->world < 2)
        return 0;
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    const ckpt_snapshot *s = ckpt_snapshot_held(ctx->ckpt);
    uint64_t mine = s->out_bytes, left = 0;
    int rc = ring_shift(ctx->ring, &mine, sizeof(mine), &left, sizeof(left), &cancel);
    void *in = rc ? NULL : ckpt_snapshot_inbox(ctx->ckpt, left);
    if (!rc) /* without room the shift still runs (nothing received): the others never wait */
        rc = ring_shift(ctx->ring, s->out, s->out_bytes, in, in ? left : 0, &cancel);
    if (!rc && !in)
        rc = -ENOMEM;
    if (!rc)
        rc = ckpt_snapshot_accept(ctx->ckpt);
    if (rc)
        RK_LOG_WARN(RK_SUB_CKPT, "no partner copy of the snapshot of step %" PRId64 " (%s): a loss now rolls back from "
                    "disk", s->step, rk_strerror(rc));
    return rc;
}

/* A checkpoint of `step` (disk), or a snapshot held in memory only; with `disk`, a
   checkpoint skipped because the previous one is still being written is taken as a
   snapshot all the same. */
static int start(rk_ctx *ctx, int64_t step, bool disk)
{
    for (size_t i = 0; i < ctx->ntensors; i++)
        if (rec_tensor_pending(&ctx->tensors[i]))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE,
                            "%s of step %" PRId64 " not taken: sharded tensor '%s' changed its slice in the "
                            "recovery and waits for rk_rebind", disk ? "checkpoint" : "snapshot", step,
                            ctx->tensors[i].name);
    ckpt_tensor *t = NULL;
    int rc = rec_ckpt_tensors(ctx, &t);
    if (!rc && disk)
        rc = ckpt_start(ctx->ckpt, step, t, ctx->ntensors);
    if (!rc && !disk)
        rc = ckpt_snapshot_take(ctx->ckpt, step, t, ctx->ntensors);
    else if (rc == RK_E_BUSY && ctx->opt.snapshot_every > 0)
        ckpt_snapshot_take(ctx->ckpt, step, t, ctx->ntensors); /* the skip stays the result */
    free(t);
    if (!disk) {
        /* A snapshot only: its copy runs on while the next step computes, until the next
           update (rec_ckpt_copied: rk_allreduce, rk_before_update, rk_step_done); its
           partner copy is sent then. */
        ctx->mirror_pending = rec_ckpt_partnered(ctx);
        ctx->snap.taken += rc == 0;
        return rc;
    }
    /* A checkpoint: host buffers may change as soon as rk_step_done returns (rekindle.h):
       their copy is waited for here; device tensors' copy runs on until the next update.
       A copy that fails fails this checkpoint (reported by rk_wait), not the call; one that
       could not start whole may still read them: waited for all the same. */
    ckpt_copied(ctx->ckpt, true, rk__deadline_ns(ctx->opt.timeout_ms / 4));
    ctx->mirror_pending = false;
    rec_ckpt_mirror(ctx); /* every member, whatever its own start did: the shift is collective */
    return rc;
}

void rec_ckpt_before_update(rk_ctx *ctx)
{
    if (!ctx->ckpt)
        return;
    int64_t t0 = rk__mono_ns();
    ckpt_copied(ctx->ckpt, false, rk__deadline_ns(ctx->opt.timeout_ms / 4));
    double ms = rk__ms_since(t0);
    ctx->snap.wait_ms += ms;
    if (ms > ctx->snap.max_ms)
        ctx->snap.max_ms = ms;
}

int rec_ckpt_copied(rk_ctx *ctx, int rc)
{
    rec_ckpt_before_update(ctx);
    if (rc == 0 && ctx->mirror_pending) {
        /* Collective: every member reaches it at the same call (the first rk_allreduce or
           rk_step_done after a snapshot); a failure is the partner copy's, not the call's. */
        ctx->mirror_pending = false;
        rec_ckpt_mirror(ctx);
    }
    return rc;
}

int rec_ckpt_step_done(rk_ctx *ctx, int64_t step)
{
    rec_ckpt_copied(ctx, 0); /* the state is about to change: the last snapshot's copy is done */
    if (!ctx->ckpt)
        return 0;
    int every = ctx->opt.ckpt_every, snap = ctx->opt.snapshot_every;
    bool disk = every > 0 && (step + 1) % every == 0, memory = snap > 0 && (step + 1) % snap == 0;
    /* A checkpoint or snapshot that cannot start is logged, an event, and (a checkpoint
       that failed, not one skipped) reported by rk_wait; training goes on. */
    if (disk || memory)
        start(ctx, step + 1, disk);
    return 0;
}

/* A collective among the current members, over the ring (which excludes lost ranks),
   abandoned as soon as the detector sees another member go. */
int rec_ckpt_call(rk_ctx *ctx, void *v, size_t count, rk_dtype dtype, rk_op op)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    return ring_allreduce(ctx->ring, v, count, dtype, op, &cancel);
}

/* The agreement of a sharded or per-rank registration (the last one of the registry):
   every member registers the same thing, and a sharded tensor's rows are the members'
   slices in rank order. Every member returns the same. */
static int agree_registration(rk_ctx *ctx, struct rec_tensor *t)
{
    int64_t h[2];
    h[0] = rec_registration_hash(t);
    h[1] = -h[0];
    int rc = rec_ckpt_call(ctx, h, 2, RK_I64, RK_MAX);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "rk_register '%s': agreement among the members failed", t->name);
    if (h[0] != -h[1])
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_COLL_MISMATCH,
                        "rk_register '%s': the members registered different tensors here (name, flags, dtype or "
                        "trailing dimensions differ)", t->name);
    if (!(t->flags & RK_SHARDED))
        return 0;
    int64_t *rows = calloc((size_t)ctx->world, sizeof(*rows));
    if (!rows)
        return -ENOMEM;
    rows[ctx->rank] = t->shape[0];
    if ((rc = rec_ckpt_call(ctx, rows, (size_t)ctx->world, RK_I64, RK_SUM)) == 0) {
        t->row0 = t->rows_global = 0;
        for (int r = 0; r < ctx->world; r++) {
            if (r < ctx->rank)
                t->row0 += rows[r];
            t->rows_global += rows[r];
        }
    } else {
        rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "rk_register '%s': agreement on the slices failed", t->name);
    }
    free(rows);
    return rc;
}

int rk_register(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                const int64_t *shape, unsigned flags)
{
    /* The registry is kept even without checkpoints: rk_resume and recovery use it. */
    int rc = rec_registry_add(ctx, name, ptr, dtype, ndim, shape, flags);
    if (rc || !(flags & (RK_SHARDED | RK_PER_RANK)))
        return rc;
    if (ctx->is_spare) { /* outside the ring: agreed when a recovery brings it in (join) */
        ctx->tensors[ctx->ntensors - 1].rows_global = -1;
        return 0;
    }
    if ((rc = agree_registration(ctx, &ctx->tensors[ctx->ntensors - 1])) != 0)
        rec_registry_pop(ctx);
    return rc;
}

int rk_shard_rows(const rk_ctx *ctx, const char *name, int64_t *offset, int64_t *rows, int64_t *global_rows)
{
    if (!ctx || !name || !offset || !rows)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_shard_rows: NULL argument");
    const struct rec_tensor *t = rec_registry_find((rk_ctx *)ctx, name);
    if (!t || !(t->flags & RK_SHARDED))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOENT, "rk_shard_rows: no sharded tensor '%s'", name);
    *offset = t->row0;
    *rows = t->shape[0];
    if (global_rows)
        *global_rows = t->rows_global;
    return 0;
}

int rk_checkpoint(rk_ctx *ctx)
{
    if (!ctx)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_checkpoint: ctx is NULL");
    if (!ctx->ckpt)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "rk_checkpoint: no checkpoint directory (RK_CKPT_DIR)");
    return start(ctx, ctx->next_step, true);
}

int rk_wait(rk_ctx *ctx)
{
    if (!ctx)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_wait: ctx is NULL");
    if (!ctx->ckpt)
        return 0;
    return ckpt_wait(ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms));
}

int rk_resume(rk_ctx *ctx, int64_t *next_step)
{
    if (!ctx || !next_step)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_resume: %s is NULL", ctx ? "next_step" : "ctx");
    *next_step = ctx->next_step;
    ctx->disk_newest = -1; /* the engine knows what it restored from here on */
    if (ctx->is_spare) {
        int src = rec_spare_wait(ctx); /* the state comes with the decision that needs us */
        *next_step = ctx->next_step;
        return src;
    }
    if (!ctx->ckpt)
        return 0; /* no checkpoint directory: nothing to restore */
    /* A checkpoint still in flight may commit a newer step first; it gets RK_TIMEOUT_MS,
       then it is abandoned (its failure is reported by rk_wait). */
    if (ckpt_busy(ctx->ckpt) && ckpt_wait(ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms)) == RK_E_TIMEOUT)
        ckpt_abandon(ctx->ckpt);
    ckpt_tensor *t = NULL;
    int64_t step = -1;
    int rc = rec_ckpt_tensors(ctx, &t);
    /* The way asked (rec_restore_newest): RK_RESTORE=inplace straight into the buffers;
       the default keeps them as they were until every member has the checkpoint whole, in
       staging of its own where this rank is alone on its host, else checked through the
       page cache the ranks of the host share, then read into them (ckpt/snapshot.h S14). */
    bool inplace = !rc && strcmp(ctx->opt.restore ? ctx->opt.restore : "staged", "inplace") == 0;
    int how = inplace ? REC_RESTORE_INPLACE : ctx->host_ranks > 1 ? REC_RESTORE_CHECKED : REC_RESTORE_STAGED;
    for (size_t i = 0; how != REC_RESTORE_STAGED && i < ctx->ntensors; i++)
        if (!ckpt_tensor_in_host(&t[i])) {
            if (inplace)
                RK_LOG_INFO(RK_SUB_CKPT, "RK_RESTORE=inplace: tensor '%s' is %s, so the checkpoint is read into "
                            "memory of the library's first (staged)", t[i].name,
                            t[i].device ? "device memory" : "not bound");
            how = REC_RESTORE_STAGED;
        }
    rc = rec_restore_newest(ctx, t, rc, INT64_MAX, &how, &step); /* a failure here is said to all */
    if (!rc && step >= 0) {
        if (how == REC_RESTORE_STAGED) /* the held snapshot's partner copy; the others hold none
                                          (ckpt/snapshot.h S12, S14) */
            rec_ckpt_mirror(ctx);
        ctx->next_step = *next_step = step;
        RK_LOG_INFO(RK_SUB_CKPT, "resumed from step %" PRId64 " in %s%s", step, ctx->opt.ckpt_dir,
                    how == REC_RESTORE_INPLACE   ? ", read straight into the registered buffers (RK_RESTORE=inplace)"
                    : how == REC_RESTORE_CHECKED ? ", checked by every member, then read into the registered buffers"
                                                 : "");
        RK_EVENT(ctx->ev, "resumed", RK_EV_I("step", step), RK_EV_S("from", "disk"),
                 RK_EV_I("epoch", ctx->agreed_epoch), RK_EV_I("world", ctx->world));
    } else if (!rc) {
        /* Nothing on disk: hold the state the program starts from, so that a failure before
           the first checkpoint can still roll back in memory. */
        rc = ckpt_hold(ctx->ckpt, ctx->next_step, t, ctx->ntensors);
        rec_ckpt_mirror(ctx);
    }
    free(t);
    return rc;
}

int rk_rebind(rk_ctx *ctx, const char *name, void *ptr)
{
    struct rec_tensor *r = rec_registry_find(ctx, name);
    if (!r)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOENT, "rk_rebind: no tensor '%s' is registered",
                        name ? name : "(null)");
    if (!ptr && r->nbytes)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_rebind '%s': NULL buffer for %zu bytes", name, r->nbytes);
    if (rec_tensor_pending(r)) {
        size_t i = (size_t)(r - ctx->tensors);
        const ckpt_snapshot *s = ctx->ckpt ? ckpt_snapshot_held(ctx->ckpt) : NULL;
        const void *held = s && i < s->n ? s->own[i].data : NULL;
        if (!held && r->nbytes)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "rk_rebind '%s': the restored rows are no longer held",
                            name);
        if (r->nbytes)
            memcpy(ptr, held, r->nbytes);
        r->bound_rows = r->shape[0];
    }
    r->ptr = ptr;
    return 0;
}

void rec_ckpt_abandon(rk_ctx *ctx)
{
    if (ctx->ckpt)
        ckpt_abandon(ctx->ckpt);
}
