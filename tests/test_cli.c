/*
 * tests/test_cli.c - the `rekindle` entry point (exit codes of contract section 4:
 * 0 ok, 1 bad thing found, 2 usage/environment) and the installed library: `make install`
 * then a small program built with `pkg-config --cflags --libs rekindle` compiles, links, runs;
 * the build's CUDA + NCCL detection against fake toolkits; the soname of the ABI rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"

static int cli(const char *args, char **out)
{
    char *bin = th_bin("rekindle");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s %s", bin, args);
    free(bin);
    return th_sh(cmd, 30, out);
}

START_TEST(help_and_version)
{
    char *out = NULL;
    th_assert_rc(cli("--help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: rekindle <command>"));
    for (const char *const *c = (const char *const[]){"ls", "verify", "inspect", "restore", "gc", "run", NULL}; *c; c++) {
        char want[32];
        snprintf(want, sizeof(want), "\n  %s ", *c);
        ck_assert_msg(strstr(out, want) != NULL, "--help does not list '%s'", *c);
    }
    free(out);
    th_assert_rc(cli("--version", &out), 0);
    char want[64];
    snprintf(want, sizeof(want), "rekindle %s\n", REKINDLE_VERSION_STRING);
    ck_assert_str_eq(out, want);
    free(out);
}
END_TEST

START_TEST(usage_errors_exit_2)
{
    char *out = NULL;
    th_assert_rc(cli("", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "usage:"));
    free(out);
    th_assert_rc(cli("frobnicate", &out), 2);
    ck_assert_str_eq(out, "rekindle: unknown command 'frobnicate' (see rekindle --help)\n");
    free(out);
}
END_TEST

static int sh_ok(const char *cmd, char **out)
{
    int rc = th_sh(cmd, 300, out);
    if (rc != 0)
        fprintf(stderr, "command failed (%d): %s\n%s\n", rc, cmd, *out ? *out : "");
    return rc;
}

START_TEST(install_and_pkg_config)
{
    const char *src = getenv("RK_TEST_SRC"), *build = getenv("RK_TEST_BUILD");
    const char *san = getenv("RK_TEST_SANITIZE");
    bool sanitized = san && strcmp(san, "1") == 0;
    char *dir = th_tmpdir("install");
    char cmd[4096], *out = NULL;
    /* The build tree's own configuration: one built with USE_CUDA=no on a machine with CUDA
       has no GPU object, and must not get GPU objects beside its CPU-only ones. */
    snprintf(cmd, sizeof(cmd), "%s/obj/ring/ring_nccl.o", build);
    bool gpu = access(cmd, F_OK) == 0;
    snprintf(cmd, sizeof(cmd), "make -s -C %s BUILD=%s SANITIZE=%d%s install PREFIX=%s/prefix", src, build,
             sanitized, gpu ? "" : " USE_CUDA=no", dir);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    free(out);
    /* The three-line program of the README, compiled only with what pkg-config says. */
    snprintf(cmd, sizeof(cmd),
             "cd %s && printf '%%s\\n' '#include <rekindle.h>' '#include <stdio.h>' "
             "'int main(void) { printf(\"%%s %%s\\\\n\", rk_version(), rk_strerror(RK_E_NOTAVAIL)); return 0; }' > hello.c && "
             "export PKG_CONFIG_PATH=%s/prefix/lib/pkgconfig && "
             "cc %s hello.c -o hello $(pkg-config --cflags --libs rekindle) && ./hello",
             dir, dir, sanitized ? "-fsanitize=address,undefined" : "");
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    ck_assert_msg(strstr(out, REKINDLE_VERSION_STRING " not available") == out, "program printed: %s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "test -x %s/prefix/bin/rekindle && test -f %s/prefix/include/rekindle.h && "
                               "test -f %s/prefix/lib/librekindle.a", dir, dir, dir);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    free(out);
    /* The same program linked against the build tree starts: the loader finds the
       library under its soname (librekindle.so.1) in build/lib. */
    snprintf(cmd, sizeof(cmd), "cd %s && cc %s -I%s/include hello.c -o hello-build -L%s/lib -Wl,-rpath,%s/lib -lrekindle && "
                               "./hello-build", dir, sanitized ? "-fsanitize=address,undefined" : "", src, build, build);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    ck_assert_msg(strstr(out, REKINDLE_VERSION_STRING " not available") == out, "program printed: %s", out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* The build's CUDA + NCCL detection against fake toolkits (headers with only the version
   macros, empty libraries): NCCL found under NCCL_HOME apart from CUDA_HOME, its version in
   the build line, ncclCommShrink compiled (-DRK_HAVE_NCCL_SHRINK) from NCCL 2.27 on only,
   NCCL's directories ahead of CUDA's, NCCL itself not linked (ring_nccl_load); and no GPU
   part where NCCL is missing or USE_CUDA=no. */
