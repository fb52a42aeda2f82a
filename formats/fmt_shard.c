/*
 * formats/fmt_shard.c - a rank's shard file (its tensors as contiguous datasets with an
 * xxh3_64 attribute each), the shard's manifest (shard-<r>.ok) and the checkpoint's
 * commit record (commit.ok): the two self-checked text files of the format.
 *
 * Manifest text (docs/FORMAT.md), one item per line, the name last so that it may hold
 * spaces (names never hold control characters):
 *   rekindle-manifest 2
 *   step S
 *   rank R world W
 *   nonce <16 hex>
 *   io_path <word>
 *   file <bytes> <xxh3 16 hex of the shard file's bytes outside the tensors' data>
 *   count N
 *   t <order> <dtype> <ndim> <dim>... <nbytes> <offset> <xxh3 16 hex> <name>   (N lines)
 *     (version 2: after the t line of a tensor that is not replicated, one more line)
 *     s <global rows> <row0> <block rows> <nblocks> <xxh3 16 hex>...   a sharded piece
 *     p                                                                per-rank state
 *   end <xxh3 16 hex of every byte before this line>
 * (format 1: "rekindle-manifest 1" and no `file` line.) Commit record text:
 *   rekindle-commit 2
 *   step S
 *   world W
 *   nonce <16 hex>
 *   commit_time_ns T
 *   io_path <word>
 *   file <bytes> <xxh3 16 hex> index.h5
 *   file <bytes> <xxh3 16 hex> shard-<r>.ok      (r = 0..W-1, each followed by)
 *   file <bytes> <xxh3 16 hex> shard-<r>.h5      (as in the manifest's `file` line)
 *   end <xxh3 16 hex of every byte before this line>
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "fio.h"
#include "fmt.h"
#include "vfd_uring.h"

#define MANIFEST_MAGIC "rekindle-manifest"
#define COMMIT_MAGIC "rekindle-commit"
#define MANIFEST_MAX (64u << 20) /* the largest text file (manifest or record) read */

/* ---- the shard file --------------------------------------------------------------------- */

/* The shard file's final size, or a little more (vfd_uring.c invariant 10: the driver
   allocates it whole before the first tensor's bytes; HDF5 truncates it to its end of
   allocation at close): every tensor of 4 KiB or more on a 4 KiB boundary (the driver's
   alignment), smaller ones packed, the metadata (superblock, groups, each dataset's object
   header, attribute and link: under 1 KiB plus its name twice) in 1 MiB blocks. */
static uint64_t shard_size_estimate(const fmt_manifest *m)
{
    const uint64_t page = 4096, block = (uint64_t)1 << 20;
    uint64_t data = 0, meta = 4 * page;
    for (size_t i = 0; i < m->n; i++) {
        uint64_t nb = m->t[i].nbytes;
        data += nb >= page ? (nb + page - 1) / page * page : nb;
        meta += 1024 + 2 * strlen(m->t[i].name);
    }
    return data + (meta + block - 1) / block * block + block;
}

/* The one place that chooses the driver of shard files: the io_uring driver, handed the
   staging memory without a copy (it stays untouched until H5Fclose returns), the file
   allocated whole first. RK_IO=auto (io_mode, else the variable) is the way measured on
   the device of the shard's directory (fio_probe.c). A file it closed successfully is
   durable. */
