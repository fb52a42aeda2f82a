/*
 * tools/cmd_run.c - `rekindle run`: launches a program on N workers with Open MPI so that
 * survivors outlive a lost worker, and relaunches a job that died as a whole.
 *
 *   rekindle run -n N [--spares S] [--hostfile F] [--max-restarts R] -- PROGRAM [ARGS...]
 *
 * How it works (docs/LAUNCHER.md has the user's view):
 *   1. The environment: RK_JOB_SECRET (32 random bytes as 64 lowercase hex digits, unless
 *      one is set already), RK_SPARES=S, RK_RUN_DIR (a private directory for the run's
 *      records: tools/records.c, which refuses one that is not the job user's alone),
 *      RK_RUN_ATTEMPT (0 for the first launch, 1 for the first relaunch...).
 *      Every RK_* variable is forwarded to the workers with `mpirun -x NAME` (by name:
 *      the secret never appears on a command line).
 *   2. mpirun runs N+S copies of `rekindle run --rk-worker DIR -- PROGRAM ARGS`: a small
 *      wrapper that runs PROGRAM as its child, passes signals on, and when PROGRAM ends
 *      (an exit or a kill, never a stop) first tells the job's other workers at once
 *      (detector/det_parent.c: the child's detector told it, through a pipe passed in
 *      RK_RUN_PARENT, where they listen and the attempt's salt; RK_PARENT_REPORT=0 turns
 *      this off), then records how ("exit C" or "signal S", then "host H pid P": hosts
 *      may share a PID space) in DIR/rank-<R>, then ends the same way.
 *   3. Completion: with `--enable-recovery --mca orte_abort_on_non_zero_status 0`,
 *      mpirun (Open MPI 4.1) exits 0 whatever its processes did, even when every one of
 *      them failed. So the launcher judges by the records: the job completed if at least
 *      one worker's PROGRAM exited 0, a spare's only if it joined the job (workers that
 *      were lost along the way are reported on stderr). Otherwise the job died; with restarts left it is relaunched (and
 *      resumes from its latest checkpoint), else the launcher exits with the job's status:
 *      the exit code of the lowest failing rank, or 128+signal. mpirun itself may never
 *      exit after a process on another host died: once the records say the job is over
 *      (completed or failed: every worker ended, or lost with its host), the launcher
 *      stops it (run_mpirun).
 *   4. Processes: mpirun runs in its own session (setsid); Open MPI gives each worker its
 *      own process group, but all stay in that session. The launcher is a child
 *      subreaper, so orphans come back to it. When mpirun is gone, whatever is left in
 *      the session is SIGKILLed. SIGINT/SIGTERM/SIGHUP are passed to mpirun (a second one,
 *      or RUN_GRACE_MS without an end, escalates to SIGKILL of the whole session); the
 *      exit status is then 128+signal and there is no relaunch.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../detector/det.h"
#include "run.h"
#include "run_elastic.h"
#include "tools.h"

extern char **environ;

enum {
    RUN_GRACE_MS = 5000,  /* after a forwarded signal, before SIGKILL of the session */
    DONE_GRACE_MS = 2000, /* every worker recorded its end: mpirun's time to notice */
    LATE_GRACE_MS = 5000, /* a worker ended (completed or failed): how long, since the last
                             record, the others may go without a sign of life (their
                             wrappers' beat) before they count as lost */
    STOP_POLL_MS = 20,    /* how often the wrapper looks for DIR/stop (a stop to grow) */
    SWEEP_MS = 2000,      /* bound on waiting for SIGKILLed leftovers to disappear */
    MAX_WORKERS = 1 << 16,
};

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: rekindle run -n N [--spares S] [--hostfile F] [--max-restarts R] -- PROGRAM [ARGS...]\n"
            "       rekindle run --host-discovery-script S [--min-np N] [--max-np M] [-n N] [...] -- PROGRAM\n\n"
            "Launches PROGRAM on N workers with Open MPI (mpirun) so that survivors outlive a\n"
            "lost worker, and relaunches a job that died as a whole so it resumes from its\n"
            "latest checkpoint.\n\n"
            "  -n N              workers (required, >= 1)\n"
            "  --spares S        start S more processes (RK_SPARES=S) that wait outside the ring\n"
            "                    and take the places of lost workers (needs RK_CKPT_DIR;\n"
            "                    default 0)\n"
            "  --hostfile F      Open MPI hostfile, passed to mpirun (multi-host: set RK_RUN_DIR\n"
            "                    to a directory every host shares)\n"
            "  --max-restarts R  relaunch a job that died up to R times (default 0)\n\n"
            "Elastic (docs/LAUNCHER.md): the hosts come from a script, as with horovodrun.\n"
            "  --host-discovery-script S  a command printing one 'host:slots' (or 'host')\n"
            "                    line per host it may run on; run before every launch and\n"
            "                    every --discovery-interval while the job runs\n"
            "  --min-np N        fewest workers to launch with (default 1); waits up to\n"
            "                    --elastic-timeout for that many slots\n"
            "  --max-np M        most workers (default: every slot); -n N: the first launch's\n"
            "  --discovery-interval SEC  (default 3); touching RK_RUN_DIR/grow asks for a\n"
            "                    discovery at once\n"
            "  --blacklist-cooldown SEC  a host that lost a worker is not grown onto for\n"
            "                    this long (default 30)\n"
            "  --elastic-timeout SEC     (default 600)\n"
            "When more slots than workers are free (a host back after its cool-down, or a new\n"
            "one), the job grows: at its next committed checkpoint (needs RK_CKPT_DIR) it is\n"
            "stopped and launched again on every free slot, resuming from that checkpoint.\n"
            "Growth relaunches count no restart. Not with --hostfile or --spares.\n\n"
            "The workers get every RK_* variable of this environment, a job secret\n"
            "RK_JOB_SECRET (generated unless set: 64 hex digits), RK_RUN_DIR and\n"
            "RK_RUN_ATTEMPT. RK_RUN_DIR, the run's records (default: a new directory under\n"
            "$TMPDIR), is refused unless it is a directory of this user closed to group and\n"
            "other writes (a missing one is made 0700). The job completed if at least one\n"
            "worker exited 0 (a spare only if it was brought into the job); lost workers are\n"
            "reported on stderr.\n"
            "Workers still at work after another completed are waited for.\n"
            "SIGINT/SIGTERM stop every worker.\n\n"
            "exit status: 0 the job completed; the job's status (the lowest failing rank's\n"
            "exit code, or 128+signal) if it died with no restarts left; 128+signal if\n"
            "stopped by a signal; 2 usage or environment error (a refused RK_RUN_DIR too).\n");
}

