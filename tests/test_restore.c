/*
 * tests/test_restore.c - rk_resume of a checkpoint on disk, with real processes
 * (tests/prog_ckpt) alone and under mpirun: damage skipped for the one before (ckpt/writer.c
 * W4, ckpt.c J3), another set of tensors refused, a failed restore that leaves the buffers
 * as they were (ckpt/snapshot.h S3), RK_RESTORE=inplace (S12), and the replicated tensors
 * the ranks of a host read through the page cache (formats/fmt_read.c S1; a read failing
 * in the middle on one rank: both fall back). The reads
 * themselves are tests/test_read.c's; writing and retention tests/test_ckpt.c's.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_prog.h"

/* W4/J3 on the reading side: a bit flip, a truncated shard, a foreign index: each
   newest checkpoint is skipped and the previous one restored. */
START_TEST(corruption_falls_back)
{
    const char *damage[] = {"flip", "truncate", "foreign"};
    for (size_t k = 0; k < RK_ARRAY_LEN(damage); k++) {
        char *dir = th_tmpdir("bad"), p[4300];
        RUN_OK(1, dir, "write", "5", NULL, NULL);
        if (k == 0) {
            snprintf(p, sizeof(p), "%s/" S4 "/shard-0.h5", dir);
            th_flip_byte(p, 1048576 + 10); /* raw data starts after the 1 MiB metadata block */
        } else if (k == 1) {
            snprintf(p, sizeof(p), "%s/" S4 "/shard-0.h5", dir);
            ck_assert_int_eq(truncate(p, 1048576 + 100), 0);
        } else {
            snprintf(p, sizeof(p), "%s/" S4 "/index.h5", dir);
            ck_assert_int_eq(th_write_file(p, "not an HDF5 file at all\n", 24), 0);
        }
        RUN_OK(1, dir, "resume", "2", NULL, NULL);
        th_rmrf(dir);
        free(dir);
    }
}
END_TEST

/* The same on the O_DIRECT read path of large tensors (np 0 adds a 16 MiB + 12 B tensor,
   most of the shard): a bit flip in its middle and a shard cut inside it are both found,
   and the previous checkpoint is restored. */
START_TEST(corruption_of_large_tensor_falls_back)
{
    for (int k = 0; k < 2; k++) {
        char *dir = th_tmpdir("bigbad"), p[4300];
        RUN_OK(0, dir, "write", "5", NULL, NULL);
        snprintf(p, sizeof(p), "%s/" S4 "/shard-0.h5", dir);
        struct stat sb;
        ck_assert_int_eq(stat(p, &sb), 0);
        if (k == 0)
            th_flip_byte(p, sb.st_size / 2);
        else
            ck_assert_int_eq(truncate(p, sb.st_size - 4 * 1048576), 0);
        RUN_OK(0, dir, "resume", "2", NULL, NULL);
        th_rmrf(dir);
        free(dir);
    }
}
END_TEST

/* Each rank's reader's line for its restore of step 4 in out: how many of its bytes it read
   straight (O_DIRECT into staging) and through the page cache, summed over the ranks. */
static void restore_ways(const char *out, unsigned long long *straight, unsigned long long *buffered)
{
    *straight = *buffered = 0;
    for (const char *l = out; (l = strstr(l, "bytes straight ")) != NULL; l++) {
        unsigned long long a = 0, b = 0, c = 0;
        ck_assert_int_eq(sscanf(l, "bytes straight %llu, bounce %llu, buffered %llu", &a, &b, &c), 3);
        *straight += a;
        *buffered += c;
    }
}

/* ckpt.h shared_reads (formats/fmt_read.c S1): two ranks of one host restore the same
   replicated tensors, the 16 MiB one too, through the page cache (nothing straight, the
   disk read once between them), cold, staged and inplace, every byte checked; the
   newest damaged in its large tensor: both fall back to the one before. One rank alone
   reads straight, as before. */
