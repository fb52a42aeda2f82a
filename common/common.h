/*
 * common/common.h - what every part of Rekindle shares: errors, logging, the event log,
 * clocks and option parsing. The one header of common/ that other folders include.
 * Names here start with rk__ (internal to the library, never exported in the API).
 *
 * Errors (STYLE.md convention 2): a function returns 0 or a negative code: -errno for
 * the OS, RK_E_... (include/rekindle.h) for Rekindle. Foreign codes (HDF5, CUDA, NCCL)
 * are translated in the glue file of their part, MPI's in common/mpi.c (rk__mpi_fail,
 * shared by ring/ and recover/), and logged once, where they happen, with rk__fail(),
 * which also sets the thread's rk_last_error() message.
 */
#ifndef RK_COMMON_H
#define RK_COMMON_H

#include <stdarg.h>
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle.h"

#define RK_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Slots held above a launch's for workers started while the job runs (recover/join_proto.c):
   the launcher reads their records, the detector and the recovery address them. */
#define RK_JOIN_SLOTS 64

/* qsort's comparison of two ints, ascending (member lists: ring/, recover/). */
static inline int rk__cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

#if defined(__GNUC__)
#define RK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define RK_PRINTF(f, a)
#endif

/* ---- errors (common/err.c) ------------------------------------------------------------ */

/* Records `fmt` as the calling thread's rk_last_error() message, logs it at `level`
   for subsystem `sub` (see below), and returns `code` so that a caller can write
   `return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EIO, "write %s: ...", path);`. */
int rk__fail(int sub, int level, int code, const char *fmt, ...) RK_PRINTF(4, 5);
/* Sets the thread's rk_last_error() message without logging. */
void rk__set_last_error(const char *fmt, ...) RK_PRINTF(1, 2);
/* Whether `code` is one of the table's RK_E_... codes. */
bool rk__is_rk_error(int code);
/* The one translation of an MPI error code (common/mpi.c, the MPI glue): rk__fail with
   the message "what: <MPI's text for mpi_rc>"; returns `code`. */
int rk__mpi_fail(int sub, int level, int code, int mpi_rc, const char *what);
/* A call into MPI that may never return: Open MPI's shared-memory transport leaves a
   receiver spinning inside its progress engine forever when a sender died in the middle of
   a send (docs/RING.md, "Transport"). Every MPI call of a polling loop (ring/, recover/) is
   bracketed by rk__mpi_enter/rk__mpi_leave (one thread, the training thread, calls MPI
   through them; a join's thread calls MPI beside it without them: recover/join.c J10),
   so that a watchdog on another thread sees one that never returns: rk__mpi_inside gives
   when the call in progress began (CLOCK_MONOTONIC ns), a number that changes with each
   call and the call's text (`what`, a string literal: the watchdog names the call it
   ends), or 0 when none is in progress. */
void rk__mpi_enter(const char *what);
void rk__mpi_leave(void);
int64_t rk__mpi_inside(uint64_t *call, const char **what);
int rk__mpi_left(int mpi_rc); /* rk__mpi_leave, then mpi_rc */
/* The stack of the thread inside the call in progress (the training thread), for a
   process about to end: its frames' names (one malloc'd array, free it) and their count,
   or 0 where none was taken in wait_ms (no call in progress, or the thread did not take
   the signal, SIGRTMIN + 3, whose handler this installs). */
int rk__mpi_stack(char ***names, int wait_ms);
/* The kernel's view of that thread, one line into out: its state, where it waits (wchan)
   and its kernel stack where the process may read it (root); -ENOENT: no thread known. */
int rk__mpi_thread_state(char *out, size_t cap);
/* Open MPI's wait for a PMIx data exchange inside a spawn (600 s unbounded otherwise),
   bounded for the process about to call MPI_Init (and what it starts): the environment's
   OMPI_MCA_pmix_base_exchange_timeout, unless set already, so that the wait ends after
   rk__mpi_exchange_wait_s(timeout_ms) seconds (common/mpi.c says why and how). */
