/*
 * recover/registry.c - the tensors a worker registered with rk_register(), in order.
 *
 * Names are paths in the checkpoint's HDF5 file: '/' separates groups. A name is
 * accepted only if HDF5 can hold it as a dataset path and no other tensor needs it as
 * a group (or the reverse): "a" and "a/b" cannot both exist.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../formats/fmt.h"
#include "rec_internal.h"

bool rec_name_valid(const char *name, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (!name || !*name) {
        *why = "empty name";
        return false;
    }
    size_t len = strlen(name);
    if (len > REC_MAX_NAME) {
        *why = "longer than 255 bytes";
        return false;
    }
    if (name[0] == '/' || name[len - 1] == '/') {
        *why = "begins or ends with '/'";
        return false;
    }
    const char *comp = name;
    for (const char *p = name;; p++) {
        if (*p == '/' || *p == '\0') {
            size_t n = (size_t)(p - comp);
            if (n == 0) {
                *why = "empty path component ('//')";
                return false;
            }
            if ((n == 1 && comp[0] == '.') || (n == 2 && comp[0] == '.' && comp[1] == '.')) {
                *why = "path component '.' or '..'";
                return false;
            }
            if (*p == '\0')
                break;
            comp = p + 1;
        } else if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            *why = "control character";
            return false;
        }
    }
    return true;
}

/* "a" is a group of "a/b": one is a proper prefix of the other, at a '/'. */
static bool group_conflict(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la == lb)
        return false;
    const char *s = la < lb ? a : b, *l = la < lb ? b : a;
    size_t ls = la < lb ? la : lb;
    return strncmp(s, l, ls) == 0 && l[ls] == '/';
}

int rec_registry_add(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                     const int64_t *shape, unsigned flags)
{
    const char *why = NULL;
    if (!ctx)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register: ctx is NULL");
    if (!rec_name_valid(name, &why))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NAME, "rk_register: name '%s': %s",
                        name ? name : "(null)", why);
    if (rk__dtype_size(dtype) == 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_DTYPE, "rk_register '%s': dtype %d", name, (int)dtype);
    if (strcmp(name, REC_RANKS_GROUP) == 0 || strncmp(name, REC_RANKS_GROUP "/", strlen(REC_RANKS_GROUP) + 1) == 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NAME,
                        "rk_register: name '%s': '" REC_RANKS_GROUP "' holds per-rank state in the checkpoint", name);
    if (flags & ~(unsigned)(RK_DEVICE | RK_SHARDED | RK_PER_RANK | RK_FROZEN))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register '%s': unknown flags 0x%x", name, flags);
    if ((flags & RK_SHARDED) && (flags & RK_PER_RANK))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL,
                        "rk_register '%s': RK_SHARDED and RK_PER_RANK together (a tensor is one or the other)", name);
    if (ndim < 0 || ndim > REC_MAX_DIMS)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register '%s': ndim %d not in [0, %d]", name,
                        ndim, REC_MAX_DIMS);
    if ((flags & RK_SHARDED) && ndim < 1)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL,
                        "rk_register '%s': RK_SHARDED needs ndim >= 1 (it is split along dimension 0)", name);
    if (ndim > 0 && !shape)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register '%s': shape is NULL with ndim %d", name, ndim);
    size_t nbytes = rk__dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register '%s': shape[%d] = %lld is negative",
                            name, d, (long long)shape[d]);
        if (shape[d] > 0 && nbytes > SIZE_MAX / (uint64_t)shape[d])
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EOVERFLOW, "rk_register '%s': size overflows", name);
        nbytes *= (size_t)shape[d];
    }
    if (!ptr && nbytes > 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "rk_register '%s': NULL buffer for %zu bytes", name, nbytes);
    if ((flags & RK_DEVICE) && (flags & (RK_SHARDED | RK_PER_RANK)))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOTAVAIL,
                        "rk_register '%s': RK_DEVICE with RK_SHARDED or RK_PER_RANK: the rebuild of a rank's own state "
                        "from the survivors' memory copies host memory only (register a host copy)", name);
    int drc = (flags & RK_DEVICE) && nbytes > 0 ? ckpt_device_check(ptr, name) : 0;
    if (drc)
        return drc;
    for (size_t i = 0; i < ctx->ntensors; i++) {
        if (strcmp(ctx->tensors[i].name, name) == 0)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_DUPLICATE, "rk_register: '%s' is already registered", name);
        if (group_conflict(ctx->tensors[i].name, name))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NAME,
                            "rk_register: '%s' and '%s' cannot both exist (one would be a group of the other)",
                            name, ctx->tensors[i].name);
    }
    if (ctx->ntensors == ctx->cap_tensors) {
        size_t cap = ctx->cap_tensors ? 2 * ctx->cap_tensors : 16;
        struct rec_tensor *t = realloc(ctx->tensors, cap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        ctx->tensors = t;
        ctx->cap_tensors = cap;
    }
    struct rec_tensor *t = &ctx->tensors[ctx->ntensors];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name)))
        return -ENOMEM;
    t->ptr = ptr;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->nbytes = nbytes;
    t->flags = flags;
    t->rows_global = ndim > 0 ? shape[0] : 0; /* sharded: set by the agreement (api_ckpt.c) */
    t->bound_rows = ndim > 0 ? shape[0] : 0; /* sharded: ndim >= 1 */
    ctx->ntensors++;
    return 0;
}

struct rec_tensor *rec_registry_find(rk_ctx *ctx, const char *name)
{
    for (size_t i = 0; ctx && name && i < ctx->ntensors; i++)
        if (strcmp(ctx->tensors[i].name, name) == 0)
            return &ctx->tensors[i];
    return NULL;
}

void rec_registry_pop(rk_ctx *ctx)
{
    if (ctx->ntensors > 0)
        free(ctx->tensors[--ctx->ntensors].name);
}

size_t rec_row_bytes(const struct rec_tensor *t)
{
    size_t b = rk__dtype_size(t->dtype);
    for (int d = 1; d < t->ndim; d++)
        b *= (size_t)t->shape[d];
    return b;
}

void rec_registry_free(rk_ctx *ctx)
{
    for (size_t i = 0; i < ctx->ntensors; i++)
        free(ctx->tensors[i].name);
    free(ctx->tensors);
    ctx->tensors = NULL;
    ctx->ntensors = ctx->cap_tensors = 0;
}

/* What the members of a sharded or per-rank registration must have alike: name, flags
   and, for a sharded tensor, dtype and trailing dimensions (63 bits, never negative). */
int64_t rec_registration_hash(const struct rec_tensor *t)
{
    uint64_t h = fmt_xxh3(t->name, strlen(t->name) + 1);
    int64_t v[2 + REC_MAX_DIMS] = {(int64_t)t->flags, -1};
    size_t n = 1;
    if (t->flags & RK_SHARDED) {
        v[n++] = t->dtype;
        v[n++] = t->ndim;
        for (int d = 1; d < t->ndim; d++)
            v[n++] = t->shape[d];
    }
    return (int64_t)((h ^ fmt_xxh3(v, n * sizeof(*v))) >> 1);
}
