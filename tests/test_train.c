/*
 * tests/test_train.c - the example trainer build/bin/rk-train as a single process
 * (contract section 6): the output format, bitwise reproducibility of a run, that the
 * hash depends on what it should, that training learns, --help, and exit status 2 with a
 * clear message for bad arguments, and --device: cpu is the default, the CUDA passes (run
 * on the host by build/tests/rk-train-emu) give the C loops' bits, a failing CUDA call is
 * named, no GPU is said. Multi-rank runs and resume: tests/test_train_mpi.c; on a GPU:
 * tests/test_train_cuda.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rekindle.h"

#define TRAIN_TIMEOUT_S 60

/* A clean RK_* environment: no checkpoints, nothing inherited from the caller. */
static void clear_rk_env(void)
{
    const char *vars[] = {"RK_CKPT_DIR", "RK_CKPT_EVERY", "RK_KEEP", "RK_EVENT_LOG", "RK_LOG", "RK_HEARTBEAT_MS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

/* Runs `prog` (under the build's bin/) with up to 10 arguments (NULL-terminated list),
   output into *out. */
static int prog_run(const char *prog, const char *const env[], char **out, const char *const args[])
{
    char *bin = th_bin(prog);
    char *argv[12] = {bin};
    size_t n = 1;
    for (; args[n - 1] && n < 11; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    clear_rk_env();
    int rc = th_run(argv, env, TRAIN_TIMEOUT_S, out);
    free(bin);
    return rc;
}

static int train_run(const char *const env[], char **out, const char *const args[])
{
    return prog_run("rk-train", env, out, args);
}

/* rk-train whose --device cuda runs the kernels of examples/rk-train-cuda.cu on the host
   (tests/cuda_emu.h), built into the build's tests/ by every build. */
#define EMU_TRAIN "../tests/rk-train-emu"

#define TRAIN(out, ...) train_run(NULL, out, (const char *const[]){__VA_ARGS__, NULL})

/* The 16 hex digits of the "final step=N world=W hash=H" line; asserts its form. */
static void final_hash(const char *out, int64_t want_step, char hash[17])
{
    const char *f = strstr(out, "final step=");
    ck_assert_msg(f != NULL, "no final line in:\n%s", out);
    long long step = -1;
    int world = -1, used = 0;
    ck_assert_msg(sscanf(f, "final step=%lld world=%d hash=%16[0-9a-f]%n", &step, &world, hash, &used) == 3,
                  "bad final line: %.80s", f);
    ck_assert_int_eq(step, want_step);
    ck_assert_int_eq(world, 1);
    ck_assert_int_eq(strlen(hash), 16);
    ck_assert_msg(f[used] == '\n', "final line goes on after the hash: %.80s", f);
}

/* Losses of the step lines, checking that they are "step S loss L world 1" for S = 0.. */
static int step_losses(const char *out, double *loss, int cap)
{
    int n = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, "step ", 5) != 0)
            continue;
        long long s = -1;
        int world = 0;
        double l = 0;
        ck_assert_msg(sscanf(p, "step %lld loss %lf world %d", &s, &l, &world) == 3, "bad step line %.60s", p);
        ck_assert_int_eq(s, n);
        ck_assert_int_eq(world, 1);
        ck_assert_msg(l >= 0 && l < 1e6, "loss %g out of range", l);
        if (n < cap)
            loss[n] = l;
        n++;
    }
    return n;
}

START_TEST(same_arguments_same_bits)
{
    char *a = NULL, *b = NULL, ha[17], hb[17];
    th_assert_rc(TRAIN(&a, "--steps", "40", "--hidden", "24", "--seed", "9"), 0);
    th_assert_rc(TRAIN(&b, "--steps", "40", "--hidden", "24", "--seed", "9"), 0);
    final_hash(a, 40, ha);
    final_hash(b, 40, hb);
    ck_assert_str_eq(ha, hb);
    ck_assert_str_eq(a, b); /* every printed loss too */
    free(a);
    free(b);
}
END_TEST

/* Each argument that changes the run changes the hash. */
static const char *const variants[][6] = {
    {"--seed", "2", NULL},
    {"--steps", "21", NULL},
    {"--hidden", "63", NULL},
    {"--layers", "2", NULL},
    {"--batch", "63", NULL},
};

START_TEST(hash_depends_on_arguments)
{
    char *base = NULL, *other = NULL, hb[17], ho[17];
    th_assert_rc(TRAIN(&base, "--steps", "20"), 0);
    final_hash(base, 20, hb);
    const char *const *v = variants[_i];
    int steps = strcmp(v[0], "--steps") == 0 ? 21 : 20;
    char sbuf[8];
    snprintf(sbuf, sizeof(sbuf), "%d", steps);
    th_assert_rc(TRAIN(&other, "--steps", sbuf, v[0], v[1]), 0);
    final_hash(other, steps, ho);
    ck_assert_msg(strcmp(hb, ho) != 0, "%s %s gives the same hash %s", v[0], v[1], hb);
    free(base);
    free(other);
}
END_TEST

