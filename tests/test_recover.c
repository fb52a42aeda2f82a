/*
 * tests/test_recover.c - the recover/ part: the tensor registry behind rk_register
 * (names HDF5 can hold, no dataset/group clash, dtype, shape, buffers) and the API's
 * behaviour on a single process; the decision rule (coord.c, I1..I6); and the rounds
 * (recovery.c, R5, R6) on real mpirun jobs of tests/prog_recover: a survivor that enters
 * recovery late, a coordinator or member that dies during recovery, a send MPI refuses,
 * and the common RK_E_TIMEOUT after the last round.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"
#include "../recover/rec.h"
#include "../recover/rec_internal.h"

static rk_ctx *ctx;

static void quiet_stderr(void)
{
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    close(null);
}

static void setup(void)
{
    unsetenv("RK_CKPT_DIR");
    unsetenv("RK_EVENT_LOG");
    quiet_stderr(); /* the failures below are expected; each is logged once */
    rk_options o;
    rk_options_init(&o);
    ck_assert_int_eq(rk_init(&ctx, &o), 0);
}

/* As setup, with a checkpoint directory. */
static void setup_ckpt(void)
{
    char *dir = th_tmpdir("recover-ckpt");
    setenv("RK_CKPT_DIR", dir, 1);
    free(dir);
    unsetenv("RK_EVENT_LOG");
    quiet_stderr();
    rk_options o;
    rk_options_init(&o);
    ck_assert_int_eq(rk_init(&ctx, &o), 0);
    unsetenv("RK_CKPT_DIR");
}

static void teardown(void)
{
    rk_finalize(&ctx);
}

static float buf[64];
static const int64_t shape2[] = {8, 8};

START_TEST(register_accepts_good_tensors)
{
    th_assert_rc(rk_register(ctx, "model/layer0/w", buf, RK_F32, 2, shape2, 0), 0);
    th_assert_rc(rk_register(ctx, "model/layer0/b", buf, RK_F32, 1, (int64_t[]){8}, 0), 0);
    th_assert_rc(rk_register(ctx, "optim/t", buf, RK_I64, 0, NULL, 0), 0); /* scalar */
    th_assert_rc(rk_register(ctx, "empty", NULL, RK_BF16, 1, (int64_t[]){0}, 0), 0);
    th_assert_rc(rk_register(ctx, "model/layer1/w", buf, RK_U8, 1, (int64_t[]){64}, 0), 0);
    th_assert_rc(rk_register(ctx, "x y-z.w_1", buf, RK_F16, 1, (int64_t[]){4}, 0), 0);
}
END_TEST

static const struct {
    const char *name;
    int want;
} bad_names[] = {
    {"", RK_E_NAME},         {"/abs", RK_E_NAME},      {"trail/", RK_E_NAME},
    {"a//b", RK_E_NAME},     {"a/./b", RK_E_NAME},     {"../up", RK_E_NAME},
    {"tab\there", RK_E_NAME}, {"model/layer0/w", RK_E_DUPLICATE},
    {"model", RK_E_NAME},    /* a group of model/layer0/w */
    {"model/layer0/w/x", RK_E_NAME}, /* would make the dataset a group */
};

START_TEST(register_rejects_bad_names)
{
    th_assert_rc(rk_register(ctx, "model/layer0/w", buf, RK_F32, 2, shape2, 0), 0);
    th_assert_rc(rk_register(ctx, bad_names[_i].name, buf, RK_F32, 1, (int64_t[]){4}, 0), bad_names[_i].want);
    ck_assert_msg(strlen(rk_last_error()) > 0, "no message for '%s'", bad_names[_i].name);
}
END_TEST

/* RK_DEVICE: a host pointer is refused naming the tensor; where the CUDA runtime has no
   device (this machine: the toolkit, no driver) the error says so; a build without CUDA
   says it has none. Never registered. (Before: RK_E_NOTAVAIL whatever the build.) */
START_TEST(register_device_is_checked)
{
#ifdef RK_HAVE_CUDA
    th_assert_rc(rk_register(ctx, "gpu/w", buf, RK_F32, 1, (int64_t[]){4}, RK_DEVICE), RK_E_CUDA);
    ck_assert_msg(strstr(rk_last_error(), "'gpu/w'") &&
                      (strstr(rk_last_error(), "no CUDA device") || strstr(rk_last_error(), "not device memory")),
                  "unclear: %s", rk_last_error());
#else
    th_assert_rc(rk_register(ctx, "gpu/w", buf, RK_F32, 1, (int64_t[]){4}, RK_DEVICE), RK_E_NOTAVAIL);
    ck_assert_msg(strstr(rk_last_error(), "'gpu/w'") && strstr(rk_last_error(), "no CUDA"), "unclear: %s",
                  rk_last_error());
#endif
    /* the rebuild of a rank's own state from memory is host memory only */
    th_assert_rc(rk_register(ctx, "gpu/s", buf, RK_F32, 1, (int64_t[]){4}, RK_DEVICE | RK_SHARDED), RK_E_NOTAVAIL);
    th_assert_rc(rk_register(ctx, "gpu/w", buf, RK_F32, 1, (int64_t[]){4}, 0), 0); /* the name is still free */
}
END_TEST

