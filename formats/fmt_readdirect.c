/*
 * formats/fmt_readdirect.c - the restore's reads: extents of shard files (runs, struct
 * fmt_run in fmt_internal.h) read into their destinations with many reads in flight
 * across them, every byte checked as its read completes. fmt_read.c turns the requests
 * of fmt_ckpt_read_many (whole tensors, rows of sharded ones) into runs; this file reads
 * them.
 *
 * A run is a contiguous extent of one shard that lands contiguously at dst: a whole
 * tensor, or the whole blocks of a sharded piece that a read of rows covers. Its bytes are
 * checked in units: one (the tensor's XXH3-64) or one per block of a sharded piece.
 *
 * Invariants (tests/test_read.c names the one each test checks):
 *  R1  The queue stays full across runs: up to READ_DEPTH reads of READ_PIECE bytes are in
 *      flight whatever tensor they belong to; the end of a tensor drains nothing.
 *  R2  A run is read one of three ways, chosen when the reader reaches it:
 *        straight  O_DIRECT through io_uring into dst itself: the run's file offset and
 *                  dst are 4 KiB-aligned, its pages are not in the page cache, and the
 *                  caller lets the reader drop dst's pages (R5; `drop`). Its last read is
 *                  rounded up to 4 KiB when dst has the room (fmt_run.room), else the
 *                  tail is read buffered;
 *        bounce    O_DIRECT into READ_BOUNCE page-aligned buffers of the reader, then
 *                  copied to dst (the offset aligned, but dst not, or not to be dropped);
 *        buffered  pread of READ_PIECE_BUF at a time in the calling thread, while the
 *                  O_DIRECT reads already queued go on: a run whose pages are mostly in
 *                  the page cache (cachestat: a warm file, which O_DIRECT would read from
 *                  the disk again), an unaligned one, and every run where O_DIRECT or
 *                  io_uring cannot be used (said once in the log).
 *  R3  Every byte is checked before the reader returns 0: reads are taken in the order
 *      they were queued (whatever order they complete in), their units hashed in file
 *      order; a mismatch fails with RK_E_CORRUPT naming the tensor, the file and, for a
 *      block, its rows; a read shorter than asked is RK_E_CORRUPT (the shard is shorter
 *      than its manifest says).
 *  R4  The reader never returns while the kernel may still write memory the caller owns:
 *      every read handed to the kernel is waited for, and only those. A submission that
 *      hands the kernel nothing while nothing is in flight closes the ring (what it still
 *      queues must never go out later) and the whole read is done again buffered, as is
 *      every later one.
 *  R5  Every wait for an O_DIRECT read is bounded: when none of the reads in flight
 *      completes for READ_STALL_MS (a disk that stopped answering), the read fails with
 *      RK_E_TIMEOUT naming the file. The kernel still owns the memory of the reads in
 *      flight then: the bounce buffers are kept for the life of the process
 *      (rk__retain_forever), the pages under a straight read are dropped (MADV_DONTNEED:
 *      the late transfer lands in pages no longer mapped; dst reads as zeros there), and
 *      the reader refuses every later read. A buffered read is a plain pread, bounded no
 *      more than the opener's own preads of the manifests and of each shard outside its
 *      data (fmt_read.c): it is taken for pages found in the page cache, unaligned runs
 *      and tails under 4 KiB, and where O_DIRECT cannot be used.
 *  R6  Every read passes fmt_fault first (RK_FAULT read: O_DIRECT and buffered alike;
 *      uring: the ring's setup and each submission).
 *  R7  A run with no dst is checked, not kept: read buffered (so that the page cache holds
 *      it after, for a read that places it: fmt_ckpt_read_many's check-only requests)
 *      into the reader's scratch buffer, a piece at a time, every unit checked as in R3.
 *
 * A read (struct piece, one of READ_DEPTH in the window):
 *   queued --submit (io_uring_submit)--> in flight --reap--> done --take: checked,
 *   copied out of its bounce buffer--> gone
 *   queued (buffered) --take: pread, checked--> gone
 *   in flight --reap, none for READ_STALL_MS: stall--> stuck (R5)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>

#include "fio.h"
#include "fmt_internal.h"

#define READ_PIECE     (4u << 20)
#define READ_PIECE_BUF (1u << 20)
#define READ_DEPTH     16
#define READ_BOUNCE    8
#define READ_STALL_MS  60000 /* no read completed for this long: the disk stopped */
#define ALIGN_4K(x)    (((x) + 4095u) & ~(uint64_t)4095u)

