/*
 * common/mpi.c - the one translation of MPI error codes (STYLE.md convention 2): every
 * part that calls MPI (ring/, recover/) reports a failed MPI call through rk__mpi_fail;
 * and the record of the MPI call in progress, which the wedge watchdog reads.
 */
#include <errno.h>
#include <execinfo.h>
#include <mpi.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

int rk__mpi_fail(int sub, int level, int code, int mpi_rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof(msg), "MPI error %d", mpi_rc);
    return rk__fail(sub, level, code, "%s: %s", what, msg);
}

static _Atomic int64_t mpi_since; /* start of the call in progress; 0: none */
static atomic_uint_fast64_t mpi_calls;
static _Atomic(const char *) mpi_what;
static atomic_int mpi_tid; /* the caller of rk__mpi_enter (the training thread): its kernel id */

void rk__mpi_enter(const char *what)
{
    static _Thread_local int tid; /* a polling loop's calls: one load and a compare */
    if (!tid)
        tid = (int)syscall(SYS_gettid);
    if (atomic_load_explicit(&mpi_tid, memory_order_relaxed) != tid)
        atomic_store_explicit(&mpi_tid, tid, memory_order_relaxed);
    atomic_store(&mpi_what, what);
    atomic_fetch_add(&mpi_calls, 1);
    atomic_store(&mpi_since, rk__mono_ns());
}

void rk__mpi_leave(void)
{
    atomic_store(&mpi_since, 0);
}

int64_t rk__mpi_inside(uint64_t *call, const char **what)
{
    *call = atomic_load(&mpi_calls);
    *what = atomic_load(&mpi_what);
    return atomic_load(&mpi_since);
}

int rk__mpi_left(int mpi_rc)
{
    rk__mpi_leave();
    return mpi_rc;
}

/* The stack of the thread inside the MPI call, for the wedge watchdog's last words: a
   signal to that thread, whose handler records its return addresses (backtrace, warmed up
   here first so that the handler loads nothing), and the names read from the addresses on
   this thread. The handler is installed only now, when the process is about to end. */
static void *stack_frames[48];
static atomic_int stack_depth = -1;

static void stack_take(int sig)
{
    (void)sig;
    atomic_store(&stack_depth, backtrace(stack_frames, 48));
}

int rk__mpi_stack(char ***names, int wait_ms)
{
    int tid = atomic_load(&mpi_tid);
    void *warm[2];
    struct sigaction sa;
    *names = NULL;
    if (!tid || !rk__mpi_inside(&(uint64_t){0}, &(const char *){NULL}))
        return 0;
    (void)backtrace(warm, 2);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stack_take;
    sigemptyset(&sa.sa_mask);
    atomic_store(&stack_depth, -1);
    if (sigaction(SIGRTMIN + 3, &sa, NULL) != 0 || syscall(SYS_tgkill, getpid(), tid, SIGRTMIN + 3) != 0)
        return 0;
    for (int i = 0; i < wait_ms && atomic_load(&stack_depth) < 0; i++)
        rk__sleep_ns(1000000);
    int n = atomic_load(&stack_depth);
    if (n <= 0)
        return 0;
    *names = backtrace_symbols(stack_frames, n);
    return *names ? n : 0;
}

int rk__mpi_thread_state(char *out, size_t cap)
{
    int tid = atomic_load(&mpi_tid);
    char path[64], buf[2048];
    size_t len = 0;
    out[0] = '\0';
    if (!tid || cap < 2)
        return -ENOENT;
    static const char *const parts[] = {"stat", "wchan", "stack"}; /* stack: root only */
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && len + 1 < cap; i++) {
        snprintf(path, sizeof(path), "/proc/self/task/%d/%s", tid, parts[i]);
        FILE *f = fopen(path, "re");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        if (i == 0) { /* the state, after the command's name */
            char *p = strrchr(buf, ')');
            n = p ? (size_t)snprintf(buf, sizeof(buf), "state %c", p[2]) : 0;
        }
        for (size_t k = 0; k < n; k++)
            if (buf[k] == '\n')
                buf[k] = ' ';
        if (n)
            len += (size_t)snprintf(out + len, cap - len, "%s%s%s%s", len ? "; " : "", i ? parts[i] : "", i ? " " : "", buf);
    }
    return 0;
}

