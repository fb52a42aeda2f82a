/*
 * tests/test_shard.c - sharded and per-rank state (docs/SHARDING.md) through the public
 * API, with real mpirun jobs of tests/prog_shard: round trips at 1 to 5 ranks with odd
 * sizes, restores into other world sizes bitwise against the global tensor, the global
 * tensor through index.h5 with h5py (a virtual dataset, from a moved directory), per-rank
 * state of ranks that no longer exist reported and readable, the CLI, registration errors,
 * a lost member rolling back from memory (its partner's copy) with the survivors' slices
 * re-split, and two adjacent losses rolling back from disk.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"

#define SECRET "0000000000000000000000000000000000000000000000000000000000000001"
#define S4 "step-000000000004"

static char *prog;

static void setup(void)
{
    prog = th_bin("../tests/prog_shard");
}

static void teardown(void)
{
    free(prog);
}

/* prog_shard MODE A SEED SPLIT [OLDW] on np ranks (np 1: alone) with checkpoints in dir
   every 2 steps and the event log at dir/../ev; returns the exit status. */
static int run_prog(int np, const char *dir, const char *mode, const char *a, const char *split, const char *oldw,
                    char **out)
{
    static char envdir[4200], envlog[4200];
    snprintf(envdir, sizeof(envdir), "RK_CKPT_DIR=%s", dir);
    snprintf(envlog, sizeof(envlog), "RK_EVENT_LOG=%s.ev", dir);
    const char *env[] = {envdir, envlog, "RK_CKPT_EVERY=2", "RK_KEEP=2", "RK_TIMEOUT_MS=20000",
                         "RK_JOB_SECRET=" SECRET, NULL};
    char *argv[] = {"--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0", prog, (char *)mode,
                    (char *)a, "11", (char *)split, (char *)oldw, NULL};
    if (np <= 1)
        return th_run(argv + 4, env, 120, out);
    return th_mpirun(np, argv, env, 150, out);
}

static int count(const char *out, const char *needle)
{
    int n = 0;
    for (const char *q = out; q && (q = strstr(q, needle)); q++)
        n++;
    return n;
}

/* Writes 4 steps (checkpoints 2 and 4) on `from` ranks (uneven split), resumes on `to`
   ranks (split: even or uneven) and checks every byte of every rank; returns dir. */
static char *write_then_resume(int from, int to, const char *split)
{
    char *dir = th_tmpdir("shard"), *out = NULL, oldw[16];
    snprintf(oldw, sizeof(oldw), "%d", from);
    int rc = run_prog(from, dir, "write", "4", "uneven", NULL, &out);
    ck_assert_msg(rc == 0 && count(out, " wrote") == from, "write on %d ranks: rc %d\n%s", from, rc, out);
    free(out);
    rc = run_prog(to, dir, "resume", "4", split, oldw, &out);
    ck_assert_msg(rc == 0 && count(out, " resumed 4") == to, "resume %d -> %d (%s): rc %d\n%s", from, to, split, rc,
                  out);
    free(out);
    return dir;
}

/* Round trips at 1..5 ranks, the same split as written (uneven: rank 0 holds no rows of
   the small tensors at 5 ranks; a 3 MiB tensor over several checksum blocks). */
START_TEST(roundtrip_1_to_5_ranks)
{
    int w = _i + 1;
    char split[16];
    snprintf(split, sizeof(split), "uneven");
    char *dir = write_then_resume(w, w, split);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* The checkpoint's per-rank events of a restore into `to` ranks from `from`. */
static char *events(const char *dir, int rank)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s.ev.%d", dir, rank);
    char *s = th_read_file(path, NULL);
    return s ? s : strdup("");
}

/* 4 -> 3: every rank reads its new rows from the old pieces; rank 3's per-rank state is
   reported (per_rank_orphaned on rank 0) and stays readable at ranks/3/ (rk_reader through
   the CLI, and h5py). */
