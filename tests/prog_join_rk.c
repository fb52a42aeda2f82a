/*
 * tests/prog_join_rk.c - a worker started while the job trains joins it in place
 * (recover/join_proto.c), run under mpirun -n 3 by tests/test_grow.c with RK_CKPT_DIR set.
 *
 * Every rank trains a 4096-float "w": each step allreduces a gradient of ones (sum: the
 * world size, checked) and adds the sum / world to w, so after step s every element is
 * s + 1, whatever the world, and a state restored from any snapshot says which step it is.
 * At step JOIN_AT the members start a join of JOIN_N newcomers (default 1; this program,
 * argv "newcomer MODE"): they come into rk_init, wait in rk_resume as spares and are brought
 * in at a step boundary with the members' state from memory; the members keep their
 * processes. MODE:
 *   alive   the newcomers live; every rank ends at STEPS on a world of 3 + JOIN_N with w
 *           exact;
 *   dies    the newcomer SIGKILLs itself before rk_resume, once its detector runs and
 *           told the members where it listens (it is asked in dead): the members go on at
 *           3 and end at STEPS with w exact;
 *   dies-last  the same, in the last newcomer of the join alone (the highest rank of the
 *           newcomers' MPI_COMM_WORLD): the others go on at 3 + JOIN_N - 1;
 *   fault:SPEC  RK_FAULT=SPEC in the newcomer alone (join@0=crash: the decision that brings
 *           it in arrived; rebuild@0=crash: inside the ring's rebuild over 4; join@1=crash:
 *           the ring built, the state not sent; allreduce@0=crash: its first allreduce as
 *           a member): the same.
 *   fault-first:SPEC  the same in the first newcomer of the join alone (rank 0 of the
 *           newcomers' MPI_COMM_WORLD): the others go on at 3 + JOIN_N - 1.
 * Prints "ok ..." lines the suite checks; "FAIL ..." and exit 1 on a wrong result.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../recover/rec_internal.h"
#include "rekindle.h"

#define N 4096
#define STEPS steps_n
#define JOIN_AT 10

/* 80 steps of 20 ms, unless STEPS and STEP_MS say otherwise (in every process: mpirun's
   environment reaches the newcomers too). With MIN_WORLD, training goes on past STEPS
   until the world is that large (every rank stops at the same step: the world changes
   only at a recovery, agreed), at most 20 x STEPS: a test of a growth that takes a bound
   of its own then does not race the job's end. */
static int steps_n = 80;

static int fail(const char *what, int rc)
{
    fprintf(stderr, "FAIL %s: %s (%s)\n", what, rk_strerror(rc), rk_last_error());
    return 1;
}

static int train(rk_ctx *ctx, float *w, const char *who, int pid_world_at_start)
{
    static float g[N];
    int64_t step = rk_next_step(ctx);
    int seen_world = pid_world_at_start;
    int rc;
    bool joined_started = false;
    useconds_t step_us = getenv("STEP_MS") ? (useconds_t)atoi(getenv("STEP_MS")) * 1000 : 20000;
    int min_world = getenv("MIN_WORLD") ? atoi(getenv("MIN_WORLD")) : 0;
    while (step < STEPS || (rk_world(ctx) < min_world && step < 20 * STEPS)) {
        for (int i = 0; i < N; i++)
            g[i] = 1.0f;
        rc = rk_allreduce(ctx, g, N, RK_F32, RK_SUM);
        if (rc == RK_RECOVERED) {
            step = rk_next_step(ctx);
            continue;
        }
        if (rc)
            return fail("rk_allreduce", rc);
        int W = rk_world(ctx);
        if (g[0] != (float)W || g[N - 1] != (float)W) {
            fprintf(stderr, "FAIL %s step %lld: sum %g on a world of %d\n", who, (long long)step, g[0], W);
            return 1;
        }
        if (W != seen_world) {
            printf("ok %s world %d at step %lld\n", who, W, (long long)step);
            fflush(stdout);
            seen_world = W;
        }
        for (int i = 0; i < N; i++)
            w[i] += g[i] / (float)W;
        if (step == JOIN_AT && !joined_started && strcmp(who, "newcomer") != 0) {
            char self[4096];
            ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
            if (n <= 0)
                return fail("readlink /proc/self/exe", -1);
            self[n] = '\0';
            const char *mode = getenv("JOIN_MODE") ? getenv("JOIN_MODE") : "alive";
            char *argv[] = {"newcomer", (char *)mode, NULL};
            rec_join_spec spec = {.command = self, .argv = argv, .n = getenv("JOIN_N") ? atoi(getenv("JOIN_N")) : 1};
            if ((rc = rec_join_begin(ctx, &spec)) != 0)
                return fail("rec_join_begin", rc);
            joined_started = true;
        }
        rc = rk_step_done(ctx, step);
        if (rc == RK_RECOVERED) {
            step = rk_next_step(ctx);
            continue;
        }
        if (rc)
            return fail("rk_step_done", rc);
        step++;
        usleep(step_us); /* 20 ms unless STEP_MS says: the join happens while the job trains */
    }
    for (int i = 0; i < N; i++)
        if (w[i] != (float)step) {
            fprintf(stderr, "FAIL %s: w[%d] = %g at the end, want %lld\n", who, i, w[i], (long long)step);
            return 1;
        }
    printf("ok %s ends at step %lld on a world of %d, w exact\n", who, (long long)step, rk_world(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    static float w[N];
    if (getenv("STEPS"))
        steps_n = atoi(getenv("STEPS"));
    bool newcomer = argc > 2 && strcmp(argv[1], "newcomer") == 0;
    const char *who = newcomer ? "newcomer" : "member";
    if (newcomer && strncmp(argv[2], "fault:", 6) == 0)
        setenv("RK_FAULT", argv[2] + 6, 1); /* the newcomer's alone */
    const char *wrank = getenv("OMPI_COMM_WORLD_RANK"); /* set before MPI_Init by the spawn */
    if (newcomer && strncmp(argv[2], "fault-first:", 12) == 0 && wrank && strcmp(wrank, "0") == 0)
        setenv("RK_FAULT", argv[2] + 12, 1);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, NULL);
    if (rc)
        return fail("rk_init", rc);
    if ((rc = rk_register(ctx, "w", w, RK_F32, 1, (int64_t[]){N}, 0)) != 0)
        return fail("rk_register", rc);
    int wr = 0, wn = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &wn);
    if (newcomer && (strcmp(argv[2], "dies") == 0 || (strcmp(argv[2], "dies-last") == 0 && wr == wn - 1))) {
        printf("ok newcomer dies at slot %d\n", rk_rank(ctx));
        fflush(stdout);
        raise(SIGKILL);
    }
    int64_t next = 0;
    if ((rc = rk_resume(ctx, &next)) != 0)
        return fail("rk_resume", rc);
    if (newcomer) {
        printf("ok newcomer brought in at step %lld, rank %d of %d, w %g\n", (long long)next, rk_rank(ctx),
               rk_world(ctx), w[0]);
        fflush(stdout);
        if (w[0] != (float)next)
            return fail("the state the newcomer received", -1);
    } else {
        printf("ok member rank %d pid %d\n", rk_rank(ctx), (int)getpid());
    }
    rc = train(ctx, w, who, rk_world(ctx));
    int frc = rk_finalize(&ctx);
    if (!rc && frc)
        return fail("rk_finalize", frc);
    return rc;
}
