/*
 * tests/test_train_mpi.c - rk-train on what the library builds around it: data-parallel
 * runs of several ranks started by `rekindle run` (needs the allreduce ring) and resuming from a checkpoint
 * (needs the checkpoint engine). Each part is probed first: a part that reports "not
 * available" has its cases left out with a "SKIP:" line; if neither is there the whole
 * suite is skipped (exit 77), never passed.
 */
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

#define JOB_TIMEOUT_S 90

static void clear_rk_env(void)
{
    const char *vars[] = {"RK_CKPT_DIR", "RK_CKPT_EVERY", "RK_KEEP", "RK_EVENT_LOG", "RK_LOG", "RK_JOB_SECRET"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

/* rk-train ARGS on `world` ranks through `rekindle run` (which gives the job its
   secret), or with world 0 as a single process without mpirun. */
static int train(int world, const char *const env[], char **out, const char *const args[])
{
    char *rekindle = th_bin("rekindle"), *bin = th_bin("rk-train"), nbuf[16];
    snprintf(nbuf, sizeof(nbuf), "%d", world);
    char *argv[20] = {rekindle, "run", "-n", nbuf, "--"};
    size_t n = world ? 5 : 0;
    argv[n++] = bin;
    for (size_t i = 0; args[i] && n < 19; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    clear_rk_env();
    int rc = th_run(argv, env, JOB_TIMEOUT_S, out);
    free(bin);
    free(rekindle);
    return rc;
}

#define TRAIN(world, env, out, ...) train(world, env, out, (const char *const[]){__VA_ARGS__, NULL})

static int step_lines(const char *out)
{
    int n = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += strncmp(p, "step ", 5) == 0;
    return n;
}

/* ---- several ranks ---------------------------------------------------------------------- */

/* Same world size and arguments: the same bits, on every rank; only rank 0 prints steps. */
START_TEST(two_ranks_reproducible)
{
    char *a = NULL, *b = NULL, ha[17], hb[17];
    th_assert_rc(TRAIN(2, NULL, &a, "--steps", "30", "--seed", "5"), 0);
    th_assert_rc(TRAIN(2, NULL, &b, "--steps", "30", "--seed", "5"), 0);
    th_final_lines(a, 2, 30, ha);
    th_final_lines(b, 2, 30, hb);
    ck_assert_str_eq(ha, hb);
    ck_assert_int_eq(step_lines(a), 30);
    ck_assert_ptr_nonnull(strstr(a, "step 29 loss "));
    ck_assert_ptr_nonnull(strstr(a, " world 2\n"));
    free(a);
    free(b);
}
END_TEST

/* The global batch is split unevenly over 3 ranks (64 = 21 + 21 + 22) and still learns. */
START_TEST(three_ranks_learn)
{
    char *out = NULL, h[17];
    th_assert_rc(TRAIN(3, NULL, &out, "--steps", "200"), 0);
    th_final_lines(out, 3, 200, h);
    double first = -1, last = -1;
    const char *p = strstr(out, "step 0 loss "), *q = strstr(out, "step 199 loss ");
    ck_assert_msg(p && q, "missing step lines:\n%.400s", out);
    sscanf(p, "step 0 loss %lf", &first);
    sscanf(q, "step 199 loss %lf", &last);
    ck_assert_msg(last < first / 4, "loss did not go down on 3 ranks: %g -> %g", first, last);
    free(out);
}
END_TEST

/* ---- resume from a checkpoint ------------------------------------------------------------ */

/* 20 steps with checkpoints every 10, then the same command for 30 steps resumes at 20
   and ends with the bits of an uninterrupted 30-step run. */
static void resume_matches(int world)
{
    char *dir = th_tmpdir("train-ckpt"), *out = NULL, h_full[17], h_resumed[17];
    char env_dir[4200];
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env_dir, "RK_CKPT_EVERY=10", NULL};
    th_assert_rc(TRAIN(world, NULL, &out, "--steps", "30"), 0);
    th_final_lines(out, world ? world : 1, 30, h_full);
    free(out);
    th_assert_rc(TRAIN(world, env, &out, "--steps", "20"), 0);
    th_final_lines(out, world ? world : 1, 20, h_resumed);
    free(out);
    th_assert_rc(TRAIN(world, env, &out, "--steps", "30"), 0);
    ck_assert_msg(strstr(out, "step 19 ") == NULL && strstr(out, "step 20 loss "), "did not resume at step 20:\n%s",
                  out);
    th_final_lines(out, world ? world : 1, 30, h_resumed);
    ck_assert_str_eq(h_resumed, h_full);
    free(out);
    th_rmrf(dir);
    free(dir);
}

START_TEST(resume_single_process)
{
    resume_matches(0);
}
END_TEST

START_TEST(resume_two_ranks)
{
    resume_matches(2);
}
END_TEST

/* A worker SIGKILLed part-way through a 3-worker job with checkpoints, launched with
   --max-restarts 2: the job ends with exit 0 and every remaining worker's final line for
   step 3000. If it ends on 3 workers (survivors failed, the job was relaunched and
   resumed from disk), the hash is that of an uninterrupted 3-worker run; a job that
   shrank instead ends on fewer workers, whose sums differ in order. */
START_TEST(killed_worker_job_finishes)
{
    char *dir = th_tmpdir("train-kill"), *out = NULL, h_full[17], h_job[17];
    th_assert_rc(TRAIN(3, NULL, &out, "--steps", "3000", "--seed", "4242"), 0);
    th_final_lines(out, 3, 3000, h_full);
    free(out);

    char *rekindle = th_bin("rekindle"), *bin = th_bin("rk-train"), env_dir[4200], log[4300];
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s", dir);
    snprintf(log, sizeof(log), "%s/job.log", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        clear_rk_env();
        putenv(env_dir);
        putenv("RK_CKPT_EVERY=100");
        putenv("RK_TIMEOUT_MS=3000");
        if (!freopen(log, "w", stdout))
            _exit(126);
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execl(rekindle, rekindle, "run", "-n", "3", "--max-restarts", "2", "--", bin, "--steps", "3000", "--seed",
              "4242", (char *)NULL);
        _exit(127);
    }
    /* Once a checkpoint is committed, kill the second rk-train process found. */
    char pattern[4200], *pg = NULL;
    snprintf(pattern, sizeof(pattern), "^%s --steps 3000 --seed 4242$", bin);
    char *pgrep[] = {"pgrep", "-f", "--", pattern, NULL};
    long victim = 0;
    const int scale = th_time_scale();
    for (int i = 0; i < 600 * scale && victim == 0; i++) {
        char probe[4300];
        snprintf(probe, sizeof(probe), "%s/step-000000000100", dir);
        if (access(probe, F_OK) == 0 && th_run(pgrep, NULL, 10, &pg) == 0) {
            char *second = strchr(pg, '\n');
            victim = second && second[1] ? atol(second + 1) : 0;
        }
        free(pg);
        pg = NULL;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (victim > 0)
        kill((pid_t)victim, SIGKILL);
    int status = 0, waited = 0;
    for (; waited < 1200 * scale && waitpid(pid, &status, WNOHANG) == 0; waited++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (waited == 1200 * scale) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    out = th_read_file(log, NULL);
    ck_assert_msg(victim > 0, "no worker to kill was found; job log:\n%s", out ? out : "");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "job status %#x; log tail:\n%s", status,
                  out && strlen(out) > 3000 ? out + strlen(out) - 3000 : out);
    const char *f = strstr(out, "final step=3000 world=");
    ck_assert_msg(f != NULL, "no final line");
    int world = atoi(f + strlen("final step=3000 world="));
    th_final_lines(out, world, 3000, h_job);
    if (world == 3) {
        ck_assert_msg(strstr(out, "relaunching, restart 1 of 2") != NULL, "3 workers at the end but no relaunch");
        ck_assert_str_eq(h_job, h_full);
    }
    free(out);
    free(rekindle);
    free(bin);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Elastic `rekindle run --host-discovery-script` (docs/LAUNCHER.md): the discovery script
   lists a third slot while 2 workers train; the job grows at its next checkpoint to 3 and
   ends with the bits of a replay whose world changes at the step it resumed at. */
START_TEST(discovery_grows_job)
{
    char *w = th_tmpdir("train-grow"), *out = NULL;
    clear_rk_env();
    int rc = th_train_elastic(w, 3000, "--seed 5 --hidden 32", TH_GROW, 0, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, "growing to 3 at the next checkpoint") &&
                      strstr(out, "launching again to grow"),
                  "rc %d:\n%s", rc, out);
    th_job_equals_replay(out, 3, 3000);
    th_rmrf(w);
    free(w);
}
END_TEST

/* The same growth in place (the default): a worker started on the slot that appeared
   joins the two while they train (recover/join_proto.c J16), from their memory, none
   restarted, no relaunch; the bits of a replay on 2 workers up to the step it was brought
   in at, then 3. */
START_TEST(discovery_grows_in_place)
{
    char *w = th_tmpdir("train-grow-ip"), *out = NULL;
    clear_rk_env();
    int rc = th_train_elastic(w, 3000, "--seed 5 --hidden 32", TH_GROW, 1, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, "growing in place to 3, 1 worker(s) started on") &&
                      strstr(out, "grown in place to 3 workers") && !strstr(out, "launching again"),
                  "rc %d:\n%s", rc, out);
    th_job_equals_replay(out, 3, 3000);
    th_rmrf(w);
    free(w);
}
END_TEST

/* Two slots listed at once (the hosts file says 4 where it said 2): the launcher asks for
   both workers in one grow file, and the members start them in one join (one spawn, one
   merge, recover/join_proto.c J20) rather than one after the other; both are brought in by
   one decision from the members' memory. The job ends at 4 with the bits of a replay on 2
   then 4 workers. */
START_TEST(discovery_grows_two_in_one_join)
{
    char *w = th_tmpdir("train-grow-two"), *out = NULL;
    clear_rk_env();
    int rc = th_train_elastic(w, 3000, "--seed 5 --hidden 32", TH_GROW_TWO, 1, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, "growing in place to 4, 2 worker(s) started on") &&
                      strstr(out, "grown in place to 4 workers") && !strstr(out, "launching again") &&
                      strstr(out, "joins of 2: 2\n") && strstr(out, "joins of 1: 0\n"),
                  "rc %d:\n%s", rc, th_tail(out, 3000));
    th_job_equals_replay(out, 4, 3000);
    th_rmrf(w);
    free(w);
}
END_TEST

/* The first worker started to grow in place ends before its MPI_Init (its program exits
   at once): the members' spawn would never return. They give the join up as soon as its
   wrapper recorded the end (recover/join_proto.c J18), long before the join's own bound
   (2 x RK_TIMEOUT_MS, 60 s here), say why, and go on at 2; the launcher says the newcomer
   ended before it joined. The job ends at 2 with the bits of a replay on 2. */
START_TEST(newcomer_ended_before_merge_given_up)
{
    char *w = th_tmpdir("train-grow-dead"), *out = NULL, *cmd = NULL;
    char *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle");
    clear_rk_env();
    /* the program: rk-train, but the first newcomer (slot 2) exits before anything */
    char prog[4096], text[8192];
    snprintf(prog, sizeof(prog), "%s/prog", w);
    int len = snprintf(text, sizeof(text), "#!/bin/sh\n[ \"${RK_RUN_SLOT:-}\" = 2 ] && exit 7\nexec %s \"$@\"\n", bin);
    ck_assert_int_eq(th_write_file(prog, text, (size_t)len), 0);
    ck_assert_int_eq(chmod(prog, 0700), 0);
    ck_assert_int_ge(asprintf(&cmd,
        "W=%s; B=%s; R=%s; A='--seed 8 --hidden 32'; H=$(hostname)\n"
        "echo \"$H:2\" > $W/hosts\n"
        "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_TIMEOUT_MS=30000 RK_RUN_DIR=$W/run\n"
        "$R run --host-discovery-script \"cat $W/hosts\" --discovery-interval 0.2 --max-np 3 -- $W/prog --steps 6000 $A "
        "> $W/out 2> $W/err & job=$!\n"
        "for i in $(seq 1200); do [ -d $W/c/step-000000000100 ] && break; sleep 0.05; done\n"
        "echo \"$H:3\" > $W/hosts; touch $W/run/grow 2>/dev/null\n"
        "wait $job; echo \"exit=$?\"\n"
        "grep '^final' $W/out; grep 'rekindle: run\\|given up' $W/err\n"
        "echo replay; mkdir -p $W/r; RK_CKPT_DIR=$W/r RK_RUN_DIR= $R run -n 2 -- $B --steps 6000 $A 2>/dev/null | "
        "grep '^final'\n",
        w, bin, rekindle), 0);
    int rc = th_sh(cmd, 50, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, "growing in place to 3") &&
                      strstr(out, "ended before it joined") &&
                      strstr(out, "the newcomer ended before its spawn and merge returned") &&
                      strstr(out, "napping 10 ms a turn of Open MPI's progress") &&
                      !strstr(out, "launching again"),
                  "rc %d:\n%s", rc, out);
    th_job_equals_replay(out, 2, 6000);
    free(cmd);
    free(bin);
    free(rekindle);
    th_rmrf(w);
    free(w);
}
END_TEST