START_TEST(build_detects_nccl_version_and_shrink)
{
    const char *src = getenv("RK_TEST_SRC");
    char *d = th_tmpdir("cudafake");
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "cd %s && mkdir -p cuda/include cuda/lib64 n226/include n226/lib n227/include n227/lib64 && "
             "echo '#define CUDART_VERSION 13000' > cuda/include/cuda_runtime_api.h && "
             "touch cuda/include/cuda_runtime.h cuda/lib64/libcudart.so n226/lib/libnccl.so.2 n227/lib64/libnccl.so && "
             "printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 26\n#define NCCL_PATCH 5\n' > n226/include/nccl.h && "
             "printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n' > n227/include/nccl.h", d);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    free(out);
    const char *vers[] = {"n226", "n227"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "make -s -C %s CUDA_HOME=%s/cuda NCCL_HOME=%s/%s config && "
                 "make -s -n -C %s BUILD=%s/b CUDA_HOME=%s/cuda NCCL_HOME=%s/%s %s/b/obj/ring/ring_nccl.o %s/b/lib/librekindle.so",
                 src, d, d, vers[i], src, d, d, d, vers[i], d, d);
        ck_assert_int_eq(sh_ok(cmd, &out), 0);
        char want[512];
        snprintf(want, sizeof(want), "CUDA 13.0 under %s/cuda + NCCL %s under %s/%s (ncclCommShrink %s): building the GPU parts",
                 d, i ? "2.27.3" : "2.26.5", d, vers[i], i ? "built" : "not built: NCCL < 2.27");
        ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
        ck_assert_msg(!strstr(out, "-DRK_HAVE_NCCL_SHRINK") == !i, "RK_HAVE_NCCL_SHRINK %s:\n%s", i ? "missing" : "set", out);
        snprintf(want, sizeof(want), "-I%s/%s/include -I%s/cuda/include", d, vers[i], d);
        ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
        snprintf(want, sizeof(want), "-L%s/%s/%s/", d, vers[i], i ? "lib64" : "lib");
        ck_assert_msg(strstr(out, want) && !strstr(out, "-lnccl") && !strstr(out, "libnccl.so.2"),
                      "NCCL's directory, NCCL not linked (found at run time):\n%s", out);
        free(out);
    }
    snprintf(cmd, sizeof(cmd), "make -s -C %s CUDA_HOME=%s/cuda NCCL_HOME=%s/none config && "
             "make -s -C %s CUDA_HOME=%s/cuda NCCL_HOME=%s/n227 USE_CUDA=no config && "
             "make -s -n -C %s BUILD=%s/c CUDA_HOME=%s/cuda NCCL_HOME=%s/n227 USE_CUDA=no %s/c/lib/librekindle.a",
             src, d, d, src, d, d, src, d, d, d, d);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    ck_assert_msg(strstr(out, "not found (CUDA_HOME=") && strstr(out, "disabled (USE_CUDA=no): CPU-only build") &&
                      !strstr(out, "_nccl.") && !strstr(out, "_cuda.") && !strstr(out, "RK_HAVE_CUDA"),
                  "CPU-only builds:\n%s", out);
    free(out);
    th_rmrf(d);
    free(d);
}
END_TEST

/* One build directory spelled two ways (the Python wheel's make passes an absolute BUILD, a
   developer's make the relative `build`): an object compiled under one spelling is rebuilt
   under the other once a header it includes changes. Before, the dependency file named the
   object as the first make had, the second saw no header behind it, and a library linked
   objects compiled against two layouts of one struct. In a copy of the Makefile, include/
   and common/ (its header touched, not the tree under test's). */
START_TEST(build_dir_spelled_two_ways)
{
    const char *src = getenv("RK_TEST_SRC");
    char *d = th_tmpdir("spelling");
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "mkdir -p %s/src && cp -r %s/Makefile %s/include %s/common %s/src/ && "
             "make -s -C %s/src BUILD=%s/src/bx %s/src/bx/obj/common/err.o && "
             "touch -d @$(( $(date +%%s) + 5 )) %s/src/common/common.h && "
             "make -n -C %s/src BUILD=bx bx/obj/common/err.o",
             d, src, src, src, d, d, d, d, d, d);
    ck_assert_int_eq(sh_ok(cmd, &out), 0);
    ck_assert_msg(strstr(out, "-c common/err.c -o bx/obj/common/err.o"),
                  "common.h changed, yet `make BUILD=bx` does not rebuild the object an absolute BUILD made:\n%s", out);
    free(out);
    th_rmrf(d);
    free(d);
}
END_TEST

/* The ABI rule (rekindle.h): the built library's soname is
   librekindle.so.<REKINDLE_ABI_VERSION>, and rk_options has that ABI's size (LP64). A field
   added outside the reserved space changes the size: bump REKINDLE_ABI_VERSION and record
   the new size here. */
START_TEST(soname_is_the_headers_abi)
{
    static const size_t options_size[] = {[0] = 272, [1] = 336};
    ck_assert_int_lt(REKINDLE_ABI_VERSION, (int)(sizeof(options_size) / sizeof(options_size[0])));
    ck_assert_msg(sizeof(void *) != 8 || sizeof(rk_options) == options_size[REKINDLE_ABI_VERSION],
                  "rk_options is %zu bytes, ABI %d's are %zu: a change of size needs a new ABI version",
                  sizeof(rk_options), REKINDLE_ABI_VERSION, options_size[REKINDLE_ABI_VERSION]);
    char cmd[4096], want[64], *out = NULL;
    snprintf(cmd, sizeof(cmd), "readelf -d %s/lib/librekindle.so", getenv("RK_TEST_BUILD"));
    ck_assert_int_eq(th_sh(cmd, 30, &out), 0);
    snprintf(want, sizeof(want), "Library soname: [librekindle.so.%d]", REKINDLE_ABI_VERSION);
    ck_assert_msg(out && strstr(out, want), "want '%s' in:\n%s", want, out ? out : "");
    free(out);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("entry");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, help_and_version);
    tcase_add_test(tc, usage_errors_exit_2);
    tcase_add_test(tc, soname_is_the_headers_abi);
    suite_add_tcase(s, tc);
    tc = tcase_create("install");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, install_and_pkg_config);
    tcase_add_test(tc, build_detects_nccl_version_and_shrink);
    tcase_add_test(tc, build_dir_spelled_two_ways);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(cli_suite());
}
