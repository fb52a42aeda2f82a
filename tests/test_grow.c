/*
 * tests/test_grow.c - growth in place onto spares held back at launch (recover/recovery.c
 * G1-G5, detector/det_proto.c I11, tools/run_grow.c; docs/LAUNCHER.md, "Growing in place").
 *
 * "admit": the detector's request that a spare join (det_proto.c I11), driven without
 * sockets or clocks. "job": rk-train under `rekindle run -n 3 --spares 1`, asked to grow
 * by RK_RUN_DIR/grow once it trains (its first step printed): it grows to 4 in place (the three
 * workers keep their processes; the final bits are those of a replay whose world changes
 * at the step it resumed), and the spare killed at each point of its join (RK_FAULT on
 * the spare alone: before the ring is built with it, inside that ring's rebuild, before
 * the state is sent to it, in its first allreduce), or stopped when asked, costs the three
 * one recovery: they go on at 3 from their memory, with the bits of an uninterrupted
 * 3-worker run. A job with sharded and per-rank state (rk-train --zero, G5) the same: grown
 * in place with a replay's bits, and the spare killed while joining. With --grow relaunch,
 * the job grows by a relaunch. "join": processes started later brought into the job's
 * communicator (recover/join.c, tests/prog_join.c): spawned and merged on a thread beside
 * the members' own messages, and given up on at a deadline when the newcomer or a member
 * dies at each point of it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../detector/det_internal.h"
#include "harness.h"
#include "rekindle.h"

#define MS 1000000LL
#define STEPS   4000   /* ~0.5 ms each on an idle machine: the request (at the first step) grows the */
#define STEPS_S "4000" /* job by step ~1000 at the slowest measured (433 ms): 4x margin */
#define ARGS "--seed 5 --hidden 32"

/* ---- admit: the detector's request (I11) ------------------------------------------------- */

enum { NODES = 4 };

/* Delivers every message queued, at once and in order, until none is left. */
static void deliver(detp *node[NODES], int64_t now)
{
    for (bool any = true; any;) {
        any = false;
        for (int i = 0; i < NODES; i++) {
            detm m;
            while (detp_pop_send(node[i], &m)) {
                any = true;
                if (m.dst >= 0 && m.dst < NODES)
                    detp_recv(node[m.dst], &m, now);
            }
        }
    }
}

/* Events of `kind` (about `peer`) popped from node n. */
static int events(detp *n, int kind, int peer)
{
    det_event e;
    int k = 0;
    while (detp_pop_event(n, &e))
        k += e.kind == kind && e.peer == peer;
    return k;
}

/* I11: one member's request reaches every member (the spare too), once: one ADMIT each, the
   epoch one higher, the member set unchanged; asked again, by anyone, nothing happens; the
   spare's later death is still declared to all (a rank twice in the log, I5). */
START_TEST(admit_reaches_every_member_once)
{
    detp *node[NODES];
    int64_t now = 1000 * MS;
    for (int i = 0; i < NODES; i++) {
        detp_cfg c = {.self = i, .world = NODES, .nslots = NODES, .period_ns = 100 * MS, .k = 3, .nhelpers = 2,
                      .seed = 7};
        ck_assert_int_eq(detp_create(&node[i], &c, now), 0);
    }
    ck_assert_int_eq(detp_admit(node[0], 3, now), 0);
    deliver(node, now);
    for (int i = 0; i < NODES; i++) {
        det_view v;
        detp_view(node[i], &v);
        ck_assert_int_eq(events(node[i], DET_EV_ADMIT, 3), 1);
        ck_assert_uint_eq(v.epoch, 1);
        ck_assert_int_eq(v.nmembers, NODES);
    }
    ck_assert_int_eq(detp_admit(node[1], 3, now), 0);
    ck_assert_int_eq(detp_admit(node[0], 0, now), -EINVAL); /* itself */
    deliver(node, now);
    for (int i = 0; i < NODES; i++) {
        det_view v;
        detp_view(node[i], &v);
        ck_assert_int_eq(events(node[i], DET_EV_ADMIT, 3), 0);
        ck_assert_uint_eq(v.epoch, 1);
    }
    /* The spare dies: its observers' silence declares it; everyone learns it. */
    for (int t = 0; t < 40; t++) {
        now += 50 * MS;
        for (int i = 0; i < 3; i++)
            detp_tick(node[i], now);
        for (int i = 0; i < 3; i++) { /* node 3 is dead: its queue is dropped */
            detm m;
            while (detp_pop_send(node[i], &m))
                if (m.dst >= 0 && m.dst < 3)
                    detp_recv(node[m.dst], &m, now);
        }
        detm m;
        while (detp_pop_send(node[3], &m))
            ;
    }
    for (int i = 0; i < 3; i++) {
        det_view v;
        detp_view(node[i], &v);
        ck_assert_msg(!det_view_has(&v, 3), "member %d still holds the dead spare", i);
        ck_assert_uint_eq(v.epoch, 2);
        ck_assert_int_eq(detp_peer_state(node[i], 3), DETP_DEAD);
    }
    for (int i = 0; i < NODES; i++)
        detp_destroy(&node[i]);
}
END_TEST

