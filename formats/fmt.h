/*
 * formats/fmt.h - the on-disk checkpoint format (docs/FORMAT.md): shard files, their
 * manifests, index.h5, the commit of a checkpoint directory, and reading it back.
 * The one header of formats/ that other folders include; names start with fmt_.
 *
 * A committed checkpoint is <ckpt_dir>/step-<12 digits>/ holding
 *   shard-<r>.h5   the tensors rank r wrote, each a contiguous dataset at its registered
 *                  name with an attribute xxh3_64 (XXH3-64 of its bytes)
 *   shard-<r>.ok   the shard's manifest: one line per tensor, written and fsync'd after the
 *                  shard itself, closed by a checksum of the manifest's own text
 *   index.h5       an external link per replicated tensor (relative file name), a
 *                  virtual dataset of the global shape per sharded tensor (over the
 *                  ranks' pieces, relative file names), an external link per per-rank
 *                  tensor at ranks/<r>/<name>, and the root attributes step, world_size,
 *                  format_version, io_path, commit_time_ns
 *   commit.ok      the commit record, written last: the size and XXH3-64 of every other
 *                  file (index.h5 and the manifests whole, each shard-<r>.h5 outside its
 *                  tensors' data), closed by a checksum of its own text (format 2)
 * Tensor kinds (docs/SHARDING.md): a replicated tensor is in one shard (fmt_assign); a
 * sharded tensor has one piece (its rows [row0, row0 + shape[0]) of the global rows) in
 * every shard, with an XXH3-64 per block of block_rows rows so that a reader of some rows
 * checks what it reads; a per-rank tensor of rank r is in shard r.
 * Every file read here is untrusted: sizes and names are checked, failures are
 * RK_E_FORMAT / RK_E_CORRUPT / RK_E_INCOMPLETE, never a crash or a hang. No byte reaches
 * libhdf5 before its checksum in the commit record matched (a format-1 checkpoint, which
 * has no record, is read as it always was).
 */
#ifndef RK_FMT_H
#define RK_FMT_H

#include <hdf5.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/common.h"

#define FMT_VERSION 2        /* written; format 1 (replicated tensors only, no commit record) is still read */
#define FMT_VERSION_LEGACY 1
#define FMT_MAX_DIMS 8
#define FMT_MAX_NAME 255
#define FMT_IO_PATH_LEN 48
#define FMT_INDEX "index.h5"
#define FMT_COMMIT "commit.ok"

enum fmt_kind { FMT_REPLICATED = 0, FMT_SHARDED = 1, FMT_PER_RANK = 2 };
#define FMT_BLOCK_BYTES (1u << 20) /* a sharded piece's checksummed block: at most this, or one row */

/* One tensor of a checkpoint. For writing, data points at its bytes (stable until the
   write returns); after reading a manifest, data is NULL and name is owned by it.
   In a manifest an entry is what one shard holds: a sharded tensor's piece has the
   local shape. In fmt_ckpt.t an entry is what a reader sees (a sharded tensor with the
   global shape, a per-rank one named ranks/<r>/<name>). */
typedef struct fmt_tensor {
    char *name;
    rk_dtype dtype;
    int ndim;
    int64_t shape[FMT_MAX_DIMS];
    uint64_t nbytes;
    uint64_t xxh3;    /* XXH3-64 of the bytes (fmt_ckpt's sharded entry: 0, see blocks) */
    uint64_t offset;  /* where the bytes start in the shard file (contiguous dataset) */
    uint32_t order;   /* position in registration order (the index lists tensors by it) */
    int rank;         /* the shard holding it (fmt_ckpt's sharded entry: -1) */
    const void *data;
    /* --- kinds other than replicated (format version 2) --- */
    int kind;              /* enum fmt_kind */
    int64_t rows;          /* FMT_SHARDED: rows of the global tensor */
    int64_t row0;          /* FMT_SHARDED piece: its first row in the global tensor */
    uint64_t block_rows;   /* FMT_SHARDED piece: rows per checksummed block (>= 1) */
    uint64_t nblocks;      /* FMT_SHARDED piece: ceil(shape[0] / block_rows) */
    uint64_t *blocks;      /* FMT_SHARDED piece: XXH3-64 of each block (owned: malloc'd by
                              fmt_shard_write or the manifest reader, freed with the
                              manifest; fmt_ckpt_close / the writer's owner free it) */
    const char *stored;    /* fmt_ckpt's entries: the dataset's name in its shard file */
    size_t piece0, npieces; /* fmt_ckpt's sharded entry: its pieces, c->pieces[piece0..] */
} fmt_tensor;

