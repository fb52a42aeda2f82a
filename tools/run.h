/*
 * tools/run.h - what the parts of `rekindle run` share: its arguments, the records its
 * workers' wrappers leave in the attempt's directory, and an elastic run's growth
 * (tools/run_grow.c). Internal to the CLI.
 */
#ifndef RK_TOOLS_RUN_H
#define RK_TOOLS_RUN_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/common.h"
#include "run_elastic.h"

/* In an attempt's directory: written by the launcher that stops the job to grow it; each
   worker's wrapper, looking for it every STOP_POLL_MS, ends its program (tools/run_worker.c). */
#define RUN_STOP_FILE "stop"

enum {
    BEAT_MS = 1000,       /* the wrapper's sign of life: DIR/alive-<R> touched this often */
    LOST_BEATS = 3,       /* an elastic run counts a worker with no record lost after this
                             many beats of silence (its host, named in alive-<R>, cools down) */
};

struct run_args {
    int n, spares, max_restarts;
    const char *hostfile;
    char **prog; /* PROGRAM and its arguments, NULL-terminated (points into argv) */
    /* Elastic (--host-discovery-script): the hosts come from the script, every launch is
       sized from them (min_np..max_np), and a running job grows at its next checkpoint. */
    const char *discovery;
    int min_np, max_np;
    double interval_s, cooldown_s, elastic_timeout_s;
    double start_timeout_s; /* --start-timeout: no wrapper beat within it of a launch -> stop */
    bool grow_relaunch;     /* --grow relaunch: never in place onto spares (tools/run_grow.c) */
};

/* A records directory held open (tools/records.c: its invariants R1-R3): RK_RUN_DIR, or
   one attempt's directory. Every file in it is reached relative to fd. */
struct rec_beat {
    uint64_t sum;       /* of the last content read */
    int64_t changed_ns; /* CLOCK_MONOTONIC of the read that found it new; 0: none read yet */
};
struct records {
    int fd;               /* O_DIRECTORY | O_NOFOLLOW; -1: closed */
    char path[PATH_MAX];  /* for messages, and mpirun's command line */
    int nproc;            /* an attempt's: workers whose beats are followed */
    struct rec_beat *beats;
};

/* RK_RUN_DIR (made 0700 when create and missing), checked (R1). 0, or -errno with why
   naming the directory. */
int rec_open_run(const char *path, bool create, struct records *d, char *why, size_t cap);
/* RUN/attempt-K made fresh under the open run directory (R2) and checked (R1); its beats
   followed for nproc workers. */
int rec_open_attempt(const struct records *run, int k, int nproc, struct records *d, char *why, size_t cap);
/* The wrapper's RUN_DIR/attempt-K as given on its command line: both checked (R1). */
int rec_open_worker(const char *path, struct records *d, char *why, size_t cap);
void rec_close(struct records *d);
/* Removes the directory and everything in it (a run directory the launcher made); closes. */
int rec_remove(struct records *d);

/* The wrapper: how its program ended, as rank-<rank> (through .rank-<rank>, renamed). */
int rec_write_end(const struct records *d, const char *rank, const char *text);
/* The wrapper's beat n (0 first: the file is made) in alive-<rank>, naming its host. */
int rec_beat(const struct records *d, const char *rank, uint64_t n, const char *host, const char *addrs);
/* This host's name and non-loopback addresses (space-separated), as a beat names them. */
void rec_this_host(char *host, size_t hcap, char *addrs, size_t acap);

/* Worker r's end ("exit" or "signal", the code) and its host; false while it has none. */
bool rec_read_end(const struct records *d, int r, char kind[16], int *code, char host[64]);
/* CLOCK_MONOTONIC ns at which this launcher last read a new beat of worker r (R3); 0 if it
   never read one. */
int64_t rec_beat_seen(struct records *d, int r);
/* The host (and addresses) worker r's beat names; false without a beat. */
bool rec_beat_host(const struct records *d, int r, char host[64], char *addrs, size_t acap);
/* Whether a regular file name is in the directory (joined-<R>, stop). */
bool rec_exists(const struct records *d, const char *name);
/* Makes the empty file name unless it exists (stop). */
int rec_touch(const struct records *d, const char *name);
/* Removes name; whether it was there (grow: a request, answered once). */
bool rec_take(const struct records *d, const char *name);
/* A note a worker left (a regular file of this user, never through a link) read into buf
   (NUL-terminated, control characters as spaces) and removed; false when there is none. */
