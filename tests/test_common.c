/*
 * tests/test_common.c - the common/ part: options from the environment, error codes,
 * logging filters, the event log (valid JSON, whole lines under concurrent writers),
 * clocks, and rk_init/rk_finalize as a single process and under mpirun.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"

static void clear_rk_env(void)
{
    const char *vars[] = {"RK_CKPT_DIR", "RK_CKPT_EVERY", "RK_KEEP", "RK_HEARTBEAT_MS", "RK_MIN_WORLD",
                          "RK_TIMEOUT_MS", "RK_EVENT_LOG", "RK_DET_IFACE", "RK_IO", "RK_LOG", "RK_LOG_SUBSYS",
                          "RK_ROLLBACK", "RK_SPARES", "RK_RESTORE"};
    for (size_t i = 0; i < RK_ARRAY_LEN(vars); i++)
        unsetenv(vars[i]);
}

/* ---- options ------------------------------------------------------------------------- */

START_TEST(options_defaults)
{
    clear_rk_env();
    rk_options o;
    rk_options_init(&o);
    ck_assert_ptr_null(o.ckpt_dir);
    ck_assert_int_eq(o.ckpt_every, 100);
    ck_assert_int_eq(o.keep, 3);
    ck_assert_int_eq(o.heartbeat_ms, 100);
    ck_assert_int_eq(o.min_world, 1);
    ck_assert_int_eq(o.timeout_ms, 30000);
    ck_assert_str_eq(o.io, "auto");
    ck_assert_str_eq(o.rollback, "auto");
    ck_assert_str_eq(o.restore, "staged");
    ck_assert_str_eq(o.env_error, "");
    th_assert_rc(rk__options_validate(&o), 0);
    o.restore = NULL; /* taken from the reserved room: zero is its default (rekindle.h) */
    th_assert_rc(rk__options_validate(&o), 0);
}
END_TEST

START_TEST(options_from_env)
{
    clear_rk_env();
    setenv("RK_CKPT_DIR", "/tmp/ck", 1);
    setenv("RK_CKPT_EVERY", "25", 1);
    setenv("RK_KEEP", "2", 1);
    setenv("RK_HEARTBEAT_MS", "50", 1);
    setenv("RK_MIN_WORLD", "3", 1);
    setenv("RK_TIMEOUT_MS", "+1500", 1);
    setenv("RK_IO", "buffered", 1);
    setenv("RK_EVENT_LOG", "/tmp/ev", 1);
    setenv("RK_ROLLBACK", "disk", 1);
    setenv("RK_RESTORE", "inplace", 1);
    rk_options o;
    rk_options_init(&o);
    ck_assert_str_eq(o.ckpt_dir, "/tmp/ck");
    ck_assert_int_eq(o.ckpt_every, 25);
    ck_assert_int_eq(o.keep, 2);
    ck_assert_int_eq(o.heartbeat_ms, 50);
    ck_assert_int_eq(o.min_world, 3);
    ck_assert_int_eq(o.timeout_ms, 1500);
    ck_assert_str_eq(o.io, "buffered");
    ck_assert_str_eq(o.event_log, "/tmp/ev");
    ck_assert_str_eq(o.rollback, "disk");
    ck_assert_str_eq(o.restore, "inplace");
    ck_assert_str_eq(o.env_error, "");
    th_assert_rc(rk__options_validate(&o), 0);
}
END_TEST

/* Each bad value is reported by rk_init as RK_E_OPTION, naming the variable. */
static const struct {
    const char *var, *value;
} bad_env[] = {
    {"RK_HEARTBEAT_MS", "abc"}, {"RK_HEARTBEAT_MS", "-5"},   {"RK_HEARTBEAT_MS", "100ms"},
    {"RK_HEARTBEAT_MS", ""},    {"RK_KEEP", "0"},            {"RK_CKPT_EVERY", "-1"},
    {"RK_CKPT_EVERY", "99999999999"}, {"RK_MIN_WORLD", "0"}, {"RK_TIMEOUT_MS", "1e3"},
    {"RK_IO", "fast"},          {"RK_HEARTBEAT_MS", " 100"}, {"RK_ROLLBACK", "memory"},
    {"RK_RESTORE", "direct"},
};

