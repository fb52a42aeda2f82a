/*
 * formats/fio.c - fault-injectable POSIX file operations (see fio.h for the RK_FAULT
 * syntax). The fault table is per process by nature (it is configured by the process's
 * environment); it is parsed once under a mutex and the counters are atomics, so any
 * thread may call fmt_fault.
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

#define FIO_MAX_RULES 32
#define FIO_ANY FMT_OP_COUNT          /* the "any" operation: a counter of its own */
#define FIO_CHUNK ((size_t)1 << 30)   /* the most one read/write syscall is asked for */

struct fio_rule {
    int op;        /* enum fmt_op, or FIO_ANY */
    int64_t index; /* -1: every one */
    int fault;     /* -errno, FMT_FAULT_SHORT or FMT_FAULT_CRASH */
};

static const char *const op_names[FMT_OP_COUNT + 1] = {
    [FMT_OP_OPEN] = "open",         [FMT_OP_WRITE] = "write",     [FMT_OP_READ] = "read",
    [FMT_OP_SYNC] = "sync",         [FMT_OP_TRUNCATE] = "truncate", [FMT_OP_RENAME] = "rename",
    [FMT_OP_SYNCDIR] = "syncdir",   [FMT_OP_UNLINK] = "unlink",   [FMT_OP_DIRECT] = "odirect",
    [FMT_OP_URING] = "uring",       [FMT_OP_REBUILD] = "rebuild", [FMT_OP_LIST] = "list",
    [FMT_OP_SWAP] = "swap",         [FMT_OP_MKDIR] = "mkdir",     [FMT_OP_PROGRESS] = "progress",
    [FMT_OP_ROLLBACK] = "rollback", [FMT_OP_ALLREDUCE] = "allreduce", [FMT_OP_COPY] = "copy",
    [FMT_OP_STAGE] = "stage",       [FIO_ANY] = "any",
};

static const struct {
    const char *name;
    int fault;
} kinds[] = {
    {"eio", -EIO},     {"enospc", -ENOSPC},         {"einval", -EINVAL},
    {"eperm", -EPERM}, {"short", FMT_FAULT_SHORT}, {"crash", FMT_FAULT_CRASH},
    {"hang", FMT_FAULT_HANG}, {"powerloss", FMT_FAULT_POWER},
};

static pthread_mutex_t fio_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool fio_loaded;
static struct fio_rule fio_rules[FIO_MAX_RULES];
static int fio_nrules;
static char fio_path_filter[256];
static atomic_uint_fast64_t fio_counts[FMT_OP_COUNT + 1];
static _Thread_local fmt_io_activity *fio_watch; /* the calling thread's record, if any */

const char *fmt_op_name(enum fmt_op op)
{
    return (op >= 0 && op < FMT_OP_COUNT) ? op_names[op] : NULL;
}

/* Parses one "OP@N=KIND" of length len into *r; 0 or -EINVAL. */
static int parse_rule(const char *s, size_t len, struct fio_rule *r)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return -EINVAL;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *at = strchr(buf, '@'), *eq = at ? strchr(at, '=') : NULL;
    if (!at || !eq)
        return -EINVAL;
    *at = '\0';
    *eq = '\0';
    r->op = -1;
    for (int i = 0; i <= FIO_ANY; i++)
        if (strcmp(buf, op_names[i]) == 0)
            r->op = i;
    if (r->op < 0)
        return -EINVAL;
    if (strcmp(at + 1, "*") == 0) {
        r->index = -1;
    } else {
        long v;
        if (rk__parse_int(at + 1, 0, INT32_MAX, &v, NULL) != 0 || at[1] == '+' || at[1] == '-')
            return -EINVAL;
        r->index = v;
    }
    r->fault = 0;
    for (size_t i = 0; i < RK_ARRAY_LEN(kinds); i++)
        if (strcmp(eq + 1, kinds[i].name) == 0)
            r->fault = kinds[i].fault;
    return r->fault ? 0 : -EINVAL;
}

