/*
 * tests/test_run.c - the launcher `rekindle run` (contract section 4), with real mpirun
 * jobs of tests/prog_run: a job runs and completes; RK_* settings, the job secret and
 * RK_SPARES reach every worker; a job that loses a worker while the others finish is a
 * success (no relaunch); a job that always fails is relaunched --max-restarts times and
 * exits with its status; SIGINT stops every worker (none left behind); usage errors
 * exit 2. The records directory (tools/records.c, invariants R1-R3): refused unless
 * private, never written through a planted link, beats judged by content on the
 * launcher's clock. An elastic run's discovery script is bounded, its host matched by
 * FQDN or address.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "rekindle.h"

#define JOB_TIMEOUT_S 60

static char *prog_path(void)
{
    const char *b = getenv("RK_TEST_BUILD");
    char *p = NULL;
    if (asprintf(&p, "%s/tests/prog_run", b ? b : "build") < 0)
        return NULL;
    return p;
}

/* rekindle run ARGS... -- prog_run MODE DIR (prog is appended when mode is not NULL). */
static int launch(const char *const env[], char **out, const char *mode, const char *dir, const char *const args[])
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

static char *read_in(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return th_read_file(path, NULL);
}

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

/* A lost worker whose peers finish is a success: exit 0, one launch, the loss reported. */
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

/* A job that always fails: launched 1 + max-restarts times, each relaunch logged with
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

/* A worker that exited 0 means "done", not "the others may die now": rank 0, still at
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

/* Spares that exited 0 without being brought in say nothing of the job: every member
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

static bool alive(long pid);

/* Every other worker failed while one went silent as on a lost host (no record, no beat,
   and mpirun never sees it end: Open MPI's mpirun does not exit after a remote loss): the
   launcher stops mpirun 5 s after the last record and exits with the job's status, saying
   why, and nothing of the silent worker is left. (Before: it waited for mpirun forever,
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

/* A PROGRAM that cannot be started fails like a job that died (exit 127), no hang. */
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

static bool alive(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z';
}

/* SIGINT to the launcher: every worker (even ones that ignore SIGINT and SIGTERM) is
   gone when it returns, nothing matches the job's command line, and the status is 130. */
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

/* A scene another user can reach: a directory under /tmp (RK_TEST_TMP is closed to them). */
static char *open_scene(void)
{
    ck_assert_msg(geteuid() == 0, "these cases act as uid 65534 through setpriv: run the suite as root");
    char *d = strdup("/tmp/rk-run-scene.XXXXXX");
    ck_assert_msg(d && mkdtemp(d), "mkdtemp: %s", strerror(errno));
    chmod(d, 0711);
    return d;
}

/* sh -c cmd as uid/gid 65534 (nobody), with S set to the scene. */
static int as_nobody(const char *scene, const char *cmd)
{
    char *line = NULL, *out = NULL;
    ck_assert_int_ge(asprintf(&line, "S=%s setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '%s'", scene, cmd),
                     0);
    int rc = th_sh(line, 30, &out);
    ck_assert_msg(rc == 0, "as nobody: %s: exit %d: %s", cmd, rc, out ? out : "");
    free(out);
    free(line);
    return rc;
}

/* A 0777 directory of uid 65534 at scene/name. */
static void nobody_dir(const char *scene, const char *name)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", scene, name);
    ck_assert_msg(mkdir(path, 0700) == 0 && chown(path, 65534, 65534) == 0 && chmod(path, 0777) == 0, "%s: %s", path,
                  strerror(errno));
}

/* Two 0600 files of the job's user, which planted links point at. */
static void make_victims(const char *scene)
{
    char path[4096];
    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof(path), "%s/victim%d.txt", scene, i);
        th_assert_rc(th_write_file(path, "precious\n", 9), 0);
        chmod(path, 0600);
    }
}

static void assert_victims(const char *scene, const char *out)
{
    char path[4096];
    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof(path), "%s/victim%d.txt", scene, i);
        char *v = th_read_file(path, NULL);
        ck_assert_msg(v && strcmp(v, "precious\n") == 0, "victim%d.txt was written through a planted link: '%s'\n%s",
                      i, v ? v : "(gone)", out);
        free(v);
    }
}

/* R1: RK_RUN_DIR is refused, with a message naming it, unless it is a directory (not a
   link) of the job's user closed to group and other writes -- here a 0777 directory of
   uid 65534 in which that user, while the launcher starts, keeps renaming attempt-0 away
   and planting its own (a stop file, links to the job's files); a link to a good
   directory; a group-writable one of the job's user. A private directory under a 1777
   parent (a shared /scratch) is used. (Before: the 0777 directory was used; the planted
   attempt stopped the job and had the job's files overwritten.) */