START_TEST(options_bad_env_named_by_rk_init)
{
    clear_rk_env();
    setenv(bad_env[_i].var, bad_env[_i].value, 1);
    rk_options o;
    rk_options_init(&o);
    ck_assert_msg(strstr(o.env_error, bad_env[_i].var) != NULL, "env_error '%s' does not name %s",
                  o.env_error, bad_env[_i].var);
    rk_ctx *ctx = (rk_ctx *)0x1;
    th_assert_rc(rk_init(&ctx, &o), RK_E_OPTION);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(rk_last_error(), bad_env[_i].var) != NULL, "rk_last_error '%s' does not name %s",
                  rk_last_error(), bad_env[_i].var);
}
END_TEST

START_TEST(options_bad_fields_named)
{
    clear_rk_env();
    rk_options o;
    rk_options_init(&o);
    o.keep = 0;
    th_assert_rc(rk__options_validate(&o), RK_E_OPTION);
    ck_assert_ptr_nonnull(strstr(rk_last_error(), "RK_KEEP"));
    rk_options_init(&o);
    o.heartbeat_ms = -5;
    th_assert_rc(rk__options_validate(&o), RK_E_OPTION);
    ck_assert_ptr_nonnull(strstr(rk_last_error(), "RK_HEARTBEAT_MS"));
    rk_options_init(&o);
    o.io = "fast";
    th_assert_rc(rk__options_validate(&o), RK_E_OPTION);
    ck_assert_ptr_nonnull(strstr(rk_last_error(), "RK_IO"));
    rk_options_init(&o);
    o.ckpt_dir = "";
    th_assert_rc(rk__options_validate(&o), RK_E_OPTION);
    th_assert_rc(rk__options_validate(NULL), -EINVAL);
}
END_TEST

START_TEST(parse_int_strict)
{
    long v = 0;
    const char *why = NULL;
    th_assert_rc(rk__parse_int("42", 0, 100, &v, &why), 0);
    ck_assert_int_eq(v, 42);
    th_assert_rc(rk__parse_int("-7", -10, 10, &v, NULL), 0);
    ck_assert_int_eq(v, -7);
    th_assert_rc(rk__parse_int("12x", 0, 100, &v, &why), RK_E_OPTION);
    ck_assert_str_eq(why, "not an integer");
    th_assert_rc(rk__parse_int("101", 0, 100, &v, &why), RK_E_OPTION);
    ck_assert_str_eq(why, "out of range");
    th_assert_rc(rk__parse_int("", 0, 100, &v, &why), RK_E_OPTION);
    th_assert_rc(rk__parse_int(NULL, 0, 100, &v, &why), RK_E_OPTION);
    th_assert_rc(rk__parse_int("99999999999999999999999", 0, 100, &v, &why), RK_E_OPTION);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------- */

static const int all_codes[] = {
#define CODE_(name, c, msg) c,
    RK_ERROR_TABLE(CODE_)
#undef CODE_
};

START_TEST(every_code_has_a_distinct_message)
{
    for (size_t i = 0; i < RK_ARRAY_LEN(all_codes); i++) {
        const char *m = rk_strerror(all_codes[i]);
        ck_assert_ptr_nonnull(m);
        ck_assert_msg(strlen(m) > 10, "code %d: message '%s' too short", all_codes[i], m);
        ck_assert_str_ne(m, "unknown error code");
        ck_assert(rk__is_rk_error(all_codes[i]));
        ck_assert_int_lt(all_codes[i], -1000);
        for (size_t j = 0; j < i; j++) {
            ck_assert_int_ne(all_codes[i], all_codes[j]);
            ck_assert_str_ne(m, rk_strerror(all_codes[j]));
        }
    }
    ck_assert_str_eq(rk_strerror(RK_OK), "success");
    ck_assert_ptr_nonnull(strstr(rk_strerror(RK_RECOVERED), "recovered"));
    ck_assert_str_eq(rk_strerror(-ENOENT), "No such file or directory");
    ck_assert_str_eq(rk_strerror(-999999), "unknown error code");
    ck_assert_str_eq(rk_strerror(12345), "unknown error code");
    ck_assert(!rk__is_rk_error(-ENOENT));
}
END_TEST

START_TEST(fail_sets_last_error_per_thread)
{
    clear_rk_env();
    rk__log_reload();
    int saved = dup(STDERR_FILENO);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    int rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EIO, "write %s failed", "shard-0.h5");
    dup2(saved, STDERR_FILENO);
    close(null);
    close(saved);
    th_assert_rc(rc, -EIO);
    ck_assert_str_eq(rk_last_error(), "write shard-0.h5 failed");
}
END_TEST