/* Open MPI 4.1 agrees on a new communicator's context id inside MPI_Comm_spawn (and
   connect/accept) by a nonblocking request whose last step, run from opal_progress by
   whichever thread of the process polls first, is a PMIx lookup of the other side's half,
   waited for up to 600 s (ompi/communicator/comm_cid.c). A newcomer dead at that moment
   held that thread there: at the spawn's root it can be the training thread, inside a ring
   call, which the wedge watchdog then ended (docs/CHAOS.md, seed 4203). The MCA parameter
   pmix_base_exchange_timeout (seconds) bounds it. ORTE's server (4.1.4) applies it in
   rounds of 2 s, taking 2 s off twice a round, so a multiple of 4 ends the wait at half
   its value (measured: 8 -> 3.7-4 s) and some other values never end it (5 did not in
   15 s). The wait asked for: a third of RK_TIMEOUT_MS, at least 6 s (a newcomer's start up
   to its MPI_Init runs inside it), rounded up to an even second: below the watchdog's
   RK_TIMEOUT_MS / 2 wherever RK_TIMEOUT_MS is 12 s or more (30 s by default). */
int rk__mpi_exchange_wait_s(int timeout_ms)
{
    int wait_s = timeout_ms / 3000;
    return wait_s < 6 ? 6 : wait_s;
}

void rk__mpi_bound_exchanges(int timeout_ms)
{
    char v[16];
    snprintf(v, sizeof(v), "%d", 4 * ((rk__mpi_exchange_wait_s(timeout_ms) + 1) / 2));
    setenv("OMPI_MCA_pmix_base_exchange_timeout", v, 0); /* the user's own setting is kept */
}

static atomic_bool mpi_abandoned;

bool rk__mpi_abandoned(void)
{
    return atomic_load(&mpi_abandoned);
}

int rk__mpi_wait_coll(MPI_Request *rq, int64_t deadline, bool (*gone)(void *arg, char *why, size_t cap), void *arg,
                      void *keep, int sub, const char *what)
{
    int64_t t0 = rk__mono_ns(), look = t0;
    char why[256] = "";
    for (;;) {
        int done = 0, mrc = RK_MPI(MPI_Test(rq, &done, MPI_STATUS_IGNORE));
        if (mrc != MPI_SUCCESS)
            return rk__mpi_fail(sub, RK_LOG_ERROR, RK_E_MPI, mrc, what);
        if (done)
            return 0;
        int64_t now = rk__mono_ns();
        if (gone && now >= look) {
            look = now + 50 * 1000000LL;
            if (gone(arg, why, sizeof(why)))
                break;
        }
        if (now >= deadline)
            break;
        rk__sleep_ns(200 * 1000);
    }
    atomic_store(&mpi_abandoned, true);
    if (keep)
        rk__retain_forever(keep);
    if (*why)
        return rk__fail(sub, RK_LOG_ERROR, RK_E_PEER_LOST, "%s given up after %.1f s: %s", what,
                        (double)(rk__mono_ns() - t0) / 1e9, why);
    return rk__fail(sub, RK_LOG_ERROR, RK_E_TIMEOUT, "%s did not complete in %.1f s: a worker of the job did not "
                    "take part (dead, hung, or far behind)", what, (double)(rk__mono_ns() - t0) / 1e9);
}

int rk__mpi_dup_bounded(MPI_Comm comm, MPI_Comm *out, int64_t deadline, bool (*gone)(void *arg, char *why, size_t cap),
                        void *arg, int sub, const char *what)
{
    MPI_Comm *d = malloc(sizeof(*d));
    MPI_Request rq;
    if (!d)
        return -ENOMEM;
    int rc, mrc = MPI_Comm_idup(comm, d, &rq);
    if (mrc != MPI_SUCCESS) {
        free(d);
        return rk__mpi_fail(sub, RK_LOG_ERROR, RK_E_MPI, mrc, what);
    }
    if ((rc = rk__mpi_wait_coll(&rq, deadline, gone, arg, d, sub, what)) != 0)
        return rc;
    *out = *d;
    free(d);
    return 0;
}