START_TEST(restore_4_to_3_reports_orphans)
{
    char *dir = write_then_resume(4, 3, "even"), *out = NULL;
    char *ev = events(dir, 0);
    ck_assert_msg(strstr(ev, "\"per_rank_orphaned\"") && strstr(ev, "\"ranks\": \"3\""), "events:\n%s", ev);
    free(ev);
    char *cmd = NULL;
    ck_assert(asprintf(&cmd, "%s/bin/rekindle inspect %s", getenv("RK_TEST_BUILD"), dir) > 0);
    int rc = th_sh(cmd, 60, &out);
    ck_assert_msg(rc == 0 && strstr(out, "ranks/3/state/rng\ti64\t(6)") && strstr(out, "sh/w\tf64\t(23,5)"),
                  "inspect: rc %d\n%s", rc, out);
    free(cmd);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* 3 -> 5: ranks 3 and 4 find no per-rank state of theirs (reported, buffers untouched). */
START_TEST(restore_3_to_5_reports_missing)
{
    char *dir = write_then_resume(3, 5, "even");
    for (int r = 3; r < 5; r++) {
        char *ev = events(dir, r);
        ck_assert_msg(strstr(ev, "\"per_rank_missing\""), "rank %d events:\n%s", r, ev);
        free(ev);
    }
    th_rmrf(dir);
    free(dir);
}
END_TEST

START_TEST(restore_2_to_1)
{
    char *dir = write_then_resume(2, 1, "even");
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* index.h5 read with h5py as a user does, from a copy of the step directory elsewhere:
   the sharded tensors whole (virtual datasets over relative file names), the per-rank
   ones at ranks/<r>/, bitwise equal to the global tensors. Then `rekindle verify` and
   `rekindle restore` (one self-contained file with the same bytes). */
START_TEST(h5py_reads_global_tensors_from_moved_dir)
{
    char *dir = th_tmpdir("shard"), *out = NULL, *cmd = NULL;
    int rc = run_prog(3, dir, "write", "4", "uneven", NULL, &out);
    ck_assert_msg(rc == 0, "write: %s", out);
    free(out);
    const char *build = getenv("RK_TEST_BUILD");
    const char *names[] = {"rep/a", "sh/w", "sh/big", "sh/bf", "sh/one", "ranks/0/state/rng", "ranks/2/state/rng"};
    ck_assert(asprintf(&cmd,
                       "set -e; cd %s && cp -r " S4 " moved && %s/bin/rekindle restore %s --out %s/flat.h5 && "
                       "%s/bin/rekindle verify %s",
                       dir, build, dir, dir, build, dir) > 0);
    rc = th_sh(cmd, 60, &out);
    ck_assert_msg(rc == 0, "copy/restore/verify: rc %d\n%s", rc, out);
    free(cmd);
    free(out);
    for (size_t i = 0; i < RK_ARRAY_LEN(names); i++) {
        ck_assert(asprintf(&cmd,
                           "set -e; %s/tests/prog_shard expect %s 4 11 %s/want && cd / && %s -c \"import h5py,numpy\n"
                           "want=open('%s/want','rb').read()\n"
                           "for f in ('%s/moved/index.h5', '%s/flat.h5'):\n"
                           "  ds=h5py.File(f,'r')['%s']\n"
                           "  a=numpy.empty(ds.shape, dtype='V%%d' %% ds.id.get_type().get_size())\n"
                           "  ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, a, mtype=ds.id.get_type())\n"
                           "  got=a.tobytes()\n"
                           "  assert got==want, (f, len(got), len(want))\n"
                           "print('same')\"",
                           build, names[i], dir, getenv("RK_TEST_PYTHON"), dir, dir, dir, names[i]) > 0);
        rc = th_sh(cmd, 60, &out);
        ck_assert_msg(rc == 0 && strstr(out, "same"), "%s: rc %d\n%s", names[i], rc, out);
        free(cmd);
        free(out);
    }
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A damaged block of a sharded piece: a rank that reads those rows sees RK_E_CORRUPT, the
   resume falls back to the older checkpoint (step 2), and verify names the tensor. */
START_TEST(corrupt_block_falls_back)
{
    char *dir = th_tmpdir("shard"), *out = NULL, *cmd = NULL;
    int rc = run_prog(2, dir, "write", "4", "uneven", NULL, &out);
    ck_assert_msg(rc == 0, "write: %s", out);
    free(out);
    /* sh/big's piece in shard-1 is 2/3 of 3 MiB: flip a byte 2.5 MiB into the file. */
    ck_assert(asprintf(&cmd, "printf '\\377' | dd of=%s/" S4 "/shard-1.h5 bs=1 seek=2621440 conv=notrunc 2>/dev/null; "
                       "%s/bin/rekindle verify %s --step 4", dir, getenv("RK_TEST_BUILD"), dir) > 0);
    rc = th_sh(cmd, 60, &out);
    ck_assert_msg(rc == 1 && strstr(out, "sh/big"), "verify: rc %d\n%s", rc, out);
    free(cmd);
    free(out);
    rc = run_prog(3, dir, "resume", "2", "even", "2", &out);
    ck_assert_msg(rc == 0 && count(out, " resumed 2") == 3, "resume: rc %d\n%s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

START_TEST(registration_errors)
{
    char *dir = th_tmpdir("shard"), *out = NULL;
    int rc = run_prog(1, dir, "flags", "0", "even", NULL, &out);
    ck_assert_msg(rc == 0 && strstr(out, "flags ok"), "rc %d\n%s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* prog_shard kill on 4 ranks, VICTIMS killing themselves at step 5; the survivors'
   output. */
static char *kill_run_with(const char *dir, const char *victims, const char *extra1, const char *extra2)
{
    char *out = NULL;
    static char envdir[4200], envlog[4200];
    snprintf(envdir, sizeof(envdir), "RK_CKPT_DIR=%s", dir);
    snprintf(envlog, sizeof(envlog), "RK_EVENT_LOG=%s.ev", dir);
    const char *env[] = {envdir, envlog, "RK_CKPT_EVERY=2", "RK_KEEP=2", "RK_TIMEOUT_MS=4000", "RK_HEARTBEAT_MS=200",
                         "RK_JOB_SECRET=" SECRET, extra1, extra2, NULL};
    char *argv[] = {"--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0", prog, "kill", "10", "11",
                    (char *)victims, NULL};
    th_mpirun(4, argv, env, 150, &out);
    return out;
}

static char *kill_run(const char *dir, const char *victims)
{
    return kill_run_with(dir, victims, NULL, NULL);
}

/* Every survivor's event log (the logs are named by the launch's ranks 0..3) says where
   it resumed from, and nothing else. */
static void resumed_from(const char *dir, const char *victims, const char *from, const char *not_from)
{
    char want[64], unwanted[64];
    snprintf(want, sizeof(want), "\"from\": \"%s\"", from);
    snprintf(unwanted, sizeof(unwanted), "\"from\": \"%s\"", not_from);
    for (int r = 0; r < 4; r++) {
        char me[4];
        snprintf(me, sizeof(me), "%d", r);
        if (strstr(victims, me))
            continue;
        char *ev = events(dir, r);
        ck_assert_msg(strstr(ev, want) && !strstr(ev, unwanted), "rank %d events:\n%s", r, ev);
        free(ev);
    }
}

/* prog_shard kill on 4 ranks with VICTIMS: every survivor recovers into a world of
   `world`, finds every byte of the restored step and says it resumed from `from`. */
static void survivors_resume(const char *victims, int world, const char *from, const char *not_from)
{
    char *dir = th_tmpdir("shard"), *out = kill_run(dir, victims), want[64], done[64];
    snprintf(want, sizeof(want), "recovered world %d step ", world);
    snprintf(done, sizeof(done), "done world %d", world);
    ck_assert_msg(count(out, want) == world && count(out, " ok\n") == world && count(out, done) == world,
                  "survivors:\n%s", out);
    free(out);
    resumed_from(dir, victims, from, not_from);
    th_rmrf(dir);
    free(dir);
}

/* A job with sharded and per-rank state loses members whose right neighbours survive:
   their pieces are in those neighbours' memory, so the survivors roll back from memory,
   learn their new, larger slices, rebind them and find every byte of the restored step.
   The last member (its partner is rank 0: the ring wraps), one in the middle (pieces move
   both ways), rank 0, and two apart (two partners send at once). */
static const struct {
    const char *victims;
    int world;
} LOSSES[] = {{"3", 3}, {"1", 3}, {"0", 3}, {"1,3", 2}};

START_TEST(lost_member_rolls_back_from_memory)
{
    survivors_resume(LOSSES[_i].victims, LOSSES[_i].world, "memory", "disk");
}
END_TEST

/* A second loss right after a rebuild from memory, before any new snapshot: the rebuilt
   snapshot's partner copy, made from what each survivor held (rollback.c B7, snapshot.h
   S4, S11), is what the second rebuild reads, so the two survivors roll back from memory
   again and find every byte. Launch rank 1 is lost first (new ranks 0, 1, 2 are launch
   ranks 0, 2, 3); then new rank 2 (its sharded piece on new rank 0, which held all of it:
   the uneven split put it in old rank 3's), new rank 0 (its piece on new rank 2, all
   received: the ring wraps), or new rank 1 (its piece on new rank 2, part held, part
   received). */
static const char *SECOND[] = {"3", "0", "2"};

START_TEST(second_loss_after_rebuild_rolls_back_from_memory)
{
    char env[32], *dir = th_tmpdir("shard");
    snprintf(env, sizeof(env), "PROG_SECOND_VICTIM=%s", SECOND[_i]);
    char *out = kill_run_with(dir, "1", env, NULL);
    ck_assert_msg(count(out, "recovered world 3 step ") == 3 && count(out, "recovered world 2 step ") == 2 &&
                  count(out, " ok\n") == 5 && count(out, "done world 2") == 2, "survivors:\n%s", out);
    free(out);
    for (int r = 0; r < 4; r++) {
        if (r == 1 || r == atoi(SECOND[_i]))
            continue;
        char *ev = events(dir, r);
        ck_assert_msg(count(ev, "\"from\": \"memory\", \"epoch\"") == 2 && !strstr(ev, "\"from\": \"disk\""),
                      "rank %d events:\n%s", r, ev);
        free(ev);
    }
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Two neighbours lost at once (2 and 3: 2's pieces were only on 3): disk, every byte of the
   restored step on both survivors. */
START_TEST(adjacent_losses_roll_back_from_disk)
{
    survivors_resume("2,3", 2, "disk", "memory");
}
END_TEST

/* One member cannot take its part in the rebuild from memory (RK_FAULT=rollback on launch
   rank 2, after rank 1 is lost): it says so in the first collective of the rebuild, and
   every survivor goes to disk in the same round, well within RK_TIMEOUT_MS (4000 ms),
   instead of waiting the deadline out at every shift of the exchange (rollback.c B1, B5). */
START_TEST(member_that_cannot_rebuild_sends_all_to_disk_at_once)
{
    char *dir = th_tmpdir("shard"), *out = kill_run_with(dir, "1", "PROG_FAULT_RANK=2", "PROG_FAULT=rollback@0=eio");
    ck_assert_msg(count(out, "recovered world 3 step ") == 3 && count(out, " ok\n") == 3 &&
                  count(out, "done world 3") == 3, "survivors:\n%s", out);
    free(out);
    resumed_from(dir, "1", "disk", "memory");
    for (int r = 0; r < 4; r++) {
        if (r == 1)
            continue;
        char *ev = events(dir, r), *res = strstr(ev, "\"resumed\"");
        char *ms = res ? strstr(res, "\"ms\": ") : NULL;
        ck_assert_msg(ms && atof(ms + 6) < 2000.0, "rank %d took too long:\n%s", r, ev);
        free(ev);
    }
    th_rmrf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("shard");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, registration_errors);
    tcase_add_loop_test(tc, roundtrip_1_to_5_ranks, 0, 5);
    tcase_add_test(tc, restore_4_to_3_reports_orphans);
    tcase_add_test(tc, restore_3_to_5_reports_missing);
    tcase_add_test(tc, restore_2_to_1);
    tcase_add_test(tc, h5py_reads_global_tensors_from_moved_dir);
    tcase_add_test(tc, corrupt_block_falls_back);
    tcase_add_loop_test(tc, lost_member_rolls_back_from_memory, 0, (int)(sizeof(LOSSES) / sizeof(LOSSES[0])));
    tcase_add_loop_test(tc, second_loss_after_rebuild_rolls_back_from_memory, 0,
                        (int)(sizeof(SECOND) / sizeof(SECOND[0])));
    tcase_add_test(tc, adjacent_losses_roll_back_from_disk);
    tcase_add_test(tc, member_that_cannot_rebuild_sends_all_to_disk_at_once);
    suite_add_tcase(s, tc);
    return th_main(s);
}