static hid_t shard_fapl(const char *path, const char *io_mode, const fmt_manifest *m, fmt_vfd_stats *vst,
                        fmt_write_stats *st)
{
    fmt_vfd_opts o = {.mode = FMT_IO_AUTO, .zero_copy = true, .stats = vst, .prealloc = shard_size_estimate(m)};
    if (fmt_io_mode_parse(io_mode, &o.mode) != 0 || o.mode == FMT_IO_AUTO)
        if (fmt_io_mode_parse(getenv("RK_IO"), &o.mode) != 0)
            o.mode = FMT_IO_AUTO;
    if (o.mode == FMT_IO_AUTO) {
        char dir[4096];
        const char *slash = strrchr(path, '/');
        if (!slash)
            snprintf(dir, sizeof(dir), ".");
        else
            snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
        fmt_io_probe p;
        fmt_io_auto(dir, &p);
        o.mode = p.mode == FMT_IO_BUFFERED ? FMT_IO_BUFFERED : FMT_IO_AUTO; /* auto: the driver's loud fallbacks */
        snprintf(st->io_auto, sizeof(st->io_auto), "%s", p.mode == FMT_IO_BUFFERED ? "buffered" : "uring");
        st->auto_direct_gbs = p.direct_gbs;
        st->auto_buffered_gbs = p.buffered_gbs;
        st->auto_first = p.first;
        st->auto_measured = p.measured;
    }
    return fmt_vfd_fapl(&o);
}

static int h5_errno_code(void)
{
    int e = errno;
    return (e == ENOSPC || e == EIO || e == EDQUOT || e == EROFS || e == EACCES) ? -e : RK_E_HDF5;
}

static int attr_write(hid_t obj, const char *name, hid_t type, const void *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    if (sp < 0)
        return -1;
    hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = (a >= 0 && H5Awrite(a, type, v) >= 0) ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

static int attr_write_str(hid_t obj, const char *name, const char *s)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0)
        return -1;
    int rc = (H5Tset_size(t, strlen(s) + 1) >= 0) ? attr_write(obj, name, t, s) : -1;
    H5Tclose(t);
    return rc;
}

int fmt_h5_root_attrs(hid_t f, int64_t step, int world, const char *io_path, int64_t commit_ns)
{
    int32_t w = world, v = FMT_VERSION;
    if (attr_write(f, "step", H5T_STD_I64LE, &step) < 0 || attr_write(f, "world_size", H5T_STD_I32LE, &w) < 0 ||
        attr_write(f, "format_version", H5T_STD_I32LE, &v) < 0 || attr_write_str(f, "io_path", io_path) < 0)
        return -1;
    if (commit_ns > 0 && attr_write(f, "commit_time_ns", H5T_STD_I64LE, &commit_ns) < 0)
        return -1;
    return 0;
}

static int write_dataset(hid_t f, hid_t lcpl, hid_t dcpl, fmt_tensor *t)
{
    hsize_t dims[FMT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        dims[d] = (hsize_t)t->shape[d];
    hid_t sp = t->ndim ? H5Screate_simple(t->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t ty = fmt_h5_type(t->dtype);
    hid_t ds = -1;
    int rc = -1;
    if (sp < 0 || ty < 0)
        goto out;
    ds = H5Dcreate2(f, t->name, ty, sp, lcpl, dcpl, H5P_DEFAULT);
    if (ds < 0)
        goto out;
    if (t->nbytes > 0 && H5Dwrite(ds, ty, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0)
        goto out;
    /* The driver has handed the bytes to the kernel without a copy and returned: hashing
       them now overlaps the checksum with the writes still in flight (both only read). */
    t->xxh3 = fmt_xxh3(t->data, t->nbytes);
    haddr_t off = t->nbytes > 0 ? H5Dget_offset(ds) : 0;
    if (off == HADDR_UNDEF)
        goto out;
    t->offset = off;
    if (t->kind == FMT_SHARDED && fmt_piece_blocks(t) != 0)
        goto out;
    rc = attr_write(ds, "xxh3_64", H5T_STD_U64LE, &t->xxh3);
out:
    if (ds >= 0)
        H5Dclose(ds);
    if (ty >= 0)
        H5Tclose(ty);
    if (sp >= 0)
        H5Sclose(sp);
    return rc;
}

uint64_t fmt_block_rows(uint64_t rows, uint64_t nbytes)
{
    uint64_t rb = rows ? nbytes / rows : 0;
    return rb && rb < FMT_BLOCK_BYTES ? FMT_BLOCK_BYTES / rb : 1;
}

int fmt_piece_blocks(fmt_tensor *t)
{
    uint64_t rows = t->shape[0] > 0 ? (uint64_t)t->shape[0] : 0, rb = rows ? t->nbytes / rows : 0;
    t->block_rows = fmt_block_rows(rows, t->nbytes);
    t->nblocks = rb ? (rows + t->block_rows - 1) / t->block_rows : 0;
    free(t->blocks);
    t->blocks = NULL;
    if (t->nblocks && !(t->blocks = malloc(t->nblocks * sizeof(*t->blocks))))
        return -ENOMEM;
    for (uint64_t b = 0; b < t->nblocks; b++) {
        uint64_t r = rows - b * t->block_rows < t->block_rows ? rows - b * t->block_rows : t->block_rows;
        t->blocks[b] = fmt_xxh3((const char *)t->data + b * t->block_rows * rb, r * rb);
    }
    return 0;
}

int fmt_fsync_path(const char *path, bool dir)
{
    if (dir) {
        int rc = fmt_io_fsync_dir(path);
        return rc ? rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "fsync directory %s: %s", path, strerror(-rc)) : 0;
    }
    int fd = fmt_io_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, fd, "fsync %s: open: %s", path, strerror(-fd));
    int rc = fmt_io_fsync(fd, path);
    close(fd);
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "fsync %s: %s", path, strerror(-rc));
    return 0;
}

