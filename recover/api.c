/*
 * recover/api.c - the training-loop API common to every part: rk_init, rk_finalize,
 * rk_step_done and the accessors. Each part's own functions are in its api_*.c file.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../detector/det.h"
#include "../ring/ring.h"
#include "rec_internal.h"

/* A write to a socket whose peer has died raises SIGPIPE, whose default action ends the
   process. Open MPI's TCP transport writes with writev(), which cannot ask for
   MSG_NOSIGNAL: a worker killed on another host could take down the survivors that were
   sending to it. Where the program left SIGPIPE at its default, rk_init installs an
   empty handler, so such a write fails with EPIPE and MPI reports the peer as lost. A
   handler rather than SIG_IGN: exec resets a handler, so the programs a worker starts
   get the default back. A program's own choice (a handler, or SIG_IGN as Python sets)
   is left alone. The default comes back once MPI no longer runs (sigpipe_release). */
static void sigpipe_noop(int sig)
{
    (void)sig;
}

static bool sigpipe_is(void (*h)(int))
{
    struct sigaction cur;
    return sigaction(SIGPIPE, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == h;
}

static void sigpipe_set_to(void (*h)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = h;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

static void sigpipe_harmless(void)
{
    if (sigpipe_is(SIG_DFL))
        sigpipe_set_to(sigpipe_noop);
}

/* Puts the default back if the handler in place is rk_init's (only this file installs
   it) and MPI is not running (never started, or finalized): while the program's MPI
   runs, a dead peer can still raise SIGPIPE. */
static void sigpipe_release(void)
{
    int started = 0, ended = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&ended);
    if ((!started || ended) && sigpipe_is(sigpipe_noop))
        sigpipe_set_to(SIG_DFL);
}

/* rk_init of a worker started by the members of a running job (MPI_Comm_spawn: join.c):
   the merge and the members' welcome (bounded: join_proto.c), then its detector, a ring
   in the spare state on the merged communicator and its checkpoint engine, made without a
   collective call: it waits in rk_resume as a spare until a decision brings it in. */
static int init_newcomer(rk_ctx *ctx, MPI_Comm parent)
{
    MPI_Comm ring_comm = MPI_COMM_NULL;
    struct rec_join_welcome *w = NULL;
    int rc = rec_join_arrive(ctx, parent, &ring_comm, &w);
    if (!rc)
        rc = rec_join_welcome_apply(ctx, w);
    if (!rc && !ctx->opt.ckpt_dir)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_OPTION, "rk_init: a worker that joins a running job takes the "
                      "others' snapshot: set RK_CKPT_DIR");
    if (!rc) {
        rk__log_set_rank(ctx->rank0);
        rc = rk__evlog_open(&ctx->ev, ctx->opt.event_log, ctx->rank0);
    }
    if (!rc)
        rc = rec_det_open_joined(ctx, w);
    rec_join_welcome_free(&w);
    int *members = rc ? NULL : malloc((size_t)ctx->nview * sizeof(int));
    if (!rc && !members)
        rc = -ENOMEM;
    for (int i = 0; !rc && i < ctx->nview; i++)
        members[i] = rec_rank_of(ctx, ctx->view[i]);
    if (!rc) {
        rc = ring_create_on(&ctx->ring, ring_comm, members, ctx->nview, ctx->opt.timeout_ms);
        ring_comm = MPI_COMM_NULL; /* the ring's, even on an error */
    }
    free(members);
    if (!rc)
        rc = rec_ckpt_open(ctx);
    if (!rc) {
        ctx->seen_seq = det_seq(ctx->det);
        /* M0 asks before its own bound, which began before this worker arrived (J14) */
        ctx->unasked_until_ns = rk__deadline_ns((REC_JOIN_WAIT + 1) * ctx->opt.timeout_ms);
        RK_LOG_INFO(RK_SUB_REC, "joined the running job at slot %d (world %d): waiting to be brought in", ctx->rank0,
                    ctx->world);
        return 0;
    }
    if (ring_comm != MPI_COMM_NULL)
        MPI_Comm_free(&ring_comm);
    rec_ckpt_close(ctx);
    rec_ring_close(ctx);
    rec_det_close(ctx);
    rk__evlog_close(&ctx->ev);
    rec_recovery_fini(ctx);
    if (ctx->comm != MPI_COMM_NULL)
        MPI_Comm_free(&ctx->comm);
    return rc;
}

/* rec_start_wait's test of the workers' end records: any of the start's but this one. */
static bool start_gone(void *arg, char *why, size_t cap)
{
    const rk_ctx *ctx = arg;
    for (int r = 0; r < ctx->world0; r++)
        if (r != ctx->rank0 && rec_record_ended(r)) {
            snprintf(why, cap, "worker %d ended during the start (its wrapper's record)", r);
            return true;
        }
    return false;
}