/* ---- job: rk-train under rekindle run -n 3 --spares 1 ------------------------------------- */

/* The job, asked to grow by one once it trains (rank 0's first step line: not its first
   commit, which under load came after the job had ended); fault: RK_FAULT for the
   spare (rank 3) alone, "stop" (the spare SIGSTOPped just before the request, woken once
   the others finished), "held@K" (workers 0-2 held on entry to their rk_step_done of step
   K, the request made while they wait: rank 0 let go first, which sees it there and asks
   the spare in, then 1 and 2 once that reached them), or ""; opts: more options of `rekindle run`; args: more of rk-train.
   replay: "grown": the replay of a world 3 then 4 from the step the grown ring resumed at;
   "three": an uninterrupted 3-worker run; "" none. *out: "exit=N", the launcher's and the
   job's lines but the steps, "kept=K" (workers 0-2 whose PID at the end is one they had
   before the request), "attempts=A", the "resumed" events, "replay", the replay's lines but
   the steps (its final lines, and what its launcher said). */
static void grow_job(const char *fault, const char *opts, const char *args, const char *replay, char **out)
{
    char *w = th_tmpdir("grow"), *bin = th_bin("rk-train"), *rekindle = th_bin("rekindle"), *cmd = NULL, all[128];
    const char *src = getenv("RK_TEST_SRC");
    snprintf(all, sizeof(all), "%s%s%s", ARGS, *args ? " " : "", args);
    int n = asprintf(
        &cmd,
        "W=%s; B=%s; R=%s; A='%s'; N=%d\n"
        /* Without rank 0's step lines, only whole ones: mpirun forwards each rank's output
           in pieces that may end mid-line, so another rank's final line, or the launcher's,
           can follow part of a step line on the same line (seen under load: a replay with 2
           final lines when every line that began with "step " went). */
        "nostep() { grep -v '^step [0-9]* loss [^ ]* world [0-9]*$'; }\n"
        "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_KEEP=1000 RK_EVENT_LOG=$W/ev RK_RUN_DIR=$W/run\n"
        "F='%s'; case $F in ''|stop|planted) ;;\n"
        "held@*) touch $W/hold-0 $W/hold-1 $W/hold-2\n"
        "  export RK_FAULT=step_done@${F#held@}=hang RK_FAULT_HOLD=$W/hold-%%r;;\n"
        "*) export RK_FAULT=$F CHAOS_FAULT_RANK=3;; esac\n"
        "$R run -n 3 --spares 1 %s -- %s/chaos/worker.sh $B --steps $N $A > $W/out 2>&1 & job=$!\n"
        "for i in $(seq 6000); do grep -qs '^step ' $W/out && break; sleep 0.01; done\n"
        "pgrep -f \"^$B --steps $N $A\\$\" > $W/pids; sp=\n"
        "if [ \"$F\" = stop ]; then for p in $(cat $W/pids); do\n"
        "  tr '\\0' '\\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=3 && sp=$p; done\n"
        "  [ -n \"$sp\" ] && kill -STOP $sp; fi\n"
        "if [ \"$F\" = planted ]; then g=$W/run/attempt-0/grow-to; echo 4 > $g.p; chmod 666 $g.p; mv $g.p $g;\n"
        "else case $F in held@*) ;; *) echo 1 > $W/run/grow;; esac; fi\n"
        "case $F in held@*)\n"
        "  for i in $(seq 3000); do [ $(grep -c 'RK_FAULT: step_done' $W/out) -ge 3 ] && break; sleep 0.01; done\n"
        "  echo 1 > $W/run/grow\n"
        "  for i in $(seq 3000); do [ -s $W/run/attempt-0/grow-to ] && break; sleep 0.01; done\n"
        "  rm -f $W/hold-0; sleep 1; rm -f $W/hold-1 $W/hold-2;; esac\n"
        /* The stopped spare is woken once the others have finished (it then finds the job
           over): a stopped process is never reported, so its wrapper beats on meanwhile. */
        "if [ -n \"$sp\" ]; then for i in $(seq 1200); do grep -q '^final' $W/out && break; sleep 0.1; done\n"
        "  sleep 1; kill -CONT $sp; fi\n"
        "wait $job; echo \"exit=$?\"; nostep < $W/out\n"
        "unset RK_FAULT CHAOS_FAULT_RANK; kept=0\n"
        "for r in 0 1 2; do p=$(sed -n 's/.*pid \\([0-9]*\\).*/\\1/p' $W/run/attempt-0/rank-$r)\n"
        "  [ -n \"$p\" ] && grep -qx \"$p\" $W/pids && kept=$((kept + 1)); done\n"
        "echo \"kept=$kept\"; echo \"attempts=$(ls $W/run | grep -c '^attempt-')\"\n"
        "grep -h '\"resumed\"' $W/ev.*\n"
        "export RK_EVENT_LOG= RK_RUN_DIR=\n"
        "case '%s' in\n"
        "grown) s=$(grep -h '\"resumed\"' $W/ev.* | grep '\"world\": 4' | head -1 | sed 's/.*\"step\": \\([0-9]*\\).*/\\1/')\n"
        "  [ -n \"$s\" ] || exit 1; mkdir -p $W/r\n"
        "  RK_CKPT_DIR=$W/r RK_CKPT_EVERY=$s $R run -n 3 -- $B --steps $s $A > /dev/null 2>&1 || exit 1\n"
        "  echo replay; RK_CKPT_DIR=$W/r $R run -n 4 -- $B --steps $N $A 2>&1 | nostep;;\n"
        /* One uninterrupted 3-worker run serves every case of the suite with the same steps
           and arguments (the same bits), kept under the suite's RK_TEST_TMP. */
        "three) echo replay; c=${RK_TEST_TMP:-$W}/grow-three-$N-$(echo \"$A\" | cksum | cut -d' ' -f1).out\n"
        "  if [ ! -s $c ]; then RK_CKPT_DIR= $R run -n 3 -- $B --steps $N $A 2>&1 | nostep > $c.$$ &&\n"
        "    mv $c.$$ $c; fi; cat $c;;\n"
        "esac\n",
        w, bin, rekindle, all, STEPS, fault, opts, src ? src : ".", replay);
    ck_assert(n > 0);
    int rc = th_sh(cmd, 300, out);
    ck_assert_msg(rc == 0, "job script exit %d:\n%.4000s", rc, *out ? *out : "");
    th_rmrf(w);
    free(cmd);
    free(rekindle);
    free(bin);
    free(w);
}