START_TEST(records_dir_refused_unless_private)
{
    char *scene = open_scene(), *out = NULL, *dir = th_tmpdir("run-private");
    make_victims(scene);
    nobody_dir(scene, "open");
    char *atk = NULL;
    ck_assert_int_ge(asprintf(&atk, "S=%s setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '"
                                    "end=$(($(date +%%s)+20)); while [ $(date +%%s) -lt $end ]; do "
                                    "mv $S/open/attempt-0 $S/open/moved.$$ 2>/dev/null; mkdir -p -m 777 $S/open/attempt-0; "
                                    "ln -sf $S/victim1.txt $S/open/attempt-0/.rank-0; "
                                    "ln -sf $S/victim2.txt $S/open/attempt-0/alive-0; "
                                    "touch $S/open/attempt-0/stop; done' >/dev/null 2>&1 & echo $!",
                     scene),
                     0);
    char *pid = NULL;
    th_sh(atk, 10, &pid);
    char env_open[4200];
    snprintf(env_open, sizeof(env_open), "RK_RUN_DIR=%s/open", scene);
    const char *env1[] = {env_open, NULL};
    int rc = LAUNCH(env1, &out, "env", dir, "-n", "2");
    if (pid && atol(pid) > 0)
        kill((pid_t)atol(pid), SIGKILL);
    ck_assert_msg(rc == 2 && strstr(out, env_open + strlen("RK_RUN_DIR=")) && strstr(out, "refused") &&
                      strstr(out, "owned by uid 65534"),
                  "rc %d, want 2 and the directory named:\n%s", rc, out);
    ck_assert_msg(!th_exists(dir, "launches"), "workers were started in a refused directory:\n%s", out);
    assert_victims(scene, out);
    free(out);

    /* A link to a good directory; a group-writable directory of the job's user. */
    char good[4200], link[4200], group[4200], e[4300];
    snprintf(good, sizeof(good), "%s/good", scene);
    snprintf(link, sizeof(link), "%s/link", scene);
    snprintf(group, sizeof(group), "%s/group", scene);
    ck_assert_int_eq(mkdir(good, 0700), 0);
    ck_assert_int_eq(symlink(good, link), 0);
    ck_assert_int_eq(mkdir(group, 0700), 0);
    chmod(group, 0770);
    const struct {
        const char *dir, *says;
    } bad[] = {{link, "is a symbolic link"}, {group, "writable by its group"}};
    for (size_t i = 0; i < 2; i++) {
        snprintf(e, sizeof(e), "RK_RUN_DIR=%s", bad[i].dir);
        const char *env[] = {e, NULL};
        th_assert_rc(LAUNCH(env, &out, "env", dir, "-n", "2"), 2);
        ck_assert_msg(strstr(out, bad[i].dir) && strstr(out, bad[i].says), "no '%s' naming %s:\n%s", bad[i].says,
                      bad[i].dir, out);
        free(out);
    }
    /* Private, under a 1777 parent: the job runs. */
    char sticky[4200];
    snprintf(sticky, sizeof(sticky), "%s/shared", scene);
    ck_assert_int_eq(mkdir(sticky, 0700), 0);
    chmod(sticky, 01777);
    snprintf(e, sizeof(e), "RK_RUN_DIR=%s/shared/run7", scene);
    const char *env3[] = {e, NULL};
    th_assert_rc(LAUNCH(env3, &out, "env", dir, "-n", "2"), 0);
    free(out);
    free(atk);
    free(pid);
    th_rmrf(scene);
    th_rmrf(dir);
    free(scene);
    free(dir);
}
END_TEST

/* R1, R2: the wrapper (another process, maybe on another host) checks the directory it is
   given before it writes there: an attempt directory of uid 65534, 0777, holding links to
   the job's files and a stop file, and a good attempt directory inside a 0777 run
   directory of uid 65534, are refused (exit 2, named), nothing is written through the
   links and PROGRAM is not started. (Before: PROGRAM ran and both files were
   overwritten.) */
