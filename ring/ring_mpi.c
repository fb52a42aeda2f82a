/*
 * ring/ring_mpi.c - the ring's membership and its MPI glue: create, destroy, rebuild over
 * survivors and spares, receive slots and their graveyard, abort tokens. See ring.c for
 * the design (invariant 7) and docs/RING.md for the protocol.
 *
 * One communicator for good: ring_create duplicates the creator's communicator (the
 * parent; collective, before any failure). Every ring of every epoch lives on it: the
 * membership is the sorted array of the members' parent ranks, the neighbours are the
 * parent ranks before and after this one in it, and every message is point-to-point on
 * the parent with the epoch in its tag. A rebuild after a failure is a bounded handshake
 * among the listed members (every member sends its epoch to every other and waits,
 * polling the cancellation source) followed by local work only (re-map the neighbours):
 * no collective MPI call is ever made after a failure, so a member that dies at any
 * point of a rebuild can delay the survivors by at most their deadline. MPI_Comm_free
 * of the parent at ring_destroy is local in Open MPI.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

int64_t ring__deadline(const ring *r, const ring_cancel *c)
{
    if (c && c->deadline_ns != 0)
        return c->deadline_ns;
    return rk__deadline_ns(r->timeout_ms);
}

void ring__send_token(ring *r, int dst, unsigned seq, unsigned sig)
{
    MPI_Request q;
    if (r->rank >= 0 && r->size > 1 && dst >= 0 && dst != r->prank &&
        RK_MPI(MPI_Isend(NULL, 0, MPI_BYTE, dst, ring__data_tag(r, seq, sig), r->parent, &q)) == MPI_SUCCESS)
        RK_MPI(MPI_Request_free(&q));
}

/* Frees mem and reqs if every request is complete (after cancelling it); otherwise keeps
   them in the grave until reap_graves finds them complete (invariants 2 and 6). */
static void bury(ring *r, MPI_Request *reqs, int n, void *mem)
{
    int pending = 0;
    for (int i = 0; i < n; i++) {
        int done = 1;
        if (reqs[i] != MPI_REQUEST_NULL) {
            RK_MPI(MPI_Cancel(&reqs[i]));
            if (RK_MPI(MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                done = 0;
        }
        pending += !done;
    }
    struct ring_grave *g = pending ? malloc(sizeof(*g)) : NULL;
    if (!g) {
        if (pending) /* cannot track them: leaking is the only safe choice */
            RK_LOG_WARN(RK_SUB_RING, "out of memory tracking %d pending transfers: leaking their buffer", pending);
        else {
            free(mem);
            free(reqs);
        }
        return;
    }
    *g = (struct ring_grave){.reqs = reqs, .nreqs = n, .mem = mem, .next = r->grave};
    r->grave = g;
    RK_LOG_DEBUG(RK_SUB_RING, "%d transfers still pending after an abort: buffer retired", pending);
}

/* Frees the graves whose requests MPI has completed. final (ring_destroy): the others'
   requests are released and their memory retained for good (rk__retain_forever), since a
   dead peer's pending receive may still be written (or a send still read). */
static void reap_graves(ring *r, bool final)
{
    struct ring_grave **link = &r->grave;
    while (*link) {
        struct ring_grave *g = *link;
        int done = 0;
        if (RK_MPI(MPI_Testall(g->nreqs, g->reqs, &done, MPI_STATUSES_IGNORE)) != MPI_SUCCESS)
            done = 0;
        if (!done && !final) {
            link = &g->next;
            continue;
        }
        if (done) {
            free(g->mem);
        } else {
            for (int i = 0; i < g->nreqs; i++)
                if (g->reqs[i] != MPI_REQUEST_NULL)
                    RK_MPI(MPI_Request_free(&g->reqs[i]));
            rk__retain_forever(g->mem); /* MPI may still write it */
            RK_LOG_DEBUG(RK_SUB_RING, "ring_destroy: transfers still pending: their buffer is retained");
        }
        *link = g->next;
        free(g->reqs);
        free(g);
    }
}

int ring__stage_alloc(ring *r)
{
    size_t w = (size_t)r->window;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, 2 * w * r->chunk_bytes) != 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -ENOMEM, "ring: %zu bytes of receive and send slots",
                        2 * w * r->chunk_bytes);
    MPI_Request *rq = malloc(2 * w * sizeof(*rq));
    if (!rq) {
        free(mem);
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -ENOMEM, "ring: request arrays");
    }
    for (size_t i = 0; i < 2 * w; i++)
        rq[i] = MPI_REQUEST_NULL;
    free(r->stage);
    free(r->rreq); /* rreq and sreq share one allocation */
    r->stage = mem;
    r->sstage = r->stage + w * r->chunk_bytes;
    r->rreq = rq;
    r->sreq = rq + w;
    return 0;
}

