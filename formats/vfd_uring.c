/*
 * formats/vfd_uring.c - the HDF5 1.10 virtual file driver over io_uring and O_DIRECT
 * (interface and behaviour: vfd_uring.h).
 *
 * A file handle holds two descriptors on the same file: `fd`, an ordinary one, and `dfd`,
 * opened with O_DIRECT, plus an io_uring of queue_depth entries and as many slots, each
 * with a lazily allocated, page-aligned staging buffer of `piece` bytes (bounded, reused
 * until close).
 *
 * Invariants
 *  1. No 4 KiB page is written both through the page cache and with O_DIRECT: only the
 *     page-aligned interior of a raw-data write goes O_DIRECT; its unaligned head and tail,
 *     small raw data and all metadata go through `fd`.
 *  2. Two writes to overlapping pages are never in flight together, and nothing is read
 *     while a write is in flight: overlapping writes, reads, truncate, flush and close
 *     drain the queue first (drain()).
 *  3. A buffer handed to the kernel stays valid until its completion is reaped: it is a
 *     staging buffer (freed only at close, after the drain) or, with zero_copy, caller
 *     memory the caller promised to keep until H5Fclose/H5Fflush returns. The driver does
 *     not offer HDF5's data sieve, whose buffer HDF5 reuses: raw data arrives straight
 *     from H5Dwrite's buffer (with no type conversion).
 *  7. HDF5 1.10 leaves a dangling id behind a failed H5Fclose (and crashes closing it
 *     again at exit), so a callback that H5Fclose runs fails only for an error HDF5 has not
 *     been told about yet (report()), and never inside fmt_vfd_close, which reports the
 *     error itself. H5Dwrite and H5Fflush always fail on a sticky error.
 *  4. Every kernel operation moves at most split_max bytes (io_uring lengths are 32-bit,
 *     pwrite stops near 2 GiB).
 *  5. The first I/O error (real or injected through fio.h) is sticky: it is logged once,
 *     kept in stats->error, and every later write, flush and close of the file fails.
 *  6. flush and close end with fdatasync after the last write completed: a file whose
 *     H5Fclose succeeded is durable.
 *  8. Every wait for a completion is bounded: when none of the operations in flight
 *     completes for VFD_STALL_MS (a disk that stopped answering) the file fails with
 *     RK_E_TIMEOUT (sticky, 5). The kernel still owns the staging buffers then: they are
 *     retained for the life of the process, never freed or reused (an exception to 3 that
 *     keeps its promise: no buffer the kernel may use is ever given back).
 *  9. The buffered path is as lean as dd: pwrite in pieces of at most `writeback` bytes,
 *     the write-back of what was written started (sync_file_range WRITE, a hint that
 *     never waits) every `writeback` bytes, so that the disk works while the rest is
 *     copied, one fdatasync at flush/close (6), then the file's clean pages dropped from
 *     the page cache (POSIX_FADV_DONTNEED): a checkpoint does not evict the job's memory.
 *     Durability rests on the fdatasync alone; the hint's failure is not an error.
 * 10. No O_DIRECT write extends the file, and none waits for another one's allocation:
 *     given the file's expected size (opts.prealloc), the file is allocated whole, blocks
 *     and size (fallocate, once, before its first raw-data write, when nothing is in
 *     flight); without it, where the file system cannot fallocate, or past that size, the
 *     size is set to the end of allocation (ftruncate) before the first raw-data write past
 *     the file's end. ext4 and XFS make a direct write that extends the file wait for its
 *     completion (a queue of 32 runs as a queue of one), and their fallocate and ftruncate
 *     wait for every direct write in flight on the file (inode_dio_wait): sized per
 *     dataset, the queue was drained at each dataset. bench/disk.sh, 4 MiB x 32 O_DIRECT:
 *     a new file 0.34-0.91 GB/s, ftruncate first 1.05-1.49, fallocate first 1.58-1.62;
 *     fallocate per dataset (KEEP_SIZE, each waiting for the previous dataset's writes)
 *     reached 0.86x the best raw write against 1.12x with ftruncate alone. HDF5 truncates
 *     the file to its end of allocation at flush and close, so an estimate too large costs
 *     nothing on disk; fallocate's ENOSPC fails the file before any data is written.
 *
 * I/O paths, chosen at open (and named in stats->io_path):
 *   "uring+odirect"  io_uring with O_DIRECT for raw-data interiors (the fast path);
 *   "uring+buffered" io_uring on `fd` for raw data (O_DIRECT refused by the file system);
 *   "buffered"       synchronous pwrite/pread + fdatasync (RK_IO=buffered, or io_uring
 *                    refused), the write-back started as it goes (9). Falling back is
 *                    logged once per file as a warning naming the reason and the file
 *                    system, at the file's first I/O (so HDF5's probe opens do not log).
 */
#include "vfd_uring.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common.h"
#include "fio.h"

/* The driver is written against HDF5 1.10's H5FD_class_t (it changed in 1.12 and 1.14). */
_Static_assert(H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10, "vfd_uring.c needs HDF5 1.10's H5FD_class_t");
_Static_assert(offsetof(H5FD_class_t, fl_map) == offsetof(H5FD_class_t, unlock) + sizeof(void *),
               "unexpected H5FD_class_t layout");