enum how { STRAIGHT, BOUNCE, BUFFERED };

struct fmt_direct {
    struct io_uring ring;
    bool ring_ok;
    bool off;     /* O_DIRECT or io_uring unusable here: every run is buffered */
    bool stuck;   /* a read never completed: the kernel may still write `bounce` */
    char *bounce; /* READ_BOUNCE buffers of READ_PIECE, page-aligned; NULL until used */
    char *scratch; /* READ_PIECE_BUF: where a run checked only (R7) is read; NULL until used */
    int *fds;     /* O_DIRECT descriptor of each shard, -1 until used */
    int nfds;
    XXH3_state_t *xs;
};

/* One read of the window. */
struct piece {
    size_t run;
    uint64_t off; /* in the file */
    uint64_t len; /* the run's bytes it reads */
    uint64_t ask; /* bytes asked of the kernel (len, or rounded up to 4 KiB) */
    char *to;     /* where it lands: dst, or a bounce buffer */
    char *dst;    /* where its bytes belong */
    enum how how;
    int slot;     /* its bounce buffer */
    uint64_t sqe; /* O_DIRECT: its submission's number */
    bool done;
    int32_t res;
};

/* The state of one fmt__read_runs. */
struct reader {
    fmt_ckpt *c;
    fmt_direct *d;
    struct fmt_run *runs;
    size_t nruns;
    bool drop;
    struct piece win[READ_DEPTH];
    uint64_t head, tail;             /* pieces taken, pieces queued */
    size_t run;                      /* the run being queued, */
    uint64_t pos;                    /* and how far */
    enum how how;                    /* its way (R2) */
    uint64_t body;                   /* straight: bytes read O_DIRECT, the rest buffered */
    uint64_t prepared, sent, reaped; /* O_DIRECT reads */
    bool slot_busy[READ_BOUNCE];
    size_t check_run; /* the run being checked, its unit and the unit's bytes left */
    uint64_t unit, unit_len, unit_left, checked;
    uint64_t n_how[3]; /* bytes read each way, and the most O_DIRECT reads in */
    uint64_t most;     /* flight at once: for the log */
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
        rk__retain_forever(d->bounce); /* reads still in flight may land there (R5) */
    else
        free(d->bounce);
    free(d->scratch); /* only ever read into by pread */
    if (d->xs)
        XXH3_freeState(d->xs);
    free(d);
    *pd = NULL;
}

static void give_up(fmt_direct *d, const char *dir, const char *why, int err)
{
    if (!d->off)
        RK_LOG_WARN(RK_SUB_FMT, "restore from %s: %s (%s): buffered reads instead of O_DIRECT", dir, why,
                    strerror(-err));
    d->off = true;
}

/* The reader of checkpoint c, made at its first read: the ring and the O_DIRECT
   descriptors come with its first O_DIRECT read (direct_ring). */
static int reader_get(fmt_ckpt *c, fmt_direct **out)
{
    if (!c->direct) {
        fmt_direct *d = calloc(1, sizeof(*d));
        if (!d)
            return -ENOMEM;
        c->direct = d;
        d->nfds = c->world;
        d->fds = malloc((size_t)c->world * sizeof(int));
        d->xs = XXH3_createState();
        if (!d->fds || !d->xs)
            return -ENOMEM;
        for (int i = 0; i < d->nfds; i++)
            d->fds[i] = -1;
    }
    *out = c->direct;
    if (c->direct->stuck)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "restore from %s: an earlier read never completed", c->dir);
    return 0;
}

/* The ring and the O_DIRECT descriptor of shard `rank`, made on first use; false (and the
   reader off, said once) where they cannot be. */
