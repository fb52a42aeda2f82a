/*
 * tests/test_recover.c - the recover/ part: the tensor registry behind rk_register
 * (names HDF5 can hold, no dataset/group clash, dtype, shape, buffers) and the API's
 * behaviour on a single process.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"
#include "../recover/rec.h"
#include "../recover/rec_internal.h"

static rk_ctx *ctx;

static void quiet_stderr(void)
{
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    close(null);
}

static void setup(void)
{
    unsetenv("RK_CKPT_DIR");
    unsetenv("RK_EVENT_LOG");
    quiet_stderr(); /* the failures below are expected; each is logged once */
    rk_options o;
    rk_options_init(&o);
    ck_assert_int_eq(rk_init(&ctx, &o), 0);
}

/* As setup, with a checkpoint directory. */
static void setup_ckpt(void)
{
    char *dir = th_tmpdir("recover-ckpt");
    setenv("RK_CKPT_DIR", dir, 1);
    free(dir);
    unsetenv("RK_EVENT_LOG");
    quiet_stderr();
    rk_options o;
    rk_options_init(&o);
    ck_assert_int_eq(rk_init(&ctx, &o), 0);
    unsetenv("RK_CKPT_DIR");
}

static void teardown(void)
{
    rk_finalize(&ctx);
}

static float buf[64];
static const int64_t shape2[] = {8, 8};

START_TEST(register_accepts_good_tensors)
{
    th_assert_rc(rk_register(ctx, "model/layer0/w", buf, RK_F32, 2, shape2, 0), 0);
    th_assert_rc(rk_register(ctx, "model/layer0/b", buf, RK_F32, 1, (int64_t[]){8}, 0), 0);
    th_assert_rc(rk_register(ctx, "optim/t", buf, RK_I64, 0, NULL, 0), 0); /* scalar */
    th_assert_rc(rk_register(ctx, "empty", NULL, RK_BF16, 1, (int64_t[]){0}, 0), 0);
    th_assert_rc(rk_register(ctx, "model/layer1/w", buf, RK_U8, 1, (int64_t[]){64}, 0), 0);
    th_assert_rc(rk_register(ctx, "x y-z.w_1", buf, RK_F16, 1, (int64_t[]){4}, 0), 0);
}
END_TEST

static const struct {
    const char *name;
    int want;
} bad_names[] = {
    {"", RK_E_NAME},         {"/abs", RK_E_NAME},      {"trail/", RK_E_NAME},
    {"a//b", RK_E_NAME},     {"a/./b", RK_E_NAME},     {"../up", RK_E_NAME},
    {"tab\there", RK_E_NAME}, {"model/layer0/w", RK_E_DUPLICATE},
    {"model", RK_E_NAME},    /* a group of model/layer0/w */
    {"model/layer0/w/x", RK_E_NAME}, /* would make the dataset a group */
};

START_TEST(register_rejects_bad_names)
{
    th_assert_rc(rk_register(ctx, "model/layer0/w", buf, RK_F32, 2, shape2, 0), 0);
    th_assert_rc(rk_register(ctx, bad_names[_i].name, buf, RK_F32, 1, (int64_t[]){4}, 0), bad_names[_i].want);
    ck_assert_msg(strlen(rk_last_error()) > 0, "no message for '%s'", bad_names[_i].name);
}
END_TEST

START_TEST(register_rejects_bad_arguments)
{
    char longname[300];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    th_assert_rc(rk_register(ctx, longname, buf, RK_F32, 1, (int64_t[]){4}, 0), RK_E_NAME);
    th_assert_rc(rk_register(ctx, NULL, buf, RK_F32, 1, (int64_t[]){4}, 0), RK_E_NAME);
    th_assert_rc(rk_register(ctx, "t", buf, (rk_dtype)42, 1, (int64_t[]){4}, 0), RK_E_DTYPE);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){4}, 1u), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 9, shape2, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, -1, shape2, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 2, NULL, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){-3}, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", NULL, RK_F32, 1, (int64_t[]){4}, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F64, 3, (int64_t[]){1LL << 40, 1LL << 40, 1LL << 40}, 0), -EOVERFLOW);
    th_assert_rc(rk_register(NULL, "t", buf, RK_F32, 1, (int64_t[]){4}, 0), -EINVAL);
    /* none of the failures registered anything: the name is still free */
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){4}, 0), 0);
}
END_TEST

START_TEST(allreduce_checks_arguments)
{
    th_assert_rc(rk_allreduce(ctx, buf, 4, RK_F32, RK_SUM), 0);
    ck_assert_float_eq(buf[0], 0.0f);
    th_assert_rc(rk_allreduce(ctx, NULL, 4, RK_F32, RK_SUM), -EINVAL);
    th_assert_rc(rk_allreduce(ctx, NULL, 0, RK_F32, RK_SUM), 0);
    th_assert_rc(rk_allreduce(ctx, buf, 4, (rk_dtype)42, RK_SUM), RK_E_DTYPE);
    th_assert_rc(rk_allreduce(ctx, buf, 4, RK_F32, (rk_op)9), RK_E_OP);
    th_assert_rc(rk_allreduce(NULL, buf, 4, RK_F32, RK_SUM), -EINVAL);
}
END_TEST

/* ---- the coordinator's decision (recover/coord.c, docs/PROTOCOL.md) --------------------- */

static rec_report R(int rank0, int64_t next, int64_t held, int64_t committed)
{
    return (rec_report){.rank0 = rank0, .epoch = 1, .next_step = next, .held_step = held, .committed_step = committed};
}

static rec_decision dec;

