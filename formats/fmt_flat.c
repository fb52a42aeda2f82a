/*
 * formats/fmt_flat.c - a checkpoint as one self-contained HDF5 file (`rekindle restore`,
 * contract section 4): every tensor at its name, data in the file itself (no external
 * links, no virtual datasets), each with its xxh3_64 attribute, and the checkpoint's root
 * attributes. The one HDF5 writer outside a checkpoint's own files; tools/ calls it.
 */
#include <errno.h>
#include <hdf5.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmt_internal.h"

/* Tensor t's bytes as a dataset at its name, with its checksum attribute. */
static int write_one(hid_t f, hid_t lcpl, const fmt_tensor *t, const void *buf)
{
    hsize_t dims[FMT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        dims[d] = (hsize_t)t->shape[d];
    hid_t sp = t->ndim ? H5Screate_simple(t->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t ty = fmt_h5_type(t->dtype), ds = -1, as = H5Screate(H5S_SCALAR), at = -1;
    int rc = -1;
    /* a sharded tensor's pieces were checked per block: its whole checksum is computed here */
    uint64_t h = t->kind == FMT_SHARDED ? fmt_xxh3(buf, t->nbytes) : t->xxh3;
    if (sp >= 0 && ty >= 0 && as >= 0 && (ds = H5Dcreate2(f, t->name, ty, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
        (t->nbytes == 0 || H5Dwrite(ds, ty, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0) &&
        (at = H5Acreate2(ds, "xxh3_64", H5T_STD_U64LE, as, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
        H5Awrite(at, H5T_NATIVE_UINT64, &h) >= 0)
        rc = 0;
    if (at >= 0)
        H5Aclose(at);
    if (ds >= 0)
        H5Dclose(ds);
    if (as >= 0)
        H5Sclose(as);
    if (ty >= 0)
        H5Tclose(ty);
    if (sp >= 0)
        H5Sclose(sp);
    return rc;
}

/* Every tensor of c into the open file f; *bad: a read failed (the checkpoint's fault). */
static int write_all(fmt_ckpt *c, hid_t f, const char *part, void (*each)(void *arg, uint64_t bytes), void *arg,
                     bool *bad)
{
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    int rc = lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0
                 ? 0
                 : rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "%s: link creation properties", part);
    for (size_t i = 0; i < c->n && !rc; i++) {
        void *buf = malloc(c->t[i].nbytes ? c->t[i].nbytes : 1);
        if (!buf) {
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -ENOMEM, "out of memory for tensor '%s'", c->t[i].name);
            break;
        }
        if ((rc = fmt_ckpt_read(c, i, buf)) != 0)
            *bad = true;
        else if (write_one(f, lcpl, &c->t[i], buf) < 0)
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "%s: cannot write tensor '%s'", part, c->t[i].name);
        free(buf);
        if (!rc && each)
            each(arg, c->t[i].nbytes);
    }
    if (lcpl >= 0)
        H5Pclose(lcpl);
    return rc;
}

int fmt_write_flat(fmt_ckpt *c, const char *path, void (*each)(void *arg, uint64_t bytes), void *arg, bool *bad)
{
    char part[PATH_MAX + 8];
    *bad = false;
    if (snprintf(part, sizeof(part), "%s.part", path) >= (int)sizeof(part))
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -ENAMETOOLONG, "%s: name too long", path);
    fmt_h5_quiet();
    hid_t f = H5Fcreate(part, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "cannot create %s", part);
    int rc = 0;
    if (fmt_h5_root_attrs(f, c->step, c->world, c->io_path, c->commit_ns) < 0)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "%s: cannot write attributes", part);
    else
        rc = write_all(c, f, part, each, arg, bad);
    if (H5Fclose(f) < 0 && !rc)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "%s: close failed", part);
    if (!rc && (fmt_fsync_path(part, false) != 0 || rename(part, path) != 0))
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, errno ? -errno : RK_E_HDF5, "cannot make %s durable: %s", path,
                      strerror(errno));
    if (!rc) { /* the rename too: a power cut must not leave only the .part */
        char parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", path);
        int frc = fmt_fsync_path(dirname(parent), true);
        if (frc != 0) {
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, frc, "cannot make the new name %s durable (fsync of its "
                          "directory): %s", path, strerror(-frc));
            unlink(path);
        }
    }
    if (rc)
        unlink(part);
    return rc;
}