START_TEST(dtype_tables)
{
    ck_assert_uint_eq(rk__dtype_size(RK_F32), 4);
    ck_assert_uint_eq(rk__dtype_size(RK_BF16), 2);
    ck_assert_uint_eq(rk__dtype_size(RK_I64), 8);
    ck_assert_uint_eq(rk__dtype_size(RK_U8), 1);
    ck_assert_uint_eq(rk__dtype_size((rk_dtype)99), 0);
    ck_assert_str_eq(rk__dtype_name(RK_BF16), "bf16");
    ck_assert_ptr_null(rk__dtype_name((rk_dtype)-1));
}
END_TEST

/* ---- logging --------------------------------------------------------------------------- */

/* Runs fn with stderr captured; returns what it printed (malloc'd). */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/rk-log-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    char *s = th_read_file(path, NULL);
    unlink(path);
    return s;
}

static int evaluated;
static int side_effect(void)
{
    return ++evaluated;
}

static void log_some(void)
{
    RK_LOG_INFO(RK_SUB_DET, "det-info %d", 1);
    RK_LOG_INFO(RK_SUB_RING, "ring-info %d", 2);
    RK_LOG_WARN(RK_SUB_RING, "ring-warn %d", 3);
    RK_LOG_ERR(RK_SUB_RING, "ring-error %d", 4);
    RK_LOG_DEBUG(RK_SUB_DET, "det-debug %d", side_effect());
}

START_TEST(log_default_is_warn_and_quiet_below)
{
    clear_rk_env();
    rk__log_reload();
    evaluated = 0;
    char *s = capture_stderr(log_some);
    ck_assert_ptr_null(strstr(s, "det-info"));
    ck_assert_ptr_null(strstr(s, "ring-info"));
    ck_assert_ptr_nonnull(strstr(s, "ring-warn 3"));
    ck_assert_ptr_nonnull(strstr(s, "ring-error 4"));
    ck_assert_int_eq(evaluated, 0); /* arguments below the threshold are not evaluated */
    free(s);
}
END_TEST

START_TEST(log_level_and_subsys_filter)
{
    clear_rk_env();
    setenv("RK_LOG", "debug", 1);
    setenv("RK_LOG_SUBSYS", "det", 1);
    th_assert_rc(rk__log_reload(), 0);
    evaluated = 0;
    rk__log_set_rank(3);
    char *s = capture_stderr(log_some);
    ck_assert_ptr_nonnull(strstr(s, "det-info 1"));
    ck_assert_ptr_nonnull(strstr(s, "det-debug 1"));
    ck_assert_ptr_null(strstr(s, "ring-info"));
    ck_assert_ptr_null(strstr(s, "ring-warn"));
    ck_assert_ptr_nonnull(strstr(s, "ring-error 4")); /* errors pass every filter */
    ck_assert_int_eq(evaluated, 1);
    ck_assert_msg(strncmp(s, "[rekindle r3 ", 13) == 0, "prefix: %.60s", s);
    ck_assert_ptr_nonnull(strstr(s, " INFO det] det-info 1\n"));
    free(s);
}
END_TEST

START_TEST(log_bad_values_reported)
{
    clear_rk_env();
    setenv("RK_LOG", "loud", 1);
    int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    int rc = rk__log_reload();
    dup2(saved, STDERR_FILENO);
    close(null);
    close(saved);
    th_assert_rc(rc, RK_E_OPTION);
    ck_assert(rk__log_enabled(RK_SUB_DET, RK_LOG_WARN)); /* fell back to warn */
    ck_assert(!rk__log_enabled(RK_SUB_DET, RK_LOG_INFO));
    setenv("RK_LOG", "info", 1);
    setenv("RK_LOG_SUBSYS", "det,nosuch", 1);
    dup2(open("/dev/null", O_WRONLY), STDERR_FILENO);
    th_assert_rc(rk__log_reload(), RK_E_OPTION);
    ck_assert(rk__log_enabled(RK_SUB_DET, RK_LOG_INFO));
    ck_assert(!rk__log_enabled(RK_SUB_RING, RK_LOG_INFO));
}
END_TEST

/* ---- event log -------------------------------------------------------------------------- */

