/*
 * common/fault.c - RK_FAULT: faults injected where tests and the chaos harness ask for them
 * (common/common.h has the syntax). The table is per process by nature (it is configured
 * by the process's environment); it is parsed once under a mutex and the counters are
 * atomics, so any thread may ask. The file operations' wrappers (formats/fio.c) add what
 * only a file operation has: the power-loss model and the record of the last operation.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define MAX_RULES 32
#define OP_ANY RK_FAULT_OP_COUNT /* the "any" operation: a counter of its own */

struct rule {
    int op;        /* enum rk__fault_op, or OP_ANY */
    int64_t index; /* -1: every one */
    int fault;     /* -errno, RK_FAULT_SHORT, ... */
};

static const char *const op_names[RK_FAULT_OP_COUNT + 1] = {
    [RK_FAULT_OP_OPEN] = "open",         [RK_FAULT_OP_WRITE] = "write",         [RK_FAULT_OP_READ] = "read",
    [RK_FAULT_OP_SYNC] = "sync",         [RK_FAULT_OP_TRUNCATE] = "truncate",   [RK_FAULT_OP_RENAME] = "rename",
    [RK_FAULT_OP_SYNCDIR] = "syncdir",   [RK_FAULT_OP_UNLINK] = "unlink",       [RK_FAULT_OP_DIRECT] = "odirect",
    [RK_FAULT_OP_URING] = "uring",       [RK_FAULT_OP_REBUILD] = "rebuild",     [RK_FAULT_OP_LIST] = "list",
    [RK_FAULT_OP_SWAP] = "swap",         [RK_FAULT_OP_MKDIR] = "mkdir",         [RK_FAULT_OP_PROGRESS] = "progress",
    [RK_FAULT_OP_ROLLBACK] = "rollback", [RK_FAULT_OP_ALLREDUCE] = "allreduce", [RK_FAULT_OP_COPY] = "copy",
    [RK_FAULT_OP_STAGE] = "stage",       [RK_FAULT_OP_JOIN] = "join",           [RK_FAULT_OP_STEP_DONE] = "step_done",
    [OP_ANY] = "any",
};

static const struct {
    const char *name;
    int fault;
} kinds[] = {
    {"eio", -EIO},     {"enospc", -ENOSPC},        {"einval", -EINVAL},
    {"eperm", -EPERM}, {"short", RK_FAULT_SHORT},  {"crash", RK_FAULT_CRASH},
    {"hang", RK_FAULT_HANG}, {"powerloss", RK_FAULT_POWER},
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool loaded;
static struct rule rules[MAX_RULES];
static atomic_int nrules; /* written under lock; read without it only to see that it is 0 */
static char path_filter[256];
static atomic_uint_fast64_t counts[RK_FAULT_OP_COUNT + 1];

const char *rk__fault_op_name(enum rk__fault_op op)
{
    return (op >= 0 && op < RK_FAULT_OP_COUNT) ? op_names[op] : NULL;
}

bool rk__fault_is_file_op(enum rk__fault_op op)
{
    return op != RK_FAULT_OP_REBUILD && op != RK_FAULT_OP_PROGRESS && op != RK_FAULT_OP_ROLLBACK &&
           op != RK_FAULT_OP_ALLREDUCE && op != RK_FAULT_OP_COPY && op != RK_FAULT_OP_STAGE && op != RK_FAULT_OP_JOIN &&
           op != RK_FAULT_OP_STEP_DONE;
}

/* Parses one "OP@N=KIND" of length len into *r; 0 or -EINVAL. */
static int parse_rule(const char *s, size_t len, struct rule *r)
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
    for (int i = 0; i <= OP_ANY; i++)
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

/* Reads the environment into the table; called with lock held. */
static int load_locked(void)
{
    int rc = 0, k = 0;
    atomic_store(&nrules, 0);
    path_filter[0] = '\0';
    const char *pf = getenv("RK_FAULT_PATH");
    if (pf)
        snprintf(path_filter, sizeof path_filter, "%s", pf);
    const char *spec = getenv("RK_FAULT");
    if (spec && *spec) {
        const char *p = spec;
        while (*p) {
            size_t len = strcspn(p, ",");
            if (k == MAX_RULES || parse_rule(p, len, &rules[k]) != 0) {
                rc = rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, RK_E_OPTION,
                              "RK_FAULT='%s': cannot parse '%.*s' (want OP@N=KIND, at most %d): "
                              "no fault will be injected", spec, (int)len, p, MAX_RULES);
                k = 0;
                break;
            }
            k++;
            p += len;
            if (*p == ',')
                p++;
        }
    }
    for (int i = 0; i <= OP_ANY; i++)
        atomic_store(&counts[i], 0);
    atomic_store(&nrules, k);
    atomic_store(&loaded, true);
    return rc;
}