/* The size of a file and the XXH3-64 of its bytes (of a shard file: of every byte
   outside its tensors' data, which their own checksums cover). */
typedef struct fmt_file_sum {
    uint64_t size;
    uint64_t xxh3;
} fmt_file_sum;

/* What a shard's manifest (shard-<r>.ok) says. */
typedef struct fmt_manifest {
    int version;      /* FMT_VERSION, or FMT_VERSION_LEGACY (no `file` line) */
    int64_t step;
    int rank, world;
    uint64_t nonce;   /* the writing job's attempt id: a stale manifest does not match */
    char io_path[FMT_IO_PATH_LEN];
    fmt_file_sum file; /* shard-<r>.h5 (format 2; fmt_shard_write fills it in) */
    size_t n;
    fmt_tensor *t;    /* owned, names owned */
    /* fmt_shard_write calls ready(ready_arg, i) before it reads t[i].data (NULL: never):
       0 once the bytes are there, else the failure that fails the shard. */
    int (*ready)(void *arg, size_t i);
    void *ready_arg;
} fmt_manifest;

/* What the commit record (commit.ok) says: the checkpoint's identity and a checksum of
   every file in it. */
typedef struct fmt_commit {
    int64_t step;
    int64_t commit_ns;
    int world;
    uint64_t nonce;
    char io_path[FMT_IO_PATH_LEN];
    fmt_file_sum index;  /* index.h5, whole */
    fmt_file_sum *ok;    /* world of them: shard-<r>.ok, whole */
    fmt_file_sum *h5;    /* world of them: shard-<r>.h5, outside its tensors' data */
} fmt_commit;

/* ---- names (fmt_layout.c) ----------------------------------------------------------- */
/* "step-000000001200" into buf (>= 32 bytes). */
void fmt_step_name(char *buf, size_t cap, int64_t step);
/* The temporary directory of one attempt at a step, ".tmp-step-000000001200-<nonce as 16
   hex digits>" (buf >= 48 bytes): every attempt (membership) writes in its own, so a
   fenced or stale writer can never touch the files of the attempt that commits. */
void fmt_tmp_name(char *buf, size_t cap, int64_t step, uint64_t nonce);
/* Whether name is exactly a committed step directory's name; *step gets the label. */
bool fmt_parse_step_name(const char *name, int64_t *step);
/* Whether name is a temporary (work in progress) directory of a checkpoint: any name that
   starts with ".tmp-step-". */
bool fmt_is_tmp_name(const char *name);
/* Whether name is exactly an attempt's temporary directory name (fmt_tmp_name); its step
   and nonce go to *step and *nonce (either may be NULL). */
bool fmt_parse_tmp_name(const char *name, int64_t *step, uint64_t *nonce);
/* Committed steps under dir, ascending by label (malloc'd; *n may be 0). -errno if dir
   cannot be listed (never "none"): the order a job resumes in is ckpt_list's. */
int fmt_list_steps(const char *dir, int64_t **steps, size_t *n);
/* Calls fn(arg, name) for every entry of dir but "." and "..", through the fault-
   injectable "list" operation (fio.h); a non-zero return of fn stops and is returned.
   -errno (logged, in rk_last_error) if dir cannot be opened or read to its end. */
int fmt_list_dir(const char *dir, int (*fn)(void *arg, const char *name), void *arg);
/* Balanced assignment of tensors to ranks: each tensor to exactly one rank, greedy by
   size, largest first, ties by order; deterministic, so every rank computes the same.
   sizes[i] bytes of tensor i; out_rank[i] gets its rank. 0 or -ENOMEM. */
int fmt_assign(const uint64_t *sizes, size_t n, int world, int *out_rank);

/* ---- HDF5 types (fmt_types.c) -------------------------------------------------------- */
/* The file type of a dtype (bf16, f16: 16-bit float types with their layouts); the caller
   closes it with H5Tclose. Negative if dtype is unknown. */
hid_t fmt_h5_type(rk_dtype dtype);
/* The dtype whose file type equals type; RK_E_FORMAT if none. */
int fmt_dtype_of(hid_t type, rk_dtype *out);
/* Turns off HDF5's automatic error printing for the calling thread (idempotent). */
void fmt_h5_quiet(void);

