/*
 * tests/test_run.c - the launcher `rekindle run` (contract section 4), with real mpirun
 * jobs of tests/prog_run: a job runs and completes; RK_* settings, the job secret and
 * RK_SPARES reach every worker; a job that loses a worker while the others finish is a
 * success (no relaunch); a job that always fails is relaunched --max-restarts times and
 * exits with its status; SIGINT stops every worker (none left behind); usage errors
 * exit 2 (the launcher's loop: tools/run_loop.c, invariants L1-L6). An elastic run's
 * discovery script is bounded, its lost host matched by FQDN or address. Open MPI's
 * transport is left to TCP and shared memory only on a host without a fabric where
 * nobody chose one. The records
 * directory's cases (tools/records.c, R1-R3) are tests/test_run_records.c's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "run_launch.h"
#include "rekindle.h"

static int count_lines(const char *s, const char *prefix)
{
    int n = 0;
    for (const char *p = s; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += *p && strncmp(p, prefix, strlen(prefix)) == 0;
    return n;
}

/* The value of NAME=... in a prog_run env file, into val. */
static bool env_value(const char *envfile, const char *name, char *val, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = envfile; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) == 0 && p[nl] == '=') {
            const char *v = p + nl + 1, *end = strchr(v, '\n');
            size_t len = end ? (size_t)(end - v) : strlen(v);
            snprintf(val, cap, "%.*s", (int)len, v);
            return true;
        }
    }
    return false;
}

static bool is_secret(const char *s)
{
    size_t n = strspn(s, "0123456789abcdef");
    return n == 64 && s[n] == '\0';
}

/* Runs an env job of n workers (+ spares) and returns the secret every worker saw
   (asserting they agree), checking the RK_* variables named in want ("NAME=value"). */