bool rec_take_text(const struct records *d, const char *name, char *buf, size_t cap);
/* A new file name, written by the caller (hostfile-K); NULL with errno set. */
FILE *rec_create_file(const struct records *d, const char *name);

/* What every attempt of a run shares (tools/run_loop.c). */
struct run_ctx {
    struct run_args *a;       /* an elastic run's size and hostfile change per launch */
    const char *mpirun, *self; /* paths of mpirun and of this program */
    struct records *run;      /* RK_RUN_DIR, open */
    struct elastic *el;       /* NULL: not elastic */
    const sigset_t *watch, *old; /* the signals the loop waits for (blocked), the mask before */
};
/* Launches the job, attempt after attempt, until it completed, failed with no restarts
   left, or a signal stopped the launcher; returns the launcher's exit status. */
int run_loop(const struct run_ctx *c);

/* The worker's wrapper: rekindle run --rk-worker DIR -- PROGRAM ARGS (tools/run_worker.c);
   the process's exit status. */
int run_worker(const char *dir, char **prog);

/* Sends sig (0: none) to every process of session id (by_session) or process group id,
   zombies and this process aside; returns how many there were (tools/run_procs.c). */
int run_procs_signal(pid_t id, bool by_session, int sig);

/* What an attempt of an elastic run, or of a run with spares, watches while its job runs. */
/* A slot of a run that grows, as the launcher counts it (struct grow's seen): a worker of the
   launch is UNSEEN until its end is taken (ENDED); a worker started since is UNSEEN until it
   joined (JOINED), then ENDED. */
enum { SLOT_UNSEEN, SLOT_JOINED, SLOT_ENDED };

struct grow {
    struct elastic *el;
    const struct run_args *a;
    const char *ckpt_dir; /* RK_CKPT_DIR: growth waits for its next commit (NULL: no growth) */
    struct records *run;  /* RK_RUN_DIR: a file "grow" there asks for a discovery now */
    struct records *rec;  /* the attempt's */
    int workers, alive;   /* launched; launched minus those lost since */
    unsigned char *seen;  /* by slot, SLOT_*: what the launcher took into account */
    int64_t base;         /* -2: no growth pending; else the newest commit when it was decided */
    int target;
    bool regrow;          /* the job was stopped to grow */
    bool completing;      /* a worker completed (exit 0): the job is ending, it grows no more */
    bool warned_no_ckpt;
    char last_error[256];
    /* A growth in place under way (ip_target > 0): the world asked, from ip_from members
       with ip_joined spares (or workers started since the launch) joined before, asked at
       ip_since. */
    int ip_target, ip_from, ip_joined;
    int64_t ip_since;
    /* An elastic run's growth in place by workers started while it trains (run_grow.c):
       asked once (joins: their slots' records are read from then on), given up on once
       (ip_failed: the growth goes by a relaunch), where they run (ip_hosts). */
    bool joins, ip_failed;
    int ip_unjoined;      /* workers started since that had ended without joining, at the ask */
    int ip_tries;         /* workers started for this growth that ended before joining */
    char ip_hosts[256];
};

/* One look, every tick of the launcher while the job runs: true when the job must be
   stopped to grow (tools/run_grow.c). */
bool grow_tick(struct grow *g);
/* The same for a run with spares (not elastic): RK_RUN_DIR/grow asks for K more workers
   (its content, default 1); in place onto the spares waiting, else by a relaunch at the next
   checkpoint with the held-back slots as workers (g->target workers then). */
bool grow_spares_tick(struct grow *g);
/* The size and hostfile of launch k of an elastic run (tools/run_grow.c). */
int elastic_size(struct run_args *a, struct elastic *el, int first_n, const struct records *run, int k,
                 const sigset_t *watch, char *hostfile, size_t cap);

#endif