/* ---- shards and manifests (fmt_shard.c) ---------------------------------------------- */
typedef struct fmt_write_stats {
    char io_path[FMT_IO_PATH_LEN]; /* the I/O path really used */
    uint64_t bytes;
    uint64_t prealloc;             /* bytes of the file allocated before its data (fallocate) */
    uint64_t extends;              /* raw-data writes that had to size the file first (0 when
                                      the preallocation covered it) */
    /* RK_IO=auto (formats/fio_probe.c): the choice and the figures it rests on; io_auto is
       "" when RK_IO forced the way. auto_first: the first choice for the directory's device
       in this process (auto_measured: measured during this write). */
    char io_auto[16];              /* "uring" or "buffered" */
    double auto_direct_gbs, auto_buffered_gbs;
    bool auto_first, auto_measured;
} fmt_write_stats;

/* Writes shard file `path` holding m->t[0..n), fills in each m->t[i].xxh3 (computed while
   the tensor's bytes are being written) and m->t[i].offset, closes the file and makes it
   durable (fsync), then fills in m->file (fmt_file_sum_of). io_mode is the RK_IO string
   ("auto" ...). */
int fmt_shard_write(const char *path, fmt_manifest *m, const char *io_mode,
                    fmt_write_stats *st);
/* The block checksums of a sharded piece t (t->data, t->shape[0] rows of t->nbytes):
   block_rows (fmt_block_rows), nblocks, blocks (malloc'd, the previous array freed).
   0 or -ENOMEM. */
int fmt_piece_blocks(fmt_tensor *t);
/* Rows per checksummed block of a sharded piece of `rows` rows and `nbytes` bytes: as many
   whole rows as fit in FMT_BLOCK_BYTES, at least one (1 for a piece of no bytes). What the
   writer uses and the only block size a manifest may give (a reader buffers one block: a
   size from an untrusted file would size that buffer). */
uint64_t fmt_block_rows(uint64_t rows, uint64_t nbytes);
/* Root attributes step, world_size, format_version, io_path, and commit_time_ns if
   commit_ns > 0, on an open file (or -1). */
int fmt_h5_root_attrs(hid_t f, int64_t step, int world, const char *io_path, int64_t commit_ns);
/* Writes and fsyncs the manifest file (a new file; never visible half-written under its
   name: written as path + ".part", fsync'd, renamed). */
int fmt_manifest_write(const char *path, const fmt_manifest *m);
/* Reads and checks a manifest; *m is malloc'd, freed with fmt_manifest_free. */
int fmt_manifest_read(const char *path, fmt_manifest **m);
/* The same over text[0..len) (text[len] must be writable; text is modified), read from
   `path` (named in errors). */
int fmt_manifest_parse(const char *path, char *text, size_t len, fmt_manifest **m);
void fmt_manifest_free(fmt_manifest **m);
/* Size and XXH3-64 of file `path`: of every byte if m is NULL, else of every byte outside
   the data of m's tensors (RK_E_CORRUPT if those overlap or pass the end of the file).
   Read with a bounded buffer; -errno (RK_E_INCOMPLETE if missing) when unreadable. */
int fmt_file_sum_of(const char *path, const fmt_manifest *m, fmt_file_sum *out);

/* ---- the commit record (fmt_shard.c) ------------------------------------------------- */
/* Writes <dir>/commit.ok (durably, never visible half-written) recording index.h5 and
   every shard's manifest (read back and summed here) and shard file (m->file of each of
   world manifests). The last file of a checkpoint written before its commit. */
int fmt_commit_write(const char *dir, int64_t step, int world, fmt_manifest *const *shards,
                     const char *io_path, int64_t commit_ns);
/* Reads and checks (self-checksum, syntax) a commit record; RK_E_INCOMPLETE if missing. */
int fmt_commit_read(const char *path, fmt_commit **out);
/* The same over text[0..len) (text[len] writable; text is modified). */
int fmt_commit_parse(const char *path, char *text, size_t len, fmt_commit **out);
void fmt_commit_free(fmt_commit **c);

/* ---- index and commit (fmt_index.c; fmt_index_info: fmt_read.c) ---------------------- */
/* Writes <dir>/index.h5: an external link per replicated tensor of every manifest, to
   "shard-<r>.h5", at its name; a virtual dataset of the global shape per sharded tensor
   over its pieces (source files "shard-<r>.h5", relative: the directory can move); an
   external link per per-rank tensor at ranks/<r>/<name>; root attributes (commit_time_ns:
   commit_ns, CLOCK_REALTIME of the commit, which orders checkpoints into timelines:
   ckpt_list); fsync; then the commit record <dir>/commit.ok (fmt_commit_write). */
int fmt_index_write(const char *dir, int64_t step, int world, fmt_manifest *const *shards,
                    const char *io_path, int64_t commit_ns);
