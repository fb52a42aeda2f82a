/*
 * tests/test_hang.c - bounds on a disk that stops answering, and attempts that never mix
 * (ckpt/ckpt.c invariants J2, J4, J5). The disk is made to stop with RK_FAULT's `hang`
 * kind (common/common.h): the writer thread's file operation does not return until the
 * process ends, or until RK_FAULT_HOLD's file is removed. Each case runs in its own
 * process (Check's fork mode), so a writer left hanging ends with it. Where two engines
 * share one process the stuck operation is the manifest's fsync, outside HDF5: a writer
 * stuck inside HDF5 holds the library's lock, which no other engine of the process could
 * take (one engine per process in a real job; see docs/PROTOCOL.md on exit).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../formats/fmt.h"
#include "common.h"
#include "harness.h"

#define TENSOR_BYTES 8192

static uint8_t data_a[TENSOR_BYTES], data_b[TENSOR_BYTES];
static const int64_t shape[1] = {TENSOR_BYTES};

static ckpt_tensor tensor(uint8_t *p)
{
    return (ckpt_tensor){.name = "w", .ptr = p, .dtype = RK_U8, .ndim = 1, .shape = shape, .nbytes = TENSOR_BYTES};
}

static ckpt_engine *engine(const char *dir, int rank, int world, uint64_t nonce, int timeout_ms)
{
    ckpt_config cfg = {.dir = dir, .rank = rank, .world = world, .keep = 2, .timeout_ms = timeout_ms,
                       .io = "auto", .nonce = nonce};
    ckpt_engine *e = NULL;
    int rc = ckpt_create(&e, &cfg);
    ck_assert_msg(rc == 0, "ckpt_create: %s", rk_last_error());
    return e;
}

static void set_fault(const char *spec, const char *path, const char *hold)
{
    setenv("RK_FAULT", spec, 1);
    if (path)
        setenv("RK_FAULT_PATH", path, 1);
    if (hold)
        setenv("RK_FAULT_HOLD", hold, 1);
    ck_assert_int_eq(rk__fault_reset(), 0);
}

/* Whether any directory directly under dir holds a file named name. */
static bool any_subdir_has(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    bool found = false;
    struct dirent *de;
    while (d && !found && (de = readdir(d)) != NULL) {
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", de->d_name, name);
        found = strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 && th_exists(dir, p);
    }
    if (d)
        closedir(d);
    return found;
}

static double ms_since(int64_t t0)
{
    return rk__ms_since(t0);
}

/* An engine (timeout 2 s) whose checkpoint of step 1 of *t will hang for ever in the fsync
   of its manifest. */
static ckpt_engine *stuck_in_manifest_sync(const char *dir, uint64_t nonce, const ckpt_tensor *t)
{
    set_fault("sync@*=hang", "shard-0.ok.part", NULL);
    ckpt_engine *e = engine(dir, 0, 1, nonce, 2000);
    ck_assert_int_eq(ckpt_start(e, 1, t, 1), 0);
    return e;
}

/* J5: rk_wait's engine wait and the engine's destruction return by their deadline while
   the writer is stuck in fsync forever, name the stuck operation and path, and nothing of
   that checkpoint is ever committed. (Before: both waited on a condition variable with no
   deadline, for ever.) */
