/*
 * tools/run_loop.c - the launcher's loop of `rekindle run`: each attempt launched under
 * mpirun, watched until mpirun ends, judged by the workers' records, then completed,
 * relaunched (a failure with restarts left, or a stop to grow) or failed. The command
 * line, the job secret and RK_RUN_DIR are tools/cmd_run.c's; the records tools/records.c's;
 * the worker's wrapper tools/run_worker.c's; an elastic run's growth tools/run_grow.c's.
 *
 * Why it watches at all: with --enable-recovery and orte_abort_on_non_zero_status 0,
 * mpirun (Open MPI 4.1) exits 0 whatever its processes did, and never exits once a
 * process on another host died (docs/LAUNCHER.md, "When is a job done?").
 *
 * Invariants (tests/test_run.c, test_run_records.c and test_hosts.c name the one each
 * test checks):
 *  L1. The verdict comes from the records alone: the job completed if a worker's PROGRAM
 *      exited 0 (a spare's only if it joined the job: joined-<R>); otherwise it died with
 *      the lowest failing rank's status. mpirun's own status counts only when no worker
 *      recorded anything (mpirun could not start the job).
 *  L2. mpirun is stopped when the records say the job is over, and only then (signals
 *      and growth aside): every worker recorded its end (DONE_GRACE_MS later); or some did
 *      and for LATE_GRACE_MS since the last record no other showed a sign of life; or none
 *      did and none showed a sign of life for LATE_GRACE_MS since the newest beat read
 *      (a sign of life: a beat read new, by the launcher's clock: records.c R3); or none
 *      ever beat within --start-timeout of the launch (mpirun could not start the workers:
 *      a host it cannot reach, or one lost while it started them). A worker that beats is
 *      waited for, however long.
 *  L3. Bounded: once stopping, the session is SIGKILLed at most RUN_GRACE_MS later (at
 *      once on a second signal); mpirun's end is kept by whichever call reaps it (reap);
 *      the sweep of what is left is bounded by SWEEP_MS.
 *  L4. Nothing of the job outlives it on the launcher's host: once mpirun ended, every
 *      process left in its session (setsid: mpirun's own) is SIGKILLed.
 *  L5. A stopping signal (SIGINT, SIGTERM, SIGHUP as SIGTERM) is passed to mpirun once
 *      and ends the run: 128+signal, no relaunch.
 *  L6. A failed job is launched again at most --max-restarts times; a launch stopped to
 *      grow in which no worker completed is launched again without counting a restart.
 *
 * States of one attempt (struct watch) and the function for each transition:
 *
 *     watch_start --> RUNNING --watch_signal--------------------> STOPPING (signal: L5)
 *                       |  \---watch_records: over (L2)---------> STOPPING (SIGTERM)
 *                       |   \--watch_grow: grow_tick or
 *                       |      grow_spares_tick true (relaunch)-> STOPPING (stop file, SIGTERM)
 *                       |                   STOPPING --watch_escalate: RUN_GRACE_MS,
 *                       |                                or a 2nd signal--> KILLED (SIGKILL)
 *     RUNNING, STOPPING, KILLED --reap: mpirun reaped--> ENDED --session_sweep--> (judge)
 *
 *   RUNNING:  mpirun runs, nothing sent to it; the records and growth are read each tick.
 *   STOPPING: a signal was sent to mpirun (stop_sig the launcher's, if it was one);
 *             kill_at is when the session is SIGKILLed. The records are no longer read.
 *   KILLED:   the session was SIGKILLed; waiting only for mpirun's end.
 *   ENDED:    mpirun reaped (status); what is left of its session is swept (L4).
 *
 * The run (run_loop): attempt k = 0, 1, ... each RUN_DIR/attempt-K; after each, judge:
 * completed -> exit 0; stopped by a signal -> 128+signal; stopped to grow, none completed
 * -> attempt k+1 (elastic_size first; a run with spares: the held-back slots as workers); died with restarts left -> attempt k+1; else the
 * job's status.
 */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run.h"
#include "tools.h"

extern char **environ;