/* Zero steps: nothing trained, the hash is that of the initial state, and stable. */
START_TEST(zero_steps)
{
    char *a = NULL, *b = NULL, ha[17], hb[17];
    th_assert_rc(TRAIN(&a, "--steps", "0"), 0);
    double loss[1];
    ck_assert_int_eq(step_losses(a, loss, 1), 0);
    final_hash(a, 0, ha);
    th_assert_rc(TRAIN(&b, "--steps", "1"), 0);
    final_hash(b, 1, hb);
    ck_assert_msg(strcmp(ha, hb) != 0, "one step does not change the state (%s)", ha);
    free(a);
    free(b);
}
END_TEST

/* Every step prints "step S loss L world 1" (S = 0..199), and the model learns: the mean
   loss of the last 20 of 200 steps is under a quarter of the first 20's. */
START_TEST(loss_goes_down)
{
    char *out = NULL, hash[17];
    th_assert_rc(TRAIN(&out, "--steps", "200"), 0);
    double loss[200];
    ck_assert_int_eq(step_losses(out, loss, 200), 200);
    final_hash(out, 200, hash);
    double first = 0, last = 0;
    for (int i = 0; i < 20; i++) {
        first += loss[i] / 20;
        last += loss[180 + i] / 20;
    }
    ck_assert_msg(last < first / 4, "loss did not go down: first 20 steps %g, last 20 %g", first, last);
    free(out);
}
END_TEST

/* The smallest model and batch work too (one layer, one unit, one sample). */
START_TEST(smallest_shapes)
{
    char *out = NULL, hash[17];
    th_assert_rc(TRAIN(&out, "--steps", "3", "--layers", "1", "--hidden", "1", "--batch", "1"), 0);
    final_hash(out, 3, hash);
    free(out);
}
END_TEST

START_TEST(help)
{
    char *out = NULL;
    th_assert_rc(TRAIN(&out, "--help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: rk-train --steps N"));
    ck_assert_ptr_nonnull(strstr(out, "rank 0 prints"));
    ck_assert_ptr_nonnull(strstr(out, "RK_CKPT_DIR"));
    free(out);
}
END_TEST

/* Bad arguments: exit 2 and a one-line message naming what is wrong. */
static const struct {
    const char *args[4];
    const char *says;
} bad_args[] = {
    {{NULL}, "--steps is required"},
    {{"--steps", NULL}, "--steps needs a value"},
    {{"--steps", "ten", NULL}, "--steps 'ten'"},
    {{"--steps", "-1", NULL}, "--steps '-1'"},
    {{"--steps", "5", "--hidden", "0"}, "--hidden '0'"},
    {{"--steps", "5", "--layers", "99"}, "--layers '99'"},
    {{"--steps", "5", "--batch", "1x"}, "--batch '1x'"},
    {{"--steps", "5", "--frobnicate", NULL}, "unknown argument '--frobnicate'"},
    {{"--steps", "5", "--device", "gpu"}, "--device 'gpu': want cpu or cuda"},
    {{"--steps", "5", "--device", NULL}, "--device needs a value"},
};

START_TEST(bad_arguments_exit_2)
{
    char *out = NULL;
    const char *const *a = bad_args[_i].args;
    const char *const args[] = {a[0], a[0] ? a[1] : NULL, a[0] && a[1] ? a[2] : NULL,
                                a[0] && a[1] && a[2] ? a[3] : NULL, NULL};
    th_assert_rc(train_run(NULL, &out, args), 2);
    ck_assert_msg(strstr(out, bad_args[_i].says) != NULL, "output does not say '%s':\n%s", bad_args[_i].says, out);
    ck_assert_msg(strncmp(out, "rk-train: ", 10) == 0, "message not prefixed: %s", out);
    free(out);
}
END_TEST

/* A failing Rekindle call: "rk-train: <what>: <rk_strerror>: <rk_last_error()>", exit 1. */
START_TEST(library_error_reported)
{
    char *out = NULL;
    const char *env[] = {"RK_HEARTBEAT_MS=abc", NULL};
    th_assert_rc(train_run(env, &out, (const char *const[]){"--steps", "3", NULL}), 1);
    char want[256];
    snprintf(want, sizeof(want), "rk-train: rk_init: %s: RK_HEARTBEAT_MS='abc'", rk_strerror(RK_E_OPTION));
    ck_assert_msg(strstr(out, want) != NULL, "output lacks '%s':\n%s", want, out);
    free(out);
}
END_TEST

/* ---- --device (docs/RK-TRAIN.md) ------------------------------------------------------ */

/* --device cpu is what runs without --device: the same bits. */
START_TEST(device_cpu_is_the_default)
{
    char *a = NULL, *b = NULL;
    th_assert_rc(TRAIN(&a, "--steps", "15", "--hidden", "20", "--seed", "4"), 0);
    th_assert_rc(TRAIN(&b, "--steps", "15", "--hidden", "20", "--seed", "4", "--device", "cpu"), 0);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
}
END_TEST

/* The CUDA passes (their indexing, their order of f32 operations), run on the host, print
   exactly the lines of the C loops: the step losses and the final hash. Shapes: the default,
   a batch over one chunk of 1024 samples, one layer of one unit, deeper than three layers. */
