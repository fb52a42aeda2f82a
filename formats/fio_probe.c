/*
 * formats/fio_probe.c - RK_IO=auto: the checkpoint directory's device measured, both ways
 * the driver writes (vfd_uring.c: io_uring + O_DIRECT, and the buffered path), and the
 * faster way chosen; the measurement kept per device and measured again when stale.
 *
 * The probe writes PROBE_MIB through the driver itself, one dataset into a new HDF5 file
 * in the directory the shard goes to (named '.rekindle-io-probe-<pid>-<tid>.h5', removed
 * at once; a crash leaves it inside the attempt's '.tmp-step-…' directory, which the next
 * start removes), each way PROBE_ROUNDS times alternately, preallocated as the shards are;
 * a way's figure is its best round, from open to the end of its fdatasync. It runs on the
 * thread that writes the shard (the checkpoint writer: never the training thread), at the
 * first checkpoint of a device, and costs PROBE_ROUNDS x 2 x PROBE_MIB of writes.
 *
 * Where it is kept: $XDG_CACHE_HOME/rekindle/io-<major>-<minor> (default ~/.cache), one
 * small text file per device id, so that every checkpoint directory of the device shares
 * it (a job's or a test's new directory does not measure again):
 *   rekindle-io 1
 *   fs <statfs f_type hex> <f_fsid hex>
 *   kernel <uname -r>
 *   time <unix seconds>
 *   direct <GB/s> <io_path of that way>
 *   buffered <GB/s>
 *   choice uring|buffered
 *
 * Invariants (tests/test_write.c names them):
 *  P1  The choice is uring unless the buffered way measured more than PROBE_MARGIN faster
 *      (O_DIRECT keeps the job's page cache; a tie is not worth giving it up); a probe that
 *      failed (a fault, ENOSPC) chooses uring, is logged as a warning, and is not kept.
 *      "uring" is the driver's own default way (FMT_IO_AUTO: io_uring + O_DIRECT, falling
 *      back loudly where either is refused), both when measured and when written: a
 *      refused io_uring never fails a checkpoint (the kept direct_path names what ran).
 *  P2  A kept measurement is used only while fresh: younger than PROBE_TTL_S and not from
 *      the future, of the same file system on the device (f_type and f_fsid: another disk
 *      or a new mkfs under the same device number measures again) and the same kernel.
 *  P3  The cache is never followed through a link and never taken from another user: the
 *      directory and the file are opened with O_NOFOLLOW and must be owned by the process's
 *      effective user and closed to group and other writes; a refused one is logged (once
 *      per process and device), measured anyway and not written.
 *  P4  One process of a device measures at a time (an exclusive flock on the cache file,
 *      waited for at most PROBE_LOCK_MS): ranks that share a disk do not measure it against
 *      each other, and the others read what it kept. Past the bound: uring, not kept.
 *  P5  RK_IO=uring and RK_IO=buffered never measure, read or write the cache.
 *  P6  Within a process a device is measured or read once per PROBE_TTL_S at most (a
 *      table in memory): later checkpoints read the cache file again only to see that it
 *      is still there and fresh; nothing is logged again.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "fio.h"
#include "fmt.h"
#include "vfd_uring.h"

#define PROBE_MIB     ((size_t)64)
#define PROBE_ROUNDS  2
#define PROBE_MARGIN  1.10            /* P1 */
#define PROBE_TTL_S   (7 * 24 * 3600) /* P2 */
#define PROBE_LOCK_MS 60000           /* P4 */
#define PROBE_MAGIC   "rekindle-io 1"
#define PROBE_MEMO    8

struct probe_key {
    dev_t dev;
    unsigned long fstype;
    uint64_t fsid;
    char kernel[65];
};

/* P6: what this process knows of a device. */
static struct memo {
    bool used;
    struct probe_key k;
    fmt_io_probe p;
    int64_t at; /* CLOCK_MONOTONIC ns */
} memo[PROBE_MEMO];
static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;

static int key_of(const char *dir, struct probe_key *k)
{
    struct stat sb;
    struct statfs fs;
    struct utsname u;
    if (stat(dir, &sb) != 0 || statfs(dir, &fs) != 0)
        return -errno;
    memset(k, 0, sizeof(*k));
    k->dev = sb.st_dev;
    k->fstype = (unsigned long)fs.f_type;
    memcpy(&k->fsid, &fs.f_fsid, sizeof(k->fsid) < sizeof(fs.f_fsid) ? sizeof(k->fsid) : sizeof(fs.f_fsid));
    if (uname(&u) == 0)
        snprintf(k->kernel, sizeof(k->kernel), "%s", u.release);
    return 0;
}