_Static_assert(offsetof(H5FD_class_t, name) == 0, "unexpected H5FD_class_t layout");

#define VFD_PAGE ((size_t)4096)
#define VFD_NAME "rekindle_uring"
#define VFD_VALUE ((H5FD_class_value_t)0) /* unused in 1.10 */
#define VFD_MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)
#define VFD_DEF_QD 16    /* staged: 16 x 1 MiB of staging memory */
#define VFD_STALL_MS 60000 /* no completion for this long: the disk stopped (invariant 8) */
#define VFD_DEF_QD_ZC 32 /* zero copy: no staging memory, deeper and larger */
#define VFD_MAX_QD 256
#define VFD_DEF_PIECE ((size_t)1 << 20)
#define VFD_DEF_PIECE_ZC ((size_t)4 << 20)
#define VFD_DEF_SPLIT ((size_t)1 << 30)
#define VFD_META_BLOCK ((hsize_t)1 << 20)
#define VFD_ASYNC_MIN ((size_t)64 << 10) /* raw writes below this go synchronously */
#define VFD_DEF_WRITEBACK ((size_t)32 << 20) /* buffered path: write-back started this often */

enum vfd_path { VP_URING_DIRECT, VP_URING_BUFFERED, VP_BUFFERED };
static const char *const vp_names[] = {"uring+odirect", "uring+buffered", "buffered"};

struct vfd_slot {
    bool busy, is_read, short_fault, direct;
    char *stage;   /* page-aligned staging buffer, piece bytes, allocated on first use */
    char *ptr;     /* what was submitted */
    char *copy_to; /* staged read: where the bytes go on completion */
    size_t len, done;
    off_t off;
};

typedef struct vfd {
    H5FD_t pub; /* first: HDF5 hands us &pub */
    char *path;
    int fd, dfd;
    bool writable, ring_ok, dirty;
    bool stuck; /* an operation never completed: the kernel may still use the buffers (8) */
    bool presized; /* opts.prealloc was served (or tried): invariant 10 */
    enum vfd_path vp;
    haddr_t eoa, eof;
    dev_t dev;
    ino_t ino;
    fmt_vfd_opts o;
    fmt_vfd_stats own_stats, *st;
    struct io_uring ring;
    struct vfd_slot *slots;
    int nslots, inflight;
    int error;
    int *close_rc; /* fmt_vfd_close's: gets the error of the close */
    bool quiet;    /* inside fmt_vfd_close's H5Fclose: errors are recorded, never returned */
    bool reported; /* a callback has returned the sticky error to HDF5 */
    uint64_t wb_lo, wb_hi; /* buffered path: bytes written, write-back not yet started (9) */
    char warn[256];
} vfd;

/* ---- errors ----------------------------------------------------------------------------- */

/* Invariant 5: records the first error of the file (logged once) and returns it. */
static int set_error(vfd *f, int rc, const char *what, uint64_t off)
{
    if (rc >= 0)
        rc = -EIO;
    if (f->error == 0) {
        f->error = rc;
        f->st->error = rc;
        rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "%s %s at offset %llu: %s", what, f->path,
                 (unsigned long long)off, rk_strerror(rc));
    }
    return f->error;
}

/* Invariant 7: whether a callback returns failure for rc. Inside fmt_vfd_close never; in
   H5Fclose (closing) or in a write, only an error HDF5 has not been told about yet, so that
   the caller's H5Fclose after a failed H5Dwrite or H5Fflush succeeds and frees the file. */
static bool report(vfd *f, int rc, bool closing)
{
    if (rc == 0 || f->quiet || (closing && f->reported))
        return false;
    f->reported = true;
    return true;
}

#define VFD_PUSH(maj, min, ...) H5Epush2(H5E_DEFAULT, __FILE__, __func__, __LINE__, H5E_ERR_CLS, maj, min, __VA_ARGS__)

static void emit_warning(vfd *f)
{
    if (f->warn[0]) {
        RK_LOG_WARN(RK_SUB_FMT, "%s", f->warn);
        f->warn[0] = '\0';
    }
}

static const char *fs_name(int fd, char *buf, size_t cap)
{
    struct statfs s;
    if (fstatfs(fd, &s) != 0)
        return "an unknown file system";
    switch ((unsigned long)s.f_type) {
    case 0x01021994UL: return "tmpfs";
    case 0xEF53UL: return "ext4";
    case 0x58465342UL: return "xfs";
    case 0x9123683EUL: return "btrfs";
    case 0x794C7630UL: return "overlayfs";
    case 0x6969UL: return "nfs";
    case 0x2FC12FC1UL: return "zfs";
    default: snprintf(buf, cap, "file system type 0x%lx", (unsigned long)s.f_type); return buf;
    }
}

/* ---- the queue -------------------------------------------------------------------------- */