int fmt_shard_write(const char *path, fmt_manifest *m, const char *io_mode, fmt_write_stats *st)
{
    int rc = RK_E_HDF5;
    fmt_h5_quiet();
    memset(st, 0, sizeof(*st));
    fmt_vfd_stats vst;
    memset(&vst, 0, sizeof(vst));
    hid_t fapl = shard_fapl(path, io_mode, m, &vst, st), lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t f = -1;
    if (fapl < 0 || lcpl < 0 || dcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 || H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "shard %s: HDF5 property lists", path);
        goto out_plist;
    }
    errno = 0;
    f = H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f < 0) {
        rc = h5_errno_code();
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "shard %s: cannot create (%s)", path, strerror(errno));
        goto out_plist;
    }
    snprintf(st->io_path, sizeof(st->io_path), "%s", vst.io_path[0] ? vst.io_path : "unknown");
    if (fmt_h5_root_attrs(f, m->step, m->world, st->io_path, 0) < 0) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, h5_errno_code(), "shard %s: root attributes", path);
        goto out_file;
    }
    for (size_t i = 0; i < m->n; i++) {
        if (m->ready && (rc = m->ready(m->ready_arg, i)) != 0)
            goto out_file; /* its reason is the caller's */
        errno = 0;
        if (write_dataset(f, lcpl, dcpl, &m->t[i]) < 0) {
            rc = vst.error ? vst.error : h5_errno_code();
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "shard %s: writing tensor '%s' (%" PRIu64 " bytes) failed",
                          path, m->t[i].name, m->t[i].nbytes);
            goto out_file;
        }
        st->bytes += m->t[i].nbytes;
    }
    errno = 0;
    /* fmt_vfd_close, not H5Fclose: a failing H5Fclose leaves HDF5 1.10 a dangling id that
       crashes the process at exit (formats/vfd_uring.h). */
    int cc = fmt_vfd_close(&f);
    f = -1;
    st->prealloc = vst.prealloc;
    st->extends = vst.extends;
    if (cc < 0 || vst.error) {
        rc = vst.error ? vst.error : cc;
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "shard %s: close (flush) failed: %s", path, rk_strerror(rc));
        goto out_plist;
    }
    /* the driver made it durable; the bytes outside the tensors' data get their checksum */
    rc = fmt_file_sum_of(path, m, &m->file);
out_file:
    if (f >= 0)
        fmt_vfd_close(&f);
out_plist:
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    if (fapl >= 0)
        H5Pclose(fapl);
    return rc;
}