START_TEST(register_rejects_bad_arguments)
{
    char longname[300];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    th_assert_rc(rk_register(ctx, longname, buf, RK_F32, 1, (int64_t[]){4}, 0), RK_E_NAME);
    th_assert_rc(rk_register(ctx, NULL, buf, RK_F32, 1, (int64_t[]){4}, 0), RK_E_NAME);
    th_assert_rc(rk_register(ctx, "t", buf, (rk_dtype)42, 1, (int64_t[]){4}, 0), RK_E_DTYPE);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){4}, 16u), -EINVAL); /* unknown flag */
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){4}, RK_SHARDED | RK_PER_RANK), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 9, shape2, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, -1, shape2, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 2, NULL, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){-3}, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", NULL, RK_F32, 1, (int64_t[]){4}, 0), -EINVAL);
    th_assert_rc(rk_register(ctx, "t", buf, RK_F64, 3, (int64_t[]){1LL << 40, 1LL << 40, 1LL << 40}, 0), -EOVERFLOW);
    th_assert_rc(rk_register(NULL, "t", buf, RK_F32, 1, (int64_t[]){4}, 0), -EINVAL);
    /* none of the failures registered anything: the name is still free */
    th_assert_rc(rk_register(ctx, "t", buf, RK_F32, 1, (int64_t[]){4}, 0), 0);
}
END_TEST

START_TEST(allreduce_checks_arguments)
{
    th_assert_rc(rk_allreduce(ctx, buf, 4, RK_F32, RK_SUM), 0);
    ck_assert_float_eq(buf[0], 0.0f);
    th_assert_rc(rk_allreduce(ctx, NULL, 4, RK_F32, RK_SUM), -EINVAL);
    th_assert_rc(rk_allreduce(ctx, NULL, 0, RK_F32, RK_SUM), 0);
    th_assert_rc(rk_allreduce(ctx, buf, 4, (rk_dtype)42, RK_SUM), RK_E_DTYPE);
    th_assert_rc(rk_allreduce(ctx, buf, 4, RK_F32, (rk_op)9), RK_E_OP);
    th_assert_rc(rk_allreduce(NULL, buf, 4, RK_F32, RK_SUM), -EINVAL);
}
END_TEST

/* ---- the coordinator's decision (recover/coord.c, docs/PROTOCOL.md) --------------------- */

static rec_report R(int rank0, int64_t next, int64_t held, int64_t committed)
{
    return (rec_report){.rank0 = rank0, .epoch = 1, .next_step = next, .held_step = held, .committed_step = committed,
                        .older_step = -1};
}

static rec_decision dec;

START_TEST(decide_I1_majority_required)
{
    int prev[] = {0, 1, 2, 3};
    rec_report three[] = {R(3, 10, 8, 8), R(0, 10, 8, 8), R(2, 11, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, three, 3, 1, 7, &dec), 0);
    rec_report two_with_lowest[] = {R(0, 10, 8, 8), R(1, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, two_with_lowest, 2, 1, 7, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.all_hold, 1);
    rec_report two_without_lowest[] = {R(2, 10, 8, 8), R(3, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, two_without_lowest, 2, 1, 7, &dec), RK_E_NO_MAJORITY);
    rec_report one[] = {R(0, 10, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, one, 1, 1, 7, &dec), RK_E_NO_MAJORITY);
    /* a job of two survives losing its second worker, not its first */
    int prev2[] = {5, 9};
    th_assert_rc(rec_decide(prev2, 2, (rec_report[]){R(5, 3, 2, -1)}, 1, 1, 2, &dec), 0);
    th_assert_rc(rec_decide(prev2, 2, (rec_report[]){R(9, 3, 2, -1)}, 1, 1, 2, &dec), RK_E_NO_MAJORITY);
}
END_TEST

START_TEST(decide_I2_min_world)
{
    int prev[] = {0, 1, 2, 3, 4};
    rec_report rep[] = {R(0, 5, 4, 4), R(1, 5, 4, 4), R(2, 5, 4, 4)};
    th_assert_rc(rec_decide(prev, 5, rep, 3, 4, 2, &dec), RK_E_MIN_WORLD);
    th_assert_rc(rec_decide(prev, 5, rep, 3, 3, 2, &dec), 0);
}
END_TEST

START_TEST(decide_I5_memory_first_I6_dense_order)
{
    int prev[] = {0, 1, 2, 3};
    /* rank 2 holds the newest snapshot (12); the others still hold 8; newest commit is 8 */
    rec_report rep[] = {R(3, 13, 8, 8), R(2, 13, 12, 8), R(1, 12, 8, 8)};
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 9, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 12);
    ck_assert_int_eq(dec.root, 2);
    ck_assert_int_eq(dec.all_hold, 0);
    ck_assert_int_eq(dec.steps_lost, 1);
    ck_assert_int_eq(dec.nmembers, 3);
    ck_assert_int_eq(dec.members[0], 1);
    ck_assert_int_eq(dec.members[1], 2);
    ck_assert_int_eq(dec.members[2], 3);
    ck_assert_uint_eq(dec.epoch, 9);
}
END_TEST