enum {
    RUN_GRACE_MS = 5000,  /* after a forwarded signal, before SIGKILL of the session */
    DONE_GRACE_MS = 2000, /* every worker recorded its end: mpirun's time to notice */
    LATE_GRACE_MS = 5000, /* a worker ended (completed or failed), or none did: how long,
                             since the last record or the newest beat, the others may go
                             without a sign of life (their wrappers' beat) before they count
                             as lost */
    SWEEP_MS = 2000,      /* bound on waiting for SIGKILLed leftovers to disappear */
    TICK_MS = 100,
};

/* Whether the directory exists and has an entry (. and .. aside). */
static bool dir_has_entry(const char *path)
{
    DIR *d = opendir(path);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));)
        found = e->d_name[0] != '.';
    if (d)
        closedir(d);
    return found;
}

/* A high-speed fabric on this host: an RDMA device (InfiniBand, RoCE, EFA, Omni-Path, any
   device of the kernel's infiniband class), a Slingshot NIC (cxi), or the character devices
   of Omni-Path (hfi1) and TrueScale (ipath). */
static bool has_fabric(void)
{
    glob_t g = {0};
    bool dev = glob("/dev/hfi1*", 0, NULL, &g) == 0 || glob("/dev/ipath*", GLOB_APPEND, NULL, &g) == 0;
    globfree(&g);
    return dev || dir_has_entry("/sys/class/infiniband") || dir_has_entry("/sys/class/cxi");
}

/* Whether an MCA parameter file selects a pml or an mtl ("pml = ucx"; an exclusion such as
   Debian's "pml = ^ucx" selects nothing). */
static bool file_selects_transport(const char *path)
{
    FILE *f = path ? fopen(path, "re") : NULL;
    if (!f)
        return false;
    char line[512];
    bool sel = false;
    while (!sel && fgets(line, sizeof(line), f)) {
        char *l = line + strspn(line, " \t");
        if (strncmp(l, "pml", 3) != 0 && strncmp(l, "mtl", 3) != 0)
            continue;
        l += 3 + strspn(l + 3, " \t");
        if (*l++ != '=')
            continue;
        l += strspn(l, " \t");
        sel = *l && *l != '^' && *l != '\n' && *l != '#';
    }
    fclose(f);
    return sel;
}

/* Open MPI's point-to-point layer left to Open MPI's TCP and shared-memory path (pml ob1)
   when this host has no fabric for another and nobody chose one (OMPI_MCA_pml or
   OMPI_MCA_mtl in the environment, a selection in the user's or the system's MCA parameter
   file: Debian's /etc/openmpi, or PREFIX/etc beside mpirun's PREFIX/bin). Unasked, every process's MPI_Init probes the PSM, PSM2 and OFI transports for
   hardware that is not there, and ends on ob1 all the same: 225-233 ms against 21-28 ms
   (Open MPI 4.1.4 on this project's machines; docs/LAUNCHER.md). A worker started while the
   job runs pays it too, inside a growth in place. */
static bool pml_ob1(const char *mpirun)
{
    if (getenv("OMPI_MCA_pml") || getenv("OMPI_MCA_mtl") || has_fabric())
        return false;
    const char *home = getenv("HOME"), *bin = strrchr(mpirun, '/');
    char user[PATH_MAX] = "", prefix[PATH_MAX] = "";
    if (home && *home)
        snprintf(user, sizeof(user), "%s/.openmpi/mca-params.conf", home);
    if (bin && bin - mpirun >= 4 && strncmp(bin - 4, "/bin", 4) == 0)
        snprintf(prefix, sizeof(prefix), "%.*s/etc/openmpi-mca-params.conf", (int)(bin - 4 - mpirun), mpirun);
    return !file_selects_transport(user) && !file_selects_transport(prefix) &&
           !file_selects_transport("/etc/openmpi/openmpi-mca-params.conf");
}

