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
    return s;
}

int main(void)
{
    return th_main(recover_suite());
}