/* Reads the environment into the table; called with fio_lock held. */
static int load_locked(void)
{
    int rc = 0;
    fio_nrules = 0;
    fio_path_filter[0] = '\0';
    const char *pf = getenv("RK_FAULT_PATH");
    if (pf)
        snprintf(fio_path_filter, sizeof fio_path_filter, "%s", pf);
    const char *spec = getenv("RK_FAULT");
    if (spec && *spec) {
        const char *p = spec;
        while (*p) {
            size_t len = strcspn(p, ",");
            if (fio_nrules == FIO_MAX_RULES || parse_rule(p, len, &fio_rules[fio_nrules]) != 0) {
                rc = rk__fail(RK_SUB_FMT, RK_LOG_ERROR, RK_E_OPTION,
                              "RK_FAULT='%s': cannot parse '%.*s' (want OP@N=KIND, at most %d): "
                              "no fault will be injected", spec, (int)len, p, FIO_MAX_RULES);
                fio_nrules = 0;
                break;
            }
            fio_nrules++;
            p += len;
            if (*p == ',')
                p++;
        }
    }
    for (int i = 0; i <= FIO_ANY; i++)
        atomic_store(&fio_counts[i], 0);
    atomic_store(&fio_loaded, true);
    return rc;
}

int fmt_fault_reset(void)
{
    pthread_mutex_lock(&fio_lock);
    int rc = load_locked();
    pthread_mutex_unlock(&fio_lock);
    return rc;
}

static void ensure_loaded(void)
{
    if (atomic_load(&fio_loaded))
        return;
    pthread_mutex_lock(&fio_lock);
    if (!atomic_load(&fio_loaded))
        load_locked();
    pthread_mutex_unlock(&fio_lock);
}

uint64_t fmt_fault_count(enum fmt_op op)
{
    ensure_loaded();
    return (op >= 0 && op < FMT_OP_COUNT) ? atomic_load(&fio_counts[op]) : 0;
}

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
static void note_activity(enum fmt_op op, const char *path)
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
        snprintf(buf, cap, "%s of %s, started %.0f ms ago", op_names[a->op], a->path, rk__ms_since(a->since_ns));
    pthread_mutex_unlock(&a->mu);
    return any;
}

/* A disk that stopped answering: the operation does not start until RK_FAULT_HOLD's file
   is removed (never, without RK_FAULT_HOLD). */
static void hold(enum fmt_op op, const char *path)
{
    const char *file = getenv("RK_FAULT_HOLD");
    RK_LOG_WARN(RK_SUB_FMT, "RK_FAULT: %s of %s hangs %s%s", op_names[op], path ? path : "-",
                file ? "until this file is removed: " : "until the process ends", file ? file : "");
    while (!file || access(file, F_OK) == 0)
        rk__sleep_ns(5 * 1000000LL);
}

int fmt_fault(enum fmt_op op, const char *path)
{
    if (op < 0 || op >= FMT_OP_COUNT)
        return 0;
    bool file_op = op != FMT_OP_REBUILD && op != FMT_OP_PROGRESS && op != FMT_OP_ROLLBACK && op != FMT_OP_ALLREDUCE &&
                   op != FMT_OP_COPY && op != FMT_OP_STAGE;
    if (file_op) {
        fio_power_check();
        note_activity(op, path);
    }
    ensure_loaded();
    if (fio_path_filter[0] && (!path || !strstr(path, fio_path_filter)))
        return 0;
    int64_t n = (int64_t)atomic_fetch_add(&fio_counts[op], 1);
    int64_t n_any = file_op ? (int64_t)atomic_fetch_add(&fio_counts[FIO_ANY], 1) : -1;
    for (int i = 0; i < fio_nrules; i++) {
        const struct fio_rule *r = &fio_rules[i];
        int64_t idx = r->op == FIO_ANY ? n_any : n;
        if ((r->op == (int)op || (r->op == FIO_ANY && file_op)) && (r->index < 0 || r->index == idx)) {
            RK_LOG_INFO(RK_SUB_FMT, "RK_FAULT: injecting %d into %s #%lld of %s", r->fault,
                        op_names[op], (long long)n, path ? path : "-");
            if (r->fault == FMT_FAULT_HANG) {
                hold(op, path);
                return 0; /* released: the operation goes ahead */
            }
            return r->fault;
        }
    }
    return 0;
}

