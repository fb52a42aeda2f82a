/*
 * detector/det_parent.c - a worker's death, reported by its parent the moment it happens.
 *
 * PURPOSE
 *   Silence needs a timeout (3 heartbeat periods at least) before a worker is declared
 *   dead. For the commonest fault, a process that ends on a host that stays up (a crash,
 *   an OOM kill, an uncaught exception, SIGKILL), waiting is not needed: under
 *   `rekindle run` the worker is the child of a wrapper, which sees the process's exit begin
 *   (every thread of it inside the kernel's exit: a look at /proc every 5 ms) well before
 *   waitpid can say it ended: the kernel's teardown of a CUDA process's memory and device
 *   context took 270 ms on an H200 (bench/exit_cuda.sh). This file is both ends of what
 *   lets the wrapper tell the members:
 *
 *   worker (det.c calls detpar_tell_*)          wrapper (tools/run_worker.c calls det_parent_*)
 *     det_start:     START {slot, nslots, salt}  ->  derives the attempt's MAC key (detw_init)
 *                    ADDR {slot, address} x n    ->  from the job's key it holds and the salt
 *     det_set_addr:  ADDR                        ->  where a spare listens
 *     det_close:     CLOSE                       ->  forgets: a worker that left is no news
 *     (the process ends: exit or kill)               det_proc_ending (P5), else waitpid ->
 *                                                    det_parent_report: a DEATH datagram to
 *                                                    every member it knows
 *
 * INVARIANTS
 *   P1  Nothing secret crosses the pipe: the wrapper has the job's key from its own
 *       environment (RK_JOB_SECRET, which the worker inherited from it); the pipe carries
 *       the attempt's salt, slots and addresses. The pipe is private to the two processes
 *       (the worker marks its end close-on-exec at rk_init), never a file.
 *   P2  The wrapper reports only an end: one waitpid returned (an exit or a kill), or one
 *       under way (P5); never a stop: a stopped worker is found, or not, by silence alone.
 *   P3  A report is a datagram of the job like any other (det_wire.c): the attempt's MAC
 *       key, addressed to one receiver, numbered from DETW_PARENT_SEQ so that a replayed
 *       copy falls in the receiver's window; one that does not authenticate is dropped and
 *       counted. Between a CLOSE and the next START there is nothing to report. The pipe's
 *       end of file is no CLOSE: a dying worker's end closes before waitpid tells.
 *   P5  The wrapper may report before waitpid can, but only a worker that can run no more
 *       code of its own: det_proc_ending finds every thread of it inside the kernel's exit
 *       (PF_EXITING, set on entry to do_exit, from which nothing returns), a zombie, or gone,
 *       reading the thread list twice around it so that a thread started meanwhile is not
 *       missed. A worker whose main thread alone ended (pthread_exit) is not ending, nor is a
 *       stopped one, nor one that closed the pipe (an exec): those wait for waitpid or
 *       silence. The pid cannot name another process: the wrapper reaps it only after.
 *   P4  The worker never waits on its parent for long: its writes are non-blocking, wait
 *       at most TELL_WAIT_MS for room, and a record that does not fit is dropped (logged):
 *       the members then learn of the death by silence, as without a parent. The pipe
 *       always has its reader while the worker writes: the wrapper keeps it open until
 *       waitpid returned the worker, and a wrapper that dies takes the worker with it
 *       (the parent-death signal, tools/run_worker.c), so no write can raise SIGPIPE.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "det_internal.h"

#define DETPAR_MAGIC 0x50444b52u /* "RKDP" little-endian */
#define TELL_WAIT_MS 100

enum { REC_START = 1, REC_ADDR, REC_CLOSE };

/* One record on the pipe (host byte order: both ends are one host, one build). */
struct detpar_rec {
    uint32_t magic;
    uint16_t kind;
    uint16_t zero;
    int32_t slot;   /* START: the worker's; ADDR: the slot that listens there */
    int32_t nslots; /* START */
    uint8_t data[DET_KEY_BYTES]; /* START: the attempt's salt; ADDR: ipv4, port (network order) */
};

#define RECS_PER_WRITE (PIPE_BUF / sizeof(struct detpar_rec)) /* a write this size is atomic */

/* ---- the worker's end -------------------------------------------------------------------- */

static void tell(int fd, const struct detpar_rec *r, size_t n)
{
    int64_t deadline = rk__deadline_ns(TELL_WAIT_MS);
    while (n > 0) {
        size_t k = n < RECS_PER_WRITE ? n : RECS_PER_WRITE;
        ssize_t w = write(fd, r, k * sizeof(*r));
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN && !rk__deadline_passed(deadline)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 10);
            continue;
        }
        if (w != (ssize_t)(k * sizeof(*r))) {
            RK_LOG_WARN(RK_SUB_DET, "could not tell this worker's parent where the members listen (%s): if "
                        "it dies, the others will learn it from its silence", w < 0 ? strerror(errno) : "short write");
            return;
        }
        r += k;
        n -= k;
    }
}

