/*
 * formats/fmt_readdirect.c - the fast read of a large tensor at restore: O_DIRECT through
 * io_uring, DIRECT_DEPTH reads of DIRECT_PIECE bytes in flight into reused page-aligned
 * buffers; each piece is hashed while it is hot in the cache, then copied to the caller's
 * buffer (which need not be aligned). One pass over memory instead of read-then-hash over
 * a cold page cache.
 *
 * Used only for tensors of at least DIRECT_MIN bytes starting on a 4 KiB boundary (the
 * shard writer aligns them); anything else, or a file system or kernel without O_DIRECT or
 * io_uring, takes fmt_ckpt_read's pread path, said once in the log. Every read passes
 * fmt_fault (RK_FAULT) first.
 *
 * Every wait for a completion is bounded: when none of the reads in flight completes for
 * DIRECT_STALL_MS (a disk that stopped answering), the read fails with RK_E_TIMEOUT naming
 * the file, instead of blocking rk_resume or a rollback from disk for ever. The kernel
 * still owns the bounce buffers then: they are retained for the life of the process
 * (rk__retain_forever), never freed or reused, and the reader refuses further reads.
 * Only reads the kernel took are waited for: when io_uring_submit takes none (fails), the
 * reads in flight are collected, the ring is closed (what it still queues must never go
 * out with a later read) and this read and every later one take pread, said once.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "fio.h"
#include "fmt_internal.h"

#define DIRECT_PIECE (4u << 20)
#define DIRECT_DEPTH 8
#define DIRECT_STALL_MS 60000 /* no read completed for this long: the disk stopped */
#define ALIGN_4K(x) (((x) + 4095u) & ~(uint64_t)4095u)

struct fmt_direct {
    struct io_uring ring;
    bool ring_ok;
    bool off;       /* O_DIRECT or io_uring unusable here: every read takes pread */
    bool stuck;     /* a read never completed: the kernel may still write `bounce` */
    char *bounce;   /* DIRECT_DEPTH pieces, page-aligned */
    int *fds;       /* O_DIRECT descriptor of each shard, -1 until used */
    int nfds;
    XXH3_state_t *xs;
};

void fmt_direct_free(fmt_direct **pd)
{
    fmt_direct *d = *pd;
    if (!d)
        return;
    if (d->ring_ok)
        io_uring_queue_exit(&d->ring);
    for (int i = 0; i < d->nfds; i++)
        if (d->fds[i] >= 0)
            close(d->fds[i]);
    free(d->fds);
    if (d->stuck)
        rk__retain_forever(d->bounce); /* reads still in flight may land there */
    else
        free(d->bounce);
    if (d->xs)
        XXH3_freeState(d->xs);
    free(d);
    *pd = NULL;
}

static int give_up(fmt_direct *d, const char *dir, const char *why, int err)
{
    if (!d->off)
        RK_LOG_WARN(RK_SUB_FMT, "restore from %s: %s (%s): buffered reads instead of O_DIRECT", dir, why,
                    strerror(-err));
    d->off = true;
    return -EOPNOTSUPP;
}

/* The reader of a checkpoint of `world` shards; created at its first large read. */
static int direct_get(fmt_ckpt *c, fmt_direct **out)
{
    if (!c->direct) {
        fmt_direct *d = calloc(1, sizeof(*d));
        if (!d)
            return -ENOMEM;
        c->direct = d;
        d->nfds = c->world;
        d->fds = malloc((size_t)c->world * sizeof(int));
        d->xs = XXH3_createState();
        if (!d->fds || !d->xs || posix_memalign((void **)&d->bounce, 4096, (size_t)DIRECT_DEPTH * DIRECT_PIECE) != 0) {
            d->bounce = NULL;
            return give_up(d, c->dir, "out of memory for read buffers", -ENOMEM);
        }
        for (int i = 0; i < d->nfds; i++)
            d->fds[i] = -1;
        int rc = fmt_fault(RK_FAULT_OP_URING, c->dir);
        rc = rc ? fmt_fault_apply(rc) : io_uring_queue_init(DIRECT_DEPTH, &d->ring, 0);
        if (rc)
            return give_up(d, c->dir, "io_uring unavailable", rc);
        d->ring_ok = true;
    }
    *out = c->direct;
    if (c->direct->stuck)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_TIMEOUT, "restore from %s: an earlier read never completed", c->dir);
    return c->direct->off ? -EOPNOTSUPP : 0;
}

/* Waits for one completion, at most DIRECT_STALL_MS: records its result in res[] by piece
   number; RK_E_TIMEOUT (and the reader is stuck for good) if none came. */
