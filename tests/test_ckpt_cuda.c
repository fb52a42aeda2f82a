/*
 * tests/test_ckpt_cuda.c - checkpoints of CUDA device tensors (RK_DEVICE, docs/GPU.md) on
 * a GPU, through tests/prog_ckpt_cuda.c: one tensor of every dtype (odd sizes, a scalar,
 * a 2-D one) snapshotted from the device, persisted (the files' bytes are the device's),
 * restored into the device by rk_resume, and rolled back after a rank's loss from the
 * survivors' memory and from disk; every comparison is bit for bit against the bytes
 * copied back with a plain cudaMemcpy. Needs a CUDA GPU: without one the suite is skipped
 * (exit 77, reported SKIP); scripts/gpu-check runs it where there is one. The same
 * pipeline on host tensors (the host copy engine) is tested in every build: test_ckpt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rekindle.h"

static char *prog(void)
{
    char *p = th_prog("prog_ckpt_cuda");
    ck_assert(p);
    return p;
}

static int count_lines(const char *out, const char *tag)
{
    int n = 0;
    for (const char *q = out; (q = strstr(q, tag)); q++)
        n += q == out || q[-1] == '\n';
    return n;
}

/* Checkpoints 1 and 2 written from the device and read back from the files, then a second
   process restores checkpoint 2 into its device tensors. */
START_TEST(persist_then_restore)
{
    char *dir = th_tmpdir("ckpt_cuda"), env0[512], *p = prog(), *out = NULL;
    snprintf(env0, sizeof(env0), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env0, "RK_CKPT_EVERY=1", NULL};
    char *a1[] = {p, "persist", NULL};
    int rc = th_run(a1, env, 120, &out);
    ck_assert_msg(rc == 0 && count_lines(out, "ok persist ") == 1, "persist exit %d:\n%s", rc, out);
    free(out);
    char *a2[] = {p, "restore", NULL};
    rc = th_run(a2, env, 120, &out);
    ck_assert_msg(rc == 0 && count_lines(out, "ok restore") == 1, "restore exit %d:\n%s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
    free(p);
}
END_TEST

/* A snapshot at every step, a checkpoint every 4th, the steps (a few ms) far shorter than
   the disk writes (64 MiB each): a snapshot-only step finds the writer still reading the
   older region, and the held snapshot takes a third staging region (ckpt/snapshot.h S6), pinned
   too (seen in the debug log: RK_LOG=debug); every checkpoint left holds its step's bytes.
   (A checkpoint due waits for the one before, so with one at every step no third region
   is needed: seen on CPUs.) */
START_TEST(generations_with_a_third_region)
{
    char *dir = th_tmpdir("ckpt_cuda_gen"), env0[512], *p = prog(), *out = NULL;
    snprintf(env0, sizeof(env0), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env0, "RK_CKPT_EVERY=4", "RK_LOG=debug", "RK_LOG_SUBSYS=ckpt", NULL};
    char *a[] = {p, "generations", NULL};
    int rc = th_run(a, env, 120, &out);
    /* The debug log is long: the message (Check's limit is a few KiB) names its last lines. */
    size_t len = strlen(out);
    ck_assert_msg(rc == 0 && count_lines(out, "ok generations ") == 1, "generations exit %d, its output ends:\n%s", rc,
                  out + (len > 1500 ? len - 1500 : 0));
    int most = 0;
    for (int k = 1; k <= 3; k++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "(%d regions pinned)", k);
        if (strstr(out, tag))
            most = k;
    }
    const char *ok = strstr(out, "ok generations ");
    printf("ckpt_cuda generations: %.*s; at most %d staging regions pinned\n", (int)strcspn(ok, "\n"), ok, most);
    ck_assert_msg(most == 3 && !strstr(out, "(4 regions pinned)") && !strstr(out, "cannot pin"),
                  "at most %d staging regions pinned, want 3 (%.*s)", most, (int)strcspn(ok, "\n"), ok);
    free(out);
    th_rmrf(dir);
    free(dir);
    free(p);
}
END_TEST

/* Three ranks; rank 1 dies after the survivors' update of step 4: they roll their device
   tensors back to the snapshot of step 4, held in memory only (no checkpoint is due before
   step 1000), and train on. */
START_TEST(rollback_from_memory)
{
    char *dir = th_tmpdir("ckpt_cuda_mem"), env0[512], *p = prog(), *out = NULL;
    snprintf(env0, sizeof(env0), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env0, "RK_CKPT_EVERY=1000", "RK_TIMEOUT_MS=8000", NULL};
    char *args[] = {"rollback", "1", NULL};
    int rc = th_mpirun_prog(3, true, p, args, env, 180, &out);
    ck_assert_msg(out && !strstr(out, "FAIL") && count_lines(out, "ok rollback next=4 world=2") == 2 &&
                      count_lines(out, "ok trained on") == 2,
                  "exit %d:\n%s", rc, out ? out : "");
    free(out);
    th_rmrf(dir);
    free(dir);
    free(p);
}
END_TEST

/* The same with RK_ROLLBACK=disk and a checkpoint every two steps: the device tensors
   come back from the newest committed checkpoint (step 4, or 2 if 4's write had not
   committed when the rank died). */
START_TEST(rollback_from_disk)
{
    char *dir = th_tmpdir("ckpt_cuda_disk"), env0[512], *p = prog(), *out = NULL;
    snprintf(env0, sizeof(env0), "RK_CKPT_DIR=%s", dir);
    const char *env[] = {env0, "RK_CKPT_EVERY=2", "RK_ROLLBACK=disk", "RK_TIMEOUT_MS=8000", NULL};
    char *args[] = {"rollback", "1", NULL};
    int rc = th_mpirun_prog(3, true, p, args, env, 180, &out);
    int n = count_lines(out ? out : "", "ok rollback next=4 world=2") +
            count_lines(out ? out : "", "ok rollback next=2 world=2");
    ck_assert_msg(out && !strstr(out, "FAIL") && n == 2 && count_lines(out, "ok trained on") == 2, "exit %d:\n%s",
                  rc, out ? out : "");
    free(out);
    th_rmrf(dir);
    free(dir);
    free(p);
}
END_TEST

int main(void)
{
    char why[160];
    if (!th_have_gpu(why, sizeof(why)))
        th_skip_suite(why);
    Suite *s = suite_create("ckpt_cuda");
    TCase *tc = tcase_create("device");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, persist_then_restore);
    tcase_add_test(tc, generations_with_a_third_region);
    tcase_add_test(tc, rollback_from_memory);
    tcase_add_test(tc, rollback_from_disk);
    suite_add_tcase(s, tc);
    return th_main(s);
}
