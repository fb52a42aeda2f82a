/*
 * recover/api_read.c - rk_reader_*: one committed checkpoint read by hand, without a job
 * (no rk_init, no MPI): the public face of formats/'s reader, for rekindle.load() and
 * rekindle.dcp.Reader in Python and for programs that restore a model outside training.
 *
 * The newest checkpoint is the first of ckpt_list's order, as for rk_resume. Every
 * read goes through fmt_ckpt_read_many, which reads a tensor's bytes at the offset its
 * shard's manifest records and checks its checksum: no HDF5 metadata of the data files
 * is parsed on the way.
 *
 * Invariants (tests/test_read.c names the one each test checks):
 *  A1  A batch (rk_reader_read_many) is checked whole before anything is read: a request
 *      naming no tensor, or whose buffer is not exactly its tensor's bytes, fails it with
 *      -EINVAL naming the request, and no byte of any buffer is written.
 *  A2  Every request of a batch is read by one fmt_ckpt_read_many (formats/fmt_readdirect.c
 *      R1-R6): its reads in flight together across tensors, every byte checked against
 *      its checksum (RK_E_CORRUPT naming the tensor and file), a fault anywhere failing
 *      the batch with every read handed to the kernel collected. rk_reader_read is a
 *      batch of one.
 *  A3  RK_READ_SHARED: the batch goes in windows of READ_AHEAD bytes (a request whole in
 *      one), the next window's file extents handed to the kernel's readahead
 *      (posix_fadvise WILLNEED) before the current one is read, so that the reader finds
 *      its pages in the page cache (R2: pread) and the processes of one machine reading
 *      the same tensors read the disk once between them (O_DIRECT reads it once for each).
 *      At most two windows are asked ahead of the reads. Where the kernel cannot say what
 *      the page cache holds (no cachestat, before Linux 6.5), no hint is given: the reader
 *      would read O_DIRECT all the same and the disk would be read twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/common.h"
#include "../ckpt/ckpt.h"
#include "../formats/fmt.h"
#include "rekindle.h"

/* A3: the bytes of a window, and of one WILLNEED (the kernel reads at most its readahead
   window, or the device's largest I/O, for each call) */
#define READ_AHEAD (256u << 20)
#define HINT_CHUNK (1u << 20)

struct rk_reader {
    fmt_ckpt *c;
};

int rk_reader_open(rk_reader **out, const char *ckpt_dir, int64_t step)
{
    if (!out || !ckpt_dir)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_reader_open: %s is NULL", out ? "ckpt_dir" : "r");
    *out = NULL;
    /* The order rk_resume uses (ckpt_list): the newest is the current timeline's. */
    ckpt_entry *list = NULL;
    size_t n = 0;
    int64_t pick = -1;
    int rc = ckpt_list(ckpt_dir, &list, &n);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "cannot list checkpoint directory %s: %s", ckpt_dir,
                        rk_strerror(rc));
    for (size_t i = 0; i < n && pick < 0; i++)
        if (step < 0 || list[i].step == step)
            pick = list[i].step;
    free(list);
    if (pick < 0) {
        if (step < 0)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOCKPT, "no committed checkpoint in %s", ckpt_dir);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOCKPT, "no committed checkpoint of step %" PRId64 " in %s",
                        step, ckpt_dir);
    }
    char name[64], path[4096];
    fmt_step_name(name, sizeof(name), pick);
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", ckpt_dir, name) >= sizeof(path))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENAMETOOLONG, "checkpoint path too long: %s", ckpt_dir);
    rk_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    if ((rc = fmt_ckpt_open(path, &r->c)) != 0) {
        free(r);
        return rc; /* fmt_ckpt_open named the file and what is wrong */
    }
    *out = r;
    return 0;
}

int64_t rk_reader_step(const rk_reader *r)
{
    return r ? r->c->step : -1;
}

int rk_reader_world(const rk_reader *r)
{
    return r ? r->c->world : -EINVAL;
}

size_t rk_reader_count(const rk_reader *r)
{
    return r ? r->c->n : 0;
}

int rk_reader_info(const rk_reader *r, size_t i, rk_tensor_info *out)
{
    if (!r || !out || i >= r->c->n)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_reader_info: no tensor %zu", i);
    const fmt_tensor *t = &r->c->t[i];
    memset(out, 0, sizeof(*out));
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    out->nbytes = t->nbytes;
    return 0;
}

long rk_reader_find(const rk_reader *r, const char *name)
{
    if (!r || !name)
        return -EINVAL;
    long k = fmt_ckpt_find(r->c, name);
    return k < 0 ? -ENOENT : k;
}

