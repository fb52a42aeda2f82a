/*
 * recover/api_det.c - the failure detector's seam into the API: rk_init starts a detector
 * per worker (rec_det_open), rk_finalize stops it (rec_det_close), and every training call
 * first asks whether this worker was fenced (rec_det_status) and whether the agreed view
 * lost a member (rec_membership_changed: then recovery.c runs; rec_ring_changed is the
 * same question as the ring's cancellation source).
 *
 * rec_det_open runs on the thread that owns MPI: each worker binds its detector socket,
 * then one MPI_Iallgather on ctx->comm (bounded: rec_start_wait) exchanges {address, status, key}; the decision to go
 * on is taken from the gathered records, so every worker takes the same one (no worker
 * is left waiting in a collective another one skipped). The job's key comes from
 * RK_JOB_SECRET (64 hex chars, read and removed from the environment by rk_init); without
 * it rank 0 makes a random key that travels in the same Allgather, and says so once. Rank 0
 * also draws the attempt's salt there: the MAC key depends on both, so datagrams of an
 * earlier launch attempt of the job are rejected (docs/DETECTOR.md, "Threat model").
 *
 * Under `rekindle run` the worker's parent (the launcher's wrapper) passes a pipe in
 * RK_RUN_PARENT=FD:PID; the detector tells it what it needs to report this worker's death
 * at once (detector/det_parent.c). It is used only by the wrapper's own child (getppid() is
 * PID: a process the program started is not the one the wrapper watches), and marked
 * close-on-exec so that no program the worker starts inherits it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../detector/det.h"
#include "rec_internal.h"

struct det_rec {
    det_addr addr;
    int32_t status;
    uint8_t key[DET_KEY_BYTES];  /* rank 0's: the job's key when there is no secret */
    uint8_t salt[DET_KEY_BYTES]; /* rank 0's: this launch attempt's */
};

void rec_det_forget_secret(rk_ctx *ctx)
{
    if (ctx->job_secret) {
        explicit_bzero(ctx->job_secret, strlen(ctx->job_secret));
        free(ctx->job_secret);
        ctx->job_secret = NULL;
    }
}

static int worst(const struct det_rec *all, int n, int *who)
{
    for (int r = 0; r < n; r++) {
        if (all[r].status != 0) {
            *who = r;
            return all[r].status;
        }
    }
    return 0;
}

/* The wedge watchdog, on the detector's thread at each of its turns: a training thread
   inside one MPI call for RK_TIMEOUT_MS / 2 is in a call that will never return (Open
   MPI's shared-memory transport spins forever on a message whose sender died half-way
   through sending it: docs/RING.md, "Transport"). Every other wait of a worker ends at its
   bound; this one cannot, and the worker still sends heartbeats, so its peers would wait
   for it in vain. It leaves the job instead (RK_EXIT_WEDGED), and its peers recover
   without it as from any lost worker, before their own RK_TIMEOUT_MS runs out. Counted in
   the detector's turns as well as in time, so that a process stopped as a whole (SIGSTOP,
   a frozen VM) is never taken for wedged when it wakes. */
static void wedge_watch(void *arg)
{
    rk_ctx *ctx = arg;
    uint64_t call = 0;
    const char *what = NULL;
    int64_t since = rk__mpi_inside(&call, &what);
    if (!since || call != ctx->wedge.call) {
        ctx->wedge.call = call;
        ctx->wedge.turns = 0;
        return;
    }
    int64_t bound_ms = ctx->opt.timeout_ms / 2, stuck_ms = (rk__mono_ns() - since) / 1000000;
    if (++ctx->wedge.turns < bound_ms / ctx->opt.heartbeat_ms / 2 || stuck_ms < bound_ms)
        return;
    RK_LOG_AT(RK_SUB_REC, RK_LOG_ERROR,
              "the training thread has been inside one MPI call (%.60s) for %lld ms: it will not return (a peer "
              "that died in the middle of a send over Open MPI's shared-memory transport, or TCP to a host lost "
              "whole: docs/RING.md, \"Transport\"); leaving the job with exit status %d so that the others go on "
              "without this worker",
              what ? what : "?", (long long)stuck_ms, RK_EXIT_WEDGED);
    char kernel[1024], **frames;
    if (rk__mpi_thread_state(kernel, sizeof(kernel)) == 0)
        RK_LOG_AT(RK_SUB_REC, RK_LOG_ERROR, "  the training thread, in the kernel: %s", kernel);
    int n = rk__mpi_stack(&frames, 500);
    if (n == 0)
        RK_LOG_AT(RK_SUB_REC, RK_LOG_ERROR, "  the training thread's stack was not taken: the thread did not run "
                  "the signal's handler within 500 ms");
    for (int i = 0; i < n; i++)
        RK_LOG_AT(RK_SUB_REC, RK_LOG_ERROR, "  the training thread, frame %d: %s", i, frames[i]);
    free(frames);
    RK_EVENT(ctx->ev, "wedged", RK_EV_D("ms", (double)stuck_ms), RK_EV_I("exit", RK_EXIT_WEDGED),
             RK_EV_S("call", what ? what : "?"));
    _exit(RK_EXIT_WEDGED);
}