/* G1-G3: 3 -> 4 in place: the three keep their processes (one attempt, their PIDs), the
   spare joins, the state comes from memory with no step lost, and the final bits are those
   of a replay on 3 workers up to the step the grown ring resumed at, then on 4. */
START_TEST(grows_three_to_four_in_place)
{
    char *out = NULL;
    grow_job("", "", "", "grown", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "growing in place from 3 to 4 workers") &&
                      strstr(out, "grown in place to 4 workers") && strstr(out, "kept=3\n") &&
                      strstr(out, "attempts=1\n") && !strstr(out, "launching again"),
                  "%.3000s", out);
    ck_assert_msg(strstr(out, "\"from\": \"memory\", \"epoch\": 2, \"world\": 4, \"steps_lost\": 0"),
                  "no resume from memory at world 4 with no step lost:\n%.3000s", out);
    th_job_equals_replay(out, 4, STEPS);
}
END_TEST

/* G1, G5: the request seen on entry to rk_step_done, before the snapshot of the step it
   finished (all three held there, rank 0 let go first: it asks the spare in there, the
   others go on as they are let go). Growth loses no member, so that step is kept: rank 0
   takes its snapshot first, and the grown ring resumes at the step after it (101). With
   sharded state (--zero: every member's own pieces of one step are needed) it resumed at
   100 while a growth seen there rolled the step back as a loss does. */
START_TEST(growth_seen_in_step_done_keeps_the_step)
{
    char *out = NULL;
    grow_job("held@100", "", "--zero", "grown", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "grown in place to 4 workers") && strstr(out, "kept=3\n"),
                  "%.3000s", out);
    ck_assert_msg(strstr(out, "\"step\": 101, \"from\": \"memory\", \"epoch\": 2, \"world\": 4, \"steps_lost\": 0"),
                  "the grown ring did not resume at step 101 from memory:\n%.3000s", out);
    th_job_equals_replay(out, 4, STEPS);
}
END_TEST

