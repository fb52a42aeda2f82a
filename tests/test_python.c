/*
 * tests/test_python.c - the Python package (python/rekindle) and the PyTorch example
 * (examples/torch_train.py), run as users run them: real interpreters, real MPI jobs
 * under mpirun and `rekindle run`, real SIGKILLs. The checks themselves are Python
 * (tests/py/): this suite runs each and shows its output when it fails.
 *
 * Skipped, with the reason, when RK_TEST_PYTHON cannot import torch and sklearn
 * (Debian's python3-torch and python3-sklearn; scripts/install-deps installs them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static char python[4096], pypath[4200], libpath[4200], script_api[4200], script_job[4200];
static char preload[4200], asan_options[256];
/* The package loads the library of the build under test, not whichever build/ it finds
   next to it; a sanitized build's needs its runtime preloaded (sanitized()). */
static const char *env_extra[] = {pypath, libpath, NULL, NULL, NULL};

static void paths(void)
{
    const char *py = getenv("RK_TEST_PYTHON"), *src = getenv("RK_TEST_SRC"), *build = getenv("RK_TEST_BUILD");
    snprintf(python, sizeof(python), "%s", py ? py : "/usr/bin/python3");
    snprintf(pypath, sizeof(pypath), "PYTHONPATH=%s/python", src ? src : ".");
    snprintf(libpath, sizeof(libpath), "REKINDLE_LIB=%s/lib/librekindle.so.0", build ? build : "build");
    snprintf(script_api, sizeof(script_api), "%s/tests/py/api_check.py", src ? src : ".");
    snprintf(script_job, sizeof(script_job), "%s/tests/py/job_check.py", src ? src : ".");
}

/* A SANITIZE=1 library in the uninstrumented interpreter: ASan's runtime must come first
   in the processes that load it, so it is preloaded (into the launcher and mpirun too,
   which is harmless), with libstdc++ so that its __cxa_throw interceptor finds the real
   one (torch throws C++ exceptions). Leak checking is off there: CPython and torch keep
   memory to their exit by design; the library's leaks are the C suites' to find. */
static void sanitized(void)
{
    const char *san = getenv("RK_TEST_SANITIZE");
    if (!san || strcmp(san, "1") != 0)
        return;
    char *out = NULL;
    int rc = th_sh("mpicc -print-file-name=libasan.so && mpicc -print-file-name=libstdc++.so", 60, &out);
    char *nl = out ? strchr(out, '\n') : NULL;
    if (rc != 0 || !nl || out[0] != '/' || nl[1] != '/') {
        char msg[600];
        snprintf(msg, sizeof(msg), "a sanitized build, and mpicc -print-file-name does not name ASan's runtime and "
                 "libstdc++ to preload into python: %.400s", out ? out : "");
        free(out);
        th_skip_suite(msg);
    }
    *nl = ' ';
    out[strcspn(out, "\n")] = '\0';
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", out);
    free(out);
    snprintf(asan_options, sizeof(asan_options), "ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0");
    env_extra[2] = preload;
    env_extra[3] = asan_options;
}

/* Runs argv; the test fails with its output unless it exits 0 and prints `want`. */
static void expect_ok(char *const argv[], int ranks, const char *want, int timeout_s)
{
    char *out = NULL;
    int rc = ranks ? th_mpirun(ranks, argv, env_extra, timeout_s, &out) : th_run(argv, env_extra, timeout_s, &out);
    const char *o = out ? out : "";
    size_t len = strlen(o);
    /* Check carries at most a few KiB of message: the tail of the output goes there, all
       of it to the suite's log. */
    if (rc != 0 || !strstr(o, want))
        fprintf(stderr, "---- %s %s: output ----\n%s\n", argv[1], argv[2] ? argv[2] : "", o);
    ck_assert_msg(rc == 0 && strstr(o, want), "%s %s: exit %d, want \"%s\"; output's tail:\n%s", argv[1],
                  argv[2] ? argv[2] : "", rc, want, len > 3000 ? o + len - 3000 : o);
    free(out);
}

static void api_on(int ranks)
{
    char *dir = th_tmpdir("py-api");
    char *w[] = {python, script_api, dir, "write", NULL}, *r[] = {python, script_api, dir, "read", NULL};
    expect_ok(w, ranks, "api_check write: ok", 120);
    expect_ok(r, ranks, "api_check read: ok", 120);
    free(dir);
}