static void submit_slot(vfd *f, int i)
{
    struct vfd_slot *s = &f->slots[i];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring); /* never NULL: inflight < entries */
    int fd = s->direct ? f->dfd : f->fd;
    if (s->is_read)
        io_uring_prep_read(sqe, fd, s->ptr + s->done, (unsigned)(s->len - s->done), s->off + (off_t)s->done);
    else
        io_uring_prep_write(sqe, fd, s->ptr + s->done, (unsigned)(s->len - s->done), s->off + (off_t)s->done);
    io_uring_sqe_set_data64(sqe, (uint64_t)i);
    int rc;
    do
        rc = io_uring_submit(&f->ring);
    while (rc == -EINTR);
    if (rc < 0) {
        /* The entry stays queued in the SQ ring; the next submit or wait takes it. */
        RK_LOG_DEBUG(RK_SUB_FMT, "io_uring_submit %s: %s (entry kept queued)", f->path, strerror(-rc));
    }
}

/* Handles one completion. */
static void complete(vfd *f, struct io_uring_cqe *cqe)
{
    int i = (int)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&f->ring, cqe);
    struct vfd_slot *s = &f->slots[i];
    const char *what = s->is_read ? "read" : "write";
    if (res < 0) {
        set_error(f, res, what, (uint64_t)s->off);
    } else {
        s->done += (size_t)res;
        if (!s->is_read) {
            if (s->direct)
                f->st->bytes_direct += (uint64_t)res;
            else
                f->st->bytes_buffered += (uint64_t)res;
        } else if (s->direct) {
            f->st->bytes_read_direct += (uint64_t)res;
        } else {
            f->st->bytes_read_buffered += (uint64_t)res;
        }
        if (s->short_fault) {
            set_error(f, -EIO, s->is_read ? "read (injected short)" : "write (injected short)",
                      (uint64_t)s->off + s->done);
        } else if (s->done < s->len) {
            /* A short transfer: continue it, unless nothing moved or O_DIRECT lost alignment. */
            if (res == 0 || (s->direct && s->done % VFD_PAGE != 0)) {
                set_error(f, s->is_read ? -EIO : -ENOSPC, what, (uint64_t)s->off + s->done);
            } else {
                submit_slot(f, i);
                return;
            }
        } else if (s->copy_to) {
            memcpy(s->copy_to, s->ptr, s->len);
        }
    }
    s->busy = false;
    s->copy_to = NULL;
    f->inflight--;
}

/* Waits for one completion, at most VFD_STALL_MS (invariant 8): RK_E_TIMEOUT, and the file
   is stuck for good, if none came. */
static int wait_one(vfd *f, struct io_uring_cqe **cqe)
{
    if (f->stuck)
        return RK_E_TIMEOUT; /* waited once already: the file has failed */
    int64_t deadline = rk__deadline_ns(VFD_STALL_MS);
    for (;;) {
        int64_t left = deadline - rk__mono_ns();
        struct __kernel_timespec ts = {.tv_sec = left > 0 ? left / 1000000000 : 0,
                                       .tv_nsec = left > 0 ? left % 1000000000 : 0};
        int rc = io_uring_wait_cqe_timeout(&f->ring, cqe, &ts);
        if (rc == -EINTR && !rk__deadline_passed(deadline))
            continue;
        if (rc == -ETIME || rc == -EINTR) {
            f->stuck = true;
            return RK_E_TIMEOUT;
        }
        return rc;
    }
}

/* Reaps completions: at least one if wait (and any are in flight), then all ready ones. */
static void reap(vfd *f, bool wait)
{
    struct io_uring_cqe *cqe;
    while (f->inflight > 0) {
        int rc = wait ? wait_one(f, &cqe) : io_uring_peek_cqe(&f->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc == RK_E_TIMEOUT) {
            set_error(f, rc, "io_uring wait: no completion for 60 s (the disk stopped answering)", 0);
            return;
        }
        if (rc == -EAGAIN && !wait)
            return;
        if (rc < 0) {
            /* The ring itself failed: the kernel still owns the buffers (invariant 8). */
            f->stuck = true;
            set_error(f, rc, "io_uring wait", 0);
            return;
        }
        complete(f, cqe);
        wait = false;
    }
}

/* Invariant 2. Returns the file's sticky error (0 if none). */
static int drain(vfd *f)
{
    while (f->inflight > 0) {
        int before = f->inflight;
        reap(f, true);
        if (f->inflight == before && f->error)
            break; /* the ring is broken */
    }
    return f->error;
}

/* Drains if a write in flight touches the pages of [off, off+len). */
static void drain_overlap(vfd *f, uint64_t off, uint64_t len)
{
    uint64_t lo = off / VFD_PAGE * VFD_PAGE, hi = (off + len + VFD_PAGE - 1) / VFD_PAGE * VFD_PAGE;
    for (int i = 0; i < f->nslots; i++) {
        const struct vfd_slot *s = &f->slots[i];
        if (s->busy && (uint64_t)s->off < hi && (uint64_t)s->off + s->len > lo) {
            drain(f);
            return;
        }
    }
}

/* A free slot (waiting for a completion if all are busy), or -1 on a broken ring. */
static int get_slot(vfd *f)
{
    for (;;) {
        for (int i = 0; i < f->nslots; i++)
            if (!f->slots[i].busy)
                return i;
        int before = f->inflight;
        reap(f, true);
        if (f->inflight == before)
            return -1;
    }
}