/* G4: the spare killed at each point of its join. The three recover without it, from
   their memory, no step lost, and finish at 3 with an uninterrupted run's bits. With sharded
   state (rk-train --zero, G5) too, killed before the state is sent to it: the rebuild's
   shifts over 4 cut, the three rebuild 3 -> 3 from the same snapshot. Killed once the
   slices were split over 4 (rollback@0), the three's split goes back to their buffers'
   size: nothing waits for an rk_rebind the program (rk_shard_rows = its rows) never calls,
   and every later snapshot is taken. */
static const struct {
    const char *fault, *args;
} join_faults[] = {
    {"join@0=crash", ""},      /* the decision that brings it in arrived: before the ring */
    {"rebuild@0=crash", ""},   /* inside the rebuild of the ring over 4, after its handshake */
    {"join@1=crash", ""},      /* the ring over 4 is built: before the state is sent to it */
    {"allreduce@0=crash", ""}, /* its first allreduce as a member */
    {"join@1=crash", "--zero"},
    {"rollback@0=crash", "--zero"}, /* the slices split over 4, before its state is sent */
};

START_TEST(spare_killed_while_joining)
{
    char *out = NULL;
    const char *fault = join_faults[_i].fault, *args = join_faults[_i].args;
    grow_job(fault, "", args, "three", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "growing in place from 3 to 4 workers") &&
                      strstr(out, "kept=3\n") && strstr(out, "attempts=1\n") &&
                      strstr(out, "lost: rank 3: killed by signal 9"),
                  "%s %s: %.3000s", fault, args, out);
    /* Before it joined, the launcher says the growth failed; after (allreduce), it joined. */
    ck_assert_msg(strncmp(fault, "allreduce", 9) == 0 ? strstr(out, "grown in place to 4 workers") != NULL
                                                      : strstr(out, "did not complete (no spare left waiting") != NULL,
                  "%s %s: %.3000s", fault, args, out);
    ck_assert_msg(strstr(out, "\"from\": \"memory\"") && !strstr(out, "\"from\": \"disk\""),
                  "%s %s: the three did not recover from memory:\n%.3000s", fault, args, out);
    ck_assert_msg(!strstr(out, "waits for rk_rebind"), "%s %s: a slice of the old size waits for rk_rebind:\n%.3000s",
                  fault, args, out);
    th_job_equals_replay(out, 3, STEPS);
}
END_TEST

/* G4: a spare that hangs (stopped) when asked to join is found by its silence and costs the
   three the same: they go on at 3 from their memory, an uninterrupted run's bits. */
START_TEST(spare_hung_while_joining)
{
    char *out = NULL;
    grow_job("stop", "", "", "three", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "growing in place from 3 to 4 workers") &&
                      strstr(out, "kept=3\n") && strstr(out, "attempts=1\n") &&
                      strstr(out, "\"from\": \"memory\"") && !strstr(out, "grown in place"),
                  "%.3000s", out);
    th_job_equals_replay(out, 3, STEPS);
}
END_TEST

/* G2: the grow-to file is read only when it is the job user's own and only it may write
   it: one others may write (planted, or left so) is refused, said once, and the job goes
   on at 3. (Before: any content of that file made the job grow.) */
START_TEST(grow_file_others_may_write_is_refused)
{
    char *out = NULL;
    grow_job("planted", "", "", "", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "grow-to refused: not a regular file of this user") &&
                      !strstr(out, "grown in place") && strstr(out, "kept=3\n"),
                  "%.3000s", out);
    ck_assert_int_eq(th_count(out, "final step=" STEPS_S " world=3 hash="), 3);
    free(out);
}
END_TEST

/* --grow relaunch: the same request grows the job by a relaunch at its next checkpoint,
   the held-back slot started as a worker. */
START_TEST(grow_relaunch_when_asked)
{
    char *out = NULL;
    grow_job("", "--grow relaunch", "", "", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "(--grow relaunch): growing to 4 at the next checkpoint") &&
                      strstr(out, "launching again to grow") && strstr(out, "attempts=2\n") &&
                      !strstr(out, "in place"),
                  "%.3000s", out);
    ck_assert_int_eq(th_count(out, "final step=" STEPS_S " world=4 hash="), 4);
    free(out);
}
END_TEST

/* G5: sharded and per-rank state (rk-train --zero: Adam's moments sharded, a per-rank RNG)
   grows in place as replicated state does: the three keep their processes, the slices are
   re-split 3 -> 4 from their memory, and the final bits are a replay's, 3 workers up to the
   step the grown ring resumed at, then 4 from it. (Before, such a job was refused in place;
   with the refusal lifted, the spare seeded its RNG as rank -1, and the bits differed.) */