/* Every line of path parses as a JSON object with t_ns, rank and event; prints the count. */
static int json_lines_ok(const char *path, long want_lines)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s -c 'import json,sys\n"
             "n=0\n"
             "for l in open(sys.argv[1]):\n"
             "    o=json.loads(l); assert isinstance(o[\"t_ns\"],int) and isinstance(o[\"rank\"],int) and o[\"event\"]; n+=1\n"
             "assert n==%ld, n\n' %s",
             getenv("RK_TEST_PYTHON") ? getenv("RK_TEST_PYTHON") : "python3", want_lines, path);
    char *out = NULL;
    int rc = th_sh(cmd, 60, &out);
    if (rc != 0)
        fprintf(stderr, "json check of %s: %s\n", path, out ? out : "");
    free(out);
    return rc;
}

START_TEST(evlog_format_is_json)
{
    char buf[512];
    int n = rk__evlog_format(buf, sizeof(buf), 123, 2, "peer_dead",
                             (rk__evfield[]){RK_EV_I("peer", 1), RK_EV_I("epoch", 4), RK_EV_D("after_ms", 312.5),
                                             RK_EV_S("note", "quote\" back\\ nl\n tab\t \x01"), RK_EV_B("ok", true)},
                             5);
    ck_assert_int_gt(n, 0);
    ck_assert_str_eq(buf, "{\"t_ns\": 123, \"rank\": 2, \"event\": \"peer_dead\", \"peer\": 1, \"epoch\": 4, "
                          "\"after_ms\": 312.5, \"note\": \"quote\\\" back\\\\ nl\\n tab\\t \\u0001\", \"ok\": true}\n");
    /* too small a buffer: -ENOSPC, never a truncated line */
    th_assert_rc(rk__evlog_format(buf, 20, 123, 2, "peer_dead", NULL, 0), -ENOSPC);
}
END_TEST

START_TEST(evlog_off_is_noop)
{
    rk__evlog *ev = (rk__evlog *)0x1;
    th_assert_rc(rk__evlog_open(&ev, NULL, 0), 0);
    ck_assert_ptr_null(ev);
    th_assert_rc(RK_EVENT(ev, "x", RK_EV_I("a", 1)), 0);
    rk__evlog_close(&ev);
    int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    int rc = rk__evlog_open(&ev, "/nonexistent-dir/ev", 0);
    dup2(saved, STDERR_FILENO);
    th_assert_rc(rc, -ENOENT);
    ck_assert_ptr_null(ev);
}
END_TEST

enum { EV_THREADS = 8, EV_PER_THREAD = 2000 };

