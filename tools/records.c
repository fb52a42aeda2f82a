/*
 * tools/records.c - the records of `rekindle run`, read and written: the run's directory
 * (RK_RUN_DIR) and each attempt's (attempt-K), where the workers' wrappers record how
 * their program ended (rank-<R>) and beat (alive-<R>), a spare notes that it joined
 * (joined-<R>, by the library), the launcher asks the wrappers to stop (stop) and a
 * scheduler asks for a discovery (grow, in RK_RUN_DIR). The launcher (tools/cmd_run.c, run_loop.c),
 * its growth (tools/run_grow.c) and the wrapper use nothing else to reach these files.
 *
 * Invariants (tests/test_run_records.c names the one each test checks):
 *  R1. A records directory is used only if it is a directory (not a symbolic link) owned
 *      by this process's user and closed to group and other writes; checked on the open
 *      descriptor (fstat), so what was checked is what is used. The refusal names it.
 *  R2. Every file in it is reached relative to that descriptor (openat, mkdirat, renameat,
 *      unlinkat, fstatat), never through a symbolic link (O_NOFOLLOW,
 *      AT_SYMLINK_NOFOLLOW), and created with O_EXCL: a file planted there is never
 *      written through. An attempt's directory is made fresh (mkdirat, 0700) under the
 *      checked run directory; one left by an earlier run is renamed away and removed
 *      without following a link.
 *  R3. A beat is judged by its content alone (the wrapper writes a counter), on the
 *      reader's monotonic clock: a worker shows a sign of life when the launcher reads
 *      content it had not read before. A file's times, set by another host's clock (and
 *      cached by NFS), say nothing.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

enum { REMOVE_DEPTH = 16, BEAT_TEXT = 1024 };

/* R1: the directory open at fd is ours and closed; why (naming path) when it is not. */
static int check_dir(int fd, const char *path, char *why, size_t cap)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        snprintf(why, cap, "%s: %s", path, strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, cap, "%s is not a directory", path);
        return -ENOTDIR;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, cap, "%s is refused: it is owned by uid %ld, not by this job's user (uid %ld)", path,
                 (long)st.st_uid, (long)geteuid());
        return -EPERM;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, cap, "%s is refused: it is writable by %s (mode %04o; chmod go-w it, or use another)",
                 path, st.st_mode & S_IWOTH ? "others" : "its group", (unsigned)(st.st_mode & 07777));
        return -EPERM;
    }
    return 0;
}

/* Opens name under at (AT_FDCWD: a path) as a records directory: R1. */
static int open_dir(int at, const char *name, const char *path, struct records *d, char *why, size_t cap)
{
    memset(d, 0, sizeof(*d));
    d->fd = -1;
    if (snprintf(d->path, sizeof(d->path), "%s", path) >= (int)sizeof(d->path)) {
        snprintf(why, cap, "%.200s...: path too long", path);
        return -ENAMETOOLONG;
    }
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if ((e == ELOOP || e == ENOTDIR) && fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            snprintf(why, cap, "%s is refused: it is a symbolic link", path);
        else
            snprintf(why, cap, "%s: %s", path, strerror(e));
        return -e;
    }
    int rc = check_dir(fd, path, why, cap);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    d->fd = fd;
    return 0;
}

int rec_open_run(const char *path, bool create, struct records *d, char *why, size_t cap)
{
    if (create && mkdir(path, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        snprintf(why, cap, "%s: %s", path, strerror(e));
        memset(d, 0, sizeof(*d));
        d->fd = -1;
        return -e;
    }
    return open_dir(AT_FDCWD, path, path, d, why, cap);
}

/* Removes name under dfd and all below it, following no link (R2). */
static int remove_at(int dfd, const char *name, int depth)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    if (depth >= REMOVE_DEPTH)
        return -ELOOP;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int r = remove_at(fd, e->d_name, depth + 1);
        rc = rc ? rc : r;
    }
    closedir(dir);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = rc ? rc : -errno;
    return rc;
}

