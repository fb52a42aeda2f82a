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
 *
 *  S1  A shared read (fmt_ckpt_read_shared: tensors other processes of the machine read
 *      too) goes through the page cache, in windows of READ_AHEAD bytes whose extents are
 *      handed to the kernel's readahead one window ahead of the reads.
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
    for (size_t i = 0; c->t && i < c->n; i++)
        if (c->t[i].kind == FMT_PER_RANK)
            free(c->t[i].name);
    free(c->pieces);
    free(c->shards);
    free(c->fds);
    free(c->t);
    free(c->by_name);
    free(c->dir);
    free(c);
    *pc = NULL;
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
        if (t->kind == FMT_SHARDED) { /* a virtual dataset in index.h5 itself */
            if (H5Lexists(f, t->name, H5P_DEFAULT) <= 0 || H5Lget_info(f, t->name, &li, H5P_DEFAULT) < 0 ||
                li.type != H5L_TYPE_HARD)
                return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: the dataset of tensor '%s' is missing",
                                path, t->name);
            continue;
        }
        snprintf(file, sizeof(file), "shard-%d.h5", t->rank);
        if (H5Lexists(f, t->name, H5P_DEFAULT) <= 0 || H5Lget_info(f, t->name, &li, H5P_DEFAULT) < 0 ||
            li.type != H5L_TYPE_EXTERNAL || li.u.val_size > sizeof(val) ||
            H5Lget_val(f, t->name, val, sizeof(val), H5P_DEFAULT) < 0 ||
            H5Lunpack_elink_val(val, li.u.val_size, &flags, &lfile, &lobj) < 0 || !lfile || !lobj ||
            strcmp(lfile, file) != 0 || lobj[0] != '/' || strcmp(lobj + 1, t->stored) != 0)
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

/* The reader's entries of one registered tensor, from its n manifest entries p[0..n)
   (by rank): a replicated tensor is one entry; a per-rank tensor one per rank, named
   ranks/<r>/<name>; a sharded tensor one of the global shape over its pieces, which must
   be one per rank, alike, and tile the global rows in rank order (alike, their rows are
   of one size, and so are the blocks of those with bytes: the manifest reader accepts
   only the writer's block size, fmt_block_rows). RK_E_CORRUPT if not. */
static int add_entries(fmt_ckpt *c, const fmt_tensor **p, size_t n)
{
    int kind = p[0]->kind;
    for (size_t k = 0; k < n; k++)
        if (p[k]->kind != kind || strcmp(p[k]->name, p[0]->name) != 0)
            return RK_E_CORRUPT;
    if (kind == FMT_REPLICATED) {
        if (n != 1)
            return RK_E_CORRUPT;
        c->t[c->n] = *p[0];
        c->t[c->n++].stored = p[0]->name;
        return 0;
    }
    if (n != (size_t)c->world)
        return RK_E_CORRUPT;
    if (kind == FMT_PER_RANK) {
        for (size_t k = 0; k < n; k++) {
            char name[FMT_MAX_NAME + 32];
            fmt_tensor *t = &c->t[c->n];
            *t = *p[k];
            t->stored = p[k]->name;
            if (!fmt_per_rank_name(name, sizeof(name), p[k]->rank, p[k]->name) || !(t->name = strdup(name)))
                return -ENOMEM;
            c->n++;
        }
        return 0;
    }
    /* sharded: pieces alike but for their rows, tiling [0, rows) in rank order */
    int64_t row = 0;
    for (size_t k = 0; k < n; k++) {
        const fmt_tensor *q = p[k];
        bool same = q->dtype == p[0]->dtype && q->ndim == p[0]->ndim && q->rows == p[0]->rows && q->row0 == row;
        for (int d = 1; same && d < q->ndim; d++)
            same = q->shape[d] == p[0]->shape[d];
        if (!same)
            return RK_E_CORRUPT;
        row += q->shape[0];
        c->pieces[c->npieces + k] = q;
    }
    if (row != p[0]->rows)
        return RK_E_CORRUPT;
    fmt_tensor *t = &c->t[c->n++];
    *t = *p[0];
    t->shape[0] = p[0]->rows;
    t->row0 = 0;
    t->nbytes = 0;
    for (size_t k = 0; k < n; k++)
        t->nbytes += p[k]->nbytes;
    t->xxh3 = 0;
    t->offset = 0;
    t->rank = -1;
    t->blocks = NULL;
    t->nblocks = 0;
    t->stored = p[0]->name;
    t->piece0 = c->npieces;
    t->npieces = n;
    c->npieces += n;
    return 0;
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
   file's bytes outside its tensors' data), then every tensor in registration order as a
   reader sees it (add_entries), positions 0..n-1, names unique (sorted: by_name). */
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
    const fmt_tensor **all = malloc((total ? total : 1) * sizeof(*all));
    c->t = calloc(total ? total : 1, sizeof(*c->t));
    c->pieces = calloc(total ? total : 1, sizeof(*c->pieces));
    c->by_name = malloc((total ? total : 1) * sizeof(*c->by_name));
    if (!all || !c->t || !c->pieces || !c->by_name) {
        free(all);
        return -ENOMEM;
    }
    size_t at = 0;
    for (int r = 0; r < c->world; r++)
        for (size_t i = 0; i < c->shards[r]->n; i++)
            all[at++] = &c->shards[r]->t[i];
    qsort(all, total, sizeof(*all), fmt__cmp_order);
    int rc = 0;
    uint32_t order = 0;
    for (size_t i = 0, n; i < total && !rc; i += n, order++) {
        for (n = 1; i + n < total && all[i + n]->order == all[i]->order; n++)
            ;
        rc = all[i]->order != order ? RK_E_CORRUPT : add_entries(c, all + i, n);
        if (rc == RK_E_CORRUPT)
            rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                     "%s: tensor %" PRIu32 " ('%s'): positions are not 0..N-1, or its pieces do not fit together",
                     c->dir, all[i]->order, all[i]->name);
    }
    free(all);
    if (rc)
        return rc;
    for (size_t i = 0; i < c->n; i++)
        c->by_name[i] = i;
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

