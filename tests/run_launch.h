/*
 * tests/run_launch.h - what the suites of `rekindle run` (tests/test_run.c,
 * tests/test_run_records.c) share: launching it on tests/prog_run and reading what the
 * workers left. Included by those two files alone.
 */
#ifndef RK_TESTS_RUN_LAUNCH_H
#define RK_TESTS_RUN_LAUNCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "prog_common.h"

#define JOB_TIMEOUT_S 60

static inline char *prog_path(void)
{
    return th_prog("prog_run");
}

/* rekindle run ARGS... -- prog_run MODE DIR (prog is appended when mode is not NULL). */
static inline int launch(const char *const env[], char **out, const char *mode, const char *dir, const char *const args[])
{
    char *rekindle = th_bin("rekindle"), *prog = prog_path();
    char *argv[24] = {rekindle, "run"};
    size_t n = 2;
    for (size_t i = 0; args[i] && n < 18; i++)
        argv[n++] = (char *)args[i];
    if (mode) {
        argv[n++] = "--";
        argv[n++] = prog;
        argv[n++] = (char *)mode;
        argv[n++] = (char *)dir;
    }
    argv[n] = NULL;
    unsetenv("RK_JOB_SECRET");
    unsetenv("RK_RUN_DIR");
    int rc = th_run(argv, env, JOB_TIMEOUT_S, out);
    free(rekindle);
    free(prog);
    return rc;
}

#define LAUNCH(env, out, mode, dir, ...) launch(env, out, mode, dir, (const char *const[]){__VA_ARGS__, NULL})

static inline char *read_in(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return th_read_file(path, NULL);
}

/* Whether pid runs (a zombie does not). */
static inline bool alive(long pid)
{
    return !prog_pid_dead((int)pid);
}

#endif