int rec_open_attempt(const struct records *run, int k, int nproc, struct records *d, char *why, size_t cap)
{
    char name[32], path[PATH_MAX + 32];
    snprintf(name, sizeof(name), "attempt-%d", k);
    snprintf(path, sizeof(path), "%s/%s", run->path, name);
    memset(d, 0, sizeof(*d));
    d->fd = -1;
    /* R2: an earlier run's attempt-K is renamed away first, so that what is removed can
       no longer be confused with what is made. */
    char old[64];
    snprintf(old, sizeof(old), ".old-%s.%ld", name, (long)getpid());
    if (renameat(run->fd, name, run->fd, old) == 0) {
        int rc = remove_at(run->fd, old, 0);
        if (rc != 0)
            fprintf(stderr, "rekindle: run: cannot remove the records of an earlier run (%s/%s): %s\n", run->path,
                    old, strerror(-rc));
    } else if (errno != ENOENT) {
        int e = errno;
        snprintf(why, cap, "%s: %s", path, strerror(e));
        return -e;
    }
    if (mkdirat(run->fd, name, 0700) != 0) {
        int e = errno;
        snprintf(why, cap, "%s: %s", path, strerror(e));
        return -e;
    }
    int rc = open_dir(run->fd, name, path, d, why, cap);
    if (rc != 0)
        return rc;
    if (nproc > 0 && !(d->beats = calloc((size_t)nproc, sizeof(*d->beats)))) {
        rec_close(d);
        snprintf(why, cap, "out of memory");
        return -ENOMEM;
    }
    d->nproc = nproc;
    return 0;
}

int rec_open_worker(const char *path, struct records *d, char *why, size_t cap)
{
    memset(d, 0, sizeof(*d));
    d->fd = -1;
    const char *slash = strrchr(path, '/');
    char parent[PATH_MAX];
    if (!slash || !slash[1] || (size_t)(slash - path) >= sizeof(parent)) {
        snprintf(why, cap, "%.200s: not RUN_DIR/attempt-K", path);
        return -EINVAL;
    }
    snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
    if (!parent[0])
        snprintf(parent, sizeof(parent), "/");
    struct records run;
    int rc = open_dir(AT_FDCWD, parent, parent, &run, why, cap);
    if (rc != 0)
        return rc;
    rc = open_dir(run.fd, slash + 1, path, d, why, cap);
    rec_close(&run);
    return rc;
}

void rec_close(struct records *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    free(d->beats);
    d->beats = NULL;
    d->nproc = 0;
}

int rec_remove(struct records *d)
{
    int rc = 0;
    DIR *dir = d->fd >= 0 ? fdopendir(dup(d->fd)) : NULL;
    for (struct dirent *e; dir && (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int r = remove_at(d->fd, e->d_name, 0);
        rc = rc ? rc : r;
    }
    if (dir)
        closedir(dir);
    if (rc == 0 && rmdir(d->path) != 0)
        rc = -errno;
    rec_close(d);
    return rc;
}

/* A new file (R2): what was there is removed, the file made with O_EXCL. fd or -errno. */
static int create_at(const struct records *d, const char *name)
{
    if (unlinkat(d->fd, name, 0) != 0 && errno != ENOENT)
        return -errno;
    int fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    return fd >= 0 ? fd : -errno;
}

int rec_write_end(const struct records *d, const char *rank, const char *text)
{
    char name[48], tmp[48];
    snprintf(name, sizeof(name), "rank-%s", rank);
    snprintf(tmp, sizeof(tmp), ".rank-%s", rank);
    int fd = create_at(d, tmp);
    if (fd < 0)
        return fd;
    size_t len = strlen(text);
    ssize_t w = write(fd, text, len);
    int rc = w == (ssize_t)len ? 0 : w < 0 ? -errno : -EIO;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && renameat(d->fd, tmp, d->fd, name) != 0)
        rc = -errno;
    return rc;
}

