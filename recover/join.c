/*
 * recover/join.c - how processes started while the job runs come into its communicator:
 * the members spawn them and merge with them, on a thread of each side that is given up
 * on at a deadline (docs/LAUNCHER.md, "Joining processes started later").
 *
 * Why a thread: with Open MPI 4.1, MPI_Comm_spawn never returns when the newcomer ends
 * before its MPI_Init, and MPI_Intercomm_merge never returns when it dies between its
 * MPI_Init and the merge; no MPI call gets them out (ULFM's neither). On a thread of their
 * own (MPI_THREAD_MULTIPLE) they can be left there while the members' point-to-point,
 * on which the ring and the recovery run, goes on at full pace (bench/mpi_connect_probe.c
 * merge, merge-dies, merge-noinit; docs/LAUNCHER.md). What the thread runs, in order:
 *
 *   member:   MPI_Comm_create_group(parent, the members) -> MPI_Comm_spawn_multiple over
 *             that (root: the first member; one command per newcomer, each with its own
 *             host and environment) -> MPI_Intercomm_merge (low) -> the merged
 *             communicator and REC_JOIN_COMMS - 1 MPI_Comm_dup of it
 *   newcomer: MPI_Intercomm_merge(its parent intercommunicator, high) -> the same dups
 *
 * In each communicator handed out the members come first, in the order of `members`, then
 * the newcomers in the order of their own MPI_COMM_WORLD; errors are returned, never
 * fatal. The calling thread polls (rec_join_poll) against its own deadline.
 *
 * Invariants:
 *   J8  The caller never waits for the thread past its deadline. rec_join_poll returns
 *       REC_AGAIN, the communicators, or an error; rec_join_abandon leaves the thread
 *       where it is: if it ever returns, it frees what it made (its communicators are never
 *       handed out) and the join's memory, itself. One owner at a time: state RUNNING
 *       (both), DONE (the thread ended: the caller joins it and frees), LEFT (the caller
 *       let go: the thread frees).
 *   J9  A process that left a thread inside MPI never calls MPI_Finalize
 *       (rec_join_thread_left, read by rk_finalize): the finalize took the shared-memory
 *       transport down under that thread's progress loop and the process died of a
 *       segfault (1 of 2 runs); skipped, every run ended with status 0.
 *   J10 The thread makes no call through RK_MPI: the wedge watchdog (api_det.c) watches
 *       the training thread's calls, and a join given up on is not a wedge.
 *   J11 A join starts only where MPI gives MPI_THREAD_MULTIPLE (RK_E_STATE otherwise):
 *       below it, a second thread inside MPI is not allowed at all.
 *   J12 A thread given up on is put at SCHED_IDLE first: left inside the spawn or the
 *       merge, Open MPI polls for a peer that is gone without end (opal_progress), a core
 *       per member where nothing yields; at SCHED_IDLE it gets only CPU time that no other
 *       thread wants. It can hold a lock of Open MPI's when it is preempted: a thread
 *       that blocks on that lock sleeps, which leaves the core to it, and even on a core
 *       that is never idle a SCHED_IDLE thread gets a small share, so the cost is a delay,
 *       never a stall (docs/LAUNCHER.md has the figures).
 *   J13 Not every wait of the spawn stays on this thread. Inside MPI_Comm_spawn, Open MPI
 *       4.1 agrees on the new communicator's context id by a nonblocking request whose last
 *       step, a PMIx lookup of the newcomers' half, is run from opal_progress by whichever
 *       thread of the process polls first: at the root it can be the training thread, in
 *       a ring call's MPI_Iprobe, and a newcomer dead at that moment held it there (600 s
 *       as shipped) until the wedge watchdog ended the worker (docs/CHAOS.md, seed 4203).
 *       rk_init and `rekindle run` bound that lookup (common/mpi.c,
 *       rk__mpi_bound_exchanges: RK_TIMEOUT_MS / 3, at least 6 s, below the watchdog's
 *       RK_TIMEOUT_MS / 2 from 12 s up): the training thread waits at most that once, and the spawn then
 *       fails, so the thread comes back. Keeping the training thread out of MPI during the
 *       spawn was tried and does not close it: once the join is given up, training must
 *       poll MPI again while the thread may still be short of that step.
 *   J21 A thread given up on naps inside Open MPI's wait loop. SCHED_IDLE (J12) takes its
 *       core back only where the core is otherwise idle; what stayed is the thread's
 *       polling itself: Open MPI's progress engine run back to back, its locks taken
 *       against the training thread's calls (training at 0.73x of its pace where Open MPI
 *       does not yield, bench/join_spin.py). Open MPI calls every progress callback
 *       registered with it (opal_progress_register, found in the global scope, or through the
 *       MPI library's handle where Python loaded it; absent in another MPI: no nap, J12 alone) on each turn of that loop,
 *       with no lock held; Rekindle registers one, once, from the training thread at
 *       the first join, before any join thread exists (Open MPI's list of callbacks may
 *       be reallocated under a thread walking it). On any thread but a join's given up on
 *       it returns at once; on that one it sleeps REC_JOIN_NAP_MS first, so the thread
 *       wakes 1000 / REC_JOIN_NAP_MS times a second. The wait it is in cannot end earlier
 *       than its peer's return, which it was given up on for; another thread's blocking
 *       wait whose progress Open MPI left to it is progressed also by the training
 *       thread's own polling (every ring call and step), so nothing waits on the nap alone;
 *       and while another join runs (joins_running) it does not nap: that join's thread
 *       may wait on a condition for progress Open MPI leaves to the first waiter.
 *       Measured (bench/join_spin.py, 5 runs each): training after a give-up at 1.00x its
 *       pace before, against 0.72x with J12 alone.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rec_internal.h"

enum { JOIN_RUNNING, JOIN_DONE, JOIN_LEFT };

struct rec_join {
    atomic_int state;
    pthread_t thread;
    bool newcomer;
    /* what the thread runs on (the caller's copies, owned here) */
    MPI_Comm parent;           /* member: the communicator of the members; newcomer: its parent */
    MPI_Group group;           /* member: the members in parent */
    char *command, **argv;     /* command: "" but at the root, where the spawn reads it */
    char **hosts, **env;       /* n each: a newcomer's "host" and "env", NULL for none */
    int n;
    /* what it made: written by the thread before DONE, read by the caller after */
    MPI_Comm out[REC_JOIN_COMMS];
    int mrc;                   /* MPI_SUCCESS, or the failed call's code */
    _Atomic(const char *) what; /* the call under way, or that failed */
};

