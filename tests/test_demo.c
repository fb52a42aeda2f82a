/*
 * tests/test_demo.c - `make demo`'s script, scripts/demo, run as a newcomer runs it: it must
 * show the recovery it promises every time, whatever the machine's speed, and say so and
 * exit non-zero when a run shows none. Each case starts the real script (rekindle run,
 * 4 rk-train workers) in a directory of its own (TMPDIR).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { DEMO_BOUND_S = 240 };

/* Runs `ENV scripts/demo BUILD` (with `before` and `after` shell around it) and returns
   its exit status; its output in *out. */
static int demo(const char *env, const char *before, const char *after, char **out)
{
    const char *build = getenv("RK_TEST_BUILD"), *src = getenv("RK_TEST_SRC");
    char *dir = th_tmpdir("demo"), cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s TMPDIR=%s %s %s/scripts/demo %s 2>&1; rc=$?; %s exit $rc", before, dir, env,
             src ? src : ".", build ? build : "build", after);
    int rc = th_sh(cmd, DEMO_BOUND_S, out);
    th_rmrf(dir);
    free(dir);
    return rc;
}

/* A run that shows no recovery (here the kill's step lies past the job's end, so nothing
   is killed and the job ends at world 4, as a kill that came after the workers finished
   would leave it) is said in one line and exits 1, never "finished (exit 0)". */
START_TEST(demo_without_recovery_fails)
{
    char *out = NULL;
    int rc = demo("RK_DEMO_STEPS=60 RK_DEMO_KILL_AT=100000", "", "", &out);
    ck_assert_msg(rc == 1 && strstr(out, "demo: FAILED: the job finished but showed no recovery") &&
                      strstr(out, "no recovery shown: no worker was killed") && !strstr(out, "finished (exit 0)"),
                  "exit %d (want 1):\n%s", rc, out);
    free(out);
}
END_TEST

/* Beside twice as many busy loops as the machine has cores (the job's 600 steps take
   about 2 s on an idle one, and its output comes late), the kill still lands at step 200
   (a third of the way) and the demo shows the recovery: rank 2 declared dead, the ring of
   3 rebuilt, the survivors resumed at step 200, the job ended at world 3. */
START_TEST(demo_under_load_shows_recovery)
{
    char *out = NULL;
    int rc = demo("", "pids=; for i in $(seq $((2 * $(nproc)))); do (while :; do :; done) & pids=\"$pids $!\"; done;",
                  "kill $pids;", &out);
    ck_assert_msg(rc == 0 && strstr(out, ">> step 200: killed worker rank 2") &&
                      strstr(out, "detection : peer_dead of rank 2") && strstr(out, "new ring  : epoch 2, world 3") &&
                      strstr(out, "resume    : step 200 from") && strstr(out, "final step=600 world=3 ") &&
                      strstr(out, "demo: finished (exit 0)"),
                  "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

static Suite *demo_suite(void)
{
    Suite *s = suite_create("demo");
    TCase *tc = tcase_create("demo");
    tcase_set_timeout(tc, DEMO_BOUND_S + 30);
    tcase_add_test(tc, demo_without_recovery_fails);
    tcase_add_test(tc, demo_under_load_shows_recovery);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(demo_suite());
}
