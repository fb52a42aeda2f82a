/*
 * ring/ring.c - the allreduce engine of the ring: a chunked, pipelined ring allreduce
 * (reduce-scatter, then allgather) over MPI non-blocking point-to-point, abortable at
 * every wait. Membership, rebuild and MPI glue are in ring_mpi.c; the kernels in
 * ring_reduce.c; the protocol in docs/RING.md.
 *
 * Protocol. N members; count elements split into N segments (ring_segment), each into
 * nch chunks of at most chunk_bytes (nch >= 1, the same for every segment: short or
 * empty chunks are sent as short or empty messages). Step k = 0 .. 2N-3: member r sends
 * segment (r-k) mod N to r+1 and receives segment (r-k-1) mod N from r-1; steps below
 * N-1 reduce what they receive into the buffer (reduce-scatter), the others copy it
 * (allgather). Chunk j of step k+1 is sent as soon as chunk j of step k is processed,
 * with up to `window` receives and `window` sends in flight: a pipeline.
 *
 * Invariants (tests/test_ring.c names the one each test checks):
 *  1. Bounded: every wait of a call polls its ring_cancel (changed(), deadline) and the
 *     call returns RK_E_PEER_LOST / RK_E_TIMEOUT when it fires; no MPI call that can
 *     block on a peer is made during an allreduce (only Isend, Irecv, Test, Cancel).
 *  2. The caller's buffer is written only by this thread, from ring-owned receive slots,
 *     after a receive completed. A receive is posted only for a message already probed
 *     and matched (MPI_Iprobe, MPI_Improbe + MPI_Imrecv); after an abort, a slot whose
 *     receive is still pending is never reused (ring_grave) until MPI completes it.
 *  3. Fixed order: segment s is reduced as (..((x_s op x_s+1) op x_s+2) .. op x_s-1)
 *     (indices mod N, out = acc op in, ring_reduce), the last hop dividing for avg. It
 *     depends only on (count, N), not on chunking or timing: bitwise reproducible.
 *  4. Agreement: every message carries the call's signature (count, dtype, op) and
 *     sequence number in its tag, and its length is checked; a member that sees a
 *     different signature, a wrong length, bad local arguments or any abort sends an
 *     abort token to its right neighbour, which forwards it: every member returns an
 *     error, none writes past its buffer. A shift checks lengths before any data moves:
 *     each member first tells the member it receives from what length it expects
 *     (struct ring_wants), and a sender sends its data only once that length is its own;
 *     otherwise it sends a mismatch token instead, and both ends of that pair fail with
 *     RK_E_COLL_MISMATCH while finishing their other half of the call (the other pairs
 *     are not disturbed, and nobody waits for a deadline).
 *  5. Messages are classified by their envelope before they are received: stale ones
 *     (an aborted call's, lower sequence number; another epoch's, an older ring's on the
 *     same parent communicator; a control message of an abandoned rebuild) are received
 *     into a slot and dropped; a message of a later call is never taken by an earlier
 *     one, nor the handshake of a rebuild the left member has begun (the call fails with
 *     RK_E_PEER_LOST and the handshake stays queued for this member's rebuild).
 *  7. After a failure no collective MPI call is made: every ring of every epoch is the
 *     parent communicator with neighbours re-mapped over the members' parent ranks, and
 *     a rebuild is a bounded point-to-point handshake followed by local work only.
 *  6. A send reads only a ring-owned send slot: each chunk is copied there when its
 *     send is posted, so the caller's buffer is never read after the call returns (an
 *     aborted call's sends cannot be cancelled; the next calls drain them as stale,
 *     inv. 5), and a later receive may rewrite the chunk at once. After an abort, slots
 *     whose send or receive is still pending are retired with the receive slots.
 *
 * States of a ring and the function for each transition:
 *
 *     ring_create --> MEMBER --ring_allreduce ok/error--> MEMBER (stale drained: inv. 5)
 *          |            |  \--ring_rebuild(list with self)--> MEMBER (re-mapped, epoch)
 *          |            \----ring_rebuild(list without self)--> FENCED (every call: RK_E_FENCED)
 *          \--> SPARE --ring_rebuild(list with self)--> MEMBER
 *     any --ring_destroy--> (freed; graves released or retained for good)
 */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "ring_internal.h"

