/*
 * tests/test_train_cuda.c - rk-train --device cuda on a GPU (docs/RK-TRAIN.md): the same
 * output lines as --device cpu, bit for bit, for several shapes; a checkpoint taken from the
 * device and resumed into it continues with the bits of an uninterrupted run; two ranks on
 * the device agree with two ranks on the host; of three ranks on the device one is killed:
 * the survivors roll back from memory and end with the bits of a fault-free replay, or a
 * spare takes its place and the job ends with the bits of an uninterrupted run. A program
 * written from the header alone (tests/prog_user_cuda.c: a device tensor registered, a
 * device buffer through rk_allreduce) survives a killed rank of three. A job of three
 * grows in place onto a spare, the device ring rebuilt over four. Needs a CUDA GPU: without one the suite is
 * skipped (exit 77, reported SKIP); scripts/gpu-check runs it where there is one. The same
 * passes run on the host in every build: tests/test_train.c, cuda_passes_give_the_cpu_bits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rekindle.h"

#define TRAIN_TIMEOUT_S 120

static int train(int ranks, const char *const env[], char **out, const char *device, const char *const args[])
{
    char *bin = th_bin("rk-train");
    char *argv[20] = {bin, "--device", (char *)device};
    size_t n = 3;
    for (size_t k = 0; args[k] && n < 19; k++)
        argv[n++] = (char *)args[k];
    argv[n] = NULL;
    unsetenv("RK_CKPT_DIR");
    int rc = ranks == 1 ? th_run(argv, env, TRAIN_TIMEOUT_S, out)
                        : th_mpirun(ranks, argv, env, TRAIN_TIMEOUT_S, out);
    free(bin);
    return rc;
}

/* The final line ("final step=N world=W hash=H") of out, for comparing runs. */
static char *final_line(const char *out)
{
    const char *f = strstr(out, "final step=");
    ck_assert_msg(f != NULL, "no final line in:\n%s", out);
    return strndup(f, strcspn(f, "\n"));
}

/* The trainer's own lines ("step ...", "final ..."): what must be the same bit for bit. A
   library's banner on stderr is not (NCCL_DEBUG=WARN makes NCCL print its version in the
   CUDA run alone). */
static char *trainer_lines(const char *out)
{
    size_t n = strlen(out), k = 0;
    char *t = malloc(n + 1);
    for (const char *p = out; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
        if (strncmp(p, "step ", 5) == 0 || strncmp(p, "final ", 6) == 0) {
            memcpy(t + k, p, len);
            k += len;
        }
        p += len;
    }
    t[k] = '\0';
    return t;
}

static const char *const shapes[][10] = {
    {"--steps", "30", NULL},
    {"--steps", "20", "--hidden", "512", "--layers", "4", "--batch", "3000", "--seed", "7"},
    {"--steps", "5", "--hidden", "1", "--layers", "1", "--batch", "1", NULL},
    {"--steps", "10", "--hidden", "4096", "--layers", "2", "--batch", "64", NULL},
};

START_TEST(same_lines_as_cpu)
{
    char *cpu = NULL, *cuda = NULL;
    th_assert_rc(train(1, NULL, &cpu, "cpu", shapes[_i]), 0);
    int rc = train(1, NULL, &cuda, "cuda", shapes[_i]);
    ck_assert_msg(rc == 0, "--device cuda exit %d:\n%s", rc, cuda);
    char *a = trainer_lines(cpu), *b = trainer_lines(cuda);
    ck_assert_msg(strstr(a, "final step="), "no final line:\n%s", cpu);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    free(cpu);
    free(cuda);
}
END_TEST

/* 12 steps with checkpoints (snapshots copied from the device), then a second run resumes
   from the last one into the device and goes on to 25: the bits of 25 steps in one run. */