int rk__mpi_exchange_wait_s(int timeout_ms);
void rk__mpi_bound_exchanges(int timeout_ms);
/* Waits for a nonblocking collective's request (MPI_Comm_idup, MPI_Iallgather, ...) until
   `deadline` (rk__mono_ns), testing it every 200 us; gone(arg, why, cap), when given, is
   asked every 50 ms whether a party is gone (true: why names it). 0 once complete;
   RK_E_PEER_LOST (gone) or RK_E_TIMEOUT (the deadline), logged as an error naming `what`.
   A collective given up on can be neither cancelled nor freed (MPI 4.1, 6.12): its request
   is left to MPI, `keep` (a block MPI may still write or read, or NULL) is kept for the life
   of the process, and from then on rk__mpi_abandoned() is true: MPI_Finalize, which could
   wait for it, must not be called. */
int rk__mpi_wait_coll(MPI_Request *rq, int64_t deadline, bool (*gone)(void *arg, char *why, size_t cap), void *arg,
                      void *keep, int sub, const char *what);
bool rk__mpi_abandoned(void);
/* MPI_Comm_idup of comm into *out, waited for as rk__mpi_wait_coll does (the handle's
   memory is MPI's for good if given up on; *out untouched then). */
int rk__mpi_dup_bounded(MPI_Comm comm, MPI_Comm *out, int64_t deadline, bool (*gone)(void *arg, char *why, size_t cap),
                        void *arg, int sub, const char *what);
/* One MPI call of a polling loop, bracketed: RK_MPI(MPI_Test(&rq, &done, &st)). */
#define RK_MPI(call) (rk__mpi_enter(#call), rk__mpi_left(call))

/* ---- logging (common/log.c) ------------------------------------------------------------
 * RK_LOG=error|warn|info|debug (default warn) and RK_LOG_SUBSYS=det,ring,... (default all)
 * are read once, at first use. Each line: "[rekindle r<rank> <host> +<seconds>s LEVEL sub] msg",
 * written to stderr with one write(2), so lines from threads never interleave.
 * The RK_LOG_* macros test the threshold before evaluating their arguments. The library
 * prints nothing on its success paths at the default level. */
enum rk__log_level { RK_LOG_ERROR = 0, RK_LOG_WARN = 1, RK_LOG_INFO = 2, RK_LOG_DEBUG = 3 };
enum rk__subsys {
    RK_SUB_COMMON = 0,
    RK_SUB_FMT,    /* formats/  */
    RK_SUB_CKPT,   /* ckpt/     */
    RK_SUB_DET,    /* detector/ */
    RK_SUB_RING,   /* ring/     */
    RK_SUB_REC,    /* recover/  */
    RK_SUB_TOOL,   /* tools/    */
    RK_SUB_CHAOS,  /* chaos/    */
    RK_SUB_COUNT
};

bool rk__log_enabled(int sub, int level);
void rk__log_write(int sub, int level, const char *fmt, ...) RK_PRINTF(3, 4);
void rk__log_vwrite(int sub, int level, const char *fmt, va_list ap);
/* The rank shown in the prefix (-1: none yet). Set by rk_init. */
void rk__log_set_rank(int rank);
/* Re-reads RK_LOG / RK_LOG_SUBSYS (tests; programs that change them at run time).
   Returns 0, or RK_E_OPTION for a value it does not understand (the rest still applies). */
int rk__log_reload(void);
/* Names: "error".., "det".. ; NULL for an out-of-range value. */
const char *rk__log_level_name(int level);
const char *rk__log_subsys_name(int sub);

#define RK_LOG_AT(sub, level, ...)                                                         \
    do {                                                                                   \
        if (rk__log_enabled((sub), (level)))                                               \
            rk__log_write((sub), (level), __VA_ARGS__);                                    \
    } while (0)
#define RK_LOG_ERR(sub, ...) RK_LOG_AT(sub, RK_LOG_ERROR, __VA_ARGS__)
#define RK_LOG_WARN(sub, ...) RK_LOG_AT(sub, RK_LOG_WARN, __VA_ARGS__)
#define RK_LOG_INFO(sub, ...) RK_LOG_AT(sub, RK_LOG_INFO, __VA_ARGS__)
#define RK_LOG_DEBUG(sub, ...) RK_LOG_AT(sub, RK_LOG_DEBUG, __VA_ARGS__)