struct xfer {
    ring *r;
    unsigned char *buf;
    size_t count, esize, ce, nch, T;
    /* ring_shift_by: sbuf (sbytes) to member rank+dist, rbuf (rbytes) from rank-dist; T
       counts the receives, Ts the sends (chunks of ce bytes, at least one each) */
    bool shift;
    int src, dst; /* parent ranks this call receives from and sends to (left, right) */
    const unsigned char *sbuf;
    unsigned char *rbuf;
    size_t sbytes, rbytes, Ts;
    /* a shift's length check (invariant 4): its first send (nctl = 1) is what this member
       expects, to src; its data waits until dst's has been heard; late: an error found
       that ends this side only (returned once the rest of the call is done, no abort) */
    size_t nctl;
    bool heard;
    uint64_t wanted;
    int late;
    rk_dtype dtype;
    rk_op op;
    unsigned seq;
    int tag;
    size_t posted, consumed;        /* receives posted into slots, and completed */
    size_t pvalid, valid;           /* chunks of this call posted, and processed (of T) */
    bool drop[RING_MAX_WINDOW];     /* slot holds a stale message, dropped on completion */
    size_t sent, sdone;             /* sends: issued, completed in FIFO order */
    const ring_cancel *cancel;
    int64_t deadline;
};

static unsigned signature(size_t count, rk_dtype dtype, rk_op op)
{
    uint64_t h = (uint64_t)count * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)dtype << 8 | (uint64_t)op) * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (unsigned)(h % RING_SIG_WANTS);
}

/* The chunk (k, j) on the side that sends (send=true) or receives it. */
static unsigned char *chunk_at(const struct xfer *x, size_t t, bool send, size_t *len)
{
    ring *r = x->r;
    if (x->shift) {
        size_t total = send ? x->sbytes : x->rbytes, off = t * x->ce;
        *len = off < total ? (total - off < x->ce ? total - off : x->ce) : 0;
        return (send ? (unsigned char *)x->sbuf : x->rbuf) + (off < total ? off : total);
    }
    size_t k = t / x->nch, j = t % x->nch;
    int seg = (int)(((size_t)r->rank + 2 * (size_t)r->size - k - (send ? 0 : 1)) % (size_t)r->size);
    size_t off, slen;
    ring_segment(x->count, r->size, seg, &off, &slen);
    size_t coff = j * x->ce;
    *len = coff < slen ? (slen - coff < x->ce ? slen - coff : x->ce) : 0;
    return x->buf + (off + (coff < slen ? coff : slen)) * x->esize;
}

static int test_req(MPI_Request *req, int *done, MPI_Status *st, int code_on_error)
{
    rk__mpi_enter("MPI_Test (the ring)");
    rk__fault_point("progress"); /* tests: RK_FAULT=progress@N=hang, a call that never returns */
    int rc = rk__mpi_left(MPI_Test(req, done, st ? st : MPI_STATUS_IGNORE));
    if (rc == MPI_SUCCESS)
        return 0;
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE)
        return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_COLL_MISMATCH, rc,
                            "allreduce: a message longer than a chunk");
    return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, code_on_error, rc,
                        "allreduce: transfer with a neighbour failed");
}

/* Receives: the next message from the left is probed (MPI_Iprobe) and classified by its
   envelope before it is matched, so a message of a later call or of a rebuild this
   member has not begun stays queued for it (invariant 5), and a mismatch is seen before
   a byte is written; only then is it matched (MPI_Improbe on its exact tag: the oldest
   message from that source, the one probed) and received. */
enum rx {
    RX_CHUNK, /* a chunk of this call: receive it into a slot */
    RX_STALE, /* an aborted call's, an older epoch's, an abandoned rebuild's: drop it */
    RX_TOKEN, /* an abort token of this call (zero bytes): take it, fail with *err */
    RX_KEEP,  /* leave it queued (a later call's or a later rebuild's), fail with *err */
};
static enum rx classify(const struct xfer *x, const MPI_Status *st, size_t want_bytes, int *err);

/* The receive side of a shift learned from the token that replaced its data that the
   member it receives from found another length here (or could not take part): this end
   fails too, and the call goes on only for what is already posted and for its sends. */