START_TEST(sharded_job_grows_in_place)
{
    char *out = NULL;
    grow_job("", "", "--zero", "grown", &out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "growing in place from 3 to 4 workers") &&
                      strstr(out, "grown in place to 4 workers") && strstr(out, "kept=3\n") &&
                      strstr(out, "attempts=1\n") && !strstr(out, "launching again"),
                  "%.3000s", out);
    ck_assert_msg(strstr(out, "\"from\": \"memory\", \"epoch\": 2, \"world\": 4, \"steps_lost\": 0"),
                  "no resume from memory at world 4 with no step lost:\n%.3000s", out);
    th_job_equals_replay(out, 4, STEPS);
}
END_TEST

/* ---- join: processes started later (recover/join.c J8-J11) ---------------------------- */

/* prog_join MODE under mpirun -n 3 (with recovery: a killed newcomer or member ends no one
   else), the join given up on at 2 s (times the sanitizers' scale); its output, and the
   job's end asserted. */
static char *join_job(const char *mode)
{
    char *out = NULL, deadline[16];
    snprintf(deadline, sizeof(deadline), "%d", 2000 * th_time_scale());
    char *args[] = {(char *)mode, deadline, NULL};
    char *prog = th_prog("prog_join");
    int rc = th_mpirun_prog(3, true, prog, args, NULL, 60, &out);
    free(prog);
    ck_assert_msg(rc == 0, "prog_join %s: status %d (-1: it ran past the bound):\n%s", mode, rc, out);
    ck_assert_msg(!strstr(out, "FAIL"), "prog_join %s:\n%s", mode, out);
    return out;
}

/* The newcomer lives: every member and the newcomer end up in one communicator of 4 (3
   when two members spawn: the third is in none), ranks in order, and tokens go around
   both duplicates; the members' own tokens went on beside the join; their ring, rebuilt
   onto the merged communicator with the newcomer (ring_rebuild_on, ring_create_on: no
   collective call), reduces exactly over 4; MPI_Finalize as usual. */
START_TEST(join_spawns_and_merges_beside_the_ring)
{
    char *out = join_job("alive");
    for (int r = 0; r < 3; r++) {
        char want[128];
        snprintf(want, sizeof(want), "ok rank %d joined in", r);
        ck_assert_msg(strstr(out, want), "%s missing:\n%s", want, out);
        snprintf(want, sizeof(want), "merged size 4, rank %d; 1000 token rounds around it, 1 around the second", r);
        ck_assert_msg(strstr(out, want), "%s missing:\n%s", want, out);
    }
    ck_assert_msg(strstr(out, "ok newcomer joined in") &&
                      strstr(out, "merged size 4, rank 3; 1000 token rounds around it, 1 around the second"),
                  "%s", out);
    ck_assert_msg(th_count(out, "20000 token rounds among the members") == 3 && !strstr(out, "no finalize"), "%s", out);
    ck_assert_msg(th_count(out, "ok members: allreduce of 3 exact, epoch 0") == 3 &&
                      th_count(out, ": allreduce of 4 exact, epoch 1") == 4 && strstr(out, "ok newcomer: allreduce of 4"),
                  "the ring over the merged communicator:\n%s", out);
    free(out);
    out = join_job("subset");
    ck_assert_msg(strstr(out, "ok rank 2: not a member") &&
                      strstr(out, "merged size 3, rank 0;") && strstr(out, "merged size 3, rank 1;") &&
                      th_count(out, "merged size 3, rank 2; 1000 token rounds around it") == 1,
                  "%s", out);
    free(out);
}
END_TEST

/* The newcomer killed right after its MPI_Init (the members' threads stay inside the
   merge), gone before MPI_Init (inside the spawn), or a member killed after starting its
   join (the others' threads inside the members' communicator or the spawn): every member
   left gives the join up at its deadline, its own tokens went on beside it and after it,
   and it ends without MPI_Finalize (J9), the job with status 0. */
static const char *const join_deaths[] = {"dies", "noinit", "member-dies"};

START_TEST(join_given_up_when_a_party_dies)
{
    const char *mode = join_deaths[_i];
    char *out = join_job(mode);
    int members = strcmp(mode, "member-dies") == 0 ? 2 : 3;
    ck_assert_msg(th_count(out, "join given up at ") == members && th_count(out, "(thread left: 1)") == members &&
                      th_count(out, "no finalize (a join's thread is inside MPI)") == members && !strstr(out, "joined"),
                  "%s: each member gives the join up at 2 s:\n%s", mode, out);
    if (members == 3)
        ck_assert_msg(th_count(out, "20000 token rounds among the members in") == 6, "%s: tokens beside and after:\n%s",
                      mode, out);
    free(out);
}
END_TEST