static void addr_rec(struct detpar_rec *r, int slot, const struct sockaddr_in *a)
{
    memset(r, 0, sizeof(*r));
    r->magic = DETPAR_MAGIC;
    r->kind = REC_ADDR;
    r->slot = slot;
    memcpy(r->data, &a->sin_addr.s_addr, 4);
    memcpy(r->data + 4, &a->sin_port, 2);
}

void detpar_tell_start(int fd, int self, int nslots, const uint8_t salt[DET_KEY_BYTES],
                       const struct sockaddr_in *addrs)
{
    if (fd <= 2)
        return;
    struct detpar_rec *r = calloc((size_t)nslots + 1, sizeof(*r));
    if (!r) {
        RK_LOG_WARN(RK_SUB_DET, "out of memory: this worker's parent cannot report its death");
        return;
    }
    r[0] = (struct detpar_rec){.magic = DETPAR_MAGIC, .kind = REC_START, .slot = self, .nslots = nslots};
    memcpy(r[0].data, salt, DET_KEY_BYTES);
    size_t n = 1;
    for (int s = 0; s < nslots; s++)
        if (s != self && addrs[s].sin_port != 0)
            addr_rec(&r[n++], s, &addrs[s]);
    tell(fd, r, n);
    free(r);
}

void detpar_tell_addr(int fd, int slot, const struct sockaddr_in *a)
{
    if (fd <= 2)
        return;
    struct detpar_rec r;
    addr_rec(&r, slot, a);
    tell(fd, &r, 1);
}

void detpar_tell_close(int fd)
{
    if (fd <= 2)
        return;
    struct detpar_rec r = {.magic = DETPAR_MAGIC, .kind = REC_CLOSE};
    tell(fd, &r, 1);
}

/* ---- the parent's end -------------------------------------------------------------------- */

struct det_parent {
    int fd;                    /* the pipe's read end (not owned) */
    int sock;                  /* UDP, for the reports; -1 until the first START */
    uint8_t key[DET_KEY_BYTES];
    bool started;              /* a START since the last CLOSE */
    int self, nslots;
    detw wire;
    struct sockaddr_in *addrs; /* nslots; sin_port 0: unknown */
    uint8_t part[sizeof(struct detpar_rec)];
    size_t npart;              /* bytes of a record not yet complete */
};

int det_parent_open(det_parent **out, int fd, const uint8_t key[DET_KEY_BYTES])
{
    if (!out || fd < 0 || !key)
        return -EINVAL;
    *out = NULL;
    det_parent *pp = calloc(1, sizeof(*pp));
    if (!pp)
        return -ENOMEM;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int rc = -errno;
        free(pp);
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, rc, "det_parent_open: fd %d: %s", fd, strerror(-rc));
    }
    pp->fd = fd;
    pp->sock = -1;
    memcpy(pp->key, key, DET_KEY_BYTES);
    *out = pp;
    return 0;
}

static void forget(det_parent *pp)
{
    if (!pp->started)
        return;
    detw_fini(&pp->wire);
    free(pp->addrs);
    pp->addrs = NULL;
    pp->started = false;
}

static void take(det_parent *pp, const struct detpar_rec *r)
{
    if (r->magic != DETPAR_MAGIC)
        return;
    switch (r->kind) {
    case REC_START:
        forget(pp);
        if (r->nslots < 1 || r->nslots > DET_MAX_SLOTS || r->slot < 0 || r->slot >= r->nslots)
            return;
        if (pp->sock < 0)
            pp->sock = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        pp->addrs = calloc((size_t)r->nslots, sizeof(*pp->addrs));
        if (pp->sock < 0 || !pp->addrs || detw_init(&pp->wire, pp->key, r->data, r->nslots, r->slot) != 0) {
            free(pp->addrs);
            pp->addrs = NULL;
            return;
        }
        pp->wire.tx_seq = DETW_PARENT_SEQ; /* P3 */
        pp->self = r->slot;
        pp->nslots = r->nslots;
        pp->started = true;
        break;
    case REC_ADDR:
        if (pp->started && r->slot >= 0 && r->slot < pp->nslots) {
            struct sockaddr_in *a = &pp->addrs[r->slot];
            a->sin_family = AF_INET;
            memcpy(&a->sin_addr.s_addr, r->data, 4);
            memcpy(&a->sin_port, r->data + 4, 2);
        }
        break;
    case REC_CLOSE:
        forget(pp);
        break;
    default:
        break;
    }
}