static const char *const device_variants[][10] = {
    {"--steps", "12", NULL},
    {"--steps", "6", "--hidden", "200", "--layers", "4", "--batch", "1100", "--seed", "7"},
    {"--steps", "4", "--hidden", "1", "--layers", "1", "--batch", "1", NULL},
    {"--steps", "5", "--layers", "6", "--hidden", "33", "--batch", "50", NULL},
};

START_TEST(cuda_passes_give_the_cpu_bits)
{
    const char *const *v = device_variants[_i];
    const char *args[14] = {"--device", "cpu"};
    for (int k = 0; k < 10 && v[k]; k++)
        args[2 + k] = v[k];
    char *cpu = NULL, *cuda = NULL;
    th_assert_rc(train_run(NULL, &cpu, args), 0);
    args[1] = "cuda";
    th_assert_rc(prog_run(EMU_TRAIN, NULL, &cuda, args), 0);
    ck_assert_ptr_nonnull(strstr(cpu, "final step="));
    ck_assert_str_eq(cpu, cuda);
    free(cpu);
    free(cuda);
}
END_TEST

/* A CUDA call failing (the Nth runtime call of the emulation: choosing the device, moving
   the state there, a gradient kernel, a later step) is named on stderr, exit 1, no final line. */
static const int emu_fail_after[] = {1, 5, 19, 200};

START_TEST(cuda_failure_reported)
{
    char env0[48], *out = NULL;
    snprintf(env0, sizeof(env0), "RKT_EMU_FAIL_AFTER=%d", emu_fail_after[_i]);
    const char *env[] = {env0, NULL};
    const char *const args[] = {"--steps", "30", "--device", "cuda", NULL};
    th_assert_rc(prog_run(EMU_TRAIN, env, &out, args), 1);
    ck_assert_msg(strstr(out, "rk-train: --device cuda: ") != NULL && strstr(out, "(emulated)") != NULL,
                  "the failure is not named:\n%s", out);
    ck_assert_ptr_null(strstr(out, "final step="));
    free(out);
}
END_TEST

/* --device cuda and --zero do not go together (yet): exit 2, said so. */
START_TEST(cuda_with_zero_refused)
{
    char *out = NULL;
    const char *const args[] = {"--steps", "3", "--device", "cuda", "--zero", NULL};
    th_assert_rc(prog_run(EMU_TRAIN, NULL, &out, args), 2);
    ck_assert_ptr_nonnull(strstr(out, "rk-train: --zero is not available with --device cuda"));
    free(out);
}
END_TEST

/* The real --device cuda where there is no GPU: exit 1 naming the runtime's reason; in a
   build without CUDA: exit 2, saying so. (On a GPU, tests/test_train_cuda.c runs it.) */
START_TEST(device_cuda_without_gpu)
{
    char *out = NULL, why[160];
#ifdef RK_TRAIN_CUDA
    if (th_have_gpu(why, sizeof(why))) {
        printf("device_cuda_without_gpu: a GPU is here: test_train_cuda covers it\n");
        return;
    }
    th_assert_rc(TRAIN(&out, "--steps", "3", "--device", "cuda"), 1);
    ck_assert_msg(strncmp(out, "rk-train: --device cuda: no CUDA device: ", 41) == 0, "output:\n%s", out);
#else
    (void)why;
    th_assert_rc(TRAIN(&out, "--steps", "3", "--device", "cuda"), 2);
    ck_assert_msg(strstr(out, "rk-train: --device cuda: this rk-train was built without CUDA") != NULL,
                  "output:\n%s", out);
#endif
    free(out);
}
END_TEST

static Suite *train_suite(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("single_process");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, same_arguments_same_bits);
    tcase_add_loop_test(tc, hash_depends_on_arguments, 0, (int)(sizeof(variants) / sizeof(variants[0])));
    tcase_add_test(tc, zero_steps);
    tcase_add_test(tc, loss_goes_down);
    tcase_add_test(tc, smallest_shapes);
    suite_add_tcase(s, tc);
    TCase *cli = tcase_create("command_line");
    tcase_set_timeout(cli, 60);
    tcase_add_test(cli, help);
    tcase_add_loop_test(cli, bad_arguments_exit_2, 0, (int)(sizeof(bad_args) / sizeof(bad_args[0])));
    tcase_add_test(cli, library_error_reported);
    suite_add_tcase(s, cli);
    TCase *dev = tcase_create("device");
    tcase_set_timeout(dev, 120);
    tcase_add_test(dev, device_cpu_is_the_default);
    tcase_add_loop_test(dev, cuda_passes_give_the_cpu_bits, 0,
                        (int)(sizeof(device_variants) / sizeof(device_variants[0])));
    tcase_add_loop_test(dev, cuda_failure_reported, 0, (int)(sizeof(emu_fail_after) / sizeof(emu_fail_after[0])));
    tcase_add_test(dev, cuda_with_zero_refused);
    tcase_add_test(dev, device_cuda_without_gpu);
    suite_add_tcase(s, dev);
    return s;
}

int main(void)
{
    return th_main(train_suite());
}
