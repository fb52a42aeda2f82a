/*
 * formats/fmt_read.c - opening a committed checkpoint (index.h5's root attributes, every
 * shard's manifest, the index's links checked against them) and reading a tensor back
 * with its checksum verified.
 *
 * Tensor bytes are read at the offset the manifest recorded, bounded by the shard's size
 * (large aligned ones with O_DIRECT through io_uring, fmt_readdirect.c; others with pread): the data path parses no HDF5 metadata, so a damaged shard yields
 * RK_E_CORRUPT, never a crash or a hang. index.h5 itself is opened with HDF5 (its root
 * attributes and links), and only after the commit record (commit.ok) was found intact
 * and every file's checksum matched it: libhdf5 never parses a byte that was not checked.
 * A format-1 checkpoint (no record) is read from its manifests alone; its index.h5,
 * which nothing sums, is never opened.
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
    free(c->by_name);
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

/* index.h5's root attributes and every tensor's link, once its checksum matched the commit
   record k: the attributes must say what k says, each link must point at its tensor in
   the right shard (what h5py users read). */
static int read_index(fmt_ckpt *c, const char *path, const fmt_commit *k)
{
    fmt_h5_quiet();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: not a readable HDF5 file", path);
    int32_t world = 0, version = 0;
    int64_t step = -1, commit_ns = 0;
    int rc = 0;
    if (attr_read(f, "commit_time_ns", H5T_NATIVE_INT64, &commit_ns) < 0)
        commit_ns = 0; /* written only when positive */
    if (attr_read(f, "step", H5T_NATIVE_INT64, &step) < 0 || attr_read(f, "world_size", H5T_NATIVE_INT32, &world) < 0 ||
        attr_read(f, "format_version", H5T_NATIVE_INT32, &version) < 0)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_FORMAT, "%s: root attributes step/world_size/format_version missing",
                      path);
    else if (version != FMT_VERSION || step != k->step || world != k->world || commit_ns != k->commit_ns)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: root attributes differ from %s", path, FMT_COMMIT);
    if (!rc)
        rc = check_links(c, f, path);
    H5Fclose(f);
    return rc;
}

/* A file's size and checksum against what the commit record says (m: of a shard file,
   outside m's tensors' data). */
static int check_sum(const char *path, const fmt_manifest *m, const fmt_file_sum *want)
{
    fmt_file_sum got;
    int rc = fmt_file_sum_of(path, m, &got);
    if (rc)
        return rc;
    if (got.size != want->size || got.xxh3 != want->xxh3)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                        "%s: %s (%" PRIu64 " bytes, checksum %016" PRIx64 "; " FMT_COMMIT " recorded %" PRIu64
                        " bytes, %016" PRIx64 ")",
                        path, got.size != want->size ? "size differs from the commit record" : "checksum mismatch",
                        got.size, got.xxh3, want->size, want->xxh3);
    return 0;
}

static int cmp_name(const void *a, const void *b, void *arg)
{
    const fmt_tensor *t = arg;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* Every shard's manifest (with a commit record k: each checked against it, and each shard
   file's bytes outside its tensors' data), then every tensor in registration order,
   positions 0..n-1, names unique (sorted: by_name). */
