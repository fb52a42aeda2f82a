/*
 * formats/fmt_index.c - index.h5 (an external link per replicated tensor to its shard, by
 * a relative file name; a virtual dataset of the global shape per sharded tensor over its
 * pieces; an external link per per-rank tensor at ranks/<r>/<name>; the root attributes),
 * followed by the commit record that sums every file (fmt_shard.c), and the durable
 * commit of a checkpoint directory:
 * fsync the temporary directory, rename it to its final name (or, if that name exists,
 * exchange the two atomically, so the name never goes missing), fsync the parent.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fio.h"
#include "fmt_internal.h"

int fmt__cmp_order(const void *a, const void *b)
{
    const fmt_tensor *x = *(const fmt_tensor *const *)a, *y = *(const fmt_tensor *const *)b;
    if (x->order != y->order)
        return (x->order > y->order) - (x->order < y->order);
    return (x->rank > y->rank) - (x->rank < y->rank);
}

bool fmt_per_rank_name(char *buf, size_t cap, int rank, const char *name)
{
    int n = snprintf(buf, cap, "ranks/%d/%s", rank, name);
    return n > 0 && (size_t)n < cap;
}

/* The virtual dataset of sharded tensor p[0] (its pieces p[0..n), by rank) at its name:
   the global shape, each piece's rows mapped from "shard-<r>.h5" (a relative name: HDF5
   looks for it beside index.h5). A tensor of no rows is an empty plain dataset. */
static int write_virtual(hid_t f, hid_t lcpl, const fmt_tensor *const *p, size_t n)
{
    const fmt_tensor *t = p[0];
    hsize_t dims[FMT_MAX_DIMS], start[FMT_MAX_DIMS] = {0}, count[FMT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        dims[d] = count[d] = (hsize_t)t->shape[d];
    dims[0] = (hsize_t)t->rows;
    hid_t sp = H5Screate_simple(t->ndim, dims, NULL), ty = fmt_h5_type(t->dtype), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t ds = -1;
    int rc = -1;
    if (sp < 0 || ty < 0 || dcpl < 0)
        goto out;
    for (size_t k = 0; k < n && t->rows > 0; k++) {
        char file[32];
        if (p[k]->shape[0] == 0)
            continue;
        hsize_t sdims[FMT_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++)
            sdims[d] = (hsize_t)p[k]->shape[d];
        hid_t src = H5Screate_simple(t->ndim, sdims, NULL);
        start[0] = (hsize_t)p[k]->row0;
        count[0] = (hsize_t)p[k]->shape[0];
        snprintf(file, sizeof(file), "shard-%d.h5", p[k]->rank);
        herr_t hr = src < 0 ? -1 : H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, NULL, count, NULL);
        if (hr >= 0)
            hr = H5Pset_virtual(dcpl, sp, file, p[k]->name, src);
        if (src >= 0)
            H5Sclose(src);
        if (hr < 0)
            goto out;
    }
    H5Sselect_all(sp);
    ds = H5Dcreate2(f, t->name, ty, sp, lcpl, dcpl, H5P_DEFAULT);
    rc = ds >= 0 ? 0 : -1;
out:
    if (ds >= 0)
        H5Dclose(ds);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (ty >= 0)
        H5Tclose(ty);
    if (sp >= 0)
        H5Sclose(sp);
    return rc;
}

