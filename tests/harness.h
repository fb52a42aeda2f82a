/*
 * tests/harness.h - what every Check suite shares: a main() that runs the suite with
 * CK_FORK on, and helpers for integration tests that start real processes and mpirun
 * jobs with a bound on their time.
 *
 * Environment set by tests/run: RK_TEST_BUILD (the build directory: bin/, lib/ ...),
 * RK_TEST_TMP (a scratch directory removed after the run).
 * A suite whose requirement is missing (a GPU) calls th_skip_suite(): exit 77, which
 * tests/run reports as SKIP, never PASS.
 */
#ifndef RK_TEST_HARNESS_H
#define RK_TEST_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Runs the suite (CK_FORK unless CK_FORK=no for debugging), prints Check's summary line,
   returns the process exit status (0: every test passed). */
int th_main(Suite *s);

/* Exits the suite's process with status 77 after printing "SKIP: <why>". */
void th_skip_suite(const char *why) __attribute__((noreturn));

/* "<build>/bin/<name>" (static storage per call site is not needed: returns malloc'd). */
char *th_bin(const char *name);
/* BUILD/tests/<name> (RK_TEST_BUILD; default build): a test program (tests/prog_*.c); malloc'd. */
char *th_prog(const char *name);
/* A new empty directory under RK_TEST_TMP (or /tmp); malloc'd path. Fails the test when it
   cannot be made (RK_TEST_TMP gone: its tests/run was stopped). */
char *th_tmpdir(const char *tag);
/* rm -rf path; 0 or -errno. */
int th_rmrf(const char *path);
/* Whether dir/name exists. */
bool th_exists(const char *dir, const char *name);
/* How many entries of dir have a name beginning with '.' (-1 if it cannot be listed). */
int th_dot_entries(const char *dir);
/* Whole file into a NUL-terminated malloc'd buffer; NULL if unreadable. */
char *th_read_file(const char *path, size_t *len);
int th_write_file(const char *path, const void *data, size_t len);
/* What the process writes to stderr (its log lines) from th_capture_begin on, returned
   (malloc'd) by th_capture_end, which puts stderr back. */
typedef struct th_capture {
    int saved;
    char path[512];
} th_capture;
void th_capture_begin(th_capture *c);
char *th_capture_end(th_capture *c);
/* n bytes of a fixed pseudo-random pattern, its k-th (xorshift64). */
void th_pattern(unsigned char *p, size_t n, unsigned k);
/* Flips a bit of the byte at off of file path (a damaged disk), failing the test if it
   cannot. */
void th_flip_byte(const char *path, off_t off);

/* RK_TEST_TIME_SCALE (1..99, default 1; tests/run sets 4 under TSan): the factor th_run
   applies to its bounds and, unless the caller's environment or envp_extra sets one, to
   the started job's heartbeat period (RK_HEARTBEAT_MS = 100 ms x scale). Tests that wait
   with their own clocks multiply by it too. */
int th_time_scale(void);

/* Runs argv (argv[0] searched in PATH) in its own process group with stdout+stderr
   captured into *out (malloc'd, NUL-terminated; out may be NULL to discard). The whole
   group is killed if it outlives timeout_s x th_time_scale(). Returns the exit status 0..255, 128+signal
   if killed by a signal, or -1 if it timed out (or could not start). */
int th_run(char *const argv[], const char *const envp_extra[], int timeout_s, char **out);
/* th_run of /bin/sh -c cmd. */
int th_sh(const char *cmd, int timeout_s, char **out);
/* The last summary line of a chaos/run output ("chaos: R runs, F faults injected, V
   violations") into *r, *f, *v; -1 if there is none. */
int th_chaos_summary(const char *out, int *r, int *f, int *v);
/* mpirun -n N --oversubscribe --allow-run-as-root --mca btl self,vader,tcp ... argv. */
int th_mpirun(int n, char *const argv[], const char *const envp_extra[], int timeout_s, char **out);
/* th_mpirun of prog args... (at most 10); with recovery, as `rekindle run` starts a job
   (--enable-recovery, no abort on a non-zero exit), so that the others outlive a killed rank. */
int th_mpirun_prog(int n, bool recovery, const char *prog, char *const args[], const char *const envp_extra[],
                   int timeout_s, char **out);

/* Whether a CUDA GPU is usable; why gets the reason when not. */
bool th_have_gpu(char *why, size_t cap);

/* The last `n` bytes of out (all of it when shorter): what an assertion's message can
   carry (Check refuses a message of more than a few KiB and exits instead). */
const char *th_tail(const char *out, size_t n);