static void end_receiving(struct xfer *x, int why)
{
    x->late = why;
    x->T = x->pvalid;
}

static int post_recvs(struct xfer *x)
{
    ring *r = x->r;
    while (x->posted - x->consumed < (size_t)r->window && x->pvalid < x->T) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        int rc = RK_MPI(MPI_Iprobe(x->src, MPI_ANY_TAG, r->parent, &flag, &st));
        if (rc != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "allreduce: MPI_Iprobe");
        if (!flag)
            return 0;
        size_t len;
        chunk_at(x, x->pvalid, false, &len);
        int err = 0;
        enum rx kind = classify(x, &st, len * x->esize, &err);
        if (kind == RX_KEEP)
            return err;
        rc = RK_MPI(MPI_Improbe(x->src, st.MPI_TAG, r->parent, &flag, &msg, &st));
        if (rc != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "allreduce: MPI_Improbe");
        if (!flag) /* only this thread receives on the parent: cannot happen; probe again */
            return 0;
        if (kind == RX_TOKEN) {
            RK_MPI(MPI_Mrecv(NULL, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
            if (!x->shift || err != RK_E_COLL_MISMATCH)
                return err;
            end_receiving(x, err);
            return 0;
        }
        int slot = (int)(x->posted % (size_t)r->window);
        rc = RK_MPI(MPI_Imrecv(r->stage + (size_t)slot * r->chunk_bytes, (int)r->chunk_bytes, MPI_BYTE, &msg,
                        &r->rreq[slot]));
        if (rc != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "allreduce: MPI_Imrecv");
        x->drop[slot] = kind == RX_STALE;
        x->pvalid += kind == RX_CHUNK;
        x->posted++;
    }
    return 0;
}

static int post_sends(struct xfer *x)
{
    ring *r = x->r;
    while (x->sent < x->Ts && x->sent - x->sdone < (size_t)r->window &&
           (x->shift ? x->sent < x->nctl || x->heard : x->sent < x->nch || x->valid > x->sent - x->nch)) {
        size_t len, slot = x->sent % (size_t)r->window;
        unsigned char *s = r->sstage + slot * r->chunk_bytes;
        int to = x->dst, tag = x->tag;
        if (x->sent < x->nctl) { /* a shift's length check, first: what this member expects */
            struct ring_wants w = {.epoch = r->epoch, .seq = x->seq, .bytes = x->rbytes};
            memcpy(s, &w, sizeof(w));
            len = sizeof(w);
            to = x->src;
            tag = ring__data_tag(r, x->seq, RING_SIG_WANTS);
        } else {
            const unsigned char *p = chunk_at(x, x->sent - x->nctl, true, &len);
            len *= x->esize;
            if (len) /* (an empty shift may pass NULL) */
                memcpy(s, p, len); /* invariant 6 */
        }
        int rc = RK_MPI(MPI_Isend(s, (int)len, MPI_BYTE, to, tag, r->parent, &r->sreq[slot]));
        if (rc != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "allreduce: MPI_Isend");
        x->sent++;
    }
    return 0;
}

/* The sender's half of a shift's length check (invariant 4): the length message of this
   call from the member this one sends to (probed by its exact tag: it travels against the
   data, so no other receive of this member meets it in order). One of an earlier call,
   left queued by an abort here, carries the same tag only every 32 calls and is dropped
   by its payload (a refusal has none: one left queued, by a call refused while this
   member aborted, would refuse the call 32 later). A length other than send_bytes, or a refusal, ends the sending side:
   no data goes, a mismatch token goes instead, and this end fails once its receives are
   done. *progress is set when a message was taken. */
static int hear_wants(struct xfer *x, bool *progress)
{
    ring *r = x->r;
    int tag = ring__data_tag(r, x->seq, RING_SIG_WANTS);
    while (x->shift && !x->heard) {
        int flag = 0, bytes = -1, rc;
        MPI_Status st;
        MPI_Message msg;
        if ((rc = RK_MPI(MPI_Iprobe(x->dst, tag, r->parent, &flag, &st))) != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "ring_shift: MPI_Iprobe");
        if (!flag)
            return 0;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        if (bytes != 0 && bytes != (int)sizeof(struct ring_wants))
            return rk__fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_COLL_MISMATCH,
                            "ring_shift: a length message of %d bytes from parent rank %d", bytes, x->dst);
        struct ring_wants w = {0};
        /* matched first: a small message, complete on arrival, so Mrecv cannot wait */
        if ((rc = RK_MPI(MPI_Improbe(x->dst, tag, r->parent, &flag, &msg, &st))) == MPI_SUCCESS && flag)
            rc = RK_MPI(MPI_Mrecv(bytes ? &w : NULL, bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS)
            return rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, rc, "ring_shift: a length message");
        if (!flag)
            return 0;
        *progress = true;
        if (bytes && (w.epoch != r->epoch || w.seq != x->seq))
            continue; /* an earlier call's */
        x->heard = true;
        x->wanted = bytes ? w.bytes : UINT64_MAX;
        if (x->wanted == (uint64_t)x->sbytes)
            return 0;
        RK_LOG_DEBUG(RK_SUB_RING, "ring_shift: parent rank %d %s, %zu bytes here: sending a mismatch token instead",
                     x->dst, bytes ? "expects another length" : "cannot take part", x->sbytes);
        x->late = RK_E_COLL_MISMATCH;
        x->Ts = x->sent; /* the length message only: the data is not sent */
        ring__send_token(r, x->dst, x->seq, RING_TOK_MISMATCH);
    }
    return 0;
}