static char *slot_stage(vfd *f, struct vfd_slot *s)
{
    if (!s->stage) {
        void *p = NULL;
        if (posix_memalign(&p, VFD_PAGE, f->o.piece) != 0)
            return NULL;
        s->stage = p;
    }
    return s->stage;
}

/* Queues [off, off+len) of the file <-> buf in pieces on the ring (direct: dfd, whose
   offsets, lengths and, for zero copy, addresses are page-aligned). For a write, zero_copy
   hands buf itself to the kernel; for a read, buf is used directly when aligned. */
static int queue_range(vfd *f, bool rd, bool direct, uint64_t off, size_t len, char *buf, bool zero_copy)
{
    drain_overlap(f, off, len);
    for (size_t pos = 0; pos < len;) {
        size_t n = len - pos < f->o.piece ? len - pos : f->o.piece;
        int i = get_slot(f);
        if (f->error)
            return f->error;
        if (i < 0)
            return set_error(f, -EIO, "io_uring", off + pos);
        struct vfd_slot *s = &f->slots[i];
        int fault = fmt_fault(rd ? RK_FAULT_OP_READ : RK_FAULT_OP_WRITE, f->path);
        if (fault && fault != RK_FAULT_SHORT)
            return set_error(f, fmt_fault_apply(fault), rd ? "read" : "write", off + pos);
        bool own = zero_copy && (!direct || (uintptr_t)(buf + pos) % VFD_PAGE == 0);
        *s = (struct vfd_slot){.stage = s->stage, .is_read = rd, .direct = direct, .off = (off_t)(off + pos),
                               .len = n, .short_fault = fault == RK_FAULT_SHORT};
        if (own) {
            s->ptr = buf + pos;
            if (!rd)
                f->st->bytes_zero_copy += n;
        } else {
            if (!(s->ptr = slot_stage(f, s)))
                return set_error(f, -ENOMEM, "staging buffer for", off + pos);
            if (rd)
                s->copy_to = buf + pos;
            else
                memcpy(s->ptr, buf + pos, n);
        }
        if (s->short_fault) {
            s->len = direct ? n / 2 / VFD_PAGE * VFD_PAGE : n / 2;
            if (s->len == 0)
                return set_error(f, -EIO, rd ? "read (injected short)" : "write (injected short)", off + pos);
        }
        s->busy = true;
        f->inflight++;
        if (!rd) {
            f->st->writes++;
            if ((uint64_t)f->inflight > f->st->max_inflight)
                f->st->max_inflight = (uint64_t)f->inflight;
        }
        submit_slot(f, i);
        pos += n;
    }
    return f->error;
}

/* Invariant 9: [off, off+n) was written through the page cache of the buffered path:
   once `writeback` bytes are waiting, their write-back starts (a hint: it never waits for
   the disk, and its failure leaves the data to the fdatasync that follows). */
static void start_writeback(vfd *f, uint64_t off, size_t n)
{
    if (f->vp != VP_BUFFERED)
        return;
    bool none = f->wb_hi == f->wb_lo;
    f->wb_lo = none || off < f->wb_lo ? off : f->wb_lo;
    f->wb_hi = none || off + n > f->wb_hi ? off + n : f->wb_hi;
    if (f->wb_hi - f->wb_lo < f->o.writeback)
        return;
    if (sync_file_range(f->fd, (off_t)f->wb_lo, (off_t)(f->wb_hi - f->wb_lo), SYNC_FILE_RANGE_WRITE) == 0)
        f->st->writebacks++;
    f->wb_lo = f->wb_hi = 0;
}

/* Synchronous transfer through fd, in operations of at most split_max bytes (writes of
   the buffered path: at most `writeback`, 9). */
static int sync_range(vfd *f, bool rd, uint64_t off, size_t len, char *buf)
{
    drain_overlap(f, off, len);
    size_t most = !rd && f->vp == VP_BUFFERED && f->o.writeback < f->o.split_max ? f->o.writeback : f->o.split_max;
    for (size_t pos = 0; pos < len;) {
        size_t n = len - pos < most ? len - pos : most;
        int rc = rd ? fmt_io_pread_all(f->fd, buf + pos, n, (off_t)(off + pos), f->path)
                    : fmt_io_pwrite_all(f->fd, buf + pos, n, (off_t)(off + pos), f->path);
        if (rc < 0)
            return set_error(f, rc, rd ? "read" : "write", off + pos);
        if (rd) {
            f->st->bytes_read_buffered += n;
        } else {
            f->st->bytes_buffered += n;
            f->st->writes++;
            start_writeback(f, off + pos, n);
        }
        pos += n;
    }
    return 0;
}