static int reap(fmt_direct *d, int32_t *res, bool *done)
{
    struct io_uring_cqe *cqe;
    int rc;
    int64_t deadline = rk__deadline_ns(DIRECT_STALL_MS);
    do {
        int64_t left = deadline - rk__mono_ns();
        struct __kernel_timespec ts = {.tv_sec = left > 0 ? left / 1000000000 : 0,
                                       .tv_nsec = left > 0 ? left % 1000000000 : 0};
        rc = io_uring_wait_cqe_timeout(&d->ring, &cqe, &ts);
    } while (rc == -EINTR && !rk__deadline_passed(deadline));
    if (rc == -ETIME || rc == -EINTR) {
        d->stuck = true;
        return RK_E_TIMEOUT;
    }
    if (rc < 0)
        return rc;
    uint64_t k = io_uring_cqe_get_data64(cqe);
    res[k % DIRECT_DEPTH] = cqe->res;
    done[k % DIRECT_DEPTH] = true;
    io_uring_cqe_seen(&d->ring, cqe);
    return 0;
}

int fmt__read_direct(fmt_ckpt *c, const fmt_tensor *t, const char *path, void *buf, uint64_t *hash)
{
    fmt_direct *d;
    int rc = direct_get(c, &d);
    if (rc)
        return rc;
    int fd = d->fds[t->rank];
    if (fd < 0) {
        fd = fmt_io_open(path, O_RDONLY | O_DIRECT, 0);
        if (fd < 0)
            return fd == -ENOENT ? RK_E_INCOMPLETE : give_up(d, c->dir, "O_DIRECT open refused", fd);
        d->fds[t->rank] = fd;
    }
    /* pieces prepared (sub), handed to the kernel (sent), completed and used (got) */
    uint64_t npieces = (t->nbytes + DIRECT_PIECE - 1) / DIRECT_PIECE, sub = 0, sent = 0, got = 0;
    int32_t res[DIRECT_DEPTH];
    bool done[DIRECT_DEPTH] = {false};
    int refused = 0; /* the error of a submission that handed the kernel nothing */
    XXH3_64bits_reset(d->xs);
    rc = 0;
    while (got < npieces && rc == 0) {
        while (sub < npieces && sub - got < DIRECT_DEPTH) {
            int f = fmt_fault(RK_FAULT_OP_READ, path);
            if (f) {
                rc = fmt_fault_apply(f);
                break;
            }
            uint64_t plen = t->nbytes - sub * DIRECT_PIECE;
            plen = plen > DIRECT_PIECE ? DIRECT_PIECE : plen;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
            io_uring_prep_read(sqe, fd, d->bounce + (sub % DIRECT_DEPTH) * DIRECT_PIECE, (unsigned)ALIGN_4K(plen),
                               t->offset + sub * DIRECT_PIECE);
            io_uring_sqe_set_data64(sqe, sub);
            done[sub % DIRECT_DEPTH] = false;
            sub++;
        }
        if (sub > sent) {
            int s = fmt_fault(RK_FAULT_OP_URING, path);
            s = s ? fmt_fault_apply(s) : io_uring_submit(&d->ring);
            if (s > 0)
                sent += (uint64_t)s;
            else if (rc == 0 && sent <= got)
                rc = refused = s < 0 ? s : -EAGAIN; /* nothing in flight to wait for */
        }
        if (rc)
            break;
        while (!done[got % DIRECT_DEPTH] && (rc = reap(d, res, done)) == 0)
            ;
        if (rc)
            break;
        uint64_t plen = t->nbytes - got * DIRECT_PIECE;
        plen = plen > DIRECT_PIECE ? DIRECT_PIECE : plen;
        int32_t r = res[got % DIRECT_DEPTH];
        if (r < 0) {
            rc = r;
            break;
        }
        if ((uint64_t)r < plen) { /* past the end: the shard is shorter than its manifest says */
            rc = RK_E_CORRUPT;
            break;
        }
        const char *p = d->bounce + (got % DIRECT_DEPTH) * DIRECT_PIECE;
        XXH3_64bits_update(d->xs, p, (size_t)plen);
        memcpy((char *)buf + got * DIRECT_PIECE, p, (size_t)plen);
        got++;
    }
    /* Never return while the kernel may still write a buffer: collect what is in flight,
       the reads handed to it and no others (unless the disk stopped: then the buffers are
       never reused, see the header). */
    for (uint64_t k = got; k < sent && !d->stuck; k++)
        while (!done[k % DIRECT_DEPTH] && reap(d, res, done) == 0)
            ;
    if (d->stuck)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "%s: reading tensor '%s': no read completed for %d ms (the disk stopped answering)", path,
                        t->name, DIRECT_STALL_MS);
    if (sent < sub) { /* reads left in the submission queue would go out with the next
                         read's: the ring goes, and every read takes pread from now on */
        io_uring_queue_exit(&d->ring);
        d->ring_ok = false;
        int off = give_up(d, c->dir, "io_uring refused the reads", refused ? refused : rc);
        if (refused)
            return off; /* this read too */
    }
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "%s: reading tensor '%s': %s", path, t->name, rk_strerror(rc));
    *hash = XXH3_64bits_digest(d->xs);
    return 0;
}