/* Request k of a batch as the reader takes it (A1; fn names the public call). */
static int request(const rk_reader *r, const char *fn, size_t k, const rk_read_req *q, fmt_read_req *out)
{
    if (q->i >= r->c->n)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "%s: request %zu: no tensor %zu", fn, k, q->i);
    const fmt_tensor *t = &r->c->t[q->i];
    if (q->nbytes != t->nbytes || (!q->buf && q->nbytes))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL,
                        "%s: request %zu: tensor '%s' has %" PRIu64 " bytes, the buffer %" PRIu64 "%s", fn, k,
                        t->name, t->nbytes, q->nbytes, q->buf ? "" : " (NULL)");
    *out = (fmt_read_req){.i = q->i, .first = 0, .nrows = t->rows, .dst = q->buf, .cap = (size_t)q->nbytes};
    return 0;
}

/* Whether the kernel says what the page cache holds (what the reader asks before each
   run: formats/fmt_readdirect.c R2). */
static bool cache_visible(int fd)
{
    uint64_t pages;
    return fmt_cache_pages(fd, 0, 4096, &pages) == 0;
}

/* A3: bytes [off, off + len) of shard `rank` handed to the kernel's readahead, through the
   descriptor the reads use; nothing where it cannot be opened (the read says why) or the
   kernel cannot say what the page cache holds. */
static void hint(rk_reader *r, int rank, uint64_t off, uint64_t len)
{
    int fd;
    if (fmt_ckpt_shard_fd(r->c, rank, &fd) != 0 || !cache_visible(fd))
        return;
    for (uint64_t at = 0; at < len; at += HINT_CHUNK)
        (void)posix_fadvise(fd, (off_t)(off + at), (off_t)(len - at < HINT_CHUNK ? len - at : HINT_CHUNK),
                            POSIX_FADV_WILLNEED);
}

/* A3: every extent of request q's tensor (a sharded one: each of its pieces) hinted. */
static void hint_request(rk_reader *r, const fmt_read_req *q)
{
    const fmt_tensor *t = &r->c->t[q->i];
    if (t->kind != FMT_SHARDED) {
        hint(r, t->rank, t->offset, t->nbytes);
        return;
    }
    for (size_t k = 0; k < t->npieces; k++) {
        const fmt_tensor *p = r->c->pieces[t->piece0 + k];
        hint(r, p->rank, p->offset, p->nbytes);
    }
}

/* The end of the window that starts at request k0 (A3: READ_AHEAD bytes, at least one
   request). */
static size_t window_end(const fmt_read_req *q, size_t n, size_t k0)
{
    uint64_t bytes = q[k0].cap;
    size_t k = k0 + 1;
    while (k < n && bytes + q[k].cap <= READ_AHEAD)
        bytes += q[k++].cap;
    return k;
}

int rk_reader_read_many(rk_reader *r, const rk_read_req *req, size_t n, unsigned flags)
{
    if (!r || (n && !req) || (flags & ~(unsigned)RK_READ_SHARED))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_reader_read_many: %s",
                        !r ? "r is NULL" : n && !req ? "req is NULL" : "unknown flags");
    if (n == 0)
        return 0;
    fmt_read_req *q = malloc(n * sizeof(*q));
    if (!q)
        return -ENOMEM;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++)
        rc = request(r, "rk_reader_read_many", k, &req[k], &q[k]);
    if (!rc && !(flags & RK_READ_SHARED))
        rc = fmt_ckpt_read_many(r->c, q, n, false);
    /* A3: window w read while window w + 1 is on its way into the page cache */
    for (size_t k0 = 0, k1 = 0, hinted = 0; !rc && (flags & RK_READ_SHARED) && k0 < n; k0 = k1) {
        k1 = window_end(q, n, k0);
        size_t next = k1 < n ? window_end(q, n, k1) : n;
        for (; hinted < next; hinted++)
            hint_request(r, &q[hinted]);
        rc = fmt_ckpt_read_many(r->c, q + k0, k1 - k0, false);
    }
    free(q);
    return rc;
}

int rk_reader_read(rk_reader *r, size_t i, void *buf, uint64_t nbytes)
{
    if (!r)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_reader_read: r is NULL");
    rk_read_req one = {.i = i, .buf = buf, .nbytes = nbytes};
    fmt_read_req q;
    int rc = request(r, "rk_reader_read", 0, &one, &q);
    return rc ? rc : fmt_ckpt_read_many(r->c, &q, 1, false);
}

void rk_reader_close(rk_reader **r)
{
    if (!r || !*r)
        return;
    fmt_ckpt_close(&(*r)->c);
    free(*r);
    *r = NULL;
}