/* Routes one transfer (invariant 1): [head | page-aligned interior | tail]. */
static int xfer(vfd *f, bool rd, H5FD_mem_t type, uint64_t off, size_t len, char *buf)
{
    bool big_raw = type == H5FD_MEM_DRAW && len >= VFD_ASYNC_MIN;
    if (f->vp == VP_BUFFERED || !f->ring_ok || !big_raw || (rd && f->error))
        return sync_range(f, rd, off, len, buf);
    bool direct = f->vp == VP_URING_DIRECT;
    uint64_t a0 = off, a1 = off + len;
    if (direct) {
        a0 = (off + VFD_PAGE - 1) / VFD_PAGE * VFD_PAGE;
        a1 = (off + len) / VFD_PAGE * VFD_PAGE;
        if (a1 <= a0)
            return sync_range(f, rd, off, len, buf);
    }
    int rc = 0;
    if (a0 > off)
        rc = sync_range(f, rd, off, (size_t)(a0 - off), buf);
    if (rc == 0 && a1 < off + len)
        rc = sync_range(f, rd, a1, (size_t)(off + len - a1), buf + (a1 - off));
    bool zc = rd || f->o.zero_copy;
    if (rc == 0)
        rc = queue_range(f, rd, direct, a0, (size_t)(a1 - a0), buf + (a0 - off), zc);
    return rc;
}

/* fdatasync, through the ring when there is one (invariant 6). */
static int sync_file(vfd *f)
{
    int rc = drain(f);
    if (rc)
        return rc;
    if (!f->ring_ok) {
        rc = fmt_io_fsync(f->fd, f->path);
        f->wb_lo = f->wb_hi = 0;
        if (rc == 0 && f->vp == VP_BUFFERED) /* 9: clean now; a hint, never an error */
            posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    } else if ((rc = fmt_fault(RK_FAULT_OP_SYNC, f->path)) != 0) {
        rc = fmt_fault_apply(rc);
    } else {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
        io_uring_prep_fsync(sqe, f->fd, IORING_FSYNC_DATASYNC);
        io_uring_sqe_set_data64(sqe, UINT64_MAX);
        struct io_uring_cqe *cqe;
        rc = io_uring_submit(&f->ring);
        if (rc >= 0)
            rc = wait_one(f, &cqe);
        if (rc >= 0) {
            rc = cqe->res < 0 ? cqe->res : 0;
            io_uring_cqe_seen(&f->ring, cqe);
        }
        if (rc == 0)
            fio_power_synced(f->fd, f->path); /* what fmt_io_fsync does after its fdatasync */
    }
    if (rc < 0)
        return set_error(f, rc, "fdatasync", 0);
    f->dirty = false;
    return 0;
}

/* ---- the HDF5 driver callbacks ----------------------------------------------------------- */

static hid_t vfd_driver_id(void);

static void *vfd_fapl_copy(const void *p)
{
    fmt_vfd_opts *c = malloc(sizeof *c);
    if (c)
        memcpy(c, p, sizeof *c);
    return c;
}

static herr_t vfd_fapl_free(void *p)
{
    free(p);
    return 0;
}

static void *vfd_fapl_get(H5FD_t *file)
{
    return vfd_fapl_copy(&((vfd *)file)->o);
}

/* Chooses the I/O path (see the file header); f->fd is open. Returns 0 or -errno. */
static int choose_path(vfd *f, int oflags)
{
    char fsbuf[48];
    f->vp = VP_BUFFERED;
    if (f->o.mode == FMT_IO_BUFFERED)
        return 0;
    int rc = fmt_fault(RK_FAULT_OP_URING, f->path);
    rc = rc ? fmt_fault_apply(rc) : io_uring_queue_init((unsigned)f->o.queue_depth, &f->ring, 0);
    if (rc < 0) {
        if (f->o.mode == FMT_IO_URING)
            return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, rc, "RK_IO=uring but io_uring is unavailable for %s: %s",
                            f->path, strerror(-rc));
        snprintf(f->warn, sizeof f->warn,
                 "%s: io_uring unavailable (%s): falling back to buffered pwrite + fdatasync (io_path=buffered)",
                 f->path, strerror(-rc));
        return 0;
    }
    f->ring_ok = true;
    f->slots = calloc((size_t)f->o.queue_depth, sizeof *f->slots);
    if (!f->slots)
        return -ENOMEM;
    f->nslots = f->o.queue_depth;
    f->dfd = fmt_io_open(f->path, (oflags & O_ACCMODE) | O_DIRECT, 0);
    if (f->dfd < 0) {
        snprintf(f->warn, sizeof f->warn,
                 "%s: O_DIRECT refused on %s (%s): io_uring through the page cache (io_path=uring+buffered)",
                 f->path, fs_name(f->fd, fsbuf, sizeof fsbuf), strerror(-f->dfd));
        f->dfd = -1;
        f->vp = VP_URING_BUFFERED;
        return 0;
    }
    f->vp = VP_URING_DIRECT;
    return 0;
}

static herr_t vfd_close(H5FD_t *file);

