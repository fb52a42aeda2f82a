/*
 * tests/test_crash.c - crash consistency at every I/O step of a two-rank checkpoint
 * (ckpt/writer.c W1, W4, ckpt/ckpt.c J3; the crash model of docs/DESIGN.md).
 *
 * A job (tests/prog_ckpt continue, 2 ranks under mpirun, RK_KEEP=1) resumes from the
 * committed checkpoint 2 and takes checkpoint 4, whose commit removes 2 by retention. A
 * clean run counts each rank's file operations (formats/fio.h) of that whole job: resume,
 * shard, manifest, index, commit, retention, clean-up. Then, for every rank R, every
 * operation kind OP in the sweep and every N below R's count of OP, one run cuts rank R at
 * its N-th OP, twice:
 *   fail   the operation returns EIO (RK_FAULT=OP@N=eio);
 *   cut    the machine loses power before it (RK_FAULT=OP@N=powerloss, RK_FAULT_POWER):
 *          every process stops at once, and the disk is looked at three ways:
 *            crash      as it is (the processes died, the kernel kept every write);
 *            power      only what was made durable (fmt_power_rebuild);
 *            meta-only  every name kept, every byte not fsync'd dropped (fmt_power_drop_data).
 * One more case, in every sample, lets the job finish and then cuts the power: the
 * durability of what it reported (a missing fsync of the parent directory after the commit
 * rename shows only here, as no operation of the job follows the commit's report).
 * Each resulting directory must hold no step-* that does not verify (rekindle verify
 * --all); step-…4 must be there if rank 0 had logged its commit (ckpt_committed, the
 * promise of rk_wait) before the cut; a relaunch must restore checkpoint 4 if step-…4 is
 * there, else checkpoint 2, bitwise, and leave no '.'-entry behind (the temporaries of the
 * cut job are removed). A test of the power-loss model itself comes first.
 *
 * RK_CRASH_STRIDE=K runs every K-th (rank, OP, N) only (default 5, which keeps make check
 * within about two minutes; make crash-sweep runs every case: K=1); RK_CRASH_OFFSET=J
 * picks which of the K. The suite prints
 *   crash sweep: O operations, C cases, K checks, V violations
 * and fails if V > 0, listing the first violations.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/fio.h"
#include "../formats/fmt.h"
#include "common.h"
#include "harness.h"

#define S2 "step-000000000002"
#define S4 "step-000000000004"
#define SECRET "0000000000000000000000000000000000000000000000000000000000000001"
#define NP 2

static char *prog, *cli;

/* The operations swept: every one that changes the disk or makes it durable. */
static const enum rk__fault_op swept[] = {RK_FAULT_OP_OPEN,   RK_FAULT_OP_WRITE,  RK_FAULT_OP_SYNC,  RK_FAULT_OP_TRUNCATE, RK_FAULT_OP_RENAME,
                                    RK_FAULT_OP_SYNCDIR, RK_FAULT_OP_UNLINK, RK_FAULT_OP_SWAP, RK_FAULT_OP_MKDIR};

static struct {
    int cases, checks, violations;
    char first[4096];
} sw;

static void setup(void)
{
    prog = th_bin("../tests/prog_ckpt");
    cli = th_bin("rekindle");
}

static void teardown(void)
{
    free(prog);
    free(cli);
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "VIOLATION: %s\n", line);
    if (sw.violations++ < 8)
        snprintf(sw.first + strlen(sw.first), sizeof(sw.first) - strlen(sw.first), "\n  %s", line);
}

/* Runs the job in dir: prog continue 5, rank `rank` with RK_FAULT=cut (none if NULL);
   the event log goes to evlog.<rank>. */
