/*
 * tests/test_detector_proc.c - the failure detector (detector/) in real workers under
 * mpirun (tests/prog_det.c), the event log as the oracle: kill -9, SIGSTOP/SIGCONT
 * (fencing), forged and garbage datagrams from outside the job; under `rekindle run`, a
 * kill reported by the parent and a stop found by silence. The protocol and the wire
 * format alone: tests/test_detector.c.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../detector/det_internal.h"
#include "harness.h"

static const uint8_t salt[DET_KEY_BYTES] = {4, 4, 4}; /* a forger's: any salt */

/* ---- proc: real workers under mpirun ------------------------------------------------------- */

struct job {
    pid_t pid;   /* the forked child that runs mpirun */
    char *dir, *out_path;
    int n;
};

/* Starts prog_det on n workers in the background; extra: mpirun options before it; with
   `launcher`, under `rekindle run -n n` instead of mpirun (extra unused). */
static struct job start_job_as(int n, int run_ms, const char *const extra[], const char *secret, bool launcher)
{
    struct job j = {.n = n};
    j.dir = th_tmpdir("det");
    ck_assert_ptr_nonnull(j.dir);
    if (asprintf(&j.out_path, "%s/out.txt", j.dir) < 0)
        ck_abort();
    j.pid = fork();
    ck_assert_int_ge(j.pid, 0);
    if (j.pid == 0) {
        /* exec, so that nothing of this (instrumented) process lingers in the child */
        char ms[64], nb[16], *prog = NULL, *pdir = NULL, *evl = NULL, *sec = NULL;
        if (asprintf(&pdir, "PROG_DET_DIR=%s", j.dir) < 0 || asprintf(&evl, "RK_EVENT_LOG=%s/ev", j.dir) < 0 ||
            !(prog = th_prog("prog_det")) ||
            (secret && asprintf(&sec, "RK_JOB_SECRET=%s", secret) < 0))
            _exit(90);
        snprintf(ms, sizeof(ms), "PROG_DET_MS=%d", run_ms);
        snprintf(nb, sizeof(nb), "%d", n);
        putenv(pdir);
        putenv(evl);
        putenv(ms);
        putenv("RK_HEARTBEAT_MS=100");
        if (sec)
            putenv(sec);
        int fd = open(j.out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(91);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        const char *argv[32] = {"timeout", "-k", "5", "150", "mpirun", "-n", nb, "--oversubscribe",
                                "--allow-run-as-root", "--mca", "btl", "self,vader,tcp"};
        int a = 12;
        char *cli = NULL;
        if (launcher) {
            if (asprintf(&cli, "%s/bin/rekindle", getenv("RK_TEST_BUILD")) < 0)
                _exit(90);
            const char *run[] = {"timeout", "-k", "5", "150", cli, "run", "-n", nb, "--"};
            a = 0;
            for (size_t i = 0; i < sizeof(run) / sizeof(run[0]); i++)
                argv[a++] = run[i];
        }
        for (int i = 0; !launcher && extra && extra[i]; i++)
            argv[a++] = extra[i];
        argv[a++] = prog;
        argv[a] = NULL;
        execvp("timeout", (char *const *)argv);
        _exit(127);
    }
    return j;
}

static struct job start_job(int n, int run_ms, const char *const extra[], const char *secret)
{
    return start_job_as(n, run_ms, extra, secret, false);
}

/* Waits (bounded) until every worker wrote its pid and port. */
static void job_addrs(const struct job *j, int *pids, int *ports)
{
    for (int r = 0; r < j->n; r++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/rank-%d", j->dir, r);
        char *s = NULL;
        for (int t = 0; t < 600 && !(s = th_read_file(path, NULL)); t++)
            usleep(100 * 1000);
        ck_assert_msg(s != NULL, "rank %d never started", r);
        ck_assert_int_eq(sscanf(s, "%d %d", &pids[r], &ports[r]), 2);
        free(s);
    }
}

/* Waits for the job; returns its output (malloc'd) and mpirun's status in *status. */
static char *finish_job(struct job *j, int *status)
{
    int st = 0;
    waitpid(j->pid, &st, 0);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *out = th_read_file(j->out_path, NULL);
    return out ? out : strdup("");
}

static void job_free(struct job *j)
{
    th_rmrf(j->dir);
    free(j->dir);
    free(j->out_path);
}

static char *event_log(const struct job *j, int r)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ev.%d", j->dir, r);
    char *s = th_read_file(path, NULL);
    return s ? s : strdup("");
}