/* ---- the manifest ------------------------------------------------------------------------ */

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) RK_PRINTF(2, 3);
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = b->oom ? 0 : vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (b->oom || n < 0)
            return;
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = 2 * b->cap + (size_t)n + 256;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static int write_file_durable(const char *path, const char *data, size_t len)
{
    char part[4096];
    snprintf(part, sizeof(part), "%s.part", path);
    int fd = fmt_io_open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, fd, "create %s: %s", part, strerror(-fd));
    int rc = fmt_io_pwrite_all(fd, data, len, 0, part);
    if (!rc)
        rc = fmt_io_fsync(fd, part);
    close(fd);
    if (!rc)
        rc = fmt_io_rename(part, path);
    if (rc) {
        unlink(part);
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "write %s: %s", path, strerror(-rc));
    }
    return 0;
}

int fmt_manifest_write(const char *path, const fmt_manifest *m)
{
    struct sbuf b = {0};
    sb_printf(&b,
              MANIFEST_MAGIC " %d\nstep %" PRId64 "\nrank %d world %d\nnonce %016" PRIx64 "\nio_path %s\nfile %" PRIu64
                             " %016" PRIx64 "\ncount %zu\n",
              FMT_VERSION, m->step, m->rank, m->world, m->nonce, m->io_path[0] ? m->io_path : "none", m->file.size,
              m->file.xxh3, m->n);
    for (size_t i = 0; i < m->n; i++) {
        const fmt_tensor *t = &m->t[i];
        sb_printf(&b, "t %" PRIu32 " %s %d", t->order, rk__dtype_name(t->dtype), t->ndim);
        for (int d = 0; d < t->ndim; d++)
            sb_printf(&b, " %" PRId64, t->shape[d]);
        sb_printf(&b, " %" PRIu64 " %" PRIu64 " %016" PRIx64 " %s\n", t->nbytes, t->offset, t->xxh3, t->name);
        if (t->kind == FMT_PER_RANK)
            sb_printf(&b, "p\n");
        if (t->kind != FMT_SHARDED)
            continue;
        sb_printf(&b, "s %" PRId64 " %" PRId64 " %" PRIu64 " %" PRIu64, t->rows, t->row0, t->block_rows, t->nblocks);
        for (uint64_t k = 0; k < t->nblocks; k++)
            sb_printf(&b, " %016" PRIx64, t->blocks[k]);
        sb_printf(&b, "\n");
    }
    if (!b.oom) {
        uint64_t h = fmt_xxh3(b.p, b.len);
        sb_printf(&b, "end %016" PRIx64 "\n", h);
    }
    int rc = b.oom ? -ENOMEM : write_file_durable(path, b.p, b.len);
    free(b.p);
    return rc;
}

void fmt_manifest_free(fmt_manifest **pm)
{
    if (!pm || !*pm)
        return;
    fmt_manifest *m = *pm;
    for (size_t i = 0; i < m->n; i++) {
        free(m->t[i].name);
        free(m->t[i].blocks);
    }
    free(m->t);
    free(m);
    *pm = NULL;
}

/* A strict cursor over one line: tokens separated by single spaces. */
struct cur {
    char *p;
};

static char *tok(struct cur *c)
{
    if (!c->p || !*c->p)
        return NULL;
    char *s = c->p, *sp = strchr(s, ' ');
    if (sp) {
        *sp = '\0';
        c->p = sp + 1;
    } else {
        c->p = NULL;
    }
    return s;
}