static void *ev_writer(void *arg)
{
    rk__evlog *ev = arg;
    char pad[600];
    memset(pad, 'x', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    for (int i = 0; i < EV_PER_THREAD; i++)
        RK_EVENT(ev, "ckpt_committed", RK_EV_I("step", i), RK_EV_I("bytes", (int64_t)1 << 40),
                 RK_EV_D("stall_ms", 0.25 * i), RK_EV_S("pad", pad + (i % 500)));
    return NULL;
}

START_TEST(evlog_concurrent_lines_whole)
{
    char *dir = th_tmpdir("evlog");
    char prefix[512], path[600];
    snprintf(prefix, sizeof(prefix), "%s/events", dir);
    snprintf(path, sizeof(path), "%s.7", prefix);
    /* Two processes, each with EV_THREADS threads, append to the same file. */
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    rk__evlog *ev = NULL;
    th_assert_rc(rk__evlog_open(&ev, prefix, 7), 0);
    pthread_t t[EV_THREADS];
    for (int i = 0; i < EV_THREADS; i++)
        pthread_create(&t[i], NULL, ev_writer, ev);
    for (int i = 0; i < EV_THREADS; i++)
        pthread_join(t[i], NULL);
    rk__evlog_close(&ev);
    ck_assert_ptr_null(ev);
    if (child == 0)
        _exit(0);
    int st = 0;
    waitpid(child, &st, 0);
    ck_assert_int_eq(json_lines_ok(path, 2L * EV_THREADS * EV_PER_THREAD), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* ---- clocks ---------------------------------------------------------------------------- */

START_TEST(clock_deadlines)
{
    int64_t t0 = rk__mono_ns();
    int64_t d = rk__deadline_ns(50);
    ck_assert(!rk__deadline_passed(d));
    ck_assert_int_le(rk__ms_left(d), 50);
    ck_assert_int_gt(rk__ms_left(d), 0);
    rk__sleep_ns(60 * 1000000LL);
    ck_assert(rk__deadline_passed(d));
    ck_assert_int_eq(rk__ms_left(d), 0);
    ck_assert(rk__ms_since(t0) >= 60.0);
    ck_assert(rk__deadline_ns(-1) == INT64_MAX);
    ck_assert(!rk__deadline_passed(rk__deadline_ns(-1)));
    ck_assert_int_gt(rk__real_ns(), 1600000000LL * 1000000000LL);
}
END_TEST

/* ---- rk_init / rk_finalize ------------------------------------------------------------- */

START_TEST(init_single_process_without_mpirun)
{
    clear_rk_env();
    rk_ctx *ctx = NULL;
    th_assert_rc(rk_init(&ctx, NULL), 0);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(rk_rank(ctx), 0);
    ck_assert_int_eq(rk_world(ctx), 1);
    ck_assert_int_eq(rk_next_step(ctx), 0);
    th_assert_rc(rk_step_done(ctx, 0), 0);
    th_assert_rc(rk_step_done(ctx, 1), 0);
    ck_assert_int_eq(rk_next_step(ctx), 2);
    th_assert_rc(rk_step_done(ctx, -1), -EINVAL);
    th_assert_rc(rk_finalize(&ctx), 0);
    ck_assert_ptr_null(ctx);
    th_assert_rc(rk_finalize(&ctx), -EINVAL);
    th_assert_rc(rk_finalize(NULL), -EINVAL);
    th_assert_rc(rk_init(NULL, NULL), -EINVAL);
}
END_TEST

/* Whether SIGPIPE is ignored in a program started now (its SigIgn mask). */
static bool child_ignores_sigpipe(void)
{
    char *out = NULL;
    ck_assert_int_eq(th_sh("grep '^SigIgn:' /proc/self/status", 10, &out), 0);
    unsigned long long mask = 0;
    ck_assert_msg(out && sscanf(out, "SigIgn: %llx", &mask) == 1, "status: %s", out ? out : "");
    free(out);
    return mask & (1ull << (SIGPIPE - 1));
}

typedef void (*sig_fn)(int);

static sig_fn sigpipe_now(void)
{
    struct sigaction sa;
    ck_assert_int_eq(sigaction(SIGPIPE, NULL, &sa), 0);
    return sa.sa_handler;
}

/* rk_init in a process whose SIGPIPE disposition is `before`. */
static rk_ctx *init_with_sigpipe(sig_fn before)
{
    clear_rk_env();
    signal(SIGPIPE, before);
    rk_ctx *ctx = NULL;
    th_assert_rc(rk_init(&ctx, NULL), 0);
    return ctx;
}

/* A write to a dead peer's socket must not kill a survivor: rk_init replaces SIGPIPE's
   default action by an empty handler (so the write fails with EPIPE), which exec resets
   for the programs a worker starts; rk_finalize puts the default back once MPI ended. */
START_TEST(init_makes_sigpipe_harmless)
{
    rk_ctx *ctx = init_with_sigpipe(SIG_DFL);
    ck_assert(sigpipe_now() != SIG_DFL && sigpipe_now() != SIG_IGN);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    close(p[0]);
    errno = 0;
    ck_assert_int_eq(write(p[1], "x", 1), -1); /* with the default, the process ends here */
    ck_assert_int_eq(errno, EPIPE);
    close(p[1]);
    ck_assert(!child_ignores_sigpipe());
    th_assert_rc(rk_finalize(&ctx), 0);
    ck_assert(sigpipe_now() == SIG_DFL);
}
END_TEST

/* A program's own choice for SIGPIPE (here SIG_IGN, as Python sets it) is left alone. */
START_TEST(init_keeps_the_programs_sigpipe)
{
    rk_ctx *ctx = init_with_sigpipe(SIG_IGN);
    ck_assert(sigpipe_now() == SIG_IGN);
    th_assert_rc(rk_finalize(&ctx), 0);
    ck_assert(sigpipe_now() == SIG_IGN);
    signal(SIGPIPE, SIG_DFL);
}
END_TEST

START_TEST(init_min_world_refused)
{
    clear_rk_env();
    setenv("RK_MIN_WORLD", "2", 1);
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    int rc = rk_init(&ctx, &o);
    dup2(saved, STDERR_FILENO);
    th_assert_rc(rc, RK_E_MIN_WORLD);
    ck_assert_ptr_null(ctx);
}
END_TEST

/* RK_SPARES: a count, fewer than the processes, and only with checkpoints (a spare takes
   over from the others' snapshot); each refusal names RK_SPARES. */
START_TEST(init_checks_spares)
{
    static const char *const bad[][2] = {{"abc", NULL}, {"2", NULL}, {"1", "/tmp/rk-spares-ck"}};
    int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY);
    for (size_t i = 0; i < RK_ARRAY_LEN(bad); i++) {
        clear_rk_env();
        setenv("RK_SPARES", bad[i][0], 1);
        if (bad[i][1])
            setenv("RK_CKPT_DIR", bad[i][1], 1); /* 1 spare of 1 process: none left to train */
        rk_options o;
        rk_options_init(&o);
        rk_ctx *ctx = NULL;
        dup2(null, STDERR_FILENO);
        int rc = rk_init(&ctx, &o);
        dup2(saved, STDERR_FILENO);
        th_assert_rc(rc, RK_E_OPTION);
        ck_assert_ptr_null(ctx);
        ck_assert_msg(strstr(rk_last_error(), "RK_SPARES") != NULL, "message: %s", rk_last_error());
    }
    clear_rk_env();
    unsetenv("RK_SPARES");
}
END_TEST

START_TEST(init_under_mpirun)
{
    char *prog = th_prog("prog_init");
    if (!prog)
        ck_abort();
    char *argv[] = {prog, NULL};
    char *out = NULL;
    int rc = th_mpirun(3, argv, NULL, 120, &out);
    ck_assert_msg(rc == 0, "mpirun exit %d:\n%s", rc, out ? out : "");
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof(want), "rank %d world 3\n", r);
        ck_assert_msg(strstr(out, want) != NULL, "missing '%s' in:\n%s", want, out);
    }
    free(out);
    free(prog);
}
END_TEST

