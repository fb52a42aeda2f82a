/*
 * tools/run.h - what the parts of `rekindle run` share: its arguments, the records its
 * workers' wrappers leave in the attempt's directory, and an elastic run's growth
 * (tools/run_grow.c). Internal to the CLI.
 */
#ifndef RK_TOOLS_RUN_H
#define RK_TOOLS_RUN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "run_elastic.h"

/* In an attempt's directory: written by the launcher that stops the job to grow it; each
   worker's wrapper, looking for it every STOP_POLL_MS, ends its program (tools/cmd_run.c). */
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
};

/* Worker r's record in the attempt's directory `dir`: its end ("exit" or "signal", the code)
   and its host; false while it has none. */
bool run_read_record(const char *dir, int r, char kind[16], int *code, char host[64]);
/* CLOCK_MONOTONIC ns of the last change of DIR/<name><r> (a wrapper's beat), 0 if none. */
int64_t run_mono_mtime(const char *dir, const char *name, int r);

/* What an attempt of an elastic run watches while its job runs. */
struct grow {
    struct elastic *el;
    const struct run_args *a;
    const char *ckpt_dir; /* RK_CKPT_DIR: growth waits for its next commit (NULL: no growth) */
    const char *run_dir;  /* RK_RUN_DIR: a file "grow" there asks for a discovery now */
    const char *rec_dir;
    int workers, alive;   /* launched; launched minus those lost since */
    bool *seen;           /* workers whose record was taken into account */
    int64_t base;         /* -2: no growth pending; else the newest commit when it was decided */
    int target;
    bool regrow;          /* the job was stopped to grow */
    bool warned_no_ckpt;
    char last_error[256];
};

/* One look, every tick of the launcher while the job runs: true when the job must be
   stopped to grow (tools/run_grow.c). */
bool grow_tick(struct grow *g);
/* The size and hostfile of launch k of an elastic run (tools/run_grow.c). */
int elastic_size(struct run_args *a, struct elastic *el, int first_n, const char *run_dir, int k,
                 const sigset_t *watch, char *hostfile, size_t cap);

#endif
