/*
 * formats/fio.h - every file operation of a checkpoint goes through here, so that tests
 * and the chaos harness can inject faults (short writes, EIO, ENOSPC, a failing fsync,
 * a crash before rename). Private to formats/ (only the .c files of formats/ include it).
 *
 * Faults are injected ONLY when the environment asks for them:
 *   RK_FAULT=OP@N=KIND[,OP@N=KIND...]
 *     OP    open|write|read|sync|truncate|rename|syncdir|unlink|mkdir|odirect|uring|list|swap|any|rebuild|progress|rollback|allreduce|copy|stage
 *           (unlink: removing a file or an empty directory; mkdir: creating a directory;
 *            odirect: opening a descriptor with O_DIRECT; uring: setting up io_uring,
 *            or the checkpoint reader submitting reads to it;
 *            list: reading a directory's entries; swap: exchanging two directories'
 *            names in one step; any: every file operation, N counted over all of them;
 *            rebuild: not a file operation but the ring's rebuild, between its handshake
 *            and its end, a point reached through fmt_fault_point (fmt.h) where only
 *            crash applies; progress: not a file operation either but each test of a
 *            ring transfer, inside its MPI call, where hang stands for an MPI call that
 *            never returns; rollback: the rebuild of sharded state from memory on
 *            this member, where an error kind makes its part fail, fmt_fault_fail;
 *            allreduce: each call of rk_allreduce, on entry, where only crash applies;
 *            copy: each copy of the host copy engine's batches (ckpt/copy.h), where an
 *            error kind fails that copy and the rest of its batch, and hang holds it;
 *            stage: each new staging region of the snapshot engine (ckpt/), where an
 *            error kind makes its mapping fail)
 *     N     the 0-based index of that operation in this process, or * for every one
 *     KIND  eio|enospc|einval|eperm|short|crash|hang|powerloss
 *   RK_FAULT_PATH=substring   only operations on paths containing it are counted and
 *                             faulted (operations without a path never are, then).
 *   RK_FAULT_HOLD=FILE        hang lasts while FILE exists (see below).
 *   RK_FAULT_POWER=DIR        record what is durable, for the power-loss model below.
 * A bad RK_FAULT is logged once (RK_LOG_ERROR) and injects nothing; it never crashes.
 * The environment is read at first use; fmt_fault_reset() reads it again.
 *
 * Meaning of the injected kinds in the wrappers below:
 *   -EIO, -ENOSPC, ...  the operation does nothing and fails with that code;
 *   FMT_FAULT_SHORT     a write (read) transfers the first half of the bytes, and the rest
 *                       fails with -EIO, as a device that fails part-way does;
 *   FMT_FAULT_CRASH     the process kills itself with SIGKILL before the operation;
 *   FMT_FAULT_HANG      the operation does not complete: the calling thread waits, as
 *                       on a disk (or a network file system) that stopped answering,
 *                       until the process ends, or, with RK_FAULT_HOLD=FILE, until FILE
 *                       no longer exists; then the operation goes ahead. Tests of every
 *                       bound on a waiting disk use it.
 *   FMT_FAULT_POWER     the machine loses power before the operation: with
 *                       RK_FAULT_POWER=DIR, "power lost" is noted in DIR (every other
 *                       process sharing DIR SIGKILLs itself at its next operation) and the
 *                       process SIGKILLs itself; without it, the same as crash.
 *
 * The power-loss model (fio_power.c; docs/DESIGN.md "Crash model"). With RK_FAULT_POWER=DIR
 * every process appends to DIR/journal what it made durable: a file's bytes at each
 * fsync/fdatasync (a copy of the file, keyed by inode), a directory's entries at each fsync
 * of the directory (name -> inode), and each inode it removes (unlink, rmdir: the inode
 * number may come back for a new file). After the job is dead, fmt_power_rebuild builds the
 * tree a disk would hold after the power loss: from the root's last durable entries down,
 * each file with its last durable bytes (empty if it never had any); everything else is
 * lost. fmt_power_drop_data keeps every name (as if all metadata had reached the journal)
 * but drops every byte not fsync'd: the model of a file system that orders metadata only.
 */