static int parse_seconds(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !(v >= lo && v <= hi))
        return tool_error(TOOL_USAGE, "run: %s '%s': want seconds in %g..%g", opt, s ? s : "", lo, hi);
    *out = v;
    return 0;
}

static int parse_count(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return tool_error(TOOL_USAGE, "run: %s '%s': want an integer in %d..%d", opt, s ? s : "", lo, hi);
    *out = (int)v;
    return 0;
}

enum { RUN_HELP_SHOWN = -1 };

/* 0 parsed, RUN_HELP_SHOWN, TOOL_USAGE on a bad command line (message printed). */
static int parse_run_args(int argc, char **argv, struct run_args *a)
{
    *a = (struct run_args){.n = -1, .min_np = 1, .max_np = MAX_WORKERS, .interval_s = 3, .cooldown_s = 30,
                           .elastic_timeout_s = 600};
    bool min_given = false, max_given = false;
    int i = 1;
    for (; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            run_usage(stdout);
            return RUN_HELP_SHOWN;
        }
        if (o[0] != '-')
            break; /* PROGRAM without "--" */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc;
        if (strcmp(o, "-n") == 0 || strcmp(o, "-np") == 0)
            rc = parse_count(o, v, 1, MAX_WORKERS, &a->n);
        else if (strcmp(o, "--spares") == 0)
            rc = parse_count(o, v, 0, MAX_WORKERS, &a->spares);
        else if (strcmp(o, "--max-restarts") == 0)
            rc = parse_count(o, v, 0, 1000000, &a->max_restarts);
        else if (strcmp(o, "--hostfile") == 0) {
            if (!v)
                return tool_error(TOOL_USAGE, "run: --hostfile needs a file");
            if (access(v, R_OK) != 0)
                return tool_error(TOOL_USAGE, "run: --hostfile %s: %s", v, strerror(errno));
            a->hostfile = v;
            rc = 0;
        } else if (strcmp(o, "--host-discovery-script") == 0) {
            if (!v || !*v)
                return tool_error(TOOL_USAGE, "run: --host-discovery-script needs a command");
            a->discovery = v;
            rc = 0;
        } else if (strcmp(o, "--min-np") == 0) {
            rc = parse_count(o, v, 1, MAX_WORKERS, &a->min_np);
            min_given = true;
        } else if (strcmp(o, "--max-np") == 0) {
            rc = parse_count(o, v, 1, MAX_WORKERS, &a->max_np);
            max_given = true;
        } else if (strcmp(o, "--discovery-interval") == 0)
            rc = parse_seconds(o, v, 0.05, 3600, &a->interval_s);
        else if (strcmp(o, "--blacklist-cooldown") == 0)
            rc = parse_seconds(o, v, 0, 86400, &a->cooldown_s);
        else if (strcmp(o, "--elastic-timeout") == 0)
            rc = parse_seconds(o, v, 0, 86400, &a->elastic_timeout_s);
        else
            return tool_error(TOOL_USAGE, "run: unknown option '%s' (see rekindle run --help)", o);
        if (rc != 0)
            return rc;
        i++;
    }
    if (!a->discovery && (min_given || max_given))
        return tool_error(TOOL_USAGE, "run: --min-np and --max-np need --host-discovery-script");
    if (a->discovery && (a->hostfile || a->spares))
        return tool_error(TOOL_USAGE, "run: --host-discovery-script makes the hostfile itself: not with %s",
                          a->hostfile ? "--hostfile" : "--spares");
    if (a->discovery && a->min_np > a->max_np)
        return tool_error(TOOL_USAGE, "run: --min-np %d is more than --max-np %d", a->min_np, a->max_np);
    if (a->discovery && a->n > a->max_np)
        return tool_error(TOOL_USAGE, "run: -n %d is more than --max-np %d", a->n, a->max_np);
    if (a->n < 0 && !a->discovery)
        return tool_error(TOOL_USAGE, "run: -n N is required (see rekindle run --help)");
    if (i >= argc)
        return tool_error(TOOL_USAGE, "run: no PROGRAM to run (rekindle run -n N -- PROGRAM [ARGS...])");
    if (a->n + a->spares > MAX_WORKERS)
        return tool_error(TOOL_USAGE, "run: -n %d plus --spares %d is more than %d processes", a->n, a->spares,
                          MAX_WORKERS);
    a->prog = argv + i;
    return 0;
}

