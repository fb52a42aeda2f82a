/*
 * tools/run_worker.c - the worker's wrapper of `rekindle run`: another process, one per
 * worker, started by mpirun (on any host) as
 *
 *   rekindle run --rk-worker RUN_DIR/attempt-K -- PROGRAM [ARGS...]
 *
 * It checks the records directory it is given (tools/records.c, R1) before anything is
 * written there, runs PROGRAM as its child (which dies with it: parent-death signal,
 * checked against a wrapper already gone), passes on the signals it receives, beats
 * (alive-<R>, a counter the launcher judges by content: R3), ends PROGRAM at once when the
 * launcher writes the stop file (a stop to grow), and when PROGRAM ends (an exit or a
 * kill, never a stop; or as soon as every thread of it is inside its exit) first tells
 * the job's other workers (detector/det_parent.c), then
 * records how in rank-<R>, then ends the same way (docs/LAUNCHER.md, "What it runs").
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../detector/det.h"
#include "run.h"
#include "tools.h"

enum { STOP_POLL_MS = 20 }; /* how often the wrapper looks for the stop file (a stop to grow) */

/* How often the wrapper looks whether its program is ending (det_proc_ending), so that it
   reports the death before the kernel's teardown of the process is done: RK_PARENT_WATCH_MS,
   default 5; 0: only when the pipe closes and when waitpid returns. */
static int watch_ms(const char *rank)
{
    const char *v = getenv("RK_PARENT_WATCH_MS"), *why = NULL;
    long ms = 5;
    if (v && *v && rk__parse_int(v, 0, 1000, &ms, &why) != 0) {
        fprintf(stderr, "rekindle: run: rank %s: RK_PARENT_WATCH_MS='%s': %s; 5 taken\n", rank, v, why);
        ms = 5;
    }
    return (int)ms;
}

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

int run_worker(const char *dir, char **prog)
{
    /* A worker started while the job runs (recover/join_proto.c J16) is told its slot:
       its own MPI_COMM_WORLD is the spawn's, where it is rank 0. */
    const char *rank = getenv("RK_RUN_SLOT");
    if (!rank)
        rank = getenv("OMPI_COMM_WORLD_RANK");
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
    char statpath[64];
    snprintf(statpath, sizeof(statpath), "/proc/%ld/stat", (long)child);
    int statfd = pp ? open(statpath, O_RDONLY | O_CLOEXEC) : -1; /* read again at every look */
    /* Pass on what is sent to the wrapper; end when the program ends (waitpid reports an end,
       never a stop), telling the others first; beat meanwhile, so the launcher can tell a
       worker still at work from one whose host is gone. DIR/stop, written by a launcher
       that stops the job to grow it, ends the program at once (SIGTERM), on every host:
       mpirun's own forwarding of the launcher's SIGTERM took 1-2 s, steps all lost. */
    int status = 0, watch = watch_ms(rank);
    bool pipe_open = pp != NULL, stopping = false, reported = false;
    char host[256], addrs[512]; /* for a launcher that learns of a host gone from the beat */
    rec_this_host(host, sizeof(host), addrs, sizeof(addrs));
    uint64_t beats = 0;
    for (int64_t beat_at = 0, stop_at = 0;;) {
        if (rk__mono_ns() >= beat_at) {
            rec_beat(&rec, rank, beats++, host, addrs); /* not written: the launcher sees silence */
            beat_at = rk__deadline_ns(BEAT_MS);
        }
        struct pollfd pf[2] = {{.fd = sfd, .events = POLLIN}, {.fd = pipe_open ? pfd[0] : -1, .events = POLLIN}};
        int ms = (int)((beat_at - rk__mono_ns()) / 1000000) + 1;
        bool watching = !reported && watch > 0 && det_parent_armed(pp);
        int cap = watching ? watch : STOP_POLL_MS;
        poll(pf, 2, ms > cap ? cap : ms > 0 ? ms : 0);
        if (!stopping && rk__mono_ns() >= stop_at) { /* every STOP_POLL_MS: a stat of a shared file */
            stop_at = rk__deadline_ns(STOP_POLL_MS);
            if (rec_exists(&rec, RUN_STOP_FILE)) {
                kill(child, SIGTERM);
                stopping = true;
            }
        }
        bool closed = false;
        if (pf[1].revents && det_parent_read(pp) != 0) {
            pipe_open = false; /* closed: the child is ending, or exec'd a program without a detector */
            closed = true;
        }
        /* Every thread of the program inside its exit: tell the others now, before the
           kernel has torn it down (P5 of det_parent.c; tens of ms for a CUDA process). */
        if ((watching || (closed && !reported && det_parent_armed(pp))) && det_proc_ending(child, statfd) == 1) {
            det_parent_report(pp, -1);
            reported = true;
        }
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
    if (!reported)
        det_parent_report(pp, status); /* before anything slower: the others are waiting */
    det_parent_close(&pp);
    if (statfd >= 0)
        close(statfd);
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