/* The label and commit time of committed checkpoint `stepdir`, from its commit record
   (format 1: the label from shard-0.ok, *commit_ns = 0). No HDF5 call. RK_E_FORMAT /
   RK_E_CORRUPT / RK_E_INCOMPLETE if unreadable. */
int fmt_index_info(const char *stepdir, int64_t *step, int64_t *commit_ns);
/* Durable rename of tmp (a directory under parent) to final: fsync tmp, rename, fsync
   parent. If final exists (the same label committed in an abandoned timeline), tmp is
   swapped in by one atomic exchange (fmt_io_exchange), so a directory named final exists
   at every instant, the parent is fsync'd, and the old directory, now named tmp, is
   removed. A file system without the exchange (-EINVAL) gets rename-aside, logged. */
int fmt_commit_dir(const char *parent, const char *tmp, const char *final);
/* Removes a directory tree (files and sub-directories, symbolic links not followed);
   0 if it does not exist. The one tree remover of the project. */
int fmt_remove_tree(const char *path);
/* fsync a file or directory by path. */
int fmt_fsync_path(const char *path, bool dir);
/* rename(2) and mkdir(2) (mode 0755) through the fault-injectable operations of fio.h
   ("rename", "mkdir"): 0 or -errno; mkdir of an existing name is -EEXIST. */
int fmt_io_rename(const char *from, const char *to);
int fmt_io_mkdir(const char *path);

/* ---- reading a checkpoint (fmt_read.c) ----------------------------------------------- */
typedef struct fmt_ckpt {
    int64_t step;
    int64_t commit_ns; /* index.h5's commit_time_ns, 0 if absent */
    int world;
    int version;
    char io_path[FMT_IO_PATH_LEN];
    char *dir;        /* the step directory */
    size_t n;
    fmt_tensor *t;    /* every tensor as a reader sees it, in registration order (the
                         per-rank entries of one tensor by rank); names of per-rank
                         entries owned, others the manifests' */
    size_t *by_name;  /* indexes of t sorted by name (fmt_ckpt_find) */
    const fmt_tensor **pieces; /* the sharded tensors' pieces, in the manifests */
    size_t npieces;   /* used of pieces */
    fmt_manifest **shards; /* world of them */
    int *fds;         /* shard file descriptors, opened on first use (-1) */
    struct fmt_direct *direct; /* the reader's ring and buffers (fmt_readdirect.c) */
} fmt_ckpt;

/* Opens committed checkpoint `stepdir`: its commit record, then every file's checksum
   against it (index.h5 and the manifests whole, the shard files outside their tensors'
   data), then the manifests and index.h5's root attributes and links, checked for
   consistency (RK_E_FORMAT, RK_E_INCOMPLETE, RK_E_CORRUPT naming the file). libhdf5 sees
   index.h5 only once its checksum matched. The one opener of checkpoints: rk_resume,
   recovery from disk, rk_reader_open and every CLI command come through here. */
int fmt_ckpt_open(const char *stepdir, fmt_ckpt **out);
void fmt_ckpt_close(fmt_ckpt **c);
/* Reads tensor i into buf (t[i].nbytes) from its shard at the manifest's offset (no HDF5
   metadata is parsed: a damaged file cannot crash the reader) and checks its checksum
   (RK_E_CORRUPT naming the tensor and file). */
int fmt_ckpt_read(fmt_ckpt *c, size_t i, void *buf);
/* Reads rows [first, first + nrows) of sharded tensor i (global rows) into buf: only the
   blocks of the pieces that hold them, each checked against its checksum (RK_E_CORRUPT
   naming the tensor, file and block). -EINVAL if i is not sharded or the rows are out of
   range. */
int fmt_ckpt_read_rows(fmt_ckpt *c, size_t i, int64_t first, int64_t nrows, void *buf);
/* One read of fmt_ckpt_read_many: tensor i into dst, which has cap bytes (at least the
   bytes read); of a sharded tensor, global rows [first, first + nrows) (of any other kind,
   the whole tensor: first and nrows are not looked at). dst NULL: checked, not kept: read
   through the page cache (which holds the bytes after, for a read that places them, memory
   allowing) into a buffer of the reader's own, every byte checked as ever (cap still says
   the bytes: the shared reads' windows are measured by it). */