static bool num(struct cur *c, int base, int64_t lo, int64_t hi, int64_t *out)
{
    char *s = tok(c), *end;
    if (!s || !*s || (*s == '-' && lo >= 0) || *s == '+' || *s == ' ')
        return false;
    errno = 0;
    long long v = base == 16 ? (long long)strtoull(s, &end, 16) : strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool hex64(struct cur *c, uint64_t *out)
{
    char *s = tok(c), *end;
    if (!s || strlen(s) != 16)
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 16);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static bool word(struct cur *c, const char *want)
{
    char *s = tok(c);
    return s && strcmp(s, want) == 0;
}

static int parse_dtype(const char *s, rk_dtype *out)
{
    for (int d = RK_F32; d <= RK_U8; d++)
        if (s && strcmp(rk__dtype_name((rk_dtype)d), s) == 0) {
            *out = (rk_dtype)d;
            return 0;
        }
    return -1;
}

static bool parse_tensor(char *line, fmt_tensor *t)
{
    struct cur c = {line};
    int64_t v;
    if (!word(&c, "t") || !num(&c, 10, 0, UINT32_MAX, &v))
        return false;
    t->order = (uint32_t)v;
    if (parse_dtype(tok(&c), &t->dtype) < 0 || !num(&c, 10, 0, FMT_MAX_DIMS, &v))
        return false;
    t->ndim = (int)v;
    uint64_t nbytes = rk__dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (!num(&c, 10, 0, INT64_MAX, &t->shape[d]))
            return false;
        if (t->shape[d] && nbytes > UINT64_MAX / (uint64_t)t->shape[d])
            return false;
        nbytes *= (uint64_t)t->shape[d];
    }
    if (!num(&c, 10, 0, INT64_MAX, &v) || (uint64_t)v != nbytes || !num(&c, 10, 0, INT64_MAX, &v) ||
        !hex64(&c, &t->xxh3))
        return false;
    t->offset = (uint64_t)v;
    t->nbytes = nbytes;
    if (!c.p || !*c.p || strlen(c.p) > FMT_MAX_NAME)
        return false;
    for (const char *q = c.p; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f)
            return false;
    return (t->name = strdup(c.p)) != NULL;
}

/* The line after a t line in a version-2 manifest, if it is one: a sharded piece's
   "s ..." or a per-rank tensor's "p". Returns 1 if line was such a line (parsed into t),
   0 if it is not one (t stays replicated), -1 if it is malformed (a block size other than
   the writer's, fmt_block_rows, included). */
static int parse_kind(char *line, fmt_tensor *t)
{
    struct cur c = {line};
    int64_t v;
    if (!line || (strcmp(line, "p") != 0 && strncmp(line, "s ", 2) != 0))
        return 0;
    if (line[0] == 'p') {
        t->kind = FMT_PER_RANK;
        return 1;
    }
    t->kind = FMT_SHARDED;
    uint64_t rows = t->ndim >= 1 ? (uint64_t)t->shape[0] : 0, rb = rows ? t->nbytes / rows : 0;
    if (t->ndim < 1 || !word(&c, "s") || !num(&c, 10, 0, INT64_MAX, &t->rows) || !num(&c, 10, 0, INT64_MAX, &t->row0) ||
        t->row0 > t->rows || t->shape[0] > t->rows - t->row0 || !num(&c, 10, 1, INT64_MAX, &v))
        return -1;
    t->block_rows = (uint64_t)v; /* the writer's, or the reader's block buffer would be sized by the file */
    if (t->block_rows != fmt_block_rows(rows, t->nbytes) || !num(&c, 10, 0, INT64_MAX, &v) ||
        (uint64_t)v != (rb ? (rows + t->block_rows - 1) / t->block_rows : 0))
        return -1;
    t->nblocks = (uint64_t)v;
    if (t->nblocks && !(t->blocks = malloc(t->nblocks * sizeof(*t->blocks))))
        return -1;
    for (uint64_t k = 0; k < t->nblocks; k++)
        if (!hex64(&c, &t->blocks[k]))
            return -1;
    return c.p ? -1 : 1;
}

static int read_small_file(const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > MANIFEST_MAX) {
        close(fd);
        return RK_E_FORMAT;
    }
    char *p = malloc((size_t)sb.st_size + 1);
    if (!p) {
        close(fd);
        return -ENOMEM;
    }
    size_t off = 0;
    while (off < (size_t)sb.st_size) {
        ssize_t r = pread(fd, p + off, (size_t)sb.st_size - off, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        off += (size_t)r;
    }
    close(fd);
    p[off] = '\0';
    *out = p;
    *len = off;
    return 0;
}

/* A self-checked text file: lines, the last "end <XXH3-64 of every byte before it>". On
   success the text ends (a NUL) before that line and *first is its first line. */