/* The pipe to this worker's parent from RK_RUN_PARENT ("FD:PID"), or 0: none (not under
   rekindle run, reports turned off there, or this process is not the wrapper's child). */
static int parent_pipe(void)
{
    const char *v = getenv("RK_RUN_PARENT");
    int fd = -1, end = 0;
    long pid = 0;
    struct stat st;
    if (!v || sscanf(v, "%d:%ld%n", &fd, &pid, &end) != 2 || v[end] != '\0' || fd <= 2)
        return 0;
    if (pid != (long)getppid() || fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode))
        return 0;
    int fl = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return 0;
    return fd;
}

static det_cfg base_cfg(rk_ctx *ctx)
{
    return (det_cfg){.rank = ctx->rank0, .world = ctx->world0, .nslots = ctx->nslots,
                     .heartbeat_ms = ctx->opt.heartbeat_ms, .iface = ctx->opt.det_iface, .ev = ctx->ev,
                     .watch = wedge_watch, .watch_arg = ctx, .parent_fd = parent_pipe()};
}

int rec_det_open_joined(rk_ctx *ctx, struct rec_join_welcome *w)
{
    det_cfg cfg = base_cfg(ctx);
    rec_det_forget_secret(ctx); /* the members' key came with the welcome */
    return rec_join_det_start(ctx, w, &cfg);
}

int rec_det_open(rk_ctx *ctx)
{
    int rc, mrc, who = -1;
    size_t n = (size_t)(ctx->world0 > 0 ? ctx->world0 : 1);
    struct det_rec mine;
    memset(&mine, 0, sizeof(mine));
    uint8_t key[DET_KEY_BYTES];
    const char *secret = ctx->job_secret;
    det_cfg cfg = base_cfg(ctx);

    mine.status = det_open(&ctx->det, &cfg);
    if (mine.status == 0)
        det_local_addr(ctx->det, &mine.addr);
    if (secret) {
        if (det_key_from_secret(secret, key) != 0 && mine.status == 0)
            mine.status = rk__fail(RK_SUB_DET, RK_LOG_ERROR, RK_E_OPTION,
                                   "RK_JOB_SECRET: expected 64 hexadecimal characters (32 bytes)");
    }
    if (ctx->rank0 == 0 && (rc = det_key_random(mine.salt)) != 0 && mine.status == 0)
        mine.status = rc;
    if (!secret && ctx->rank0 == 0) {
        if ((rc = det_key_random(mine.key)) != 0 && mine.status == 0)
            mine.status = rc;
        if (ctx->world0 == 1)
            RK_LOG_INFO(RK_SUB_DET, "RK_JOB_SECRET not set: detector datagrams carry a MAC with a key made for this job at start");
        else
            RK_LOG_WARN(RK_SUB_DET, "RK_JOB_SECRET not set: detector datagrams carry a MAC with a key made for this "
                        "job by rank 0 and shared over MPI (set RK_JOB_SECRET, 64 hex chars, for a launcher secret)");
    }

    /* Every rank's record, then this one's as the send buffer: one block, kept for good if
       the collective is given up on (MPI may still read and write it). */
    struct det_rec *all = calloc(n + 1, sizeof(*all));
    MPI_Request rq;
    if (!all) {
        rc = -ENOMEM; /* out of memory before the collective: nothing sensible is left to do */
        goto out_close;
    }
    all[n] = mine;
    mrc = MPI_Iallgather(&all[n], (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, ctx->comm, &rq);
    if (mrc != MPI_SUCCESS) {
        rc = rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc,
                          "rk_init: MPI_Iallgather of detector addresses");
        goto out_free;
    }
    if ((rc = rec_start_wait(ctx, &rq, all, "rk_init: MPI_Iallgather of detector addresses")) != 0) {
        all = NULL; /* MPI's for good */
        goto out_free;
    }
    if ((rc = worst(all, ctx->world0, &who)) != 0) {
        if (who != ctx->rank0)
            rk__fail(RK_SUB_DET, RK_LOG_ERROR, rc, "rk_init: the detector of rank %d could not start (%s)", who,
                     rk_strerror(rc));
        goto out_free;
    }
    det_addr *addrs = calloc(n, sizeof(*addrs));
    if (!addrs) {
        rc = -ENOMEM;
        goto out_free;
    }
    bool loop = false, hosts_differ = false;
    ctx->host_ranks = 0;
    for (int r = 0; r < ctx->world0; r++) {
        addrs[r] = all[r].addr;
        loop |= all[r].addr.loopback;
        hosts_differ |= all[r].addr.host_id != all[0].addr.host_id;
        ctx->host_ranks += all[r].addr.host_id == all[ctx->rank0].addr.host_id;
    }
    if (loop && hosts_differ) {
        rc = rk__fail(RK_SUB_DET, RK_LOG_ERROR, RK_E_OPTION,
                      "rk_init: a detector bound to loopback in a job spanning hosts: set RK_DET_IFACE to an "
                      "interface or address the other hosts can reach");
    } else {
        rc = det_start(ctx->det, addrs, secret ? key : all[0].key, all[0].salt);
    }
    free(addrs);
out_free:
    if (all)
        explicit_bzero(all, (n + 1) * sizeof(*all));
    free(all);
out_close:
    explicit_bzero(key, sizeof(key));
    explicit_bzero(&mine, sizeof(mine));
    rec_det_forget_secret(ctx);
    if (rc != 0)
        det_close(&ctx->det);
    return rc;
}