/* The newcomer dies after the merge, before the ring is rebuilt with it: the members'
   rebuild onto the merged communicator ends at its 1 s bound (the ring a spare there),
   and their rebuild without it, on the same communicator, reduces exactly over 3: a loss
   like any other, which costs one bounded wait. */
START_TEST(join_newcomer_dies_after_the_merge)
{
    char *out = join_job("late-dies");
    ck_assert_msg(th_count(out, "joined in") == 3 && th_count(out, "rebuild with the dead newcomer: rc -") == 3 &&
                      th_count(out, "member 0\n") == 3 && th_count(out, ": allreduce of 3 exact, epoch 2") == 3 &&
                      !strstr(out, "no finalize"),
                  "%s", out);
    free(out);
}
END_TEST

/* ---- a worker started while the job trains joins it (recover/join_proto.c J12-J15) ----- */

/* prog_join_rk MODE under mpirun -n 3 with a checkpoint directory: the members spawn n
   newcomers in one join at step 10 and train on, with the variables of `extra` (NULL-ended,
   or NULL: STEPS, STEP_MS, MIN_WORLD of prog_join_rk) set too; its output, the job's end
   asserted. */
static char *join_rk_job_env(const char *mode, int n, const char *const *extra)
{
    char *out = NULL, env_dir[4200], env_mode[96], env_n[32];
    char *dir = th_tmpdir("join_rk");
    snprintf(env_dir, sizeof(env_dir), "RK_CKPT_DIR=%s/ck", dir);
    snprintf(env_mode, sizeof(env_mode), "JOIN_MODE=%s", mode);
    snprintf(env_n, sizeof(env_n), "JOIN_N=%d", n);
    const char *env[8] = {env_dir, env_mode, env_n, "RK_LOG=info"};
    for (int i = 4; extra && *extra && i < 7; i++)
        env[i] = *extra++;
    char *args[] = {NULL};
    char *prog = th_prog("prog_join_rk");
    int rc = th_mpirun_prog(3, true, prog, args, env, 90, &out);
    free(prog);
    th_rmrf(dir);
    free(dir);
    ck_assert_msg(rc == 0, "prog_join_rk %s: status %d (-1: it ran past the bound):\n%s", mode, rc, th_tail(out, 3000));
    ck_assert_msg(!strstr(out, "FAIL"), "prog_join_rk %s:\n%s", mode, th_tail(out, 3000));
    return out;
}

static char *join_rk_job(const char *mode)
{
    return join_rk_job_env(mode, 1, NULL);
}

/* The newcomer lives: spawned while the three train, it is asked in at a step boundary,
   receives the members' state from memory (0 steps lost) and all four end exact on a
   world of 4; no member restarted (the members' lines come once each). */
START_TEST(join_rk_newcomer_trains_with_the_members)
{
    char *out = join_rk_job("alive");
    ck_assert_msg(strstr(out, "ok newcomer brought in at step ") && strstr(out, "rank 3 of 4") &&
                      th_count(out, "ok member world 4 at step ") == 3 &&
                      th_count(out, "ok member ends at step 80 on a world of 4, w exact") == 3 &&
                      strstr(out, "ok newcomer ends at step 80 on a world of 4, w exact") &&
                      th_count(out, "ok member rank ") == 3 && strstr(out, "from memory (0 steps lost)"),
                  "%s", out);
    free(out);
}
END_TEST

/* The newcomer dies at each point of its join: asked in dead, on the decision, inside the
   ring's rebuild over 4, before the state is sent to it, in its first allreduce as a
   member. Each costs the three one detection and one round: they go on at 3 from memory
   and end exact. */
static const char *const join_rk_deaths[] = {"dies", "fault:join@0=crash", "fault:rebuild@0=crash",
                                             "fault:join@1=crash", "fault:allreduce@0=crash"};

START_TEST(join_rk_newcomer_killed_while_joining)
{
    const char *mode = join_rk_deaths[_i];
    char *out = join_rk_job(mode);
    ck_assert_msg(th_count(out, "ok member ends at step 80 on a world of 3, w exact") == 3 &&
                      !strstr(out, "newcomer ends") && strstr(out, "from memory (0 steps lost)") &&
                      !strstr(out, "from disk"),
                  "%s:\n%s", mode, out);
    free(out);
}
END_TEST

/* J20: two newcomers in one join (one spawn, one merge): each tells the other where its
   detector listens, both are brought in by the same decision at one step, and all five end
   exact on a world of 5 with the members' processes unchanged. */