static bool same_key(const struct probe_key *a, const struct probe_key *b)
{
    return a->dev == b->dev && a->fstype == b->fstype && a->fsid == b->fsid &&
           strcmp(a->kernel, b->kernel) == 0;
}

static struct memo *memo_find(const struct probe_key *k)
{
    for (int i = 0; i < PROBE_MEMO; i++)
        if (memo[i].used && same_key(&memo[i].k, k))
            return &memo[i];
    return NULL;
}

static void memo_put(const struct probe_key *k, const fmt_io_probe *p)
{
    pthread_mutex_lock(&memo_mu);
    struct memo *m = memo_find(k);
    for (int i = 0; !m && i < PROBE_MEMO; i++)
        if (!memo[i].used)
            m = &memo[i];
    if (!m)
        m = &memo[0];
    *m = (struct memo){.used = true, .k = *k, .p = *p, .at = rk__mono_ns()};
    pthread_mutex_unlock(&memo_mu);
}

/* ---- the measurement ----------------------------------------------------------------------- */

/* One way, once: GB/s from the file's create to the end of its close (its fdatasync), or
   -errno. io_path gets the driver's path. */
static double probe_once(const char *dir, enum fmt_io_mode mode, void *buf, size_t n, int *err, char *io_path)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/.rekindle-io-probe-%d-%d.h5", dir, (int)getpid(), (int)gettid());
    fmt_vfd_stats st;
    memset(&st, 0, sizeof(st));
    fmt_vfd_opts o = {.mode = mode, .zero_copy = true, .stats = &st, .prealloc = n + ((uint64_t)2 << 20)};
    hid_t fapl = fmt_vfd_fapl(&o), dcpl = H5Pcreate(H5P_DATASET_CREATE), sp = -1, ds = -1, f = -1;
    hsize_t dim = n;
    double gbs = 0;
    *err = RK_E_HDF5;
    if (fapl < 0 || dcpl < 0 || H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
        H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 || (sp = H5Screate_simple(1, &dim, NULL)) < 0)
        goto out;
    int64_t t0 = rk__mono_ns();
    f = H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f < 0) {
        *err = errno ? -errno : RK_E_HDF5;
        goto out;
    }
    ds = H5Dcreate2(f, "probe", H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    bool wrote = ds >= 0 && H5Dwrite(ds, H5T_STD_U8LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    if (ds >= 0)
        H5Dclose(ds);
    int rc = fmt_vfd_close(&f);
    double s = (double)(rk__mono_ns() - t0) / 1e9;
    fmt_io_unlink(path);
    if (rc == 0 && !wrote)
        rc = RK_E_HDF5;
    *err = rc ? (st.error ? st.error : rc) : 0;
    if (rc == 0) {
        gbs = (double)n / 1e9 / (s > 1e-9 ? s : 1e-9);
        memcpy(io_path, st.io_path, sizeof(st.io_path));
    }
out:
    if (sp >= 0)
        H5Sclose(sp);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (fapl >= 0)
        H5Pclose(fapl);
    return gbs;
}

/* Both ways, alternately (P1). 0, or the first failure (-errno). */
static int measure(const char *dir, fmt_io_probe *p)
{
    size_t n = PROBE_MIB << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, n) != 0)
        return -ENOMEM;
    memset(buf, 0x5a, n);
    int rc = 0;
    for (int r = 0; r < PROBE_ROUNDS && !rc; r++)
        for (int w = 0; w < 2 && !rc; w++) {
            bool direct = (r + w) % 2 == 0; /* D B, then B D */
            char io_path[sizeof(p->direct_path)] = "";
            double g = probe_once(dir, direct ? FMT_IO_AUTO : FMT_IO_BUFFERED, buf, n, &rc, io_path);
            double *best = direct ? &p->direct_gbs : &p->buffered_gbs;
            if (!rc && g > *best)
                *best = g;
            if (!rc && direct)
                snprintf(p->direct_path, sizeof(p->direct_path), "%s", io_path);
        }
    free(buf);
    p->mode = p->buffered_gbs > p->direct_gbs * PROBE_MARGIN ? FMT_IO_BUFFERED : FMT_IO_URING;
    p->measured = true;
    return rc;
}