START_TEST(wrapper_refuses_unsafe_records)
{
    char *scene = open_scene(), *out = NULL;
    make_victims(scene);
    char run1[4200], att1[4300], run2[4200], att2[4300], mark[4300];
    snprintf(run1, sizeof(run1), "%s/run1", scene);
    ck_assert_int_eq(mkdir(run1, 0700), 0);
    chmod(run1, 0777); /* nobody makes attempt-0 in it, then the job's user closes it */
    as_nobody(scene, "mkdir -m 777 $S/run1/attempt-0 && chmod 777 $S/run1/attempt-0 && "
                     "ln -s $S/victim1.txt $S/run1/attempt-0/.rank-0 && ln -s $S/victim2.txt $S/run1/attempt-0/alive-0 && "
                     "touch $S/run1/attempt-0/stop");
    chmod(run1, 0700);
    snprintf(att1, sizeof(att1), "%s/attempt-0", run1);
    snprintf(run2, sizeof(run2), "%s/run2", scene);
    nobody_dir(scene, "run2");
    snprintf(att2, sizeof(att2), "%s/attempt-0", run2);
    ck_assert_int_eq(mkdir(att2, 0700), 0);
    const char *dirs[] = {att1, att2}, *named[] = {att1, run2};
    char *rekindle = th_bin("rekindle");
    for (int i = 0; i < 2; i++) {
        snprintf(mark, sizeof(mark), "%s/ran-%d", scene, i);
        char *argv[] = {rekindle, "run", "--rk-worker", (char *)dirs[i], "--", "touch", mark, NULL};
        const char *env[] = {"OMPI_COMM_WORLD_RANK=0", NULL};
        th_assert_rc(th_run(argv, env, 30, &out), 2);
        ck_assert_msg(strstr(out, named[i]) && strstr(out, "is refused: it is owned by uid 65534"),
                      "no refusal naming %s:\n%s", named[i], out);
        ck_assert_msg(access(mark, F_OK) != 0, "PROGRAM ran in a refused directory");
        assert_victims(scene, out);
        free(out);
    }
    free(rekindle);
    th_rmrf(scene);
    free(scene);
}
END_TEST

/* R3: a worker whose beat's content keeps changing is at work, whatever the file's mtime
   says (set back to 2000 after every beat: a host whose clock runs behind, NFS's cached
   times): rank 0, still at work 8 s after rank 1 failed, is waited for. (Before: counted
   lost 5 s after rank 1's record, its job stopped.) */
START_TEST(beat_judged_by_content_not_mtime)
{
    char *dir = th_tmpdir("run-pastbeat"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "pastbeat0", dir, "-n", "2"), 0);
    char *d0 = read_in(dir, "done-0");
    ck_assert_msg(d0 != NULL && !strstr(out, "no sign of life"), "rank 0 at work was counted lost:\n%s", out);
    ck_assert_msg(strstr(out, "job completed by 1 of 2 workers; lost: rank 1: exit 3"), "output:\n%s", out);
    free(d0);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* R3: a beat whose content stopped changing goes stale by the launcher's clock, even with
   an mtime an hour ahead (a host whose clock runs ahead): the launcher stops mpirun 5 s
   after the last record, as for any silent worker. (Before: the future mtime looked
   fresh for an hour: the launcher waited.) */
START_TEST(beat_stale_despite_future_mtime)
{
    char *dir = th_tmpdir("run-stale"), *out = NULL;
    int rc = LAUNCH(NULL, &out, "stale1", dir, "-n", "3");
    char *p1 = read_in(dir, "pid-1");
    long pids[2] = {0, 0};
    if (p1)
        sscanf(p1, "%ld %ld", &pids[0], &pids[1]);
    for (int i = 0; i < 2; i++)
        if (pids[i] > 0 && alive(pids[i]))
            kill((pid_t)pids[i], SIGKILL);
    ck_assert_msg(rc == 3 && strstr(out, "the other 1 show no sign of life"), "rc %d, want 3:\n%s", rc, out);
    free(p1);
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
    tcase_add_test(jobs, sigint_leaves_nothing_behind);
    suite_add_tcase(s, jobs);
    TCase *rec = tcase_create("records");
    tcase_set_timeout(rec, 90);
    tcase_add_test(rec, secret_upper_case_as_the_detector_takes_it);
    tcase_add_test(rec, records_dir_refused_unless_private);
    tcase_add_test(rec, wrapper_refuses_unsafe_records);
    tcase_add_test(rec, beat_judged_by_content_not_mtime);
    tcase_add_test(rec, beat_stale_despite_future_mtime);
    tcase_add_test(rec, lost_host_matched_by_fqdn_or_address);
    tcase_add_test(rec, discovery_script_ended_at_its_bound);
    suite_add_tcase(s, rec);
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
