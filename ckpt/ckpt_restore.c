/*
 * ckpt/ckpt_restore.c - reading a committed checkpoint back, and verifying one. A restore
 * reads into the engine's staging memory (the held snapshot, ckpt.c I8), never into the
 * registered buffers: the caller copies it out (ckpt_restore_held) only once the whole
 * checkpoint verified on every rank, so a checkpoint that fails at its k-th tensor leaves
 * the caller's buffers as they were. The match of the tensor set is checked before
 * anything is read; every tensor's checksum is checked as it is read.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, d ? "," : "", shape[d]);
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
}

static int check_match(const fmt_ckpt *c, const ckpt_tensor *t, size_t n, const char *where)
{
    char a[160], b[160];
    bool *seen = calloc(c->n ? c->n : 1, sizeof(*seen));
    if (!seen)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        long k = fmt_ckpt_find(c, t[i].name);
        if (k < 0) {
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s has no tensor '%s' (registered)", where,
                          t[i].name);
            break;
        }
        seen[k] = true;
        const fmt_tensor *f = &c->t[k];
        bool same = f->dtype == t[i].dtype && f->ndim == t[i].ndim;
        for (int d = 0; same && d < f->ndim; d++)
            same = f->shape[d] == t[i].shape[d];
        if (!same) {
            shape_str(a, sizeof(a), f->ndim, f->shape);
            shape_str(b, sizeof(b), t[i].ndim, t[i].shape);
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s: tensor '%s' is %s %s there but registered as %s %s",
                          where, t[i].name, rk__dtype_name(f->dtype), a, rk__dtype_name(t[i].dtype), b);
        }
    }
    for (size_t k = 0; k < c->n && !rc; k++)
        if (!seen[k])
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s holds tensor '%s', which is not registered", where,
                          c->t[k].name);
    free(seen);
    return rc;
}

int ckpt_load(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    char name[64], path[4096];
    fmt_step_name(name, sizeof(name), step);
    snprintf(path, sizeof(path), "%s/%s", e->dir, name);
    fmt_ckpt *c = NULL;
    int rc = fmt_ckpt_open(path, &c);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, rc, "%s skipped: %s", path, rk_last_error());
    if (c->step != step) {
        rc = rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "%s skipped: its index says step %" PRId64, path, c->step);
        goto out;
    }
    if ((rc = check_match(c, t, n, path)) != 0 || (rc = ckpt__hold_space(e, t, n)) != 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        long k = fmt_ckpt_find(c, t[i].name);
        if ((rc = fmt_ckpt_read(c, (size_t)k, e->staging + e->held_off[i])) != 0) {
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_WARN, rc, "%s skipped: %s", path, rk_last_error());
            goto out; /* staging holds part of it: no snapshot is held (-1) */
        }
    }
    e->held_step = step;
out:
    fmt_ckpt_close(&c);
    return rc;
}

int ckpt_verify_dir(const char *stepdir, char *bad, size_t cap)
{
    fmt_ckpt *c = NULL;
    char dummy[8];
    if (!bad) {
        bad = dummy;
        cap = sizeof(dummy);
    }
    bad[0] = '\0';
    int rc = fmt_ckpt_open(stepdir, &c);
    if (rc) {
        snprintf(bad, cap, "%s", rk_last_error());
        return rc;
    }
    uint64_t max = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->t[i].nbytes > max)
            max = c->t[i].nbytes;
    void *buf = malloc(max ? max : 1);
    if (!buf) {
        fmt_ckpt_close(&c);
        return -ENOMEM;
    }
    int first = 0;
    size_t len = 0;
    for (size_t i = 0; i < c->n; i++) {
        int r = fmt_ckpt_read(c, i, buf);
        if (r == 0)
            continue;
        if (!first)
            first = r;
        if (len < cap)
            len += (size_t)snprintf(bad + len, cap - len, "%s%s", len ? "; " : "", rk_last_error());
    }
    free(buf);
    fmt_ckpt_close(&c);
    return first;
}
