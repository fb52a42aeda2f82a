/*
 * tests/prog_shard.c - a worker for the tests of sharded and per-rank state
 * (tests/test_shard.c), run alone or under mpirun. Registers a replicated tensor, four
 * sharded ones (odd row counts, a 3 MiB one of several checksum blocks, one of a single
 * row, so that some ranks hold no rows) and a per-rank one whose size depends on the rank.
 * The global tensor's bytes at step s are a function of (tensor, byte, s, seed); a rank
 * holds its rows of it. A per-rank tensor's bytes are a function of (tensor, rank, s, seed).
 *
 *   prog_shard write STEPS SEED SPLIT        runs STEPS steps (checkpoints per RK_CKPT_*),
 *                                            scribbles over every buffer after each
 *                                            rk_step_done, rk_wait; prints "rank R wrote"
 *   prog_shard resume EXPECT SEED SPLIT OLDW rk_resume into this world; checks next_step,
 *                                            every slice and per-rank tensor bitwise (a rank
 *                                            >= OLDW: its per-rank buffer is left as it was);
 *                                            prints "rank R resumed S"
 *   prog_shard kill STEPS SEED VICTIMS       steps with an allreduce each, checkpoints per
 *                                            RK_CKPT_*; each rank of VICTIMS (a comma-separated
 *                                            list) SIGKILLs itself before the
 *                                            allreduce of step 5; a survivor that gets
 *                                            RK_RECOVERED learns its new slices
 *                                            (rk_shard_rows), rebinds the resized ones
 *                                            (rk_rebind), checks every byte and goes on; prints
 *                                            "rank R recovered world W step S ok"
 *   prog_shard expect NAME STEP SEED FILE    (no rk_init) writes the expected bytes of the
 *                                            global tensor NAME (or ranks/<r>/<name>) to FILE
 *   prog_shard flags                         the registration errors, one process
 * SPLIT: "even" (rank r gets G/W rows, one more if r < G%W) or "uneven" (rank r gets a
 * share growing with r; rank 0 may get none).
 * PROG_FAULT_RANK=r with PROG_FAULT=spec sets RK_FAULT=spec on launch rank r alone.
 * PROG_SECOND_VICTIM=r (kill): launch rank r SIGKILLs itself right after its first
 * recovery, before the step after it (a second loss while the rebuilt snapshot is held).
 * Exit: 0 ok, 3 rk_* failed, 4 wrong data.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "prog_common.h"
#include "rekindle.h"

struct spec {
    const char *name;
    rk_dtype dtype;
    int ndim;
    int64_t shape[3]; /* sharded: the global shape */
    unsigned flags;
};

static const struct spec specs[] = {
    {"rep/a", RK_F32, 2, {7, 3}, 0},
    {"sh/w", RK_F64, 2, {23, 5}, RK_SHARDED},
    {"sh/big", RK_U8, 1, {3 * 1048576 + 17}, RK_SHARDED},
    {"sh/bf", RK_BF16, 3, {5, 2, 3}, RK_SHARDED},
    {"state/rng", RK_I64, 1, {3}, RK_PER_RANK}, /* rank r: 3 + r elements */
    {"sh/one", RK_U8, 2, {1, 7}, RK_SHARDED},
};
#define NSPECS RK_ARRAY_LEN(specs)

static uint8_t byte_at(size_t t, uint64_t i, int64_t step, uint64_t seed)
{
    return prog_byte_at(t, i, step, seed);
}

static size_t row_bytes(const struct spec *s)
{
    size_t n = rk__dtype_size(s->dtype);
    for (int d = 1; d < s->ndim; d++)
        n *= (size_t)s->shape[d];
    return n;
}

/* The rows [*row0, *row0 + *rows) of a G-row tensor that rank r of w holds. */
static void split(int64_t g, int w, int r, bool even, int64_t *row0, int64_t *rows)
{
    if (even) {
        int64_t q = g / w, m = g % w;
        *rows = q + (r < m);
        *row0 = r * q + (r < m ? r : m);
        return;
    }
    int64_t tot = (int64_t)w * (w + 1) / 2;
    int64_t a = g * ((int64_t)r * (r + 1) / 2) / tot, b = g * ((int64_t)(r + 1) * (r + 2) / 2) / tot;
    *row0 = a;
    *rows = b - a;
}

/* kill: per-rank tensors of one size on every rank. A rollback in place gives new rank r
   old rank r's per-rank state (as a restore from disk does), so a size that depends on
   the rank could not survive the renumbering after a loss below the last rank. */