static atomic_int threads_left; /* joins given up on whose thread has not returned (J9) */

/* J21 */
#define REC_JOIN_NAP_MS 10 /* a thread given up on, each turn of Open MPI's wait loop */
static _Thread_local struct rec_join *this_join; /* the join this thread runs (join_main) */
static atomic_int joins_running;                  /* joins in state RUNNING */
static atomic_bool naps;                          /* the callback is Open MPI's (J21) */

static int nap_if_given_up(void)
{
    struct rec_join *j = this_join;
    if (!j)
        return 0;
    int st = atomic_load_explicit(&j->state, memory_order_relaxed);
    /* Not while another join runs: its thread's waits may be left to this one's progress. */
    if (st == JOIN_LEFT && atomic_load_explicit(&joins_running, memory_order_relaxed) == 0)
        nanosleep(&(struct timespec){.tv_nsec = REC_JOIN_NAP_MS * 1000000L}, NULL);
    return 0; /* no event of Open MPI's progressed */
}

static void register_nap(void)
{
    /* Open MPI's opal_progress_register is in libopen-pal, which libmpi loads: in the
       global scope of a program linked with MPI; not where Python loaded us (RTLD_LOCAL),
       then looked up through the MPI library's handle (taken once, kept). */
    int (*reg)(int (*)(void)) = (int (*)(int (*)(void)))dlsym(RTLD_DEFAULT, "opal_progress_register");
    Dl_info d;
    void *h = NULL;
    if (!reg && dladdr((void *)MPI_Comm_spawn, &d) && d.dli_fname && (h = dlopen(d.dli_fname, RTLD_LAZY | RTLD_NOLOAD)))
        reg = (int (*)(int (*)(void)))dlsym(h, "opal_progress_register");
    int rc = reg ? reg(nap_if_given_up) : -1;
    atomic_store(&naps, rc == 0);
    if (rc == 0)
        RK_LOG_DEBUG(RK_SUB_REC, "join: a thread given up on naps %d ms a turn of Open MPI's progress", REC_JOIN_NAP_MS);
    else
        RK_LOG_DEBUG(RK_SUB_REC, "join: %s: a thread given up on keeps polling (at SCHED_IDLE)",
                     reg ? "Open MPI did not take the progress callback" : "no opal_progress_register in this MPI");
}