int fmt_index_write(const char *dir, int64_t step, int world, fmt_manifest *const *shards, const char *io_path,
                    int64_t commit_ns)
{
    char path[4096], file[32];
    int rc = RK_E_HDF5;
    size_t total = 0, k = 0;
    fmt_h5_quiet();
    for (int r = 0; r < world; r++)
        total += shards[r]->n;
    const fmt_tensor **all = malloc((total ? total : 1) * sizeof(*all));
    if (!all)
        return -ENOMEM;
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < shards[r]->n; i++)
            all[k++] = &shards[r]->t[i];
    qsort(all, total, sizeof(*all), fmt__cmp_order);

    snprintf(path, sizeof(path), "%s/" FMT_INDEX, dir);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), f = -1;
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0)
        goto out_lcpl;
    errno = 0;
    f = H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, errno ? -errno : RK_E_HDF5, "index %s: cannot create", path);
        goto out_lcpl;
    }
    if (fmt_h5_root_attrs(f, step, world, io_path, commit_ns) < 0) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "index %s: root attributes", path);
        goto out_file;
    }
    for (size_t i = 0; i < total; i++) {
        if (all[i]->kind == FMT_SHARDED) {
            size_t n = 1;
            while (i + n < total && all[i + n]->order == all[i]->order)
                n++;
            if (write_virtual(f, lcpl, all + i, n) < 0) {
                rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "index %s: virtual dataset '%s'", path, all[i]->name);
                goto out_file;
            }
            i += n - 1;
            continue;
        }
        char at[FMT_MAX_NAME + 32], target[FMT_MAX_NAME + 2];
        snprintf(file, sizeof(file), "shard-%d.h5", all[i]->rank);
        snprintf(target, sizeof(target), "/%s", all[i]->name);
        snprintf(at, sizeof(at), "%s", all[i]->name);
        if (all[i]->kind == FMT_PER_RANK)
            fmt_per_rank_name(at, sizeof(at), all[i]->rank, all[i]->name);
        if (H5Lcreate_external(file, target, f, at, lcpl, H5P_DEFAULT) < 0) {
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "index %s: link '%s' -> %s", path, at, file);
            goto out_file;
        }
    }
    herr_t hc = H5Fclose(f);
    f = -1;
    if (hc < 0) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "index %s: close failed", path);
        goto out_lcpl;
    }
    rc = fmt_fsync_path(path, false);
    if (!rc)
        rc = fmt_commit_write(dir, step, world, shards, io_path, commit_ns);
out_file:
    if (f >= 0)
        H5Fclose(f);
out_lcpl:
    if (lcpl >= 0)
        H5Pclose(lcpl);
    free(all);
    return rc;
}

int fmt_commit_dir(const char *parent, const char *tmp, const char *final)
{
    char from[4096], to[4096];
    snprintf(from, sizeof(from), "%s/%s", parent, tmp);
    snprintf(to, sizeof(to), "%s/%s", parent, final);
    int rc = fmt_fsync_path(from, true);
    if (rc)
        return rc;
    /* One committer per label (rank 0): check, then rename or exchange. */
    struct stat sb;
    bool replace = stat(to, &sb) == 0;
    if (!replace) {
        rc = fmt_io_rename(from, to);
    } else if ((rc = fmt_io_exchange(from, to)) == -EINVAL || rc == -ENOSYS) {
        /* No atomic exchange here: the old directory goes aside first (a moment without
           `final`; the label's older timeline is lost if the process dies in it). */
        RK_LOG_WARN(RK_SUB_FMT, "commit: %s cannot exchange directories (%s): replacing %s in two renames", parent,
                    strerror(-rc), to);
        char aside[4200];
        snprintf(aside, sizeof(aside), "%s.old", from);
        if ((rc = fmt_io_rename(to, aside)) == 0 && (rc = fmt_io_rename(from, to)) == 0)
            rc = fmt_io_rename(aside, from);
    }
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "commit: %s %s -> %s: %s", replace ? "exchange" : "rename", from,
                        to, strerror(-rc));
    if ((rc = fmt_fsync_path(parent, true)) != 0)
        return rc;
    if (replace) /* the old one now has the temporary name: a dead attempt if we stop here */
        fmt_remove_tree(from);
    return 0;
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    int rc = type == FTW_DP || type == FTW_DNR ? fmt_io_rmdir(path) : fmt_io_unlink(path);
    if (rc && rc != -ENOENT)
        errno = -rc;
    return rc == 0 || rc == -ENOENT ? 0 : -1;
}

int fmt_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -errno;
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_WARN, errno ? -errno : -EIO, "remove %s: %s", path, strerror(errno));
    return 0;
}