#ifndef RK_FMT_FIO_H
#define RK_FMT_FIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum fmt_op {
    FMT_OP_OPEN,
    FMT_OP_WRITE,
    FMT_OP_READ,
    FMT_OP_SYNC,
    FMT_OP_TRUNCATE,
    FMT_OP_RENAME,
    FMT_OP_SYNCDIR,
    FMT_OP_UNLINK,
    FMT_OP_DIRECT, /* "odirect": open with O_DIRECT (EINVAL: the file system refuses it) */
    FMT_OP_URING,  /* "uring": io_uring setup (EPERM: refused, e.g. by seccomp), or a
                      submission of the checkpoint reader's reads (fmt_readdirect.c) */
    FMT_OP_REBUILD, /* "rebuild": the ring's rebuild (fmt_fault_point); not counted by "any" */
    FMT_OP_LIST,   /* "list": opening and reading a directory (EACCES, an unmounted share) */
    FMT_OP_SWAP,   /* "swap": renameat2 RENAME_EXCHANGE of two directories */
    FMT_OP_PROGRESS, /* "progress": a test of a ring transfer, inside the MPI call (fmt_fault_point) */
    FMT_OP_MKDIR,  /* "mkdir": creating a directory */
    FMT_OP_ROLLBACK, /* "rollback": a member's part of a rollback from memory (fmt_fault_fail) */
    FMT_OP_ALLREDUCE, /* "allreduce": a call of rk_allreduce, on entry (fmt_fault_point: crash) */
    FMT_OP_COPY,   /* "copy": one copy of the host copy engine's batch (fmt_fault_fail) */
    FMT_OP_STAGE,  /* "stage": mapping a snapshot's staging region (ckpt/, fmt_fault_fail) */
    FMT_OP_COUNT
};

#define FMT_FAULT_SHORT (-100000) /* inject a short write/read (half the length) */
#define FMT_FAULT_CRASH (-100001) /* the caller must raise(SIGKILL) on itself now */
#define FMT_FAULT_HANG (-100002)  /* the operation never returns (a disk that stopped) */
#define FMT_FAULT_POWER (-100003) /* the machine loses power now (RK_FAULT_POWER) */

/* 0: go ahead; otherwise the fault to inject for this operation: -EIO, -ENOSPC, ...,
   FMT_FAULT_SHORT or FMT_FAULT_CRASH. Counts operations per process (thread-safe). */
int fmt_fault(enum fmt_op op, const char *path);
/* Re-reads RK_FAULT / RK_FAULT_PATH and zeroes the counters. Returns 0, or RK_E_OPTION
   if RK_FAULT could not be parsed (then no fault is injected; logged once). */
int fmt_fault_reset(void);
/* How many operations of that kind were counted since start or the last reset. */
uint64_t fmt_fault_count(enum fmt_op op);
/* "write", "sync", ...; NULL out of range. */
const char *fmt_op_name(enum fmt_op op);

/* POSIX wrappers that consult fmt_fault, retry EINTR and partial transfers, and return
   0 or -errno. path names the file in fault filtering (and nowhere else). */
int fmt_io_open(const char *path, int flags, mode_t mode); /* fd >= 0, or -errno */
int fmt_io_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *path);
int fmt_io_pread_all(int fd, void *buf, size_t len, off_t off, const char *path); /* -EIO on EOF */
int fmt_io_fsync(int fd, const char *path);          /* fdatasync */
int fmt_io_ftruncate(int fd, off_t len, const char *path);
int fmt_io_fsync_dir(const char *dir);
int fmt_io_unlink(const char *path);
int fmt_io_rmdir(const char *path);                  /* counted as "unlink" */
/* fmt_io_rename and fmt_io_mkdir are in fmt.h (ckpt/ renames and creates directories). */
/* Exchanges the names of a and b (both exist) atomically: renameat2 RENAME_EXCHANGE.
   -EINVAL / -ENOSYS where the file system or kernel cannot; FMT_FAULT_CRASH -> SIGKILL. */
int fmt_io_exchange(const char *a, const char *b);

/* Applies an injected fault code for an operation that cannot be short: CRASH and POWER
   kill the process, HANG never returns, SHORT becomes -EIO, anything else is returned as is. */
int fmt_fault_apply(int fault);

/* ---- the power-loss model (fio_power.c), active only with RK_FAULT_POWER=DIR ---------- */
/* The hooks of the wrappers: fd (path) was fsync'd; dir was fsync'd; path is about to be
   removed; before every operation (SIGKILLs the process if power was lost); the cut. */
void fio_power_synced(int fd, const char *path);
void fio_power_synced_dir(const char *dir);
void fio_power_removing(const char *path);
void fio_power_check(void);
void fio_power_cut(void);
/* For tests, after every process that used DIR (logdir) is dead. Everything under root now
   counts as durable (recorded in logdir), as on a disk at rest: */
int fmt_power_baseline(const char *root, const char *logdir);
/* The durable image of root per logdir, built in the new directory out: */
int fmt_power_rebuild(const char *root, const char *logdir, const char *out);
/* In place: every file under root keeps its name, its bytes go back to the last durable
   ones (empty if none): */
int fmt_power_drop_data(const char *root, const char *logdir);

#endif