void rec_det_close(rk_ctx *ctx)
{
    det_close(&ctx->det);
}

int rec_det_status(rk_ctx *ctx)
{
    if (ctx->det && det_fenced(ctx->det)) {
        rec_ckpt_abandon(ctx); /* a fenced worker's checkpoint is never committed */
        rk__set_last_error("this worker was declared dead by the others and is fenced: it must stop");
        return RK_E_FENCED;
    }
    return 0;
}

/* ---- the membership hooks: whether the agreed view lost a member ------------------------ */

static bool in_view(const rk_ctx *ctx, int rank0)
{
    /* Before rec_recovery_init the view is not set, but the detector runs: a death read
       then is one of the initial view, ranks 0 .. world-1 (dropped as no member's, it left
       the others waiting on the dead rank until their collective's deadline). */
    if (!ctx->view)
        return rank0 >= 0 && rank0 < ctx->world;
    for (int i = 0; i < ctx->nview; i++)
        if (ctx->view[i] == rank0)
            return true;
    return false;
}

/* The first loss since the last agreement starts the schedule (R5): the time the detector
   learned it (an event's CLOCK_REALTIME stamp, taken back to CLOCK_MONOTONIC), so a
   worker that looks late, after a long step, is on the same rounds as the others. */
static void note_loss(rk_ctx *ctx, int64_t t_real_ns)
{
    if (ctx->loss_ns)
        return;
    int64_t ago = rk__real_ns() - t_real_ns;
    ctx->loss_ns = rk__mono_ns() - (ago > 0 ? ago : 0);
}

/* A member of the agreed view declared dead, this worker fenced, or a waiting spare asked
   to join as an additional member (growth in place), since the last agreement. A clean
   leave (a peer that finished and called rk_finalize) is not one: a member that completed
   a collective may leave before its peers have received what it already sent, and they
   must be allowed to finish. */
bool rec_membership_changed(rk_ctx *ctx)
{
    if (!ctx->det)
        return false;
    rec_grow_poll(ctx); /* growth in place asked by the launcher (recovery.c G2) */
    uint64_t s = det_seq(ctx->det);
    if (s == ctx->seen_seq)
        return ctx->change_pending;
    ctx->seen_seq = s;
    det_event ev;
    uint64_t lost = 0;
    while (det_next_event(ctx->det, &ev, &lost) == 1) {
        bool gone = ev.kind == DET_EV_FENCED || (ev.kind == DET_EV_DEAD && in_view(ctx, ev.peer));
        if (gone || (ev.kind == DET_EV_ADMIT && rec_grow_admit(ctx, ev.peer))) { /* growth: recovery.c G1 */
            ctx->change_pending = true;
            ctx->change_lost |= gone;
            note_loss(ctx, ev.t_ns);
        }
    }
    if (lost) { /* events were dropped: judge by the view alone */
        det_view v;
        det_view_get(ctx->det, &v);
        for (int i = 0; i < ctx->nview; i++)
            ctx->change_lost |= !det_view_has(&v, ctx->view[i]);
        ctx->change_pending |= ctx->change_lost;
    }
    ctx->change_lost |= det_fenced(ctx->det);
    ctx->change_pending |= ctx->change_lost;
    if (ctx->change_pending)
        note_loss(ctx, rk__real_ns()); /* known only from the view: now */
    return ctx->change_pending;
}

bool rec_membership_lost(const rk_ctx *ctx)
{
    return ctx->change_lost;
}

bool rec_ring_changed(void *arg)
{
    rk_ctx *ctx = arg;
    if (!rec_membership_changed(ctx))
        return false;
    /* Growth alone (recovery.c G1): the ring call in flight is given up only once the
       request is REC_GROW_GRACE_NS old. A call its peers are still making finishes
       (abandoned at its last chunk on one member while the others completed it, that
       member lacked the step: the growth rolled it back); one that a peer left for the
       recovery is given up after the grace. */
    return ctx->change_lost || !ctx->loss_ns || rk__mono_ns() - ctx->loss_ns >= REC_GROW_GRACE_NS;
}