static bool same_size_per_rank;

/* Per-rank tensor t's element count on rank r. */
static int64_t per_rank_len(const struct spec *s, int r)
{
    return s->shape[0] + (same_size_per_rank ? 0 : r);
}

/* What tensor t holds on rank r at step s: bytes [first, first + n) of the global tensor
   (sharded, replicated) or of rank r's own (per-rank). */
static void fill(uint8_t *p, size_t t, int r, uint64_t first, size_t n, int64_t step, uint64_t seed)
{
    size_t key = specs[t].flags & RK_PER_RANK ? t + 16 * (size_t)(r + 1) : t;
    for (size_t i = 0; i < n; i++)
        p[i] = byte_at(key, first + i, step, seed);
}

struct slot {
    uint8_t *buf;
    int64_t row0, rows, shape[3];
    size_t nbytes;
};

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, rk_strerror(rc), rk_last_error());
    return 3;
}

/* Buffers and registrations of this rank (world w) in slot[]. */
static int register_all(rk_ctx *ctx, struct slot *slot, bool even)
{
    int r = rk_rank(ctx), w = rk_world(ctx), rc;
    for (size_t t = 0; t < NSPECS; t++) {
        const struct spec *s = &specs[t];
        struct slot *x = &slot[t];
        memcpy(x->shape, s->shape, sizeof(x->shape));
        x->row0 = 0;
        if (s->flags & RK_SHARDED)
            split(s->shape[0], w, r, even, &x->row0, &x->shape[0]);
        if (s->flags & RK_PER_RANK)
            x->shape[0] = per_rank_len(s, r);
        x->rows = x->shape[0];
        x->nbytes = (size_t)x->rows * row_bytes(s);
        x->buf = malloc(x->nbytes + 1);
        if ((rc = rk_register(ctx, s->name, x->buf, s->dtype, s->ndim, x->shape, s->flags)) != 0)
            return fail("rk_register", rc);
        int64_t off = -1, rows = -1, g = -1;
        if ((s->flags & RK_SHARDED) &&
            ((rc = rk_shard_rows(ctx, s->name, &off, &rows, &g)) != 0 || off != x->row0 || rows != x->rows ||
             g != s->shape[0])) {
            fprintf(stderr, "rk_shard_rows '%s': %d offset %" PRId64 " rows %" PRId64 " of %" PRId64 ", want %" PRId64
                    " %" PRId64 " of %" PRId64 "\n", s->name, rc, off, rows, g, x->row0, x->rows, s->shape[0]);
            return 4;
        }
    }
    return 0;
}

static void fill_all(struct slot *slot, int r, int64_t step, uint64_t seed)
{
    for (size_t t = 0; t < NSPECS; t++)
        fill(slot[t].buf, t, r, (uint64_t)slot[t].row0 * row_bytes(&specs[t]), slot[t].nbytes, step, seed);
}

/* Every byte of this rank's tensors is that of `step`; per-rank ones only if keep_rank. */
static int check_all(struct slot *slot, int r, int64_t step, uint64_t seed, bool per_rank_restored)
{
    for (size_t t = 0; t < NSPECS; t++) {
        struct slot *x = &slot[t];
        uint8_t *want = malloc(x->nbytes + 1);
        if ((specs[t].flags & RK_PER_RANK) && !per_rank_restored)
            memset(want, 0x5A, x->nbytes);
        else
            fill(want, t, r, (uint64_t)x->row0 * row_bytes(&specs[t]), x->nbytes, step, seed);
        for (size_t i = 0; i < x->nbytes; i++)
            if (x->buf[i] != want[i]) {
                fprintf(stderr, "rank %d: tensor %s (rows %" PRId64 "+%" PRId64 ") byte %zu is %02x, want %02x\n", r,
                        specs[t].name, x->row0, x->rows, i, x->buf[i], want[i]);
                free(want);
                return 4;
            }
        free(want);
    }
    return 0;
}

static int expect(const char *name, int64_t step, uint64_t seed, const char *file)
{
    int r = 0;
    char base[256];
    snprintf(base, sizeof(base), "%s", name);
    if (sscanf(name, "ranks/%d/%255s", &r, base) != 2)
        r = 0;
    for (size_t t = 0; t < NSPECS; t++) {
        if (strcmp(specs[t].name, base) != 0)
            continue;
        size_t n = row_bytes(&specs[t]) * (size_t)(specs[t].flags & RK_PER_RANK ? per_rank_len(&specs[t], r)
                                                                                  : specs[t].shape[0]);
        uint8_t *p = malloc(n + 1);
        fill(p, t, r, 0, n, step, seed);
        FILE *f = fopen(file, "wb");
        bool ok = f && fwrite(p, 1, n, f) == n;
        if (f)
            fclose(f);
        free(p);
        return ok ? 0 : 3;
    }
    fprintf(stderr, "no tensor %s\n", name);
    return 2;
}