static int count_str(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* The peer_dead line of `peer` in an event log, or NULL. */
static const char *dead_line(const char *ev, int peer)
{
    char want[64];
    snprintf(want, sizeof(want), "\"event\": \"peer_dead\", \"peer\": %d,", peer);
    return strstr(ev, want);
}

/* Rank 0's event log once it declares `peer` dead (bounded: 10 s); malloc'd. */
static char *wait_dead(const struct job *j, int peer)
{
    char *ev = NULL;
    for (int t = 0; t < 200; t++) {
        free(ev);
        ev = event_log(j, 0);
        if (dead_line(ev, peer))
            break;
        usleep(50 * 1000);
    }
    return ev;
}

static const char *const recovery_opts[] = {"--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0", NULL};
static const char secret[] = "5a0c4f1e2b7d9386a1c3e5f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b";

/* I2, I5 on real processes: kill -9 one worker, every survivor logs peer_dead for it with
   the same epoch, and the survivors finish in bounded time. */
START_TEST(proc_kill9_every_survivor_sees_peer_dead)
{
    struct job j = start_job(4, 6000, recovery_opts, secret);
    int pids[4], ports[4];
    job_addrs(&j, pids, ports);
    usleep(1500 * 1000);
    ck_assert_int_eq(kill(pids[2], SIGKILL), 0);
    int status;
    char *out = finish_job(&j, &status);
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        char *ev = event_log(&j, r);
        ck_assert_msg(strstr(ev, "\"event\": \"peer_dead\", \"peer\": 2, \"epoch\": 1") != NULL,
                      "rank %d event log lacks peer_dead of 2:\n%s\njob output:\n%s", r, ev, out);
        /* plain mpirun: no parent to report it, its silence tells */
        ck_assert_msg(strstr(ev, "\"via\": \"silence\"") != NULL && !strstr(ev, "\"via\": \"parent\""),
                      "rank %d: not learned from silence:\n%s", r, ev);
        ck_assert_msg(count_str(ev, "\"event\": \"peer_dead\"") == 1, "rank %d: more than one death:\n%s", r, ev);
        char want[64]; /* it went on to the end (later epochs: workers that finished left) */
        snprintf(want, sizeof(want), "rank %d epoch ", r);
        ck_assert_msg(strstr(out, want) != NULL, "missing '%s' in:\n%s", want, out);
        free(ev);
    }
    free(out);
    job_free(&j);
}
END_TEST

/* I6 on real processes: a stopped worker is declared dead; after SIGCONT it fences itself
   (rk_step_done returns RK_E_FENCED) instead of rejoining. */
START_TEST(proc_sigstop_then_fenced)
{
    struct job j = start_job(4, 6000, recovery_opts, secret);
    int pids[4], ports[4];
    job_addrs(&j, pids, ports);
    usleep(1500 * 1000);
    ck_assert_int_eq(kill(pids[1], SIGSTOP), 0);
    char *ev = wait_dead(&j, 1); /* then resume it */
    ck_assert_int_eq(kill(pids[1], SIGCONT), 0);
    int status;
    char *out = finish_job(&j, &status);
    ck_assert_msg(strstr(ev, "\"event\": \"peer_dead\", \"peer\": 1") != NULL, "rank 0 log:\n%s\n%s", ev, out);
    ck_assert_msg(strstr(out, "rank 1 fenced: ") != NULL, "rank 1 did not fence itself:\n%s", out);
    char *ev1 = event_log(&j, 1);
    ck_assert_msg(strstr(ev1, "\"event\": \"fenced\"") != NULL, "rank 1 log:\n%s", ev1);
    ck_assert_msg(strstr(ev1, "\"event\": \"peer_dead\"") == NULL, "the resumed worker declared others dead:\n%s", ev1);
    for (int r = 0; r < 4; r++) {
        if (r == 1)
            continue;
        char want[64];
        snprintf(want, sizeof(want), "rank %d epoch ", r);
        ck_assert_msg(strstr(out, want) != NULL, "missing '%s' in:\n%s", want, out);
        char *e = event_log(&j, r);
        ck_assert_msg(count_str(e, "\"event\": \"peer_dead\"") == 1 &&
                          strstr(e, "\"event\": \"peer_dead\", \"peer\": 1, \"epoch\": 1"),
                      "rank %d log:\n%s", r, e);
        free(e);
    }
    free(ev);
    free(ev1);
    free(out);
    job_free(&j);
}
END_TEST