int ring__stage_bury(ring *r, int npending)
{
    (void)npending;
    /* The old slots stay with their requests (rreq is the base of the request
       allocation, receives then sends); the ring gets fresh ones. */
    MPI_Request *old_rq = r->rreq;
    void *old_mem = r->stage;
    r->stage = r->sstage = NULL;
    r->rreq = r->sreq = NULL;
    bury(r, old_rq, 2 * r->window, old_mem);
    return ring__stage_alloc(r);
}

/* Reports a failure already recorded by a callee once more, with this call's context. */
static int refail(int level, int rc, const char *what)
{
    char why[256];
    snprintf(why, sizeof(why), "%s", rk_last_error());
    return rk__fail(RK_SUB_RING, level, rc, "%s: %s", what, why);
}

/* A sorted, checked copy of a member list of parent ranks; NULL/0 means all. */
static int member_list(const ring *r, const int *in, int n, int **out)
{
    bool all = !in || n == 0;
    int m = all ? r->psize : n;
    int *v = malloc((size_t)m * sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (int i = 0; i < m; i++)
        v[i] = all ? i : in[i];
    qsort(v, (size_t)m, sizeof(*v), rk__cmp_int);
    for (int i = 0; i < m; i++) {
        if (v[i] < 0 || v[i] >= r->psize || (i > 0 && v[i] == v[i - 1])) {
            int bad = v[i];
            free(v);
            return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL,
                            "ring: member %d is out of range [0, %d) or listed twice", bad, r->psize);
        }
    }
    *out = v;
    return 0;
}

static int index_of(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return i;
    return -1;
}

/* Makes the sorted parent ranks `members` the ring of `epoch` (takes ownership of the
   array): the neighbours are re-mapped over them; nothing is sent. */
static void adopt(ring *r, int *members, int n, uint64_t epoch)
{
    free(r->members);
    r->members = members;
    r->size = n;
    r->epoch = epoch;
    r->rank = index_of(members, n, r->prank);
    r->left = r->rank < 0 ? -1 : members[(r->rank + n - 1) % n];
    r->right = r->rank < 0 ? -1 : members[(r->rank + 1) % n];
    r->seq = 0;
    r->fenced = false;
}

/* comm becomes the ring's parent (owned): errors returned, this process's rank and the
   size read from it. */
static void take_parent(ring *r, MPI_Comm comm)
{
    r->parent = comm;
    MPI_Comm_set_errhandler(r->parent, MPI_ERRORS_RETURN);
    MPI_Comm_rank(r->parent, &r->prank);
    MPI_Comm_size(r->parent, &r->psize);
}

static int create(ring **out, MPI_Comm comm, bool dup, const int *members, int nmembers, int timeout_ms)
{
    int rc, flag = 0, *list = NULL;
    void *ub = NULL;
    if (!out)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_create: out is NULL");
    *out = NULL;
    ring *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->parent = MPI_COMM_NULL;
    r->rank = r->left = r->right = -1;
    r->timeout_ms = timeout_ms;
    r->chunk_bytes = RING_DEFAULT_CHUNK;
    r->window = RING_DEFAULT_WINDOW;
    MPI_Comm mine = comm;
    /* bounded: a process of comm that died, or never calls, holds no one */
    if (dup && (rc = rk__mpi_dup_bounded(comm, &mine, rk__deadline_ns(timeout_ms), NULL, NULL, RK_SUB_RING,
                                         "ring_create: MPI_Comm_idup")) != 0)
        goto out_free;
    take_parent(r, mine);
    /* MPI_TAG_UB is an attribute of MPI_COMM_WORLD alone (MPI 4.1, 9.1.2): Open MPI
       attaches it to no other communicator, not even MPI_COMM_SELF or a duplicate of one,
       and its value holds for every communicator. */
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (!flag || *(int *)ub < RING_TAG_UB_MIN) {
        rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_MPI, "ring_create: MPI_TAG_UB %d < %d",
                      flag ? *(int *)ub : -1, RING_TAG_UB_MIN);
        goto out_parent;
    }
    /* The epoch of a data tag takes every bit above the control bit that the bound allows
       (ring_internal.h): a stale message is mistaken for a current one only after that
       many epochs. The bound is the same on every process of the job. */
    int ebits = RING_EPOCH_LO_BITS;
    while (ebits < RING_EPOCH_MAX_BITS && (int64_t)1 << (23 + ebits - RING_EPOCH_LO_BITS + 1) <= (int64_t)*(int *)ub + 1)
        ebits++;
    r->epoch_mask = (1u << ebits) - 1;
    if ((rc = member_list(r, members, nmembers, &list)) != 0)
        goto out_parent;
    if ((rc = ring__stage_alloc(r)) != 0)
        goto out_list;
    adopt(r, list, (!members || nmembers == 0) ? r->psize : nmembers, 0);
    *out = r;
    return 0;