/* A worker of 3 killed: the other 2 go on in place (from memory); its host (this one)
   cools down for 0.5 s, then its slot counts again and the job grows back to 3 at its next
   checkpoint: the bits of a replay on 3, then 2, then 3 workers. The run is long enough
   (6000 steps, ~1 ms each on an idle machine) for the growth to come well before its end.
   (With a cool-down of 2 s and 4000 steps the job once ended first, at world 2, during a
   full make check.) */
START_TEST(lost_worker_grown_back)
{
    clear_rk_env();
    th_elastic_grows_back(TH_LOSE_WORKER, true, "--seed 6 --hidden 32", "lost worker 1: no growth onto it");
}
END_TEST

/* Whether a probe run fails because a part is not built: its output says so. */
static bool part_missing(int world, const char *const env[], const char *what)
{
    char *out = NULL;
    int rc = TRAIN(world, env, &out, "--steps", "2");
    bool missing = rc != 0 && out && strstr(out, rk_strerror(RK_E_NOTAVAIL));
    if (missing)
        printf("SKIP: %s: %s\n", what, rk_strerror(RK_E_NOTAVAIL));
    else if (rc != 0)
        printf("probe for %s failed (exit %d): the cases below will say why\n%s\n", what, rc, out ? out : "");
    free(out);
    return missing;
}

