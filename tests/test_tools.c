/*
 * tests/test_tools.c - the checkpoint subcommands of the `rekindle` CLI against real
 * checkpoints written by tests/prog_ckpt: output, exit codes (0 ok, 1 bad, 2 usage), the
 * self-contained file of restore, gc never removing the newest that verifies, damage to
 * HDF5 metadata found by the commit record's checksums, and format-1 checkpoints.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/fmt.h"
#include "common.h"
#include "harness.h"

#define SECRET "RK_JOB_SECRET=0000000000000000000000000000000000000000000000000000000000000001"

static char *dir, *cli;

static void setup(void)
{
    char *prog = th_bin("../tests/prog_ckpt"), *out = NULL;
    cli = th_bin("rekindle");
    dir = th_tmpdir("cli");
    char env[4200];
    snprintf(env, sizeof(env), "RK_CKPT_DIR=%s", dir);
    const char *e[] = {env, "RK_CKPT_EVERY=2", "RK_KEEP=3", SECRET, NULL};
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
    flip("step-000000000004/shard-0.h5", 1052672 + 5); /* weights/f64's: read in the same batch */
    EXPECT("verify \"$D\" --step 4", 1, "'weights/f32': checksum mismatch");
    EXPECT("verify \"$D\" --step 4", 1, "'weights/f64': checksum mismatch"); /* every bad one named */
    EXPECT("verify \"$D\" --all", 1, "step-000000000004: BAD");
    EXPECT("verify \"$D\" --step 5", 2, "step 5");
    EXPECT("verify \"$D\" --step x", 2, "--step");
    EXPECT("ls \"$D\" | grep -c committed", 0, "3"); /* data damage is found by verify, not ls */
}
END_TEST

START_TEST(inspect_lists_tensors)
{
    EXPECT("inspect \"$D\"", 0, "half/bf16\tbf16\t(5,9)\t90\tshard-0.h5\txxh3:");
    EXPECT("inspect \"$D\" --step 2", 0, "step 2, world_size 1, format_version 2");
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
             " assert int(f.attrs['step'])==6 and int(f.attrs['world_size'])==1 and int(f.attrs['format_version'])==2;"
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
    /* The new name is made durable too (an fsync of its directory after the rename); when
       that fails, the restore fails and leaves neither the file nor its .part. (Before:
       no fsync of the directory, and a power cut could leave only the .part.) */
    setenv("RK_FAULT", "syncdir@0=eio", 1);
    EXPECT("restore \"$D\" --step 4 --out \"$D/nodir.h5\"", 2, "fsync of its directory");
    unsetenv("RK_FAULT");
    EXPECT("ls \"$D\" | grep -c nodir", 1, "0");
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

/* rk_resume (tests/prog_ckpt) over the checkpoint directory must restore label `want`. */
static void resume_expect(const char *want)
{
    char *prog = th_bin("../tests/prog_ckpt"), *out = NULL, env[4200];
    snprintf(env, sizeof(env), "RK_CKPT_DIR=%s", dir);
    const char *e[] = {env, "RK_CKPT_EVERY=2", "RK_KEEP=3", SECRET, NULL};
    char *argv[] = {prog, "resume", (char *)want, "7", NULL};
    int rc = th_run(argv, e, 60, &out);
    ck_assert_msg(rc == 0, "prog_ckpt resume %s: exit %d: %s", want, rc, out);
    free(out);
    free(prog);
}

/* Damage to HDF5 metadata is found by the commit record's checksums before libhdf5 sees a
   byte: one bit of index.h5 that makes HDF5 1.10 crash (SIGSEGV in H5Lexists, opening
   the links) and one of a shard file's superblock. ls says corrupt, verify names the
   file (exit 1), inspect and restore refuse it (exit 1), rk_resume takes the one before. */
START_TEST(flipped_hdf5_metadata_is_corrupt)
{
    flip("step-000000000006/index.h5", 2170);
    EXPECT("ls \"$D\" --json", 0, "\"step\": 6, \"state\": \"corrupt\"");
    EXPECT("ls \"$D\" | grep -c committed", 0, "2");
    EXPECT("verify \"$D\" --step 6", 1, "step-000000000006/index.h5: checksum mismatch");
    EXPECT("verify \"$D\" --all", 1, "step-000000000004: ok");
    EXPECT("inspect \"$D\" --step 6", 1, "index.h5: checksum mismatch");
    EXPECT("restore \"$D\" --step 6 --out \"$D/r.h5\"", 1, "index.h5: checksum mismatch");
    resume_expect("4");
    flip("step-000000000004/shard-0.h5", 0); /* the superblock's signature */
    EXPECT("ls \"$D\" --json", 0, "\"step\": 4, \"state\": \"corrupt\"");
    EXPECT("verify \"$D\" --step 4", 1, "step-000000000004/shard-0.h5: checksum mismatch");
    resume_expect("2");
    flip("step-000000000002/commit.ok", 20); /* the record itself */
    EXPECT("verify \"$D\" --step 2", 1, "commit.ok: malformed or checksum mismatch");
}
END_TEST

/* A checkpoint of format 1 (before the commit record: manifests "rekindle-manifest 1"
   without a `file` line, format_version 1, no commit.ok) is still read; one of format 2
   that lost its record is not taken for one. */
static void to_format_1(const char *step)
{
    char p[4300];
    snprintf(p, sizeof(p), "%s/%s/shard-0.ok", dir, step);
    char *m = th_read_file(p, NULL), *q, *nl;
    ck_assert_ptr_nonnull(m);
    ck_assert_ptr_nonnull(q = strstr(m, "rekindle-manifest 2\n"));
    q[18] = '1';
    ck_assert_ptr_nonnull(q = strstr(m, "\nfile "));
    nl = strchr(q + 1, '\n');
    memmove(q, nl, strlen(nl) + 1);
    ck_assert_ptr_nonnull(q = strstr(m, "end "));
    snprintf(q, 22, "end %016llx\n", (unsigned long long)fmt_xxh3(m, (size_t)(q - m)));
    ck_assert_int_eq(th_write_file(p, m, strlen(m)), 0);
    free(m);
    snprintf(p, sizeof(p), "%s/%s/index.h5", dir, step);
    fmt_h5_quiet();
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT), a = f >= 0 ? H5Aopen(f, "format_version", H5P_DEFAULT) : -1;
    int32_t v = 1;
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_INT32, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
    snprintf(p, sizeof(p), "%s/%s/commit.ok", dir, step);
    ck_assert_int_eq(unlink(p), 0);
}