/* ---- clocks (common/clock.c) ----------------------------------------------------------- */
int64_t rk__mono_ns(void);         /* CLOCK_MONOTONIC, ns                         */
int64_t rk__real_ns(void);         /* CLOCK_REALTIME, ns (the event log's t_ns)   */
int64_t rk__deadline_ns(int64_t timeout_ms); /* rk__mono_ns() + timeout; INT64_MAX if < 0 */
bool rk__deadline_passed(int64_t deadline_ns);
/* Milliseconds left before the deadline (0 if passed), capped at INT32_MAX: for poll(). */
int rk__ms_left(int64_t deadline_ns);
void rk__sleep_ns(int64_t ns);     /* restarts on EINTR */
double rk__ms_since(int64_t mono_ns_then);

/* ---- large regions (common/mem.c) -------------------------------------------------------
 * Anonymous, zeroed, private memory advised for huge pages and populated at once (cheap
 * first touch). NULL with errno on failure; rk__unmap takes the size given to rk__map. */
void *rk__map(size_t bytes);
/* The same, not populated: each page is first touched by its first write (a restore's
   staging, which its O_DIRECT reads fault in while the disk works). */
void *rk__map_lazy(size_t bytes);
/* Grows a region of rk__map (NULL/0: maps one) to `bytes`, in place or moved, keeping its
   pages (only the new tail is first touched); NULL with errno on failure (p still valid). */
void *rk__remap(void *p, size_t old_bytes, size_t bytes);
void rk__unmap(void *p, size_t bytes);

/* ---- event log (common/evlog.c) --------------------------------------------------------
 * Contract section 5: with RK_EVENT_LOG=PATH every worker appends one JSON object per line
 * to PATH.<rank at start>. One handle per worker (owned by its rk_ctx); each line is
 * built whole and written with one write(2) on an O_APPEND descriptor under a mutex, so
 * lines from several threads (or processes sharing a file) never interleave.
 * A NULL handle is valid everywhere and means "event log off". */
typedef struct rk__evlog rk__evlog;

typedef struct rk__evfield {
    const char *key;
    char type; /* 'i' int64, 'd' double, 's' string (escaped), 'b' bool, 'r' raw JSON */
    union {
        int64_t i;
        double d;
        const char *s;
        bool b;
    } v;
} rk__evfield;

#define RK_EV_I(k, x) ((rk__evfield){.key = (k), .type = 'i', .v.i = (int64_t)(x)})
#define RK_EV_D(k, x) ((rk__evfield){.key = (k), .type = 'd', .v.d = (double)(x)})
#define RK_EV_S(k, x) ((rk__evfield){.key = (k), .type = 's', .v.s = (x)})
#define RK_EV_B(k, x) ((rk__evfield){.key = (k), .type = 'b', .v.b = (x)})
#define RK_EV_RAW(k, x) ((rk__evfield){.key = (k), .type = 'r', .v.s = (x)})

/* Opens PATH.<rank> for appending (created 0644). path NULL or "": *ev = NULL, returns 0. */
int rk__evlog_open(rk__evlog **ev, const char *path, int rank);
void rk__evlog_close(rk__evlog **ev); /* drops a reference; the last one closes; *ev = NULL */
/* Another reference to ev (NULL: none), for a thread that may outlive its opener's
   close (a checkpoint writer abandoned on a disk that stopped answering). */
rk__evlog *rk__evlog_ref(rk__evlog *ev);

/* Keeps mem for the life of the process, reachable (common/retain.c): for memory another
   party may still use after its owner is done (MPI transfers, a stuck writer thread). */
void rk__retain_forever(void *mem);
/* Writes {"t_ns":…,"rank":…,"event":name, fields…}. Returns 0 or -errno (also logged once). */
int rk__evlog_emit(rk__evlog *ev, const char *name, const rk__evfield *fields, size_t n);
#define RK_EVENT(ev, name, ...)                                                             \
    rk__evlog_emit((ev), (name), (const rk__evfield[]){__VA_ARGS__},                        \
                   sizeof((const rk__evfield[]){__VA_ARGS__}) / sizeof(rk__evfield))
/* Formats one event line (with '\n') into buf; returns its length, or -ENOSPC if it does
   not fit. Used by rk__evlog_emit and by tests. */
