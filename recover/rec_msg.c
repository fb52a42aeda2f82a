/*
 * recover/rec_msg.c - the recovery's messages (recovery.c R1, R6): point-to-point MPI on
 * the job's communicator that never blocks, and whose bytes are never freed while MPI may
 * still touch them. A send is a copy (MPI_Alloc_mem) listed in ctx->xfers until MPI is done
 * with it: freed once its send completed, freed at once if MPI_Isend failed, and kept for
 * the life of the process (rk__retain_forever) if a request to a dead peer may still read
 * it. A receive lands in such a copy too.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rec_internal.h"

/* A message MPI may still be sending: the request and the copy it reads (R6). */
struct rec_xfer {
    MPI_Request rq;
    void *buf; /* MPI_Alloc_mem */
};

/* MPI is done with a transfer's copy (completed, or failed without a request): free it. A
   request still pending is handed back to MPI and its copy kept for the life of the
   process: a dead peer's transfer may touch it whenever. */
static void xfer_release(MPI_Request *rq, void *buf)
{
    if (*rq != MPI_REQUEST_NULL) {
        RK_MPI(MPI_Request_free(rq));
        rk__retain_forever(buf);
    } else {
        MPI_Free_mem(buf);
    }
}

/* Tests every send in flight once; frees the copies of those completed. */
void rec_msgs_progress(rk_ctx *ctx)
{
    for (int i = 0; i < ctx->nxfers; i++) {
        int done = 0;
        struct rec_xfer *x = &ctx->xfers[i];
        int mrc = RK_MPI(MPI_Test(&x->rq, &done, MPI_STATUS_IGNORE));
        if (mrc == MPI_SUCCESS && !done)
            continue;
        if (mrc != MPI_SUCCESS && x->rq != MPI_REQUEST_NULL)
            continue; /* not completed: kept until it does or rec_msgs_settle gives up */
        xfer_release(&x->rq, x->buf);
        ctx->xfers[i--] = ctx->xfers[--ctx->nxfers];
    }
}

/* Waits until every send completed or the deadline (0: test once), then gives up on the
   rest (xfer_release keeps their copies). */
void rec_msgs_settle(rk_ctx *ctx, int64_t deadline)
{
    for (;;) {
        rec_msgs_progress(ctx);
        if (ctx->nxfers == 0 || rk__deadline_passed(deadline))
            break;
        rk__sleep_ns(REC_POLL_NS);
    }
    for (int i = 0; i < ctx->nxfers; i++)
        xfer_release(&ctx->xfers[i].rq, ctx->xfers[i].buf);
    ctx->nxfers = 0;
}

/* Sends a copy of len bytes to dst and returns at once: the copy stays in ctx->xfers until
   MPI is done with it. 0; REC_AGAIN if MPI refused the send (nothing is held then: the
   caller sends again in the next round, or the detector declares dst dead); -ENOMEM. */
int rec_msg_send(rk_ctx *ctx, const void *msg, size_t len, int dst, int tag)
{
    MPI_Comm comm = ctx->comm;
    int rank = rec_rank_of(ctx, dst);
    if (!rec_join_route(ctx, dst, &comm, &rank) && rank < 0) {
        RK_LOG_DEBUG(RK_SUB_REC, "recovery: slot %d has no rank to send to", dst);
        return REC_AGAIN;
    }
    return rec_msg_send_on(ctx, comm, rank, msg, len, tag);
}

int rec_msg_send_on(rk_ctx *ctx, MPI_Comm comm, int dst, const void *msg, size_t len, int tag)
{
    if (ctx->nxfers == ctx->cap_xfers) {
        int cap = ctx->cap_xfers ? 2 * ctx->cap_xfers : 8;
        struct rec_xfer *x = realloc(ctx->xfers, (size_t)cap * sizeof(*x));
        if (!x)
            return -ENOMEM;
        ctx->xfers = x;
        ctx->cap_xfers = cap;
    }
    void *copy = NULL;
    if (MPI_Alloc_mem((MPI_Aint)len, MPI_INFO_NULL, &copy) != MPI_SUCCESS)
        return -ENOMEM;
    memcpy(copy, msg, len);
    MPI_Request rq = MPI_REQUEST_NULL;
    int mrc = RK_MPI(MPI_Isend(copy, (int)len, MPI_BYTE, dst, tag, comm, &rq));
    if (mrc != MPI_SUCCESS) {
        MPI_Free_mem(copy); /* a failed MPI_Isend holds nothing */
        RK_LOG_DEBUG(RK_SUB_REC, "recovery: send (tag %#x) to rank %d refused (MPI error %d)", tag, dst, mrc);
        return REC_AGAIN;
    }
    ctx->xfers[ctx->nxfers++] = (struct rec_xfer){.rq = rq, .buf = copy};
    return 0;
}

/* Receives one message of `tag` already waiting, from anyone, without ever blocking:
   MPI_Iprobe finds it (its sender and length), its copy is allocated, and only then
   MPI_Improbe matches it (the first message of that sender and tag: the same one, MPI
   does not reorder them), and MPI_Imrecv receives it into the copy, polled until the
   deadline (a sender that dies mid-message leaves the copy to MPI, kept). Returns its
   length (copied into buf) and *src; 0 if none waits, or none could be taken now (no
   memory for the copy: it stays queued for a later call); REC_DROPPED if one was taken
   but not delivered (longer than cap, or incomplete at the deadline): the caller goes on
   with the next. */
int rec_msg_recv(rk_ctx *ctx, int tag, void *buf, size_t cap, int *src, int64_t deadline)
{
    int n = rec_msg_recv_on(ctx, ctx->comm, tag, buf, cap, src, deadline);
    if (n > 0)
        *src = rec_slot_of(ctx, *src);
    return n;
}

int rec_msg_recv_on(rk_ctx *ctx, MPI_Comm comm, int tag, void *buf, size_t cap, int *src, int64_t deadline)
{
    int flag = 0, count = 0, done = 0;
    MPI_Message msg;
    MPI_Status st;
    if (RK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &st)) != MPI_SUCCESS || !flag)
        return 0;
    if (MPI_Get_count(&st, MPI_BYTE, &count) != MPI_SUCCESS || count < 0)
        count = 0;
    void *copy = NULL;
    if (MPI_Alloc_mem((MPI_Aint)(count > 0 ? count : 1), MPI_INFO_NULL, &copy) != MPI_SUCCESS) {
        rk__fail(RK_SUB_REC, RK_LOG_WARN, -ENOMEM, "recovery: no memory to receive a message of %d bytes yet", count);
        return 0; /* not matched: it waits for a later call; every wait for it is bounded */
    }
    if (RK_MPI(MPI_Improbe(st.MPI_SOURCE, tag, comm, &flag, &msg, &st)) != MPI_SUCCESS || !flag) {
        MPI_Free_mem(copy); /* gone meanwhile (its sender's request cancelled): nothing taken */
        return 0;
    }
    MPI_Request rq = MPI_REQUEST_NULL;
    if (RK_MPI(MPI_Imrecv(copy, count, MPI_BYTE, &msg, &rq)) != MPI_SUCCESS) {
        MPI_Free_mem(copy);
        return REC_DROPPED;
    }
    while (RK_MPI(MPI_Test(&rq, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done && !rk__deadline_passed(deadline))
        rk__sleep_ns(REC_POLL_NS);
    int n = REC_DROPPED;
    if (done && (size_t)count <= cap && count > 0) {
        memcpy(buf, copy, (size_t)count);
        *src = st.MPI_SOURCE;
        n = count;
    }
    xfer_release(&rq, copy);
    return n;
}