/* utime + stime of a process, ns (/proc/PID/stat fields 14 and 15); -1 if unreadable. */
static int64_t proc_cpu_ns(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    char *s = th_read_file(path, NULL);
    const char *p = s ? strrchr(s, ')') : NULL; /* the name may hold spaces */
    unsigned long long ut, st;
    int64_t ns = -1;
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
        ns = (int64_t)(ut + st) * (1000000000LL / sysconf(_SC_CLK_TCK));
    free(s);
    return ns;
}

/* I10 on real processes: a worker stopped past its timeout, declared dead and continued
   fences itself; then, sleeping without calling the library, its detector thread sleeps
   too. Its process's CPU over 2 s of that sleep, read from outside, stays a small part
   of the time (a generous ceiling: a count of CPU, not a speed). Before I10 its thread
   polled with no timeout, at real-time priority where allowed: 2.8 s of CPU in 3 s. */
START_TEST(proc_fenced_worker_sleeps)
{
    setenv("PROG_DET_FENCED_SLEEP_MS", "6000", 1);
    struct job j = start_job(3, 10000, recovery_opts, secret);
    unsetenv("PROG_DET_FENCED_SLEEP_MS");
    int pids[3], ports[3];
    job_addrs(&j, pids, ports);
    usleep(1500 * 1000);
    ck_assert_int_eq(kill(pids[1], SIGSTOP), 0);
    char *ev = wait_dead(&j, 1), *out = NULL;
    ck_assert_msg(dead_line(ev, 1) != NULL, "rank 1 never declared dead:\n%s", ev);
    ck_assert_int_eq(kill(pids[1], SIGCONT), 0);
    for (int t = 0; t < 200; t++) { /* the worker says it is fenced, then sleeps */
        free(out);
        out = th_read_file(j.out_path, NULL);
        if (out && strstr(out, "rank 1 fenced: "))
            break;
        usleep(50 * 1000);
    }
    ck_assert_msg(out && strstr(out, "rank 1 fenced: "), "rank 1 did not fence itself:\n%s", out ? out : "");
    int64_t c0 = proc_cpu_ns(pids[1]), t0 = rk__mono_ns();
    usleep(2000 * 1000);
    int64_t c1 = proc_cpu_ns(pids[1]), t1 = rk__mono_ns();
    ck_assert_msg(c0 >= 0 && c1 >= 0, "rank 1 (pid %d) ended during its sleep", pids[1]);
    double share = (double)(c1 - c0) / (double)(t1 - t0);
    printf("proc_fenced_worker_sleeps: %.0f ms of CPU in %.0f ms asleep (%.1f%%)\n", (c1 - c0) / 1e6,
           (t1 - t0) / 1e6, 100 * share);
    ck_assert_msg(share < 0.25, "the fenced worker used %.0f ms of CPU in %.0f ms of sleep without calling the "
                  "library: its detector thread does not sleep", (c1 - c0) / 1e6, (t1 - t0) / 1e6);
    int status;
    free(out);
    out = finish_job(&j, &status);
    free(ev);
    free(out);
    job_free(&j);
}
END_TEST