/* Spares (rekindle run --spares 1): a worker SIGKILLed once a checkpoint is committed is
   replaced by the spare, the world stays 3, and since the reduction order of a 3-member
   ring is the same the final hash is that of an uninterrupted 3-worker run; with no loss
   the spare is released and the job still ends with 3 final lines and exit 0. */
static void spare_job(bool kill_one, const char *args, char **out)
{
    char *dir = th_tmpdir("train-spare");
    char all[256];
    snprintf(all, sizeof(all), "--seed 77 %s", args);
    th_train_spare(dir, 800, all, kill_one, 150, out);
    th_rmrf(dir);
    free(dir);
}

START_TEST(spare_replaces_killed_worker)
{
    char *out = NULL, h_full[17], h_job[17];
    th_assert_rc(TRAIN(3, NULL, &out, "--steps", "800", "--seed", "77"), 0);
    th_final_lines(out, 3, 800, h_full);
    free(out);
    spare_job(true, "", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "\"spare_joined\""), "no spare joined:\n%.3000s", out);
    th_final_lines(strstr(out, "exit=0\n"), 3, 800, h_job);
    ck_assert_str_eq(h_job, h_full);
    free(out);
}
END_TEST

/* The same with --zero (sharded Adam moments, per-rank RNG): the spare registers its
   tensors before it has a slice, receives its slice and the lost rank's per-rank state
   with the rollback (memory or disk), rebinds, and the job ends with the hash of an
   uninterrupted 3-worker run. (Before: the spare's sharded registration was refused, and
   so was every recovery that brought it in.) */
