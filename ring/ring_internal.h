/*
 * ring/ring_internal.h - the ring handle and what ring.c (the allreduce engine) and
 * ring_mpi.c (communicators, MPI glue) share. Private to ring/.
 */
#ifndef RK_RING_INTERNAL_H
#define RK_RING_INTERNAL_H

#include "ring.h"

/* Tags (must fit MPI_TAG_UB >= 2^23 - 1, the smallest of Open MPI's PMLs):
 *   data and abort tokens on the ring's communicator: (seq & 0x3f) << 16 | sig
 *     sig: a 16-bit signature of (count, dtype, op) below RING_SIG_TOKENS, or a token;
 *   the rebuild handshake on the parent communicator: RING_TAG_CTRL | (epoch & 0x3fffff). */
#define RING_TAG_UB_MIN ((1 << 23) - 1)
#define RING_TAG_CTRL (1 << 22)
#define RING_SEQ_MASK 0x3fu
#define RING_SIG_TOKENS 0xfffdu /* signatures are 0 .. RING_SIG_TOKENS - 1 */
enum ring_token {
    RING_TOK_TIMEOUT = 0xfffd,  /* a member's deadline passed */
    RING_TOK_LOST = 0xfffe,     /* a member saw the membership change or a failed transfer */
    RING_TOK_MISMATCH = 0xffff, /* a member had bad or different arguments */
};

#define RING_DEFAULT_CHUNK (256u * 1024u)
#define RING_DEFAULT_WINDOW 4
#define RING_MAX_WINDOW 64

/* Receive buffers (and their requests) that MPI may still write after an abort: kept
   until MPI reports the requests complete, never reused (invariant 2). */
struct ring_grave {
    MPI_Request *reqs;
    int nreqs;
    void *mem;
    struct ring_grave *next;
};

struct ring {
    MPI_Comm parent;      /* dup of the creator's communicator, MPI_ERRORS_RETURN */
    MPI_Comm comm;        /* the current ring; MPI_COMM_NULL for a spare */
    int prank, psize;     /* in parent */
    int rank, size;       /* in the ring; rank -1 for a spare */
    int left, right;      /* ring ranks of the neighbours */
    int *members;         /* parent ranks of the members, ascending (the ring order) */
    uint64_t epoch;
    bool fenced;          /* a rebuild excluded this process: every call fails */
    int timeout_ms;
    unsigned seq;         /* calls of ring_allreduce so far (tags carry its low 6 bits) */
    size_t chunk_bytes;
    int window;
    unsigned char *stage; /* window * chunk_bytes: the receive slots */
    MPI_Request *rreq;    /* window receive requests, slot i <-> rreq[i] */
    MPI_Request *sreq;    /* window send requests (a FIFO) */
    struct ring_grave *grave;
    MPI_Comm *retired;    /* communicators of earlier memberships, freed at destroy */
    int nretired;
    ring_hook_fn hook;
    void *hook_arg;
};

/* ring_mpi.c. MPI errors are translated by rk__mpi_fail (common/) at debug level: the
   ring's caller reports the failure once, with its context. */
/* Receive slots for the current chunking; the old ones go to the grave if any of
   `reqs` (n of them) is still pending, else are freed. */
int ring__stage_alloc(ring *r);
int ring__stage_bury(ring *r, int npending);
/* Sends a zero-byte abort token to the right neighbour and forgets the request. */
void ring__send_token(ring *r, unsigned seq, enum ring_token tok);
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
