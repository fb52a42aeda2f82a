/*
 * recover/api_read.c - rk_reader_*: one committed checkpoint read by hand, without a job
 * (no rk_init, no MPI): the public face of formats/'s reader, for rekindle.load() in
 * Python and for programs that restore a model outside training.
 *
 * The newest checkpoint is the first of ckpt_list's order, as for rk_resume. Every
 * read goes through fmt_ckpt_read, which reads a tensor's bytes at the offset its
 * shard's manifest records and checks its checksum: no HDF5 metadata of the data files
 * is parsed on the way.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int rk_reader_read(rk_reader *r, size_t i, void *buf, uint64_t nbytes)
{
    if (!r || i >= r->c->n)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_reader_read: no tensor %zu", i);
    const fmt_tensor *t = &r->c->t[i];
    if (nbytes != t->nbytes || (!buf && nbytes))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL,
                        "rk_reader_read: tensor '%s' has %" PRIu64 " bytes, the buffer %" PRIu64 "%s", t->name,
                        t->nbytes, nbytes, buf ? "" : " (NULL)");
    return fmt_ckpt_read(r->c, i, buf);
}

void rk_reader_close(rk_reader **r)
{
    if (!r || !*r)
        return;
    fmt_ckpt_close(&(*r)->c);
    free(*r);
    *r = NULL;
}