bool rec_join_thread_left(void)
{
    return atomic_load(&threads_left) > 0;
}

static void free_join(struct rec_join *j)
{
    for (int i = 0; i < REC_JOIN_COMMS; i++)
        if (j->out[i] != MPI_COMM_NULL)
            MPI_Comm_free(&j->out[i]);
    if (j->group != MPI_GROUP_NULL)
        MPI_Group_free(&j->group);
    if (j->argv)
        for (char **a = j->argv; *a; a++)
            free(*a);
    for (int k = 0; k < j->n; k++) {
        free(j->hosts ? j->hosts[k] : NULL);
        free(j->env ? j->env[k] : NULL);
    }
    free(j->argv);
    free(j->command);
    free(j->hosts);
    free(j->env);
    free(j);
}

static void step(struct rec_join *j, const char *what)
{
    atomic_store(&j->what, what);
}

/* The newcomers started, one command each (the same program, its own "host" and "env"):
   the intercommunicator to them, or the failed call's code. */
static int spawn(struct rec_join *j, MPI_Comm members, MPI_Comm *inter)
{
    int n = j->n, mrc = MPI_SUCCESS;
    char **cmds = calloc((size_t)n, sizeof(char *)), ***argvs = calloc((size_t)n, sizeof(char **));
    int *procs = calloc((size_t)n, sizeof(int)), *errs = calloc((size_t)n, sizeof(int));
    MPI_Info *infos = calloc((size_t)n, sizeof(MPI_Info));
    if (!cmds || !argvs || !procs || !errs || !infos)
        mrc = MPI_ERR_NO_MEM;
    for (int k = 0; mrc == MPI_SUCCESS && k < n; k++) {
        cmds[k] = j->command;
        argvs[k] = j->argv;
        procs[k] = 1;
        infos[k] = MPI_INFO_NULL;
        const char *host = j->hosts ? j->hosts[k] : NULL, *env = j->env ? j->env[k] : NULL;
        if ((host || env) && (mrc = MPI_Info_create(&infos[k])) == MPI_SUCCESS) {
            if (host)
                MPI_Info_set(infos[k], "host", host);
            if (env)
                MPI_Info_set(infos[k], "env", env); /* Open MPI: "K=V" lines, set in this newcomer */
        }
    }
    step(j, "MPI_Comm_spawn");
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Comm_spawn_multiple(n, cmds, argvs, procs, infos, 0, members, inter, errs);
    for (int k = 0; mrc == MPI_SUCCESS && k < n; k++)
        mrc = errs[k]; /* a newcomer that did not start */
    for (int k = 0; infos && k < n; k++)
        if (infos[k] != MPI_INFO_NULL)
            MPI_Info_free(&infos[k]);
    free(cmds);
    free(argvs);
    free(procs);
    free(errs);
    free(infos);
    if (mrc != MPI_SUCCESS && *inter != MPI_COMM_NULL)
        MPI_Comm_free(inter);
    return mrc;
}