/* RK_DEVICE on host memory: RK_E_CUDA in a build with CUDA (a host pointer, or no device),
   RK_E_NOTAVAIL without. */
#ifdef RK_HAVE_CUDA
#define NO_DEVICE RK_E_CUDA
#else
#define NO_DEVICE RK_E_NOTAVAIL
#endif

/* Registration errors (one process). */
static int flags_mode(rk_ctx *ctx)
{
    static float x[4];
    int64_t shape[2] = {4, 1};
    struct {
        const char *name;
        int ndim;
        unsigned flags;
        int want;
    } cases[] = {
        {"dev", 1, RK_DEVICE, NO_DEVICE},           {"both", 1, RK_SHARDED | RK_PER_RANK, -EINVAL},
        {"dev/sharded", 1, RK_DEVICE | RK_SHARDED, RK_E_NOTAVAIL},
        {"scalar", 0, RK_SHARDED, -EINVAL},          {"ranks/x", 1, RK_PER_RANK, RK_E_NAME},
        {"ranks", 1, 0, RK_E_NAME},                  {"unknown", 1, 16u, -EINVAL},
        {"ok/sharded", 2, RK_SHARDED, 0},            {"ok/per_rank", 1, RK_PER_RANK, 0},
    };
    int status = 0;
    for (size_t i = 0; i < RK_ARRAY_LEN(cases); i++) {
        int rc = rk_register(ctx, cases[i].name, x, RK_F32, cases[i].ndim, shape, cases[i].flags);
        if (rc != cases[i].want) {
            fprintf(stderr, "rk_register '%s' flags %u: %d (%s), want %d\n", cases[i].name, cases[i].flags, rc,
                    rk_strerror(rc), cases[i].want);
            status = 4;
        }
    }
    int64_t off = -1, rows = -1;
    if (rk_shard_rows(ctx, "ok/sharded", &off, &rows, NULL) != 0 || off != 0 || rows != 4 ||
        rk_shard_rows(ctx, "ok/per_rank", &off, &rows, NULL) != -ENOENT) {
        fprintf(stderr, "rk_shard_rows: offset %" PRId64 " rows %" PRId64 "\n", off, rows);
        status = 4;
    }
    if (!status)
        printf("flags ok\n");
    return status;
}

/* Steps with an allreduce each; the victim dies at step 5; survivors check the rollback. */
static bool listed(const char *list, int rank)
{
    for (const char *p = list; p && *p; p = strchr(p, ','), p = p ? p + 1 : NULL)
        if (atoi(p) == rank)
            return true;
    return false;
}