/* ---- the worker wrapper (rekindle run --rk-worker DIR -- PROGRAM ARGS) ------------------ */

/* The channel for reporting the child's death (detector/det_parent.c): a pipe, and the
   job's key from RK_JOB_SECRET, as the child's detector will derive it. NULL (and pfd
   -1) when RK_PARENT_REPORT=0 or there is no secret: the others then learn of a death
   from its silence alone. */
static det_parent *report_channel(const char *rank, int pfd[2])
{
    pfd[0] = pfd[1] = -1;
    const char *off = getenv("RK_PARENT_REPORT"), *secret = getenv("RK_JOB_SECRET");
    uint8_t key[DET_KEY_BYTES];
    if ((off && strcmp(off, "0") == 0) || !secret || det_key_from_secret(secret, key) != 0)
        return NULL;
    det_parent *pp = NULL;
    if (pipe2(pfd, O_CLOEXEC) != 0 || det_parent_open(&pp, pfd[0], key) != 0) {
        fprintf(stderr, "rekindle: run: rank %s: no channel to report its death (%s): the others will learn "
                        "it from its silence\n", rank, strerror(errno));
        for (int i = 0; i < 2; i++)
            if (pfd[i] >= 0)
                close(pfd[i]);
        pfd[0] = pfd[1] = -1;
    }
    explicit_bzero(key, sizeof(key));
    return pp;
}