static bool text_checked(char *text, size_t len)
{
    if (len < 22 || text[len - 1] != '\n' || memchr(text, '\0', len))
        return false;
    text[len - 1] = '\0';
    char *endl = strrchr(text, '\n');
    if (!endl)
        return false;
    struct cur c = {endl + 1};
    uint64_t h;
    if (!word(&c, "end") || !hex64(&c, &h) || c.p || fmt_xxh3(text, (size_t)(endl + 1 - text)) != h)
        return false;
    *endl = '\0';
    return true;
}

/* Reads a text file for fmt_*_parse; the error (logged) if it cannot. */
static int read_text(const char *path, const char *what, char **text, size_t *len)
{
    int rc = read_small_file(path, text, len);
    if (rc == -ENOENT)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_INCOMPLETE, "%s %s is missing", what, path);
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc == RK_E_FORMAT ? RK_E_FORMAT : rc, "%s %s: unreadable", what,
                        path);
    return 0;
}

/* `file <bytes> <xxh3>` (and the rest of the line left in c). */
static bool file_sum(struct cur *c, fmt_file_sum *s)
{
    int64_t v;
    if (!word(c, "file") || !num(c, 10, 0, INT64_MAX, &v) || !hex64(c, &s->xxh3))
        return false;
    s->size = (uint64_t)v;
    return true;
}

int fmt_manifest_read(const char *path, fmt_manifest **out)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = read_text(path, "manifest", &text, &len);
    if (!rc)
        rc = fmt_manifest_parse(path, text, len, out);
    free(text);
    return rc;
}

int fmt_manifest_parse(const char *path, char *text, size_t len, fmt_manifest **out)
{
    *out = NULL;
    int rc = RK_E_CORRUPT;
    fmt_manifest *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    if (!text_checked(text, len))
        goto out_bad;
    struct cur c;
    char *save = NULL, *line;
    int64_t v, w, n;
    line = strtok_r(text, "\n", &save);
    c.p = line;
    if (!line || !word(&c, MANIFEST_MAGIC) || !num(&c, 10, 0, 1000, &v) || c.p ||
        (v != FMT_VERSION && v != FMT_VERSION_LEGACY)) {
        rc = RK_E_FORMAT;
        goto out_bad;
    }
    m->version = (int)v;
    int version = m->version;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "step") || !num(&c, 10, 0, INT64_MAX, &m->step))
        goto out_bad;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "rank") || !num(&c, 10, 0, 1 << 24, &v) || !word(&c, "world") || !num(&c, 10, 1, 1 << 24, &w) ||
        v >= w)
        goto out_bad;
    m->rank = (int)v;
    m->world = (int)w;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "nonce") || !hex64(&c, &m->nonce))
        goto out_bad;
    c.p = strtok_r(NULL, "\n", &save);
    char *io;
    if (!word(&c, "io_path") || !(io = tok(&c)) || strlen(io) >= sizeof(m->io_path))
        goto out_bad;
    strcpy(m->io_path, io);
    if (m->version != FMT_VERSION_LEGACY) {
        c.p = strtok_r(NULL, "\n", &save);
        if (!file_sum(&c, &m->file) || c.p)
            goto out_bad;
    }
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "count") || !num(&c, 10, 0, (int64_t)(len / 8), &n))
        goto out_bad;
    m->t = calloc((size_t)n + 1, sizeof(*m->t));
    if (!m->t) {
        rc = -ENOMEM;
        goto out_bad;
    }
    line = strtok_r(NULL, "\n", &save);
    for (int64_t i = 0; i < n; i++) {
        if (!line || !parse_tensor(line, &m->t[i])) {
            if (m->t[i].name)
                m->n++;
            goto out_bad;
        }
        m->t[i].rank = m->rank;
        m->n++;
        line = strtok_r(NULL, "\n", &save);
        int k = version >= 2 ? parse_kind(line, &m->t[i]) : 0;
        if (k < 0)
            goto out_bad;
        if (k > 0)
            line = strtok_r(NULL, "\n", &save);
    }
    if (line != NULL)
        goto out_bad;
    *out = m;
    return 0;