START_TEST(spare_takes_sharded_state)
{
    char *out = NULL, h_full[17], h_job[17];
    th_assert_rc(TRAIN(3, NULL, &out, "--steps", "800", "--seed", "77", "--zero"), 0);
    th_final_lines(out, 3, 800, h_full);
    free(out);
    spare_job(true, "--zero", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "\"spare_joined\""), "no spare joined:\n%.3000s", out);
    th_final_lines(strstr(out, "exit=0\n"), 3, 800, h_job);
    ck_assert_str_eq(h_job, h_full);
    free(out);
}
END_TEST

START_TEST(unused_spare_released)
{
    char *out = NULL, h[17];
    spare_job(false, "", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "spare worker not needed"), "%.3000s", out);
    th_final_lines(strstr(out, "exit=0\n"), 3, 800, h);
    free(out);
}
END_TEST

/* ---- --zero: sharded Adam moments, per-rank RNG ------------------------------------------ */

/* One of 4 `rk-train --zero` workers SIGKILLed in its 91st rk_allreduce (two a step: the
   gradients', then the parameters' allgather; so in step 45's gradients): the 3
   survivors rebuild the lost slices from their partners' memory (every survivor's event
   `resumed` says memory) at most one step back (a snapshot at every step: steps_lost
   <= 1), and end with the hash of a fault-free replay on 3 workers from the state of the
   step they resumed at. A kill that lands inside the partner copy of the newest snapshot
   leaves it without one: the generation before it is resumed then (ckpt/snapshot.h S6). */
