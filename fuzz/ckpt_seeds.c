/*
 * fuzz/ckpt_seeds.c - writes committed checkpoints of sharded, per-rank and replicated
 * tensors under DIR, as step directories for fuzz/mkseeds.py: the seeds from which
 * fuzz_ckpt reaches the sharded pieces' manifest lines and their block reads (the
 * checkpoints of tests/prog_ckpt have replicated tensors only). One of 2 ranks and one of
 * 3, split unevenly ("sh/one", one row, has empty pieces); "sh/wide" is 3 MiB of rows of 256 KiB, 4
 * to a checksummed block, so that a piece has several blocks, mostly zeros so that the
 * seeds stay small. Written with the formats' own writer; built with the normal compiler
 * by `make fuzz`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/fmt.h"

#define WIDE_ROW (256u << 10)
#define WIDE_ROWS 12
#define F_ROWS 23

static unsigned char f[F_ROWS * 3 * 4], wide[WIDE_ROWS * WIDE_ROW], rep[7 * 4];

/* Rank r's rows of g global ones, in a world of w: a share growing with r (of "sh/one",
   rank 0 holds none). */
static void split(int64_t g, int w, int r, int64_t *row0, int64_t *rows)
{
    int64_t total = (int64_t)w * (w + 1) / 2, at = 0;
    for (int k = 0; k <= r; k++) {
        int64_t n = k + 1 < w ? g * (k + 1) / total : g - at;
        if (k == r) {
            *row0 = at;
            *rows = n;
        }
        at += n;
    }
}

static fmt_tensor piece(const char *name, rk_dtype dt, int ndim, const int64_t *shape, const unsigned char *g,
                        int w, int r, uint32_t order)
{
    int64_t row0 = 0, rows = 0, rb = (int64_t)rk__dtype_size(dt);
    for (int d = 1; d < ndim; d++)
        rb *= shape[d];
    split(shape[0], w, r, &row0, &rows);
    fmt_tensor t = {.name = strdup(name), .dtype = dt, .ndim = ndim, .nbytes = (uint64_t)(rows * rb), .order = order,
                    .rank = r, .data = g + row0 * rb, .kind = FMT_SHARDED, .rows = shape[0], .row0 = row0};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)ndim);
    t.shape[0] = rows;
    return t;
}

static int write_step(const char *dir, int w)
{
    static const int64_t f_shape[] = {F_ROWS, 3}, wide_shape[] = {WIDE_ROWS, WIDE_ROW}, one_shape[] = {1, 7};
    char step[4096], path[4200];
    snprintf(step, sizeof(step), "%s/w%d", dir, w);
    mkdir(step, 0755);
    snprintf(step, sizeof(step), "%s/w%d/step-000000000006", dir, w);
    if (mkdir(step, 0755) != 0)
        return -1;
    fmt_manifest *m[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int r = 0; r < w && !rc; r++) {
        if (!(m[r] = calloc(1, sizeof(*m[r]))) || !(m[r]->t = calloc(5, sizeof(fmt_tensor))))
            return -1;
        *m[r] = (fmt_manifest){.version = FMT_VERSION, .step = 6, .rank = r, .world = w, .nonce = 42, .t = m[r]->t};
        m[r]->t[m[r]->n++] = piece("sh/f", RK_F32, 2, f_shape, f, w, r, 0);
        m[r]->t[m[r]->n++] = piece("sh/wide", RK_U8, 2, wide_shape, wide, w, r, 1);
        m[r]->t[m[r]->n++] = piece("sh/one", RK_U8, 2, one_shape, rep, w, r, 2);
        m[r]->t[m[r]->n++] = (fmt_tensor){.name = strdup("state/rng"), .dtype = RK_I64, .ndim = 1, .shape = {1 + r},
                                          .nbytes = 8 * (uint64_t)(1 + r), .order = 3, .rank = r, .data = f,
                                          .kind = FMT_PER_RANK};
        if (r == w - 1)
            m[r]->t[m[r]->n++] = (fmt_tensor){.name = strdup("rep/a"), .dtype = RK_F32, .ndim = 2, .shape = {7, 1},
                                              .nbytes = sizeof(rep), .order = 4, .rank = r, .data = rep};
        fmt_write_stats st;
        snprintf(path, sizeof(path), "%s/shard-%d.h5", step, r);
        rc = fmt_shard_write(path, m[r], "buffered", &st);
        snprintf(m[r]->io_path, sizeof(m[r]->io_path), "%s", st.io_path);
        snprintf(path, sizeof(path), "%s/shard-%d.ok", step, r);
        if (!rc)
            rc = fmt_manifest_write(path, m[r]);
    }
    if (!rc)
        rc = fmt_index_write(step, 6, w, m, "buffered", 1);
    for (int r = 0; r < w; r++)
        fmt_manifest_free(&m[r]);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ckpt_seeds DIR\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof(f); i++)
        f[i] = (unsigned char)(i * 37 + 11);
    for (size_t i = 0; i < sizeof(rep); i++)
        rep[i] = (unsigned char)(i * 13 + 1);
    for (size_t r = 0; r < WIDE_ROWS; r++)
        for (size_t i = 0; i < 64; i++)
            wide[r * WIDE_ROW + i * 4096] = (unsigned char)(r * 64 + i + 1);
    mkdir(argv[1], 0755);
    for (int w = 2; w <= 3; w++)
        if (write_step(argv[1], w) != 0) {
            fprintf(stderr, "ckpt_seeds: world %d: %s\n", w, rk_last_error());
            return 1;
        }
    return 0;
}