/* The thread's steps (J10: plain MPI calls). */
static void run(struct rec_join *j)
{
    MPI_Comm members = MPI_COMM_NULL, inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    if (j->newcomer) {
        inter = j->parent;
    } else {
        step(j, "MPI_Comm_create_group (the members)");
        if ((j->mrc = MPI_Comm_create_group(j->parent, j->group, REC_JOIN_TAG, &members)) != MPI_SUCCESS)
            return;
        MPI_Comm_set_errhandler(members, MPI_ERRORS_RETURN);
        j->mrc = spawn(j, members, &inter);
        MPI_Comm_free(&members);
        if (j->mrc != MPI_SUCCESS)
            return;
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    }
    step(j, "MPI_Intercomm_merge");
    j->mrc = MPI_Intercomm_merge(inter, j->newcomer, &merged);
    if (!j->newcomer)
        MPI_Comm_free(&inter);
    if (j->mrc != MPI_SUCCESS)
        return;
    MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    /* The merged communicator is the first handed out, the others its copies: each copy
       agrees on a context id over the new members, 40-45 ms over TCP (docs/BENCHMARKS.md). */
    j->out[0] = merged;
    step(j, "MPI_Comm_dup (the merged communicator)");
    for (int i = 1; i < REC_JOIN_COMMS && j->mrc == MPI_SUCCESS; i++)
        if ((j->mrc = MPI_Comm_dup(merged, &j->out[i])) == MPI_SUCCESS)
            MPI_Comm_set_errhandler(j->out[i], MPI_ERRORS_RETURN);
}

static void *join_main(void *arg)
{
    struct rec_join *j = arg;
    this_join = j;
    run(j);
    int expect = JOIN_RUNNING;
    /* Said before the state changes: a join not given up on is not freed until then. */
    if (!j->newcomer && j->mrc == MPI_SUCCESS && atomic_load(&j->state) == JOIN_RUNNING)
        RK_LOG_INFO(RK_SUB_REC, "join: %d worker(s) spawned and merged; brought in from the next rk_step_done", j->n);
    if (atomic_compare_exchange_strong(&j->state, &expect, JOIN_DONE)) {
        atomic_fetch_sub(&joins_running, 1);
    } else { /* LEFT: ours to free (J8) */
        RK_LOG_INFO(RK_SUB_REC, "a join given up on came back from %s (%s)", atomic_load(&j->what),
                    j->mrc == MPI_SUCCESS ? "it succeeded" : "it failed");
        this_join = NULL; /* its frees progress MPI too */
        free_join(j);
        atomic_fetch_sub(&threads_left, 1);
    }
    return NULL;
}

static int thread_level_ok(const char *who)
{
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE,
                        "%s: MPI runs at thread level %d, below MPI_THREAD_MULTIPLE: a join needs a second thread "
                        "inside MPI (initialize MPI with MPI_THREAD_MULTIPLE, or let rk_init do it)", who, level);
    return 0;
}

static int start(struct rec_join *j, struct rec_join **out)
{
    static pthread_once_t nap_once = PTHREAD_ONCE_INIT;
    pthread_once(&nap_once, register_nap); /* J21: before the first join thread */
    atomic_init(&j->state, JOIN_RUNNING);
    atomic_fetch_add(&joins_running, 1);
    pthread_attr_t attr;
    int e = pthread_attr_init(&attr);
    if (!e) {
        pthread_attr_setstacksize(&attr, 1u << 20);
        e = pthread_create(&j->thread, &attr, join_main, j);
        pthread_attr_destroy(&attr);
    }
    if (e) {
        atomic_fetch_sub(&joins_running, 1);
        free_join(j);
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -e, "join: cannot start its thread: %s", strerror(e));
    }
    *out = j;
    return 0;
}

static struct rec_join *new_join(void)
{
    struct rec_join *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->parent = MPI_COMM_NULL;
    j->group = MPI_GROUP_NULL;
    for (int i = 0; i < REC_JOIN_COMMS; i++)
        j->out[i] = MPI_COMM_NULL;
    return j;
}

/* Either side's start: MPI's thread level checked, a new join made. */
static int begin(struct rec_join **j)
{
    int rc = thread_level_ok("join");
    if (rc)
        return rc;
    *j = new_join();
    return *j ? 0 : -ENOMEM;
}