static bool direct_ready(fmt_ckpt *c, fmt_direct *d, int rank)
{
    if (d->off)
        return false;
    if (!d->ring_ok) {
        int rc = fmt_fault(RK_FAULT_OP_URING, c->dir);
        rc = rc ? fmt_fault_apply(rc) : io_uring_queue_init(READ_DEPTH, &d->ring, 0);
        if (rc) {
            give_up(d, c->dir, "io_uring unavailable", rc);
            return false;
        }
        d->ring_ok = true;
    }
    if (d->fds[rank] < 0) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/shard-%d.h5", c->dir, rank);
        int fd = fmt_io_open(path, O_RDONLY | O_DIRECT, 0);
        if (fd < 0) {
            give_up(d, c->dir, "O_DIRECT open refused", fd);
            return false;
        }
        d->fds[rank] = fd;
    }
    return true;
}

int fmt_cache_pages(int fd, uint64_t off, uint64_t len, uint64_t *pages)
{
#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif
    struct {
        uint64_t off, len;
    } range = {off, len};
    struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
    } cs;
    if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0)
        return -errno;
    *pages = cs.nr_cache;
    return 0;
}

/* Whether most of [off, off + len) of fd is in the page cache (where the kernel cannot
   say, nothing is taken as cached). */
static bool cached(int fd, uint64_t off, uint64_t len)
{
    uint64_t pages = 0;
    return fmt_cache_pages(fd, off, len, &pages) == 0 && pages * 4096 * 2 >= len;
}

/* The way run r is read (R2). */
static enum how choose(struct reader *s, const struct fmt_run *r)
{
    int fd = s->c->fds[r->rank];
    if (!r->dst || r->off % 4096 || cached(fd, r->off, r->len) || !direct_ready(s->c, s->d, r->rank))
        return BUFFERED; /* R7: a run checked only is read through the page cache */
    if (s->drop && (uintptr_t)r->dst % 4096 == 0)
        return STRAIGHT;
    return BOUNCE;
}

static const char *run_path(const struct reader *s, size_t run, char *path)
{
    snprintf(path, 4096, "%s/shard-%d.h5", s->c->dir, s->runs[run].rank);
    return path;
}

/* Queues the next piece: false when every run is queued, when it waits for a bounce
   buffer, or when its read failed to start (the error in rc: a fault injected, R6). */
static bool queue_one(struct reader *s, int *rc)
{
    while (s->run < s->nruns && s->pos == s->runs[s->run].len) {
        s->run++;
        s->pos = 0;
    }
    if (s->run == s->nruns)
        return false;
    const struct fmt_run *r = &s->runs[s->run];
    if (s->pos == 0) {
        s->how = choose(s, r);
        s->body = s->how != STRAIGHT || ALIGN_4K(r->len) <= r->room ? r->len : r->len & ~(uint64_t)4095;
    }
    enum how how = s->pos >= s->body ? BUFFERED : s->how;
    uint64_t chunk = how == BUFFERED ? READ_PIECE_BUF : READ_PIECE, end = how == BUFFERED ? r->len : s->body;
    struct piece *p = &s->win[s->tail % READ_DEPTH];
    *p = (struct piece){.run = s->run,
                        .off = r->off + s->pos,
                        .len = end - s->pos < chunk ? end - s->pos : chunk,
                        .dst = r->dst ? r->dst + s->pos : NULL,
                        .how = how,
                        .slot = -1};
    p->to = p->dst;
    if (!p->dst) { /* R7: read into the reader's scratch, one piece at a time (take) */
        if (!s->d->scratch && !(s->d->scratch = malloc(READ_PIECE_BUF))) {
            *rc = -ENOMEM;
            return false;
        }
        p->to = s->d->scratch;
    }
    p->ask = how == BUFFERED ? p->len : ALIGN_4K(p->len);
    if (how == BOUNCE) {
        for (int k = 0; k < READ_BOUNCE && p->slot < 0; k++)
            if (!s->slot_busy[k])
                p->slot = k;
        if (p->slot < 0)
            return false;
        if (!s->d->bounce &&
            posix_memalign((void **)&s->d->bounce, 4096, (size_t)READ_BOUNCE * READ_PIECE) != 0) {
            s->d->bounce = NULL;
            *rc = -ENOMEM;
            return false;
        }
        p->to = s->d->bounce + (size_t)p->slot * READ_PIECE;
    }
    if (how != BUFFERED) {
        char path[4096];
        int f = fmt_fault(RK_FAULT_OP_READ, run_path(s, s->run, path));
        if (f) {
            f = fmt_fault_apply(f);
            *rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, f, "%s: reading tensor '%s': %s", path, r->name,
                           rk_strerror(f));
            return false;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->d->ring);
        io_uring_prep_read(sqe, s->d->fds[r->rank], p->to, (unsigned)p->ask, p->off);
        io_uring_sqe_set_data64(sqe, s->tail);
        p->sqe = s->prepared++;
        if (p->slot >= 0)
            s->slot_busy[p->slot] = true;
    }
    s->n_how[how] += p->len;
    s->pos += p->len;
    s->tail++;
    return true;
}

