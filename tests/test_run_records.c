/*
 * tests/test_run_records.c - the records of `rekindle run` (tools/records.c, invariants
 * R1-R3), from outside, with real jobs of tests/prog_run: a records directory that is not
 * the job user's alone is refused, by the launcher and by each worker's wrapper, with a
 * message naming it, while another user (uid 65534, through setpriv) plants links, stop
 * files and renamed attempt directories; nothing is written through a planted link; a
 * beat counts by its content on the launcher's clock, whatever its mtime says.
 * The cases that act as another user need root.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "rekindle.h"
#include "run_launch.h"

/* A scene another user can reach: a directory under /tmp (RK_TEST_TMP is closed to them). */
static char *open_scene(void)
{
    ck_assert_msg(geteuid() == 0, "these cases act as uid 65534 through setpriv: run the suite as root");
    char *d = strdup("/tmp/rk-run-scene.XXXXXX");
    ck_assert_msg(d && mkdtemp(d), "mkdtemp: %s", strerror(errno));
    chmod(d, 0711);
    return d;
}

/* sh -c cmd as uid/gid 65534 (nobody), with S set to the scene. */
static int as_nobody(const char *scene, const char *cmd)
{
    char *line = NULL, *out = NULL;
    ck_assert_int_ge(asprintf(&line, "S=%s setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '%s'", scene, cmd),
                     0);
    int rc = th_sh(line, 30, &out);
    ck_assert_msg(rc == 0, "as nobody: %s: exit %d: %s", cmd, rc, out ? out : "");
    free(out);
    free(line);
    return rc;
}

/* A 0777 directory of uid 65534 at scene/name. */
static void nobody_dir(const char *scene, const char *name)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", scene, name);
    ck_assert_msg(mkdir(path, 0700) == 0 && chown(path, 65534, 65534) == 0 && chmod(path, 0777) == 0, "%s: %s", path,
                  strerror(errno));
}

/* Two 0600 files of the job's user, which planted links point at. */
static void make_victims(const char *scene)
{
    char path[4096];
    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof(path), "%s/victim%d.txt", scene, i);
        th_assert_rc(th_write_file(path, "precious\n", 9), 0);
        chmod(path, 0600);
    }
}

static void assert_victims(const char *scene, const char *out)
{
    char path[4096];
    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof(path), "%s/victim%d.txt", scene, i);
        char *v = th_read_file(path, NULL);
        ck_assert_msg(v && strcmp(v, "precious\n") == 0, "victim%d.txt was written through a planted link: '%s'\n%s",
                      i, v ? v : "(gone)", out);
        free(v);
    }
}

/* R1: RK_RUN_DIR is refused, with a message naming it, unless it is a directory (not a
   link) of the job's user closed to group and other writes -- here a 0777 directory of
   uid 65534 in which that user, while the launcher starts, keeps renaming attempt-0 away
   and planting its own (a stop file, links to the job's files); a link to a good
   directory; a group-writable one of the job's user. A private directory under a 1777
   parent (a shared /scratch) is used. (Before: the 0777 directory was used; the planted
   attempt stopped the job and had the job's files overwritten.) */
