/*
 * formats/fio.c - fault-injectable POSIX file operations (RK_FAULT: common/common.h, the
 * table in common/fault.c); each records itself for fmt_io_activity_describe and checks
 * the power-loss model (fio_power.c) first.
 */
#include "fio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fmt.h"

#define FIO_CHUNK ((size_t)1 << 30)   /* the most one read/write syscall is asked for */

static _Thread_local fmt_io_activity *fio_watch; /* the calling thread's record, if any */

void fmt_io_watch(fmt_io_activity *a)
{
    if (a && !a->init) {
        pthread_mutex_init(&a->mu, NULL);
        a->init = true;
    }
    fio_watch = a;
}

void fmt_io_activity_fini(fmt_io_activity *a)
{
    if (a && a->init) {
        pthread_mutex_destroy(&a->mu);
        a->init = false;
    }
}

/* Records, for another thread to read, the operation the calling thread starts now. */
static void note_activity(enum rk__fault_op op, const char *path)
{
    fmt_io_activity *a = fio_watch;
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->op = op;
    a->since_ns = rk__mono_ns();
    snprintf(a->path, sizeof(a->path), "%s", path ? path : "-");
    a->count++;
    pthread_mutex_unlock(&a->mu);
}

bool fmt_io_activity_describe(fmt_io_activity *a, char *buf, size_t cap)
{
    if (!a || !a->init)
        return false;
    pthread_mutex_lock(&a->mu);
    bool any = a->count > 0;
    if (any)
        snprintf(buf, cap, "%s of %s, started %.0f ms ago", rk__fault_op_name((enum rk__fault_op)a->op), a->path, rk__ms_since(a->since_ns));
    pthread_mutex_unlock(&a->mu);
    return any;
}

int fmt_fault(enum rk__fault_op op, const char *path)
{
    if (rk__fault_is_file_op(op)) {
        fio_power_check();
        note_activity(op, path);
    }
    return rk__fault(op, path);
}

int fmt_fault_apply(int fault)
{
    if (fault == RK_FAULT_POWER)
        fio_power_cut();
    return rk__fault_apply(fault);
}

int fmt_io_open(const char *path, int flags, mode_t mode)
{
    int f = fmt_fault((flags & O_DIRECT) ? RK_FAULT_OP_DIRECT : RK_FAULT_OP_OPEN, path);
    if (f)
        return fmt_fault_apply(f);
    int fd;
    do
        fd = open(path, flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

/* One loop for both directions: len bytes at off, partial transfers continued. */
static int xfer_all(bool wr, int fd, void *buf, size_t len, off_t off, const char *path)
{
    int f = fmt_fault(wr ? RK_FAULT_OP_WRITE : RK_FAULT_OP_READ, path);
    bool short_fault = f == RK_FAULT_SHORT;
    if (f && !short_fault)
        return fmt_fault_apply(f);
    size_t want = short_fault ? len / 2 : len;
    char *p = buf;
    while (want > 0) {
        size_t n = want < FIO_CHUNK ? want : FIO_CHUNK;
        ssize_t r = wr ? pwrite(fd, p, n, off) : pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return wr ? -ENOSPC : -EIO;
        p += r;
        off += r;
        want -= (size_t)r;
    }
    return short_fault ? -EIO : 0;
}

int fmt_io_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *path)
{
    return xfer_all(true, fd, (void *)buf, len, off, path);
}

int fmt_io_pread_all(int fd, void *buf, size_t len, off_t off, const char *path)
{
    return xfer_all(false, fd, buf, len, off, path);
}

int fmt_io_fsync(int fd, const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_SYNC, path);
    if (f)
        return fmt_fault_apply(f);
    int rc;
    do
        rc = fdatasync(fd);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return -errno;
    fio_power_synced(fd, path);
    return 0;
}

int fmt_io_ftruncate(int fd, off_t len, const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_TRUNCATE, path);
    if (f)
        return fmt_fault_apply(f);
    int rc;
    do
        rc = ftruncate(fd, len);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int fmt_io_fallocate(int fd, off_t len, const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_TRUNCATE, path);
    if (f)
        return fmt_fault_apply(f);
    int rc;
    do
        rc = fallocate(fd, 0, 0, len);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int fmt_io_rename(const char *from, const char *to)
{
    int f = fmt_fault(RK_FAULT_OP_RENAME, to);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(to); /* the inode it replaces, if any, goes */
    return rename(from, to) < 0 ? -errno : 0;
}

int fmt_io_mkdir(const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_MKDIR, path);
    if (f)
        return fmt_fault_apply(f);
    return mkdir(path, 0755) < 0 ? -errno : 0;
}

int fmt_io_fsync_dir(const char *dir)
{
    int f = fmt_fault(RK_FAULT_OP_SYNCDIR, dir);
    if (f)
        return fmt_fault_apply(f);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc;
    do
        rc = fsync(fd);
    while (rc < 0 && errno == EINTR);
    rc = rc < 0 ? -errno : 0;
    close(fd);
    if (rc == 0)
        fio_power_synced_dir(dir);
    return rc;
}

int fmt_io_unlink(const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_UNLINK, path);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(path);
    return unlink(path) < 0 ? -errno : 0;
}

int fmt_io_rmdir(const char *path)
{
    int f = fmt_fault(RK_FAULT_OP_UNLINK, path);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(path);
    return rmdir(path) < 0 ? -errno : 0;
}

int fmt_io_exchange(const char *a, const char *b)
{
    int f = fmt_fault(RK_FAULT_OP_SWAP, b);
    if (f)
        return fmt_fault_apply(f);
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) < 0 ? -errno : 0;
}

int fmt_list_dir(const char *dir, int (*fn)(void *arg, const char *name), void *arg)
{
    int f = fmt_fault(RK_FAULT_OP_LIST, dir);
    if (f) {
        f = fmt_fault_apply(f);
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, f, "cannot list %s: %s", dir, strerror(-f));
    }
    DIR *d = opendir(dir);
    if (!d)
        return rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -errno, "cannot list %s: %s", dir, strerror(errno));
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno)
                rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, -errno, "cannot list %s: %s", dir, strerror(errno));
            break;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if ((rc = fn(arg, e->d_name)) != 0)
            break;
    }
    closedir(d);
    return rc;
}