START_TEST(two_ranks_of_a_host_share_replicated_reads)
{
    char *dir = th_tmpdir("shared"), p[4300], *out = NULL, *argv[] = {prog, "write", "5", "7", "big", NULL};
    const char *const *env = env_for(dir, "RK_LOG=debug", NULL);
    ck_assert_int_eq(th_mpirun(2, argv, env, 90, &out), 0);
    free(out);
    unsigned long long straight, buffered;
    for (int k = 0; k < 3; k++) {
        char cmd[4400];
        snprintf(cmd, sizeof(cmd), "for f in '%s'/" S4 "/*; do dd if=$f iflag=nocache count=0 status=none; done", dir);
        ck_assert_int_eq(th_sh(cmd, 10, NULL), 0);
        argv[1] = "resume";
        argv[2] = "4";
        env = env_for(dir, "RK_LOG=debug", k == 1 ? "RK_RESTORE=inplace" : NULL);
        int rc = k < 2 ? th_mpirun(2, argv, env, 90, &out) : th_run(argv, env, 60, &out);
        ck_assert_msg(rc == 0 && strstr(out, "resumed 4"), "exit %d: %s", rc, out);
        restore_ways(out, &straight, &buffered);
        if (k < 2)
            ck_assert_msg(straight == 0 && buffered >= 2ull * 16 * 1024 * 1024, "%d: straight %llu, buffered %llu: %s",
                          k, straight, buffered, out);
        else
            ck_assert_msg(straight >= 16ull * 1024 * 1024, "one rank: straight %llu: %s", straight, out);
        free(out);
    }
    char cmd[4400], *off = NULL;
    snprintf(cmd, sizeof(cmd), "awk '$1==\"t\" && $NF==\"big\" {print FILENAME, $(NF-2)}' '%s'/" S4 "/shard-*.ok", dir);
    ck_assert_int_eq(th_sh(cmd, 10, &off), 0);
    char okfile[4300];
    long at = 0;
    ck_assert_msg(off && sscanf(off, "%4299s %ld", okfile, &at) == 2, "no tensor big: %s", off ? off : "");
    free(off);
    snprintf(p, sizeof(p), "%.*s.h5", (int)(strlen(okfile) - 3), okfile);
    th_flip_byte(p, at + 8 * 1024 * 1024);
    argv[2] = "2";
    int rc = th_mpirun(2, argv, env_for(dir, NULL, NULL), 90, &out);
    ck_assert_msg(rc == 0 && strstr(out, "rank 0 resumed 2") && strstr(out, "rank 1 resumed 2"), "exit %d: %s", rc,
                  out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S1 and ckpt/snapshot.h S14 with a fault in the middle: two ranks of a host restore step
   4 (every tensor replicated and host memory: checked whole through the page cache, then
   read into the buffers), rank 1's reads failing with EIO (RK_FAULT read@K=eio on rank 1
   alone, in the 16 MiB tensor, the last read of a pass): at the check's, rank 1's restore
   of step 4 fails naming that tensor, at the second read's, the log says the step changed
   or became unreadable between its check and its read; either way both restore step 2
   whole: a checkpoint one rank could not read is no rank's. Then step 2 alone on disk: a
   fault in its check fails rk_resume with every buffer as it was (S3's promise), one in
   its second read fails it saying so. */
START_TEST(shared_read_fault_falls_back)
{
    char *dir = th_tmpdir("sharedflt"), *out = NULL, sh[4400], cmd[4400];
    char *argv[] = {prog, "write", "5", "7", "big", NULL}, *wrap[] = {"/bin/sh", "-c", sh, NULL};
    ck_assert_int_eq(th_mpirun(2, argv, env_for(dir, NULL, NULL), 90, &out), 0);
    free(out);
    unsigned long long reads = 0, at[4] = {1000000ull};
    const char *between = "between its check and its read";
    for (int k = 0; k < 5; k++) {
        const char *step = k < 3 ? S4 : S2, *mode = k == 0 ? "resume 4" : k < 3 ? "resume 2" : "untouched 0";
        char fault[64];
        if (k == 3) { /* step 2 alone: its reads counted as step 4's (the same tensors) */
            argv[2] = "3";
            th_rmrf(dir);
            ck_assert_int_eq(th_mpirun(2, argv, env_for(dir, NULL, NULL), 90, &out), 0);
            free(out);
        }
        snprintf(fault, sizeof(fault), "RK_FAULT=read@%llu=eio", k == 0 ? at[0] : k % 2 ? reads / 2 - 2 : reads - 2);
        snprintf(sh, sizeof(sh), "[ \"$OMPI_COMM_WORLD_RANK\" = 1 ] || unset RK_FAULT; exec '%s' %s 7 big", prog, mode);
        snprintf(cmd, sizeof(cmd), "for f in '%s'/%s/*; do dd if=$f iflag=nocache count=0 status=none; done", dir, step);
        ck_assert_int_eq(th_sh(cmd, 10, NULL), 0);
        char path[64];
        snprintf(path, sizeof(path), "RK_FAULT_PATH=/%s/", step);
        int rc = th_mpirun(2, wrap, env_for(dir, fault, path), 90, &out);
        const char *ops = out ? strstr(out, "rank 1 ops") : NULL, *r = ops ? strstr(ops, " read=") : NULL;
        if (k == 0) {
            ck_assert_msg(rc == 0 && strstr(out, "rank 1 resumed 4") && r && sscanf(r, " read=%llu", &reads) == 1 &&
                              reads > 8 && reads % 2 == 0, /* the check's reads, then as many into the buffers */
                          "exit %d: %s", rc, out ? out : "");
        } else if (k < 3) {
            ck_assert_msg(rc == 0 && strstr(out, "rank 0 resumed 2") && strstr(out, "rank 1 resumed 2") &&
                              strstr(out, "reading tensor 'big'") && (k == 1) == !strstr(out, between),
                          "%d: read@%s on rank 1: exit %d: %s", k, fault, rc, out ? out : "");
        } else {
            ck_assert_msg(rc == 0 && strstr(out, "rank 0 resume: -1008 ") && strstr(out, "rank 1 resume: -1008 ") &&
                              (k == 3 ? strstr(out, "rank 0 resume: -1008 next 0 untouched 1") &&
                                            strstr(out, "rank 1 resume: -1008 next 0 untouched 1") && !strstr(out, between)
                                      : strstr(out, between) != NULL),
                          "%d: read@%s on rank 1: exit %d: %s", k, fault, rc, out ? out : "");
        }
        free(out);
    }
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* ckpt/snapshot.h S12, RK_RESTORE=inplace (rk_resume straight into the registered
   buffers): every byte of every dtype and of the 16 MiB tensor restored, cold and warm;
   training goes on from it (the first snapshot after it is taken from the buffers and the
   next checkpoint restores right); the newest damaged in its large tensor: the one before
   is restored; two ranks, rank 1's shard of the newest damaged: rank 0 read it into its
   buffers, and both restore the one before all the same; a bad value of RK_RESTORE is
   refused by name. */
START_TEST(inplace_restores_falls_back_and_trains_on)
{
    const char *ip = "RK_RESTORE=inplace";
    char *dir = th_tmpdir("inplace"), p[4300], *out = NULL;
    RUN_OK(0, dir, "write", "5", NULL, NULL);
    snprintf(p, sizeof(p), "%s/" S4 "/shard-0.h5", dir);
    for (int warm = 0; warm < 2; warm++) {
        int fd = open(p, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        posix_fadvise(fd, 0, 0, warm ? POSIX_FADV_WILLNEED : POSIX_FADV_DONTNEED);
        close(fd);
        int rc = run_prog(0, dir, "resume", "4", ip, "RK_LOG=info", &out);
        ck_assert_msg(rc == 0 && strstr(out, "read straight into the registered buffers"), "exit %d: %s", rc, out);
        free(out);
    }
    RUN_OK(0, dir, "continue", "7", ip, "RK_SNAPSHOT_EVERY=1"); /* from 4: 6 committed */
    RUN_OK(0, dir, "resume", "6", NULL, NULL);
    snprintf(p, sizeof(p), "%s/step-000000000006/shard-0.h5", dir);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    th_flip_byte(p, sb.st_size / 2);
    int rc = run_prog(0, dir, "resume", "4", ip, "RK_LOG=warn", &out);
    ck_assert_msg(rc == 0 && strstr(out, "checksum mismatch"), "exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);

    dir = th_tmpdir("inplace2");
    RUN_OK(2, dir, "write", "5", NULL, NULL);
    char cmd[4400], *off = NULL; /* the first tensor of more than 16 bytes that rank 1 wrote */
    snprintf(cmd, sizeof(cmd), "awk '$1==\"t\" && $(NF-3)>16 {print $(NF-2); exit}' '%s/" S4 "/shard-1.ok'", dir);
    ck_assert_int_eq(th_sh(cmd, 10, &off), 0);
    ck_assert_msg(off && atol(off) > 0, "rank 1 wrote no tensor of more than 16 bytes: %s", off ? off : "");
    snprintf(p, sizeof(p), "%s/" S4 "/shard-1.h5", dir);
    th_flip_byte(p, atol(off) + 8);
    free(off);
    rc = run_prog(2, dir, "resume", "2", ip, "RK_LOG=info", &out);
    const char *said = out ? strstr(out, "read straight into the registered buffers") : NULL;
    ck_assert_msg(rc == 0 && strstr(out, "rank 0 resumed 2") && strstr(out, "rank 1 resumed 2") && said &&
                      strstr(said + 1, "read straight into the registered buffers"), /* by both ranks */
                  "exit %d: %s", rc, out);
    free(out);
    rc = run_prog(1, dir, "resume", "2", "RK_RESTORE=direct", NULL, &out);
    ck_assert_msg(rc != 0 && strstr(out, "RK_RESTORE='direct'") && strstr(out, "staged or inplace"),
                  "exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Restore of another set of tensors: RK_E_MISMATCH, buffers untouched. */
START_TEST(mismatch_is_clear)
{
    char *dir = th_tmpdir("mm"), *out = NULL;
    RUN_OK(1, dir, "write", "3", NULL, NULL);
    int rc = run_prog(1, dir, "other", "0", NULL, NULL, &out);
    ck_assert_msg(rc == 0 && strstr(out, "resume: RK_E_MISMATCH") && strstr(out, "untouched 1") &&
                      strstr(out, "weights/f32"),
                  "exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S3: the only checkpoint fails its checksum at a tensor read after others (k > 0):
   rk_resume reports it and the caller's buffers are bitwise as before, never half
   restored (the restore reads into staging, and copies out only once all of it verified). */
START_TEST(corrupt_only_checkpoint_leaves_buffers)
{
    char *dir = th_tmpdir("only"), p[4300], *out = NULL;
    RUN_OK(1, dir, "write", "3", NULL, NULL);
    snprintf(p, sizeof(p), "%s/" S2 "/shard-0.h5", dir);
    th_flip_byte(p, tensor_offset(dir, S2, "bytes") + 5); /* tensor 6 of 9 */
    resume_untouched(dir, NULL, &out);
    ck_assert_msg(strstr(out, "resume: -1008 ") || strstr(out, "next 0 "), "%s", out); /* RK_E_CORRUPT or fresh */
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("restore");
    TCase *tc = tcase_create("resume");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, corruption_falls_back);
    tcase_add_test(tc, corruption_of_large_tensor_falls_back);
    tcase_add_test(tc, inplace_restores_falls_back_and_trains_on);
    tcase_add_test(tc, two_ranks_of_a_host_share_replicated_reads);
    tcase_add_test(tc, shared_read_fault_falls_back);
    tcase_add_test(tc, mismatch_is_clear);
    tcase_add_test(tc, corrupt_only_checkpoint_leaves_buffers);
    suite_add_tcase(s, tc);
    return th_main(s);
}