/* Every dtype (torch and numpy) through register, allreduce, checkpoint, resume and
   rekindle.load; the errors for bad tensors, options and names; on one process. */
START_TEST(api_one_process)
{
    api_on(0);
}
END_TEST

START_TEST(api_three_ranks)
{
    api_on(3);
}
END_TEST

static void job(const char *mode, const char *flag, const char *want)
{
    char *work = th_tmpdir("py-job");
    char *argv[] = {python, script_job, (char *)getenv("RK_TEST_BUILD"), work, (char *)mode, (char *)flag, NULL};
    expect_ok(argv, 0, want, 540);
    free(work);
}

/* One of 4 workers of torch_train.py SIGKILLed: the 3 survivors finish with the hash of a
   fault-free replay from the step they resumed at. */
START_TEST(killed_worker_replay)
{
    job("kill", NULL, "job_check kill: ok");
}
END_TEST

/* The same with gradients averaged by rekindle.allreduce_hook inside DDP. */
START_TEST(killed_worker_replay_ddp)
{
    job("kill", "--ddp", "job_check kill --ddp: ok");
}
END_TEST

/* The same with Adam's moments sharded (--zero): the survivors take their new slices
   through rk.shard_rows and rk.rebind, and the gathered final hash equals the replay's. */
START_TEST(killed_worker_replay_zero)
{
    job("kill", "--zero", "job_check kill --zero: ok");
}
END_TEST

/* --zero on 3 workers and a spare: the spare brought in takes the lost slice (after
   resume(), rk.shard_rows and rk.rebind) and the hash equals 3 workers' replay. */
START_TEST(spare_takes_lost_slice_zero)
{
    job("spare", "--zero", "job_check spare --zero: ok");
}
END_TEST

/* --zero with the member lost in the job's last collective (the final hash's gather):
   the survivors go back to their loop and end normally with the replay's hash. */
START_TEST(lost_in_last_collective_zero)
{
    job("last", "--zero", "job_check last --zero: ok");
}
END_TEST

/* A program written from docs/PYTHON.md alone, a checkpoint at every step, one of 4
   workers SIGKILLed at step 65: the survivors end normally (exit 0, no error from the
   checkpoint the recovery abandoned) with the hash of a fault-free replay; in the
   `with rekindle.init()` form and with an explicit finalize(). */
START_TEST(docs_program_with_survives_kill)
{
    job("docs", "with", "job_check docs with: ok");
}
END_TEST

START_TEST(docs_program_call_survives_kill)
{
    job("docs", "call", "job_check docs call: ok");
}
END_TEST

/* A job launched again resumes from disk; rekindle.load equals the model's state_dict. */
START_TEST(relaunch_resumes_from_disk)
{
    job("relaunch", NULL, "job_check relaunch: ok");
}
END_TEST

int main(void)
{
    paths();
    char cmd[4400], *why = NULL;
    snprintf(cmd, sizeof(cmd), "%s -c 'import torch, sklearn' 2>&1", python);
    if (th_sh(cmd, 120, &why) != 0) {
        char msg[4700];
        snprintf(msg, sizeof(msg), "%s cannot import torch and sklearn (install python3-torch python3-sklearn: "
                 "scripts/install-deps): %.400s", python, why ? why : "");
        free(why);
        th_skip_suite(msg);
    }
    free(why);
    sanitized();
    Suite *s = suite_create("python");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, api_one_process);
    tcase_add_test(tc, api_three_ranks);
    suite_add_tcase(s, tc);
    tc = tcase_create("job");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, killed_worker_replay);
    tcase_add_test(tc, killed_worker_replay_ddp);
    tcase_add_test(tc, killed_worker_replay_zero);
    tcase_add_test(tc, lost_in_last_collective_zero);
    tcase_add_test(tc, spare_takes_lost_slice_zero);
    tcase_add_test(tc, docs_program_with_survives_kill);
    tcase_add_test(tc, docs_program_call_survives_kill);
    tcase_add_test(tc, relaunch_resumes_from_disk);
    suite_add_tcase(s, tc);
    return th_main(s);
}