/* Reads name into buf (NUL-terminated, at most cap-1 bytes), never through a link. */
static ssize_t read_at(const struct records *d, const char *name, char *buf, size_t cap)
{
    int fd = openat(d->fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t got = 0;
    for (ssize_t k; got + 1 < cap && (k = read(fd, buf + got, cap - 1 - got)) > 0;)
        got += (size_t)k;
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

bool rec_read_end(const struct records *d, int r, char kind[16], int *code, char host[64])
{
    char name[32], text[512];
    kind[0] = host[0] = '\0';
    snprintf(name, sizeof(name), "rank-%d", r);
    if (read_at(d, name, text, sizeof(text)) <= 0)
        return false;
    int got = sscanf(text, "%15s %d host %63s", kind, code, host);
    if (got < 2)
        kind[0] = host[0] = '\0';
    return got >= 2;
}

/* This host's name and its addresses other than loopback ("10.0.0.5 fd00::5"), what the
   launcher matches against the discovery script's names (run_elastic.h). */
void rec_this_host(char *host, size_t hcap, char *addrs, size_t acap)
{
    snprintf(host, hcap, "?");
    if (gethostname(host, hcap - 1) != 0)
        snprintf(host, hcap, "?");
    host[hcap - 1] = '\0';
    addrs[0] = '\0';
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return;
    size_t len = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        char a[INET6_ADDRSTRLEN] = "";
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET) {
            const struct in_addr *in = &((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
            if ((ntohl(in->s_addr) >> 24) == 127)
                continue;
            inet_ntop(AF_INET, in, a, sizeof(a));
        } else if (i->ifa_addr->sa_family == AF_INET6) {
            const struct in6_addr *in6 = &((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(in6) || IN6_IS_ADDR_LINKLOCAL(in6))
                continue;
            inet_ntop(AF_INET6, in6, a, sizeof(a));
        }
        if (a[0] && len + strlen(a) + 2 < acap)
            len += (size_t)snprintf(addrs + len, acap - len, "%s%s", len ? " " : "", a);
    }
    freeifaddrs(ifs);
}

int rec_beat(const struct records *d, const char *rank, uint64_t n, const char *host, const char *addrs)
{
    char name[48], text[BEAT_TEXT];
    snprintf(name, sizeof(name), "alive-%s", rank);
    int len = snprintf(text, sizeof(text), "host %s\naddr %s\nbeat %llu\n", host, addrs, (unsigned long long)n);
    if (len >= (int)sizeof(text))
        len = (int)sizeof(text) - 1;
    /* The first beat makes the file (R2); later ones rewrite it in place: the counter only
       grows, so the text only grows. Opened and closed each time: NFS's close-to-open
       consistency then shows each beat to the launcher's host. */
    int fd = n == 0 ? create_at(d, name) : openat(d->fd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return n == 0 ? fd : -errno;
    ssize_t w = pwrite(fd, text, (size_t)len, 0);
    int rc = w == len ? 0 : w < 0 ? -errno : -EIO;
    close(fd);
    return rc;
}

int64_t rec_beat_seen(struct records *d, int r)
{
    if (r < 0 || r >= d->nproc)
        return 0;
    char name[32], text[BEAT_TEXT];
    snprintf(name, sizeof(name), "alive-%d", r);
    ssize_t got = read_at(d, name, text, sizeof(text));
    if (got <= 0)
        return d->beats[r].changed_ns;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the content */
    for (ssize_t i = 0; i < got; i++)
        h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    if (!d->beats[r].changed_ns || h != d->beats[r].sum) {
        d->beats[r].sum = h;
        d->beats[r].changed_ns = rk__mono_ns();
    }
    return d->beats[r].changed_ns;
}

bool rec_beat_host(const struct records *d, int r, char host[64], char *addrs, size_t acap)
{
    char name[32], text[BEAT_TEXT];
    host[0] = addrs[0] = '\0';
    snprintf(name, sizeof(name), "alive-%d", r);
    if (read_at(d, name, text, sizeof(text)) <= 0 || sscanf(text, "host %63s", host) != 1) {
        host[0] = '\0';
        return false;
    }
    const char *a = strstr(text, "\naddr ");
    if (a) {
        a += 6;
        size_t len = strcspn(a, "\n");
        snprintf(addrs, acap, "%.*s", (int)(len < acap ? len : acap - 1), a);
    }
    return true;
}

bool rec_exists(const struct records *d, const char *name)
{
    struct stat st;
    return fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

int rec_touch(const struct records *d, const char *name)
{
    int fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST ? 0 : -errno;
    close(fd);
    return 0;
}

bool rec_take(const struct records *d, const char *name)
{
    return unlinkat(d->fd, name, 0) == 0;
}

bool rec_take_text(const struct records *d, const char *name, char *buf, size_t cap)
{
    struct stat st;
    if (fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
        return false;
    if (read_at(d, name, buf, cap) < 0)
        buf[0] = '\0';
    for (char *c = buf; *c; c++) /* one line, printable: it is printed */
        if ((unsigned char)*c < ' ' || *c == 0x7f)
            *c = ' ';
    return rec_take(d, name);
}

FILE *rec_create_file(const struct records *d, const char *name)
{
    int fd = create_at(d, name);
    if (fd < 0) {
        errno = -fd;
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}
