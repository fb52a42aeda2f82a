/*
 * tests/ckpt_prog.h - tests/prog_ckpt driven as the checkpoint suites run it (test_ckpt.c,
 * test_restore.c): its path (setup/teardown, a checked fixture), the environment of a
 * job (RK_CKPT_DIR, a checkpoint every 2 steps, 2 kept, the job secret), one run alone or
 * under mpirun, and the shard manifest's offset of a tensor.
 */
#ifndef RK_TESTS_CKPT_PROG_H
#define RK_TESTS_CKPT_PROG_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "harness.h"

#define S2 "step-000000000002"
#define S3 "step-000000000003"
#define S4 "step-000000000004"
#define S6 "step-000000000006"

#define SECRET "0000000000000000000000000000000000000000000000000000000000000001"

static char *prog; /* tests/prog_ckpt, found by setup() */

static inline void setup(void)
{
    prog = th_bin("../tests/prog_ckpt");
}

static inline void teardown(void)
{
    free(prog);
}

static char envbuf[8][4400]; /* env_for's */

/* env: RK_CKPT_DIR=dir plus extras; returns a NULL-terminated static array. */
static inline const char *const *env_for(const char *dir, const char *extra1, const char *extra2)
{
    static const char *e[8];
    int k = 0;
    snprintf(envbuf[k], sizeof(envbuf[k]), "RK_CKPT_DIR=%s", dir);
    e[k] = envbuf[k];
    k++;
    const char *fixed[] = {"RK_CKPT_EVERY=2", "RK_KEEP=2", "RK_TIMEOUT_MS=20000", "RK_JOB_SECRET=" SECRET};
    for (size_t i = 0; i < RK_ARRAY_LEN(fixed); i++)
        e[k++] = fixed[i];
    if (extra1)
        e[k++] = extra1;
    if (extra2)
        e[k++] = extra2;
    e[k] = NULL;
    return e;
}

static inline int run_prog(int np, const char *dir, const char *mode, const char *arg, const char *extra1,
                    const char *extra2, char **out)
{
    char *argv[] = {prog, (char *)mode, (char *)arg, "7", NULL, NULL};
    if (np == 0)
        argv[4] = "big";
    const char *const *env = env_for(dir, extra1, extra2);
    if (np <= 1)
        return th_run(argv, env, 60, out);
    return th_mpirun(np, argv, env, 90, out);
}

#define RUN_OK(np, dir, mode, arg, e1, e2)                                                  \
    do {                                                                                   \
        char *o_ = NULL;                                                                   \
        int rc_ = run_prog(np, dir, mode, arg, e1, e2, &o_);                               \
        ck_assert_msg(rc_ == 0, "%s %s: exit %d: %s", mode, arg, rc_, o_ ? o_ : "");       \
        free(o_);                                                                          \
    } while (0)

/* Runs prog_ckpt untouched (1 rank) and checks that rk_resume left every buffer as it
   was; the output goes to *out. */
static inline void resume_untouched(const char *dir, const char *extra, char **out)
{
    int rc = run_prog(1, dir, "untouched", "0", extra, NULL, out);
    ck_assert_msg(rc == 0 && strstr(*out, "untouched 1"), "exit %d: %s", rc, *out);
}

/* Byte offset of tensor `name`'s data in shard-0.h5 of dir/stepname, from its manifest. */
static inline long tensor_offset(const char *dir, const char *stepname, const char *name)
{
    char cmd[4400], *out = NULL;
    snprintf(cmd, sizeof(cmd), "awk '$1==\"t\" && $NF==\"%s\" {print $(NF-2)}' '%s/%s/shard-0.ok'", name, dir,
             stepname);
    ck_assert_int_eq(th_sh(cmd, 10, &out), 0);
    long off = out ? atol(out) : 0;
    free(out);
    ck_assert_int_gt(off, 0);
    return off;
}

#endif