static int run_job(const char *dir, const char *logdir, const char *evlog, int rank, const char *cut, char **out)
{
    char e[6][4200], rk[16];
    snprintf(e[0], sizeof(e[0]), "RK_CKPT_DIR=%s", dir);
    snprintf(e[1], sizeof(e[1]), "RK_FAULT_PATH=%s", dir);
    snprintf(e[2], sizeof(e[2]), "RK_FAULT_POWER=%s", logdir ? logdir : "");
    snprintf(e[3], sizeof(e[3]), "RK_CUT=%s", cut ? cut : "");
    snprintf(rk, sizeof(rk), "%d", rank);
    snprintf(e[4], sizeof(e[4]), "RK_CUT_RANK=%s", rk);
    snprintf(e[5], sizeof(e[5]), "RK_EVENT_LOG=%s", evlog ? evlog : "");
    const char *env[] = {e[0], e[1], e[2], e[3], e[4], e[5], "RK_CKPT_EVERY=2", "RK_KEEP=1", "RK_TIMEOUT_MS=5000",
                         "RK_JOB_SECRET=" SECRET, NULL};
    char *argv[] = {"/bin/sh", "-c",
                    "if [ -n \"$RK_CUT\" ] && [ \"$OMPI_COMM_WORLD_RANK\" = \"$RK_CUT_RANK\" ]; then "
                    "export RK_FAULT=\"$RK_CUT\"; fi; exec \"$0\" continue 5 7",
                    prog, NULL};
    return th_mpirun(NP, argv, env, 90, out);
}

/* The checks on one view of the disk after a cut; promised: step 4's commit was logged. */
static void check_view(const char *what, const char *view, bool promised)
{
    char *out = NULL;
    sw.checks++;
    bool s4 = th_exists(view, S4), s2 = th_exists(view, S2);
    if (promised && !s4)
        violation("%s: " S4 " is gone, though its commit was reported", what);
    if (!s4 && !s2) {
        violation("%s: neither " S2 " nor " S4 " is there", what);
        return;
    }
    char *vargv[] = {cli, "verify", (char *)view, "--all", NULL};
    int rc = th_run(vargv, NULL, 60, &out);
    if (rc != 0)
        violation("%s: rekindle verify --all: exit %d: %s", what, rc, out ? out : "");
    free(out);
    out = NULL;
    char ck[4200];
    snprintf(ck, sizeof(ck), "RK_CKPT_DIR=%s", view);
    const char *env[] = {ck, "RK_CKPT_EVERY=2", "RK_KEEP=1", "RK_TIMEOUT_MS=5000", "RK_JOB_SECRET=" SECRET, NULL};
    char *rargv[] = {prog, "resume", s4 ? "4" : "2", "7", NULL};
    rc = th_run(rargv, env, 60, &out);
    if (rc != 0)
        violation("%s: relaunch does not restore %s bitwise: exit %d: %s", what, s4 ? S4 : S2, rc, out ? out : "");
    free(out);
    int dots = th_dot_entries(view);
    if (dots != 0)
        violation("%s: %d '.'-entries left after the relaunch", what, dots);
}

/* One run cut at rank `rank`'s n-th op (op < 0: never; with power, the power goes once the
   job has ended, after every operation of every rank). */
static void one_case(const char *base, int rank, int op, uint64_t n, bool power)
{
    char what[256], cut[64] = "", cmd[9000], *out = NULL;
    if (op >= 0) {
        snprintf(cut, sizeof(cut), "%s@%llu=%s", rk__fault_op_name((enum rk__fault_op)op), (unsigned long long)n,
                 power ? "powerloss" : "eio");
        snprintf(what, sizeof(what), "rank %d %s", rank, cut);
    } else {
        snprintf(what, sizeof(what), "power lost after the job ended");
    }
    char *dir = th_tmpdir("cut"), *logdir = th_tmpdir("cut-log");
    snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/", base, dir);
    ck_assert_int_eq(th_sh(cmd, 30, NULL), 0);
    if (power)
        ck_assert_int_eq(fmt_power_baseline(dir, logdir), 0);
    sw.cases++;
    char evlog[4200], evfile[4300];
    snprintf(evlog, sizeof(evlog), "%s/events", logdir);
    int rc = run_job(dir, power ? logdir : NULL, evlog, rank, op >= 0 ? cut : NULL, &out);
    snprintf(evfile, sizeof(evfile), "%s.0", evlog);
    char *ev = th_read_file(evfile, NULL);
    bool promised = ev && strstr(ev, "\"ckpt_committed\"");
    free(ev);
    /* Whatever the job says (0, a reported failure, killed): a bound on its time, and no
       process dying of anything but the injected SIGKILL (mpirun reports 137 or 9). */
    if (rc < 0 || !(rc == 0 || rc == 3 || rc == 1 || rc == 9 || rc == 137)) {
        violation("%s: the job ended with %d (its output follows)", what, rc);
        fprintf(stderr, "%s\n", out ? out : "");
    }
    free(out);
    if (!power) {
        check_view(what, dir, promised);
    } else {
        char view[300], *crash = th_tmpdir("cut-crash"), *durable = th_tmpdir("cut-power");
        snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/ && rmdir '%s'", dir, crash, durable);
        ck_assert_int_eq(th_sh(cmd, 30, NULL), 0);
        snprintf(view, sizeof(view), "%s (crash)", what);
        check_view(view, crash, promised);
        int r = fmt_power_rebuild(dir, logdir, durable);
        snprintf(view, sizeof(view), "%s (power)", what);
        if (r)
            violation("%s: fmt_power_rebuild: %s", view, strerror(-r));
        else
            check_view(view, durable, promised);
        r = fmt_power_drop_data(dir, logdir);
        snprintf(view, sizeof(view), "%s (meta-only)", what);
        if (r)
            violation("%s: fmt_power_drop_data: %s", view, strerror(-r));
        else
            check_view(view, dir, promised);
        th_rmrf(crash);
        th_rmrf(durable);
        free(crash);
        free(durable);
    }
    th_rmrf(dir);
    th_rmrf(logdir);
    free(dir);
    free(logdir);
}