START_TEST(wait_and_destroy_bounded_on_hung_disk)
{
    char *dir = th_tmpdir("hang");
    ckpt_tensor t = tensor(data_a);
    ckpt_engine *e = stuck_in_manifest_sync(dir, 0x11, &t);
    int64_t t0 = rk__mono_ns();
    int rc = ckpt_wait(e, rk__deadline_ns(300));
    double ms = ms_since(t0);
    ck_assert_msg(rc == RK_E_TIMEOUT, "ckpt_wait: %s", rk_strerror(rc));
    ck_assert_msg(ms < 3000, "ckpt_wait took %.0f ms past a 300 ms deadline", ms);
    ck_assert_msg(strstr(rk_last_error(), "sync of ") && strstr(rk_last_error(), ".tmp-step-000000000001-"),
                  "the error does not name the stuck operation and path: %s", rk_last_error());
    /* A checkpoint due meanwhile waits timeout/4 at most, then is skipped (J2). */
    t0 = rk__mono_ns();
    rc = ckpt_start(e, 2, &t, 1);
    ms = ms_since(t0);
    ck_assert_msg(rc == RK_E_BUSY, "ckpt_start while stuck: %s", rk_strerror(rc));
    ck_assert_msg(ms < 5 * 500, "ckpt_start waited %.0f ms (bound 500)", ms);
    t0 = rk__mono_ns();
    rc = ckpt_destroy(&e, rk__deadline_ns(300));
    ms = ms_since(t0);
    ck_assert_msg(rc == RK_E_TIMEOUT, "ckpt_destroy: %s", rk_strerror(rc));
    ck_assert_msg(ms < 3000, "ckpt_destroy took %.0f ms past a 300 ms deadline", ms);
    ck_assert_ptr_null(e);
    ck_assert(!th_exists(dir, "step-000000000001"));
    free(dir);
}
END_TEST

/* J5: a writer left behind is reported as RK_E_TIMEOUT by ckpt_destroy even when its job
   was abandoned first (an abandonment is no failure of its own), so rk_finalize's caller
   knows to leave with _exit. (Before: RK_E_ABORTED, and the program's exit handlers ran
   beside the writer.) */
START_TEST(destroy_reports_writer_left_after_abandon)
{
    char *dir = th_tmpdir("left");
    ckpt_tensor t = tensor(data_a);
    ckpt_engine *e = stuck_in_manifest_sync(dir, 0x12, &t);
    for (int i = 0; i < 500 && !any_subdir_has(dir, "shard-0.ok.part"); i++)
        rk__sleep_ns(10 * 1000000LL);
    ck_assert(ckpt_abandon(e));
    int rc = ckpt_destroy(&e, rk__deadline_ns(300));
    ck_assert_msg(rc == RK_E_TIMEOUT, "ckpt_destroy: %s (%s)", rk_strerror(rc), rk_last_error());
    ck_assert_msg(strstr(rk_last_error(), "left behind") && strstr(rk_last_error(), "sync of "),
                  "the error does not name the stuck operation: %s", rk_last_error());
    ck_assert_ptr_null(e);
    free(dir);
}
END_TEST

/* J5: an abandoned checkpoint is never committed, even once its disk answers again; its
   failure is reported once; a checkpoint whose commit had begun is not abandoned. */