/* I9, P2 under `rekindle run`: a SIGKILLed worker is declared dead by every survivor on
   its parent's report, in well under a heartbeat period; a worker stopped at the same
   moment is not reported by its parent (a stop is not an end): silence finds it, as
   before, and once continued it fences itself. */
START_TEST(proc_run_kill_via_parent_stop_via_silence)
{
    struct job j = start_job_as(5, 6000, NULL, NULL, true);
    int pids[5], ports[5];
    job_addrs(&j, pids, ports);
    usleep(1500 * 1000);
    ck_assert_int_eq(kill(pids[1], SIGSTOP), 0);
    ck_assert_int_eq(kill(pids[3], SIGKILL), 0);
    char *ev = wait_dead(&j, 1);
    ck_assert_int_eq(kill(pids[1], SIGCONT), 0);
    free(ev);
    int status;
    char *out = finish_job(&j, &status);
    ck_assert_msg(status == 0, "rekindle run exit %d:\n%s", status, out);
    for (int r = 0; r < 5; r++) {
        if (r == 1 || r == 3)
            continue;
        char *e = event_log(&j, r);
        const char *k = dead_line(e, 3), *st = dead_line(e, 1);
        ck_assert_msg(k && st, "rank %d lacks a death:\n%s\n%s", r, e, out);
        const char *kv = strstr(k, "\"via\": "), *sv = strstr(st, "\"via\": ");
        ck_assert_msg(kv && strncmp(kv, "\"via\": \"parent\"", 15) == 0, "rank %d: the kill not via parent:\n%s", r, e);
        ck_assert_msg(sv && strncmp(sv, "\"via\": \"silence\"", 16) == 0, "rank %d: the stop not via silence:\n%s", r,
                      e);
        ck_assert_int_eq(count_str(e, "\"event\": \"peer_dead\""), 2);
        free(e);
    }
    ck_assert_msg(strstr(out, "rank 1 fenced: ") != NULL, "rank 1 did not fence itself:\n%s", out);
    free(out);
    job_free(&j);
}
END_TEST

static void send_udp(int port, const void *buf, size_t len)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    /* the worker bound the host's outward address: find it through a connected socket */
    int probe = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "192.0.2.123", &any.sin_addr);
    socklen_t sl = sizeof(to);
    if (connect(probe, (struct sockaddr *)&any, sizeof(any)) != 0 || getsockname(probe, (struct sockaddr *)&to, &sl) != 0)
        inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    close(probe);
    to.sin_port = htons((uint16_t)port);
    to.sin_family = AF_INET;
    sendto(fd, buf, len, 0, (struct sockaddr *)&to, sizeof(to));
    close(fd);
}

static uint64_t stat_field(const char *ev, const char *key)
{
    const char *line = strstr(ev, "\"event\": \"det_stats\"");
    if (!line)
        return 0;
    char k[64];
    snprintf(k, sizeof(k), "\"%s\": ", key);
    const char *p = strstr(line, k);
    return p ? strtoull(p + strlen(k), NULL, 10) : 0;
}

/* Forged (wrong key), replayed-looking, garbage, short and oversized datagrams sent from
   outside the job are dropped and counted; nobody is declared dead. */