out_bad:
    fmt_manifest_free(&m);
    if (rc == RK_E_CORRUPT || rc == RK_E_FORMAT)
        rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "manifest %s: %s", path,
                 rc == RK_E_FORMAT ? "not a Rekindle manifest of a known version" : "malformed or checksum mismatch");
    return rc;
}

/* ---- whole-file checksums ------------------------------------------------------------------ */

struct range {
    uint64_t off, len;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* Hashes [from, to) of fd into st through buf. */
static int sum_span(int fd, const char *path, XXH3_state_t *st, char *buf, size_t cap, uint64_t from, uint64_t to)
{
    while (from < to) {
        size_t want = to - from < cap ? (size_t)(to - from) : cap;
        int r = fmt_io_pread_all(fd, buf, want, (off_t)from, path);
        if (r)
            return r;
        XXH3_64bits_update(st, buf, want);
        from += want;
    }
    return 0;
}

int fmt_file_sum_of(const char *path, const fmt_manifest *m, fmt_file_sum *out)
{
    enum { CAP = 1 << 20 };
    struct range *rg = NULL;
    size_t nr = 0;
    char *buf = NULL;
    XXH3_state_t *st = NULL;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, errno == ENOENT ? RK_E_INCOMPLETE : -errno, "%s: %s", path,
                        errno == ENOENT ? "missing" : strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT, "%s: not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (m && m->n && !(rg = malloc(m->n * sizeof(*rg)))) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; m && i < m->n; i++)
        if (m->t[i].nbytes > 0)
            rg[nr++] = (struct range){m->t[i].offset, m->t[i].nbytes};
    if (nr)
        qsort(rg, nr, sizeof(*rg), cmp_range);
    if (!(buf = malloc(CAP)) || !(st = XXH3_createState())) {
        rc = -ENOMEM;
        goto out;
    }
    XXH3_64bits_reset(st);
    uint64_t at = 0;
    for (size_t i = 0; i <= nr && !rc; i++) {
        uint64_t next = i < nr ? rg[i].off : size;
        if (next < at || next > size || (i < nr && rg[i].len > size - next)) {
            rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, RK_E_CORRUPT,
                          "%s: the tensors' data overlap or lie past the end of the file (%" PRIu64 " bytes)", path,
                          size);
            break;
        }
        if ((rc = sum_span(fd, path, st, buf, CAP, at, next)) != 0)
            rc = rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "%s: cannot read: %s", path, strerror(-rc));
        if (i < nr)
            at = next + rg[i].len;
    }
    out->size = size;
    out->xxh3 = XXH3_64bits_digest(st);
out:
    XXH3_freeState(st);
    free(buf);
    free(rg);
    close(fd);
    return rc;
}

/* ---- the commit record ----------------------------------------------------------------------- */

void fmt_commit_free(fmt_commit **pc)
{
    if (!pc || !*pc)
        return;
    free((*pc)->ok);
    free((*pc)->h5);
    free(*pc);
    *pc = NULL;
}

int fmt_commit_write(const char *dir, int64_t step, int world, fmt_manifest *const *shards, const char *io_path,
                     int64_t commit_ns)
{
    char path[4096];
    fmt_file_sum s;
    struct sbuf b = {0};
    snprintf(path, sizeof(path), "%s/" FMT_INDEX, dir);
    int rc = fmt_file_sum_of(path, NULL, &s);
    if (rc)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "commit record: %s", rk_last_error());
    sb_printf(&b,
              COMMIT_MAGIC " %d\nstep %" PRId64 "\nworld %d\nnonce %016" PRIx64 "\ncommit_time_ns %" PRId64
                           "\nio_path %s\nfile %" PRIu64 " %016" PRIx64 " " FMT_INDEX "\n",
              FMT_VERSION, step, world, shards[0]->nonce, commit_ns, io_path && *io_path ? io_path : "none", s.size,
              s.xxh3);
    for (int r = 0; r < world && !rc; r++) {
        snprintf(path, sizeof(path), "%s/shard-%d.ok", dir, r);
        if ((rc = fmt_file_sum_of(path, NULL, &s)) != 0)
            rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "commit record: %s", rk_last_error());
        sb_printf(&b, "file %" PRIu64 " %016" PRIx64 " shard-%d.ok\nfile %" PRIu64 " %016" PRIx64 " shard-%d.h5\n", s.size,
                  s.xxh3, r, shards[r]->file.size, shards[r]->file.xxh3, r);
    }
    if (!b.oom) {
        uint64_t h = fmt_xxh3(b.p, b.len);
        sb_printf(&b, "end %016" PRIx64 "\n", h);
    }
    if (!rc) {
        snprintf(path, sizeof(path), "%s/" FMT_COMMIT, dir);
        rc = b.oom ? -ENOMEM : write_file_durable(path, b.p, b.len);
    }
    free(b.p);
    return rc;
}