/* The argv of mpirun for one attempt (malloc'd array; strings from argv, env or static). */
static char **mpirun_argv(const char *mpirun, const char *self, const struct run_args *a, const char *rec_dir,
                          char *nbuf)
{
    size_t nenv = 0, nprog = 0;
    for (char **e = environ; *e; e++)
        nenv += strncmp(*e, "RK_", 3) == 0;
    while (a->prog[nprog])
        nprog++;
    char **v = calloc(28 + 2 * nenv + nprog, sizeof(char *));
    if (!v)
        return NULL;
    size_t k = 0;
    v[k++] = (char *)mpirun;
    v[k++] = "-n";
    v[k++] = nbuf;
    v[k++] = "--enable-recovery";
    v[k++] = "--mca";
    v[k++] = "orte_abort_on_non_zero_status";
    v[k++] = "0";
    /* No final barrier in MPI_Finalize: survivors must not wait there for lost peers. */
    v[k++] = "--mca";
    v[k++] = "async_mpi_finalize";
    v[k++] = "1";
    v[k++] = "--oversubscribe";
    v[k++] = "--mca";
    v[k++] = "btl_vader_single_copy_mechanism";
    v[k++] = "none";
    if (geteuid() == 0)
        v[k++] = "--allow-run-as-root";
    if (pml_ob1(mpirun)) {
        v[k++] = "--mca";
        v[k++] = "pml";
        v[k++] = "ob1";
    }
    if (a->hostfile) {
        v[k++] = "--hostfile";
        v[k++] = (char *)a->hostfile;
    }
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "RK_", 3) != 0)
            continue;
        char *eq = strchr(*e, '=');
        v[k++] = "-x";
        v[k++] = eq ? strndup(*e, (size_t)(eq - *e)) : strdup(*e); /* freed by free_argv */
    }
    v[k++] = (char *)self;
    v[k++] = "run";
    v[k++] = "--rk-worker";
    v[k++] = (char *)rec_dir;
    v[k++] = "--";
    for (size_t i = 0; i < nprog; i++)
        v[k++] = a->prog[i];
    v[k] = NULL;
    return v;
}

static void free_argv(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        if (strcmp(v[i], "-x") == 0 && v[i + 1])
            free(v[++i]);
    free(v);
}

/* Reaps what ended among our children: mpirun, and orphans of its session that came
   back to us (a subreaper). mpirun's status goes to *status once (*reaped): whichever
   call reaps it, its end is never lost (the loop would wait for it for ever). */
static void reap(pid_t mpirun, int *status, bool *reaped)
{
    int ws = 0;
    for (pid_t w; (w = waitpid(-1, &ws, WNOHANG)) > 0;)
        if (w == mpirun && !*reaped) {
            *status = ws;
            *reaped = true;
        }
}

/* SIGKILLs every process of session `sid` (mpirun's; mpirun is its leader) but ourselves,
   and reaps. Returns how many were still there (0: the session is empty, zombies aside). */
static int session_kill(pid_t sid, int *status, bool *reaped)
{
    int found = run_procs_signal(sid, true, SIGKILL);
    reap(sid, status, reaped);
    return found;
}