int fmt_fault_apply(int fault)
{
    if (fault == FMT_FAULT_CRASH || fault == FMT_FAULT_POWER) {
        if (fault == FMT_FAULT_POWER)
            fio_power_cut();
        raise(SIGKILL);
        return -EINTR; /* not reached */
    }
    if (fault == FMT_FAULT_HANG)
        return -EIO; /* not reached: fmt_fault holds the operation until it is released */
    return fault == FMT_FAULT_SHORT ? -EIO : fault;
}

void fmt_fault_point(const char *op)
{
    ensure_loaded();
    if (fio_nrules == 0)
        return; /* the common case, on the ring's hot path: nothing asked for */
    for (int i = 0; i < FMT_OP_COUNT; i++)
        if (strcmp(op, op_names[i]) == 0 && fmt_fault((enum fmt_op)i, NULL) == FMT_FAULT_CRASH)
            fmt_fault_apply(FMT_FAULT_CRASH);
}

int fmt_fault_fail(const char *op)
{
    ensure_loaded();
    if (fio_nrules == 0)
        return 0;
    for (int i = 0; i < FMT_OP_COUNT; i++)
        if (strcmp(op, op_names[i]) == 0) {
            int f = fmt_fault((enum fmt_op)i, NULL);
            return f ? fmt_fault_apply(f) : 0;
        }
    return 0;
}

int fmt_io_open(const char *path, int flags, mode_t mode)
{
    int f = fmt_fault((flags & O_DIRECT) ? FMT_OP_DIRECT : FMT_OP_OPEN, path);
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
    int f = fmt_fault(wr ? FMT_OP_WRITE : FMT_OP_READ, path);
    bool short_fault = f == FMT_FAULT_SHORT;
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
    int f = fmt_fault(FMT_OP_SYNC, path);
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
    int f = fmt_fault(FMT_OP_TRUNCATE, path);
    if (f)
        return fmt_fault_apply(f);
    int rc;
    do
        rc = ftruncate(fd, len);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int fmt_io_rename(const char *from, const char *to)
{
    int f = fmt_fault(FMT_OP_RENAME, to);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(to); /* the inode it replaces, if any, goes */
    return rename(from, to) < 0 ? -errno : 0;
}

int fmt_io_mkdir(const char *path)
{
    int f = fmt_fault(FMT_OP_MKDIR, path);
    if (f)
        return fmt_fault_apply(f);
    return mkdir(path, 0755) < 0 ? -errno : 0;
}

int fmt_io_fsync_dir(const char *dir)
{
    int f = fmt_fault(FMT_OP_SYNCDIR, dir);
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
    int f = fmt_fault(FMT_OP_UNLINK, path);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(path);
    return unlink(path) < 0 ? -errno : 0;
}

int fmt_io_rmdir(const char *path)
{
    int f = fmt_fault(FMT_OP_UNLINK, path);
    if (f)
        return fmt_fault_apply(f);
    fio_power_removing(path);
    return rmdir(path) < 0 ? -errno : 0;
}

int fmt_io_exchange(const char *a, const char *b)
{
    int f = fmt_fault(FMT_OP_SWAP, b);
    if (f)
        return fmt_fault_apply(f);
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) < 0 ? -errno : 0;
}

int fmt_list_dir(const char *dir, int (*fn)(void *arg, const char *name), void *arg)
{
    int f = fmt_fault(FMT_OP_LIST, dir);
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