int fmt_commit_read(const char *path, fmt_commit **out)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = read_text(path, "commit record", &text, &len);
    if (!rc)
        rc = fmt_commit_parse(path, text, len, out);
    free(text);
    return rc;
}

/* `file <bytes> <xxh3> <name>` with name exactly `want`. */
static bool file_line(char *line, const char *want, fmt_file_sum *s)
{
    struct cur c = {line};
    char *name;
    return file_sum(&c, s) && (name = tok(&c)) && !c.p && strcmp(name, want) == 0;
}

int fmt_commit_parse(const char *path, char *text, size_t len, fmt_commit **out)
{
    *out = NULL;
    int rc = RK_E_CORRUPT;
    fmt_commit *k = calloc(1, sizeof(*k));
    if (!k)
        return -ENOMEM;
    if (!text_checked(text, len))
        goto out_bad;
    struct cur c;
    char *save = NULL, *line, *io, name[32];
    int64_t v;
    c.p = strtok_r(text, "\n", &save);
    if (!word(&c, COMMIT_MAGIC) || !num(&c, 10, 0, 1000, &v) || c.p || v != FMT_VERSION) {
        rc = RK_E_FORMAT;
        goto out_bad;
    }
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "step") || !num(&c, 10, 0, INT64_MAX, &k->step) || c.p)
        goto out_bad;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "world") || !num(&c, 10, 1, 1 << 24, &v) || c.p || (uint64_t)v > len / 32)
        goto out_bad; /* two lines of at least 16 bytes per shard */
    k->world = (int)v;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "nonce") || !hex64(&c, &k->nonce) || c.p)
        goto out_bad;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "commit_time_ns") || !num(&c, 10, 0, INT64_MAX, &k->commit_ns) || c.p)
        goto out_bad;
    c.p = strtok_r(NULL, "\n", &save);
    if (!word(&c, "io_path") || !(io = tok(&c)) || c.p || strlen(io) >= sizeof(k->io_path))
        goto out_bad;
    strcpy(k->io_path, io);
    if (!file_line(strtok_r(NULL, "\n", &save), FMT_INDEX, &k->index))
        goto out_bad;
    if (!(k->ok = calloc((size_t)k->world, sizeof(*k->ok))) || !(k->h5 = calloc((size_t)k->world, sizeof(*k->h5)))) {
        rc = -ENOMEM;
        goto out_bad;
    }
    for (int r = 0; r < k->world; r++) {
        snprintf(name, sizeof(name), "shard-%d.ok", r);
        if (!file_line(strtok_r(NULL, "\n", &save), name, &k->ok[r]))
            goto out_bad;
        snprintf(name, sizeof(name), "shard-%d.h5", r);
        if (!file_line(strtok_r(NULL, "\n", &save), name, &k->h5[r]))
            goto out_bad;
    }
    if ((line = strtok_r(NULL, "\n", &save)) != NULL)
        goto out_bad;
    *out = k;
    return 0;
out_bad:
    fmt_commit_free(&k);
    if (rc == RK_E_CORRUPT || rc == RK_E_FORMAT)
        rk__fail(RK_SUB_FMT, RK_LOG_DEBUG, rc, "commit record %s: %s", path,
                 rc == RK_E_FORMAT ? "not a Rekindle commit record of this version" : "malformed or checksum mismatch");
    return rc;
}
