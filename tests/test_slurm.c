/*
 * tests/test_slurm.c - a Rekindle job under a real Slurm: examples/slurm/train.sbatch
 * submitted with sbatch to the cluster scripts/slurm makes (Debian's slurmctld and munge
 * in the root namespace, one slurmd per network-namespace host, 3 nodes x 2 workers),
 * `rekindle run` inside the allocation, Open MPI's daemons started by srun. chaos/slurm
 * drives each case and judges it by the final hash against a replay: one node fails (its
 * slurmd and every process on it SIGKILLed) and the survivors finish in place while Slurm
 * marks it DOWN; the node that runs the job script fails alone, and the script's
 * batch-host watchers requeue the job that Slurm (with --no-kill) would leave RUNNING
 * without its script, which runs again and resumes from the newest checkpoint. Two cases
 * are left to be run by hand, to keep make check within its time: the fault-free one
 * (every case runs the job to its end; `chaos/slurm --case complete`) and every node
 * failing at once (Slurm's own --requeue, then the same run again and resume from disk
 * as the batch host's loss; `chaos/slurm --case requeue`).
 *
 * Skipped (exit 77, with the reason) where network namespaces cannot be made or Slurm or
 * munge is not installed (scripts/install-deps installs them). The cluster is taken down
 * by chaos/slurm whatever happens, and again by each case before it ends.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* For scripts/slurm check (which makes no cluster): a prefix of its own. The clusters of
   the cases have theirs (claim_cluster: ru<i>n on 10.82.<i>), so the hosts of test_hosts
   (rkt), of a user's scripts/slurm (rks) and of another test run may exist meanwhile. */
#define SLURM_ENV "RK_HOSTS_PREFIX=rku RK_HOSTS_NET=10.82.0"

enum { CASE_TIMEOUT_S = 150, CLUSTER_SLOTS = 40 };

/* Each case's cluster has a prefix and network no other running case has (two test runs
   on one machine would otherwise take each other's cluster down): slot i is claimed by
   making the directory /tmp/rekindle-slurm-claim-<i> (atomic) with the claimer's pid in
   it, or by taking over one whose claimer is gone. Fills env with its settings; returns
   the claim's directory (released by release_cluster), NULL if all are taken. */
static char *claim_cluster(char *env, size_t cap)
{
    for (int i = 0; i < CLUSTER_SLOTS; i++) {
        char *dir = NULL, pidfile[256], *held;
        if (asprintf(&dir, "/tmp/rekindle-slurm-claim-%d", i) < 0)
            return NULL;
        snprintf(pidfile, sizeof(pidfile), "%s/pid", dir);
        bool mine = mkdir(dir, 0700) == 0;
        if (!mine && errno == EEXIST && (held = th_read_file(pidfile, NULL)) != NULL) {
            long pid = atol(held);
            mine = pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH; /* its claimer is gone */
            free(held);
        }
        char me[32];
        int n = snprintf(me, sizeof(me), "%ld\n", (long)getpid());
        if (mine && th_write_file(pidfile, me, (size_t)n) == 0) {
            /* "n" ends the prefix: the hosts of ru1n are ru1n1..., never those of ru11n */
            snprintf(env, cap, "RK_HOSTS_PREFIX=ru%dn RK_HOSTS_NET=10.82.%d", i, i);
            return dir;
        }
        free(dir);
    }
    return NULL;
}

static void release_cluster(char *dir)
{
    char pidfile[256];
    snprintf(pidfile, sizeof(pidfile), "%s/pid", dir);
    unlink(pidfile);
    rmdir(dir);
    free(dir);
}

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
    const char *build = getenv("RK_TEST_BUILD");
    char env[128];
    char *claim = claim_cluster(env, sizeof(env));
    ck_assert_msg(claim != NULL, "all %d cluster slots (/tmp/rekindle-slurm-claim-*) are held by running processes",
                  CLUSTER_SLOTS);
    char *dir = th_tmpdir("slurm");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s %s/chaos/slurm --build %s --out %s --case %s --steps %d --timeout 60 %s", env,
             src_dir(), build ? build : "build", dir, which, steps, extra);
    int rc = th_sh(cmd, CASE_TIMEOUT_S, &out);
    snprintf(cmd, sizeof(cmd), "%s %s/scripts/slurm down", env, src_dir());
    char *dout = NULL;
    th_sh(cmd, 60, &dout);
    free(dout);
    release_cluster(claim);
    char want[128];
    snprintf(want, sizeof(want), "slurm: %s run 0 ok", which);
    ck_assert_msg(rc == 0 && out && strstr(out, want) && strstr(out, "slurm: 1 runs, 0 failed"), "exit %d:\n%.4000s",
                  rc, out ? out : "");
    th_rmrf(dir);
    free(dir);
    return out;
}

/* Once a checkpoint is committed, one worker of node 3 dies (the 5 others resume in
   place and train on to a commit), then node 3 fails: the 4 survivors resume in place
   (same Slurm run, same launch), the node is marked DOWN at once while the job still runs
   (scontrol, as a health check would: Slurm's own timeout takes 15 s here, which a job
   of a few hundred steps need not outlast on an idle machine; the bench and the batch
   host's case wait for it), Slurm ends the job's steps on the node (mpirun's srun of its daemons
   among them: without --no-kill on that step the survivors would die with it), and the
   job COMPLETES with the hash of a replay of its history: from scratch on 6 workers, on 5
   from the first resume, on 4 from the last (unless the last resume's step is a committed
   one: then from the job's checkpoint). (Before, the judge replayed every step before the
   last resume on 6 workers, and a correct job failed it.) */
START_TEST(node_lost_survivors_go_on)
{
    char *out = slurm_case("node_loss", 600, "--worker-first --mark-down");
    ck_assert_msg(strstr(out, "world 4") && strstr(out, "kill_to_training_ms"), "%s", out);
    free(out);
}
END_TEST

/* The job's BatchHost (the node of the script and mpirun) fails alone. Slurm, with
   --no-kill, only removes it from the job once it marks it DOWN and kills the script's
   step there: the job would stay RUNNING with nothing in it (mpirun's daemons on the other
   nodes end with it) and hold its allocation. The script's watchers on the other nodes see
   the batch host gone from the job and requeue it; the node comes back, the script runs
   again (Restarts 1, exactly one requeue), every worker resumes from disk at the newest
   commit, and the job COMPLETES with the hash of a replay from it on 6 workers. */
START_TEST(batch_node_lost_requeues)
{
    char *out = slurm_case("batch_loss", 600, "");
    ck_assert_msg(strstr(out, "world 6") && strstr(out, "requeued_to_resumed_ms"), "%s", out);
    free(out);
}
END_TEST

static Suite *slurm_suite(void)
{
    Suite *s = suite_create("slurm");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, CASE_TIMEOUT_S + 30);
    tcase_add_test(tc, node_lost_survivors_go_on);
    tcase_add_test(tc, batch_node_lost_requeues);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    need_slurm(); /* here, not in a case: a forked case's exit 77 is an error to Check, not a skip */
    return th_main(slurm_suite());
}