START_TEST(join_rk_two_newcomers_in_one_join)
{
    char *out = join_rk_job_env("alive", 2, NULL);
    ck_assert_msg(th_count(out, "ok newcomer brought in at step ") == 2 && strstr(out, "rank 3 of 5") &&
                      strstr(out, "rank 4 of 5") && th_count(out, "ok member world 5 at step ") == 3 &&
                      th_count(out, "ok member ends at step 80 on a world of 5, w exact") == 3 &&
                      th_count(out, "ok newcomer ends at step 80 on a world of 5, w exact") == 2 &&
                      th_count(out, "ok member rank ") == 3 && strstr(out, "join: 2 worker(s) spawned and merged") &&
                      strstr(out, "join: the other worker(s) started with this one told where they listen") &&
                      strstr(out, "from memory (0 steps lost)") && !strstr(out, "ok member world 4 at step "),
                  "%s", th_tail(out, 3000));
    /* one decision brought both in: the same step in both lines */
    const char *a = strstr(out, "ok newcomer brought in at step "), *b = a ? strstr(a + 1, "ok newcomer brought in at step ") : NULL;
    ck_assert_msg(a && b && atoll(a + 31) == atoll(b + 31), "%s", th_tail(out, 3000));
    free(out);
}
END_TEST

/* Members that train in steps of 0.8 s take the newcomer's address and tell M0 they are
   ready only at their step boundaries, so its admission comes 1-2 s after its detector
   started. Before detector/det_proto.c I12's wait for its own ADMIT, the newcomer counted
   the members' silence from its start, declared all three dead after 1 s, and those
   declarations reached them with the ADMIT: a healthy member was fenced and the job went
   on at 2 without the newcomer. Now all four end exact on a world of 4. */
START_TEST(join_rk_newcomer_of_slow_steps)
{
    char *out = join_rk_job_env("alive", 1, (const char *const[]){"STEPS=20", "STEP_MS=800", NULL});
    ck_assert_msg(strstr(out, "ok newcomer brought in at step ") && strstr(out, "rank 3 of 4") &&
                      th_count(out, "ok member ends at step 20 on a world of 4, w exact") == 3 &&
                      strstr(out, "ok newcomer ends at step 20 on a world of 4, w exact") &&
                      !strstr(out, "declared dead") && !strstr(out, "fenced"),
                  "%s", th_tail(out, 3000));
    free(out);
}
END_TEST

/* One of the two newcomers of a join dies as soon as its rk_init returned: asked in dead
   (a lost spare, recovery.c G4: one detection and one round) where its address reached
   the members, else never asked while the other is, 1 s after it could be (J20). Either
   way the three members and the other newcomer go on at 4 from memory and end exact; the
   job trains until it is at 4 (MIN_WORLD), so that the grace does not race its end. */
START_TEST(join_rk_one_of_two_newcomers_killed)
{
    char *out = join_rk_job_env("dies-last", 2, (const char *const[]){"MIN_WORLD=4", NULL});
    ck_assert_msg(th_count(out, "ok member ends at step ") == 3 && th_count(out, "on a world of 4, w exact") == 4 &&
                      th_count(out, "ok newcomer ends at step ") == 1 &&
                      th_count(out, "ok newcomer dies at slot") == 1 && strstr(out, "from memory (0 steps lost)") &&
                      !strstr(out, "from disk"),
                  "%s", th_tail(out, 3000));
    free(out);
}
END_TEST

/* The first of two newcomers of one join dies at each point of its join (the decision
   that brings both in arrived; inside the ring's rebuild over 5; the ring built, the state
   not sent; its first allreduce as a member) while the other lives: the three members and
   the other newcomer go on at 4 from the members' memory and end exact. Before the fix of
   recovery.c G6, a death after the ring was built left the other newcomer waiting for a
   decision as a spare while the members waited for its report in the rounds, until their
   bound (3 x RK_TIMEOUT_MS): the job stopped. */
static const char *const join_rk_first_deaths[] = {"fault-first:join@0=crash", "fault-first:rebuild@0=crash",
                                                   "fault-first:join@1=crash", "fault-first:allreduce@0=crash"};

START_TEST(join_rk_first_of_two_newcomers_dies_while_joining)
{
    const char *mode = join_rk_first_deaths[_i];
    char *out = join_rk_job_env(mode, 2, (const char *const[]){"MIN_WORLD=4", NULL});
    ck_assert_msg(th_count(out, "ok member ends at step ") == 3 && th_count(out, "on a world of 4, w exact") == 4 &&
                      th_count(out, "ok newcomer ends at step ") == 1 && !strstr(out, "from disk"),
                  "%s:\n%s", mode, th_tail(out, 4000));
    free(out);
}
END_TEST