/* Completes sends in FIFO order; *progress is set when one completed. */
static int reap_sends(struct xfer *x, bool *progress)
{
    ring *r = x->r;
    while (x->sdone < x->sent) {
        int done = 0;
        int rc = test_req(&r->sreq[x->sdone % (size_t)r->window], &done, NULL, RK_E_PEER_LOST);
        if (rc != 0)
            return rc;
        if (!done)
            break;
        x->sdone++;
        *progress = true;
    }
    return 0;
}

/* What the next message from the left is, by its envelope (see enum rx). A control
   message of a later epoch means the left member has begun a rebuild: it sends nothing
   more in this epoch, so this call fails with RK_E_PEER_LOST and the message stays
   queued for this member's own handshake (dropping it would leave that handshake
   waiting until its deadline). Data of a later epoch cannot arrive in an earlier one:
   the all-to-all handshake completes at no member before every member has left the
   earlier epoch. */
static enum rx classify(const struct xfer *x, const MPI_Status *st, size_t want_bytes, int *err)
{
    unsigned tag = (unsigned)st->MPI_TAG, sig = tag & RING_SIG_MASK, mseq = (tag >> 13) & RING_SEQ_MASK;
    const ring *r = x->r;
    if (tag & RING_TAG_CTRL) {
        unsigned ahead = (tag - (unsigned)x->r->epoch) & RING_CTRL_EPOCH_MASK;
        if (ahead == 0 || ahead > RING_CTRL_EPOCH_MASK / 2)
            return RX_STALE;
        RK_LOG_DEBUG(RK_SUB_RING, "parent rank %d has begun the rebuild to epoch %u (this ring: epoch %llu)",
                     x->src, tag & RING_CTRL_EPOCH_MASK, (unsigned long long)x->r->epoch);
        *err = RK_E_PEER_LOST;
        return RX_KEEP;
    }
    if (ring__tag_epoch(tag) != ((unsigned)r->epoch & r->epoch_mask))
        return RX_STALE;
    unsigned age = (x->seq - mseq) & RING_SEQ_MASK;
    if (sig == RING_SIG_WANTS) {
        /* A length message goes to the member a shift receives from: one of another call
           was left by an abort (never one of a later call: the left sends its data before
           it leaves a call). One of this call, when the left is also the member this one
           sends to, is hear_wants's: left queued. Else the left is not in a shift. */
        if (age != 0)
            return RX_STALE;
        if (x->shift && x->src == x->dst) {
            *err = 0;
            return RX_KEEP;
        }
    }
    if (age != 0 && age <= RING_SEQ_MASK / 2)
        return RX_STALE;
    *err = RK_E_COLL_MISMATCH;
    if (age != 0) {
        RK_LOG_DEBUG(RK_SUB_RING, "a message of call %u arrived in call %u", mseq, x->seq & RING_SEQ_MASK);
        return RX_KEEP;
    }
    if (sig == RING_TOK_TIMEOUT || sig == RING_TOK_LOST || sig == RING_TOK_MISMATCH) {
        *err = sig == RING_TOK_TIMEOUT ? RK_E_TIMEOUT : sig == RING_TOK_LOST ? RK_E_PEER_LOST : RK_E_COLL_MISMATCH;
        return RX_TOKEN;
    }
    int bytes = -1;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    if (sig == ((unsigned)x->tag & RING_SIG_MASK) && bytes == (int)want_bytes)
        return RX_CHUNK;
    RK_LOG_DEBUG(RK_SUB_RING, "signature %#x and %d bytes from the left, %#x and %zu bytes here", sig,
                 bytes, (unsigned)x->tag & RING_SIG_MASK, want_bytes);
    return RX_KEEP; /* stale for the next call, which drops it */
}