out_list:
    free(list);
out_parent:
    if (dup)
        MPI_Comm_free(&r->parent);
out_free:
    free(r);
    return refail(RK_LOG_ERROR, rc, "ring_create");
}

int ring_create(ring **out, MPI_Comm comm, const int *members, int nmembers, int timeout_ms)
{
    return create(out, comm, true, members, nmembers, timeout_ms);
}

int ring_create_on(ring **out, MPI_Comm comm, const int *members, int nmembers, int timeout_ms)
{
    return create(out, comm, false, members, nmembers, timeout_ms);
}

void ring_destroy(ring **pr)
{
    if (!pr || !*pr)
        return;
    ring *r = *pr;
    reap_graves(r, true);
    if (r->parent != MPI_COMM_NULL)
        MPI_Comm_free(&r->parent);
    free(r->members);
    free(r->stage);
    free(r->rreq);
    free(r);
    *pr = NULL;
}

/* Names the members whose handshake message for `epoch` has not come (their receive is
   still pending) when the wait ended with rc; returns rc. */
static int handshake_missing(MPI_Request *q, const int *list, int n, int me, uint64_t epoch, int rc)
{
    char who[160] = "";
    size_t len = 0;
    int missing = 0;
    for (int i = 0; i < n; i++) {
        int done = 1;
        if (i == me || q[2 * i] == MPI_REQUEST_NULL ||
            (RK_MPI(MPI_Test(&q[2 * i], &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && done))
            continue;
        if (missing++ < 8 && len < sizeof(who))
            len += (size_t)snprintf(who + len, sizeof(who) - len, "%s%d", missing > 1 ? ", " : "", list[i]);
    }
    const char *why = rc == RK_E_TIMEOUT ? "the deadline passed" : "the membership changed";
    if (missing == 0)
        return rk__fail(RK_SUB_RING, RK_LOG_DEBUG, rc,
                        "handshake for epoch %llu: %s with every member heard from and a send pending",
                        (unsigned long long)epoch, why);
    return rk__fail(RK_SUB_RING, RK_LOG_DEBUG, rc,
                    "handshake for epoch %llu: %s with %d of %d members not heard from (rank %s%s)",
                    (unsigned long long)epoch, why, missing, n - 1, who, missing > 8 ? ", ..." : "");
}

/* The bounded handshake of a rebuild: every member sends the epoch to every other and
   waits for theirs. Nothing is created unless all answered with the same epoch. */
static int handshake(ring *r, const int *list, int n, uint64_t epoch, const ring_cancel *c)
{
    int me = index_of(list, n, r->prank), tag = ring__ctrl_tag(epoch, RING_CTRL_HANDSHAKE), rc = 0;
    size_t nq = 2 * (size_t)n;
    MPI_Request *q = malloc(nq * sizeof(*q));
    uint64_t *val = malloc((size_t)(n + 1) * sizeof(*val));
    if (!q || !val) {
        free(q);
        free(val);
        return -ENOMEM;
    }
    val[n] = epoch;
    for (size_t i = 0; i < nq; i++)
        q[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < n && rc == 0; i++) {
        if (i == me)
            continue;
        int m1 = RK_MPI(MPI_Irecv(&val[i], 1, MPI_UINT64_T, list[i], tag, r->parent, &q[2 * i]));
        int m2 = RK_MPI(MPI_Isend(&val[n], 1, MPI_UINT64_T, list[i], tag, r->parent, &q[2 * i + 1]));
        if (m1 != MPI_SUCCESS || m2 != MPI_SUCCESS)
            rc = rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, m1 != MPI_SUCCESS ? m1 : m2,
                              "rebuild handshake: post");
    }
    int64_t deadline = ring__deadline(r, c);
    for (int done = 0; rc == 0 && !done;) {
        int mrc = RK_MPI(MPI_Testall((int)nq, q, &done, MPI_STATUSES_IGNORE));
        if (mrc != MPI_SUCCESS)
            rc = rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, mrc, "rebuild handshake");
        else if (!done && (rc = ring__poll_cancel(c, deadline)) != 0)
            rc = handshake_missing(q, list, n, me, epoch, rc);
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (i != me && val[i] != epoch)
            rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_COLL_MISMATCH,
                          "rebuild: member %d is at epoch %llu, this one at %llu", list[i],
                          (unsigned long long)val[i], (unsigned long long)epoch);
    bury(r, q, (int)nq, val); /* frees both when complete (always, on success) */
    return rc;
}