/* The descriptor of shard `rank` (opened on first use), its path into path[4096], and a
   check that bytes [off, off + len) lie inside it. */
static int shard_fd(fmt_ckpt *c, int rank, uint64_t off, uint64_t len, const char *name, char *path, int *out)
{
    snprintf(path, 4096, "%s/shard-%d.h5", c->dir, rank);
    if (c->fds[rank] < 0) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, errno == ENOENT ? RK_E_INCOMPLETE : -errno,
                            "%s: cannot open: %s", path, strerror(errno));
        c->fds[rank] = fd;
    }
    struct stat sb;
    if (fstat(c->fds[rank], &sb) != 0)
        return -errno;
    if (len > 0 && (off > (uint64_t)sb.st_size || len > (uint64_t)sb.st_size - off))
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s' lies past the end of the file (truncated)",
                        path, name);
    *out = c->fds[rank];
    return 0;
}

int fmt_ckpt_shard_fd(fmt_ckpt *c, int rank, int *fd)
{
    char path[4096];
    if (rank < 0 || rank >= c->world)
        return -EINVAL;
    return shard_fd(c, rank, 0, 0, "", path, fd);
}

/* The blocks of piece q that a read of its rows [lo, hi) holds only in part (at most
   its first and its last): each read whole into a buffer of its own, checked, and the
   rows wanted copied to dst (dst: row lo). The blocks wholly inside go to a run. */
static int partial_blocks(fmt_ckpt *c, const fmt_tensor *q, uint64_t lo, uint64_t hi, char *dst, const char *path)
{
    uint64_t rows = (uint64_t)q->shape[0], rb = q->nbytes / rows, br = q->block_rows;
    uint64_t ends[2] = {lo / br, (hi - 1) / br};
    char *b = NULL;
    int rc = 0;
    for (int e = 0; e < 2 && !rc; e++) {
        uint64_t k = ends[e], b0 = k * br, b1 = br < rows - b0 ? b0 + br : rows;
        if ((b0 >= lo && b1 <= hi) || (e == 1 && ends[1] == ends[0]))
            continue; /* inside, or the one block already read */
        if (!b && !(b = malloc(br * rb)))
            return -ENOMEM;
        if ((rc = fmt_io_pread_all(c->fds[q->rank], b, (b1 - b0) * rb, (off_t)(q->offset + b0 * rb), path)) != 0)
            rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "%s: reading tensor '%s': %s", path, q->name, strerror(-rc));
        else if (fmt_xxh3(b, (b1 - b0) * rb) != q->blocks[k])
            rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                          "%s: tensor '%s': checksum mismatch in rows %" PRIu64 "..%" PRIu64 " of its piece", path,
                          q->name, b0, b1 - 1);
        else {
            uint64_t from = b0 > lo ? b0 : lo, to = b1 < hi ? b1 : hi;
            if (dst) /* NULL: checked only (fmt_ckpt_read_many) */
                memcpy(dst + (from - lo) * rb, b + (from - b0) * rb, (to - from) * rb);
        }
    }
    free(b);
    return rc;
}