/* J19: a worker started to join whose program reaches MPI_Init only after the spawn's PMIx
   exchange bound (here it sleeps 9 s first, as a cold `import torch` on a busy host may;
   the bound is 6 s at RK_TIMEOUT_MS=5000): the spawn fails while it is alive, M0 says why
   in the run records, and the launcher grows by a relaunch at once, saying so. (Before: the
   members started another newcomer 20 s later, which failed alike, and the launcher went
   by a relaunch only at its 40 s bound, or never where the job ended first.) */
START_TEST(slow_newcomer_grows_by_a_relaunch_at_once)
{
    char *w = th_tmpdir("slow_newcomer"), *r = th_bin("rekindle"), *b = th_bin("rk-train"), *cmd = NULL, *out = NULL;
    int n = asprintf(
        &cmd,
        "W=%s; H=$(hostname); echo \"$H:2\" > $W/hosts; mkdir -p $W/run\n"
        "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=100 RK_EVENT_LOG= RK_RUN_DIR=$W/run RK_TIMEOUT_MS=5000\n"
        "%s run --host-discovery-script \"cat $W/hosts\" --discovery-interval 0.2 --max-np 3 -- "
        "sh -c '[ -n \"$RK_RUN_SLOT\" ] && sleep 9; exec %s \"$@\"' rk-train --steps 20000 --seed 5 --hidden 32 "
        "> $W/out 2> $W/err & job=$!\n"
        "for i in $(seq 1200); do [ -d $W/c/step-000000000100 ] && break; sleep 0.05; done\n"
        "echo \"$H:3\" > $W/hosts\n"
        "wait $job; echo \"exit=$?\"; grep '^final' $W/out; grep 'rekindle: run' $W/err\n",
        w, r, b);
    ck_assert(n > 0);
    int rc = th_sh(cmd, 150, &out);
    ck_assert_msg(rc == 0, "script status %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "growing in place to 3") &&
                      strstr(out, "did not complete (the workers gave the join up: the spawn failed ") &&
                      strstr(out, "the newcomer still starting") && strstr(out, "growing by a relaunch") &&
                      strstr(out, "launching again to grow") && !strstr(out, "try 2 of"),
                  "%s", out);
    ck_assert_int_eq(th_count(out, "final step=20000 world=3 hash="), 3);
    free(out);
    free(cmd);
    free(b);
    free(r);
    th_rmrf(w);
    free(w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grow");
    TCase *ta = tcase_create("admit");
    tcase_add_test(ta, admit_reaches_every_member_once);
    suite_add_tcase(s, ta);
    TCase *tj = tcase_create("job");
    tcase_set_timeout(tj, 360);
    tcase_add_test(tj, grows_three_to_four_in_place);
    tcase_add_test(tj, growth_seen_in_step_done_keeps_the_step);
    tcase_add_loop_test(tj, spare_killed_while_joining, 0, (int)(sizeof(join_faults) / sizeof(join_faults[0])));
    tcase_add_test(tj, spare_hung_while_joining);
    tcase_add_test(tj, grow_file_others_may_write_is_refused);
    tcase_add_test(tj, grow_relaunch_when_asked);
    tcase_add_test(tj, sharded_job_grows_in_place);
    suite_add_tcase(s, tj);
    TCase *tn = tcase_create("join");
    tcase_set_timeout(tn, 120);
    tcase_add_test(tn, join_spawns_and_merges_beside_the_ring);
    tcase_add_loop_test(tn, join_given_up_when_a_party_dies, 0, (int)(sizeof(join_deaths) / sizeof(join_deaths[0])));
    tcase_add_test(tn, join_newcomer_dies_after_the_merge);
    suite_add_tcase(s, tn);
    TCase *tr = tcase_create("join_rk");
    tcase_set_timeout(tr, 200);
    tcase_add_test(tr, join_rk_newcomer_trains_with_the_members);
    tcase_add_test(tr, join_rk_newcomer_of_slow_steps);
    tcase_add_test(tr, join_rk_two_newcomers_in_one_join);
    tcase_add_test(tr, join_rk_one_of_two_newcomers_killed);
    tcase_add_loop_test(tr, join_rk_first_of_two_newcomers_dies_while_joining, 0,
                        (int)(sizeof(join_rk_first_deaths) / sizeof(join_rk_first_deaths[0])));
    tcase_add_loop_test(tr, join_rk_newcomer_killed_while_joining, 0,
                        (int)(sizeof(join_rk_deaths) / sizeof(join_rk_deaths[0])));
    tcase_add_test(tr, slow_newcomer_grows_by_a_relaunch_at_once);
    suite_add_tcase(s, tr);
    return th_main(s);
}
