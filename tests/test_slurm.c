/*
 * tests/test_slurm.c - a Rekindle job under a real Slurm: examples/slurm/train.sbatch
 * submitted with sbatch to the cluster scripts/slurm makes (Debian's slurmctld and munge
 * in the root namespace, one slurmd per network-namespace host, 3 nodes x 2 workers),
 * `rekindle run` inside the allocation, Open MPI's daemons started by srun. chaos/slurm
 * drives each case and judges it by the final hash against a replay: the job runs to its
 * end; one node fails (its slurmd and every process on it SIGKILLed) and the survivors
 * finish in place while Slurm marks it DOWN; every node fails and Slurm's --requeue runs
 * the job again, which resumes from the newest checkpoint committed before the loss.
 *
 * Skipped (exit 77, with the reason) where network namespaces cannot be made or Slurm or
 * munge is not installed (scripts/install-deps installs them). The cluster is taken down
 * by chaos/slurm whatever happens, and again by each case before it ends.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A prefix and network of their own: the hosts of test_hosts (rkt) and of a user's
   scripts/slurm (rks) may exist at the same time. */
#define SLURM_ENV "RK_HOSTS_PREFIX=rku RK_HOSTS_NET=10.82.0"

enum { CASE_TIMEOUT_S = 150 };

static const char *src_dir(void)
{
    const char *s = getenv("RK_TEST_SRC");
    return s ? s : ".";
}

static void need_slurm(void)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd), SLURM_ENV " %s/scripts/slurm check", src_dir());
    if (th_sh(cmd, 30, &out) != 0) {
        char why[512];
        snprintf(why, sizeof(why), "no Slurm cluster can be made here: %s", out ? out : "");
        why[strcspn(why, "\n")] = '\0';
        th_skip_suite(why);
    }
    free(out);
}

/* chaos/slurm --case `which` --steps `steps` `extra`: it must say "<which> run 0 ok" and
   end with no failure; its output (with the times it measured) is returned. */
static char *slurm_case(const char *which, int steps, const char *extra)
{
    need_slurm();
    const char *build = getenv("RK_TEST_BUILD");
    char *dir = th_tmpdir("slurm");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd), SLURM_ENV " %s/chaos/slurm --build %s --out %s --case %s --steps %d --timeout 60 %s",
             src_dir(), build ? build : "build", dir, which, steps, extra);
    int rc = th_sh(cmd, CASE_TIMEOUT_S, &out);
    snprintf(cmd, sizeof(cmd), SLURM_ENV " %s/scripts/slurm down", src_dir());
    char *dout = NULL;
    th_sh(cmd, 60, &dout);
    free(dout);
    char want[128];
    snprintf(want, sizeof(want), "slurm: %s run 0 ok", which);
    ck_assert_msg(rc == 0 && out && strstr(out, want) && strstr(out, "slurm: 1 runs, 0 failed"), "exit %d:\n%.4000s",
                  rc, out ? out : "");
    th_rmrf(dir);
    free(dir);
    return out;
}

/* The job runs to its end on 3 nodes and its final hash equals a fault-free run's. */
START_TEST(job_completes)
{
    free(slurm_case("complete", 300, ""));
}
END_TEST

/* Once a checkpoint is committed, one worker of node 3 dies (the 5 others resume in
   place and train on to a commit), then node 3 fails: the 4 survivors resume in place
   (same Slurm run, same launch), Slurm marks the node DOWN while the job still runs (15 s
   after the kill here: 1200 steps outlast it; that is when Slurm ends the job's steps on
   the node, mpirun's srun of its daemons among them), and the job COMPLETES with the hash
   of a replay of its history: from scratch on 6 workers, on 5 from the first resume, on
   4 from the last (unless the last resume's step is a committed one: then from the job's
   checkpoint). (Before, the judge replayed every step before the last resume on 6
   workers, and a correct job failed it.) */
START_TEST(node_lost_survivors_go_on)
{
    char *out = slurm_case("node_loss", 1200, "--worker-first");
    ck_assert_msg(strstr(out, "world 4") && strstr(out, "kill_to_training_ms"), "%s", out);
    free(out);
}
END_TEST

/* Every node fails: Slurm requeues the job, the nodes come back, the script runs again
   (SLURM_RESTART_COUNT 1) and every worker resumes from disk at the newest checkpoint
   committed before the loss; the job COMPLETES with the hash of a replay from it. */
START_TEST(allocation_lost_requeued_resumes)
{
    char *out = slurm_case("requeue", 300, "");
    ck_assert_msg(strstr(out, "world 6") && strstr(out, "requeued_to_resumed_ms"), "%s", out);
    free(out);
}
END_TEST

static Suite *slurm_suite(void)
{
    Suite *s = suite_create("slurm");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, CASE_TIMEOUT_S + 30);
    tcase_add_test(tc, job_completes);
    tcase_add_test(tc, node_lost_survivors_go_on);
    tcase_add_test(tc, allocation_lost_requeued_resumes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return th_main(slurm_suite()); }