static int worker_main(const char *dir, char **prog)
{
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank)
        rank = getenv("PMIX_RANK");
    if (!rank || !*rank || strspn(rank, "0123456789") != strlen(rank) || strlen(rank) > 9)
        return tool_error(TOOL_USAGE, "run --rk-worker: no OMPI_COMM_WORLD_RANK (not started by mpirun?)");
    /* The records directory is checked before anything is written there (records.c, R1);
       one that does not exist on this host (not shared) leaves the worker unrecorded, as a
       lost one, but one that exists and is not safe stops it here. */
    struct records rec;
    char why[PATH_MAX + 160];
    int orc = rec_open_worker(dir, &rec, why, sizeof(why));
    if (orc != 0 && orc != -ENOENT)
        return tool_error(TOOL_USAGE, "run: rank %s: the records directory %s", rank, why);
    if (orc == -ENOENT)
        fprintf(stderr, "rekindle: run: rank %s: %s: its end will not be recorded (set RK_RUN_DIR to a directory "
                        "every host shares)\n", rank, why);
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    int sfd = signalfd(-1, &all, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: rank %s: signalfd: %s", rank, strerror(errno));
    }
    int pfd[2];
    det_parent *pp = report_channel(rank, pfd);
    pid_t wrapper = getpid();
    pid_t child = fork();
    if (child < 0) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: rank %s: fork: %s", rank, strerror(errno));
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the wrapper lost: its program goes too */
        if (getppid() != wrapper)
            raise(SIGKILL); /* it was lost before the line above: as if it had been after */
        sigprocmask(SIG_SETMASK, &old, NULL);
        setenv("RK_RUN_RECORDS", dir, 1); /* where a spare notes that it joined (recover/) */
        char chan[64];
        int wfd = pfd[1] >= 0 ? fcntl(pfd[1], F_DUPFD, 3) : -1; /* a copy without close-on-exec */
        snprintf(chan, sizeof(chan), "%d:%ld", wfd, (long)wrapper);
        if (wfd >= 0)
            setenv("RK_RUN_PARENT", chan, 1); /* read by rk_init (recover/api_det.c) */
        else
            unsetenv("RK_RUN_PARENT");
        execvp(prog[0], prog);
        fprintf(stderr, "rekindle: run: rank %s: cannot start %s: %s\n", rank, prog[0], strerror(errno));
        _exit(127);
    }
    if (pfd[1] >= 0)
        close(pfd[1]);
    /* Pass on what is sent to the wrapper; end when the program ends (waitpid reports an end,
       never a stop), telling the others first; beat meanwhile, so the launcher can tell a
       worker still at work from one whose host is gone. DIR/stop, written by a launcher
       that stops the job to grow it, ends the program at once (SIGTERM), on every host:
       mpirun's own forwarding of the launcher's SIGTERM took 1-2 s, steps all lost. */
    int status = 0;
    bool pipe_open = pp != NULL, stopping = false;
    char host[256], addrs[512]; /* for a launcher that learns of a host gone from the beat */
    rec_this_host(host, sizeof(host), addrs, sizeof(addrs));
    uint64_t beats = 0;
    for (int64_t beat_at = 0;;) {
        if (rk__mono_ns() >= beat_at) {
            rec_beat(&rec, rank, beats++, host, addrs); /* not written: the launcher sees silence */
            beat_at = rk__deadline_ns(BEAT_MS);
        }
        struct pollfd pf[2] = {{.fd = sfd, .events = POLLIN}, {.fd = pipe_open ? pfd[0] : -1, .events = POLLIN}};
        int ms = (int)((beat_at - rk__mono_ns()) / 1000000) + 1;
        poll(pf, 2, ms > STOP_POLL_MS ? STOP_POLL_MS : ms > 0 ? ms : 0);
        if (!stopping && rec_exists(&rec, RUN_STOP_FILE)) {
            kill(child, SIGTERM);
            stopping = true;
        }
        if (pf[1].revents && det_parent_read(pp) != 0)
            pipe_open = false; /* closed: the child ended or exec'd a program without a detector */
        struct signalfd_siginfo si;
        bool ended = false;
        while (!ended && read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
            if (si.ssi_signo == SIGCHLD)
                ended = waitpid(child, &status, WNOHANG) == child;
            else
                kill(child, (int)si.ssi_signo);
        }
        if (ended)
            break;
    }
    det_parent_report(pp, status); /* before anything slower: the others are waiting */
    det_parent_close(&pp);
    if (pfd[0] >= 0)
        close(pfd[0]);
    close(sfd);
    char text[384];
    snprintf(text, sizeof(text), "%s %d host %s pid %ld\n", WIFSIGNALED(status) ? "signal" : "exit",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), host, (long)child);
    int rc = rec_write_end(&rec, rank, text);
    if (rc != 0)
        fprintf(stderr, "rekindle: run: rank %s: cannot record its end in %s: %s\n", rank, dir, strerror(-rc));
    rec_close(&rec);
    if (WIFSIGNALED(status)) {
        /* End the same way, so that mpirun sees what happened (no core of the wrapper). */
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(WTERMSIG(status), SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, WTERMSIG(status));
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        raise(WTERMSIG(status));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* ---- the launcher ------------------------------------------------------------------------ */

static char *find_in_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        return NULL;
    char *copy = strdup(path), *save = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
        char *cand = NULL;
        if (asprintf(&cand, "%s/%s", *d ? d : ".", name) < 0)
            break;
        if (access(cand, X_OK) == 0) {
            free(copy);
            return cand;
        }
        free(cand);
    }
    free(copy);
    return NULL;
}