int rk__evlog_format(char *buf, size_t cap, int64_t t_ns, int rank, const char *name,
                     const rk__evfield *fields, size_t n);

/* ---- options (common/opt.c) ------------------------------------------------------------
 * rk_options_init() (public) fills defaults and reads the RK_* table; rk__options_validate
 * checks every field's range and names the bad one. */
int rk__options_validate(const rk_options *o);
/* A copy of validated options that owns its strings, for a context that outlives the
   caller's (a binding passes temporaries): every path is duplicated and every choice points
   at the table's own constant. 0 or -ENOMEM (nothing left to free). Released with
   rk__options_free, which frees only those copies. */
int rk__options_keep(rk_options *dst, const rk_options *o);
void rk__options_free(rk_options *o);
/* Strict integer parse of an environment-style value: decimal, optional sign, no junk,
   within [lo, hi]. Returns 0 or RK_E_OPTION with a reason in why (if why != NULL). */
int rk__parse_int(const char *s, long lo, long hi, long *out, const char **why);

/* ---- fault injection (common/fault.c) -------------------------------------------------
 * Faults are injected ONLY when the environment asks for them:
 *   RK_FAULT=OP@N=KIND[,OP@N=KIND...]
 *     OP    a file operation (formats/fio.h wraps each one):
 *             open|write|read|sync|truncate|rename|syncdir|unlink|mkdir|odirect|uring|list|swap
 *             (unlink: removing a file or an empty directory; mkdir: creating a directory;
 *              odirect: opening a descriptor with O_DIRECT; uring: setting up io_uring, or
 *              the checkpoint reader submitting reads to it; list: reading a directory's
 *              entries; swap: exchanging two directories' names in one step)
 *           any: every file operation, N counted over all of them;
 *           or a point of another part, reached through rk__fault_point (only crash
 *           applies) or rk__fault_fail (an error kind makes it fail):
 *             rebuild    the ring's rebuild, between its handshake and its end (point);
 *             progress   each test of a ring transfer, inside its MPI call, where hang
 *                        stands for an MPI call that never returns (point);
 *             rollback   a member's part of a rebuild of sharded state from memory (fail);
 *             allreduce  each call of rk_allreduce, on entry (point);
 *             copy       each copy of the host copy engine's batches (ckpt/copy.h): an
 *                        error kind fails that copy and the rest of its batch, hang
 *                        holds it (fail);
 *             stage      each new staging region of the snapshot engine (ckpt/): an error
 *                        kind makes its mapping fail (fail)
 *             join       a spare's join (recover/recovery.c G4): #0 when the decision that
 *                        brings it in arrives, before the ring is built with it; #1 once
 *                        that ring is built, before the state is sent to it (point)
 *     N     the 0-based index of that operation in this process, or * for every one
 *     KIND  eio|enospc|einval|eperm|short|crash|hang|powerloss
 *   RK_FAULT_PATH=substring   only operations on paths containing it are counted and
 *                             faulted (operations without a path, the points, never are).
 *   RK_FAULT_HOLD=FILE        hang lasts while FILE exists.
 *   RK_FAULT_POWER=DIR        the power-loss model of file operations (formats/fio.h).
 * A bad RK_FAULT is logged once (RK_LOG_ERROR) and injects nothing; it never crashes.
 * The environment is read at first use; rk__fault_reset() reads it again.
 * The kinds: -EIO, -ENOSPC, ...: the operation does nothing and fails with that code;
 * RK_FAULT_SHORT: a write (read) transfers the first half of the bytes, the rest fails
 * with -EIO; RK_FAULT_CRASH: the process kills itself with SIGKILL before the operation;
 * RK_FAULT_HANG: the operation does not complete, as on a disk that stopped answering,
 * until the process ends or, with RK_FAULT_HOLD=FILE, until FILE no longer exists (then it
 * goes ahead); RK_FAULT_POWER: a file operation's machine loses power (formats/fio.h), at
 * a point the same as crash. */