static void session_sweep(pid_t sid)
{
    int64_t deadline = rk__deadline_ns(SWEEP_MS);
    int status = 0;
    bool reaped = true; /* mpirun was: whatever is left is an orphan */
    while (session_kill(sid, &status, &reaped) > 0 && !rk__deadline_passed(deadline)) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* How the workers of one attempt ended, from their records. */
struct verdict {
    int recorded;  /* workers that recorded how they ended */
    int ok;        /* workers whose PROGRAM exited 0 (a spare only if it joined the job) */
    int unused;    /* spares that exited 0 without having joined: they say nothing of the job */
    int64_t last_beat_ns; /* the newest sign of life of a worker with no record (0: none) */
    int nproc;     /* the processes judged: the launch's and the workers started since */
    int job_status; /* the lowest failing rank's exit code or 128+signal; 0 if none */
    char lost[512]; /* "rank 1 (node3): killed by signal 9; rank 2: no record" */
};

/* with_host: name each lost worker's host (a job started with --hostfile). Ranks from
   `members` on are the spares: one that exited 0 without having joined (no joined-<R>
   note, written by the library when recovery brings it in) is unused, and an unused
   spare's 0 is not the job's completion (its members may all have failed). With `joins`,
   the slots above the launch's (workers started while the job runs: recover/join_proto.c)
   are judged as spares, those that left a record or a beat. */
static void judge(struct records *rec, int nproc, int members, bool joins, bool with_host, struct verdict *v)
{
    memset(v, 0, sizeof(*v));
    size_t len = 0;
    int listed = 0;
    v->nproc = nproc;
    for (int r = 0; r < nproc + (joins ? RK_JOIN_SLOTS : 0); r++) {
        char what[64] = "", on[80] = "", kind[16], host[64];
        int code = -1, status;
        rec_read_end(rec, r, kind, &code, host);
        if (r >= nproc && !kind[0] && !rec_beat_seen(rec, r))
            continue; /* no worker was started at that slot */
        v->nproc += r >= nproc;
        v->recorded += kind[0] != '\0';
        if (!kind[0]) {
            int64_t beat = rec_beat_seen(rec, r);
            v->last_beat_ns = beat > v->last_beat_ns ? beat : v->last_beat_ns;
        }
        if (strcmp(kind, "exit") == 0 && code == 0) {
            char joined[32];
            snprintf(joined, sizeof(joined), "joined-%d", r);
            if (r >= members && !rec_exists(rec, joined))
                v->unused++;
            else
                v->ok++;
            continue;
        }
        if (host[0] && with_host)
            snprintf(on, sizeof(on), " (%s)", host);
        if (strcmp(kind, "exit") == 0) {
            snprintf(what, sizeof(what), "exit %d", code);
            status = code;
        } else if (strcmp(kind, "signal") == 0) {
            snprintf(what, sizeof(what), "killed by signal %d (%s)", code, strsignal(code));
            status = 128 + code;
        } else {
            snprintf(what, sizeof(what), "ended without a record");
            status = 1;
        }
        if (v->job_status == 0)
            v->job_status = status;
        if (listed++ < 8 && len < sizeof(v->lost))
            len += (size_t)snprintf(v->lost + len, sizeof(v->lost) - len, "%srank %d%s: %s", len ? "; " : "", r, on,
                                    what);
    }
    if (listed > 8 && len < sizeof(v->lost))
        snprintf(v->lost + len, sizeof(v->lost) - len, "; %d more", listed - 8);
}

enum watch_state { RUNNING, STOPPING, KILLED, ENDED };

/* One attempt's mpirun, watched (the header's diagram). */
struct watch {
    enum watch_state state;
    pid_t mpirun;       /* leader of its own session */
    int status;         /* mpirun's wait status, once ENDED */
    int stop_sig;       /* the stopping signal the launcher received (0: none) */
    int64_t kill_at;    /* STOPPING: when the session is SIGKILLed */
    int recorded;       /* workers whose end was recorded, at the last read */
    int64_t record_at;  /* when that count last changed */
    int64_t all_since;  /* when every worker had recorded (0: not yet) */
    int64_t launched;   /* when mpirun was started */
    int64_t start_by;   /* no beat of any worker by then: mpirun could not start them (L2) */
    struct records *rec;
    int nproc, members;
    struct grow *g;     /* the run's growth, NULL: none */
};

/* -> STOPPING (from RUNNING or STOPPING): sig to mpirun, the session SIGKILLed RUN_GRACE_MS
   later. */
static void watch_stop(struct watch *w, int sig)
{
    kill(w->mpirun, sig);
    if (w->state == KILLED)
        return; /* already past the grace */
    w->kill_at = rk__deadline_ns(RUN_GRACE_MS);
    w->state = STOPPING;
}

/* A signal to the launcher: passed on once (L5); a second one escalates at once (L3). */
static void watch_signal(struct watch *w, int sig)
{
    if (w->stop_sig == 0) {
        w->stop_sig = sig;
        watch_stop(w, sig == SIGHUP ? SIGTERM : sig);
    } else {
        w->kill_at = 0;
    }
}

/* RUNNING: whether the records say the job is over (L2); if so, stops mpirun and says why. */
static void watch_records(struct watch *w)
{
    struct verdict v;
    judge(w->rec, w->nproc, w->members, w->g && w->g->joins, false, &v);
    int64_t now = rk__mono_ns();
    if (v.recorded != w->recorded) {
        w->recorded = v.recorded;
        w->record_at = now;
    }
    if (v.recorded == v.nproc && !w->all_since)
        w->all_since = now;
    int64_t life = v.last_beat_ns > w->record_at ? v.last_beat_ns : w->record_at; /* of the rest */
    int64_t end_at = w->all_since ? w->all_since + DONE_GRACE_MS * 1000000LL
                     : v.recorded > 0 ? life + LATE_GRACE_MS * 1000000LL
                     : v.last_beat_ns > 0 ? v.last_beat_ns + LATE_GRACE_MS * 1000000LL /* all silent */
                                         : w->start_by;                                 /* none started */
    if (now < end_at)
        return;
    if (v.recorded == 0 && v.last_beat_ns == 0)
        fprintf(stderr, "rekindle: run: no worker has started within %.3g s of the launch (no beat of any "
                        "worker's wrapper: mpirun could not start them on their hosts), but mpirun is still "
                        "running: stopping it (--start-timeout)\n",
                (double)(w->start_by - w->launched) / 1e9);
    else if (v.recorded == 0)
        fprintf(stderr, "rekindle: run: no worker has recorded its end and none has shown a sign of life for %d ms "
                        "(lost with their hosts), but mpirun is still running: stopping it\n",
                LATE_GRACE_MS);
    else if (v.recorded == v.nproc)
        fprintf(stderr, "rekindle: run: every worker has ended, but mpirun is still running: stopping it\n");
    else
        fprintf(stderr,
                "rekindle: run: %s: %d of %d workers ended (%d completed), the other %d show no sign "
                "of life for %d ms (lost with their hosts), but mpirun is still running: stopping it\n",
                v.ok > 0 ? "the job completed" : "the job failed", v.recorded, v.nproc, v.ok, v.nproc - v.recorded,
                LATE_GRACE_MS);
    watch_stop(w, SIGTERM);
}

/* RUNNING: the growth of an elastic run, or of a run with spares (run_grow.c), wrote the
   stop file to relaunch larger: mpirun goes too. */
static void watch_grow(struct watch *w, struct grow *g)
{
    if (g->el ? grow_tick(g) : grow_spares_tick(g))
        watch_stop(w, SIGTERM);
}

/* STOPPING -> KILLED once kill_at passed (L3). */
static void watch_escalate(struct watch *w)
{
    if (rk__mono_ns() < w->kill_at)
        return;
    fprintf(stderr, "rekindle: run: workers still running %d ms after the signal: killing them\n", RUN_GRACE_MS);
    kill(-w->mpirun, SIGKILL);
    bool reaped = false;
    session_kill(w->mpirun, &w->status, &reaped);
    w->state = reaped ? ENDED : KILLED;
}

/* Runs mpirun (argv) to its end through the states above. Returns its wait status, or
   -errno if it could not be started; *stop_sig: the stopping signal received (0: none).
   Signals in `watch` are blocked by the caller. */
static int run_mpirun(char **argv, const sigset_t *watch, const sigset_t *old_mask, int *stop_sig,
                      struct records *rec, int nproc, int members, double start_timeout_s, struct grow *g)
{
    int64_t launched = rk__mono_ns();
    struct watch w = {.state = RUNNING, .kill_at = INT64_MAX, .rec = rec, .nproc = nproc, .members = members, .g = g,
                      .launched = launched, .start_by = launched + (int64_t)(start_timeout_s * 1e9)};
    w.mpirun = fork();
    if (w.mpirun < 0)
        return -errno;
    if (w.mpirun == 0) {
        setsid(); /* its own session and process group (L4) */
        sigprocmask(SIG_SETMASK, old_mask, NULL);
        execv(argv[0], argv);
        fprintf(stderr, "rekindle: run: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    while (w.state != ENDED) {
        struct timespec tick = {0, TICK_MS * 1000 * 1000};
        int sig = sigtimedwait(watch, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
            watch_signal(&w, sig);
        bool reaped = false;
        reap(w.mpirun, &w.status, &reaped);
        if (reaped)
            w.state = ENDED;
        else if (w.state == RUNNING)
            watch_records(&w);
        if (g && w.state == RUNNING)
            watch_grow(&w, g);
        if (w.state == STOPPING)
            watch_escalate(&w);
    }
    session_sweep(w.mpirun);
    *stop_sig = w.stop_sig;
    return w.status;
}

/* One launch: records into RUN_DIR/attempt-K. Returns 0 and fills *v, or the launcher's
   exit status when it cannot tell (mpirun did not start, or a stopping signal). */
static int attempt(const struct run_ctx *c, int k, int *stop_sig, struct verdict *v, struct grow *g)
{
    const struct run_args *a = c->a;
    char nbuf[16], kbuf[16], why[PATH_MAX + 160];
    struct records rec;
    if (rec_open_attempt(c->run, k, a->n + a->spares, &rec, why, sizeof(why)) != 0)
        return tool_error(TOOL_USAGE, "run: the records directory %s", why);
    snprintf(nbuf, sizeof(nbuf), "%d", a->n + a->spares);
    snprintf(kbuf, sizeof(kbuf), "%d", k);
    setenv("RK_RUN_ATTEMPT", kbuf, 1);
    char **argv = mpirun_argv(c->mpirun, c->self, a, rec.path, nbuf);
    if (!argv) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: out of memory");
    }
    if (g)
        g->rec = &rec;
    int status = run_mpirun(argv, c->watch, c->old, stop_sig, &rec, a->n + a->spares, a->n, a->start_timeout_s, g);
    free_argv(argv);
    if (g)
        g->rec = NULL;
    if (status < 0) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: cannot start mpirun: %s", strerror(-status));
    }
    judge(&rec, a->n + a->spares, a->n, g && g->joins, a->hostfile != NULL, v);
    rec_close(&rec);
    if (*stop_sig)
        return 128 + *stop_sig;
    if (v->recorded == 0) {
        /* no worker recorded its end: mpirun itself failed (its own message is above) */
        int ms = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        v->job_status = ms ? ms : 1;
        snprintf(v->lost, sizeof(v->lost), "no worker recorded its end; mpirun exit status %d", ms);
    }
    return 0;
}

int run_loop(const struct run_ctx *c)
{
    struct run_args *a = c->a;
    struct elastic *el = c->el;
    int status = 0, stop_sig = 0, restarts = 0, first_n = a->n;
    char hostfile[PATH_MAX];
    rk_options o;
    rk_options_init(&o);
    /* in every worker's environment, even one whose program calls MPI_Init itself */
    rk__mpi_bound_exchanges(o.timeout_ms);
    for (int k = 0; status == 0; k++) {
        struct verdict v;
        struct grow g = {.el = el, .a = a, .ckpt_dir = getenv("RK_CKPT_DIR"), .run = c->run, .base = -2};
        if (el) {
            if ((status = elastic_size(a, el, first_n, c->run, k, c->watch, hostfile, sizeof(hostfile))) != 0)
                break;
            g.workers = g.alive = a->n;
            if (g.ckpt_dir && !*g.ckpt_dir)
                g.ckpt_dir = NULL;
            if (!(g.seen = calloc((size_t)a->n + RK_JOIN_SLOTS, 1))) {
                status = tool_error(TOOL_USAGE, "run: out of memory");
                break;
            }
        }
        bool spares = !el && a->spares > 0; /* grows when RK_RUN_DIR/grow asks (run_grow.c) */
        status = attempt(c, k, &stop_sig, &v, el || spares ? &g : NULL);
        free(g.seen);
        if (status != 0)
            break; /* stopped (L5), or could not launch */
        if (g.regrow && v.ok == 0) {
            if (spares) { /* the held-back slots started as workers */
                char sbuf[16];
                a->spares = a->n + a->spares - g.target;
                a->n = g.target;
                snprintf(sbuf, sizeof(sbuf), "%d", a->spares);
                setenv("RK_SPARES", sbuf, 1);
            }
            fprintf(stderr, "rekindle: run: launching again to grow (not a restart)\n");
            continue;
        }
        if (v.ok > 0) {
            if (v.lost[0])
                fprintf(stderr, "rekindle: run: job completed by %d of %d workers; lost: %s\n", v.ok,
                        v.nproc - v.unused, v.lost);
            status = 0;
            break;
        }
        status = v.job_status ? v.job_status : 1;
        if (restarts >= a->max_restarts) {
            fprintf(stderr, "rekindle: run: job failed (%s)%s\n", v.lost, a->max_restarts ? ": no restarts left" : "");
            break;
        }
        restarts++;
        fprintf(stderr, "rekindle: run: job failed (%s): relaunching, restart %d of %d\n", v.lost, restarts,
                a->max_restarts);
        status = 0;
    }
    return status;
}