static int load_manifests(fmt_ckpt *c, const fmt_commit *k)
{
    char path[4096];
    size_t total = 0;
    uint64_t nonce = k ? k->nonce : 0;
    if (!(c->shards = calloc((size_t)c->world, sizeof(*c->shards))) || !(c->fds = malloc((size_t)c->world * sizeof(int))))
        return -ENOMEM;
    for (int r = 0; r < c->world; r++)
        c->fds[r] = -1;
    for (int r = 0; r < c->world; r++) {
        snprintf(path, sizeof(path), "%s/shard-%d.ok", c->dir, r);
        int rc = k ? check_sum(path, NULL, &k->ok[r]) : 0;
        if (rc || (rc = fmt_manifest_read(path, &c->shards[r])) != 0)
            return rc;
        fmt_manifest *m = c->shards[r];
        if (r == 0 && !k)
            nonce = m->nonce;
        if (m->step != c->step || m->world != c->world || m->rank != r || m->nonce != nonce)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                            "%s: step/world/rank/attempt do not match the checkpoint's (a stale or foreign shard)", path);
        if (m->version != (k ? FMT_VERSION : FMT_VERSION_LEGACY))
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: a format-%d manifest in a format-%d checkpoint",
                            path, m->version, k ? FMT_VERSION : FMT_VERSION_LEGACY);
        if (k) {
            snprintf(path, sizeof(path), "%s/shard-%d.h5", c->dir, r);
            if (m->file.size != k->h5[r].size || m->file.xxh3 != k->h5[r].xxh3)
                return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: its manifest and " FMT_COMMIT " differ",
                                path);
            if ((rc = check_sum(path, m, &k->h5[r])) != 0)
                return rc;
        }
        total += m->n;
    }
    if (!(c->t = calloc(total ? total : 1, sizeof(*c->t))) || !(c->by_name = malloc((total ? total : 1) * sizeof(size_t))))
        return -ENOMEM;
    for (int r = 0; r < c->world; r++)
        for (size_t i = 0; i < c->shards[r]->n; i++)
            c->t[c->n++] = c->shards[r]->t[i];
    qsort(c->t, c->n, sizeof(*c->t), cmp_order);
    for (size_t i = 0; i < c->n; i++) {
        if (c->t[i].order != i)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor positions are not 0..%zu",
                            c->dir, c->n - 1);
        c->by_name[i] = i;
    }
    qsort_r(c->by_name, c->n, sizeof(*c->by_name), cmp_name, c->t);
    for (size_t i = 1; i < c->n; i++)
        if (strcmp(c->t[c->by_name[i]].name, c->t[c->by_name[i - 1]].name) == 0)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s' appears twice", c->dir,
                            c->t[c->by_name[i]].name);
    return 0;
}

/* The commit record of c->dir into *k and its identity into c; or, for a checkpoint of
   format 1 (no record, and its manifests say format 1), *k NULL and the identity from
   shard-0.ok (no commit time: ordered by label, ckpt_list). */
static int open_record(fmt_ckpt *c, fmt_commit **k)
{
    char path[4096], ok[4096];
    snprintf(path, sizeof(path), "%s/" FMT_COMMIT, c->dir);
    int rc = fmt_commit_read(path, k);
    if (!rc) {
        c->step = (*k)->step;
        c->world = (*k)->world;
        c->commit_ns = (*k)->commit_ns;
        c->version = FMT_VERSION;
        snprintf(c->io_path, sizeof(c->io_path), "%s", (*k)->io_path);
    }
    if (rc != RK_E_INCOMPLETE)
        return rc;
    snprintf(ok, sizeof(ok), "%s/shard-0.ok", c->dir);
    fmt_manifest *m = NULL;
    bool legacy = fmt_manifest_read(ok, &m) == 0 && m->version == FMT_VERSION_LEGACY;
    if (legacy) {
        c->step = m->step;
        c->world = m->world;
        c->version = FMT_VERSION_LEGACY;
        snprintf(c->io_path, sizeof(c->io_path), "%s", m->io_path);
    }
    fmt_manifest_free(&m);
    return legacy ? 0 : rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_INCOMPLETE, "%s is missing", path);
}

int fmt_ckpt_open(const char *stepdir, fmt_ckpt **out)
{
    char path[4096];
    *out = NULL;
    fmt_ckpt *c = calloc(1, sizeof(*c));
    fmt_commit *k = NULL;
    if (!c || !(c->dir = strdup(stepdir))) {
        free(c);
        return -ENOMEM;
    }
    snprintf(path, sizeof(path), "%s/" FMT_INDEX, stepdir);
    /* The record, then the checksum of every file against it, the manifests, and only
       then index.h5 with libhdf5. Format 1 has no record: its index is never opened
       (the manifests say everything a reader needs). */
    int rc = open_record(c, &k);
    if (!rc && k)
        rc = check_sum(path, NULL, &k->index);
    if (!rc)
        rc = load_manifests(c, k);
    if (!rc && k)
        rc = read_index(c, path, k);
    fmt_commit_free(&k);
    if (rc) {
        fmt_ckpt_close(&c);
        return rc;
    }
    *out = c;
    return 0;
}

int fmt_index_info(const char *stepdir, int64_t *step, int64_t *commit_ns)
{
    fmt_ckpt c = {.dir = (char *)stepdir, .step = -1};
    fmt_commit *k = NULL;
    int rc = open_record(&c, &k);
    fmt_commit_free(&k);
    *step = c.step;
    *commit_ns = c.commit_ns;
    return rc;
}

long fmt_ckpt_find(const fmt_ckpt *c, const char *name)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int d = strcmp(c->t[c->by_name[mid]].name, name);
        if (d == 0)
            return (long)c->by_name[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
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