START_TEST(proc_forged_and_garbage_rejected)
{
    struct job j = start_job(4, 5000, NULL, secret);
    int pids[4], ports[4];
    job_addrs(&j, pids, ports);
    detw forger;
    static const uint8_t wrong[DET_KEY_BYTES] = {0xde, 0xad};
    uint8_t k[DET_KEY_BYTES];
    th_assert_rc(det_key_from_secret(secret, k), 0);
    th_assert_rc(detw_init(&forger, wrong, salt, 4, 3), 0);
    detm m = {.type = DETM_DECL, .src = 1, .dst = 3, .subject = -1, .origin = -1, .ndecl = 1};
    m.decl[0] = (detm_decl){0, 999};
    uint8_t buf[2048];
    size_t n = detw_encode(&forger, &m, buf);
    /* a forgery under the right job id: copy it in, MAC stays wrong */
    detw right;
    th_assert_rc(detw_init(&right, k, salt, 4, 3), 0);
    uint8_t job[8];
    for (int i = 0; i < 8; i++)
        job[i] = (uint8_t)(right.job >> (8 * i));
    for (int i = 0; i < 10; i++) {
        send_udp(ports[3], buf, n);                 /* wrong job */
        memcpy(buf + 8, job, 8);
        send_udp(ports[3], buf, n);                 /* right job, bad MAC */
        send_udp(ports[3], "garbage!", 8);          /* short */
        memset(buf + 200, 'x', 1000);
        send_udp(ports[3], buf, 1200);              /* oversized */
        n = detw_encode(&forger, &m, buf);
    }
    int status;
    char *out = finish_job(&j, &status);
    ck_assert_msg(status == 0, "mpirun exit %d:\n%s", status, out);
    char *ev = event_log(&j, 3);
    ck_assert_msg(stat_field(ev, "drop_job") >= 10 && stat_field(ev, "drop_mac") >= 10 &&
                      stat_field(ev, "drop_short") >= 10 && stat_field(ev, "drop_oversize") >= 10,
                  "rank 3 counters:\n%s", ev);
    ck_assert_msg(stat_field(ev, "rx_ok") > 0, "rank 3 accepted nothing:\n%s", ev);
    for (int r = 0; r < 4; r++) {
        char *e = event_log(&j, r);
        ck_assert_msg(strstr(e, "\"peer_dead\"") == NULL && strstr(e, "\"fenced\"") == NULL,
                      "rank %d acted on a forgery:\n%s", r, e);
        free(e);
    }
    detw_fini(&forger);
    detw_fini(&right);
    free(ev);
    free(out);
    job_free(&j);
}
END_TEST

/* A single process: the detector runs with no peers, and stops cleanly. */
START_TEST(proc_single_process)
{
    unsetenv("RK_JOB_SECRET");
    rk_ctx *ctx = NULL;
    th_assert_rc(rk_init(&ctx, NULL), 0);
    th_assert_rc(rk_step_done(ctx, 0), 0);
    th_assert_rc(rk_finalize(&ctx), 0);
}
END_TEST

/* rk_init reads the job's secret and removes it from the environment: a process the
   program starts does not inherit it. */
START_TEST(proc_secret_not_inherited)
{
    setenv("RK_JOB_SECRET", secret, 1);
    rk_ctx *ctx = NULL;
    th_assert_rc(rk_init(&ctx, NULL), 0);
    ck_assert_msg(getenv("RK_JOB_SECRET") == NULL, "RK_JOB_SECRET is still in the environment after rk_init");
    char *out = NULL;
    int rc = th_sh("test -z \"$RK_JOB_SECRET\" && echo clean", 30, &out);
    ck_assert_msg(rc == 0 && out && strstr(out, "clean"), "a child inherited RK_JOB_SECRET (rc %d): %s", rc,
                  out ? out : "");
    free(out);
    th_assert_rc(rk_step_done(ctx, 0), 0);
    th_assert_rc(rk_finalize(&ctx), 0);
}
END_TEST

/* A malformed RK_JOB_SECRET is refused by rk_init, naming the variable. */
START_TEST(proc_bad_secret_refused)
{
    rk_ctx *ctx = NULL;
    setenv("RK_JOB_SECRET", "xyz", 1);
    int saved = dup(STDERR_FILENO), null = open("/dev/null", 1);
    dup2(null, STDERR_FILENO);
    int rc = rk_init(&ctx, NULL);
    dup2(saved, STDERR_FILENO);
    th_assert_rc(rc, RK_E_OPTION);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(rk_last_error(), "RK_JOB_SECRET"));
}
END_TEST

/* Threads of this process under SCHED_RR (field 41 of /proc/self/task/T/stat). */
static int rr_threads(void)
{
    DIR *dir = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; dir && (e = readdir(dir));) {
        char path[300], buf[1024];
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[len] = '\0';
        char *q = strrchr(buf, ')'); /* after the command name: fields 3.. */
        int field = 2;
        for (; q && *q && field < 41; q++)
            field += *q == ' ';
        n += q && field == 41 && atoi(q) == SCHED_RR;
    }
    if (dir)
        closedir(dir);
    return n;
}

