/*
 * tests/test_gpu_check.c - scripts/gpu-check where there is no GPU (docs/GPU.md): it says
 * so, writes a summary saying that nothing ran on a GPU, and exits 0; usage errors exit 2.
 * Where the Debian packages were gathered (.gpu-deps/root, scripts/gpu-check --gather),
 * the prefix is checked to be one that can travel: mpicc and the launcher are there, no
 * link points outside it, and it fits the 64 MiB a device call carries. The build against
 * the prefix itself is too slow for make check: scripts/gpu-check --build-only does it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rekindle.h"

static char *script(void)
{
    const char *src = getenv("RK_TEST_SRC");
    char *p = NULL;
    ck_assert_msg(src != NULL, "RK_TEST_SRC is not set (run through tests/run)");
    ck_assert_int_gt(asprintf(&p, "%s/scripts/gpu-check", src), 0);
    return p;
}

START_TEST(no_gpu_says_so_and_exits_0)
{
    char why[160];
    if (th_have_gpu(why, sizeof(why))) {
        printf("no_gpu_says_so_and_exits_0: a GPU is here (scripts/gpu-check would run it all)\n");
        return;
    }
    char *gc = script(), *dir = th_tmpdir("gpu_check"), cmd[8192], *out = NULL, path[4200];
    snprintf(cmd, sizeof(cmd), "'%s' '%s/out'", gc, dir);
    th_assert_rc(th_sh(cmd, 60, &out), 0);
    ck_assert_msg(strstr(out, "gpu-check: no GPU: ") != NULL, "output:\n%s", out);
    snprintf(path, sizeof(path), "%s/out/summary.txt", dir);
    char *sum = th_read_file(path, NULL);
    ck_assert_msg(sum != NULL, "no %s", path);
    ck_assert_msg(strstr(sum, "nothing was run on a GPU") && strstr(sum, "result: SKIPPED (no GPU)"),
                  "summary:\n%s", sum);
    free(sum);
    free(out);
    th_rmrf(dir);
    free(dir);
    free(gc);
}
END_TEST

static const struct {
    const char *args, *says;
} usage[] = {
    {"--frobnicate", "unknown option '--frobnicate'"},
    {"a b", "one OUTDIR only"},
    {"--build", "--build needs a directory"},
};

START_TEST(usage_errors_exit_2)
{
    char *gc = script(), cmd[4200], *out = NULL;
    snprintf(cmd, sizeof(cmd), "'%s' %s", gc, usage[_i].args);
    th_assert_rc(th_sh(cmd, 30, &out), 2);
    ck_assert_msg(strstr(out, usage[_i].says) != NULL, "output:\n%s", out);
    free(out);
    free(gc);
}
END_TEST

START_TEST(help_names_the_steps)
{
    char *gc = script(), cmd[4200], *out = NULL;
    snprintf(cmd, sizeof(cmd), "'%s' --help", gc);
    th_assert_rc(th_sh(cmd, 30, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--gather"));
    ck_assert_ptr_nonnull(strstr(out, "--build-only"));
    ck_assert_ptr_nonnull(strstr(out, "summary.txt"));
    free(out);
    free(gc);
}
END_TEST

/* A gathered prefix (if there is one here) can travel and be used: checked, not rebuilt. */
START_TEST(gathered_prefix_travels)
{
    const char *src = getenv("RK_TEST_SRC");
    char root[4200], cmd[8192], *out = NULL;
    snprintf(root, sizeof(root), "%s/.gpu-deps/root", src ? src : ".");
    if (!th_exists(root, "PACKAGES")) {
        printf("gathered_prefix_travels: nothing gathered here (scripts/gpu-check --gather)\n");
        return;
    }
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && test -x usr/bin/opal_wrapper && test -L usr/bin/mpicc && test -x usr/bin/orted && "
             "test -e usr/include/hdf5/serial/hdf5.h && test -e usr/include/check.h && "
             "test -e usr/lib/x86_64-linux-gnu/libcheck_pic.a && "
             "echo abs=$(find . -type l -lname '/*' | wc -l) dangling=$(find . -xtype l | wc -l) "
             "mib=$(du -sm . | cut -f1) pkgs=$(wc -l < PACKAGES) debs=$(wc -l < VERSIONS)",
             root);
    th_assert_rc(th_sh(cmd, 30, &out), 0);
    int abs = -1, dangling = -1, mib = -1, pkgs = -1, debs = -2;
    ck_assert_msg(
        sscanf(out, "abs=%d dangling=%d mib=%d pkgs=%d debs=%d", &abs, &dangling, &mib, &pkgs, &debs) == 5,
        "output:\n%s", out);
    ck_assert_int_eq(abs, 0);
    ck_assert_int_eq(dangling, 0);
    ck_assert_int_eq(pkgs, debs);
    ck_assert_msg(mib <= 60, "the prefix is %d MiB: more than a device call should carry with the tree", mib);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpu_check");
    TCase *tc = tcase_create("gpu_check");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, no_gpu_says_so_and_exits_0);
    tcase_add_loop_test(tc, usage_errors_exit_2, 0, (int)(sizeof(usage) / sizeof(usage[0])));
    tcase_add_test(tc, help_names_the_steps);
    tcase_add_test(tc, gathered_prefix_travels);
    suite_add_tcase(s, tc);
    return th_main(s);
}