START_TEST(resume_from_device_checkpoint)
{
    char *dir = th_tmpdir("train_cuda_ckpt"), env0[512], *a = NULL, *b = NULL, *c = NULL;
    snprintf(env0, sizeof(env0), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env0, "RK_CKPT_EVERY=4", NULL};
    th_assert_rc(train(1, env, &a, "cuda", (const char *const[]){"--steps", "12", NULL}), 0);
    int rc = train(1, env, &b, "cuda", (const char *const[]){"--steps", "25", NULL});
    ck_assert_msg(rc == 0, "resume exit %d:\n%s", rc, b);
    th_assert_rc(train(1, NULL, &c, "cuda", (const char *const[]){"--steps", "25", NULL}), 0);
    char *fb = final_line(b), *fc = final_line(c);
    ck_assert_str_eq(fb, fc);
    free(fb);
    free(fc);
    free(a);
    free(b);
    free(c);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Two ranks sharing the device (the allreduce of device gradients): the final lines agree
   with two ranks on the host (a sum of two is the same in either order). */
START_TEST(two_ranks_same_as_cpu)
{
    char *cpu = NULL, *cuda = NULL;
    const char *const args[] = {"--steps", "15", "--hidden", "48", NULL};
    th_assert_rc(train(2, NULL, &cpu, "cpu", args), 0);
    int rc = train(2, NULL, &cuda, "cuda", args); /* the library gives each rank its NCCL_HOSTID */
    ck_assert_msg(rc == 0, "--device cuda on 2 ranks exit %d:\n%s", rc, cuda);
    char *fa = final_line(cpu), *fb = final_line(cuda);
    ck_assert_str_eq(fa, fb);
    free(fa);
    free(fb);
    free(cpu);
    free(cuda);
}
END_TEST

/* The model is large enough (hidden 512, 4 layers: ~3 MiB of gradients a step through
   NCCL) that checkpoint 50 is committed well before the end of the run. */
#define BIG "--device cuda --hidden 512 --layers 4"

/* Three ranks on the device, one SIGKILLed in its 101st rk_allreduce (one a step: in step
   100, after checkpoint 50): the two
   survivors roll their device tensors back from their memory (a snapshot at every step:
   at most one step lost), go on with a ring of two, and end with the bits of a fault-free
   replay on two ranks from the state of the step they resumed at. */
START_TEST(killed_rank_equals_replay)
{
    char *w = th_tmpdir("train_cuda_kill"), *out = NULL;
    unsetenv("RK_CKPT_DIR");
    int rc = th_train_kill_replay(w, 3, 1500, "--seed 5 " BIG, "RK_CKPT_EVERY=50 RK_TIMEOUT_MS=8000", 101, 280, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    ck_assert_msg(th_count(out, "\"from\": \"memory\"") == 2, "the survivors did not both resume from memory:\n%s",
                  out);
    ck_assert_msg(th_count(out, "\"steps_lost\": 0") + th_count(out, "\"steps_lost\": 1") == 2,
                  "a survivor lost more than one step:\n%s", out);
    th_job_equals_replay(out, 2, 1500);
    th_rmrf(w);
    free(w);
}
END_TEST

/* rekindle run --spares 1: rank 1 SIGKILLed once checkpoint 100 is committed; the spare
   takes its place on the device (the state from the survivors), the ring is three again,
   and the job ends with the bits of an uninterrupted three-rank run. */
START_TEST(spare_replaces_killed_rank)
{
    char *w = th_tmpdir("train_cuda_spare"), *full = NULL, *out = NULL, h_full[17], h_job[17];
    th_assert_rc(train(3, NULL, &full, "cuda",
                       (const char *const[]){"--steps", "1500", "--seed", "77", "--hidden", "512", "--layers", "4",
                                             NULL}),
                 0);
    th_final_lines(full, 3, 1500, h_full);
    unsetenv("RK_CKPT_DIR");
    th_train_spare(w, 1500, "--seed 77 " BIG, true, 280, &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "\"spare_joined\""), "no spare joined:\n%.3000s", out);
    th_final_lines(strstr(out, "exit=0\n"), 3, 1500, h_job);
    ck_assert_str_eq(h_job, h_full);
    free(full);
    free(out);
    th_rmrf(w);
    free(w);
}
END_TEST

/* rekindle run -n 3 --spares 1, asked to grow once rank 0 trains: the three keep their
   processes, the spare joins in place, and every member (the spare too) takes a fresh NCCL
   communicator over the grown ring at its first device allreduce (ring_nccl_plan: FRESH).
   The state comes from memory with no step lost, and the job's bits are those of a replay
   on 3 workers up to the step the grown ring resumed at, then on 4. */
START_TEST(grows_in_place_on_the_device)
{
    char *w = th_tmpdir("train_cuda_grow"), *rekindle = th_bin("rekindle"), *bin = th_bin("rk-train");
    char *cmd = NULL, *out = NULL;
    unsetenv("RK_CKPT_DIR");
    ck_assert(asprintf(&cmd,
                       "W=%s; R=%s; B=%s; A='--seed 5 " BIG "'; N=3000\n"
                       "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG=$W/ev "
                       "RK_RUN_DIR=$W/run RK_TIMEOUT_MS=8000\n"
                       "$R run -n 3 --spares 1 -- $B --steps $N $A > $W/out 2>&1 & job=$!\n"
                       "for i in $(seq 6000); do grep -qs '^step ' $W/out && break; sleep 0.01; done\n"
                       "echo 1 > $W/run/grow; wait $job; echo \"exit=$?\"\n"
                       "grep -v '^step ' $W/out; grep -h '\"resumed\"' $W/ev.*\n"
                       "export RK_EVENT_LOG= RK_RUN_DIR=\n"
                       "s=$(grep -h '\"resumed\"' $W/ev.* | grep '\"world\": 4' | head -1 | "
                       "sed 's/.*\"step\": \\([0-9]*\\).*/\\1/')\n"
                       "[ -n \"$s\" ] || exit 0; mkdir -p $W/r\n"
                       "RK_CKPT_DIR=$W/r RK_CKPT_EVERY=$s $R run -n 3 -- $B --steps $s $A > /dev/null 2>&1 || exit 1\n"
                       "echo replay; RK_CKPT_DIR=$W/r $R run -n 4 -- $B --steps $N $A 2>&1 | grep -v '^step '\n",
                       w, rekindle, bin) > 0);
    th_assert_rc(th_sh(cmd, 280, &out), 0);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "grown in place to 4 workers"), "not grown:\n%.3000s", out);
    ck_assert_msg(strstr(out, "\"from\": \"memory\", \"epoch\": 2, \"world\": 4, \"steps_lost\": 0"),
                  "no resume from memory at world 4 with no step lost:\n%.3000s", out);
    th_job_equals_replay(out, 4, 3000);
    th_rmrf(w);
    free(w);
    free(rekindle);
    free(bin);
    free(cmd);
}
END_TEST