int rk__fault_reset(void)
{
    pthread_mutex_lock(&lock);
    int rc = load_locked();
    pthread_mutex_unlock(&lock);
    return rc;
}

static void ensure_loaded(void)
{
    if (atomic_load(&loaded))
        return;
    pthread_mutex_lock(&lock);
    if (!atomic_load(&loaded))
        load_locked();
    pthread_mutex_unlock(&lock);
}

uint64_t rk__fault_count(enum rk__fault_op op)
{
    ensure_loaded();
    return (op >= 0 && op < RK_FAULT_OP_COUNT) ? atomic_load(&counts[op]) : 0;
}

/* A disk that stopped answering: the operation does not start until RK_FAULT_HOLD's file
   is removed (never, without RK_FAULT_HOLD). */
static void hold(enum rk__fault_op op, const char *path)
{
    const char *file = getenv("RK_FAULT_HOLD");
    RK_LOG_WARN(RK_SUB_COMMON, "RK_FAULT: %s of %s hangs %s%s", op_names[op], path ? path : "-",
                file ? "until this file is removed: " : "until the process ends", file ? file : "");
    while (!file || access(file, F_OK) == 0)
        rk__sleep_ns(5 * 1000000LL);
}

int rk__fault(enum rk__fault_op op, const char *path)
{
    if (op < 0 || op >= RK_FAULT_OP_COUNT)
        return 0;
    bool file_op = rk__fault_is_file_op(op);
    ensure_loaded();
    /* The table is read under the lock: a test may reset it (rk__fault_reset) while a
       thread of the library (a writer's retention) still asks. */
    int fault = 0;
    int64_t n = -1;
    pthread_mutex_lock(&lock);
    if (!path_filter[0] || (path && strstr(path, path_filter))) {
        n = (int64_t)atomic_fetch_add(&counts[op], 1);
        int64_t n_any = file_op ? (int64_t)atomic_fetch_add(&counts[OP_ANY], 1) : -1;
        for (int i = 0, nr = atomic_load(&nrules); i < nr && !fault; i++) {
            const struct rule *r = &rules[i];
            int64_t idx = r->op == OP_ANY ? n_any : n;
            if ((r->op == (int)op || (r->op == OP_ANY && file_op)) && (r->index < 0 || r->index == idx))
                fault = r->fault;
        }
    }
    pthread_mutex_unlock(&lock);
    if (!fault)
        return 0;
    RK_LOG_INFO(RK_SUB_COMMON, "RK_FAULT: injecting %d into %s #%lld of %s", fault, op_names[op], (long long)n,
                path ? path : "-");
    if (fault == RK_FAULT_HANG) {
        hold(op, path); /* outside the lock: the others go on */
        return 0;       /* released: the operation goes ahead */
    }
    return fault;
}

int rk__fault_apply(int fault)
{
    if (fault == RK_FAULT_CRASH || fault == RK_FAULT_POWER) {
        raise(SIGKILL);
        return -EINTR; /* not reached */
    }
    if (fault == RK_FAULT_HANG)
        return -EIO; /* not reached: rk__fault holds the operation until it is released */
    return fault == RK_FAULT_SHORT ? -EIO : fault;
}

/* The point named `op`, or -1. */
static int point_of(const char *op)
{
    for (int i = 0; i < RK_FAULT_OP_COUNT; i++)
        if (strcmp(op, op_names[i]) == 0)
            return i;
    return -1;
}

void rk__fault_point(const char *op)
{
    ensure_loaded();
    if (atomic_load_explicit(&nrules, memory_order_relaxed) == 0)
        return; /* the common case, on the ring's hot path: nothing asked for */
    int i = point_of(op);
    if (i >= 0 && rk__fault((enum rk__fault_op)i, NULL) == RK_FAULT_CRASH)
        rk__fault_apply(RK_FAULT_CRASH);
}

int rk__fault_fail(const char *op)
{
    ensure_loaded();
    if (atomic_load_explicit(&nrules, memory_order_relaxed) == 0)
        return 0;
    int i = point_of(op), f = i >= 0 ? rk__fault((enum rk__fault_op)i, NULL) : 0;
    return f ? rk__fault_apply(f) : 0;
}