/* Hands the kernel the reads queued and not yet submitted. RK_E_... -EOPNOTSUPP (R4) when
   it takes none while none is in flight. */
static int submit(struct reader *s)
{
    if (s->sent == s->prepared)
        return 0;
    int n = fmt_fault(RK_FAULT_OP_URING, s->c->dir);
    n = n ? fmt_fault_apply(n) : io_uring_submit(&s->d->ring);
    if (n > 0) {
        s->sent += (uint64_t)n;
        s->most = s->sent - s->reaped > s->most ? s->sent - s->reaped : s->most;
    } else if (s->sent == s->reaped) { /* nothing in flight to wait for: the ring goes */
        io_uring_queue_exit(&s->d->ring);
        s->d->ring_ok = false;
        s->prepared = s->sent;
        give_up(s->d, s->c->dir, "io_uring refused the reads", n < 0 ? n : -EAGAIN);
        return -EOPNOTSUPP;
    }
    return 0;
}

/* Waits for one completion, at most READ_STALL_MS (R5). */
static int reap(struct reader *s)
{
    struct io_uring_cqe *cqe;
    int rc;
    int64_t deadline = rk__deadline_ns(READ_STALL_MS);
    do {
        int64_t left = deadline - rk__mono_ns();
        struct __kernel_timespec ts = {.tv_sec = left > 0 ? left / 1000000000 : 0,
                                       .tv_nsec = left > 0 ? left % 1000000000 : 0};
        rc = io_uring_wait_cqe_timeout(&s->d->ring, &cqe, &ts);
    } while (rc == -EINTR && !rk__deadline_passed(deadline));
    if (rc == -ETIME || rc == -EINTR) {
        s->d->stuck = true;
        return RK_E_TIMEOUT;
    }
    if (rc < 0)
        return rc;
    struct piece *p = &s->win[io_uring_cqe_get_data64(cqe) % READ_DEPTH];
    p->res = cqe->res;
    p->done = true;
    s->reaped++;
    io_uring_cqe_seen(&s->d->ring, cqe);
    return 0;
}

/* The next unit of the run being checked: its bytes, a fresh hash. */
static void next_unit(struct reader *s, const struct fmt_run *r)
{
    s->unit_len = r->unit < r->len - s->checked ? r->unit : r->len - s->checked;
    s->unit_left = s->unit_len;
    XXH3_64bits_reset(s->d->xs);
}

/* Feeds n bytes of the run being checked to its units (R3). */
static int check(struct reader *s, const struct fmt_run *r, const char *p, uint64_t n)
{
    while (n > 0) {
        uint64_t m = n < s->unit_left ? n : s->unit_left;
        XXH3_64bits_update(s->d->xs, p, (size_t)m);
        p += m;
        n -= m;
        s->unit_left -= m;
        s->checked += m;
        if (s->unit_left > 0)
            continue;
        if (XXH3_64bits_digest(s->d->xs) != r->sums[s->unit]) {
            char path[4096];
            run_path(s, (size_t)(r - s->runs), path);
            if (!r->unit_rows)
                return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s': checksum mismatch",
                                path, r->name);
            uint64_t b0 = (r->block0 + s->unit) * r->unit_rows, rows = s->unit_len / (r->unit / r->unit_rows);
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                            "%s: tensor '%s': checksum mismatch in rows %" PRIu64 "..%" PRIu64
                            " of its piece",
                            path, r->name, b0, b0 + rows - 1);
        }
        s->unit++;
        next_unit(s, r);
    }
    return 0;
}