/* RK_JOB_SECRET: kept if set (and well formed), otherwise 32 random bytes in hex. */
static int job_secret(void)
{
    const char *have = getenv("RK_JOB_SECRET");
    if (have) {
        uint8_t key[DET_KEY_BYTES]; /* the detector's own parser: what it takes, the launcher takes */
        int bad = det_key_from_secret(have, key);
        explicit_bzero(key, sizeof(key));
        if (bad)
            return tool_error(TOOL_USAGE, "run: RK_JOB_SECRET is set but is not %d hex digits", 2 * DET_KEY_BYTES);
        return 0;
    }
    unsigned char raw[DET_KEY_BYTES];
    for (size_t got = 0; got < sizeof(raw);) {
        ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return tool_error(TOOL_USAGE, "run: getrandom for RK_JOB_SECRET: %s", strerror(errno));
        got += (size_t)r;
    }
    char hex[2 * DET_KEY_BYTES + 1];
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    setenv("RK_JOB_SECRET", hex, 1);
    return 0;
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
    int job_status; /* the lowest failing rank's exit code or 128+signal; 0 if none */
    char lost[512]; /* "rank 1 (node3): killed by signal 9; rank 2: no record" */
};

/* with_host: name each lost worker's host (a job started with --hostfile). Ranks from
   `members` on are the spares: one that exited 0 without having joined (no joined-<R>
   note, written by the library when recovery brings it in) is unused, and an unused
   spare's 0 is not the job's completion (its members may all have failed). */