/* "rank R ops open=N write=N ..." lines of a clean run into counts[R][op]. */
static int parse_counts(const char *out, uint64_t counts[NP][RK_FAULT_OP_COUNT])
{
    int ranks = 0;
    for (const char *p = strstr(out, "rank "); p; p = strstr(p + 1, "rank ")) {
        int r = -1, used = 0;
        if (sscanf(p, "rank %d ops%n", &r, &used) != 1 || used == 0 || r < 0 || r >= NP)
            continue;
        ranks++;
        for (int op = 0; op < RK_FAULT_OP_COUNT; op++) {
            char key[32];
            snprintf(key, sizeof(key), " %s=", rk__fault_op_name((enum rk__fault_op)op));
            const char *k = strstr(p, key);
            const char *eol = strchr(p, '\n');
            if (k && (!eol || k < eol))
                counts[r][op] = strtoull(k + strlen(key), NULL, 10);
        }
    }
    return ranks;
}

static void put(const char *dir, const char *name, const char *data, bool sync)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = fmt_io_open(p, O_RDWR | O_CREAT, 0644);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    th_assert_rc(fmt_io_pwrite_all(fd, data, strlen(data), sb.st_size, p), 0);
    if (sync)
        th_assert_rc(fmt_io_fsync(fd, p), 0);
    close(fd);
}

/* Content of dir/name, or NULL if it does not exist. */
static char *got(const char *dir, const char *name)
{
    char p[8200];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return th_read_file(p, NULL);
}

#define EXPECT(dir, name, want)                                                                 \
    do {                                                                                        \
        char *g_ = got(dir, name);                                                              \
        const char *w_ = (want);                                                                \
        ck_assert_msg(w_ ? g_ && strcmp(g_, w_) == 0 : !g_, "%s/%s: '%s', want '%s'", dir, name, \
                      g_ ? g_ : "(none)", w_ ? w_ : "(none)");                                  \
        free(g_);                                                                               \
    } while (0)

/* The model (formats/fio_power.c): after the power goes, a file has the bytes it had at its
   last fsync (none: empty), and a name exists only as of its directory's last fsync; an
   inode number reused after a removal never inherits the old file's bytes. */