/* How many times needle occurs in out (0 for a NULL out). */
int th_count(const char *out, const char *needle);

/* rk-train's output: asserts `world` final lines ("final step=STEPS world=W hash=H"), all
   for `steps` steps and with one hash, which goes to hash. */
void th_final_lines(const char *out, int world, int steps, char hash[17]);
/* A job script's output: the job's final lines, then a line "replay" and the replay's;
   asserts both are `world` lines of `steps` steps with the same hash. Frees out. */
void th_job_equals_replay(char *out, int world, int steps);

/* rk-train --steps STEPS ARGS (ARGS: shell words without --steps) on `world` workers
   through `rekindle run`, checkpoints in dir/c and events in dir/ev.*, with env (shell
   assignments: RK_CKPT_EVERY=...) exported; rank 1 SIGKILLs itself in its kill_call-th
   rk_allreduce (RK_FAULT=allreduce@kill_call=crash through chaos/worker.sh: the loss comes
   at the same call in every run, where a kill from outside raced the job's pace and could
   miss a job that ended first). Then the replay: the checkpoint of the step the
   survivors resumed at (the job's, or a fault-free run's of that many steps) resumed on
   world - 1 workers. *out: "exit=N", the job's final lines, "unpartnered=K" (workers that
   had no partner copy of the snapshot), the events "resumed", a line "replay", the
   replay's final lines (th_job_equals_replay compares them). Returns th_sh's status. */
int th_train_kill_replay(const char *dir, int world, int steps, const char *args, const char *env, int kill_call,
                         int timeout_s, char **out);

/* rk-train --steps STEPS ARGS through `rekindle run -n 3 --spares 1`, checkpoints every 50
   steps in dir/ck, events in dir/ev.*; with kill_one, rank 1 SIGKILLs itself in its
   TH_SPARE_KILL_AT-th rk_allreduce (RK_FAULT=allreduce@N=crash: at least one a step, so
   before the end of a job of more steps). Asserts the script ran; *out: "exit=N", the
   job's output, the events spare_joined. */
#define TH_SPARE_KILL_AT 240
void th_train_spare(const char *dir, int steps, const char *args, bool kill_one, int timeout_s, char **out);

/* rk-train --steps STEPS ARGS under an elastic `rekindle run` (--max-np 3, 4 for
   TH_GROW_TWO, a cool-down of 0.5 s, the discovery script every 0.2 s), checkpoints every
   50 steps in dir/c. Once checkpoint 100 is committed: TH_GROW: the script, which listed
   this host with 2 slots, lists 3 (and RK_RUN_DIR/grow is touched); TH_GROW_TWO: the same,
   4 slots; TH_LOSE_WORKER: of 3 workers on this host,
   worker 1 is SIGKILLed (the job shrinks in place, grows back after the cool-down);
   TH_LOSE_HOST: on 3 hosts of scripts/hosts (one slot each), every process of the second
   is SIGKILLed, likewise. in_place: 0 --grow relaunch; 1 --grow inplace (workers started on
   the free slots join the job); 2 --grow inplace where the growth goes by a relaunch all
   the same (a host lost whole). Then the replay on this host: the same
   worlds at the same steps, from the steps the job resumed at. *out: "exit=N", the job's
   final lines, the launcher's lines, "joins of K: J" (the members' joins that started K
   newcomers, K = 1, 2), "memory=A disk=B" (B: the growth's resume, from memory
   when in place), "replay", the replay's final lines. Returns th_sh's status. */
enum th_elastic { TH_GROW, TH_LOSE_WORKER, TH_LOSE_HOST, TH_GROW_TWO };
int th_train_elastic(const char *dir, int steps, const char *args, enum th_elastic how, int in_place, char **out);
/* th_train_elastic of 6000 steps with TH_LOSE_WORKER or TH_LOSE_HOST (long enough for the
   growth back, ~1 ms steps on an idle machine, to come well before the end), asserting exit
   0, the launcher's lost_line, the growth (in place: and no relaunch), and the final bits
   of the replay on 3 workers. */
void th_elastic_grows_back(enum th_elastic how, bool in_place, const char *args, const char *lost_line);

/* Asserts with both sides shown. */
#define th_assert_rc(expr, want)                                                          \
    do {                                                                                  \
        int th_got_ = (expr), th_want_ = (want);                                          \
        ck_assert_msg(th_got_ == th_want_, "%s = %d (%s), want %d (%s)", #expr, th_got_,  \
                      rk_strerror(th_got_), th_want_, rk_strerror(th_want_));             \
    } while (0)

#endif
