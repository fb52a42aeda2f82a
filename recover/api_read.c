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
 *  A3  RK_READ_SHARED: the batch is read through the page cache (fmt_ckpt_read_shared,
 *      formats/fmt_read.c), so that the processes of one machine reading the same tensors
 *      read the disk once between them (O_DIRECT reads it once for each).
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
    if (!rc)
        rc = flags & RK_READ_SHARED ? fmt_ckpt_read_shared(r->c, q, n) : fmt_ckpt_read_many(r->c, q, n, false);
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