static H5FD_t *vfd_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr)
{
    if (!name || !*name || maxaddr == 0 || (maxaddr != HADDR_UNDEF && maxaddr > VFD_MAXADDR)) {
        VFD_PUSH(H5E_ARGS, H5E_BADVALUE, "bad file name or maxaddr");
        return NULL;
    }
    const fmt_vfd_opts *o = H5Pget_driver_info(fapl);
    if (!o || H5Pget_driver(fapl) != vfd_driver_id()) {
        VFD_PUSH(H5E_ARGS, H5E_BADVALUE, "not a %s file access property list", VFD_NAME);
        return NULL;
    }
    int oflags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
    oflags |= (flags & H5F_ACC_TRUNC) ? O_TRUNC : 0;
    oflags |= (flags & H5F_ACC_CREAT) ? O_CREAT : 0;
    oflags |= (flags & H5F_ACC_EXCL) ? O_EXCL : 0;
    /* HDF5 probes without the create flags first: failing here is normal, so it is quiet. */
    int fd = fmt_io_open(name, oflags, 0666);
    if (fd < 0) {
        RK_LOG_DEBUG(RK_SUB_FMT, "open %s: %s", name, strerror(-fd));
        VFD_PUSH(H5E_FILE, H5E_CANTOPENFILE, "open %s: %s", name, strerror(-fd));
        return NULL;
    }
    struct stat sb;
    vfd *f = calloc(1, sizeof *f);
    if (!f || fstat(fd, &sb) != 0 || !(f->path = strdup(name))) {
        VFD_PUSH(H5E_FILE, H5E_CANTOPENFILE, "open %s: out of memory or fstat failed", name);
        close(fd);
        free(f);
        return NULL;
    }
    f->fd = fd;
    f->dfd = -1;
    f->o = *o;
    f->st = o->stats ? o->stats : &f->own_stats;
    memset(f->st, 0, sizeof *f->st);
    f->writable = (flags & H5F_ACC_RDWR) != 0;
    f->eof = (haddr_t)sb.st_size;
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
    int rc = choose_path(f, oflags);
    snprintf(f->st->io_path, sizeof f->st->io_path, "%s", vp_names[f->vp]);
    if (rc < 0) {
        VFD_PUSH(H5E_FILE, H5E_CANTOPENFILE, "open %s: %s", name, strerror(-rc));
        vfd_close(&f->pub);
        return NULL;
    }
    return &f->pub;
}

static herr_t vfd_close(H5FD_t *file)
{
    vfd *f = (vfd *)file;
    int rc = f->error;
    if (f->ring_ok) {
        drain(f);
        rc = f->error;
    }
    if (f->writable && f->dirty && rc == 0)
        rc = sync_file(f);
    if (f->ring_ok)
        io_uring_queue_exit(&f->ring);
    for (int i = 0; i < f->nslots; i++)
        if (f->stuck && f->slots[i].stage)
            rk__retain_forever(f->slots[i].stage); /* the kernel may still use it (8) */
        else
            free(f->slots[i].stage);
    free(f->slots);
    if (f->dfd >= 0)
        close(f->dfd);
    if (close(f->fd) != 0 && rc == 0)
        rc = set_error(f, -errno, "close", 0);
    bool fail = report(f, rc, true);
    if (fail)
        VFD_PUSH(H5E_VFL, H5E_CANTCLOSEFILE, "%s: %s (the file is not complete)", f->path, rk_strerror(rc));
    if (f->close_rc)
        *f->close_rc = rc;
    free(f->path);
    free(f);
    return fail ? -1 : 0;
}

static int vfd_cmp(const H5FD_t *a, const H5FD_t *b)
{
    const vfd *x = (const vfd *)a, *y = (const vfd *)b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino)
        return x->ino < y->ino ? -1 : 1;
    return 0;
}

static herr_t vfd_query(const H5FD_t *file, unsigned long *flags)
{
    if (flags)
        *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_AGGREGATE_SMALLDATA;
    return 0;
}

static haddr_t vfd_get_eoa(const H5FD_t *file, H5FD_mem_t type)
{
    return ((const vfd *)file)->eoa;
}

static herr_t vfd_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr)
{
    ((vfd *)file)->eoa = addr;
    return 0;
}

static haddr_t vfd_get_eof(const H5FD_t *file, H5FD_mem_t type)
{
    return ((const vfd *)file)->eof;
}

static herr_t vfd_get_handle(H5FD_t *file, hid_t fapl, void **handle)
{
    if (!handle)
        return -1;
    *handle = &((vfd *)file)->fd;
    return 0;
}

static herr_t vfd_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf)
{
    vfd *f = (vfd *)file;
    if (addr == HADDR_UNDEF || addr + size < addr || addr + size > f->eoa) {
        VFD_PUSH(H5E_ARGS, H5E_BADVALUE, "read %s: [%llu, +%zu) beyond the end of allocation %llu", f->path,
                 (unsigned long long)addr, size, (unsigned long long)f->eoa);
        return -1;
    }
    emit_warning(f);
    int before = f->error;
    drain(f);
    /* Past the end of the file HDF5 expects zeros (as with sec2). */
    size_t n = addr >= f->eof ? 0 : (size_t)(f->eof - addr < size ? f->eof - addr : size);
    memset((char *)buf + n, 0, size - n);
    int rc = n ? xfer(f, true, type, addr, n, buf) : 0;
    drain(f);
    if (rc == 0 && f->error != before)
        rc = f->error;
    if (rc && !f->quiet) {
        VFD_PUSH(H5E_IO, H5E_READERROR, "read %s at %llu: %s", f->path, (unsigned long long)addr, rk_strerror(rc));
        return -1;
    }
    return 0;
}