START_TEST(zero_killed_worker_rebuilds_from_memory)
{
    char *w = th_tmpdir("train-zero"), *out = NULL;
    clear_rk_env();
    int rc = th_train_kill_replay(w, 4, 200, "--zero --seed 7",
                                  "RK_CKPT_EVERY=20 RK_TIMEOUT_MS=8000 RK_HEARTBEAT_MS=250", 91, 2 * JOB_TIMEOUT_S,
                                  &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    bool memory = th_count(out, "\"from\": \"memory\"") == 3 && !strstr(out, "\"from\": \"disk\"");
    ck_assert_msg(memory, "not every survivor resumed from memory:\n%s", out);
    ck_assert_msg(th_count(out, "\"steps_lost\": 0") + th_count(out, "\"steps_lost\": 1") == 3,
                  "a survivor lost more than one step:\n%s", out);
    th_job_equals_replay(out, 3, 200);
    th_rmrf(w);
    free(w);
}
END_TEST

/* The same kill with snapshots only at checkpoints (RK_SNAPSHOT_EVERY=0: one copy of the
   state held, ckpt/snapshot.h S13): the 3 survivors rebuild the lost slices from the
   partner copies of the last checkpoint's snapshot, in memory (step 40; the kill is in step
   45), and end with the hash of a fault-free replay on 3 workers from step 40. */
START_TEST(zero_checkpoints_only_rebuilds_from_memory)
{
    char *w = th_tmpdir("train-zero1"), *out = NULL;
    clear_rk_env();
    int rc = th_train_kill_replay(w, 4, 200, "--zero --seed 7",
                                  "RK_CKPT_EVERY=20 RK_SNAPSHOT_EVERY=0 RK_TIMEOUT_MS=8000 RK_HEARTBEAT_MS=250", 91,
                                  2 * JOB_TIMEOUT_S, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    bool memory = th_count(out, "\"from\": \"memory\"") == 3 && !strstr(out, "\"from\": \"disk\"");
    ck_assert_msg(memory, "not every survivor resumed from memory:\n%s", out);
    ck_assert_msg(th_count(out, "\"step\": 40") >= 3, "not resumed at the checkpoint of step 40:\n%s", out);
    th_job_equals_replay(out, 3, 200);
    th_rmrf(w);
    free(w);
}
END_TEST

/* One rank's checkpoint disk stops answering for good (RK_FAULT=open@3=hang on rank 3: its
   second checkpoint's shard): its later checkpoints are skipped, the others' fail, and
   training goes on to the end. The --zero final hash is a collective: rk-train takes it
   before rk_wait, which on the stuck rank waits RK_TIMEOUT_MS for the disk, so the others'
   allgather does not give up on it (before: every rank failed "the final hash's
   allgather: a deadline passed" and the job was relaunched). */
START_TEST(zero_stuck_disk_finishes)
{
    char *w = th_tmpdir("train-stuck"), *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle"), *out = NULL;
    const char *src = getenv("RK_TEST_SRC");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "W=%s; export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=10 RK_KEEP=100 RK_TIMEOUT_MS=3000\n"
             "RK_FAULT=open@3=hang CHAOS_FAULT_RANK=3 %s run -n 4 --max-restarts 0 -- %s/chaos/worker.sh %s "
             "--steps 40 --zero --seed 7 --hidden 32 > $W/out 2>&1; echo \"exit=$?\"; grep -E '^final|allgather' $W/out\n",
             w, rekindle, src ? src : ".", bin);
    clear_rk_env();
    int rc = th_sh(cmd, 2 * JOB_TIMEOUT_S, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    ck_assert_msg(th_count(out, "final step=40 world=4 ") == 4 && !strstr(out, "allgather"), "%s", out);
    th_rmrf(w);
    free(w);
    free(bin);
    free(rekindle);
    free(out);
}
END_TEST

/* Any collective may return RK_RECOVERED, the last one too: a member lost in the final
   hash's allgather of --zero (RK_FAULT=allreduce@61=crash on rank 2: 30 steps of two
   rk_allreduce calls each, then the allgathers of m, v and the RNGs) sends the survivors
   back to their loop at rk_next_step(); the job ends in place on 3 workers, with the hash
   of a 3-worker run from the checkpoint they resumed at. (Before: rk-train reported "the
   final hash's allgather: recovered" and exited 1 on every survivor.) */
START_TEST(zero_loss_in_final_allgather_finishes_in_place)
{
    char *w = th_tmpdir("train-final"), *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle"), *out = NULL;
    const char *src = getenv("RK_TEST_SRC");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "W=%s; B=%s; R=%s; A='--steps 30 --zero --seed 7 --hidden 32'\n"
             "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=10 RK_KEEP=100 RK_EVENT_LOG=$W/ev RK_TIMEOUT_MS=8000\n"
             "RK_FAULT=allreduce@61=crash CHAOS_FAULT_RANK=2 $R run -n 4 -- %s/chaos/worker.sh $B $A > $W/out 2>&1\n"
             "echo \"exit=$?\"; grep -E '^final|relaunch|rk-train:' $W/out\n"
             "s=$(grep -h '\"resumed\"' $W/ev.* | head -1 | sed 's/.*\"step\": \\([0-9]*\\).*/\\1/')\n"
             "echo \"resumed=$s\"; d=step-$(printf %%012d \"$s\"); mkdir -p $W/r; cp -r $W/c/$d $W/r/ || exit 1\n"
             "echo replay; RK_CKPT_DIR=$W/r RK_EVENT_LOG= $R run -n 3 -- $B $A | grep '^final'\n",
             w, bin, rekindle, src ? src : ".");
    clear_rk_env();
    int rc = th_sh(cmd, 2 * JOB_TIMEOUT_S, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    ck_assert_msg(!strstr(out, "relaunch") && !strstr(out, "rk-train:"), "the survivors failed:\n%s", out);
    ck_assert_msg(strstr(out, "resumed=30\n"), "the survivors did not resume at step 30:\n%s", out);
    th_job_equals_replay(out, 3, 30);
    th_rmrf(w);
    free(w);
    free(bin);
    free(rekindle);
}
END_TEST

/* The largest `hwm=` of the `memory` lines of rk-train --mem; *params: that rank's P. */
static long long max_hwm(const char *out, long long *params)
{
    long long worst = -1, hwm, p;
    for (const char *q = out; (q = strstr(q, "memory rank=")); q++)
        if (sscanf(q, "memory rank=%*d hwm=%lld rss=%*d params=%lld", &hwm, &p) == 2 && hwm > worst) {
            worst = hwm;
            *params = p / 4;
        }
    return worst;
}

/* `--zero --mem` on 4 workers: a rank's peak resident set over the runtime's (the same job at
   --hidden 1) stays under 30 bytes per parameter: parameters and gradients (8), its slices
   of m and v (8/4), the library's two generations of the snapshot (2 x (4 + 8/4),
   ckpt/snapshot.h S6) and of the partner copy (2 x 8/4), about 27 with the rest of the
   library's buffers.
   Full-size m and v (8 bytes per parameter of which only the slice is used, and
   snapshotted twice) put it above 33. */
START_TEST(zero_moments_are_slices)
{
    char *w = th_tmpdir("train-zero-mem"), env_dir[4200], *out = NULL;
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s/c", w);
    const char *env[] = {env_dir, "RK_CKPT_EVERY=2", "RK_TIMEOUT_MS=60000", "RK_HEARTBEAT_MS=500", NULL};
    long long p0 = 0, p = 0;
    th_assert_rc(TRAIN(4, env, &out, "--steps", "4", "--hidden", "1", "--batch", "8", "--zero", "--mem"), 0);
    long long base = max_hwm(out, &p0);
    free(out);
    th_rmrf(w);
    free(w);
    w = th_tmpdir("train-zero-mem");
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s/c", w);
    th_assert_rc(TRAIN(4, env, &out, "--steps", "4", "--hidden", "2048", "--batch", "8", "--zero", "--mem"), 0);
    long long hwm = max_hwm(out, &p);
    ck_assert_msg(base > 0 && hwm > 0 && p > 1000000, "no memory lines:\n%s", out);
    /* ThreadSanitizer backs every touched byte with several bytes of shadow memory, so under
       it the resident set says nothing about the layout: the job still has to run. */
    const char *tsan = getenv("RK_TEST_TSAN");
    if (tsan && strcmp(tsan, "1") == 0)
        fprintf(stderr, "zero_moments_are_slices: under TSan %.1f bytes per parameter, not checked\n",
                (double)(hwm - base) / (double)p);
    else
        ck_assert_msg(hwm - base < 30 * p, "peak %lld - runtime %lld = %.1f bytes per parameter (P = %lld), want < 30",
                      hwm, base, (double)(hwm - base) / (double)p, p);
    free(out);
    th_rmrf(w);
    free(w);
}
END_TEST

int main(void)
{
    char *dir = th_tmpdir("train-probe");
    char env_dir[4200];
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s", dir ? dir : "/nonexistent");
    const char *env[] = {env_dir, NULL};
    bool no_ring = part_missing(2, NULL, "multi-rank cases (the allreduce ring)");
    bool no_ckpt = part_missing(0, env, "resume cases (the checkpoint engine)");
    th_rmrf(dir);
    free(dir);
    if (no_ring && no_ckpt)
        th_skip_suite("rk-train beyond one process: the allreduce ring and the checkpoint engine are not built yet");

    Suite *s = suite_create("train_mpi");
    if (!no_ring) {
        TCase *tc = tcase_create("ranks");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, two_ranks_reproducible);
        tcase_add_test(tc, three_ranks_learn);
        suite_add_tcase(s, tc);
    }
    if (!no_ckpt && !no_ring) {
        TCase *tc = tcase_create("zero");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, zero_killed_worker_rebuilds_from_memory);
        tcase_add_test(tc, zero_checkpoints_only_rebuilds_from_memory);
        tcase_add_test(tc, zero_moments_are_slices);
        tcase_add_test(tc, zero_loss_in_final_allgather_finishes_in_place);
        tcase_add_test(tc, zero_stuck_disk_finishes);
        suite_add_tcase(s, tc);
        TCase *te = tcase_create("elastic");
        tcase_set_timeout(te, 300);
        tcase_add_test(te, discovery_grows_job);
        tcase_add_test(te, discovery_grows_in_place);
        tcase_add_test(te, discovery_grows_two_in_one_join);
        tcase_add_test(te, newcomer_ended_before_merge_given_up);
        tcase_add_test(te, lost_worker_grown_back);
        suite_add_tcase(s, te);
    }
    if (!no_ckpt) {
        TCase *tc = tcase_create("resume");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, resume_single_process);
        if (!no_ring) {
            tcase_add_test(tc, resume_two_ranks);
            tcase_add_test(tc, killed_worker_job_finishes);
            tcase_add_test(tc, spare_replaces_killed_worker);
            tcase_add_test(tc, unused_spare_released);
            tcase_add_test(tc, spare_takes_sharded_state);
        }
        suite_add_tcase(s, tc);
    }
    return th_main(s);
}