static void env_job(const char *const env[], const char *const args[], int nproc, const char *const want[],
                    char secret[80])
{
    char *dir = th_tmpdir("run-env"), *out = NULL;
    th_assert_rc(launch(env, &out, "env", dir, args), 0);
    secret[0] = '\0';
    for (int r = 0; r < nproc; r++) {
        char name[32], val[256];
        snprintf(name, sizeof(name), "env-%d", r);
        char *e = read_in(dir, name);
        ck_assert_msg(e != NULL, "worker %d left no env file; launcher said:\n%s", r, out);
        ck_assert_msg(env_value(e, "RK_JOB_SECRET", val, sizeof(val)), "rank %d: no RK_JOB_SECRET", r);
        ck_assert_msg(is_secret(val), "rank %d: RK_JOB_SECRET '%s' is not 64 lowercase hex digits", r, val);
        if (r == 0)
            snprintf(secret, 80, "%.64s", val); /* is_secret: 64 characters */
        ck_assert_str_eq(val, secret);
        for (size_t i = 0; want && want[i]; i++) {
            const char *eq = strchr(want[i], '=');
            char wname[64];
            snprintf(wname, sizeof(wname), "%.*s", (int)(eq - want[i]), want[i]);
            ck_assert_msg(env_value(e, wname, val, sizeof(val)), "rank %d: %s missing:\n%s", r, wname, e);
            ck_assert_str_eq(val, eq + 1);
        }
        free(e);
    }
    char extra[32];
    snprintf(extra, sizeof(extra), "env-%d", nproc);
    char *none = read_in(dir, extra);
    ck_assert_msg(none == NULL, "more than %d processes started", nproc);
    char *launches = read_in(dir, "launches");
    ck_assert_int_eq(count_lines(launches, "start "), nproc);
    free(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}

START_TEST(three_workers_complete)
{
    char *dir = th_tmpdir("run-ok"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "env", dir, "-n", "3"), 0);
    char *launches = read_in(dir, "launches");
    ck_assert_msg(launches != NULL, "no worker started:\n%s", out);
    for (int r = 0; r < 3; r++) {
        char want[32];
        snprintf(want, sizeof(want), "start %d 0\n", r);
        ck_assert_msg(strstr(launches, want), "no '%s' in launches:\n%s", want, launches);
    }
    ck_assert_int_eq(count_lines(launches, "start "), 3);
    ck_assert_msg(strstr(out, "rekindle:") == NULL, "the launcher complained about a good job:\n%s", out);
    free(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

START_TEST(rk_variables_reach_workers)
{
    const char *env[] = {"RK_CKPT_EVERY=7", "RK_TEST_MARKER=hello world", NULL};
    const char *want[] = {"RK_CKPT_EVERY=7", "RK_TEST_MARKER=hello world", "RK_SPARES=0", "RK_RUN_ATTEMPT=0", NULL};
    char secret[80];
    env_job(env, (const char *const[]){"-n", "3", NULL}, 3, want, secret);
}
END_TEST

/* docs/LAUNCHER.md, "What it runs": a host with no fabric (this test's own look: an entry
   of /sys/class/infiniband or /sys/class/cxi, /dev/hfi1*, /dev/ipath*). */
static bool host_has_fabric(void)
{
    const char *dirs[] = {"/sys/class/infiniband", "/sys/class/cxi"};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        for (struct dirent *e; d && (e = readdir(d));)
            if (e->d_name[0] != '.') {
                closedir(d);
                return true;
            }
        if (d)
            closedir(d);
    }
    glob_t g;
    bool dev = glob("/dev/hfi1*", 0, NULL, &g) == 0;
    globfree(&g);
    dev = dev || glob("/dev/ipath*", 0, NULL, &g) == 0;
    globfree(&g);
    return dev;
}

/* The pml and mtl worker 0 of a 2-worker job saw ("" when unset), the launcher run with env. */
static void transport_seen(const char *const env[], char pml[64], char mtl[64])
{
    char *dir = th_tmpdir("run-pml"), *out = NULL;
    th_assert_rc(LAUNCH(env, &out, "env", dir, "-n", "2"), 0);
    char *e = read_in(dir, "env-0");
    ck_assert_msg(e != NULL, "worker 0 left no env file; launcher said:\n%s", out);
    if (!env_value(e, "OMPI_MCA_pml", pml, 64))
        pml[0] = '\0';
    if (!env_value(e, "OMPI_MCA_mtl", mtl, 64))
        mtl[0] = '\0';
    free(e);
    free(out);
    th_rmrf(dir);
    free(dir);
}

START_TEST(transport_chosen_only_where_nobody_did)
{
    char pml[64], mtl[64];
    bool fabric = host_has_fabric();
    /* Nobody chose: TCP and shared memory (ob1) on a host without a fabric, else MPI's own. */
    transport_seen(NULL, pml, mtl);
    ck_assert_str_eq(pml, fabric ? "" : "ob1");
    /* The user chose an mtl: the launcher adds nothing. */
    transport_seen((const char *const[]){"OMPI_MCA_mtl=^psm", NULL}, pml, mtl);
    ck_assert_str_eq(pml, "");
    ck_assert_str_eq(mtl, "^psm");
    /* A selection in the user's MCA parameter file counts as a choice; an exclusion does not. */
    char *home = th_tmpdir("run-pml-home"), path[4096], envhome[4200];
    snprintf(path, sizeof(path), "%s/.openmpi", home);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/.openmpi/mca-params.conf", home);
    snprintf(envhome, sizeof(envhome), "HOME=%s", home);
    ck_assert_int_eq(th_write_file(path, "# mine\n  pml = ob1 \n", 20), 0);
    transport_seen((const char *const[]){envhome, NULL}, pml, mtl);
    ck_assert_str_eq(pml, "");
    ck_assert_int_eq(th_write_file(path, "pml = ^ucx\nmtl=^ofi\n", 20), 0);
    transport_seen((const char *const[]){envhome, NULL}, pml, mtl);
    ck_assert_str_eq(pml, fabric ? "" : "ob1");
    th_rmrf(home);
    free(home);
}
END_TEST

START_TEST(secret_fresh_per_run_or_kept)
{
    char s1[80], s2[80], s3[80];
    env_job(NULL, (const char *const[]){"-n", "2", NULL}, 2, NULL, s1);
    env_job(NULL, (const char *const[]){"-n", "2", NULL}, 2, NULL, s2);
    ck_assert_msg(strcmp(s1, s2) != 0, "two runs got the same secret %s", s1);
    /* A secret already set is the job's. */
    static char set[] = "RK_JOB_SECRET=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const char *env[] = {set, NULL};
    const char *want[] = {set, NULL};
    env_job(env, (const char *const[]){"-n", "2", NULL}, 2, want, s3);
    ck_assert_str_eq(s3, set + strlen("RK_JOB_SECRET="));
}
END_TEST

START_TEST(malformed_secret_refused)
{
    char *dir = th_tmpdir("run-badsecret"), *out = NULL;
    const char *env[] = {"RK_JOB_SECRET=not-hex", NULL};
    th_assert_rc(LAUNCH(env, &out, "env", dir, "-n", "2"), 2);
    ck_assert_msg(strstr(out, "RK_JOB_SECRET") != NULL, "message does not name RK_JOB_SECRET:\n%s", out);
    char *launches = read_in(dir, "launches");
    ck_assert_ptr_null(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

START_TEST(spares_started_and_told)
{
    const char *want[] = {"RK_SPARES=1", NULL};
    char secret[80];
    env_job(NULL, (const char *const[]){"-n", "2", "--spares", "1", NULL}, 3, want, secret);
}
END_TEST

START_TEST(hostfile_passed_through)
{
    char *dir = th_tmpdir("run-hosts");
    char hostfile[4096];
    snprintf(hostfile, sizeof(hostfile), "%s/hosts", dir);
    th_assert_rc(th_write_file(hostfile, "localhost slots=8\n", 18), 0);
    char secret[80];
    env_job(NULL, (const char *const[]){"-n", "2", "--hostfile", hostfile, NULL}, 2, NULL, secret);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L1: a lost worker whose peers finish is a success: exit 0, one launch, the loss reported. */
START_TEST(lost_worker_survivors_finish)
{
    char *dir = th_tmpdir("run-kill"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "kill1", dir, "-n", "3", "--max-restarts", "2"), 0);
    char *launches = read_in(dir, "launches");
    ck_assert_msg(launches != NULL, "no worker started:\n%s", out);
    ck_assert_msg(count_lines(launches, "start ") == 3, "launched more than once:\n%s\nlauncher:\n%s", launches, out);
    char *d0 = read_in(dir, "done-0"), *d2 = read_in(dir, "done-2"), *d1 = read_in(dir, "done-1");
    ck_assert_msg(d0 && d2, "survivors did not finish:\n%s", out);
    ck_assert_ptr_null(d1);
    ck_assert_msg(strstr(out, "rank 1: killed by signal 9"), "loss not reported:\n%s", out);
    ck_assert_ptr_null(strstr(out, "relaunching"));
    free(d0);
    free(d2);
    free(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L6: a job that always fails: launched 1 + max-restarts times, each relaunch logged with
   its reason, and the launcher exits with the job's status. */
START_TEST(failing_job_relaunched)
{
    char *dir = th_tmpdir("run-fail"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "fail", dir, "-n", "2", "--max-restarts", "2"), 3);
    char *launches = read_in(dir, "launches");
    ck_assert_msg(launches != NULL, "no worker started:\n%s", out);
    ck_assert_int_eq(count_lines(launches, "start "), 6);
    for (int k = 0; k < 3; k++) {
        char want[32];
        snprintf(want, sizeof(want), "start 0 %d\n", k);
        ck_assert_msg(strstr(launches, want), "no '%s' in launches:\n%s", want, launches);
    }
    ck_assert_int_eq(count_lines(out, "rekindle: run: job failed (rank 0: exit 3; rank 1: exit 3): relaunching"),
                     2);
    ck_assert_msg(strstr(out, "no restarts left"), "no final failure line:\n%s", out);
    free(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L2: a worker that exited 0 means "done", not "the others may die now": rank 0, still at
   work 8 s after the others completed (its last commit, the program's export), is waited
   for while its wrapper beats. (Before: killed 5 s after the first completion, and the run
   exited 0 with rank 0 listed as lost.) */
START_TEST(late_worker_is_waited_for)
{
    char *dir = th_tmpdir("run-slow"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "slow0", dir, "-n", "3"), 0);
    char *d0 = read_in(dir, "done-0");
    ck_assert_msg(d0 != NULL, "rank 0 was stopped before it finished:\n%s", out);
    ck_assert_msg(!strstr(out, "lost") && !strstr(out, "stopping it"), "a worker at work was counted lost:\n%s", out);
    free(d0);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L1: spares that exited 0 without being brought in say nothing of the job: every member
   failed, so the job failed and is relaunched. (Before: "job completed by 1 of 4
   workers", exit 0, no relaunch.) */
START_TEST(unused_spares_do_not_complete_a_failed_job)
{
    char *dir = th_tmpdir("run-spares"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "spares", dir, "-n", "3", "--spares", "1", "--max-restarts", "1"), 3);
    char *launches = read_in(dir, "launches");
    ck_assert_msg(launches && count_lines(launches, "start ") == 8, "want 2 launches of 4:\n%s\n%s", launches, out);
    ck_assert_msg(!strstr(out, "job completed"), "a failed job reported as completed:\n%s", out);
    ck_assert_msg(strstr(out, "no restarts left"), "no final failure line:\n%s", out);
    free(launches);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L2, L4: every other worker failed while one went silent as on a lost host (no record,
   no beat, and mpirun never sees it end: Open MPI's mpirun does not exit after a remote
   loss): the launcher stops mpirun 5 s after the last record and exits with the job's
   status, saying why, and nothing of the silent worker is left. (Before: it waited for mpirun forever,
   as survivors that stopped without a majority after a host loss did under Slurm.) */
START_TEST(failed_job_with_silent_worker_ends)
{
    char *dir = th_tmpdir("run-silent"), *out = NULL;
    int rc = LAUNCH(NULL, &out, "silent1", dir, "-n", "3");
    long pids[2] = {0, 0};
    char *p1 = read_in(dir, "pid-1");
    if (p1)
        sscanf(p1, "%ld %ld", &pids[0], &pids[1]);
    bool left[2];
    for (int i = 0; i < 2; i++) {
        left[i] = pids[i] > 0 && alive(pids[i]);
        if (left[i])
            kill((pid_t)pids[i], SIGKILL); /* a launcher that hung left them: not the next test's */
    }
    ck_assert_msg(p1 != NULL, "rank 1 did not start:\n%s", out);
    ck_assert_msg(rc == 3, "launcher status %d, want 3 (rank 0's exit):\n%s", rc, out);
    ck_assert_msg(strstr(out, "the job failed: 2 of 3 workers ended (0 completed), the other 1 show no sign of life"),
                  "the stop is not explained:\n%s", out);
    ck_assert_msg(strstr(out, "job failed (rank 0: exit 3; rank 1: ended without a record; rank 2: exit 3)"),
                  "no failure line:\n%s", out);
    ck_assert_msg(!left[0] && !left[1], "rank 1 (pid %ld, wrapper %ld) outlived the launcher", pids[0], pids[1]);
    free(p1);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L2, L3, L4: mpirun cannot start the workers (a host it cannot reach: here its agent,
   standing for ssh, never returns): no wrapper ever beats, and mpirun would wait for the
   host for ever. The launcher stops it --start-timeout after the launch, says why, fails
   the job, and leaves nothing of it behind. (Before: it waited for mpirun for ever; a
   launch whose namespace hosts went away under a timed-out test ran on for 36 minutes.) */
START_TEST(no_worker_started_launch_stopped)
{
    char *dir = th_tmpdir("run-nostart"), path[4096], *out = NULL;
    snprintf(path, sizeof(path), "%s/agent", dir);
    th_assert_rc(th_write_file(path, "#!/bin/sh\nsleep 1000\n", 22), 0);
    chmod(path, 0755);
    char agent[4200], hostfile[4096];
    snprintf(agent, sizeof(agent), "OMPI_MCA_plm_rsh_agent=%s", path);
    snprintf(hostfile, sizeof(hostfile), "%s/hosts", dir);
    th_assert_rc(th_write_file(hostfile, "rk-unreachable slots=2\n", 23), 0);
    const char *env[] = {agent, "OMPI_MCA_plm_rsh_no_tree_spawn=1", NULL};
    int rc = LAUNCH(env, &out, "env", dir, "-n", "2", "--hostfile", hostfile, "--start-timeout", "2");
    ck_assert_msg(rc == 1, "launcher status %d, want 1:\n%s", rc, out ? out : "(timed out)");
    ck_assert_msg(strstr(out, "no worker has started within 2 s of the launch"), "the stop is not explained:\n%s", out);
    char *left = NULL;
    snprintf(path, sizeof(path), "pgrep -f '%s/agen[t]' || true", dir); /* [t]: not this shell */
    th_sh(path, 10, &left);
    ck_assert_msg(left && !*left, "the agent outlived the launcher: %s", left ? left : "");
    free(left);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* L1: a PROGRAM that cannot be started fails like a job that died (exit 127), no hang. */
START_TEST(missing_program_fails)
{
    char *rekindle = th_bin("rekindle"), *out = NULL;
    char *argv[] = {rekindle, "run", "-n", "2", "--", "/nonexistent/program", NULL};
    th_assert_rc(th_run(argv, NULL, JOB_TIMEOUT_S, &out), 127);
    ck_assert_msg(strstr(out, "cannot start /nonexistent/program"), "no reason given:\n%s", out);
    free(out);
    free(rekindle);
}
END_TEST

/* L3, L4, L5: SIGINT to the launcher: every worker (even ones that ignore SIGINT and
   SIGTERM) is gone when it returns, nothing matches the job's command line, and the status is 130. */
START_TEST(sigint_leaves_nothing_behind)
{
    char *dir = th_tmpdir("run-sigint");
    char *rekindle = th_bin("rekindle"), *prog = prog_path();
    char logpath[4096];
    snprintf(logpath, sizeof(logpath), "%s/launcher.log", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        freopen(logpath, "w", stdout);
        dup2(STDOUT_FILENO, STDERR_FILENO);
        unsetenv("RK_JOB_SECRET");
        execl(rekindle, rekindle, "run", "-n", "3", "--", prog, "hang", dir, (char *)NULL);
        _exit(127);
    }
    long pids[3] = {0};
    for (int waited = 0; waited < 300; waited++) { /* up to 30 s for the workers to start */
        int have = 0;
        for (int r = 0; r < 3; r++) {
            char name[16];
            snprintf(name, sizeof(name), "pid-%d", r);
            char *s = read_in(dir, name);
            if (s && *s)
                pids[r] = atol(s), have++;
            free(s);
        }
        if (have == 3)
            break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < 3; r++)
        ck_assert_msg(pids[r] > 0 && alive(pids[r]), "worker %d did not start", r);
    kill(pid, SIGINT);
    int status = 0, waited = 0;
    for (; waited < 300 && waitpid(pid, &status, WNOHANG) == 0; waited++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (waited == 300) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("the launcher did not end within 30 s of SIGINT");
    }
    char *log = th_read_file(logpath, NULL);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 130, "launcher status %#x, want exit 130; log:\n%s",
                  status, log ? log : "");
    for (int r = 0; r < 3; r++)
        ck_assert_msg(!alive(pids[r]), "worker %d (pid %ld) outlived the launcher", r, pids[r]);
    char *pg = NULL, *pgrep[] = {"pgrep", "-a", "-f", "--", dir, NULL};
    ck_assert_msg(th_run(pgrep, NULL, 10, &pg) == 1, "processes of the job left behind:\n%s", pg ? pg : "");
    free(pg);
    free(log);
    free(rekindle);
    free(prog);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A secret the detector takes is one the launcher takes: one parser, one case rule
   (det_key_from_secret). (Before: the launcher's own check refused upper case, exit 2.) */
START_TEST(secret_upper_case_as_the_detector_takes_it)
{
    static char set[] = "RK_JOB_SECRET=00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff";
    char *dir = th_tmpdir("run-upper"), *out = NULL;
    const char *env[] = {set, NULL};
    th_assert_rc(LAUNCH(env, &out, "env", dir, "-n", "2"), 0);
    char *e = read_in(dir, "env-1"), val[128];
    ck_assert_msg(e && env_value(e, "RK_JOB_SECRET", val, sizeof(val)), "no worker saw the secret:\n%s", out);
    ck_assert_str_eq(val, set + strlen("RK_JOB_SECRET="));
    free(e);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A discovery script that printed its hosts, closed its stdout and went on (waiting for
   a child of its group, which does not hold the pipe) is ended with its whole group at the 10 s bound: the launcher goes
   on (here: no slot, exit 2, the script named) and nothing of the script is left.
   (Before: the launcher waited for the script's end, 1000 s.) */
START_TEST(discovery_script_ended_at_its_bound)
{
    char *dir = th_tmpdir("run-disc"), *out = NULL, script[4300], pidf[4200];
    snprintf(pidf, sizeof(pidf), "%s/sleeper", dir);
    snprintf(script, sizeof(script), "sleep 1000 >/dev/null & echo $! > %s; echo nohost.invalid:1; exec >&-; wait", pidf);
    int rc = LAUNCH(NULL, &out, NULL, NULL, "--host-discovery-script", script, "--elastic-timeout", "0", "--",
                    "/bin/true");
    char *p = th_read_file(pidf, NULL);
    long sleeper = p ? atol(p) : 0;
    bool left = sleeper > 0 && alive(sleeper);
    if (left)
        kill((pid_t)sleeper, SIGKILL);
    ck_assert_msg(rc == 2 && strstr(out, "did not finish in 10 s"), "rc %d, want 2:\n%s", rc, out);
    ck_assert_msg(sleeper > 0 && !left, "the script's child (pid %ld) outlived its bound", sleeper);
    free(p);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A lost worker's host is matched to the discovery script's name for it when the script
   prints its FQDN (the worker's hostname is the short name) or its address: the host
   cools down and the job does not count its slots as free. (Before: no match, no
   cool-down: "3 slots are free for 2 workers".) */
START_TEST(lost_host_matched_by_fqdn_or_address)
{
    static const char *const scripts[] = {"echo rkq.rk.test:3", "echo $(hostname -I | cut -d\" \" -f1):3"};
    static const char *const names[] = {"rkq.rk.test", ""};
    char *rekindle = th_bin("rekindle"), *prog = prog_path();
    for (int i = 0; i < 2; i++) {
        char *dir = th_tmpdir("run-match"), *out = NULL, cmd[8192];
        snprintf(cmd, sizeof(cmd),
                 "unshare --uts sh -c 'hostname rkq && exec \"$0\" \"$@\"' %s run --host-discovery-script '%s' "
                 "--discovery-interval 0.2 --blacklist-cooldown 60 --elastic-timeout 0 -- %s fail1 %s",
                 rekindle, scripts[i], prog, dir);
        unsetenv("RK_RUN_DIR");
        unsetenv("RK_CKPT_DIR");
        th_assert_rc(th_sh(cmd, JOB_TIMEOUT_S, &out), 0);
        ck_assert_msg(strstr(out, "host rkq (listed as ") && strstr(out, names[i]) &&
                          strstr(out, "lost worker 1: no growth onto it for 60 s"),
                      "the lost worker's host was not matched (script %s):\n%s", scripts[i], out);
        ck_assert_msg(!strstr(out, "slots are free"), "the lost host's slots counted as free:\n%s", out);
        free(out);
        th_rmrf(dir);
        free(dir);
    }
    free(rekindle);
    free(prog);
}
END_TEST

static const struct {
    const char *args[10];
    const char *says;
} usage_errors[] = {
    {{NULL}, "-n N is required"},
    {{"-n", NULL}, "-n ''"},
    {{"-n", "0", "--", "true", NULL}, "-n '0'"},
    {{"-n", "two", "--", "true", NULL}, "-n 'two'"},
    {{"-n", "2", NULL}, "no PROGRAM"},
    {{"-n", "2", "--", NULL}, "no PROGRAM"},
    {{"-n", "2", "--spares", "-1", "--", "true", NULL}, "--spares '-1'"},
    {{"-n", "2", "--max-restarts", "x", "--", "true", NULL}, "--max-restarts 'x'"},
    {{"-n", "2", "--hostfile", "/nonexistent/hosts", "--", "true", NULL}, "/nonexistent/hosts"},
    {{"-n", "2", "--frobnicate", "--", "true", NULL}, "unknown option '--frobnicate'"},
    {{"--min-np", "2", "--", "true", NULL}, "--min-np and --max-np need --host-discovery-script"},
    {{"--host-discovery-script", "x", "--hostfile", "/etc/hosts", "--", "true", NULL}, "not with --hostfile"},
    {{"--host-discovery-script", "x", "--min-np", "3", "--max-np", "2", "--", "true", NULL},
     "--min-np 3 is more than --max-np 2"},
    {{"--host-discovery-script", "x", "--discovery-interval", "0", "--", "true", NULL}, "--discovery-interval '0'"},
};

/* A discovery script's bad line is named, and with no slot in --elastic-timeout the
   launcher gives up (exit 2) without launching anything. */
START_TEST(discovery_errors_named)
{
    char *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, NULL, NULL, "--host-discovery-script", "printf 'node1:4\\nnode2:zero\\n'",
                        "--elastic-timeout", "0", "--", "/bin/true"),
                 2);
    ck_assert_msg(strstr(out, "line 2 'node2:zero': want host or host:slots") &&
                      strstr(out, "0 free slots of the --min-np 1 after --elastic-timeout 0 s"),
                  "output:\n%s", out);
    free(out);
    th_assert_rc(LAUNCH(NULL, &out, NULL, NULL, "--host-discovery-script", "exit 3", "--elastic-timeout", "0", "--",
                        "/bin/true"),
                 2);
    ck_assert_msg(strstr(out, "'exit 3' failed (exit 3)"), "output:\n%s", out);
    free(out);
}
END_TEST

START_TEST(usage_errors_exit_2)
{
    char *out = NULL;
    th_assert_rc(launch(NULL, &out, NULL, NULL, usage_errors[_i].args), 2);
    ck_assert_msg(strstr(out, usage_errors[_i].says), "output does not say '%s':\n%s", usage_errors[_i].says, out);
    ck_assert_msg(strncmp(out, "rekindle: run: ", 15) == 0, "not one 'rekindle: run:' line:\n%s", out);
    free(out);
}
END_TEST

START_TEST(mpirun_not_found_exit_2)
{
    char *out = NULL;
    const char *env[] = {"PATH=/nonexistent", NULL};
    th_assert_rc(LAUNCH(env, &out, NULL, NULL, "-n", "2", "--", "/bin/true"), 2);
    ck_assert_msg(strstr(out, "mpirun not found"), "output:\n%s", out);
    free(out);
}
END_TEST

START_TEST(help)
{
    char *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, NULL, NULL, "--help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: rekindle run -n N"));
    ck_assert_ptr_nonnull(strstr(out, "--max-restarts"));
    free(out);
}
END_TEST

static Suite *run_suite(void)
{
    Suite *s = suite_create("run");
    TCase *jobs = tcase_create("jobs");
    tcase_set_timeout(jobs, 90);
    tcase_add_test(jobs, three_workers_complete);
    tcase_add_test(jobs, rk_variables_reach_workers);
    tcase_add_test(jobs, transport_chosen_only_where_nobody_did);
    tcase_add_test(jobs, secret_fresh_per_run_or_kept);
    tcase_add_test(jobs, malformed_secret_refused);
    tcase_add_test(jobs, spares_started_and_told);
    tcase_add_test(jobs, hostfile_passed_through);
    tcase_add_test(jobs, lost_worker_survivors_finish);
    tcase_add_test(jobs, failing_job_relaunched);
    tcase_add_test(jobs, late_worker_is_waited_for);
    tcase_add_test(jobs, unused_spares_do_not_complete_a_failed_job);
    tcase_add_test(jobs, failed_job_with_silent_worker_ends);
    tcase_add_test(jobs, missing_program_fails);
    tcase_add_test(jobs, no_worker_started_launch_stopped);
    tcase_add_test(jobs, sigint_leaves_nothing_behind);
    tcase_add_test(jobs, secret_upper_case_as_the_detector_takes_it);
    suite_add_tcase(s, jobs);
    TCase *el = tcase_create("elastic");
    tcase_set_timeout(el, 90);
    tcase_add_test(el, lost_host_matched_by_fqdn_or_address);
    tcase_add_test(el, discovery_script_ended_at_its_bound);
    suite_add_tcase(s, el);
    TCase *cli = tcase_create("command_line");
    tcase_set_timeout(cli, 30);
    tcase_add_loop_test(cli, usage_errors_exit_2, 0, (int)(sizeof(usage_errors) / sizeof(usage_errors[0])));
    tcase_add_test(cli, mpirun_not_found_exit_2);
    tcase_add_test(cli, discovery_errors_named);
    tcase_add_test(cli, help);
    suite_add_tcase(s, cli);
    return s;
}

int main(void)
{
    return th_main(run_suite());
}