/* ---- the cache file ------------------------------------------------------------------------ */

/* P3: an fd is ours to trust: a directory or regular file (as asked) of the effective user,
   closed to group and other writes. NULL, or why not. */
static const char *untrusted(int fd, bool dir)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return "cannot be examined";
    if (dir ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode))
        return dir ? "not a directory" : "not a regular file";
    if (sb.st_uid != geteuid())
        return "owned by another user";
    if (sb.st_mode & (S_IWGRP | S_IWOTH))
        return "open to group or other writes";
    return NULL;
}

/* The cache file of key k, opened read-write (created 0600), P3. -errno or the fd; *why
   says why it was refused (a link, another user's), logged by the caller. */
static int cache_open(const struct probe_key *k, char *path, size_t cap, const char **why)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char top[4096];
    *why = NULL;
    if (xdg && xdg[0] == '/')
        snprintf(top, sizeof(top), "%s", xdg);
    else if (home && home[0] == '/')
        snprintf(top, sizeof(top), "%s/.cache", home);
    else
        return -ENOENT;
    int len = snprintf(path, cap, "%s/rekindle", top);
    if (len < 0 || (size_t)len + 32 >= cap)
        return -ENAMETOOLONG;
    mkdir(top, 0700);
    mkdir(path, 0700);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        *why = errno == ELOOP || errno == ENOTDIR ? "a symbolic link or not a directory" : NULL;
        return -errno;
    }
    if ((*why = untrusted(dfd, true)) != NULL) {
        close(dfd);
        return -EPERM;
    }
    char name[64];
    snprintf(name, sizeof(name), "io-%u-%u", major(k->dev), minor(k->dev));
    snprintf(path + strlen(path), cap - strlen(path), "/%s", name);
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    int e = errno;
    close(dfd);
    if (fd < 0) {
        *why = e == ELOOP ? "a symbolic link" : NULL;
        return -e;
    }
    if ((*why = untrusted(fd, false)) != NULL) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* P4: the exclusive lock, waited for at most PROBE_LOCK_MS. */