/* Invariant 10: raw data [.., end) is about to be written and nothing is in flight yet, or
   it lies past the file's end: the whole file allocated at once (opts.prealloc, the first
   time), else the size set to the end of allocation before its first write is queued. */
static int presize(vfd *f, uint64_t end)
{
    uint64_t want = f->eoa > end ? f->eoa : end;
    if (!f->presized && f->o.prealloc) {
        f->presized = true;
        want = f->o.prealloc > want ? f->o.prealloc : want;
        int rc = f->inflight ? drain(f) : 0;
        if (rc == 0)
            rc = fmt_io_fallocate(f->fd, (off_t)want, f->path);
        if (rc == 0) {
            f->st->prealloc = want;
            f->eof = want > f->eof ? want : f->eof;
            return 0;
        }
        if (rc != -EOPNOTSUPP && rc != -ENOSYS)
            return set_error(f, rc, "fallocate", want);
        RK_LOG_DEBUG(RK_SUB_FMT, "%s: fallocate not supported: sized by ftruncate", f->path);
    }
    if (end <= f->eof || f->vp == VP_BUFFERED)
        return 0;
    int rc = fmt_io_ftruncate(f->fd, (off_t)want, f->path);
    if (rc < 0)
        return set_error(f, rc, "ftruncate", want);
    f->st->extends++;
    f->eof = want;
    return 0;
}

static herr_t vfd_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf)
{
    vfd *f = (vfd *)file;
    if (addr == HADDR_UNDEF || addr + size < addr || addr + size > f->eoa || !f->writable) {
        VFD_PUSH(H5E_ARGS, H5E_BADVALUE, "write %s: [%llu, +%zu) beyond the end of allocation %llu or read-only",
                 f->path, (unsigned long long)addr, size, (unsigned long long)f->eoa);
        return -1;
    }
    emit_warning(f);
    int rc = f->error;
    f->dirty = true;
    if (rc && (f->quiet || (f->reported && type != H5FD_MEM_DRAW)))
        return 0; /* metadata of a lost file, from H5Fclose: the caller was told already */
    if (rc == 0 && type == H5FD_MEM_DRAW &&
        ((size >= VFD_ASYNC_MIN && addr + size > f->eof) || (f->o.prealloc && !f->presized)))
        rc = presize(f, addr + size);
    if (rc == 0)
        rc = xfer(f, false, type, addr, size, (char *)buf);
    if (report(f, rc, false)) {
        VFD_PUSH(H5E_IO, H5E_WRITEERROR, "write %s at %llu: %s", f->path, (unsigned long long)addr,
                 rk_strerror(rc));
        return -1;
    }
    if (addr + size > f->eof)
        f->eof = addr + size;
    return 0;
}

static herr_t vfd_flush(H5FD_t *file, hid_t dxpl, hbool_t closing)
{
    vfd *f = (vfd *)file;
    int rc = drain(f);
    if (rc == 0 && f->writable && f->dirty)
        rc = sync_file(f);
    if (report(f, rc, closing)) {
        VFD_PUSH(H5E_IO, H5E_CANTFLUSH, "flush %s: %s", f->path, rk_strerror(rc));
        return -1;
    }
    return 0;
}

static herr_t vfd_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing)
{
    vfd *f = (vfd *)file;
    int rc = drain(f);
    if (rc == 0 && f->writable && f->eoa != f->eof) {
        rc = fmt_io_ftruncate(f->fd, (off_t)f->eoa, f->path);
        if (rc < 0)
            rc = set_error(f, rc, "ftruncate", f->eoa);
        else
            f->eof = f->eoa;
        f->dirty = true;
    }
    if (report(f, rc, closing)) {
        VFD_PUSH(H5E_IO, H5E_SEEKERROR, "truncate %s: %s", f->path, rk_strerror(rc));
        return -1;
    }
    return 0;
}