int rec_start_wait(rk_ctx *ctx, MPI_Request *rq, void *keep, const char *what)
{
    return rk__mpi_wait_coll(rq, ctx->start_deadline, start_gone, ctx, keep, RK_SUB_REC, what);
}

int rk_init(rk_ctx **out, const rk_options *o)
{
    int rc, mrc, flag = 0;
    rk_options defaults;

    if (!out)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "rk_init: ctx is NULL");
    *out = NULL;
    if (!o) {
        rk_options_init(&defaults);
        o = &defaults;
    }
    if ((rc = rk__options_validate(o)) != 0)
        return rc;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE,
                        "rk_init: MPI was already finalized (by an earlier rk_finalize or the program), and "
                        "MPI can be initialized once per process: one rk_init per process");
    const char *spares = getenv("RK_SPARES");
    long nspares = 0;
    if (spares && *spares && rk__parse_int(spares, 0, 1 << 24, &nspares, NULL) != 0)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_OPTION, "RK_SPARES='%s': not a count", spares);
    if (nspares > 0 && !o->ckpt_dir)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_OPTION,
                        "RK_SPARES=%ld: a spare takes over from the others' snapshot: set RK_CKPT_DIR", nspares);

    rk_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    if ((rc = rk__options_keep(&ctx->opt, o)) != 0) {
        free(ctx);
        return rc;
    }
    /* The job's secret is read once and removed from the environment, so that no process
       the program starts inherits it (docs/DETECTOR.md, "Threat model"). */
    const char *secret = getenv("RK_JOB_SECRET");
    if (secret && *secret && !(ctx->job_secret = strdup(secret))) {
        rc = -ENOMEM;
        goto out_free;
    }
    unsetenv("RK_JOB_SECRET");
    ctx->comm = MPI_COMM_NULL;
    sigpipe_harmless();

    MPI_Initialized(&flag);
    if (!flag) {
        int provided = 0;
        /* Open MPI ends MPI_Finalize with a barrier of every process of the job, which
           survivors of a lost peer can wait in forever: ask for none (unless the user
           chose otherwise). Read by MPI_Init_thread. */
        setenv("OMPI_MCA_async_mpi_finalize", "1", 0);
        /* A process started without a launcher (no PMIx server: a singleton) would fork and
           exec a daemon of its own (orted) inside MPI_Init: after that fork every page the
           program had already written is copy-on-write, and its next write to each faults
           (262,144 faults, 0.25-0.3 s of system time for a 1 GiB model restored into its
           buffers, docs/BENCHMARKS.md). Isolated, a singleton starts no daemon; it needs
           none (nothing here spawns or connects). Only the singleton component reads it (a
           launched process ignores it); the user's own setting is kept. */
        setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
        /* A spawn's waits on PMIx bounded below the wedge watchdog's (join.c J13). */
        rk__mpi_bound_exchanges(ctx->opt.timeout_ms);
        /* MPI_THREAD_MULTIPLE: a join of processes started later runs its spawn and merge
           on a thread of its own, which may never return (join.c J11); the training
           thread's calls are unchanged, and the ring's cost was within the noise
           (docs/LAUNCHER.md). */
        mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (mrc != MPI_SUCCESS) {
            rc = rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, "rk_init: MPI_Init_thread");
            goto out_free;
        }
        ctx->mpi_owned = true;
        if (provided < MPI_THREAD_SERIALIZED)
            RK_LOG_WARN(RK_SUB_REC, "MPI provides thread level %d < SERIALIZED: call Rekindle from one thread only", provided);
    }
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) { /* started by the members of a running job: it joins them */
        if ((rc = init_newcomer(ctx, parent)) != 0)
            goto out_mpi;
        *out = ctx;
        return 0;
    }
    /* Every collective of the start is bounded (rec_start_wait): a worker that dies before
       it, or never calls rk_init, must not hold the others forever. The first one is where
       the workers meet, so its bound covers how far apart they come (10 x RK_TIMEOUT_MS). */
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank0);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx->world0);
    rk__log_set_rank(ctx->rank0);
    ctx->start_deadline = ctx->opt.timeout_ms < 0 ? INT64_MAX : rk__deadline_ns(10LL * ctx->opt.timeout_ms);
    MPI_Comm comm;
    if ((rc = rk__mpi_dup_bounded(MPI_COMM_WORLD, &comm, ctx->start_deadline, start_gone, ctx, RK_SUB_REC,
                                  "rk_init: MPI_Comm_idup (every worker's arrival)")) != 0)
        goto out_mpi;
    ctx->comm = comm;
    /* A dead peer must surface as an error code, never abort the survivors. */
    MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN);
    if (nspares >= ctx->world0) {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_OPTION, "RK_SPARES=%ld: not fewer than the %d processes",
                      nspares, ctx->world0);
        goto out_comm;
    }
    /* The last RK_SPARES ranks are spares: outside the ring until recovery needs them. */
    ctx->nslots = ctx->world0 + RK_JOIN_SLOTS < DET_MAX_SLOTS ? ctx->world0 + RK_JOIN_SLOTS : DET_MAX_SLOTS;
    ctx->next_join_slot = ctx->world0;
    ctx->nspares = (int)nspares;
    ctx->world = ctx->world0 - ctx->nspares;
    ctx->is_spare = ctx->rank0 >= ctx->world;
    ctx->rank = ctx->is_spare ? -1 : ctx->rank0;
    if (ctx->world < ctx->opt.min_world) {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MIN_WORLD,
                      "rk_init: world size %d is below RK_MIN_WORLD=%d", ctx->world, ctx->opt.min_world);
        goto out_comm;
    }
    if ((rc = rk__evlog_open(&ctx->ev, ctx->opt.event_log, ctx->rank0)) != 0)
        goto out_comm;
    if ((rc = rec_det_open(ctx)) != 0)
        goto out_evlog;
    if ((rc = rec_ring_open(ctx)) != 0)
        goto out_det;
    if ((rc = rec_ckpt_open(ctx)) != 0)
        goto out_ring;
    if ((rc = rec_recovery_init(ctx)) != 0)
        goto out_ckpt;
    *out = ctx;
    return 0;