int ring_rebuild(ring *r, const int *members, int nmembers, uint64_t epoch, const ring_cancel *c)
{
    int *list = NULL, rc;
    if (!r || !members || nmembers <= 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_rebuild: no ring or no members");
    if ((rc = member_list(r, members, nmembers, &list)) != 0)
        return rc;
    if (index_of(list, nmembers, r->prank) < 0) {
        free(list);
        r->fenced = true;
        return rk__fail(RK_SUB_RING, RK_LOG_WARN, RK_E_FENCED,
                        "ring_rebuild: epoch %llu excludes this process (rank %d of the job)",
                        (unsigned long long)epoch, r->prank);
    }
    reap_graves(r, false); /* receive slots of earlier aborts that MPI has finished with */
    if ((rc = handshake(r, list, nmembers, epoch, c)) != 0) {
        free(list);
        return refail(RK_LOG_WARN, rc, "ring_rebuild: handshake");
    }
    /* Between the handshake and the end of the rebuild (chaos kind kill_in_rebuild): a
       member that dies here costs the survivors at most their next call's deadline. */
    rk__fault_point("rebuild");
    adopt(r, list, nmembers, epoch);
    return 0;
}

int ring_rebuild_on(ring *r, MPI_Comm comm, const int *members, int nmembers, uint64_t epoch, const ring_cancel *c)
{
    if (!r || comm == MPI_COMM_NULL)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_rebuild_on: no ring or no communicator");
    /* What this process sent or posted on the communicator before stays there: its
       requests complete or stay graves (invariant 6); nothing of it can match a message
       of the new one. */
    MPI_Comm_free(&r->parent);
    take_parent(r, comm);
    r->rank = r->left = r->right = -1; /* a member of no ring of comm until the handshake */
    return ring_rebuild(r, members, nmembers, epoch, c);
}

/* A blob's message: the epoch and call number it belongs to, then its bytes. A receive
   that takes one of an earlier exchange (abandoned in this epoch, so with the same tag)
   drops it and posts again. */
struct blob_head {
    uint64_t epoch;
    uint64_t seq;
};

int ring_share_blob(ring *r, void *blob, size_t bytes, const ring_cancel *c)
{
    if (!r || !blob || bytes == 0 || bytes > (size_t)INT32_MAX - sizeof(struct blob_head))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_share_blob: no ring, no blob, or %zu bytes", bytes);
    if (r->fenced)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_FENCED, "ring_share_blob: the membership of epoch %llu excludes this process",
                        (unsigned long long)r->epoch);
    if (r->rank < 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "ring_share_blob: this process is a spare");
    if (r->size == 1)
        return 0;
    int tag = ring__ctrl_tag(r->epoch, RING_CTRL_NCCL_ID), n = r->rank == 0 ? r->size - 1 : 1, mrc = MPI_SUCCESS, rc = 0;
    size_t len = sizeof(struct blob_head) + bytes;
    struct blob_head head = {.epoch = r->epoch, .seq = r->seq}, got;
    MPI_Request *q = malloc((size_t)n * sizeof(*q));
    unsigned char *msg = malloc(len); /* MPI's copy: buried with q if a transfer is left pending */
    if (!q || !msg) {
        free(q);
        free(msg);
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -ENOMEM, "ring_share_blob: %zu bytes", len);
    }
    for (int i = 0; i < n; i++)
        q[i] = MPI_REQUEST_NULL;
    if (r->rank == 0) {
        memcpy(msg, &head, sizeof(head));
        memcpy(msg + sizeof(head), blob, bytes);
        for (int i = 1; i < r->size && mrc == MPI_SUCCESS; i++)
            mrc = RK_MPI(MPI_Isend(msg, (int)len, MPI_BYTE, r->members[i], tag, r->parent, &q[i - 1]));
    } else {
        mrc = RK_MPI(MPI_Irecv(msg, (int)len, MPI_BYTE, r->members[0], tag, r->parent, &q[0]));
    }
    if (mrc != MPI_SUCCESS)
        rc = rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, mrc, "ring_share_blob: post");
    int64_t deadline = ring__deadline(r, c);
    for (int done = 0; rc == 0 && !done;) {
        MPI_Status st;
        mrc = r->rank == 0 ? RK_MPI(MPI_Testall(n, q, &done, MPI_STATUSES_IGNORE)) : RK_MPI(MPI_Test(&q[0], &done, &st));
        int count = -1;
        if (mrc != MPI_SUCCESS) {
            rc = rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, mrc, "ring_share_blob");
        } else if (!done) {
            if ((rc = ring__poll_cancel(c, deadline)) == 0)
                rk__sleep_ns(20000);
        } else if (r->rank != 0 && (MPI_Get_count(&st, MPI_BYTE, &count), count != (int)len)) {
            rc = rk__fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_COLL_MISMATCH, "ring_share_blob: %d bytes from parent rank %d, "
                          "%zu expected", count, r->members[0], len);
        } else if (r->rank != 0 && (memcpy(&got, msg, sizeof(got)), got.epoch != head.epoch || got.seq != head.seq)) {
            RK_LOG_DEBUG(RK_SUB_RING, "ring_share_blob: dropped an earlier exchange's message (call %llu, this one %llu)",
                         (unsigned long long)got.seq, (unsigned long long)head.seq);
            done = 0;
            if ((mrc = RK_MPI(MPI_Irecv(msg, (int)len, MPI_BYTE, r->members[0], tag, r->parent, &q[0]))) != MPI_SUCCESS)
                rc = rk__mpi_fail(RK_SUB_RING, RK_LOG_DEBUG, RK_E_PEER_LOST, mrc, "ring_share_blob: post");
        }
    }
    if (rc == 0 && r->rank != 0)
        memcpy(blob, msg + sizeof(head), bytes);
    bury(r, q, n, msg); /* frees both once MPI is done with them (at once on success) */
    if (rc != 0)
        return rk__fail(RK_SUB_RING, RK_LOG_WARN, rc, "ring_share_blob: %s (ring rank %d of %d, epoch %llu): %s",
                        r->rank == 0 ? "sending" : "receiving", r->rank, r->size, (unsigned long long)r->epoch,
                        rc == RK_E_TIMEOUT ? "the deadline passed" : rc == RK_E_PEER_LOST ? "a member was lost" : rk_strerror(rc));
    return 0;
}

bool ring_is_member(const ring *r)
{
    return r && r->rank >= 0;
}

int ring_rank(const ring *r)
{
    return r ? r->rank : -1;
}

int ring_size(const ring *r)
{
    return r ? r->size : 0;
}

uint64_t ring_epoch(const ring *r)
{
    return r ? r->epoch : 0;
}

void ring_set_test_hook(ring *r, ring_hook_fn fn, void *arg)
{
    if (r) {
        r->hook = fn;
        r->hook_arg = arg;
    }
}

int ring_set_chunking(ring *r, size_t chunk_bytes, int window)
{
    if (!r || chunk_bytes < RING_MIN_CHUNK || chunk_bytes % 8 != 0 || chunk_bytes > (size_t)INT32_MAX ||
        window < 1 || window > RING_MAX_WINDOW)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_set_chunking: chunk %zu bytes, window %d",
                        chunk_bytes, window);
    size_t ob = r->chunk_bytes;
    int ow = r->window;
    r->chunk_bytes = chunk_bytes;
    r->window = window;
    int rc = ring__stage_alloc(r);
    if (rc != 0) {
        r->chunk_bytes = ob;
        r->window = ow;
    }
    return rc;
}