/* rk_init of a process started without mpirun (recover/api.c, rekindle.h): MPI_Init forks
   no daemon (the process has no child after it), so the memory the program wrote before
   is not copy-on-write; the user's own setting is kept (isolated off: the singleton forks
   its orted, and every page of the 64 MiB written before faults on its next write). */
START_TEST(singleton_init_leaves_memory_writable)
{
    char *prog = th_prog("prog_init");
    if (!prog)
        ck_abort();
    char *argv[] = {prog, "rewrite", "64", NULL}, *out = NULL;
    for (int user_off = 0; user_off < 2; user_off++) {
        const char *env[] = {user_off ? "OMPI_MCA_ess_singleton_isolated=0" : NULL, NULL};
        int rc = th_run(argv, env, 60, &out);
        long faults = -1;
        int kids = -1;
        const char *l = out ? strstr(out, "rewrite faults ") : NULL;
        ck_assert_msg(rc == 0 && l && sscanf(l, "rewrite faults %ld of %*d pages children %d", &faults, &kids) == 2,
                      "exit %d: %s", rc, out);
        if (user_off)
            ck_assert_msg(faults >= 16384 && kids >= 1, "isolated off by the user: %ld faults (want every page), "
                          "%d children: %s", faults, kids, out);
        else
            ck_assert_msg(kids == 0, "rk_init of a singleton left %d child process(es) (%ld faults): %s", kids, faults,
                          out);
        free(out);
    }
    free(prog);
}
END_TEST

/* Open MPI's wait inside a spawn or connect for the other side's PMIx exchange (600 s as
   shipped, common/mpi.c): rk_init bounds it, so a connect to a port nothing accepts on
   fails after rk__mpi_exchange_wait_s seconds; a bound the user set is kept. */
START_TEST(spawn_exchange_wait_bounded)
{
    char *prog = th_prog("prog_init");
    if (!prog)
        ck_abort();
    char *argv[] = {prog, "connect-nobody", NULL}, *out = NULL;
    int wait_s = rk__mpi_exchange_wait_s(6000);
    for (int user = 0; user < 2; user++) {
        const char *env[] = {"RK_TIMEOUT_MS=6000", user ? "OMPI_MCA_pmix_base_exchange_timeout=4" : NULL, NULL};
        int rc = th_mpirun(1, argv, env, 90, &out);
        double s = -1;
        const char *l = out ? strstr(out, "connect to nobody: failed after ") : NULL;
        ck_assert_msg(rc == 0 && l && sscanf(l, "connect to nobody: failed after %lf s", &s) == 1,
                      "exit %d (-1: past 90 s, the wait unbounded): %.3000s", rc, out);
        if (user)
            ck_assert_msg(s < wait_s - 1, "the user's bound (4: 2 s) not kept: %.1f s", s);
        else
            ck_assert_msg(s >= wait_s - 1 && s < wait_s + 10, "connect to nobody failed after %.1f s, want about %d",
                          s, wait_s);
        free(out);
    }
    free(prog);
}
END_TEST

