/*
 * tools/cmd_run.c - `rekindle run`: launches a program on N workers with Open MPI so that
 * survivors outlive a lost worker, and relaunches a job that died as a whole.
 *
 *   rekindle run -n N [--spares S [--grow inplace|relaunch]] [--hostfile F] [--max-restarts R]
 *                -- PROGRAM [ARGS...]
 *
 * This file is the command: its arguments, and the environment of the run (docs/LAUNCHER.md
 * has the user's view): RK_JOB_SECRET (32 random bytes as 64 lowercase hex digits, unless
 * one is set already: the detector's parser judges it), RK_SPARES=S, RK_RUN_DIR (a
 * private directory for the run's records, refused unless it is the job user's alone:
 * tools/records.c), RK_RUN_ATTEMPT (0 for the first launch, 1 for the first relaunch...).
 * Every RK_* variable is forwarded to the workers with `mpirun -x NAME` (by name: the
 * secret never appears on a command line). The launcher blocks SIGINT, SIGTERM, SIGHUP
 * and SIGCHLD to wait for them, and is a child subreaper (orphans of the job come back
 * to it). Then:
 *   - tools/run_loop.c: the launcher's loop (its header has the state diagram and the
 *     invariants L1-L6): each attempt run under mpirun, watched, judged by the records,
 *     relaunched or ended;
 *   - tools/run_worker.c: the worker's wrapper (`rekindle run --rk-worker DIR -- PROGRAM`),
 *     another process on every worker's host;
 *   - tools/records.c: the records both read and write (R1-R3);
 *   - tools/run_elastic.c, tools/run_grow.c: an elastic run's hosts and growth.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include "../detector/det.h"
#include "run.h"
#include "run_elastic.h"
#include "tools.h"

enum { MAX_WORKERS = 1 << 16 };

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: rekindle run -n N [--spares S [--grow inplace|relaunch]] [--hostfile F] [--max-restarts R]\n"
            "                    [--start-timeout SEC] -- PROGRAM [ARGS...]\n"
            "       rekindle run --host-discovery-script S [--min-np N] [--max-np M] [-n N] [...] -- PROGRAM\n\n"
            "Launches PROGRAM on N workers with Open MPI (mpirun) so that survivors outlive a\n"
            "lost worker, and relaunches a job that died as a whole so it resumes from its\n"
            "latest checkpoint.\n\n"
            "  -n N              workers (required, >= 1)\n"
            "  --spares S        start S more processes (RK_SPARES=S) that wait outside the ring\n"
            "                    and take the places of lost workers, or join as more workers\n"
            "                    when RK_RUN_DIR/grow asks (its content: how many, default 1)\n"
            "                    (needs RK_CKPT_DIR; default 0)\n"
            "  --grow MODE       how a job grows: inplace (default: the spares, or workers\n"
            "                    started on the free slots, join the running workers, none\n"
            "                    restarted) or relaunch (at the next checkpoint, every worker\n"
            "                    relaunched on the larger world)\n"
            "  --hostfile F      Open MPI hostfile, passed to mpirun (multi-host: set RK_RUN_DIR\n"
            "                    to a directory every host shares)\n"
            "  --max-restarts R  relaunch a job that died up to R times (default 0)\n"
            "  --start-timeout SEC  a launch in which no worker has started (no beat of its\n"
            "                    wrapper) within SEC is stopped: mpirun could not reach its\n"
            "                    hosts (default 120)\n\n"
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
            "one), the job grows in place: workers started on the free slots join the running\n"
            "ones, none restarted. With --grow relaunch, or when that does not complete in its\n"
            "bound, it grows at its next committed checkpoint (needs RK_CKPT_DIR): stopped and\n"
            "launched again on every free slot, resuming from that checkpoint. Growth\n"
            "relaunches count no restart. Not with --hostfile or --spares.\n\n"
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
                           .elastic_timeout_s = 600, .start_timeout_s = 120};
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
        else if (strcmp(o, "--grow") == 0) {
            if (!v || (strcmp(v, "inplace") != 0 && strcmp(v, "relaunch") != 0))
                return tool_error(TOOL_USAGE, "run: --grow '%s': want inplace or relaunch", v ? v : "");
            a->grow_relaunch = strcmp(v, "relaunch") == 0;
            rc = 0;
        } else if (strcmp(o, "--max-restarts") == 0)
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
        else if (strcmp(o, "--start-timeout") == 0)
            rc = parse_seconds(o, v, 0.5, 86400, &a->start_timeout_s);
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

int cmd_run(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--rk-worker") == 0 && strcmp(argv[3], "--") == 0 && argc >= 5)
        return run_worker(argv[2], argv + 4);

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

    int status = 0;
    struct elastic *el = a.discovery ? calloc(1, sizeof(*el)) : NULL;
    if (a.discovery && !el)
        status = tool_error(TOOL_USAGE, "run: out of memory");
    if (el) {
        el->script = a.discovery;
        el->min_np = a.min_np;
        el->max_np = a.max_np;
        el->cooldown_ms = (int)(a.cooldown_s * 1000);
    }
    if (status == 0) {
        struct run_ctx c = {.a = &a, .mpirun = mpirun, .self = self, .run = &run, .el = el, .watch = &watch,
                            .old = &old};
        status = run_loop(&c);
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