static int cache_lock(int fd)
{
    int64_t deadline = rk__deadline_ns(PROBE_LOCK_MS);
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        if (rk__mono_ns() >= deadline)
            return RK_E_TIMEOUT;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The kept measurement, if fresh for k (P2). */
static bool cache_read(int fd, const struct probe_key *k, fmt_io_probe *p)
{
    char text[1024], kernel[65], choice[16], dpath[48];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    if (n <= 0)
        return false;
    text[n] = '\0';
    unsigned long fstype;
    uint64_t fsid;
    long long t;
    double d, b;
    int used = 0;
    if (sscanf(text,
               PROBE_MAGIC "\nfs %lx %" SCNx64
                           "\nkernel %64s\ntime %lld\ndirect %lf %47s\nbuffered %lf\nchoice %15s\n%n",
               &fstype, &fsid, kernel, &t, &d, dpath, &b, choice, &used) != 8 ||
        used != n)
        return false;
    long long age = (long long)time(NULL) - t;
    if (fstype != k->fstype || fsid != k->fsid || strcmp(kernel, k->kernel) != 0 || age < 0 ||
        age > PROBE_TTL_S || !(d >= 0) || !(b >= 0))
        return false;
    if (strcmp(choice, "uring") != 0 && strcmp(choice, "buffered") != 0)
        return false;
    p->mode = choice[0] == 'u' ? FMT_IO_URING : FMT_IO_BUFFERED;
    p->direct_gbs = d;
    p->buffered_gbs = b;
    snprintf(p->direct_path, sizeof(p->direct_path), "%s", dpath);
    p->age_s = (double)age;
    return true;
}

static void cache_write(int fd, const struct probe_key *k, const fmt_io_probe *p)
{
    char text[1024];
    int n = snprintf(text, sizeof(text),
                     PROBE_MAGIC "\nfs %lx %" PRIx64
                                 "\nkernel %s\ntime %lld\ndirect %.3f %s\nbuffered %.3f\nchoice %s\n",
                     k->fstype, k->fsid, k->kernel[0] ? k->kernel : "unknown", (long long)time(NULL),
                     p->direct_gbs, p->direct_path[0] ? p->direct_path : "none", p->buffered_gbs,
                     p->mode == FMT_IO_BUFFERED ? "buffered" : "uring");
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        RK_LOG_WARN(RK_SUB_FMT, "RK_IO=auto: cannot keep the measurement in %s: %s", p->cache,
                    strerror(errno));
}

/* ---- the choice ---------------------------------------------------------------------------- */

static void log_choice(const char *dir, const struct probe_key *k, const fmt_io_probe *p)
{
    RK_LOG_INFO(RK_SUB_FMT,
                "RK_IO=auto: %s (device %u:%u): O_DIRECT %.2f GB/s (%s), buffered %.2f GB/s: %s (%s%s%s)",
                dir, major(k->dev), minor(k->dev), p->direct_gbs, p->direct_path[0] ? p->direct_path : "none",
                p->buffered_gbs, p->mode == FMT_IO_BUFFERED ? "buffered" : "uring",
                p->measured ? "measured now" : "measured before, kept in ", p->measured ? "" : p->cache,
                p->why[0] ? p->why : "");
}

/* P6: a device this process knows: 1 and *p if it may go on with it (not kept, or the
   cache still holds it fresh), 0 if it must look again. */
static int known(const struct probe_key *k, fmt_io_probe *p)
{
    pthread_mutex_lock(&memo_mu);
    struct memo *m = memo_find(k);
    bool fresh = m && rk__ms_since(m->at) < PROBE_TTL_S * 1000.0;
    if (fresh)
        *p = m->p;
    pthread_mutex_unlock(&memo_mu);
    if (!fresh)
        return 0;
    p->measured = p->first = false;
    if (!p->cache[0])
        return 1; /* refused, or the measurement failed: the process goes on with uring */
    const char *why;
    char cache[sizeof(p->cache)];
    fmt_io_probe again;
    int fd = cache_open(k, cache, sizeof(cache), &why);
    bool same = fd >= 0 && cache_read(fd, k, &again) && again.mode == p->mode;
    if (fd >= 0)
        close(fd);
    return same;
}

int fmt_io_auto(const char *dir, fmt_io_probe *p)
{
    struct probe_key k;
    memset(p, 0, sizeof(*p));
    p->mode = FMT_IO_URING;
    int rc = key_of(dir, &k);
    if (rc) {
        RK_LOG_WARN(RK_SUB_FMT, "RK_IO=auto: %s cannot be examined (%s): uring", dir, strerror(-rc));
        snprintf(p->why, sizeof(p->why), "; %s cannot be examined", dir);
        return 0;
    }
    if (known(&k, p))
        return 0;
    memset(p, 0, sizeof(*p));
    p->mode = FMT_IO_URING;
    p->first = true;
    const char *why = NULL;
    int fd = cache_open(&k, p->cache, sizeof(p->cache), &why);
    if (fd < 0) {
        if (why)
            RK_LOG_WARN(RK_SUB_FMT,
                        "RK_IO=auto: refusing the kept measurement %s: %s; measuring anyway, not kept",
                        p->cache, why);
        snprintf(p->why, sizeof(p->why), "; not kept: %s", why ? why : strerror(-fd));
        p->cache[0] = '\0';
    } else if ((rc = cache_lock(fd)) != 0) {
        RK_LOG_WARN(RK_SUB_FMT,
                    "RK_IO=auto: %s: %s (another process measures the device): uring, not measured", p->cache,
                    rk_strerror(rc));
        snprintf(p->why, sizeof(p->why), "; not measured: the cache stayed locked");
        p->cache[0] = '\0';
        close(fd);
        memo_put(&k, p);
        return 0;
    } else if (cache_read(fd, &k, p)) {
        close(fd); /* kept before, or by the process of the device that held the lock */
        log_choice(dir, &k, p);
        memo_put(&k, p);
        return 0;
    }
    rc = measure(dir, p);
    if (rc) {
        RK_LOG_WARN(RK_SUB_FMT, "RK_IO=auto: measuring %s failed (%s): uring, not kept", dir,
                    rk_strerror(rc));
        p->mode = FMT_IO_URING;
        p->cache[0] = '\0';
        snprintf(p->why, sizeof(p->why), "; the measurement failed: %s", rk_strerror(rc));
    } else if (fd >= 0) {
        cache_write(fd, &k, p);
    }
    if (fd >= 0)
        close(fd); /* the lock goes with it */
    log_choice(dir, &k, p);
    memo_put(&k, p);
    return 0;
}