/* The same growth onto a worker started while the job trains (recover/join.c: spawned,
   merged, welcomed): an elastic `rekindle run` on 2 slots of this host, listed with 3 once
   checkpoint 100 is committed. The two keep their processes; the newcomer's ring is on the
   merged communicator, and at the grown epoch's first device allreduce every member takes
   a fresh NCCL communicator over it (the same FRESH way as a spare's). The job's bits are
   those of a replay on 2 workers up to the step the grown ring resumed at, then on 3. */
START_TEST(grows_onto_a_started_worker_on_the_device)
{
    char *w = th_tmpdir("train_cuda_join"), *out = NULL;
    unsetenv("RK_CKPT_DIR");
    int rc = th_train_elastic(w, 3000, "--seed 5 " BIG, TH_GROW, 1, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, "growing in place to 3, 1 worker(s) started on") &&
                      strstr(out, "grown in place to 3 workers") && !strstr(out, "launching again"),
                  "rc %d:\n%s", rc, th_tail(out, 3000));
    th_job_equals_replay(out, 3, 3000);
    th_rmrf(w);
    free(w);
}
END_TEST

/* A user's program (tests/prog_user_cuda.c) on 3 ranks under `rekindle run`, rank 1 killed
   before its allreduce of step 60: both survivors check every sum and the device weights
   they got back, and end with the same weights, having recovered once. */
START_TEST(user_program_survives_a_kill)
{
    char *w = th_tmpdir("train_cuda_user"), *rekindle = th_bin("rekindle"), *prog = th_prog("prog_user_cuda");
    char *cmd = NULL, *out = NULL;
    ck_assert(asprintf(&cmd,
                       "export RK_CKPT_DIR=%s/c RK_CKPT_EVERY=25 RK_EVENT_LOG=%s/ev RK_TIMEOUT_MS=8000; "
                       "%s run -n 3 -- %s 120 60 > %s/out 2>&1; echo \"exit=$?\"; cat %s/out",
                       w, w, rekindle, prog, w, w) > 0);
    th_assert_rc(th_sh(cmd, TRAIN_TIMEOUT_S, &out), 0);
    ck_assert_msg(strstr(out, "exit=0\n") && !strstr(out, "FAIL"), "the job:\n%s", out);
    ck_assert_msg(th_count(out, "final rank=") == 2 && th_count(out, " world=2 steps=120 ") == 2 &&
                      th_count(out, " recovered=1\n") == 2,
                  "not two survivors at world 2 that recovered once:\n%s", out);
    const char *f1 = strstr(out, "final rank="), *f2 = strstr(f1 + 1, "final rank=");
    const char *a = strstr(f1, " w="), *b = strstr(f2, " w=");
    ck_assert_msg(a && b && strncmp(a, b, strcspn(a + 1, " \n") + 1) == 0, "the survivors' weights differ:\n%s", out);
    th_rmrf(w);
    free(w);
    free(rekindle);
    free(prog);
    free(cmd);
    free(out);
}
END_TEST

int main(void)
{
    char why[160];
    if (!th_have_gpu(why, sizeof(why)))
        th_skip_suite(why);
    Suite *s = suite_create("train_cuda");
    TCase *tc = tcase_create("device");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, same_lines_as_cpu, 0, (int)(sizeof(shapes) / sizeof(shapes[0])));
    tcase_add_test(tc, resume_from_device_checkpoint);
    tcase_add_test(tc, two_ranks_same_as_cpu);
    suite_add_tcase(s, tc);
    TCase *tk = tcase_create("kill");
    tcase_set_timeout(tk, 600);
    tcase_add_test(tk, killed_rank_equals_replay);
    tcase_add_test(tk, spare_replaces_killed_rank);
    tcase_add_test(tk, user_program_survives_a_kill);
    tcase_add_test(tk, grows_in_place_on_the_device);
    tcase_add_test(tk, grows_onto_a_started_worker_on_the_device);
    suite_add_tcase(s, tk);
    return th_main(s);
}
