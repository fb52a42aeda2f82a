/*
 * tests/prog_update.c - a training loop written from include/rekindle.h alone, whose
 * registered state changes before its allreduce: a data loader's position, advanced at the
 * start of every step. rekindle.h says such a program calls rk_before_update() first (the
 * snapshot of the step before may still be copied then); run by tests/test_recover.c under
 * `rekindle run`, with a worker killed.
 *
 *   prog_update STEPS VICTIM KILL_AT [no-before-update]
 *
 * State: "model/w" (1 Mi doubles) and "data/pos" (one int64). At the start of step s the
 * state is pos = s and every w[i] = 1 + 2 + ... + s; step s moves pos to s + 1, averages
 * pos over the ring and adds it to w. The worker started as rank VICTIM raise(SIGKILL)s
 * at step KILL_AT after moving pos. Whatever the recoveries, a survivor must end with pos = STEPS and w[i] =
 * STEPS (STEPS + 1) / 2: it prints "rank R ok" then, else "rank R WRONG ..." (exit 3).
 * With "no-before-update" it does not call rk_before_update (what the docs say not to do).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle.h"

#define N (1 << 20)

static double w[N];
static int64_t pos[1];

static int bad(rk_ctx *ctx, const char *what, int rc)
{
    fprintf(stderr, "rank %d: %s: %s\n", ctx ? rk_rank(ctx) : -1, what, rk_strerror(rc));
    rk_finalize(&ctx);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return fprintf(stderr, "usage: prog_update STEPS VICTIM KILL_AT [no-before-update]\n"), 2;
    int64_t steps = atoll(argv[1]), kill_at = atoll(argv[3]);
    int victim = atoi(argv[2]);
    int before = !(argc > 4 && strcmp(argv[4], "no-before-update") == 0);
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o);
    if (rc)
        return bad(NULL, "rk_init", rc);
    if ((rc = rk_register(ctx, "model/w", w, RK_F64, 1, (int64_t[]){N}, 0)) != 0 ||
        (rc = rk_register(ctx, "data/pos", pos, RK_I64, 1, (int64_t[]){1}, 0)) != 0)
        return bad(ctx, "rk_register", rc);
    int64_t step = 0;
    int me0 = rk_rank(ctx); /* ranks are renumbered after a loss: the victim is one process */
    if ((rc = rk_resume(ctx, &step)) != 0)
        return bad(ctx, "rk_resume", rc);
    while (step < steps) {
        if (before && (rc = rk_before_update(ctx)) != 0)
            return bad(ctx, "rk_before_update", rc);
        pos[0] += 1; /* the data loader moves on */
        if (me0 == victim && step == kill_at) {
            fflush(NULL);
            raise(SIGKILL);
        }
        double g = (double)pos[0];
        rc = rk_allreduce(ctx, &g, 1, RK_F64, RK_SUM);
        if (rc == 0) {
            g /= rk_world(ctx);
            for (size_t i = 0; i < N; i++)
                w[i] += g;
            rc = rk_step_done(ctx, step);
        }
        if (rc == RK_RECOVERED) {
            step = rk_next_step(ctx);
            printf("rank %d recovered world %d step %lld\n", rk_rank(ctx), rk_world(ctx), (long long)step);
            continue;
        }
        if (rc)
            return bad(ctx, "rk_allreduce / rk_step_done", rc);
        step++;
    }
    double want = (double)steps * (double)(steps + 1) / 2;
    size_t wrong = 0;
    for (size_t i = 0; i < N; i++)
        wrong += w[i] != want;
    int r = rk_rank(ctx);
    if (pos[0] != steps || wrong)
        printf("rank %d WRONG pos %lld (want %lld), %zu of w not %.0f (w[0] %.0f)\n", r, (long long)pos[0],
               (long long)steps, wrong, want, w[0]);
    else
        printf("rank %d ok\n", r);
    fflush(stdout);
    rc = rk_finalize(&ctx);
    return pos[0] != steps || wrong ? 3 : rc ? 2 : 0;
}