/* Takes the oldest piece (R3): waits for it or reads it, checks it, copies it out. */
static int take(struct reader *s)
{
    struct piece *p = &s->win[s->head % READ_DEPTH];
    const struct fmt_run *r = &s->runs[p->run];
    char path[4096];
    int rc = 0;
    if (p->run != s->check_run) { /* the first piece of its run */
        s->check_run = p->run;
        s->unit = 0;
        s->checked = 0;
        next_unit(s, r);
    }
    if (p->how == BUFFERED) {
        rc = fmt_io_pread_all(s->c->fds[r->rank], p->to, (size_t)p->len, (off_t)p->off,
                              run_path(s, p->run, path));
    } else {
        while (!p->done && (rc = reap(s)) == 0)
            ;
        if (!rc && p->res < 0)
            rc = p->res;
        else if (!rc && (uint64_t)p->res < p->len)
            rc = RK_E_CORRUPT; /* past the end: the shard is shorter than its manifest says */
    }
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "%s: reading tensor '%s': %s",
                        run_path(s, p->run, path), r->name, rk_strerror(rc));
    if ((rc = check(s, r, p->to, p->len)) != 0)
        return rc;
    if (p->how == BOUNCE) {
        memcpy(p->dst, p->to, (size_t)p->len);
        s->slot_busy[p->slot] = false;
    }
    s->head++;
    return 0;
}

/* After a stall (R5): the memory of every read still in flight is given up. */
static void abandon_in_flight(struct reader *s)
{
    for (uint64_t k = s->head; k < s->tail; k++) {
        struct piece *p = &s->win[k % READ_DEPTH];
        if (p->how == STRAIGHT && !p->done && p->sqe < s->sent)
            (void)madvise(p->to, (size_t)p->ask, MADV_DONTNEED);
    }
}

static int read_runs(struct reader *s)
{
    int rc = 0;
    while (rc == 0 && (s->head < s->tail || s->run < s->nruns)) {
        while (rc == 0 && s->tail - s->head < READ_DEPTH && queue_one(s, &rc))
            ;
        int sr = submit(s);
        if (sr == -EOPNOTSUPP)
            return sr;
        if (rc == 0 && s->head < s->tail)
            rc = take(s);
    }
    /* R4: the reads handed to the kernel are collected before returning (R5: unless the
       disk stopped), and none queued is left behind. */
    if (rc && submit(s) == -EOPNOTSUPP && s->sent == s->reaped)
        return rc;
    while (!s->d->stuck && s->reaped < s->sent && reap(s) == 0)
        ;
    if (s->d->stuck) {
        abandon_in_flight(s);
        char path[4096];
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "%s: reading tensor '%s': no read completed for %d ms (the disk stopped answering)",
                        run_path(s, s->win[s->head % READ_DEPTH].run, path),
                        s->runs[s->win[s->head % READ_DEPTH].run].name, READ_STALL_MS);
    }
    return rc;
}

int fmt__read_runs(fmt_ckpt *c, struct fmt_run *runs, size_t n, bool drop)
{
    fmt_direct *d;
    int rc = reader_get(c, &d);
    if (rc || n == 0)
        return rc;
    for (int again = 0; again < 2; again++) {
        struct reader s = {.c = c, .d = d, .runs = runs, .nruns = n, .drop = drop, .check_run = n};
        rc = read_runs(&s);
        RK_LOG_DEBUG(RK_SUB_FMT,
                     "restore from %s: %zu runs, bytes straight %" PRIu64 ", bounce %" PRIu64
                     ", buffered %" PRIu64 ", most in flight %" PRIu64 ": %s",
                     c->dir, n, s.n_how[STRAIGHT], s.n_how[BOUNCE], s.n_how[BUFFERED], s.most,
                     rc ? rk_strerror(rc) : "ok");
        if (rc != -EOPNOTSUPP)
            break; /* else R4: the ring is gone, every run is read buffered */
    }
    return rc;
}