enum rk__fault_op {
    RK_FAULT_OP_OPEN,
    RK_FAULT_OP_WRITE,
    RK_FAULT_OP_READ,
    RK_FAULT_OP_SYNC,
    RK_FAULT_OP_TRUNCATE,
    RK_FAULT_OP_RENAME,
    RK_FAULT_OP_SYNCDIR,
    RK_FAULT_OP_UNLINK,
    RK_FAULT_OP_DIRECT,    /* "odirect": open with O_DIRECT (EINVAL: the file system refuses it) */
    RK_FAULT_OP_URING,     /* "uring": io_uring setup (EPERM: refused, e.g. by seccomp), or a
                              submission of the checkpoint reader's reads */
    RK_FAULT_OP_REBUILD,   /* "rebuild": the ring's rebuild (point); not counted by "any" */
    RK_FAULT_OP_LIST,      /* "list": opening and reading a directory (EACCES, an unmounted share) */
    RK_FAULT_OP_SWAP,      /* "swap": renameat2 RENAME_EXCHANGE of two directories */
    RK_FAULT_OP_PROGRESS,  /* "progress": a test of a ring transfer, inside the MPI call (point) */
    RK_FAULT_OP_MKDIR,     /* "mkdir": creating a directory */
    RK_FAULT_OP_ROLLBACK,  /* "rollback": a member's part of a rollback from memory (fail) */
    RK_FAULT_OP_ALLREDUCE, /* "allreduce": a call of rk_allreduce, on entry (point: crash) */
    RK_FAULT_OP_COPY,      /* "copy": one copy of the host copy engine's batch (fail) */
    RK_FAULT_OP_STAGE,     /* "stage": mapping a snapshot's staging region (fail) */
    RK_FAULT_OP_JOIN,      /* "join": a spare's join, before the ring (#0), before the state (#1) (point) */
    RK_FAULT_OP_STEP_DONE, /* "step_done": a call of rk_step_done, on entry (point: crash, or
                              hang until RK_FAULT_HOLD's file goes) */
    RK_FAULT_OP_COUNT
};
#define RK_FAULT_SHORT (-100000) /* a short write/read (half the length) */
#define RK_FAULT_CRASH (-100001) /* the caller must raise(SIGKILL) on itself now */
#define RK_FAULT_HANG (-100002)  /* the operation never returns (a disk that stopped) */
#define RK_FAULT_POWER (-100003) /* the machine loses power now (RK_FAULT_POWER) */

/* 0: go ahead; otherwise the fault to inject for this operation: -EIO, -ENOSPC, ...,
   RK_FAULT_SHORT, _CRASH or _POWER (a hang is served here: it returns once released).
   Counts operations per process (thread-safe). path: for RK_FAULT_PATH (may be NULL). */
int rk__fault(enum rk__fault_op op, const char *path);
/* Re-reads RK_FAULT / RK_FAULT_PATH and zeroes the counters. Returns 0, or RK_E_OPTION
   if RK_FAULT could not be parsed (then no fault is injected; logged once). */
int rk__fault_reset(void);
/* How many operations of that kind were counted since start or the last reset. */
uint64_t rk__fault_count(enum rk__fault_op op);
/* "write", "sync", ...; NULL out of range. */
const char *rk__fault_op_name(enum rk__fault_op op);
/* Whether op is a file operation (counted by "any"), not a point of another part. */
bool rk__fault_is_file_op(enum rk__fault_op op);
/* An injected fault for an operation that cannot be short: CRASH and POWER kill the
   process, HANG never gets here, SHORT becomes -EIO, anything else is returned as is. */
int rk__fault_apply(int fault);
/* The point `op` ("rebuild", "progress", "allreduce"): the process is killed there if a
   crash is asked for; other kinds are ignored. Nothing to do when RK_FAULT is unset. */
void rk__fault_point(const char *op);
/* The point `op` ("rollback", "copy", "stage"): 0, or the error asked for there (crash and
   powerloss kill the process; hang holds the caller, then 0). */
int rk__fault_fail(const char *op);

/* ---- sizes of dtypes (common/err.c keeps the tables of names) -------------------------- */
size_t rk__dtype_size(rk_dtype t);   /* 0 for an unknown dtype */
const char *rk__dtype_name(rk_dtype t); /* "f32", "bf16", ...; NULL if unknown */

#endif /* RK_COMMON_H */
