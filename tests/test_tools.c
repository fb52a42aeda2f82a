/*
 * tests/test_tools.c - the checkpoint subcommands of the `rekindle` CLI against real
 * checkpoints written by tests/prog_ckpt: output, exit codes (0 ok, 1 bad, 2 usage), the
 * self-contained file of restore, and gc never removing the newest that verifies.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"

static char *dir, *cli;

static void setup(void)
{
    char *prog = th_bin("../tests/prog_ckpt"), *out = NULL;
    cli = th_bin("rekindle");
    dir = th_tmpdir("cli");
    char env[4200];
    snprintf(env, sizeof(env), "RK_CKPT_DIR=%s", dir);
    const char *e[] = {env, "RK_CKPT_EVERY=2", "RK_KEEP=3",
                       "RK_JOB_SECRET=0000000000000000000000000000000000000000000000000000000000000001", NULL};
    char *argv[] = {prog, "write", "7", "7", NULL};
    int rc = th_run(argv, e, 60, &out);
    ck_assert_msg(rc == 0, "prog_ckpt write: %d %s", rc, out);
    free(out);
    free(prog);
}

static void teardown(void)
{
    th_rmrf(dir);
    free(dir);
    free(cli);
}

/* Runs `rekindle ARGS` (a shell fragment, DIR replaced by the checkpoint dir). */
static int cli_run(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "D='%s'; '%s' %s 2>&1", dir, cli, args);
    return th_sh(cmd, 60, out);
}

#define EXPECT(args, status, needle)                                                        \
    do {                                                                                   \
        char *o_ = NULL;                                                                   \
        int rc_ = cli_run(args, &o_);                                                      \
        ck_assert_msg(rc_ == (status) && strstr(o_, needle),                \
                      "rekindle %s: exit %d (want %d), output:\n%s", args, rc_, status, o_); \
        free(o_);                                                                          \
    } while (0)

static void flip(const char *rel, off_t off)
{
    char p[4300];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    unsigned char b;
    ck_assert_int_eq(pread(fd, &b, 1, off), 1);
    b ^= 1;
    ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

START_TEST(ls_lists_every_checkpoint)
{
    EXPECT("ls \"$D\"", 0, "committed");
    EXPECT("ls \"$D\" | grep -c committed", 0, "3");
    EXPECT("ls \"$D\" --json", 0, "\"step\": 6, \"state\": \"committed\", \"world_size\": 1, \"tensors\": 9");
    EXPECT("ls /nonexistent/dir", 2, "/nonexistent/dir");
    EXPECT("ls \"$D\" --bogus", 2, "--bogus");
    EXPECT("ls --help", 0, "usage: rekindle ls");
}
END_TEST

START_TEST(verify_names_bad_tensor)
{
    EXPECT("verify \"$D\"", 0, "step-000000000006: ok");
    EXPECT("verify \"$D\" --all", 0, "step-000000000002: ok");
    flip("step-000000000004/shard-0.h5", 1048576 + 3); /* weights/f32's bytes */
    EXPECT("verify \"$D\" --step 4", 1, "'weights/f32': checksum mismatch");
    EXPECT("verify \"$D\" --all", 1, "step-000000000004: BAD");
    EXPECT("verify \"$D\" --step 5", 2, "step 5");
    EXPECT("verify \"$D\" --step x", 2, "--step");
    EXPECT("ls \"$D\" | grep -c committed", 0, "3"); /* data damage is found by verify, not ls */
}
END_TEST

START_TEST(inspect_lists_tensors)
{
    EXPECT("inspect \"$D\"", 0, "half/bf16\tbf16\t(5,9)\t90\tshard-0.h5\txxh3:");
    EXPECT("inspect \"$D\" --step 2", 0, "step 2, world_size 1, format_version 1");
    EXPECT("inspect \"$D\" --step 2 | grep -c xxh3", 0, "9");
}
END_TEST

START_TEST(restore_self_contained)
{
    EXPECT("restore \"$D\" --out \"$D/out.h5\"", 0, "restored step 6");
    EXPECT("h5dump -H \"$D/out.h5\" | grep -c EXTERNAL_LINK", 1, "0");
    char py[4096];
    snprintf(py, sizeof(py),
             "cd / && %s -c \"import h5py; f=h5py.File('%s/out.h5','r'); g=h5py.File('%s/step-000000000006/index.h5','r');"
             " assert int(f.attrs['step'])==6 and int(f.attrs['world_size'])==1 and int(f.attrs['format_version'])==1;"
             " assert f['deep/a/b/c/name with spaces'][()].tobytes()==g['deep/a/b/c/name with spaces'][()].tobytes(); print('same')\"",
             getenv("RK_TEST_PYTHON") ? getenv("RK_TEST_PYTHON") : "/usr/bin/python3", dir, dir);
    char *out = NULL;
    int rc = th_sh(py, 60, &out);
    ck_assert_msg(rc == 0 && strstr(out, "same"), "%d %s", rc, out);
    free(out);
    EXPECT("restore \"$D\"", 2, "--out");
    flip("step-000000000006/shard-0.h5", 1048576 + 3);
    EXPECT("restore \"$D\" --out \"$D/bad.h5\"", 1, "checksum mismatch");
    EXPECT("test -e \"$D/bad.h5\" || echo absent", 0, "absent");
}
END_TEST

START_TEST(gc_keeps_newest_that_verifies)
{
    flip("step-000000000006/shard-0.h5", 1048576 + 3);
    EXPECT("gc \"$D\" --keep 1", 0, "removed");
    EXPECT("ls \"$D\"", 0, "4 ");
    EXPECT("ls \"$D\" | grep -c committed", 0, "2"); /* 6 (kept: newest) and 4 (newest that verifies) */
    EXPECT("gc \"$D\"", 2, "--keep");
    EXPECT("gc \"$D\" --keep 0", 2, "--keep");
}
END_TEST

/* One order for the engine and the CLI (ckpt_list): ls names each checkpoint's timeline
   and commit time; a directory that cannot be listed (a fault in the "list" operation) is
   an environment error of ls, verify and gc, never "no checkpoint". */
START_TEST(order_and_unlistable_directory)
{
    EXPECT("ls \"$D\" --json", 0, "\"timeline\": \"current\"");
    EXPECT("ls \"$D\" --json | grep -c '\"commit_time_ns\": [1-9]'", 0, "3");
    setenv("RK_FAULT", "list@*=eio", 1); /* this test's own process (CK_FORK) */
    EXPECT("gc \"$D\" --keep 1", 2, "cannot list");
    EXPECT("ls \"$D\"", 2, "cannot list");
    EXPECT("verify \"$D\"", 2, "cannot list");
    unsetenv("RK_FAULT");
    EXPECT("ls \"$D\" | grep -c committed", 0, "3"); /* nothing was removed */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tools");
    TCase *tc = tcase_create("ckpt_cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, ls_lists_every_checkpoint);
    tcase_add_test(tc, verify_names_bad_tensor);
    tcase_add_test(tc, inspect_lists_tensors);
    tcase_add_test(tc, restore_self_contained);
    tcase_add_test(tc, gc_keeps_newest_that_verifies);
    tcase_add_test(tc, order_and_unlistable_directory);
    suite_add_tcase(s, tc);
    return th_main(s);
}
