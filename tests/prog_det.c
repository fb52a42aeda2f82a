/*
 * tests/prog_det.c - a worker for the detector's integration tests and benchmarks.
 *
 * rk_init, then rk_step_done in a loop with small sleeps for PROG_DET_MS milliseconds
 * (default 8000), then rk_finalize. With PROG_DET_DIR set it writes "<pid> <port>" to
 * PROG_DET_DIR/rank-<R> once the detector runs, so a test can signal it or send it
 * datagrams. Prints what it observes: "rank R fenced: ..." (then exits 0) when the others
 * declared it dead (with PROG_DET_FENCED_SLEEP_MS, after sleeping that long without
 * calling the library), "rank R recovered at step S" when rk_step_done returns RK_RECOVERED
 * (it goes on from there), and at the end "rank R epoch E members M".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prog_common.h"
#include "../detector/det.h"
#include "../recover/rec_internal.h"

static void write_rank_file(const char *dir, int rank, int port)
{
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof(tmp), "%s/.rank-%d", dir, rank);
    snprintf(path, sizeof(path), "%s/rank-%d", dir, rank);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "%d %d\n", (int)getpid(), port);
    fclose(f);
    rename(tmp, path);
}

/* PROG_DET_FENCED_SLEEP_MS: once fenced, sleep that long without calling the library
   (a program busy elsewhere), so a test can count the process's CPU meanwhile. */
static void fenced_sleep(void)
{
    const char *e = getenv("PROG_DET_FENCED_SLEEP_MS");
    long ms = e ? atol(e) : 0;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int main(void)
{
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    int rc;
    int rank = rk_rank(ctx);
    const char *dir = getenv("PROG_DET_DIR");
    if (dir && ctx->det)
        write_rank_file(dir, rank, det_port(ctx->det));
    long run_ms = getenv("PROG_DET_MS") ? atol(getenv("PROG_DET_MS")) : 8000;
    int64_t end = rk__deadline_ns(run_ms);
    int64_t step = 0;
    while (!rk__deadline_passed(end)) {
        rc = rk_step_done(ctx, step++);
        if (rc == RK_E_FENCED) {
            printf("rank %d fenced: %s\n", rank, rk_strerror(rc));
            fflush(stdout);
            fenced_sleep();
            break;
        }
        if (rc == RK_RECOVERED) { /* recovery rebuilt the job without the lost worker */
            printf("rank %d recovered at step %lld\n", rank, (long long)rk_next_step(ctx));
            fflush(stdout);
            step = rk_next_step(ctx);
            rc = 0;
            continue;
        }
        if (rc != 0) {
            fprintf(stderr, "rank %d: rk_step_done: %s\n", rank, rk_strerror(rc));
            return 5;
        }
        rk__sleep_ns(10 * 1000000LL);
    }
    if (rc == 0 && ctx->det) {
        det_view v;
        det_view_get(ctx->det, &v);
        printf("rank %d epoch %llu members %d\n", rank, (unsigned long long)v.epoch, v.nmembers);
        fflush(stdout);
    }
    rc = rk_finalize(&ctx);
    if (rc != 0) {
        fprintf(stderr, "rank %d: rk_finalize: %s\n", rank, rk_strerror(rc));
        return 4;
    }
    return 0;
}
