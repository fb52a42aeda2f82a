/*
 * tests/test_hosts.c - real jobs across hosts: 3 hosts made by scripts/hosts (network
 * namespaces joined by a bridge; Open MPI's TCP transport between them, the detector on
 * their addresses, checkpoints on a directory every host sees), 2 workers per host,
 * judged by the chaos harness's oracles, the bitwise replay among them (chaos/run
 * --hosts 3). One job loses a whole host (every process of it SIGKILLed at once), one has
 * a host cut off by iptables for a few seconds: the majority goes on in place, the cut-off
 * workers stop and commit nothing. An elastic job (rekindle run --host-discovery-script)
 * loses a host and grows back to its size when the host is listed again. A job whose
 * every worker is on hosts that freeze while mpirun's host lives on is ended by the
 * launcher from the workers' silent beats.
 *
 * The suite is skipped (exit 77, with the reason) where network namespaces cannot be made
 * (not root, no CAP_SYS_ADMIN) or iptables is missing. chaos/run removes its hosts
 * whatever happens to the run (and on SIGINT/SIGTERM); each case removes them again
 * before it ends, in case the harness itself was killed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "harness.h"

enum { CAMPAIGN_TIMEOUT_S = 100 };

static const char *src_dir(void)
{
    const char *s = getenv("RK_TEST_SRC");
    return s ? s : ".";
}

/* Skips the suite where scripts/hosts cannot make hosts or the faults cannot be made. */
static void need_hosts(void)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd), "RK_HOSTS_PREFIX=rkt RK_HOSTS_NET=10.79.0 %s/scripts/hosts check", src_dir());
    if (th_sh(cmd, 30, &out) != 0) {
        char why[512];
        snprintf(why, sizeof(why), "network namespaces cannot be made here: %s", out ? out : "");
        why[strcspn(why, "\n")] = '\0';
        th_skip_suite(why);
    }
    free(out);
    out = NULL;
    if (th_sh("command -v iptables && /usr/bin/python3 -c 'import h5py'", 30, &out) != 0)
        th_skip_suite("iptables or Debian's python3-h5py is missing (scripts/install-deps installs them)");
    free(out);
}

/* Runs one chaos campaign of `kind` on 3 hosts; it must end with 1 run, 1 fault and no
   violation, and its output must contain `want`. */
static void hosts_campaign(const char *kind, int seed, const char *want)
{
    need_hosts();
    const char *build = getenv("RK_TEST_BUILD");
    char *dir = th_tmpdir("hosts");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "RK_HOSTS_PREFIX=rkt RK_HOSTS_NET=10.79.0 %s/chaos/run --build %s --out %s --workers 6 --hosts 3 "
             "--steps 200 --hidden 128 --ckpt-every 20 --run-timeout 45 --no-install --runs 1 --seed %d "
             "--faults %s",
             src_dir(), build ? build : "build", dir, seed, kind);
    int rc = th_sh(cmd, CAMPAIGN_TIMEOUT_S, &out);
    char down[1024], *dout = NULL;
    snprintf(down, sizeof(down), "RK_HOSTS_PREFIX=rkt RK_HOSTS_NET=10.79.0 %s/scripts/hosts down", src_dir());
    th_sh(down, 60, &dout);
    free(dout);
    int r = -1, f = -1, v = -1;
    bool got = th_chaos_summary(out, &r, &f, &v) == 0;
    ck_assert_msg(got && rc == 0 && r == 1 && f == 1 && v == 0, "exit %d, runs %d faults %d violations %d:\n%.4000s",
                  rc, r, f, v, out ? out : "");
    ck_assert_msg(strstr(out, want), "no '%s' in the campaign's output:\n%.3000s", want, out);
    free(out);
    free(dir);
}

/* Every process of one host SIGKILLed at once (Open MPI's daemon included): the other two
   hosts' workers finish in place on a world of 4 with the replay's hash, and
   `rekindle run` ends (mpirun alone would wait for the lost host for ever). */
START_TEST(host_loss_survived)
{
    hosts_campaign("host_loss", 1, "host_loss rkt");
}
END_TEST