static int kill_mode(rk_ctx *ctx, struct slot *slot, int64_t steps, uint64_t seed, const char *victims)
{
    int rc;
    bool victim = listed(victims, rk_rank(ctx));
    /* PROG_SECOND_VICTIM=r: launch rank r SIGKILLs itself right after its first recovery. */
    const char *second = getenv("PROG_SECOND_VICTIM"), *launch_rank = getenv("OMPI_COMM_WORLD_RANK");
    bool second_victim = second && launch_rank && strcmp(second, launch_rank) == 0;
    for (int64_t s = rk_next_step(ctx); s < steps; s++) {
        if (s == 5 && victim) {
            fflush(NULL);
            raise(SIGKILL);
        }
        double one = 1.0;
        rc = rk_allreduce(ctx, &one, 1, RK_F64, RK_SUM);
        if (rc == RK_RECOVERED) {
            int r = rk_rank(ctx), w = rk_world(ctx);
            int64_t next = rk_next_step(ctx);
            for (size_t t = 0; t < NSPECS; t++) {
                struct slot *x = &slot[t];
                if (!(specs[t].flags & RK_SHARDED))
                    continue;
                int64_t off, rows;
                if ((rc = rk_shard_rows(ctx, specs[t].name, &off, &rows, NULL)) != 0)
                    return fail("rk_shard_rows", rc);
                x->row0 = off;
                if (rows != x->rows) { /* a new buffer of the new size gets the restored rows */
                    free(x->buf);
                    x->rows = x->shape[0] = rows;
                    x->nbytes = (size_t)rows * row_bytes(&specs[t]);
                    x->buf = malloc(x->nbytes + 1);
                    if ((rc = rk_rebind(ctx, specs[t].name, x->buf)) != 0)
                        return fail("rk_rebind", rc);
                }
            }
            /* Per-rank state: new rank r has the checkpoint's rank r's (one size on every
               rank in this mode: same_size_per_rank). */
            if ((rc = check_all(slot, r, next, seed, true)) != 0)
                return rc;
            printf("rank %d recovered world %d step %" PRId64 " ok\n", r, w, next);
            if (second_victim) { /* lost right after the rebuild: before any new snapshot */
                fflush(NULL);
                raise(SIGKILL);
            }
            s = next - 1;
            continue;
        }
        if (rc)
            return fail("rk_allreduce", rc);
        fill_all(slot, rk_rank(ctx), s + 1, seed);
        if ((rc = rk_step_done(ctx, s)) < 0)
            return fail("rk_step_done", rc);
        if (rc == RK_RECOVERED) {
            fprintf(stderr, "recovered in rk_step_done: not expected by this test\n");
            return 4;
        }
    }
    /* The checkpoint in flight at the loss was abandoned: rk_wait reports that once. */
    if ((rc = rk_wait(ctx)) != 0 && rc != RK_E_ABORTED)
        return fail("rk_wait", rc);
    printf("rank %d done world %d\n", rk_rank(ctx), rk_world(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    same_size_per_rank = strcmp(mode, "kill") == 0;
    if (strcmp(mode, "expect") == 0)
        return argc == 6 ? expect(argv[2], strtoll(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), argv[5]) : 2;
    int64_t arg = argc > 2 ? strtoll(argv[2], NULL, 10) : 0;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    bool even = argc > 4 && strcmp(argv[4], "even") == 0;
    /* PROG_FAULT_RANK=r PROG_FAULT=spec: RK_FAULT=spec on the process of launch rank r alone. */
    const char *fault_rank = getenv("PROG_FAULT_RANK"), *launch_rank = getenv("OMPI_COMM_WORLD_RANK");
    if (fault_rank && launch_rank && strcmp(fault_rank, launch_rank) == 0 && getenv("PROG_FAULT"))
        setenv("RK_FAULT", getenv("PROG_FAULT"), 1);
    rk_ctx *ctx = prog_rk_init();
    int rc, status = 0;
    if (!ctx)
        return 3;
    struct slot slot[NSPECS];
    memset(slot, 0, sizeof(slot));
    if (strcmp(mode, "flags") == 0) {
        status = flags_mode(ctx);
    } else if ((status = register_all(ctx, slot, even)) != 0) {
        /* reported */
    } else if (strcmp(mode, "write") == 0) {
        for (int64_t s = 0; s < arg && !status; s++) {
            fill_all(slot, rk_rank(ctx), s + 1, seed);
            if ((rc = rk_step_done(ctx, s)) < 0)
                status = fail("rk_step_done", rc);
            for (size_t t = 0; t < NSPECS; t++) /* must not reach the checkpoint */
                memset(slot[t].buf, 0xA5, slot[t].nbytes);
        }
        if (!status && (rc = rk_wait(ctx)) != 0)
            status = fail("rk_wait", rc);
        if (!status)
            printf("rank %d wrote\n", rk_rank(ctx));
    } else if (strcmp(mode, "resume") == 0) {
        int oldw = argc > 5 ? atoi(argv[5]) : rk_world(ctx);
        int64_t next = -2;
        for (size_t t = 0; t < NSPECS; t++)
            memset(slot[t].buf, 0x5A, slot[t].nbytes);
        if ((rc = rk_resume(ctx, &next)) != 0) {
            status = fail("rk_resume", rc);
        } else if (next != arg) {
            fprintf(stderr, "next_step %" PRId64 ", want %" PRId64 "\n", next, arg);
            status = 4;
        } else if ((status = check_all(slot, rk_rank(ctx), next, seed, rk_rank(ctx) < oldw)) == 0) {
            printf("rank %d resumed %" PRId64 "\n", rk_rank(ctx), next);
        }
    } else if (strcmp(mode, "kill") == 0) {
        status = kill_mode(ctx, slot, arg, seed, argc > 4 ? argv[4] : "");
    }
    fflush(NULL);
    rc = rk_finalize(&ctx);
    for (size_t t = 0; t < NSPECS; t++)
        free(slot[t].buf);
    if (rc && !status)
        status = fail("rk_finalize", rc);
    return status;
}