int rec_join_spawn(MPI_Comm parent, const int *members, int nmembers, const rec_join_spec *spec, struct rec_join **out)
{
    *out = NULL;
    int me = -1;
    MPI_Comm_rank(parent, &me);
    bool root = members && nmembers > 0 && members[0] == me; /* MPI_Comm_spawn reads the rest there alone */
    if (!spec || (root && (!spec->command || !*spec->command)) || spec->n < 1 || !members || nmembers < 1)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "join: no command, no newcomer or no member");
    struct rec_join *j = NULL;
    int rc = begin(&j);
    if (rc)
        return rc;
    size_t na = 0;
    while (spec->argv && spec->argv[na])
        na++;
    j->parent = parent;
    j->n = spec->n;
    j->command = strdup(root ? spec->command : "");
    j->argv = calloc(na + 1, sizeof(*j->argv));
    j->hosts = calloc((size_t)spec->n, sizeof(char *));
    j->env = calloc((size_t)spec->n, sizeof(char *));
    bool ok = j->command && j->argv && j->hosts && j->env;
    for (size_t i = 0; ok && i < na; i++)
        ok = (j->argv[i] = strdup(spec->argv[i])) != NULL;
    for (int k = 0; ok && k < spec->n; k++) {
        const char *h = spec->hosts ? spec->hosts[k] : NULL, *e = spec->env ? spec->env[k] : NULL;
        ok = (!h || !*h || (j->hosts[k] = strdup(h))) && (!e || !*e || (j->env[k] = strdup(e)));
    }
    if (!ok) {
        free_join(j);
        return -ENOMEM;
    }
    MPI_Group all;
    int mrc = MPI_Comm_group(parent, &all);
    if (mrc == MPI_SUCCESS) {
        mrc = MPI_Group_incl(all, nmembers, members, &j->group);
        MPI_Group_free(&all);
    }
    if (mrc != MPI_SUCCESS) {
        free_join(j);
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MPI, mrc, "join: the members' group");
    }
    return start(j, out);
}

int rec_join_newcomer(MPI_Comm parent, struct rec_join **out)
{
    *out = NULL;
    if (parent == MPI_COMM_NULL)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, -EINVAL, "join: this process was not spawned (no parent)");
    struct rec_join *j = NULL;
    int rc = begin(&j);
    if (rc)
        return rc;
    j->newcomer = true;
    j->parent = parent;
    return start(j, out);
}

int rec_join_poll(struct rec_join *j, MPI_Comm out[REC_JOIN_COMMS])
{
    if (atomic_load(&j->state) != JOIN_DONE)
        return REC_AGAIN;
    pthread_join(j->thread, NULL);
    atomic_store(&j->state, JOIN_LEFT); /* the thread is gone: nothing left to hand over */
    if (j->mrc != MPI_SUCCESS)
        return rk__mpi_fail(RK_SUB_REC, RK_LOG_WARN, RK_E_MPI, j->mrc, atomic_load(&j->what));
    for (int i = 0; i < REC_JOIN_COMMS; i++) {
        out[i] = j->out[i];
        j->out[i] = MPI_COMM_NULL;
    }
    return 0;
}

void rec_join_end(struct rec_join **pj)
{
    struct rec_join *j = *pj;
    *pj = NULL;
    if (!j)
        return;
    int expect = JOIN_RUNNING;
    /* J12: before LEFT, while the thread is still ours to name (not detached). */
    int idle = atomic_load(&j->state) == JOIN_RUNNING ? pthread_setschedparam(j->thread, SCHED_IDLE,
                                                                               &(struct sched_param){0}) : -1;
    atomic_fetch_add(&threads_left, 1); /* before the thread can see LEFT and count itself out */
    if (atomic_compare_exchange_strong(&j->state, &expect, JOIN_LEFT)) {
        atomic_fetch_sub(&joins_running, 1);
        pthread_detach(j->thread); /* J8: it frees the join if it ever returns */
        char nap[80] = "";
        if (atomic_load(&naps)) /* J21 */
            snprintf(nap, sizeof(nap), ", napping %d ms a turn of Open MPI's progress", REC_JOIN_NAP_MS);
        RK_LOG_WARN(RK_SUB_REC, "join given up on inside %s: its thread stays there (%s%s); this process will not "
                    "call MPI_Finalize", atomic_load(&j->what) ? atomic_load(&j->what) : "its first MPI call",
                    idle == 0 ? "at SCHED_IDLE: it runs only on a core nothing else wants" : "at its priority", nap);
        return;
    }
    atomic_fetch_sub(&threads_left, 1);
    if (expect == JOIN_DONE)
        pthread_join(j->thread, NULL);
    free_join(j);
}