START_TEST(power_model)
{
    char *root = th_tmpdir("pm"), *log = th_tmpdir("pm-log"), p[4000], q[4000];
    put(root, "old", "OLD", false);
    snprintf(p, sizeof(p), "%s/sub", root);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    put(p, "kept", "KEPT", false);
    ck_assert_int_eq(fmt_power_baseline(root, log), 0); /* all of that is durable */
    setenv("RK_FAULT_POWER", log, 1);
    put(root, "a", "AAAA", true);    /* bytes durable */
    put(root, "b", "BBBB", false);   /* bytes never durable */
    put(p, "kept", "+more", false);  /* an append never made durable */
    th_assert_rc(fmt_io_fsync_dir(root), 0); /* names old, sub, a, b durable */
    snprintf(p, sizeof(p), "%s/a", root);
    snprintf(q, sizeof(q), "%s/c", root);
    th_assert_rc(fmt_io_rename(p, q), 0); /* not durable */
    put(root, "c", "cc", false);
    snprintf(p, sizeof(p), "%s/old", root);
    th_assert_rc(fmt_io_unlink(p), 0);    /* not durable */
    put(root, "d", "DDDD", true);           /* bytes durable, name not */
    put(root, "e", "EEEE", true);           /* the number of old may come back here */
    unsetenv("RK_FAULT_POWER");

    char out[4000];
    snprintf(out, sizeof(out), "%.3000s.power", root);
    ck_assert_int_eq(fmt_power_rebuild(root, log, out), 0);
    EXPECT(out, "old", "OLD");
    EXPECT(out, "a", "AAAA");
    EXPECT(out, "b", "");
    EXPECT(out, "c", NULL);
    EXPECT(out, "d", NULL);
    EXPECT(out, "e", NULL);
    EXPECT(out, "sub/kept", "KEPT");

    ck_assert_int_eq(fmt_power_drop_data(root, log), 0);
    EXPECT(root, "old", NULL);
    EXPECT(root, "a", NULL);
    EXPECT(root, "b", "");
    EXPECT(root, "c", "AAAA");
    EXPECT(root, "d", "DDDD");
    EXPECT(root, "e", "EEEE");
    EXPECT(root, "sub/kept", "KEPT");
    th_rmrf(out);
    th_rmrf(root);
    th_rmrf(log);
    free(root);
    free(log);
}
END_TEST

START_TEST(every_io_step_of_a_checkpoint)
{
    long stride = 5, offset = 0;
    const char *s = getenv("RK_CRASH_STRIDE"), *o = getenv("RK_CRASH_OFFSET");
    if (s)
        stride = strtol(s, NULL, 10) > 0 ? strtol(s, NULL, 10) : 1;
    if (o)
        offset = strtol(o, NULL, 10);
    char *base = th_tmpdir("crash-base"), *out = NULL;
    char ck[4200];
    snprintf(ck, sizeof(ck), "RK_CKPT_DIR=%s", base);
    const char *env[] = {ck, "RK_CKPT_EVERY=2", "RK_KEEP=1", "RK_TIMEOUT_MS=5000", "RK_JOB_SECRET=" SECRET, NULL};
    char *wargv[] = {prog, "write", "3", "7", NULL};
    int rc = th_mpirun(NP, wargv, env, 90, &out);
    ck_assert_msg(rc == 0 && th_exists(base, S2), "the base checkpoint: exit %d: %s", rc, out);
    free(out);

    /* The clean run: how many operations of each kind each rank does. */
    uint64_t counts[NP][RK_FAULT_OP_COUNT];
    memset(counts, 0, sizeof(counts));
    char *dir = th_tmpdir("crash-count"), cmd[9000];
    snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/", base, dir);
    ck_assert_int_eq(th_sh(cmd, 30, NULL), 0);
    rc = run_job(dir, NULL, NULL, 0, NULL, &out);
    ck_assert_msg(rc == 0 && parse_counts(out, counts) == NP && th_exists(dir, S4) && !th_exists(dir, S2),
                  "the clean run: exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);

    uint64_t ops = 0;
    long k = 0;
    for (int r = 0; r < NP; r++)
        for (size_t i = 0; i < RK_ARRAY_LEN(swept); i++) {
            ops += counts[r][swept[i]];
            for (uint64_t n = 0; n < counts[r][swept[i]]; n++, k++) {
                if (k % stride != offset % stride)
                    continue;
                one_case(base, r, (int)swept[i], n, false);
                one_case(base, r, (int)swept[i], n, true);
            }
        }
    one_case(base, 0, -1, 0, true); /* and after the last one: what a finished job promised */
    printf("crash sweep: %llu operations, %d cases, %d checks, %d violations%s\n", (unsigned long long)ops,
           sw.cases, sw.checks, sw.violations, stride > 1 ? " (a strided sample)" : "");
    fflush(stdout);
    ck_assert_int_gt(ops, 20);
    ck_assert_msg(sw.violations == 0, "%d violations in %d cases:%s", sw.violations, sw.cases, sw.first);
    th_rmrf(base);
    free(base);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("crash");
    TCase *tc = tcase_create("sweep");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1100);
    tcase_add_test(tc, power_model);
    tcase_add_test(tc, every_io_step_of_a_checkpoint);
    suite_add_tcase(s, tc);
    return th_main(s);
}
