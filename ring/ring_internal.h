/*
 * ring/ring_internal.h - the ring handle and what ring.c (the allreduce engine) and
 * ring_mpi.c (communicators, MPI glue) share. Private to ring/.
 */
#ifndef RK_RING_INTERNAL_H
#define RK_RING_INTERNAL_H

#include "ring.h"

/* Tags (must fit MPI_TAG_UB >= 2^23 - 1, the smallest of Open MPI's PMLs: ucx's). Every
 * message of the ring travels point-to-point on the one parent communicator, in every epoch:
 *   data, abort tokens and a shift's length messages:
 *       (epoch >> 4) << 23 | (epoch & 0xf) << 18 | (seq & 0x1f) << 13 | sig
 *     sig: a 13-bit signature of (count, dtype, op) below RING_SIG_WANTS, a shift's
 *     signature, or a token; a message of another epoch (an older ring's) is drained and
 *     dropped (invariant 5). The epoch takes every bit MPI_TAG_UB leaves above bit 22:
 *     4 bits at the smallest bound, 12 with ob1's (2^31 - 1), so the epoch of a data tag
 *     wraps after 16 or 4096 epochs (epoch_mask, ring_create);
 *   control (bit 22): RING_TAG_CTRL | kind << 21 | (epoch & 0x1fffff), kind
 *     RING_CTRL_HANDSHAKE (the rebuild handshake) or RING_CTRL_NCCL_ID (ring_nccl.c);
 *     bits 23 and up are 0. */
#define RING_TAG_UB_MIN ((1 << 23) - 1)
#define RING_TAG_CTRL (1 << 22)
#define RING_CTRL_HANDSHAKE 0
#define RING_CTRL_NCCL_ID 1
#define RING_EPOCH_LO_BITS 4     /* epoch bits below the control bit */
#define RING_EPOCH_MAX_BITS 12   /* and with bits 23 .. 30 above it */
#define RING_CTRL_EPOCH_MASK 0x1fffffu
#define RING_SEQ_MASK 0x1fu
#define RING_SIG_MASK 0x1fffu
#define RING_SIG_WANTS 0x1ffbu  /* a shift's length message; allreduce signatures are below it */
#define RING_SIG_SHIFT 0x1ffcu  /* ring_shift's data */
enum ring_token {
    RING_TOK_TIMEOUT = 0x1ffd,  /* a member's deadline passed */
    RING_TOK_LOST = 0x1ffe,     /* a member saw the membership change or a failed transfer */
    RING_TOK_MISMATCH = 0x1fff, /* a member had bad or different arguments, or no memory */
};
/* A shift's length message (RING_SIG_WANTS), sent by each member to the member it receives
   from before anything else: the length it expects. The sender's data waits for it, so a
   different length fails at both ends at once (ring.c, hear_wants). An empty message of
   that tag is a refusal: the member cannot take part (bad arguments, no memory). epoch and
   seq in full: one left queued by an aborted call is told from this call's. */
struct ring_wants {
    uint64_t epoch;
    uint64_t seq;
    uint64_t bytes;
};
#define RING_MIN_CHUNK 128 /* a slot holds any control message (an NCCL unique id) */

#define RING_DEFAULT_CHUNK (256u * 1024u)
#define RING_DEFAULT_WINDOW 4
#define RING_MAX_WINDOW 64

/* Slots (and their requests) that MPI may still write or read after an abort: kept
   until MPI reports the requests complete, never reused (invariants 2 and 6). */
struct ring_grave {
    MPI_Request *reqs;
    int nreqs;
    void *mem;
    struct ring_grave *next;
};

struct ring {
    MPI_Comm parent;      /* dup of the creator's communicator, MPI_ERRORS_RETURN: every
                             message of every epoch travels on it, point-to-point */
    int prank, psize;     /* in parent */
    int rank, size;       /* in the ring; rank -1 for a spare */
    int left, right;      /* parent ranks of the neighbours (-1 for a spare) */
    int *members;         /* parent ranks of the members, ascending (the ring order) */
    uint64_t epoch;
    unsigned epoch_mask;  /* the bits of the epoch that data tags carry (MPI_TAG_UB) */
    bool fenced;          /* a rebuild excluded this process: every call fails */
    int timeout_ms;
    unsigned seq;         /* calls of ring_allreduce in this epoch (tags carry its low bits) */
    size_t chunk_bytes;
    int window;
    unsigned char *stage; /* 2 * window * chunk_bytes: the receive slots, then */
    unsigned char *sstage; /* the send slots (inside stage; slot i <-> sreq[i]) */
    MPI_Request *rreq;    /* window receive requests, slot i <-> rreq[i] */
    MPI_Request *sreq;    /* window send requests (a FIFO) */
    struct ring_grave *grave;
    ring_hook_fn hook;
    void *hook_arg;
};

/* The tag of a data message, token or length message of call `seq` in the ring's epoch,
   and the epoch bits of a data tag (compared with epoch & epoch_mask). */
static inline int ring__data_tag(const ring *r, unsigned seq, unsigned sig)
{
    unsigned e = (unsigned)r->epoch & r->epoch_mask;
    return (int)((e >> RING_EPOCH_LO_BITS) << 23 | (e & 0xfu) << 18 | (seq & RING_SEQ_MASK) << 13 |
                 (sig & RING_SIG_MASK));
}
static inline unsigned ring__tag_epoch(unsigned tag)
{
    return (tag >> 23) << RING_EPOCH_LO_BITS | ((tag >> 18) & 0xfu);
}
/* The tag of a control message of `kind` for `epoch`. */
static inline int ring__ctrl_tag(uint64_t epoch, int kind)
{
    return RING_TAG_CTRL | kind << 21 | (int)(epoch & RING_CTRL_EPOCH_MASK);
}

/* ring_mpi.c. MPI errors are translated by rk__mpi_fail (common/) at debug level: the
   ring's caller reports the failure once, with its context. */
/* Receive and send slots for the current chunking. ring__stage_bury: the old ones go
   to the grave if any of their requests is still pending (else are freed), and the
   ring gets fresh ones; -ENOMEM leaves it without slots (stage NULL): the next call
   allocates them before it starts (ring.c, slots). */
int ring__stage_alloc(ring *r);
int ring__stage_bury(ring *r, int npending);
/* Sends a zero-byte message of call seq with signature sig to parent rank dst and forgets
   the request: an abort token (enum ring_token) to the member the aborted call sends to,
   or a shift's refusal (RING_SIG_WANTS) to the member it receives from. */
void ring__send_token(ring *r, int dst, unsigned seq, unsigned sig);
/* 0, RK_E_PEER_LOST (changed) or RK_E_TIMEOUT (deadline). */
static inline int ring__poll_cancel(const ring_cancel *c, int64_t deadline_ns)
{
    if (c && c->changed && c->changed(c->arg))
        return RK_E_PEER_LOST;
    if (deadline_ns != INT64_MAX && rk__mono_ns() >= deadline_ns)
        return RK_E_TIMEOUT;
    return 0;
}
int64_t ring__deadline(const ring *r, const ring_cancel *c);

#endif