/* Processes the receive that completed into `slot`. Returns 0, or an error. */
static int consume(struct xfer *x, int slot)
{
    ring *r = x->r;
    x->consumed++;
    if (x->drop[slot])
        return 0; /* stale: dropped (invariant 5) */
    size_t t = x->valid, len;
    unsigned char *dst = chunk_at(x, t, false, &len);
    if (x->shift) {
        if (len)
            memcpy(dst, r->stage + (size_t)slot * r->chunk_bytes, len);
        x->valid++;
        return 0;
    }
    size_t k = t / x->nch, n1 = (size_t)r->size - 1;
    if (r->hook)
        r->hook(r->hook_arg, k < n1 ? 0 : 1, (int)(k < n1 ? k : k - n1), (int)(t % x->nch));
    const unsigned char *src = r->stage + (size_t)slot * r->chunk_bytes;
    int rc = 0;
    if (k < n1) {
        int div = (x->op == RK_AVG && k == n1 - 1) ? r->size : 0;
        rc = ring_reduce(dst, src, dst, len, x->dtype, x->op, div);
    } else {
        memcpy(dst, src, len * x->esize);
    }
    x->valid++;
    return rc;
}

/* Abort (invariants 2, 4 and 6): receives already matched and sends already posted keep
   their slots until MPI completes them (slots with a request still pending are retired,
   never reused); the member this call sends to is told (the right neighbour, or for a
   shift by k the next member of the cycle rank, rank+k, ..., which reaches every member
   that waits, directly or not, on this one). */
