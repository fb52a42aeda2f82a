/*
 * formats/fmt_read.c - opening a committed checkpoint (index.h5's root attributes, every
 * shard's manifest, the index's links checked against them) and reading a tensor back
 * with its checksum verified.
 *
 * Tensor bytes are read at the offset the manifest recorded, bounded by the shard's size
 * (large aligned ones with O_DIRECT through io_uring, fmt_readdirect.c; others with pread): the data path parses no HDF5 metadata, so a damaged shard yields
 * RK_E_CORRUPT, never a crash or a hang. index.h5 itself is opened with HDF5 (its root
 * attributes and links), and only after its manifests were found intact.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fio.h"
#include "fmt_internal.h"

static int attr_read(hid_t f, const char *name, hid_t memtype, void *v)
{
    hid_t a = H5Aopen(f, name, H5P_DEFAULT), sp = -1;
    int rc = -1;
    if (a < 0)
        return -1;
    sp = H5Aget_space(a);
    if (sp >= 0 && H5Sget_simple_extent_type(sp) == H5S_SCALAR && H5Aread(a, memtype, v) >= 0)
        rc = 0;
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

static int attr_read_str(hid_t f, const char *name, char *buf, size_t cap)
{
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t ft = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
    int rc = -1;
    if (ft >= 0 && mt >= 0 && H5Tget_class(ft) == H5T_STRING && H5Tis_variable_str(ft) == 0 &&
        H5Tget_size(ft) < cap && H5Tset_size(mt, H5Tget_size(ft) + 1) >= 0) {
        memset(buf, 0, cap);
        rc = H5Aread(a, mt, buf) >= 0 ? 0 : -1;
    }
    if (mt >= 0)
        H5Tclose(mt);
    if (ft >= 0)
        H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

void fmt_ckpt_close(fmt_ckpt **pc)
{
    if (!pc || !*pc)
        return;
    fmt_ckpt *c = *pc;
    for (int r = 0; c->shards && r < c->world; r++) {
        fmt_manifest_free(&c->shards[r]);
        if (c->fds && c->fds[r] >= 0)
            close(c->fds[r]);
    }
    fmt_direct_free(&c->direct);
    free(c->shards);
    free(c->fds);
    free(c->t);
    free(c->dir);
    free(c);
    *pc = NULL;
}

static int cmp_order(const void *a, const void *b)
{
    const fmt_tensor *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

static int check_links(fmt_ckpt *c, hid_t f, const char *path)
{
    char file[32];
    for (size_t i = 0; i < c->n; i++) {
        const fmt_tensor *t = &c->t[i];
        H5L_info_t li;
        char val[FMT_MAX_NAME + 64];
        const char *lfile = NULL, *lobj = NULL;
        unsigned flags;
        snprintf(file, sizeof(file), "shard-%d.h5", t->rank);
        if (H5Lexists(f, t->name, H5P_DEFAULT) <= 0 || H5Lget_info(f, t->name, &li, H5P_DEFAULT) < 0 ||
            li.type != H5L_TYPE_EXTERNAL || li.u.val_size > sizeof(val) ||
            H5Lget_val(f, t->name, val, sizeof(val), H5P_DEFAULT) < 0 ||
            H5Lunpack_elink_val(val, li.u.val_size, &flags, &lfile, &lobj) < 0 || !lfile || !lobj ||
            strcmp(lfile, file) != 0 || lobj[0] != '/' || strcmp(lobj + 1, t->name) != 0)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: the link of tensor '%s' is missing or wrong",
                            path, t->name);
    }
    return 0;
}

static int read_index(fmt_ckpt *c, const char *path, bool links)
{
    fmt_h5_quiet();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, access(path, F_OK) == 0 ? RK_E_CORRUPT : RK_E_INCOMPLETE,
                        "%s: %s", path, access(path, F_OK) == 0 ? "not a readable HDF5 file" : "missing");
    int32_t world = 0, version = 0;
    int rc = 0;
    if (attr_read(f, "step", H5T_NATIVE_INT64, &c->step) < 0 || attr_read(f, "world_size", H5T_NATIVE_INT32, &world) < 0 ||
        attr_read(f, "format_version", H5T_NATIVE_INT32, &version) < 0)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_FORMAT, "%s: root attributes step/world_size/format_version missing",
                      path);
    else if (version != FMT_VERSION)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_FORMAT, "%s: format_version %d (this build reads %d)", path,
                      version, FMT_VERSION);
    else if (world < 1 || world > (1 << 24) || c->step < 0)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_FORMAT, "%s: world_size %d or step %" PRId64 " out of range",
                      path, world, c->step);
    if (!rc && attr_read_str(f, "io_path", c->io_path, sizeof(c->io_path)) < 0)
        snprintf(c->io_path, sizeof(c->io_path), "unknown");
    if (!rc && (attr_read(f, "commit_time_ns", H5T_NATIVE_INT64, &c->commit_ns) < 0 || c->commit_ns < 0))
        c->commit_ns = 0; /* written before the attribute existed: ordered by label (ckpt_list) */
    c->world = world;
    c->version = version;
    if (!rc && links)
        rc = check_links(c, f, path);
    H5Fclose(f);
    return rc;
}