START_TEST(format_1_still_read)
{
    char p[4300];
    snprintf(p, sizeof(p), "%s/step-000000000002/commit.ok", dir);
    ck_assert_int_eq(unlink(p), 0);
    EXPECT("verify \"$D\" --step 2", 1, "commit.ok is missing");
    to_format_1("step-000000000004");
    to_format_1("step-000000000006");
    EXPECT("verify \"$D\" --step 6", 0, "step-000000000006: ok");
    EXPECT("verify \"$D\" --step 4", 0, "step-000000000004: ok");
    EXPECT("inspect \"$D\" --step 6", 0, "format_version 1");
    EXPECT("ls \"$D\" | grep -c committed", 0, "2");
    resume_expect("6");
}
END_TEST

/* A crafted checkpoint of a million tensors whose last name repeats the one before it
   (its commit record and every checksum right) is rejected as a duplicate: the check
   sorts the names (O(n log n)), where comparing every pair stalled for hours. */
START_TEST(million_tensor_duplicate_rejected)
{
    enum { N = 1000000 };
    char p[4300], name[16];
    snprintf(p, sizeof(p), "%s/step-000000000008", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    fmt_manifest m = {.version = FMT_VERSION, .step = 8, .rank = 0, .world = 1, .nonce = 42, .io_path = "buffered", .n = N};
    ck_assert_ptr_nonnull(m.t = calloc(N, sizeof(*m.t)));
    for (size_t i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "t%07zu", i + 1 < N ? i : i - 1);
        m.t[i] = (fmt_tensor){.name = strdup(name), .dtype = RK_U8, .ndim = 1, .order = (uint32_t)i};
    }
    snprintf(p, sizeof(p), "%s/step-000000000008/shard-0.h5", dir);
    ck_assert_int_eq(th_write_file(p, "not parsed", 10), 0);
    ck_assert_int_eq(fmt_file_sum_of(p, &m, &m.file), 0);
    snprintf(p, sizeof(p), "%s/step-000000000008/index.h5", dir);
    ck_assert_int_eq(th_write_file(p, "never parsed: the manifest fails first", 38), 0);
    snprintf(p, sizeof(p), "%s/step-000000000008/shard-0.ok", dir);
    ck_assert_int_eq(fmt_manifest_write(p, &m), 0);
    fmt_manifest *shards[] = {&m};
    snprintf(p, sizeof(p), "%s/step-000000000008", dir);
    ck_assert_int_eq(fmt_commit_write(p, 8, 1, shards, "buffered", 1), 0);
    for (size_t i = 0; i < N; i++)
        free(m.t[i].name);
    free(m.t);
    EXPECT("verify \"$D\" --step 8", 1, "tensor 't0999998' appears twice");
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
    tcase_add_test(tc, flipped_hdf5_metadata_is_corrupt);
    tcase_add_test(tc, format_1_still_read);
    tcase_add_test(tc, million_tensor_duplicate_rejected);
    suite_add_tcase(s, tc);
    return th_main(s);
}