static void abort_xfer(struct xfer *x, int why)
{
    ring *r = x->r;
    int pending = 0;
    for (size_t m = x->consumed; m < x->posted; m++) {
        int done = 0;
        if (RK_MPI(MPI_Test(&r->rreq[m % (size_t)r->window], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !done)
            pending++;
    }
    for (size_t m = x->sdone; m < x->sent; m++) {
        int done = 0;
        if (RK_MPI(MPI_Test(&r->sreq[m % (size_t)r->window], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !done)
            pending++;
    }
    if (pending > 0 && ring__stage_bury(r, pending) != 0)
        RK_LOG_WARN(RK_SUB_RING, "after an abort: no memory for fresh slots; the next call allocates them");
    enum ring_token tok = why == RK_E_TIMEOUT ? RING_TOK_TIMEOUT
                          : why == RK_E_PEER_LOST ? RING_TOK_LOST : RING_TOK_MISMATCH;
    ring__send_token(r, x->dst, x->seq, tok);
}

static int run(struct xfer *x)
{
    ring *r = x->r;
    unsigned idle = 0;
    int rc = ring__poll_cancel(x->cancel, x->deadline); /* a call never starts cancelled */
    if (rc != 0)
        return rc;
    /* (consumed < posted: a receive side ended early, end_receiving, still owns slots) */
    while (x->valid < x->T || x->sdone < x->Ts || x->consumed < x->posted) {
        bool progress = false;
        if ((rc = post_recvs(x)) != 0 || (rc = post_sends(x)) != 0 || (rc = hear_wants(x, &progress)) != 0)
            return rc;
        if (x->consumed < x->posted) {
            int slot = (int)(x->consumed % (size_t)r->window), done = 0;
            if ((rc = test_req(&r->rreq[slot], &done, NULL, RK_E_PEER_LOST)) != 0)
                return rc;
            if (done) {
                if ((rc = consume(x, slot)) != 0)
                    return rc;
                progress = true;
            }
        }
        if ((rc = reap_sends(x, &progress)) != 0)
            return rc;
        if (progress) {
            idle = 0;
            continue;
        }
        if ((rc = ring__poll_cancel(x->cancel, x->deadline)) != 0)
            return rc;
        if (++idle >= 64) /* oversubscribed cores: let the neighbour run */
            sched_yield();
    }
    return 0;
}

static const char *why_text(const struct xfer *x, int rc)
{
    switch (rc) {
    case RK_E_PEER_LOST: return "a member was lost (membership changed or a member aborted)";
    case RK_E_TIMEOUT: return "the deadline passed";
    case RK_E_COLL_MISMATCH:
        return x->shift ? "the two ends of a shift passed different lengths, or a member had bad arguments"
                        : "members passed different count, dtype or op";
    default: return rk_strerror(rc);
    }
}

/* Whether r can take a call now: 0, or the error (a NULL, fenced or spare ring). */
static int usable(const ring *r, const char *fn)
{
    if (!r)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "%s: ring is NULL", fn);
    if (r->fenced)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_FENCED, "%s: the membership of epoch %llu excludes this process",
                        fn, (unsigned long long)r->epoch);
    if (r->rank < 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "%s: this process is a spare, not a member of the ring",
                        fn);
    return 0;
}

/* A call that cannot start here (bad arguments, no slots) tells the members that wait on
   it at once rather than leave them to their deadline: a mismatch token to the member it
   sends to and, for a shift, a refusal (an empty length message) to the member it
   receives from, whose data then never leaves (hear_wants). */
static void refuse(struct xfer *x)
{
    ring__send_token(x->r, x->dst, x->seq, RING_TOK_MISMATCH);
    if (x->shift)
        ring__send_token(x->r, x->src, x->seq, RING_SIG_WANTS);
}

/* The slots a call needs: an abort that found no memory for fresh ones left none
   (ring__stage_bury); they are allocated again here, or the call is refused. */
static int slots(struct xfer *x, const char *fn)
{
    if (x->r->stage)
        return 0;
    int rc = ring__stage_alloc(x->r);
    if (rc == 0)
        return 0;
    refuse(x);
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, rc, "%s: no memory for the ring's slots (%zu bytes)", fn,
                    2 * (size_t)x->r->window * x->r->chunk_bytes);
}

/* Runs a prepared call; on failure aborts it (invariants 2, 4 and 6) and says where. A
   shift whose lengths differ at one of its ends (x->late) is complete, not aborted: it
   fails without a token, and the rest of the ring is not disturbed. */
static int finish(struct xfer *x, const char *fn)
{
    int rc = slots(x, fn);
    if (rc != 0)
        return rc;
    rc = run(x);
    if (rc == 0 && x->late == 0)
        return 0;
    if (rc == 0) {
        ring *r = x->r;
        if (x->heard && x->wanted == UINT64_MAX)
            return rk__fail(RK_SUB_RING, RK_LOG_ERROR, x->late,
                            "%s: parent rank %d, which this member sends to, refused the call (bad arguments or no "
                            "memory there): nothing sent (ring rank %d of %d, epoch %llu)", fn, x->dst, r->rank, r->size,
                            (unsigned long long)r->epoch);
        if (x->heard && x->wanted != (uint64_t)x->sbytes)
            return rk__fail(RK_SUB_RING, RK_LOG_ERROR, x->late,
                            "%s: parent rank %d, which this member sends to, expects %llu bytes, not the %zu here: "
                            "nothing sent (ring rank %d of %d, epoch %llu)", fn, x->dst,
                            (unsigned long long)x->wanted, x->sbytes, r->rank, r->size, (unsigned long long)r->epoch);
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, x->late,
                        "%s: parent rank %d, which this member receives from, sends another length than the %zu bytes "
                        "expected here, or cannot take part (ring rank %d of %d, epoch %llu)", fn, x->src, x->rbytes,
                        r->rank, r->size, (unsigned long long)r->epoch);
    }
    abort_xfer(x, rc);
    int level = rc == RK_E_COLL_MISMATCH ? RK_LOG_ERROR : RK_LOG_WARN;
    return rk__fail(RK_SUB_RING, level, rc, "%s: aborted at chunk %zu of %zu (ring rank %d of %d, epoch %llu): %s", fn,
                    x->valid, x->T, x->r->rank, x->r->size, (unsigned long long)x->r->epoch, why_text(x, rc));
}