int det_parent_read(det_parent *pp)
{
    uint8_t buf[RECS_PER_WRITE * sizeof(struct detpar_rec)];
    for (;;) {
        ssize_t n = read(pp->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? 0 : 1;
        if (n == 0) /* the worker is gone (its end closes before waitpid can tell), or exec'd
                       another program: its detector is gone either way; kept for the report */
            return 1;
        for (size_t i = 0; i < (size_t)n;) {
            size_t k = sizeof(pp->part) - pp->npart;
            if (k > (size_t)n - i)
                k = (size_t)n - i;
            memcpy(pp->part + pp->npart, buf + i, k);
            pp->npart += k;
            i += k;
            if (pp->npart == sizeof(pp->part)) {
                struct detpar_rec r;
                memcpy(&r, pp->part, sizeof(r));
                take(pp, &r);
                pp->npart = 0;
            }
        }
    }
}

int det_parent_report(det_parent *pp, int status)
{
    if (!pp)
        return 0;
    det_parent_read(pp); /* what the worker said last, before it died */
    if (!pp->started)
        return 0;
    int sent = 0;
    uint8_t buf[DETW_MAX];
    for (int r = 0; r < pp->nslots; r++) {
        const struct sockaddr_in *to = &pp->addrs[r];
        if (r == pp->self || to->sin_port == 0)
            continue;
        detm m = {.type = DETM_DEATH, .src = pp->self, .dst = r, .inc = (uint32_t)status,
                  .subject = pp->self, .origin = -1};
        size_t n = detw_encode(&pp->wire, &m, buf);
        if (sendto(pp->sock, buf, n, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof(*to)) == (ssize_t)n)
            sent++;
    }
    return sent;
}

bool det_parent_armed(const det_parent *pp)
{
    return pp && pp->started;
}

void det_parent_close(det_parent **ppp)
{
    if (!ppp || !*ppp)
        return;
    det_parent *pp = *ppp;
    forget(pp);
    if (pp->sock >= 0)
        close(pp->sock);
    sodium_memzero(pp->key, sizeof(pp->key));
    free(pp);
    *ppp = NULL;
}

/* ---- whether a process is ending (P5) ---------------------------------------------------- */

#define PF_EXITING_FLAG 0x4ul /* include/linux/sched.h: set on entry to do_exit */

int det_proc_stat(const char *path, int fd, char *state, unsigned long *flags, long *threads)
{
    bool own = fd < 0;
    if (own && (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return errno == ENOENT || errno == ESRCH ? -ENOENT : -errno;
    char buf[1024];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    int err = n < 0 ? errno : 0;
    if (own)
        close(fd);
    if (n <= 0)
        return n == 0 || err == ESRCH ? -ENOENT : -err;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the command's name, which may hold anything */
    long nt = 0;
    if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %ld", state, flags,
                     &nt) != 3)
        return -EINVAL;
    if (threads)
        *threads = nt;
    return 0;
}

/* 1: the thread whose stat file is `path` (or open as `fd`) is inside its exit, a zombie
   or gone; 0: it may still run (or its state cannot be read). */
static int thread_ending(const char *path, int fd)
{
    char state = 0;
    unsigned long flags = 0;
    int rc = det_proc_stat(path, fd, &state, &flags, NULL);
    if (rc)
        return rc == -ENOENT;
    return state == 'Z' || state == 'X' || state == 'x' || (flags & PF_EXITING_FLAG) != 0;
}

static int cmp_tid(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The thread ids of pid, sorted: how many (at most cap), or -1 when they cannot be listed
   or are more than cap. */
static int list_threads(pid_t pid, long *tid, int cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? 0 : -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (n == cap) {
            n = -1;
            break;
        }
        tid[n++] = strtol(e->d_name, NULL, 10);
    }
    closedir(d);
    if (n > 0)
        qsort(tid, (size_t)n, sizeof(*tid), cmp_tid);
    return n;
}

int det_proc_ending(pid_t pid, int statfd)
{
    if (pid <= 0)
        return -EINVAL;
    char path[96];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    if (!thread_ending(path, statfd))
        return 0; /* the main thread runs: the common case, one read */
    enum { MAX_THREADS = 4096 };
    long *a = malloc(2 * MAX_THREADS * sizeof(long)), *b = a + MAX_THREADS;
    if (!a)
        return -ENOMEM;
    int na = list_threads(pid, a, MAX_THREADS), ending = na >= 0;
    for (int i = 0; ending && i < na; i++) {
        snprintf(path, sizeof(path), "/proc/%ld/task/%ld/stat", (long)pid, a[i]);
        ending = thread_ending(path, -1);
    }
    /* Every thread listed is ending; one started before the last of them began its exit
       is in the second list. A list that holds only threads of the first: nothing of the
       process can run again (P5). */
    int nb = ending ? list_threads(pid, b, MAX_THREADS) : -1;
    for (int i = 0; ending && i < nb; i++)
        ending = bsearch(&b[i], a, (size_t)na, sizeof(*a), cmp_tid) != NULL;
    free(a);
    return ending && nb >= 0;
}