/* The runs of request r (its tensor whole, or the pieces of its rows) appended to
   runs[*n..]; the blocks read in part are read here (partial_blocks). */
static int plan(fmt_ckpt *c, const fmt_read_req *r, struct fmt_run *runs, size_t *n)
{
    char path[4096];
    int fd, rc;
    const fmt_tensor *t = &c->t[r->i];
    char *dst = r->dst;
    if (t->kind != FMT_SHARDED) {
        if ((rc = shard_fd(c, t->rank, t->offset, t->nbytes, t->name, path, &fd)) != 0)
            return rc;
        if (t->nbytes == 0)
            return fmt_xxh3(dst, 0) == t->xxh3
                       ? 0
                       : rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: tensor '%s': checksum mismatch", path,
                                  t->name);
        runs[(*n)++] = (struct fmt_run){.name = t->name, .rank = t->rank, .off = t->offset, .len = t->nbytes,
                                        .dst = dst, .room = r->cap, .unit = t->nbytes, .sums = &t->xxh3};
        return 0;
    }
    for (size_t k = 0; k < t->npieces; k++) {
        const fmt_tensor *q = c->pieces[t->piece0 + k];
        int64_t lo = r->first > q->row0 ? r->first : q->row0, hi = q->row0 + q->shape[0];
        if (hi > r->first + r->nrows)
            hi = r->first + r->nrows;
        if (lo >= hi || q->nbytes == 0)
            continue;
        uint64_t rows = (uint64_t)q->shape[0], rb = q->nbytes / rows, br = q->block_rows, need;
        uint64_t plo = (uint64_t)(lo - q->row0), phi = (uint64_t)(hi - q->row0);
        uint64_t at = (uint64_t)(lo - r->first) * rb; /* where its rows go in dst */
        if ((rc = shard_fd(c, q->rank, q->offset, q->nbytes, q->name, path, &fd)) != 0)
            return rc;
        if (__builtin_mul_overflow(br < rows ? br : rows, rb, &need))
            return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                            "%s: tensor '%s': blocks of %" PRIu64 " rows of %" PRIu64 " bytes", path, q->name, br, rb);
        if ((rc = partial_blocks(c, q, plo, phi, dst ? dst + at : NULL, path)) != 0)
            return rc;
        uint64_t ka = (plo + br - 1) / br, kb = phi == rows ? q->nblocks : phi / br; /* blocks wholly inside */
        if (kb <= ka)
            continue;
        uint64_t r0 = ka * br, r1 = kb * br < rows ? kb * br : rows;
        uint64_t to = at + (r0 - plo) * rb;
        bool last = to + (r1 - r0) * rb == (uint64_t)r->nrows * rb; /* may use the room after */
        runs[(*n)++] = (struct fmt_run){.name = q->name, .rank = q->rank, .off = q->offset + r0 * rb,
                                        .len = (r1 - r0) * rb, .dst = dst ? dst + to : NULL,
                                        .room = last ? r->cap - to : (r1 - r0) * rb,
                                        .unit = br * rb, .sums = q->blocks + ka, .unit_rows = br, .block0 = ka};
    }
    return 0;
}

int fmt_ckpt_read_many(fmt_ckpt *c, const fmt_read_req *r, size_t n, bool drop)
{
    size_t cap = 0, m = 0;
    for (size_t k = 0; k < n; k++) {
        const fmt_tensor *t = r[k].i < c->n ? &c->t[r[k].i] : NULL;
        if (!t || (t->kind == FMT_SHARDED && (r[k].first < 0 || r[k].nrows < 0 || r[k].first > t->rows ||
                                              r[k].nrows > t->rows - r[k].first)))
            return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -EINVAL, "rows %" PRId64 "+%" PRId64 " of tensor %zu: no such "
                            "tensor, or out of range", r[k].first, r[k].nrows, r[k].i);
        cap += t->kind == FMT_SHARDED ? t->npieces : 1;
    }
    struct fmt_run *runs = malloc((cap ? cap : 1) * sizeof(*runs));
    if (!runs)
        return -ENOMEM;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++)
        rc = plan(c, &r[k], runs, &m);
    if (!rc)
        rc = fmt__read_runs(c, runs, m, drop);
    free(runs);
    return rc;
}