static int load_manifests(fmt_ckpt *c)
{
    char path[4096];
    size_t total = 0;
    uint64_t nonce = 0;
    if (!(c->shards = calloc((size_t)c->world, sizeof(*c->shards))) || !(c->fds = malloc((size_t)c->world * sizeof(int))))
        return -ENOMEM;
    for (int r = 0; r < c->world; r++)
        c->fds[r] = -1;
    for (int r = 0; r < c->world; r++) {
        snprintf(path, sizeof(path), "%s/shard-%d.ok", c->dir, r);
        int rc = fmt_manifest_read(path, &c->shards[r]);
        if (rc)
            return rc;
        fmt_manifest *m = c->shards[r];
        if (r == 0)
            nonce = m->nonce;
        if (m->step != c->step || m->world != c->world || m->rank != r || m->nonce != nonce)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                            "%s: step/world/rank/attempt do not match index.h5 (a stale or foreign shard)", path);
        total += m->n;
    }
    if (!(c->t = calloc(total ? total : 1, sizeof(*c->t))))
        return -ENOMEM;
    for (int r = 0; r < c->world; r++)
        for (size_t i = 0; i < c->shards[r]->n; i++)
            c->t[c->n++] = c->shards[r]->t[i];
    qsort(c->t, c->n, sizeof(*c->t), cmp_order);
    for (size_t i = 0; i < c->n; i++) {
        if (c->t[i].order != i)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor positions are not 0..%zu",
                            c->dir, c->n - 1);
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->t[i].name, c->t[j].name) == 0)
                return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s' appears twice", c->dir,
                                c->t[i].name);
    }
    return 0;
}

int fmt_ckpt_open(const char *stepdir, fmt_ckpt **out)
{
    char path[4096];
    *out = NULL;
    fmt_ckpt *c = calloc(1, sizeof(*c));
    if (!c || !(c->dir = strdup(stepdir))) {
        free(c);
        return -ENOMEM;
    }
    snprintf(path, sizeof(path), "%s/" FMT_INDEX, stepdir);
    /* Attributes first (world size), then the manifests, then the links. */
    int rc = read_index(c, path, false);
    if (!rc)
        rc = load_manifests(c);
    if (!rc)
        rc = read_index(c, path, true);
    if (rc) {
        fmt_ckpt_close(&c);
        return rc;
    }
    *out = c;
    return 0;
}

int fmt_index_info(const char *stepdir, int64_t *step, int64_t *commit_ns)
{
    char path[4096];
    fmt_ckpt c = {0};
    snprintf(path, sizeof(path), "%s/" FMT_INDEX, stepdir);
    int rc = read_index(&c, path, false);
    *step = c.step;
    *commit_ns = c.commit_ns;
    return rc;
}

long fmt_ckpt_find(const fmt_ckpt *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0)
            return (long)i;
    return -1;
}

int fmt_ckpt_read(fmt_ckpt *c, size_t i, void *buf)
{
    const fmt_tensor *t = &c->t[i];
    char path[4096];
    snprintf(path, sizeof(path), "%s/shard-%d.h5", c->dir, t->rank);
    if (c->fds[t->rank] < 0) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, errno == ENOENT ? RK_E_INCOMPLETE : -errno,
                            "%s: cannot open: %s", path, strerror(errno));
        c->fds[t->rank] = fd;
    }
    int fd = c->fds[t->rank];
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return -errno;
    if (t->nbytes > 0 && (t->offset > (uint64_t)sb.st_size || t->nbytes > (uint64_t)sb.st_size - t->offset))
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s' lies past the end of the file (truncated)",
                        path, t->name);
    if (t->nbytes >= FMT_DIRECT_MIN && t->offset % 4096 == 0) {
        uint64_t h = 0;
        int dr = fmt__read_direct(c, t, path, buf, &h);
        if (dr == 0 && h != t->xxh3)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s': checksum mismatch", path, t->name);
        if (dr != -EOPNOTSUPP)
            return dr;
    }
    uint64_t done = 0;
    while (done < t->nbytes) {
        size_t want = t->nbytes - done > (1u << 30) ? (1u << 30) : (size_t)(t->nbytes - done);
        int r = fmt_io_pread_all(fd, (char *)buf + done, want, (off_t)(t->offset + done), path);
        if (r)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, r, "%s: reading tensor '%s': %s", path, t->name, strerror(-r));
        done += want;
    }
    if (fmt_xxh3(buf, t->nbytes) != t->xxh3)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s': checksum mismatch", path, t->name);
    return 0;
}