/* One host cut off from the others for seconds: the majority goes on in place with the
   replay's hash; the cut-off workers stop (never exit 0) and commit nothing after it. */
START_TEST(partition_majority_goes_on)
{
    hosts_campaign("partition", 1, "partition rkt");
}
END_TEST

/* An elastic job on 3 hosts (rekindle run --host-discovery-script listing all three, one
   slot each) loses a host whole: the two others go on in place; the launcher counts the
   lost worker's host out for its cool-down (learned from its wrapper's silent beat: the
   wrapper died with the host), then it is listed again and the job grows back to 3 at its
   next checkpoint, with the bits of a replay on 3, then 2, then 3 workers. */
START_TEST(host_lost_and_back)
{
    need_hosts();
    th_elastic_grows_back(TH_LOSE_HOST, true, "--seed 8 --hidden 32", "host rke2 lost worker 1: no growth onto it");
}
END_TEST

/* run_loop.c L2, L3: every worker on two hosts (mpirun on this one, outside them), each
   host frozen whole (every process SIGSTOPped: no record, no beat, and mpirun, its
   connections to the frozen daemons still open, never ends): the launcher, which has read
   their beats, stops mpirun once none has shown a sign of life for its bound and says
   why, with a failed job's status. (Before: with no record at all, it waited for mpirun
   for ever.) */
START_TEST(all_workers_silent_launcher_ends)
{
    need_hosts();
    const char *build = getenv("RK_TEST_BUILD");
    char *w = th_tmpdir("hosts-silent"), cmd[4096], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "H='env RK_HOSTS_PREFIX=rkv RK_HOSTS_NET=10.86.0 %s/scripts/hosts'; B=%s; W=%s\n"
             "$H up 2 $W/hosts 1 >/dev/null || { echo 'hosts up failed'; exit 90; }\n"
             "eval \"$($H env)\"\n"
             "RK_RUN_DIR=$W/run $B/bin/rekindle run -n 2 --hostfile $W/hosts -- $B/tests/prog_run hang $W "
             ">$W/launcher.log 2>&1 &\n"
             "L=$!\n"
             "for i in $(seq 600); do [ -s $W/pid-0 ] && [ -s $W/pid-1 ] && break; sleep 0.1; done\n"
             "sleep 1\n" /* the launcher has read a beat of each */
             "for h in rkv1 rkv2; do for p in $(ip netns pids $h); do kill -STOP $p; done; done\n"
             "wait $L; echo \"exit=$?\"\n"
             "cat $W/launcher.log\n",
             src_dir(), build ? build : "build", w);
    int rc = th_sh(cmd, 90, &out);
    char down[1024], *dout = NULL;
    snprintf(down, sizeof(down), "RK_HOSTS_PREFIX=rkv RK_HOSTS_NET=10.86.0 %s/scripts/hosts down", src_dir());
    th_sh(down, 60, &dout);
    free(dout);
    ck_assert_msg(rc == 0 && out && !strstr(out, "exit=0\n") && strstr(out, "exit="),
                  "the launcher did not end (th_sh %d):\n%s", rc, out ? out : "");
    ck_assert_msg(strstr(out, "no worker has recorded its end and none has shown a sign of life for 5000 ms"),
                  "the stop is not explained:\n%s", out);
    free(out);
    th_rmrf(w);
    free(w);
}
END_TEST

static Suite *hosts_suite(void)
{
    Suite *s = suite_create("hosts");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, CAMPAIGN_TIMEOUT_S + 30);
    tcase_add_test(tc, host_loss_survived);
    tcase_add_test(tc, partition_majority_goes_on);
    tcase_add_test(tc, host_lost_and_back);
    suite_add_tcase(s, tc);
    TCase *silent = tcase_create("silent");
    tcase_set_timeout(silent, 150);
    tcase_add_test(silent, all_workers_silent_launcher_ends);
    suite_add_tcase(s, silent);
    return s;
}

int main(void) { return th_main(hosts_suite()); }