START_TEST(abandoned_never_commits)
{
    char *dir = th_tmpdir("abandon"), hold[4200];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ck_assert_int_eq(th_write_file(hold, "x", 1), 0);
    set_fault("sync@*=hang", "shard-0.h5", hold);
    ckpt_engine *e = engine(dir, 0, 1, 0x22, 20000);
    ckpt_tensor t = tensor(data_a);
    ck_assert_int_eq(ckpt_start(e, 3, &t, 1), 0);
    rk__sleep_ns(100 * 1000000LL);
    ck_assert(ckpt_abandon(e));
    int64_t t0 = rk__mono_ns();
    int rc = ckpt_wait(e, rk__deadline_ns(20000)); /* abandoned: not waited for, and no failure */
    ck_assert_msg(rc == 0, "ckpt_wait after abandon: %s (%s)", rk_strerror(rc), rk_last_error());
    ck_assert_msg(ms_since(t0) < 2000, "ckpt_wait waited %.0f ms for an abandoned writer", ms_since(t0));
    unlink(hold); /* the disk answers again */
    ck_assert_int_eq(ckpt_destroy(&e, rk__deadline_ns(20000)), 0);
    ck_assert(!th_exists(dir, "step-000000000003"));

    /* The commit claimed first: hang at the commit's rename; abandoning is refused. */
    char final[4200];
    snprintf(final, sizeof(final), "%s/step-", dir);
    ck_assert_int_eq(th_write_file(hold, "x", 1), 0);
    set_fault("rename@*=hang", final, hold);
    e = engine(dir, 0, 1, 0x23, 20000);
    ck_assert_int_eq(ckpt_start(e, 4, &t, 1), 0);
    for (int i = 0; i < 400 && !any_subdir_has(dir, "index.h5"); i++)
        rk__sleep_ns(10 * 1000000LL);
    rk__sleep_ns(200 * 1000000LL); /* past the claim, in the rename */
    ck_assert(!ckpt_abandon(e));
    unlink(hold);
    ck_assert_int_eq(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    ck_assert(th_exists(dir, "step-000000000004"));
    ck_assert_int_eq(ckpt_destroy(&e, rk__deadline_ns(20000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* J4: a stale writer (rank 1 of a membership whose rank 0 is gone) and the attempt that
   commits the same step never share a file: the committed directory holds none of the
   stale writer's. (Before: both wrote in '.tmp-step-<S>', and the commit took the stale
   shard along.) */
START_TEST(stale_attempt_never_mixes)
{
    char *dir = th_tmpdir("stale");
    memset(data_a, 0xAA, sizeof(data_a));
    memset(data_b, 0xBB, sizeof(data_b));
    ckpt_engine *stale = engine(dir, 1, 2, 0xA, 20000);
    ckpt_tensor ta[2] = {tensor(data_a), tensor(data_a)};
    ta[1].name = "v"; /* two tensors: rank 1 of 2 writes one of them */
    char tmp[64], path[4300]; /* its rank 0 made the attempt's directory, then died */
    fmt_tmp_name(tmp, sizeof(tmp), 5, 0xA);
    snprintf(path, sizeof(path), "%s/%s", dir, tmp);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(ckpt_start(stale, 5, ta, 2), 0);
    for (int i = 0; i < 500 && !any_subdir_has(dir, "shard-1.ok"); i++)
        rk__sleep_ns(10 * 1000000LL);
    ck_assert_msg(any_subdir_has(dir, "shard-1.ok"), "the stale writer wrote no manifest");

    ckpt_engine *e = engine(dir, 0, 1, 0xB, 20000);
    ckpt_tensor tb[2] = {tensor(data_b), tensor(data_b)};
    tb[1].name = "v";
    ck_assert_int_eq(ckpt_start(e, 5, tb, 2), 0);
    ck_assert_msg(ckpt_wait(e, rk__deadline_ns(20000)) == 0, "%s", rk_last_error());
    ck_assert(th_exists(dir, "step-000000000005/shard-0.h5"));
    ck_assert_msg(!th_exists(dir, "step-000000000005/shard-1.h5") && !th_exists(dir, "step-000000000005/shard-1.ok"),
                  "the committed checkpoint holds the stale attempt's shard");
    fmt_ckpt *c = NULL;
    char step[4200];
    snprintf(step, sizeof(step), "%s/step-000000000005", dir);
    ck_assert_int_eq(fmt_ckpt_open(step, &c), 0);
    ck_assert_int_eq(c->world, 1);
    uint8_t back[TENSOR_BYTES];
    ck_assert_int_eq(fmt_ckpt_read(c, 0, back), 0);
    ck_assert(memcmp(back, data_b, sizeof(back)) == 0);
    fmt_ckpt_close(&c);
    ck_assert(ckpt_abandon(stale));
    ck_assert_int_eq(ckpt_destroy(&stale, rk__deadline_ns(5000)), 0); /* abandoned: not a failure */
    ck_assert_int_eq(ckpt_destroy(&e, rk__deadline_ns(5000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A rank that skips a checkpoint (its writer is stuck) tells rank 0 at once, which stops
   waiting for that shard instead of waiting its full timeout. (Before: rank 0 waited.) */
START_TEST(skip_tells_rank0_at_once)
{
    char *dir = th_tmpdir("skip"), hold[4200];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ck_assert_int_eq(th_write_file(hold, "x", 1), 0);
    set_fault("sync@*=hang", "shard-1.ok.part", hold);
    ckpt_tensor t[2] = {tensor(data_a), tensor(data_a)};
    t[1].name = "v";
    ckpt_engine *r1 = engine(dir, 1, 2, 0x33, 2000);
    ck_assert_int_eq(ckpt_start(r1, 2, t, 2), 0); /* stuck in fsync of its shard */
    rk__sleep_ns(50 * 1000000LL);
    ck_assert_int_eq(ckpt_start(r1, 4, t, 2), RK_E_BUSY); /* skipped after 500 ms: noted */

    ckpt_engine *r0 = engine(dir, 0, 2, 0x33, 30000);
    int64_t t0 = rk__mono_ns();
    ck_assert_int_eq(ckpt_start(r0, 4, t, 2), 0);
    int rc = ckpt_wait(r0, rk__deadline_ns(60000));
    double ms = ms_since(t0);
    ck_assert_msg(rc == RK_E_ABORTED, "rank 0: %s (%s)", rk_strerror(rc), rk_last_error());
    ck_assert_msg(ms < 10000, "rank 0 waited %.0f ms for a shard rank 1 had skipped (timeout 30000)", ms);
    ck_assert(!th_exists(dir, "step-000000000004"));
    unlink(hold);
    ck_assert(ckpt_abandon(r1));
    ckpt_destroy(&r1, rk__deadline_ns(10000));
    ck_assert_int_eq(ckpt_destroy(&r0, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Through the public API, 1 and 2 ranks: one rank's disk stops for good at its first
   checkpoint; every process ends within a bound, rk_wait says RK_E_TIMEOUT naming the
   stuck path, and no checkpoint of the stuck step is committed. (Before: rk_wait and
   rk_finalize hung for ever.) */
START_TEST(api_wait_finalize_bounded)
{
    char *dir = th_tmpdir("api"), *prog = th_bin("../tests/prog_ckpt");
    const int np = _i == 0 ? 1 : 2;
    char cdir[4200];
    snprintf(cdir, sizeof(cdir), "RK_CKPT_DIR=%s/ck", dir);
    const char *env[] = {cdir, "RK_CKPT_EVERY=2", "RK_TIMEOUT_MS=1500", "RK_FAULT=sync@*=hang",
                         np == 1 ? "RK_FAULT_PATH=shard-0.h5" : "RK_FAULT_PATH=shard-1.h5",
                         "RK_JOB_SECRET=0000000000000000000000000000000000000000000000000000000000000001", NULL};
    char *argv[] = {prog, "write", "7", "7", NULL}, *out = NULL;
    int64_t t0 = rk__mono_ns();
    int rc = np == 1 ? th_run(argv, env, 60, &out) : th_mpirun(np, argv, env, 60, &out);
    double ms = ms_since(t0);
    ck_assert_msg(rc != -1, "the job hung: %s", out ? out : "");
    ck_assert_msg(rc == 3, "exit %d, want 3 (rk_wait failed): %s", rc, out ? out : "");
    ck_assert_msg(strstr(out, "rk_wait: a deadline passed") && strstr(out, "shard-"),
                  "rk_wait's error does not name the stuck file: %s", out);
    ck_assert_msg(ms < 30000, "the job took %.0f ms (RK_TIMEOUT_MS 1500)", ms);
    char sub[4300];
    snprintf(sub, sizeof(sub), "%s/ck", dir);
    ck_assert(!th_exists(sub, "step-000000000002"));
    free(out);
    free(prog);
    th_rmrf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hang");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, wait_and_destroy_bounded_on_hung_disk);
    tcase_add_test(tc, destroy_reports_writer_left_after_abandon);
    tcase_add_test(tc, abandoned_never_commits);
    tcase_add_test(tc, stale_attempt_never_mixes);
    tcase_add_test(tc, skip_tells_rank0_at_once);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, api_wait_finalize_bounded, 0, 2);
    suite_add_tcase(s, tc);
    return th_main(s);
}