/* A worker that dies between MPI_Init and rk_init (prog_init die-at-start: the last of 3)
   holds the others at rk_init's first collective no longer than its bound: under mpirun
   with recovery 10 x RK_TIMEOUT_MS (2 s: 20 s), under `rekindle run` until its wrapper
   records the end. Before, they stayed inside MPI_Comm_dup for good. */
START_TEST(start_bounded_when_a_worker_dies)
{
    char *prog = th_prog("prog_init"), *rekindle = th_bin("rekindle"), *out = NULL;
    char *args[] = {"die-at-start", NULL};
    const char *env[] = {"RK_TIMEOUT_MS=2000", NULL};
    th_mpirun_prog(3, true, prog, args, env, 90, &out);
    double s = -1;
    const char *l = out ? strstr(out, "rk_init: failed after ") : NULL;
    ck_assert_msg(th_count(out, "rk_init: failed after ") == 2 && sscanf(l, "rk_init: failed after %lf s", &s) == 1 &&
                      s >= 19 && s < 40 && strstr(l, "MPI_Comm_idup (every worker's arrival) did not complete"),
                  "under mpirun: not both survivors failing rk_init after about 20 s:\n%.3000s", out);
    free(out);
    char *cmd = NULL;
    ck_assert(asprintf(&cmd, "RK_TIMEOUT_MS=2000 %s run -n 3 -- %s die-at-start 2>&1; echo \"exit=$?\"", rekindle,
                       prog) > 0);
    th_sh(cmd, 60, &out);
    l = out ? strstr(out, "rk_init: failed after ") : NULL;
    ck_assert_msg(th_count(out, "rk_init: failed after ") == 2 && sscanf(l, "rk_init: failed after %lf s", &s) == 1 &&
                      s < 10 && strstr(l, "worker 2 ended during the start") && !strstr(out, "exit=0\n"),
                  "under rekindle run: not both survivors failing rk_init at the record of worker 2's end:\n%.3000s",
                  out);
    free(out);
    free(cmd);
    free(rekindle);
    free(prog);
}
END_TEST

static Suite *common_suite(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("options");
    tcase_add_test(tc, options_defaults);
    tcase_add_test(tc, options_from_env);
    tcase_add_loop_test(tc, options_bad_env_named_by_rk_init, 0, (int)RK_ARRAY_LEN(bad_env));
    tcase_add_test(tc, options_bad_fields_named);
    tcase_add_test(tc, parse_int_strict);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, every_code_has_a_distinct_message);
    tcase_add_test(tc, fail_sets_last_error_per_thread);
    tcase_add_test(tc, dtype_tables);
    suite_add_tcase(s, tc);

    tc = tcase_create("log");
    tcase_add_test(tc, log_default_is_warn_and_quiet_below);
    tcase_add_test(tc, log_level_and_subsys_filter);
    tcase_add_test(tc, log_bad_values_reported);
    suite_add_tcase(s, tc);

    tc = tcase_create("evlog");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, evlog_format_is_json);
    tcase_add_test(tc, evlog_off_is_noop);
    tcase_add_test(tc, evlog_concurrent_lines_whole);
    suite_add_tcase(s, tc);

    tc = tcase_create("clock");
    tcase_add_test(tc, clock_deadlines);
    suite_add_tcase(s, tc);

    tc = tcase_create("init");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, init_single_process_without_mpirun);
    tcase_add_test(tc, init_min_world_refused);
    tcase_add_test(tc, init_makes_sigpipe_harmless);
    tcase_add_test(tc, init_keeps_the_programs_sigpipe);
    tcase_add_test(tc, init_checks_spares);
    tcase_add_test(tc, init_under_mpirun);
    tcase_add_test(tc, singleton_init_leaves_memory_writable);
    tcase_add_test(tc, spawn_exchange_wait_bounded);
    tcase_add_test(tc, start_bounded_when_a_worker_dies);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(common_suite());
}