START_TEST(decide_I1_majority_required)
{
    int prev[] = {0, 1, 2, 3};
    rec_report three[] = {R(3, 10, 8, 8), R(0, 10, 8, 8), R(2, 11, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, three, 3, 1, 7, &dec), 0);
    rec_report two_with_lowest[] = {R(0, 10, 8, 8), R(1, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, two_with_lowest, 2, 1, 7, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.all_hold, 1);
    rec_report two_without_lowest[] = {R(2, 10, 8, 8), R(3, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, two_without_lowest, 2, 1, 7, &dec), RK_E_NO_MAJORITY);
    rec_report one[] = {R(0, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, one, 1, 1, 7, &dec), RK_E_NO_MAJORITY);
    /* a job of two survives losing its second worker, not its first */
    int prev2[] = {5, 9};
    th_assert_rc(rec_decide(prev2, 2, (rec_report[]){R(5, 3, 2, -1)}, 1, 1, 2, &dec), 0);
    th_assert_rc(rec_decide(prev2, 2, (rec_report[]){R(9, 3, 2, -1)}, 1, 1, 2, &dec), RK_E_NO_MAJORITY);
}
END_TEST

START_TEST(decide_I2_min_world)
{
    int prev[] = {0, 1, 2, 3, 4};
    rec_report rep[] = {R(0, 5, 4, 4), R(1, 5, 4, 4), R(2, 5, 4, 4)};
    th_assert_rc(rec_decide(prev, 5, rep, 3, 4, 2, &dec), RK_E_MIN_WORLD);
    th_assert_rc(rec_decide(prev, 5, rep, 3, 3, 2, &dec), 0);
}
END_TEST

START_TEST(decide_I5_memory_first_I6_dense_order)
{
    int prev[] = {0, 1, 2, 3};
    /* rank 2 holds the newest snapshot (12); the others still hold 8; newest commit is 8 */
    rec_report rep[] = {R(3, 13, 8, 8), R(2, 13, 12, 8), R(1, 12, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 9, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 12);
    ck_assert_int_eq(dec.root, 2);
    ck_assert_int_eq(dec.all_hold, 0);
    ck_assert_int_eq(dec.steps_lost, 1);
    ck_assert_int_eq(dec.nmembers, 3);
    ck_assert_int_eq(dec.members[0], 1);
    ck_assert_int_eq(dec.members[1], 2);
    ck_assert_int_eq(dec.members[2], 3);
    ck_assert_uint_eq(dec.epoch, 9);
}
END_TEST

START_TEST(decide_I4_never_older_than_committed)
{
    int prev[] = {0, 1, 2};
    /* survivors' memory holds 8, but a survivor knows step 12 was committed: disk */
    rec_report rep[] = {R(0, 14, 8, 12), R(1, 14, -1, 8)};
    th_assert_rc(rec_decide(prev, 3, rep, 2, 1, 3, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
    ck_assert_int_eq(dec.step, 12);
    ck_assert_int_eq(dec.steps_lost, 2);
    /* nothing held, nothing committed */
    rec_report none[] = {R(0, 3, -1, -1), R(1, 3, -1, -1)};
    th_assert_rc(rec_decide(prev, 3, none, 2, 1, 3, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_NOTHING);
    ck_assert_int_eq(dec.step, 0);
}
END_TEST

START_TEST(decide_rejects_malformed)
{
    int prev[] = {0, 1, 2};
    th_assert_rc(rec_decide(prev, 3, (rec_report[]){R(7, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(prev, 3, (rec_report[]){R(1, 1, -1, -1), R(1, 1, -1, -1)}, 2, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(prev, 0, (rec_report[]){R(1, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(NULL, 3, (rec_report[]){R(1, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
}
END_TEST

/* A tensor registered after the last snapshot: the held snapshot does not cover it, so
   this member never offers it for a rollback, and a rollback from it fails cleanly
   instead of copying from memory that holds nothing. */
START_TEST(held_snapshot_not_offered_after_a_new_tensor)
{
    static float a[16], b[16];
    const int64_t n16[] = {16};
    th_assert_rc(rk_register(ctx, "a", a, RK_F32, 1, n16, 0), 0);
    int64_t next = -1;
    th_assert_rc(rk_resume(ctx, &next), 0);
    ck_assert_int_eq(rec_ckpt_held_step(ctx), 0); /* the starting state is held */
    th_assert_rc(rk_register(ctx, "b", b, RK_F32, 1, n16, 0), 0);
    ck_assert_int_eq(rec_ckpt_held_step(ctx), -1);
    rec_decision d = {.epoch = 1, .step = 0, .source = REC_FROM_MEMORY, .root = 0, .all_hold = 0,
                        .nmembers = 1, .members = {0}};
    ck_assert_int_ne(rec_ckpt_rollback(ctx, &d), 0);
}
END_TEST

static Suite *recover_suite(void)
{
    Suite *s = suite_create("recover");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, register_accepts_good_tensors);
    tcase_add_loop_test(tc, register_rejects_bad_names, 0, (int)RK_ARRAY_LEN(bad_names));
    tcase_add_test(tc, register_rejects_bad_arguments);
    tcase_add_test(tc, allreduce_checks_arguments);
    suite_add_tcase(s, tc);

    tc = tcase_create("rollback");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup_ckpt, teardown);
    tcase_add_test(tc, held_snapshot_not_offered_after_a_new_tensor);
    suite_add_tcase(s, tc);

    tc = tcase_create("decide");
    tcase_add_test(tc, decide_I1_majority_required);
    tcase_add_test(tc, decide_I2_min_world);
    tcase_add_test(tc, decide_I5_memory_first_I6_dense_order);
    tcase_add_test(tc, decide_I4_never_older_than_committed);
    tcase_add_test(tc, decide_rejects_malformed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(recover_suite());
}