START_TEST(records_dir_refused_unless_private)
{
    char *scene = open_scene(), *out = NULL, *dir = th_tmpdir("run-private");
    make_victims(scene);
    nobody_dir(scene, "open");
    char *atk = NULL;
    ck_assert_int_ge(asprintf(&atk, "S=%s setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '"
                                    "end=$(($(date +%%s)+20)); while [ $(date +%%s) -lt $end ]; do "
                                    "mv $S/open/attempt-0 $S/open/moved.$$ 2>/dev/null; mkdir -p -m 777 $S/open/attempt-0; "
                                    "ln -sf $S/victim1.txt $S/open/attempt-0/.rank-0; "
                                    "ln -sf $S/victim2.txt $S/open/attempt-0/alive-0; "
                                    "touch $S/open/attempt-0/stop; done' >/dev/null 2>&1 & echo $!",
                     scene),
                     0);
    char *pid = NULL;
    th_sh(atk, 10, &pid);
    char env_open[4200];
    snprintf(env_open, sizeof(env_open), "RK_RUN_DIR=%s/open", scene);
    const char *env1[] = {env_open, NULL};
    int rc = LAUNCH(env1, &out, "env", dir, "-n", "2");
    if (pid && atol(pid) > 0)
        kill((pid_t)atol(pid), SIGKILL);
    ck_assert_msg(rc == 2 && strstr(out, env_open + strlen("RK_RUN_DIR=")) && strstr(out, "refused") &&
                      strstr(out, "owned by uid 65534"),
                  "rc %d, want 2 and the directory named:\n%s", rc, out);
    ck_assert_msg(!th_exists(dir, "launches"), "workers were started in a refused directory:\n%s", out);
    assert_victims(scene, out);
    free(out);

    /* A link to a good directory; a group-writable directory of the job's user. */
    char good[4200], link[4200], group[4200], e[4300];
    snprintf(good, sizeof(good), "%s/good", scene);
    snprintf(link, sizeof(link), "%s/link", scene);
    snprintf(group, sizeof(group), "%s/group", scene);
    ck_assert_int_eq(mkdir(good, 0700), 0);
    ck_assert_int_eq(symlink(good, link), 0);
    ck_assert_int_eq(mkdir(group, 0700), 0);
    chmod(group, 0770);
    const struct {
        const char *dir, *says;
    } bad[] = {{link, "is a symbolic link"}, {group, "writable by its group"}};
    for (size_t i = 0; i < 2; i++) {
        snprintf(e, sizeof(e), "RK_RUN_DIR=%s", bad[i].dir);
        const char *env[] = {e, NULL};
        th_assert_rc(LAUNCH(env, &out, "env", dir, "-n", "2"), 2);
        ck_assert_msg(strstr(out, bad[i].dir) && strstr(out, bad[i].says), "no '%s' naming %s:\n%s", bad[i].says,
                      bad[i].dir, out);
        free(out);
    }
    /* Private, under a 1777 parent: the job runs. */
    char sticky[4200];
    snprintf(sticky, sizeof(sticky), "%s/shared", scene);
    ck_assert_int_eq(mkdir(sticky, 0700), 0);
    chmod(sticky, 01777);
    snprintf(e, sizeof(e), "RK_RUN_DIR=%s/shared/run7", scene);
    const char *env3[] = {e, NULL};
    th_assert_rc(LAUNCH(env3, &out, "env", dir, "-n", "2"), 0);
    free(out);
    free(atk);
    free(pid);
    th_rmrf(scene);
    th_rmrf(dir);
    free(scene);
    free(dir);
}
END_TEST

/* R1, R2: the wrapper (another process, maybe on another host) checks the directory it is
   given before it writes there: an attempt directory of uid 65534, 0777, holding links to
   the job's files and a stop file, and a good attempt directory inside a 0777 run
   directory of uid 65534, are refused (exit 2, named), nothing is written through the
   links and PROGRAM is not started. (Before: PROGRAM ran and both files were
   overwritten.) */