START_TEST(decide_I4_never_older_than_committed)
{
    int prev[] = {0, 1, 2};
    /* survivors' memory holds 8, but a survivor knows step 12 was committed: disk */
    rec_report rep[] = {R(0, 14, 8, 12), R(1, 14, -1, 8)};
    th_assert_rc(rec_decide(prev, 3, rep, 2, 1, 3, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
    ck_assert_int_eq(dec.step, 12);
    ck_assert_int_eq(dec.steps_lost, 2);
    /* nothing held, nothing committed */
    rec_report none[] = {R(0, 3, -1, -1), R(1, 3, -1, -1)};
    th_assert_rc(rec_decide(prev, 3, none, 2, 1, 3, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_NOTHING);
    ck_assert_int_eq(dec.step, 0);
}
END_TEST

/* I5 with partner copies (sharded or per-rank state): memory only if every lost member's
   right neighbour (ring order, cyclic) survived and every survivor holds the step. */
START_TEST(decide_I5_partners)
{
    int prev[] = {3, 1, 0, 2, 4}; /* any order: the ring is 0 1 2 3 4 */
    rec_report rep[4];
    const int alive_sets[][3] = {{0, 2, 4}, {0, 1, 4}, {1, 2, 4}};
    const int want[] = {REC_FROM_MEMORY, REC_FROM_DISK, REC_FROM_MEMORY};
    for (int k = 0; k < 3; k++) { /* lost {1,3}: neighbours 2, 4 alive; {2,3}: 3 lost too; {0,3}: 1 and 4 */
        for (int i = 0; i < 3; i++) {
            rep[i] = R(alive_sets[k][i], 9, 8, 6);
            rep[i].partnered = 1;
        }
        th_assert_rc(rec_decide(prev, 5, rep, 3, 1, 2, &dec), 0);
        ck_assert_msg(dec.source == want[k], "case %d: source %d", k, dec.source);
        ck_assert_int_eq(dec.step, want[k] == REC_FROM_MEMORY ? 8 : 6);
    }
    /* a survivor without the newest snapshot: disk (its pieces of step 8 are missing) */
    rep[1].held_step = -1;
    th_assert_rc(rec_decide(prev, 5, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
}
END_TEST

/* I5 with partner copies and no member lost (a growth in place, recovery.c G5): the newest
   step of which every member holds its own pieces counts, its partner copies sent or not;
   with a member lost it does not (the lost pieces are in the partner copies only). */
START_TEST(decide_I5_growth_own_pieces)
{
    int prev[] = {0, 1, 2};
    rec_report rep[3];
    for (int i = 0; i < 3; i++) {
        rep[i] = R(i, 11, 10, 6); /* the partnered snapshot: 10 */
        rep[i].partnered = 1;
        rep[i].own_step = 11; /* the step's own pieces, its partner copy not yet sent */
    }
    th_assert_rc(rec_decide(prev, 3, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 11);
    ck_assert_int_eq(dec.steps_lost, 0);
    /* one member did not take the snapshot of 11: the newest all hold, 10 */
    rep[1].own_step = 10;
    th_assert_rc(rec_decide(prev, 3, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.step, 10);
    /* a member lost: partnered steps only */
    rep[1].own_step = 11;
    th_assert_rc(rec_decide(prev, 3, rep, 2, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 10);
}
END_TEST

/* I7: a newcomer lost before its join's rollback completed held no piece of the step the
   others took before it came: where the reporters' own pieces of one step were taken in a
   world of exactly them (each rank once), that step counts as in a growth, no partner copy
   needed. A step taken with the lost member in the world (own_world 4), or a rank missing
   among the reporters, does not. */
START_TEST(decide_I7_lost_newcomer_held_nothing)
{
    int prev[] = {0, 1, 2, 3}; /* 3: the newcomer, lost in its join */
    rec_report rep[3];
    for (int i = 0; i < 3; i++) {
        rep[i] = R(i, 12, -1, 6); /* no partnered snapshot (11's partner copy never sent) */
        rep[i].partnered = 1;
        rep[i].own_step = 11;
        rep[i].own_rank = i;
        rep[i].own_world = 3;
    }
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 11);
    ck_assert_int_eq(dec.steps_lost, 1);
    rep[2].own_world = 4; /* taken with the lost member in it: its pieces are gone */
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
    ck_assert_int_eq(dec.step, 6);
    rep[2].own_world = 3;
    rep[2].own_rank = 1; /* rank 2's pieces held by nobody */
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
    rep[2].own_rank = 2;
    rep[2].own_step = 10; /* not one step */
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
}
END_TEST

/* Two generations (ckpt/snapshot.h S6): a survivor whose newest snapshot was not partnered (the
   member lost while it was being sent) offers the one before; with partner copies the
   decision is the newest step every survivor holds, of either generation; with replicated
   state the newest any survivor holds, and every holder of it counts, older or not. */
START_TEST(decide_I5_older_generation)
{
    int prev[] = {0, 1, 2, 3};
    rec_report rep[3] = {R(0, 11, 10, 6), R(2, 11, 9, 6), R(3, 11, 10, 6)};
    rep[0].older_step = 9;
    rep[1].older_step = 8;
    rep[2].older_step = 9;
    for (int i = 0; i < 3; i++)
        rep[i].partnered = 1;
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 9);
    ck_assert_int_eq(dec.all_hold, 1);
    ck_assert_int_eq(dec.steps_lost, 2);
    /* one survivor holds neither 9 nor 10: the newest held by all is none: disk */
    rep[1].held_step = 7;
    rep[1].older_step = 6;
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_DISK);
    ck_assert_int_eq(dec.step, 6);
    /* replicated state: the newest any survivor holds (10), rooted at the lowest holder;
       not all hold it */
    for (int i = 0; i < 3; i++)
        rep[i].partnered = 0;
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 10);
    ck_assert_int_eq(dec.root, 0);
    ck_assert_int_eq(dec.all_hold, 0);
    /* the older generation counts as holding: 9 everywhere, one has it as older */
    rep[0] = R(0, 10, 9, 6);
    rep[1] = R(2, 10, 10, 6);
    rep[1].older_step = 9;
    rep[2] = R(3, 10, 9, 6);
    for (int i = 0; i < 3; i++)
        rep[i].partnered = 1;
    rep[0].older_step = rep[2].older_step = 8;
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.step, 9);
    ck_assert_int_eq(dec.all_hold, 1);
    /* nobody's newest was partnered (a member lost before the partner copy was sent): the
       older generation alone is offered, and chosen */
    for (int i = 0; i < 3; i++) {
        rep[i].held_step = -1;
        rep[i].older_step = 9;
    }
    th_assert_rc(rec_decide(prev, 4, rep, 3, 1, 2, &dec), 0);
    ck_assert_int_eq(dec.source, REC_FROM_MEMORY);
    ck_assert_int_eq(dec.step, 9);
}
END_TEST

START_TEST(decide_rejects_malformed)
{
    int prev[] = {0, 1, 2};
    th_assert_rc(rec_decide(prev, 3, (rec_report[]){R(7, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(prev, 3, (rec_report[]){R(1, 1, -1, -1), R(1, 1, -1, -1)}, 2, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(prev, 0, (rec_report[]){R(1, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
    th_assert_rc(rec_decide(NULL, 3, (rec_report[]){R(1, 1, -1, -1)}, 1, 1, 1, &dec), -EINVAL);
}
END_TEST

/* ---- the rebuild's plan (rebuild.c, pure; rollback.c B6), without MPI ------------------ */

/* The rebuilt snapshot's partner copy of member m (rollback.c B7): what it holds of its
   new left neighbour's range (from its old piece or its partner copy of its old left's),
   then what the left sends (from within the left's own range) cover that range, every
   byte once. Returns the bytes sent. */
static int64_t partner_moved;
static int64_t simulate_partner(const struct rec_plan *p, int m, bool sharded)
{
    int l = (m + p->w - 1) % p->w, q = p->old[m], q0 = q >= 0 ? (q + p->w0 - 1) % p->w0 : -1;
    struct rec_move in[2], out[3];
    int nin, nout = rec_plan_partner(p, m, sharded, p->hi[l] - p->lo[l], in, &nin, out);
    static int got[4096];
    memset(got, 0, sizeof(got));
    int64_t sent = 0;
    for (int k = 0; k < nin; k++) {
        ck_assert(in[k].q == q || in[k].q == q0);
        ck_assert(in[k].a >= p->at[in[k].q] && in[k].b <= p->at[in[k].q + 1] && in[k].a < in[k].b);
        for (int64_t i = in[k].a; i < in[k].b; i++)
            got[i - p->lo[l]]++;
    }
    for (int k = 0; k < nout; k++) {
        ck_assert(out[k].q == -1 && out[k].a >= p->lo[l] && out[k].b <= p->hi[l] && out[k].a < out[k].b);
        for (int64_t i = out[k].a; i < out[k].b; i++)
            got[i - p->lo[l]]++;
        sent += out[k].b - out[k].a;
    }
    for (int64_t i = p->lo[l]; i < p->hi[l]; i++)
        ck_assert_msg(got[i - p->lo[l]] == 1, "partner copy of new rank %d on %d: byte %lld %d times", l, m,
                      (long long)i, got[i - p->lo[l]]);
    return sent;
}

/* The exchange of one tensor simulated for every member at once: old rank q's piece is
   bytes at[q] .. of a vector whose byte i is (i * 7 + 1); each new member copies what it
   holds of its range, then at every shift (k, slot) that the plan makes, what member h
   sends to h + k must be exactly what h + k expects from h. Every byte of every new
   member's range must arrive once, with the right value. Returns the bytes that moved. */
static int64_t simulate(int w0, int w, const int32_t *nr, const int64_t *len, bool sharded, int64_t rows,
                        int64_t rb)
{
    int32_t old[16];
    int64_t at[17], lo[16], hi[16];
    struct rec_plan p = {.w0 = w0, .w = w, .nr = nr, .old = old, .at = at, .lo = lo, .hi = hi};
    th_assert_rc(rec_plan_members(&p), 0);
    rec_plan_tensor(&p, len, sharded, rows, rb);
    int64_t moved = 0;
    static int got[16][4096];
    memset(got, 0, sizeof(got));
    for (int r = 0; r < w; r++)
        for (int slot = 0; slot < 2; slot++) {
            int q = rec_plan_held(&p, r, slot);
            int64_t a, b;
            if (q >= 0 && (rec_plan_take(&p, q, r, &a, &b), a < b))
                for (int64_t i = a; i < b; i++)
                    got[r][i - lo[r]]++;
        }
    for (int k = 1; k < w; k++)
        for (int slot = 0; slot < 2; slot++) {
            bool any = false;
            for (int h = 0; h < w; h++) {
                struct rec_move sm, rm, sm2, rm2;
                rec_plan_shift(&p, h, k, slot, &sm, &rm);
                rec_plan_shift(&p, (h + k) % w, k, slot, &sm2, &rm2); /* the receiver's view */
                ck_assert_msg(sm.b - sm.a == rm2.b - rm2.a && sm.a == rm2.a, "shift %d slot %d: %d sends [%lld, %lld), "
                              "%d expects [%lld, %lld)", k, slot, h, (long long)sm.a, (long long)sm.b, (h + k) % w,
                              (long long)rm2.a, (long long)rm2.b);
                any |= sm.a < sm.b;
                if (sm.a < sm.b) {
                    ck_assert_int_ge(sm.a, at[sm.q]); /* from the piece the sender holds */
                    ck_assert_int_le(sm.b, at[sm.q] + len[sm.q]);
                }
                for (int64_t i = sm.a; i < sm.b; i++)
                    got[(h + k) % w][i - lo[(h + k) % w]]++;
                moved += sm.b - sm.a;
            }
            ck_assert_int_eq(any, rec_plan_sends(&p, k, slot));
        }
    for (int r = 0; r < w; r++)
        for (int64_t i = lo[r]; i < hi[r]; i++)
            ck_assert_msg(got[r][i - lo[r]] == 1, "new rank %d: byte %lld arrived %d times", r, (long long)i,
                          got[r][i - lo[r]]);
    partner_moved = 0;
    for (int m = 0; m < w && w > 1; m++) /* B7: each member's new partner copy, its left's range, once */
        partner_moved += simulate_partner(&p, m, sharded);
    return moved;
}

/* One loss of 4 (old rank 1): its piece comes from rank 2's partner copy, the edges of the
   new even split move, and nothing else. */
START_TEST(plan_one_loss_moves_only_what_changes_hands)
{
    /* 10 rows of 4 bytes split 3,3,2,2 over 4; old rank 1 lost; new ranks 0,1,2 = old 0,2,3 */
    const int32_t nr[] = {1, 0, 2, 3};
    const int64_t len[] = {12, 12, 8, 8};
    int64_t moved = simulate(4, 3, nr, len, true, 10, 4);
    /* new split 4,3,3 rows: [0,16) [16,28) [28,40); old 0 holds [0,12), old 2 [12,32) (with 1's), old 3 [32,40) */
    ck_assert_int_eq(moved, 4 + 4 + 0); /* 12..16 to rank 0, 28..32 to rank 2 */
    /* B7: the partner copies send 28..32 to rank 0 (it holds 32..40), 0..12 to rank 1 (it
       holds 12..16), 16..24 to rank 2 (it holds 24..28): 24 of the 40 bytes a partner
       copy sent whole would move */
    ck_assert_int_eq(partner_moved, 4 + 12 + 8);
}
END_TEST

/* Every single loss and every pair of non-neighbour losses at 5 ranks, sharded (uneven
   old pieces) and per-rank (new rank r gets old rank r's piece): every byte arrives once. */
START_TEST(plan_every_loss_covers_every_range)
{
    const int64_t len[] = {0, 20, 8, 12, 4};
    for (int lost = 1; lost < 32; lost++) {
        int32_t nr[5];
        int w = 0, nlost = 0;
        bool neighbours = false;
        for (int q = 0; q < 5; q++) {
            nr[q] = lost & (1 << q) ? 0 : ++w;
            nlost += !nr[q];
        }
        for (int q = 0; q < 5; q++)
            neighbours |= (lost & (1 << q)) && (lost & (1 << ((q + 1) % 5)));
        if (neighbours || nlost > 2)
            continue;
        simulate(5, w, nr, len, true, 11, 4);
        simulate(5, w, nr, len, false, 0, 0);
    }
}
END_TEST

/* A spare brought in (new rank 3 with no old rank) holds nothing and receives its whole
   range; the lost member's piece comes from its partner. */
START_TEST(plan_spare_receives_its_whole_range)
{
    const int32_t nr[] = {1, 0, 2, 3}; /* old 1 lost; the spare is new rank 3 */
    const int64_t len[] = {12, 12, 8, 8};
    int32_t old[4];
    int64_t at[5], lo[4], hi[4];
    struct rec_plan p = {.w0 = 4, .w = 4, .nr = nr, .old = old, .at = at, .lo = lo, .hi = hi};
    th_assert_rc(rec_plan_members(&p), 0);
    ck_assert_int_eq(old[3], -1);
    ck_assert_int_eq(rec_plan_held(&p, 3, 0), -1);
    ck_assert_int_eq(rec_plan_held(&p, 1, 1), 1); /* old 2 holds old 1's partner copy */
    simulate(4, 4, nr, len, true, 10, 4);
    simulate(4, 4, nr, len, false, 0, 0);
}
END_TEST

/* Two neighbours lost: the first one's pieces are nowhere; a claim past the new world. */
START_TEST(plan_rejects_what_memory_cannot_hold)
{
    int32_t old[4];
    struct rec_plan p = {.w0 = 4, .w = 2, .nr = (const int32_t[]){1, 0, 0, 2}, .old = old};
    th_assert_rc(rec_plan_members(&p), RK_E_INTERNAL);
    p = (struct rec_plan){.w0 = 3, .w = 2, .nr = (const int32_t[]){1, 3, 2}, .old = old};
    th_assert_rc(rec_plan_members(&p), RK_E_INTERNAL);
}
END_TEST

/* A tensor registered after the last snapshot: the held snapshot does not cover it, so
   this member never offers it for a rollback, and a rollback from it fails cleanly
   instead of copying from memory that holds nothing (rollback.c B2, B3: the buffers and
   the snapshot held before untouched). */
START_TEST(held_snapshot_not_offered_after_a_new_tensor)
{
    static float a[16], b[16];
    const int64_t n16[] = {16};
    th_assert_rc(rk_register(ctx, "a", a, RK_F32, 1, n16, 0), 0);
    int64_t next = -1;
    th_assert_rc(rk_resume(ctx, &next), 0);
    ck_assert_int_eq(rec_ckpt_held_step(ctx), 0); /* the starting state is held */
    th_assert_rc(rk_register(ctx, "b", b, RK_F32, 1, n16, 0), 0);
    ck_assert_int_eq(rec_ckpt_held_step(ctx), -1);
    rec_decision d = {.epoch = 1, .step = 0, .source = REC_FROM_MEMORY, .root = 0, .all_hold = 0,
                        .nmembers = 1, .members = {0}};
    int from = 0;
    ck_assert_int_ne(rec_ckpt_rollback(ctx, &d, &from), 0);
}
END_TEST

/* The context keeps its own copy of every option string: a caller's (Python's bytes
   objects) may go as soon as rk_init returns. (Before: rollback and io kept the caller's
   pointers, and every recovery read the freed RK_ROLLBACK.) */
START_TEST(options_strings_are_the_contexts_own)
{
    char *dir = th_tmpdir("recover-opts"), ev[4200];
    snprintf(ev, sizeof(ev), "%s/events", dir);
    char *s[4] = {strdup(dir), strdup(ev), strdup("buffered"), strdup("disk")};
    quiet_stderr();
    rk_options o;
    rk_options_init(&o);
    o.ckpt_dir = s[0];
    o.event_log = s[1];
    o.io = s[2];
    o.rollback = s[3];
    ck_assert_int_eq(rk_init(&ctx, &o), 0);
    for (int i = 0; i < 4; i++) { /* the caller's strings go */
        memset(s[i], 'x', strlen(s[i]));
        free(s[i]);
    }
    ck_assert_str_eq(ctx->opt.ckpt_dir, dir);
    ck_assert_str_eq(ctx->opt.event_log, ev);
    ck_assert_str_eq(ctx->opt.io, "buffered");
    ck_assert_str_eq(ctx->opt.rollback, "disk");
    th_assert_rc(rk_finalize(&ctx), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* ---- the rounds on real jobs (recover/recovery.c, R5, R6) ------------------------------ */

#define ROUND_MS "2000" /* RK_TIMEOUT_MS: one round */

/* Runs prog_recover ARGS on n workers with recovery on; returns its output (malloc'd). */
static char *recover_job(int n, const char *refuse, const char *a1, const char *a2, const char *a3, const char *a4)
{
    char *p = th_prog("prog_recover");
    ck_assert(p);
    char *argv[] = {"--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0", p, (char *)a1, (char *)a2,
                    (char *)a3, (char *)a4, NULL};
    const char *env[] = {"RK_TIMEOUT_MS=" ROUND_MS, refuse, NULL};
    char *out = NULL;
    th_mpirun(n, argv, env, 90, &out);
    free(p);
    ck_assert(out);
    return out;
}

static int count_lines(const char *out, const char *needle)
{
    int n = 0;
    for (const char *q = out; (q = strstr(q, needle)); q++)
        n++;
    return n;
}

/* Every survivor recovered into a ring of `world`, finished, and left no MPI memory. */
static void assert_all_recovered(const char *out, int survivors, int world)
{
    char want[64];
    snprintf(want, sizeof(want), "recovered world %d ", world);
    ck_assert_msg(count_lines(out, want) == survivors, "want %d lines '%s':\n%s", survivors, want, out);
    snprintf(want, sizeof(want), "done world %d\n", world);
    ck_assert_msg(count_lines(out, want) == survivors, "want %d lines '%s':\n%s", survivors, want, out);
    ck_assert_msg(!strstr(out, " error: "), "a survivor failed:\n%s", out);
    ck_assert_msg(count_lines(out, "alloc_mem outstanding 0 ") == survivors, "MPI memory left behind:\n%s", out);
    ck_assert_msg(!strstr(out, "LeakSanitizer"), "leak:\n%s", out);
}

/* ---- snapshots at every step and rk_before_update (docs/DESIGN.md) ----------------------- */

/* tests/prog_update (written from rekindle.h alone: its state changes before its
   allreduce, so it calls rk_before_update first) on 4 workers under `rekindle run`, a
   snapshot at every step and a checkpoint every 50; rank 2 killed at step KILL: the
   survivors resume from memory at most one step back (steps_lost <= 1; the snapshots
   in between are not on disk) and end with the exact state (pos = STEPS, w = the sum). */
START_TEST(before_update_program_resumes_one_step_back)
{
    char *w = th_tmpdir("update"), *rekindle = th_bin("rekindle"), *out = NULL, cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "W=%s; export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_EVENT_LOG=$W/ev RK_TIMEOUT_MS=8000\n"
             "%s run -n 4 -- %s/tests/prog_update 40 2 23; echo \"exit=$?\"\n"
             "grep -h '\"resumed\"' $W/ev.*; ls $W/c\n",
             w, rekindle, getenv("RK_TEST_BUILD"));
    int rc = th_sh(cmd, 120, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n"), "rc %d:\n%s", rc, out);
    ck_assert_msg(count_lines(out, " ok\n") == 3 && !strstr(out, "WRONG"), "a survivor's state is wrong:\n%s", out);
    ck_assert_msg(count_lines(out, "\"from\": \"memory\"") == 3, "not from memory:\n%s", out);
    ck_assert_msg(count_lines(out, "\"steps_lost\": 0") + count_lines(out, "\"steps_lost\": 1") == 3,
                  "more than one step lost:\n%s", out);
    ck_assert_msg(!strstr(out, "step-000000000023") && strstr(out, "step-000000000050") == NULL,
                  "the resumed step should come from memory alone:\n%s", out);
    th_rmrf(w);
    free(w);
    free(rekindle);
    free(out);
}
END_TEST

/* The same program, written from rekindle.h alone, in an elastic job (docs/LAUNCHER.md,
   "Elastic"): `rekindle run --host-discovery-script` lists 2 slots, then 2 + ADD once
   checkpoint 100 is committed; the workers started on the new slots join the two while
   they train (the program's own rk_init and rk_resume, started by the members), all
   resume from the two's memory in a world of 2 + ADD (no relaunch, none restarted) and end
   with the exact state: nothing in the program is about growth but rk_resume at its
   start. With ADD 2 both come in one join ("Several newcomers in one join"). */
/* A job of 2 under `rekindle run --host-discovery-script` in W, the hosts file listing
   `to` slots once step 100 is committed; `env` exported before, the program run as
   `wrap` PROG ARGS (a shell prefix, "" for none); the job's exit, its launcher lines and
   `tail`'s output in *out. Returns th_sh's status. */
static int grow_job(const char *w, int to, const char *env, const char *wrap, const char *tail, char **out)
{
    char *rekindle = th_bin("rekindle"), cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "W=%s; H=$(hostname); echo \"$H:2\" > $W/hosts\n"
             "export RK_CKPT_DIR=$W/c RK_CKPT_EVERY=50 RK_EVENT_LOG=$W/ev RK_RUN_DIR=$W/run RK_TIMEOUT_MS=8000 %s\n"
             "%s run --host-discovery-script \"cat $W/hosts\" --discovery-interval 0.2 --max-np %d -- "
             "%s%s/tests/prog_update 1200 -1 -1%s > $W/out 2> $W/err & job=$!\n"
             "for i in $(seq 1200); do [ -d $W/c/step-000000000100 ] && break; sleep 0.05; done\n"
             "echo \"$H:%d\" > $W/hosts\n"
             "wait $job; echo \"exit=$?\"; cat $W/out; grep 'rekindle: run' $W/err\n%s\n",
             w, env, rekindle, to, wrap, getenv("RK_TEST_BUILD"), wrap[0] ? "'" : "", to, tail);
    free(rekindle);
    return th_sh(cmd, 180, out);
}

static void docs_program_grows(int add)
{
    int world = 2 + add;
    char *w = th_tmpdir("update-grow"), *out = NULL;
    int rc = grow_job(w, world, "", "", "grep -h '\"resumed\"' $W/ev.*", &out);
    char growing[64], grown[64], resumed[32];
    snprintf(growing, sizeof(growing), "growing in place to %d, %d worker(s) started", world, add);
    snprintf(grown, sizeof(grown), "grown in place to %d workers", world);
    snprintf(resumed, sizeof(resumed), "\"world\": %d", world);
    ck_assert_msg(rc == 0 && strstr(out, "exit=0\n") && strstr(out, growing) && strstr(out, grown) && !strstr(out, "launching again"),
                  "rc %d:\n%s", rc, out);
    ck_assert_msg(count_lines(out, " ok\n") == world && !strstr(out, "WRONG"), "want %d workers ok at the end:\n%s",
                  world, out);
    ck_assert_msg(count_lines(out, resumed) == world && count_lines(out, "\"from\": \"memory\"") == world,
                  "the %d workers should resume from the two's memory in a world of %d:\n%s", world, world, out);
    ck_assert_msg(count_lines(out, "\"world\": 3") == 0 || world == 3, "grown one at a time, not in one join:\n%s",
                  out);
    th_rmrf(w);
    free(w);
    free(out);
}

START_TEST(docs_program_grows_with_the_job)
{
    docs_program_grows(1);
}
END_TEST

START_TEST(docs_program_grows_by_two_in_one_join)
{
    docs_program_grows(2);
}
END_TEST

/* A newcomer never takes the TCP ports of a worker that died before it (join_proto.c J22):
   two newcomers at slots 2 and 3 get Open MPI's TCP ports from 1024 + 64 x their slot in
   their environment, the workers launched first none; a setting of the user's is kept. */
static char *grow_by_two_noting_ports(const char *user_port)
{
    char *w = th_tmpdir("grow-ports"), *out = NULL;
    ck_assert_int_eq(grow_job(w, 4, user_port ? user_port : "",
                              "sh -c 'echo \"slot=${RK_RUN_SLOT:--} v4=${OMPI_MCA_btl_tcp_port_min_v4:--} "
                              "v6=${OMPI_MCA_btl_tcp_port_min_v6:--}\" >> '$W'/ports; exec ",
                              "sort $W/ports", &out),
                     0);
    ck_assert_msg(strstr(out, "exit=0\n") && strstr(out, "grown in place to 4 workers"), "not grown in place:\n%s", out);
    th_rmrf(w);
    free(w);
    return out;
}

START_TEST(newcomers_take_their_slots_ports)
{
    char *out = grow_by_two_noting_ports(NULL);
    ck_assert_msg(count_lines(out, "slot=- v4=- v6=-\n") == 2 && strstr(out, "slot=2 v4=1152 v6=1152\n") &&
                      strstr(out, "slot=3 v4=1216 v6=1216\n"),
                  "want the first two without, slots 2 and 3 with their own ports:\n%s", out);
    free(out);
    out = grow_by_two_noting_ports("OMPI_MCA_btl_tcp_port_min_v4=2000");
    ck_assert_msg(count_lines(out, "v4=2000 v6=-\n") == 4, "the user's setting, kept in all four:\n%s", out);
    free(out);
}
END_TEST

/* A worker whose MPI call never returns (rank 2: its first test of a transfer at step 5
   hangs, as Open MPI's shared-memory transport does after a peer died mid-send) still
   sends heartbeats, so its peers would wait for it until their own bound and stop. The
   wedge watchdog ends it after half a round (RK_EXIT_WEDGED), and the others recover
   without it and finish; before it leaves, it logs the stack of the call it is stuck in. */
START_TEST(wedged_worker_leaves_and_others_recover)
{
    char *out = recover_job(4, NULL, "-1", "2", "0", "wedge");
    assert_all_recovered(out, 3, 3);
    ck_assert_msg(strstr(out, "inside one MPI call (MPI_Test (the ring)) for ") != NULL,
                  "no wedge reported, or not the call it is in:\n%s", out);
    ck_assert_msg(strstr(out, "the training thread, frame 3: ") != NULL, "no stack of the wedged thread:\n%s", out);
    ck_assert_msg(strstr(out, "the training thread, in the kernel: state ") != NULL, "no kernel state of the wedged thread:\n%s", out);
    ck_assert_msg(count_lines(out, "rank 2 ") == 0, "rank 2 went on:\n%s", out);
    free(out);
}
END_TEST

/* R5: a survivor in a long compute step enters recovery 1.5 rounds after the others; they
   wait for it on the common schedule instead of giving up after one round. */
START_TEST(rounds_R5_late_survivor_recovers)
{
    char *out = recover_job(4, NULL, "3", "2", "3500", NULL);
    assert_all_recovered(out, 3, 3);
    free(out);
}
END_TEST

/* R4, R5: the coordinator is late and dies during recovery, after the members' first
   round ended; the next lowest coordinates in a later round. */
START_TEST(rounds_R5_coordinator_dies_in_recovery)
{
    char *out = recover_job(5, NULL, "4", "0", "2600", "die");
    assert_all_recovered(out, 3, 3);
    free(out);
}
END_TEST

/* R5: a member dies while the others wait for its report. */
START_TEST(rounds_R5_member_dies_in_recovery)
{
    char *out = recover_job(5, NULL, "4", "2", "2600", "die");
    assert_all_recovered(out, 3, 3);
    free(out);
}
END_TEST

/* R6: MPI refuses rank 1's first report (MPI_Isend fails): nothing is left behind (no
   MPI_Alloc_mem outstanding; under SANITIZE=1 no leak), it reports again next round. */
START_TEST(rounds_R6_refused_send_leaves_nothing)
{
    char *out = recover_job(4, "PROG_REC_REFUSE_ISEND=1:0x5e01", "3", "-1", "0", NULL);
    ck_assert_msg(strstr(out, "rank 1 alloc_mem outstanding 0 isend_refused 1"), "no send refused:\n%s", out);
    assert_all_recovered(out, 3, 3);
    free(out);
}
END_TEST

/* R5: a survivor silent past the last round: every survivor stops alike with
   RK_E_TIMEOUT, the ones that waited naming the silent one. */
START_TEST(rounds_R5_timeout_after_last_round_alike)
{
    char *out = recover_job(4, NULL, "3", "2", "7500", NULL);
    ck_assert_msg(count_lines(out, " error: a deadline passed") == 3, "want 3 timeouts:\n%s", out);
    ck_assert_msg(count_lines(out, "finished: recovery stopped: no report from rank(s) 2 in 3 rounds") == 2,
                  "the silent one not named:\n%s", out);
    ck_assert_msg(!strstr(out, "recovered"), "someone recovered:\n%s", out);
    free(out);
}
END_TEST

/* MPI starts once per process: a second rk_init after rk_finalize is an error, never
   an abort inside MPI. */
START_TEST(init_after_finalize_is_an_error)
{
    th_assert_rc(rk_finalize(&ctx), 0);
    rk_options o;
    rk_options_init(&o);
    th_assert_rc(rk_init(&ctx, &o), RK_E_STATE);
    ck_assert_ptr_null(ctx);
}
END_TEST

static Suite *recover_suite(void)
{
    Suite *s = suite_create("recover");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, register_accepts_good_tensors);
    tcase_add_loop_test(tc, register_rejects_bad_names, 0, (int)RK_ARRAY_LEN(bad_names));
    tcase_add_test(tc, register_rejects_bad_arguments);
    tcase_add_test(tc, register_device_is_checked);
    tcase_add_test(tc, allreduce_checks_arguments);
    tcase_add_test(tc, init_after_finalize_is_an_error);
    tcase_add_test(tc, options_strings_are_the_contexts_own);
    suite_add_tcase(s, tc);

    tc = tcase_create("rollback");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup_ckpt, teardown);
    tcase_add_test(tc, held_snapshot_not_offered_after_a_new_tensor);
    suite_add_tcase(s, tc);

    tc = tcase_create("plan");
    tcase_add_test(tc, plan_one_loss_moves_only_what_changes_hands);
    tcase_add_test(tc, plan_every_loss_covers_every_range);
    tcase_add_test(tc, plan_spare_receives_its_whole_range);
    tcase_add_test(tc, plan_rejects_what_memory_cannot_hold);
    suite_add_tcase(s, tc);

    tc = tcase_create("decide");
    tcase_add_test(tc, decide_I1_majority_required);
    tcase_add_test(tc, decide_I2_min_world);
    tcase_add_test(tc, decide_I5_memory_first_I6_dense_order);
    tcase_add_test(tc, decide_I4_never_older_than_committed);
    tcase_add_test(tc, decide_I5_partners);
    tcase_add_test(tc, decide_I5_older_generation);
    tcase_add_test(tc, decide_I5_growth_own_pieces);
    tcase_add_test(tc, decide_I7_lost_newcomer_held_nothing);
    tcase_add_test(tc, decide_rejects_malformed);
    suite_add_tcase(s, tc);

    tc = tcase_create("rounds");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rounds_R5_late_survivor_recovers);
    tcase_add_test(tc, rounds_R5_coordinator_dies_in_recovery);
    tcase_add_test(tc, rounds_R5_member_dies_in_recovery);
    tcase_add_test(tc, rounds_R6_refused_send_leaves_nothing);
    tcase_add_test(tc, rounds_R5_timeout_after_last_round_alike);
    tcase_add_test(tc, wedged_worker_leaves_and_others_recover);
    tcase_add_test(tc, before_update_program_resumes_one_step_back);
    tcase_add_test(tc, docs_program_grows_with_the_job);
    tcase_add_test(tc, docs_program_grows_by_two_in_one_join);
    tcase_add_test(tc, newcomers_take_their_slots_ports);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(recover_suite());
}