/* ---- shared reads (S1): through the page cache, with the kernel's readahead asked ahead --- */

/* S1: the bytes of a window, and of one WILLNEED (the kernel reads at most its readahead
   window, or the device's largest I/O, for each call) */
#define READ_AHEAD (256u << 20)
#define HINT_CHUNK (1u << 20)

/* Whether the kernel says what the page cache holds (what the reader asks before each
   run: formats/fmt_readdirect.c R2). */
static bool cache_visible(int fd)
{
    uint64_t pages;
    return fmt_cache_pages(fd, 0, 4096, &pages) == 0;
}

/* S1: bytes [off, off + len) of shard `rank` handed to the kernel's readahead, through the
   descriptor the reads use; nothing where it cannot be opened (the read says why) or the
   kernel cannot say what the page cache holds. */
static void hint(fmt_ckpt *c, int rank, uint64_t off, uint64_t len)
{
    int fd;
    if (fmt_ckpt_shard_fd(c, rank, &fd) != 0 || !cache_visible(fd))
        return;
    for (uint64_t at = 0; at < len; at += HINT_CHUNK)
        (void)posix_fadvise(fd, (off_t)(off + at), (off_t)(len - at < HINT_CHUNK ? len - at : HINT_CHUNK),
                            POSIX_FADV_WILLNEED);
}

/* S1: every extent of request q's tensor (a sharded one: each of its pieces) hinted. */
static void hint_request(fmt_ckpt *c, const fmt_read_req *q)
{
    const fmt_tensor *t = &c->t[q->i];
    if (t->kind != FMT_SHARDED) {
        hint(c, t->rank, t->offset, t->nbytes);
        return;
    }
    for (size_t k = 0; k < t->npieces; k++) {
        const fmt_tensor *p = c->pieces[t->piece0 + k];
        hint(c, p->rank, p->offset, p->nbytes);
    }
}

/* The end of the window that starts at request k0 (S1: READ_AHEAD bytes, at least one
   request). */
static size_t window_end(const fmt_read_req *q, size_t n, size_t k0)
{
    uint64_t bytes = q[k0].cap;
    size_t k = k0 + 1;
    while (k < n && bytes + q[k].cap <= READ_AHEAD)
        bytes += q[k++].cap;
    return k;
}

int fmt_ckpt_read_shared(fmt_ckpt *c, const fmt_read_req *r, size_t n)
{
    int rc = 0;
    /* S1: window w read while window w + 1 is on its way into the page cache */
    for (size_t k0 = 0, k1 = 0, hinted = 0; !rc && k0 < n; k0 = k1) {
        k1 = window_end(r, n, k0);
        size_t next = k1 < n ? window_end(r, n, k1) : n;
        for (; hinted < next; hinted++)
            hint_request(c, &r[hinted]);
        rc = fmt_ckpt_read_many(c, r + k0, k1 - k0, false);
    }
    return rc;
}

int fmt_ckpt_read_rows(fmt_ckpt *c, size_t i, int64_t first, int64_t nrows, void *buf)
{
    const fmt_tensor *t = i < c->n ? &c->t[i] : NULL;
    if (!t || t->kind != FMT_SHARDED)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -EINVAL, "rows %" PRId64 "+%" PRId64 " of tensor %zu: not a sharded "
                        "tensor, or out of range", first, nrows, i);
    uint64_t rb = t->rows ? t->nbytes / (uint64_t)t->rows : 0;
    fmt_read_req r = {.i = i, .first = first, .nrows = nrows, .dst = buf,
                      .cap = nrows > 0 && nrows <= t->rows ? (size_t)nrows * rb : 0};
    return fmt_ckpt_read_many(c, &r, 1, false);
}

int fmt_ckpt_read(fmt_ckpt *c, size_t i, void *buf)
{
    const fmt_tensor *t = &c->t[i];
    fmt_read_req r = {.i = i, .first = 0, .nrows = t->rows, .dst = buf, .cap = t->nbytes};
    return fmt_ckpt_read_many(c, &r, 1, false);
}