int ring_shift_by(ring *r, int dist, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                  const ring_cancel *cancel)
{
    int rc = usable(r, "ring_shift");
    if (rc)
        return rc;
    int k = ((dist % r->size) + r->size) % r->size; /* usable: a member, size >= 1 */
    struct xfer x = {.r = r, .shift = true, .sbuf = send, .rbuf = recv, .sbytes = send_bytes, .rbytes = recv_bytes,
                     .esize = 1, .ce = r->chunk_bytes, .seq = ++r->seq, .cancel = cancel,
                     .src = r->members[(r->rank + r->size - k) % r->size], .dst = r->members[(r->rank + k) % r->size]};
    if ((!send && send_bytes) || (!recv && recv_bytes)) {
        if (k != 0)
            refuse(&x);
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_shift: NULL buffer");
    }
    if (k == 0) { /* alone, or a distance that is a multiple of the size: to itself */
        if (send_bytes != recv_bytes)
            return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_COLL_MISMATCH,
                            "ring_shift: to itself, %zu bytes sent to be received as %zu", send_bytes, recv_bytes);
        if (send_bytes)
            memmove(recv, send, send_bytes);
        return 0;
    }
    x.T = recv_bytes ? (recv_bytes + x.ce - 1) / x.ce : 1;
    x.nctl = 1; /* the length message (invariant 4), then the data */
    x.Ts = x.nctl + (send_bytes ? (send_bytes + x.ce - 1) / x.ce : 1);
    x.nch = 1;
    x.tag = ring__data_tag(r, x.seq, RING_SIG_SHIFT);
    x.deadline = ring__deadline(r, cancel);
    return finish(&x, "ring_shift");
}

int ring_shift(ring *r, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
               const ring_cancel *cancel)
{
    return ring_shift_by(r, 1, send, send_bytes, recv, recv_bytes, cancel);
}

int ring_allreduce(ring *r, void *buf, size_t count, rk_dtype dtype, rk_op op,
                   const ring_cancel *cancel)
{
    int rc = usable(r, "ring_allreduce");
    if (rc)
        return rc;
    struct xfer x = {.r = r, .buf = buf, .count = count, .dtype = dtype, .op = op,
                     .seq = ++r->seq, .cancel = cancel, .src = r->left, .dst = r->right};
    x.esize = rk__dtype_size(dtype);
    if (x.esize == 0)
        rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_DTYPE, "ring_allreduce: unknown dtype %d", (int)dtype);
    else if ((unsigned)op > RK_MIN)
        rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_OP, "ring_allreduce: unknown op %d", (int)op);
    else if (op == RK_AVG && (dtype == RK_I32 || dtype == RK_I64 || dtype == RK_U8))
        rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_OP, "ring_allreduce: avg of integers (%s): use sum",
                      rk__dtype_name(dtype));
    else if (!buf && count > 0)
        rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_allreduce: NULL buffer with count %zu", count);
    if (rc != 0) {
        refuse(&x); /* the others fail too (inv. 4) */
        return rc;
    }
    if (r->size == 1)
        return 0; /* one contribution; avg divides by 1: exact */

    x.ce = r->chunk_bytes / x.esize;
    size_t seg0_off, seg0_len;
    ring_segment(count, r->size, 0, &seg0_off, &seg0_len); /* segment 0 is a longest one */
    x.nch = seg0_len == 0 ? 1 : (seg0_len + x.ce - 1) / x.ce;
    x.T = x.Ts = 2 * ((size_t)r->size - 1) * x.nch;
    x.tag = ring__data_tag(r, x.seq, signature(count, dtype, op));
    x.deadline = ring__deadline(r, cancel);
    return finish(&x, "ring_allreduce");
}