static void judge(struct records *rec, int nproc, int members, bool with_host, struct verdict *v)
{
    memset(v, 0, sizeof(*v));
    size_t len = 0;
    int listed = 0;
    for (int r = 0; r < nproc; r++) {
        char what[64] = "", on[80] = "", kind[16], host[64];
        int code = -1, status;
        rec_read_end(rec, r, kind, &code, host);
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

/* Runs mpirun to its end. Returns its wait status; *stop_sig is the first stopping
   signal received (0: none). Signals in `watch` are blocked by the caller.
   mpirun (Open MPI 4.1 with --enable-recovery) never exits once a process on another
   host has died, even after every other one ended: so when the records of rec_dir say
   the job is over (every one of nproc workers recorded its end: DONE_GRACE_MS; or some
   recorded it, completed or failed, and for LATE_GRACE_MS since the last record no other
   has shown a sign of life: the rest were lost with their hosts), mpirun is stopped as
   on SIGTERM. A worker still at work after another ended (rank 0 committing the last
   checkpoint, the program's own export, survivors training on in place after a loss)
   beats, and is waited for. */
static int run_mpirun(char **argv, const sigset_t *watch, const sigset_t *old_mask, int *stop_sig,
                      struct records *rec, int nproc, int members, struct grow *g)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        setsid(); /* its own session and process group: see the header, point 4 */
        sigprocmask(SIG_SETMASK, old_mask, NULL);
        execv(argv[0], argv);
        fprintf(stderr, "rekindle: run: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0, recorded = 0;
    int64_t kill_at = INT64_MAX, end_at = INT64_MAX, record_at = 0, all_since = 0;
    bool done = false, killed = false, ended = false;
    while (!done) {
        struct timespec tick = {0, 100 * 1000 * 1000};
        siginfo_t si;
        int sig = sigtimedwait(watch, &si, &tick);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            if (*stop_sig == 0) {
                *stop_sig = sig;
                kill(pid, sig == SIGHUP ? SIGTERM : sig);
                kill_at = rk__deadline_ns(RUN_GRACE_MS);
            } else {
                kill_at = 0; /* a second one: no more waiting */
            }
        }
        reap(pid, &status, &done);
        if (!done && !ended && *stop_sig == 0) {
            struct verdict v;
            judge(rec, nproc, members, false, &v);
            if (v.recorded != recorded) {
                recorded = v.recorded;
                record_at = rk__mono_ns();
            }
            if (v.recorded == nproc && !all_since)
                all_since = rk__mono_ns();
            int64_t life = v.last_beat_ns > record_at ? v.last_beat_ns : record_at; /* of the rest */
            end_at = all_since ? all_since + DONE_GRACE_MS * 1000000LL
                     : v.recorded > 0 ? life + LATE_GRACE_MS * 1000000LL
                     : v.last_beat_ns > 0 ? v.last_beat_ns + LATE_GRACE_MS * 1000000LL /* all silent */
                                         : INT64_MAX;
            if (rk__mono_ns() >= end_at) {
                if (v.recorded == 0)
                    fprintf(stderr, "rekindle: run: no worker has recorded its end and none has shown a sign of life "
                                    "for %d ms (lost with their hosts), but mpirun is still running: stopping it\n",
                            LATE_GRACE_MS);
                else if (v.recorded == nproc)
                    fprintf(stderr, "rekindle: run: every worker has ended, but mpirun is still running: stopping it\n");
                else
                    fprintf(stderr,
                            "rekindle: run: %s: %d of %d workers ended (%d completed), the other %d show no sign "
                            "of life for %d ms (lost with their hosts), but mpirun is still running: stopping it\n",
                            v.ok > 0 ? "the job completed" : "the job failed", v.recorded, nproc, v.ok,
                            nproc - v.recorded, LATE_GRACE_MS);
                kill(pid, SIGTERM);
                kill_at = rk__deadline_ns(RUN_GRACE_MS);
                ended = true;
            }
        }
        if (g && !done && !ended && *stop_sig == 0 && grow_tick(g)) {
            kill(pid, SIGTERM);
            kill_at = rk__deadline_ns(RUN_GRACE_MS);
            ended = true;
        }
        if (!done && !killed && rk__mono_ns() >= kill_at) {
            fprintf(stderr, "rekindle: run: workers still running %d ms after the signal: killing them\n",
                    RUN_GRACE_MS);
            kill(-pid, SIGKILL);
            session_kill(pid, &status, &done);
            killed = true;
        }
    }
    session_sweep(pid);
    return status;
}

/* RK_RUN_DIR, given (made 0700 if missing) or a fresh mkdtemp directory, held open and
   checked (records.c, R1). */
static int make_run_dir(struct records *run, bool *created)
{
    const char *given = getenv("RK_RUN_DIR");
    char why[PATH_MAX + 160], tmpl[PATH_MAX];
    *created = false;
    if (given && *given) {
        if (rec_open_run(given, true, run, why, sizeof(why)) != 0)
            return tool_error(TOOL_USAGE, "run: RK_RUN_DIR %s", why);
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpl, sizeof(tmpl), "%s/rekindle-run.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpl))
        return tool_error(TOOL_USAGE, "run: cannot create a run directory %s: %s", tmpl, strerror(errno));
    if (rec_open_run(tmpl, false, run, why, sizeof(why)) != 0) {
        rmdir(tmpl);
        return tool_error(TOOL_USAGE, "run: run directory %s", why);
    }
    *created = true;
    setenv("RK_RUN_DIR", tmpl, 1);
    return 0;
}

/* One launch: records into RUN_DIR/attempt-K. Returns 0 and fills *v, or the launcher's
   exit status when it cannot tell (mpirun did not start, or a stopping signal). */
static int attempt(const char *mpirun, const char *self, const struct run_args *a, const struct records *run, int k,
                   const sigset_t *watch, const sigset_t *old, int *stop_sig, struct verdict *v, struct grow *g)
{
    char nbuf[16], kbuf[16], why[PATH_MAX + 160];
    struct records rec;
    if (rec_open_attempt(run, k, a->n + a->spares, &rec, why, sizeof(why)) != 0)
        return tool_error(TOOL_USAGE, "run: the records directory %s", why);
    snprintf(nbuf, sizeof(nbuf), "%d", a->n + a->spares);
    snprintf(kbuf, sizeof(kbuf), "%d", k);
    setenv("RK_RUN_ATTEMPT", kbuf, 1);
    char **argv = mpirun_argv(mpirun, self, a, rec.path, nbuf);
    if (!argv) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: out of memory");
    }
    if (g)
        g->rec = &rec;
    int status = run_mpirun(argv, watch, old, stop_sig, &rec, a->n + a->spares, a->n, g);
    free_argv(argv);
    if (g)
        g->rec = NULL;
    if (status < 0) {
        rec_close(&rec);
        return tool_error(TOOL_USAGE, "run: cannot start mpirun: %s", strerror(-status));
    }
    judge(&rec, a->n + a->spares, a->n, a->hostfile != NULL, v);
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

int cmd_run(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--rk-worker") == 0 && strcmp(argv[3], "--") == 0 && argc >= 5)
        return worker_main(argv[2], argv + 4);

    struct run_args a;
    int rc = parse_run_args(argc, argv, &a);
    if (rc != 0)
        return rc == RUN_HELP_SHOWN ? TOOL_OK : rc;
    char *mpirun = find_in_path("mpirun");
    if (!mpirun)
        return tool_error(TOOL_USAGE, "run: mpirun not found in PATH (install Open MPI: scripts/install-deps)");
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0) {
        free(mpirun);
        return tool_error(TOOL_USAGE, "run: cannot find this program (/proc/self/exe): %s", strerror(errno));
    }
    self[sl] = '\0';
    struct records run;
    bool created = false;
    if ((rc = job_secret()) != 0 || (rc = make_run_dir(&run, &created)) != 0) {
        free(mpirun);
        return rc;
    }
    char sbuf[16];
    snprintf(sbuf, sizeof(sbuf), "%d", a.spares);
    setenv("RK_SPARES", sbuf, 1);
    if (a.hostfile && created)
        fprintf(stderr, "rekindle: run: note: with --hostfile, set RK_RUN_DIR to a directory every host shares, "
                        "or workers on other hosts cannot record how they ended\n");

    sigset_t watch, old;
    sigemptyset(&watch);
    sigaddset(&watch, SIGINT);
    sigaddset(&watch, SIGTERM);
    sigaddset(&watch, SIGHUP);
    sigaddset(&watch, SIGCHLD);
    sigprocmask(SIG_BLOCK, &watch, &old);
    prctl(PR_SET_CHILD_SUBREAPER, 1);

    int status = 0, stop_sig = 0, restarts = 0, first_n = a.n;
    struct elastic *el = a.discovery ? calloc(1, sizeof(*el)) : NULL;
    if (a.discovery && !el)
        status = tool_error(TOOL_USAGE, "run: out of memory");
    if (el) {
        el->script = a.discovery;
        el->min_np = a.min_np;
        el->max_np = a.max_np;
        el->cooldown_ms = (int)(a.cooldown_s * 1000);
    }
    char hostfile[PATH_MAX];
    for (int k = 0; status == 0; k++) {
        struct verdict v;
        struct grow g = {.el = el, .a = &a, .ckpt_dir = getenv("RK_CKPT_DIR"), .run = &run, .base = -2};
        if (el) {
            if ((status = elastic_size(&a, el, first_n, &run, k, &watch, hostfile, sizeof(hostfile))) != 0)
                break;
            g.workers = g.alive = a.n;
            if (g.ckpt_dir && !*g.ckpt_dir)
                g.ckpt_dir = NULL;
            if (!(g.seen = calloc((size_t)a.n, sizeof(bool)))) {
                status = tool_error(TOOL_USAGE, "run: out of memory");
                break;
            }
        }
        status = attempt(mpirun, self, &a, &run, k, &watch, &old, &stop_sig, &v, el ? &g : NULL);
        free(g.seen);
        if (status != 0)
            break; /* stopped, or could not launch */
        if (g.regrow && v.ok == 0) {
            fprintf(stderr, "rekindle: run: launching again to grow (not a restart)\n");
            continue;
        }
        if (v.ok > 0) {
            if (v.lost[0])
                fprintf(stderr, "rekindle: run: job completed by %d of %d workers; lost: %s\n", v.ok,
                        a.n + a.spares - v.unused, v.lost);
            status = 0;
            break;
        }
        status = v.job_status ? v.job_status : 1;
        if (restarts >= a.max_restarts) {
            fprintf(stderr, "rekindle: run: job failed (%s)%s\n", v.lost,
                    a.max_restarts ? ": no restarts left" : "");
            break;
        }
        restarts++;
        fprintf(stderr, "rekindle: run: job failed (%s): relaunching, restart %d of %d\n", v.lost, restarts,
                a.max_restarts);
        status = 0;
    }
    free(el);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (created)
        rec_remove(&run);
    else
        rec_close(&run);
    free(mpirun);
    return status;
}