static herr_t vfd_lock(H5FD_t *file, hbool_t rw)
{
    vfd *f = (vfd *)file;
    if (flock(f->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 && errno != ENOSYS) {
        VFD_PUSH(H5E_FILE, H5E_CANTOPENFILE, "lock %s: %s", f->path, strerror(errno));
        return -1;
    }
    return 0;
}

static herr_t vfd_unlock(H5FD_t *file)
{
    vfd *f = (vfd *)file;
    if (flock(f->fd, LOCK_UN) != 0 && errno != ENOSYS) {
        VFD_PUSH(H5E_FILE, H5E_CANTCLOSEFILE, "unlock %s: %s", f->path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- registration ------------------------------------------------------------------------ */

static pthread_mutex_t vfd_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static hid_t vfd_id = H5I_INVALID_HID;

static herr_t vfd_terminate(void)
{
    vfd_id = H5I_INVALID_HID;
    return 0;
}

static const H5FD_class_t vfd_class = {
    .name = VFD_NAME,
    .maxaddr = VFD_MAXADDR,
    .fc_degree = H5F_CLOSE_WEAK,
    .terminate = vfd_terminate,
    .fapl_size = sizeof(fmt_vfd_opts),
    .fapl_get = vfd_fapl_get,
    .fapl_copy = vfd_fapl_copy,
    .fapl_free = vfd_fapl_free,
    .open = vfd_open,
    .close = vfd_close,
    .cmp = vfd_cmp,
    .query = vfd_query,
    .get_eoa = vfd_get_eoa,
    .set_eoa = vfd_set_eoa,
    .get_eof = vfd_get_eof,
    .get_handle = vfd_get_handle,
    .read = vfd_read,
    .write = vfd_write,
    .flush = vfd_flush,
    .truncate = vfd_truncate,
    .lock = vfd_lock,
    .unlock = vfd_unlock,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* The driver's id, registered on first use (and again after H5close). */
static hid_t vfd_driver_id(void)
{
    pthread_mutex_lock(&vfd_reg_lock);
    if (vfd_id < 0 || H5Iis_valid(vfd_id) <= 0)
        vfd_id = H5FDregister(&vfd_class);
    hid_t id = vfd_id;
    pthread_mutex_unlock(&vfd_reg_lock);
    return id;
}

int fmt_io_mode_parse(const char *s, enum fmt_io_mode *mode)
{
    if (!s || !*s || strcmp(s, "auto") == 0)
        *mode = FMT_IO_AUTO;
    else if (strcmp(s, "uring") == 0)
        *mode = FMT_IO_URING;
    else if (strcmp(s, "buffered") == 0)
        *mode = FMT_IO_BUFFERED;
    else
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_OPTION, "RK_IO='%s': want auto, uring or buffered", s);
    return 0;
}

hid_t fmt_vfd_fapl(const fmt_vfd_opts *o)
{
    fmt_vfd_opts c = o ? *o : (fmt_vfd_opts){.mode = FMT_IO_AUTO};
    if (c.mode == FMT_IO_AUTO && fmt_io_mode_parse(getenv("RK_IO"), &c.mode) != 0)
        return H5I_INVALID_HID;
    if (c.queue_depth == 0)
        c.queue_depth = c.zero_copy ? VFD_DEF_QD_ZC : VFD_DEF_QD;
    if (c.queue_depth < 1 || c.queue_depth > VFD_MAX_QD || (int)c.mode < 0 || c.mode > FMT_IO_BUFFERED) {
        rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_OPTION, "fmt_vfd_fapl: queue depth %d not in 1..%d or bad mode %d",
                 c.queue_depth, VFD_MAX_QD, (int)c.mode);
        return H5I_INVALID_HID;
    }
    c.split_max = c.split_max ? c.split_max : VFD_DEF_SPLIT;
    c.split_max = c.split_max > VFD_DEF_SPLIT ? VFD_DEF_SPLIT : c.split_max;
    c.split_max = c.split_max < VFD_PAGE ? VFD_PAGE : c.split_max / VFD_PAGE * VFD_PAGE;
    c.piece = c.piece ? (c.piece + VFD_PAGE - 1) / VFD_PAGE * VFD_PAGE : c.zero_copy ? VFD_DEF_PIECE_ZC : VFD_DEF_PIECE;
    c.piece = c.piece > c.split_max ? c.split_max : c.piece;
    c.writeback = c.writeback ? (c.writeback + VFD_PAGE - 1) / VFD_PAGE * VFD_PAGE : VFD_DEF_WRITEBACK;
    hid_t id = vfd_driver_id();
    if (id < 0) {
        rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "H5FDregister(%s) failed", VFD_NAME);
        return H5I_INVALID_HID;
    }
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        goto fail;
    if (H5Pset_alignment(fapl, VFD_PAGE, VFD_PAGE) < 0 || H5Pset_meta_block_size(fapl, VFD_META_BLOCK) < 0 ||
        H5Pset_driver(fapl, id, &c) < 0)
        goto fail_fapl;
    return fapl;
fail_fapl:
    H5Pclose(fapl);
fail:
    rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "fmt_vfd_fapl: cannot build the file access property list");
    return H5I_INVALID_HID;
}

int fmt_vfd_close(hid_t *file)
{
    if (!file || *file < 0)
        return 0;
    hid_t fapl = H5Fget_access_plist(*file);
    bool ours = fapl >= 0 && H5Pget_driver(fapl) == vfd_driver_id();
    int *handle = NULL;
    if (ours && H5Fget_vfd_handle(*file, fapl, (void **)&handle) < 0)
        handle = NULL;
    if (fapl >= 0)
        H5Pclose(fapl);
    int rc = 0, close_rc = 0;
    vfd *f = handle ? (vfd *)((char *)handle - offsetof(vfd, fd)) : NULL;
    if (f) {
        /* Everything that can fail happens here, where failing is harmless... */
        if (H5Fflush(*file, H5F_SCOPE_LOCAL) < 0)
            rc = f->error ? f->error : RK_E_HDF5;
        /* ...and nothing that H5Fclose calls may fail: HDF5 1.10 keeps the id of a file
           whose close failed, pointing at freed memory, and closes it again at exit. */
        f->quiet = true;
        f->close_rc = &close_rc;
    }
    herr_t hr = H5Fclose(*file);
    *file = H5I_INVALID_HID;
    if (rc == 0)
        rc = close_rc;
    if (rc == 0 && hr < 0)
        rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_HDF5, "H5Fclose failed");
    return rc;
}