out_ckpt:
    rec_ckpt_close(ctx);
out_ring:
    rec_ring_close(ctx);
out_det:
    rec_det_close(ctx);
out_evlog:
    rk__evlog_close(&ctx->ev);
out_comm:
    MPI_Comm_free(&ctx->comm);
out_mpi:
    /* A newcomer's merge given up on (join.c J9), or a collective of the start (it could
       wait for it): no MPI_Finalize. */
    if (ctx->mpi_owned && !rec_join_thread_left() && !rk__mpi_abandoned())
        MPI_Finalize();
out_free:
    sigpipe_release();
    rec_det_forget_secret(ctx);
    rk__options_free(&ctx->opt);
    free(ctx);
    return rc;
}

int rk_finalize(rk_ctx **pctx)
{
    if (!pctx || !*pctx)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "rk_finalize: ctx is NULL");
    rk_ctx *ctx = *pctx;
    if (ctx->rank == 0)
        rec_release_spares(ctx);
    if (rec_membership_changed(ctx))
        rec_ckpt_abandon(ctx); /* a member was lost and never recovered: don't wait for it */
    int rc = rec_ckpt_close(ctx);
    rec_join_fini(ctx);
    rec_recovery_fini(ctx);
    rec_ring_close(ctx);
    rec_det_close(ctx);
    rk__evlog_close(&ctx->ev);
    rec_registry_free(ctx);
    if (ctx->comm != MPI_COMM_NULL)
        MPI_Comm_free(&ctx->comm);
    if (ctx->mpi_owned) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && rec_join_thread_left())
            RK_LOG_INFO(RK_SUB_REC, "MPI_Finalize not called: a join's thread is still inside MPI (join.c J9)");
        else if (!finalized && rk__mpi_abandoned())
            RK_LOG_INFO(RK_SUB_REC, "MPI_Finalize not called: a collective given up on is still inside MPI");
        else if (!finalized)
            MPI_Finalize();
    }
    sigpipe_release();
    rk__options_free(&ctx->opt);
    free(ctx);
    *pctx = NULL;
    return rc;
}

int rk_step_done(rk_ctx *ctx, int64_t step)
{
    if (!ctx)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "rk_step_done: ctx is NULL");
    if (step < 0)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "rk_step_done: step %lld is negative",
                        (long long)step);
    rk__fault_point("step_done");
    int rc = rec_det_status(ctx);
    if (rc != 0)
        return rc;
    rec_join_progress(ctx);
    if (ctx->is_spare)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE, "rk_step_done: a spare worker must wait in rk_resume");
    if (rec_membership_changed(ctx) && rec_membership_lost(ctx))
        return rec_recover(ctx); /* a loss: the step just finished is rolled back with the rest */
    ctx->next_step = step + 1;
    rc = rec_ckpt_step_done(ctx, step);
    /* Growth alone (recovery.c G1) loses nobody: the step just finished is kept, its
       snapshot taken first, as every member that saw the request later took its own. */
    return ctx->change_pending ? rec_recover(ctx) : rc;
}

int rk_before_update(rk_ctx *ctx)
{
    if (!ctx)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "rk_before_update: ctx is NULL");
    rec_ckpt_before_update(ctx);
    return 0;
}

int64_t rk_next_step(const rk_ctx *ctx)
{
    return ctx ? ctx->next_step : 0;
}

int rk_rank(const rk_ctx *ctx)
{
    return ctx ? ctx->rank : -EINVAL;
}

int rk_world(const rk_ctx *ctx)
{
    return ctx ? ctx->world : -EINVAL;
}