typedef struct fmt_read_req {
    size_t i;
    int64_t first, nrows;
    void *dst;
    size_t cap;
} fmt_read_req;
/* Reads every request with many reads in flight across them (formats/fmt_readdirect.c:
   O_DIRECT through io_uring where the pages are not in the page cache, pread where they
   are), every byte checked against its checksum as it arrives (RK_E_CORRUPT naming the
   tensor, file and, for a sharded tensor, the rows of the block). drop: each dst is
   private anonymous memory (mmap'd staging, malloc'd) that the reader may read into
   straight, and whose pages it may replace with zeros should a read never complete
   (RK_E_TIMEOUT); with cap rounded up to 4 KiB and dst 4 KiB-aligned, no byte is copied.
   Without drop the reader copies through buffers of its own. fmt_ckpt_read and
   fmt_ckpt_read_rows are this with one request and no drop. */
int fmt_ckpt_read_many(fmt_ckpt *c, const fmt_read_req *r, size_t n, bool drop);
/* fmt_ckpt_read_many without drop, through the page cache (S1, fmt_read.c): the
   requests go in windows of 256 MiB (a request whole in one), the next window's file
   extents handed to the kernel's readahead (posix_fadvise WILLNEED) before the current
   one is read, so that the reader finds its pages cached (R2: pread) and the processes of
   one machine reading the same tensors read the disk once between them (O_DIRECT reads
   it once for each). At most two windows are asked ahead of the reads. Where the kernel
   cannot say what the page cache holds (no cachestat, before Linux 6.5), no hint is
   given: the reader would read O_DIRECT all the same. Every byte checked as ever. */
int fmt_ckpt_read_shared(fmt_ckpt *c, const fmt_read_req *r, size_t n);
/* The descriptor the reader reads shard `rank` through (opened on first use, closed with
   c): 0 and *fd, or RK_E_INCOMPLETE / -errno where it cannot be opened. */
int fmt_ckpt_shard_fd(fmt_ckpt *c, int rank, int *fd);
/* How many pages of [off, off + len) of fd are in the page cache (cachestat, Linux 6.5): 0
   and *pages, or -errno where the kernel cannot say (ENOSYS before 6.5). What the reader
   asks before each run (fmt_readdirect.c R2). */
int fmt_cache_pages(int fd, uint64_t off, uint64_t len, uint64_t *pages);
/* Index of the tensor named name (a per-rank one as ranks/<r>/<name>), or -1 (O(log n)). */
long fmt_ckpt_find(const fmt_ckpt *c, const char *name);
/* "ranks/<r>/<name>" into buf; false if it does not fit. */
bool fmt_per_rank_name(char *buf, size_t cap, int rank, const char *name);

/* ---- a checkpoint as one file (fmt_flat.c) --------------------------------------------- */
/* Writes checkpoint c as one self-contained HDF5 file at `path` (`rekindle restore`):
   every tensor at its name with its data (no links) and its xxh3_64 attribute, and c's
   root attributes. Each tensor is read and checked with fmt_ckpt_read; each(arg, bytes)
   after each one (may be NULL: progress). Durable: written as path + ".part", fsync'd,
   renamed, its directory fsync'd; on failure neither file is left. Returns 0, or the
   error with rk_last_error() saying what and where: *bad set when a tensor could not be
   read whole (RK_E_CORRUPT, ...: the checkpoint's fault), else the file's (RK_E_HDF5,
   -errno). */
int fmt_write_flat(fmt_ckpt *c, const char *path, void (*each)(void *arg, uint64_t bytes), void *arg, bool *bad);

/* ---- what a thread is doing in the file system (fio.c) --------------------------------
 * A thread that registers a record with fmt_io_watch has each file operation it starts
 * (through the fault-injectable wrappers, which every checkpoint write uses) recorded
 * there; another thread can then name the operation and path a stuck writer is in. */
typedef struct fmt_io_activity {
    pthread_mutex_t mu; /* held only to copy the record, never across I/O */
    bool init;
    int op;             /* enum rk__fault_op of the last operation started */
    int64_t since_ns;   /* when it started (CLOCK_MONOTONIC) */
    uint64_t count;     /* operations recorded */
    char path[512];
} fmt_io_activity;
/* Records the calling thread's operations in a (zero-initialized or used before; NULL:
   stop recording). */
void fmt_io_watch(fmt_io_activity *a);
void fmt_io_activity_fini(fmt_io_activity *a);
/* "fsync of PATH, started N ms ago" into buf; false if nothing was recorded yet. */
bool fmt_io_activity_describe(fmt_io_activity *a, char *buf, size_t cap);

/* XXH3-64 of a buffer (fmt_types.c). */
uint64_t fmt_xxh3(const void *p, size_t n);

#endif