START_TEST(wrapper_refuses_unsafe_records)
{
    char *scene = open_scene(), *out = NULL;
    make_victims(scene);
    char run1[4200], att1[4300], run2[4200], att2[4300], mark[4300];
    snprintf(run1, sizeof(run1), "%s/run1", scene);
    ck_assert_int_eq(mkdir(run1, 0700), 0);
    chmod(run1, 0777); /* nobody makes attempt-0 in it, then the job's user closes it */
    as_nobody(scene, "mkdir -m 777 $S/run1/attempt-0 && chmod 777 $S/run1/attempt-0 && "
                     "ln -s $S/victim1.txt $S/run1/attempt-0/.rank-0 && ln -s $S/victim2.txt $S/run1/attempt-0/alive-0 && "
                     "touch $S/run1/attempt-0/stop");
    chmod(run1, 0700);
    snprintf(att1, sizeof(att1), "%s/attempt-0", run1);
    snprintf(run2, sizeof(run2), "%s/run2", scene);
    nobody_dir(scene, "run2");
    snprintf(att2, sizeof(att2), "%s/attempt-0", run2);
    ck_assert_int_eq(mkdir(att2, 0700), 0);
    const char *dirs[] = {att1, att2}, *named[] = {att1, run2};
    char *rekindle = th_bin("rekindle");
    for (int i = 0; i < 2; i++) {
        snprintf(mark, sizeof(mark), "%s/ran-%d", scene, i);
        char *argv[] = {rekindle, "run", "--rk-worker", (char *)dirs[i], "--", "touch", mark, NULL};
        const char *env[] = {"OMPI_COMM_WORLD_RANK=0", NULL};
        th_assert_rc(th_run(argv, env, 30, &out), 2);
        ck_assert_msg(strstr(out, named[i]) && strstr(out, "is refused: it is owned by uid 65534"),
                      "no refusal naming %s:\n%s", named[i], out);
        ck_assert_msg(access(mark, F_OK) != 0, "PROGRAM ran in a refused directory");
        assert_victims(scene, out);
        free(out);
    }
    free(rekindle);
    th_rmrf(scene);
    free(scene);
}
END_TEST

/* R3, L2: a worker whose beat's content keeps changing is at work, whatever the file's mtime
   says (set back to 2000 after every beat: a host whose clock runs behind, NFS's cached
   times): rank 0, still at work 8 s after rank 1 failed, is waited for. (Before: counted
   lost 5 s after rank 1's record, its job stopped.) */
START_TEST(beat_judged_by_content_not_mtime)
{
    char *dir = th_tmpdir("run-pastbeat"), *out = NULL;
    th_assert_rc(LAUNCH(NULL, &out, "pastbeat0", dir, "-n", "2"), 0);
    char *d0 = read_in(dir, "done-0");
    ck_assert_msg(d0 != NULL && !strstr(out, "no sign of life"), "rank 0 at work was counted lost:\n%s", out);
    ck_assert_msg(strstr(out, "job completed by 1 of 2 workers; lost: rank 1: exit 3"), "output:\n%s", out);
    free(d0);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* R3, L2: a beat whose content stopped changing goes stale by the launcher's clock, even with
   an mtime an hour ahead (a host whose clock runs ahead): the launcher stops mpirun 5 s
   after the last record, as for any silent worker. (Before: the future mtime looked
   fresh for an hour: the launcher waited.) */
START_TEST(beat_stale_despite_future_mtime)
{
    char *dir = th_tmpdir("run-stale"), *out = NULL;
    int rc = LAUNCH(NULL, &out, "stale1", dir, "-n", "3");
    char *p1 = read_in(dir, "pid-1");
    long pids[2] = {0, 0};
    if (p1)
        sscanf(p1, "%ld %ld", &pids[0], &pids[1]);
    for (int i = 0; i < 2; i++)
        if (pids[i] > 0 && alive(pids[i]))
            kill((pid_t)pids[i], SIGKILL);
    ck_assert_msg(rc == 3 && strstr(out, "the other 1 show no sign of life"), "rc %d, want 3:\n%s", rc, out);
    free(p1);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

static Suite *records_suite(void)
{
    Suite *s = suite_create("run_records");
    TCase *tc = tcase_create("records");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, records_dir_refused_unless_private);
    tcase_add_test(tc, wrapper_refuses_unsafe_records);
    tcase_add_test(tc, beat_judged_by_content_not_mtime);
    tcase_add_test(tc, beat_stale_despite_future_mtime);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(records_suite());
}
