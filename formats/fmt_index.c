/*
 * formats/fmt_index.c - index.h5 (an external link per tensor to its shard, by a relative
 * file name, and the root attributes), followed by the commit record that sums every
 * file (fmt_shard.c), and the durable commit of a checkpoint directory:
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
#include "fmt.h"

static int cmp_order(const void *a, const void *b)
{
    const fmt_tensor *x = *(const fmt_tensor *const *)a, *y = *(const fmt_tensor *const *)b;
    return (x->order > y->order) - (x->order < y->order);
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
    qsort(all, total, sizeof(*all), cmp_order);

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
        snprintf(file, sizeof(file), "shard-%d.h5", all[i]->rank);
        char target[FMT_MAX_NAME + 2];
        snprintf(target, sizeof(target), "/%s", all[i]->name);
        if (H5Lcreate_external(file, target, f, all[i]->name, lcpl, H5P_DEFAULT) < 0) {
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "index %s: link '%s' -> %s", path, all[i]->name, file);
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
    (void)sb, (void)type, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
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