static void *nap(void *arg)
{
    (void)arg;
    return NULL;
}

/* Whether this process may make a thread real-time (root, CAP_SYS_NICE, RLIMIT_RTPRIO). */
static bool may_be_real_time(void)
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(&a, SCHED_RR);
    struct sched_param sp = {.sched_priority = 1};
    pthread_attr_setschedparam(&a, &sp);
    pthread_t t;
    bool ok = pthread_create(&t, &a, nap, NULL) == 0;
    if (ok)
        pthread_join(t, NULL);
    pthread_attr_destroy(&a);
    return ok;
}

/* The detector thread asks for SCHED_RR (its turns on time on a loaded machine: a normal
   thread's wake came 200-300 ms late at load ~10 on 2 cores, and its peers took that for
   death); RK_DET_RT=0 leaves it as it is; where the process may not, it runs as before. */
START_TEST(proc_detector_thread_real_time)
{
    unsetenv("RK_JOB_SECRET");
    bool may = may_be_real_time(), off = _i == 1; /* one process each: MPI starts once a process */
    if (off)
        setenv("RK_DET_RT", "0", 1);
    rk_ctx *ctx = NULL;
    th_assert_rc(rk_init(&ctx, NULL), 0);
    int n = 0;
    for (int i = 0; i < 100 && (n = rr_threads()) == 0 && may && !off; i++)
        usleep(10000); /* the thread sets its own policy as it starts */
    ck_assert_msg(n == (may && !off), "%d real-time threads (may: %d, RK_DET_RT=0: %d)", n, may, off);
    th_assert_rc(rk_finalize(&ctx), 0);
    unsetenv("RK_DET_RT");
    if (!may)
        printf("proc_detector_thread_real_time: this process may not use SCHED_RR: checked that none is used\n");
}
END_TEST

/* RK_DET_IFACE as a subnet ("127.0.0.0/8"): one setting for every host of a job, each
   binding its own address inside it; a subnet no interface is in is refused. */
START_TEST(proc_iface_subnet)
{
    det *d = NULL;
    det_cfg cfg = {.rank = 0, .world = 1, .heartbeat_ms = 100, .iface = "127.0.0.0/8"};
    th_assert_rc(det_open(&d, &cfg), 0);
    det_addr a;
    det_local_addr(d, &a);
    ck_assert_uint_eq(ntohl(a.ipv4) >> 24, 127);
    det_close(&d);
    int saved = dup(STDERR_FILENO), null = open("/dev/null", 1);
    dup2(null, STDERR_FILENO);
    cfg.iface = "198.51.100.0/24"; /* TEST-NET-2: on no interface here */
    int rc = det_open(&d, &cfg);
    cfg.iface = "127.0.0.0/33";
    int rc2 = det_open(&d, &cfg);
    dup2(saved, STDERR_FILENO);
    close(null);
    close(saved);
    th_assert_rc(rc, RK_E_OPTION);
    th_assert_rc(rc2, RK_E_OPTION);
    ck_assert_ptr_null(d);
}
END_TEST

static Suite *detector_proc_suite(void)
{
    Suite *s = suite_create("detector_proc");
    TCase *tc = tcase_create("proc");
    tcase_set_timeout(tc, 200);
    tcase_add_test(tc, proc_single_process);
    tcase_add_test(tc, proc_secret_not_inherited);
    tcase_add_test(tc, proc_bad_secret_refused);
    tcase_add_test(tc, proc_iface_subnet);
    tcase_add_loop_test(tc, proc_detector_thread_real_time, 0, 2);
    tcase_add_test(tc, proc_kill9_every_survivor_sees_peer_dead);
    tcase_add_test(tc, proc_sigstop_then_fenced);
    tcase_add_test(tc, proc_fenced_worker_sleeps);
    tcase_add_test(tc, proc_run_kill_via_parent_stop_via_silence);
    tcase_add_test(tc, proc_forged_and_garbage_rejected);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(detector_proc_suite());
}
