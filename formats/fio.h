/*
 * formats/fio.h - every file operation of a checkpoint goes through here, so that tests
 * and the chaos harness can inject faults (short writes, EIO, ENOSPC, a failing fsync,
 * a crash before rename). Private to formats/ (only the .c files of formats/ include it).
 *
 * RK_FAULT itself (its syntax, the table, the counters, a hang) is common/'s (fault.c,
 * common.h); a file operation adds, through fmt_fault, the record of the thread's last
 * operation (fmt_io_watch) and the power-loss model:
 *   RK_FAULT_POWER (the kind powerloss): the machine loses power before the operation:
 *                       with RK_FAULT_POWER=DIR, "power lost" is noted in DIR (every
 *                       other process sharing DIR SIGKILLs itself at its next operation)
 *                       and the process SIGKILLs itself; without it, the same as crash.
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

#include "common.h"

/* Before the file operation `op` on path: the power-loss model's check, the record of the
   operation, then rk__fault (common.h): 0, or the fault to inject (a hang was served). */
int fmt_fault(enum rk__fault_op op, const char *path);

/* POSIX wrappers that consult fmt_fault, retry EINTR and partial transfers, and return
   0 or -errno. path names the file in fault filtering (and nowhere else). */
int fmt_io_open(const char *path, int flags, mode_t mode); /* fd >= 0, or -errno */
int fmt_io_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *path);
int fmt_io_pread_all(int fd, void *buf, size_t len, off_t off, const char *path); /* -EIO on EOF */
int fmt_io_fsync(int fd, const char *path);          /* fdatasync */
int fmt_io_ftruncate(int fd, off_t len, const char *path);
/* fallocate(fd, 0, 0, len): the blocks of [0, len) allocated and the size at least len;
   counted and faulted as "truncate" (both size a file). -EOPNOTSUPP where the file system
   cannot (the caller sizes the file another way). */
int fmt_io_fallocate(int fd, off_t len, const char *path);
int fmt_io_fsync_dir(const char *dir);
int fmt_io_unlink(const char *path);
int fmt_io_rmdir(const char *path);                  /* counted as "unlink" */
/* fmt_io_rename and fmt_io_mkdir are in fmt.h (ckpt/ renames and creates directories). */
/* Exchanges the names of a and b (both exist) atomically: renameat2 RENAME_EXCHANGE.
   -EINVAL / -ENOSYS where the file system or kernel cannot; RK_FAULT_CRASH -> SIGKILL. */
int fmt_io_exchange(const char *a, const char *b);

/* Applies an injected fault code for an operation that cannot be short: POWER cuts the
   power (fio_power_cut) and kills the process, the rest as rk__fault_apply. */
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
