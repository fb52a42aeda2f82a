/*
 * tests/test_ckpt_snap.c - the checkpoint engine's in-memory side, on the engine itself
 * (ckpt/ckpt.h) in one process: the held snapshot and a rebuild that fails after opening
 * it, the host copy engine (ckpt/copy.h: batches, waits with a deadline, a copy failing
 * halfway, large copies streamed), a snapshot copied before the caller's update, and the
 * two generations of ckpt/snapshot.h S6 (a failed snapshot leaves the one before; a region
 * the writer reads is put aside; a frozen tensor copied once a generation), a checkpoint
 * writing from the snapshot in flight (S8) and the next region mapped ahead (S9; at a
 * restore, staging faulted in by the reads and the next region mapped after), and one
 * generation held where the job keeps its checkpoints' snapshots only (S13). The
 * public API's side is tests/test_ckpt.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../ckpt/ckpt_internal.h" /* S9: the region mapped ahead, e->s.prep */
#include "../ckpt/copy.h"
#include "../formats/fmt.h"
#include "common.h"
#include "harness.h"

#define S2 "step-000000000002"
#define S4 "step-000000000004"
#define S6 "step-000000000006"

/* A one-rank engine writing into dir (nonce 7), made or the test fails. */
static ckpt_engine *engine_in(const char *dir, int keep, int timeout_ms)
{
    ckpt_config cfg = {.dir = dir, .rank = 0, .world = 1, .keep = keep, .timeout_ms = timeout_ms, .nonce = 7};
    ckpt_engine *e = NULL;
    th_assert_rc(ckpt_create(&e, &cfg), 0);
    return e;
}

/* A rebuild that fails after ckpt_hold_open (ckpt_hold_cancel): the snapshot held before
   is held again, whole, and restores; the new region is gone. (Before: the old snapshot
   stayed mapped but was no longer held: step -1, nothing to restore.) */
START_TEST(cancelled_hold_keeps_the_held_snapshot)
{
    char *dir = th_tmpdir("hold");
    ckpt_engine *e = engine_in(dir, 1, 5000);
    double v[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    int64_t shape[1] = {5}, big[1] = {4096};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    th_assert_rc(ckpt_hold(e, 5, &t, 1), 0);
    ckpt_tensor t2[2] = {{.name = "w", .dtype = RK_F64, .ndim = 1, .shape = big, .nbytes = 4096 * 8},
                         {.name = "x", .dtype = RK_U8, .ndim = 1, .shape = big, .nbytes = 4096}};
    unsigned char *where[2];
    const ckpt_snapshot *before = NULL;
    for (int round = 0; round < 2; round++) { /* the second open finds the first one neither sealed nor cancelled */
        th_assert_rc(ckpt_hold_open(e, 5, t2, 2, where, &before), 0);
        ck_assert_int_eq(before->step, 5); /* what was held, readable until the seal or the cancel */
        ck_assert(memcmp(before->own[0].data, v, sizeof(v)) == 0);
        memset(where[0], 0xEE, t2[0].nbytes);
        ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    }
    ckpt_hold_cancel(e);
    ckpt_hold_cancel(e); /* nothing open: nothing */
    const ckpt_snapshot *s = ckpt_snapshot_held(e);
    ck_assert_int_eq(s->step, 5);
    ck_assert_uint_eq(s->n, 1);
    ck_assert(s->own[0].nbytes == sizeof(v) && memcmp(s->own[0].data, v, sizeof(v)) == 0);
    t.ptr = out;
    th_assert_rc(ckpt_restore_held(e, &t, 1), 0);
    ck_assert(memcmp(out, v, sizeof(v)) == 0);
    /* and a later open and seal still works from it */
    th_assert_rc(ckpt_hold_open(e, 6, &t, 1, where, &before), 0);
    ck_assert(before->step == 5 && before->own[0].data == s->own[0].data);
    memcpy(where[0], s->own[0].data, sizeof(v));
    memset(out, 0, sizeof(out));
    th_assert_rc(ckpt_hold_seal(e, 6, &t, 1), 0); /* sealed, then in the buffers */
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 6);
    ck_assert(memcmp(out, v, sizeof(v)) == 0);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* RK_FAULT for the copy engines' fault point ("copy", ckpt/copy.h), hold: RK_FAULT_HOLD's
   file (NULL: none); NULL rules: none. */
static void copy_faults(const char *rules, const char *hold)
{
    if (rules)
        setenv("RK_FAULT", rules, 1);
    else
        unsetenv("RK_FAULT");
    if (hold)
        setenv("RK_FAULT_HOLD", hold, 1);
    else
        unsetenv("RK_FAULT_HOLD");
    th_assert_rc(rk__fault_reset(), 0);
}

/* Until the copy given up on (released meanwhile) has ended: a wait for it only looks once
   it was given up on (ckpt/snapshot.h S5), so the test looks again, 10 s at most. */
static void copy_ended(ckpt_engine *e)
{
    for (int i = 0; i < 2000 && ckpt_copied(e, false, rk__deadline_ns(5)) != 0; i++)
        rk__sleep_ns(5 * 1000000LL);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5)), 0);
}

/* The checkpoint `step` of dir holds v[0..n) all equal to x (read back through the engine). */
static void check_ckpt(ckpt_engine *e, int64_t step, size_t n, double x)
{
    double *out = calloc(n, sizeof(*out));
    int64_t shape[1] = {(int64_t)n};
    ckpt_tensor t = {.name = "w", .ptr = out, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = n * sizeof(*out)};
    th_assert_rc(ckpt_load(e, step, &t, 1), 0);
    th_assert_rc(ckpt_restore_held(e, &t, 1), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(out[i] == x);
    free(out);
}

/* S8: a checkpoint of the step whose snapshot is still being copied writes from that copy:
   nothing is copied twice (a fault on the second copy fails the checkpoint if it copies
   again: before, it did, and ckpt_wait returned -EIO). Once the snapshot was waited for
   (the buffers may have changed since), a checkpoint of its step copies them anew. */
START_TEST(checkpoint_writes_from_the_snapshot_in_flight)
{
    char *dir = th_tmpdir("reuse"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ckpt_engine *e = engine_in(dir, 3, 5000);
    static double v[4096];
    int64_t shape[1] = {4096};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    for (size_t i = 0; i < 4096; i++)
        v[i] = 3;
    th_assert_rc(th_write_file(hold, "", 0), 0);
    copy_faults("copy@0=hang,copy@1=eio", hold); /* the snapshot's copy held in flight */
    th_assert_rc(ckpt_snapshot_take(e, 3, &t, 1), 0);
    th_assert_rc(ckpt_start(e, 3, &t, 1), 0);
    unlink(hold);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(10000)), 0);
    ck_assert_int_eq(ckpt_last_committed(e), 3);
    copy_faults(NULL, NULL);
    check_ckpt(e, 3, 4096, 3);
    /* settled, then changed: copied again */
    th_assert_rc(ckpt_snapshot_take(e, 5, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    for (size_t i = 0; i < 4096; i++)
        v[i] = 5.5;
    th_assert_rc(ckpt_start(e, 5, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(10000)), 0);
    check_ckpt(e, 5, 4096, 5.5);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S9: once a generation has its region, the other's is mapped ahead by a thread, and the
   next turn takes it rather than mapping (and first-touching) one on the training thread. */
START_TEST(next_region_mapped_ahead)
{
    char *dir = th_tmpdir("prep");
    ckpt_engine *e = engine_in(dir, 1, 5000);
    static double v[1 << 16];
    int64_t shape[1] = {1 << 16};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    th_assert_rc(ckpt_snapshot_take(e, 1, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert(e->s.prep.job != NULL);
    th_assert_rc(ckpt_snapshot_take(e, 2, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert(e->s.prep.job == NULL);
    ck_assert(e->s.prep.p != NULL && ckpt_snapshot_held(e)->out == e->s.prep.p);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 1);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* The shard of dir's checkpoint `step` dropped from the page cache: a restore of it reads
   O_DIRECT, straight into staging (formats/fmt_readdirect.c R2). */
static void drop_shard(const char *dir, const char *step)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/%s/shard-0.h5", dir, step);
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fdatasync(fd), 0);
    ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* Bytes of [p, p + n) not in memory (p page-aligned). */
static size_t not_resident(const void *p, size_t n)
{
    size_t pages = (n + 4095) / 4096, out = 0;
    unsigned char *vec = malloc(pages);
    ck_assert_ptr_nonnull(vec);
    ck_assert_int_eq(mincore((void *)p, n, vec), 0);
    for (size_t i = 0; i < pages; i++)
        out += (vec[i] & 1) ? 0 : 4096;
    free(vec);
    return out;
}

/* S9 at a restore, S3: a fresh engine's ckpt_load maps staging unpopulated and its O_DIRECT
   reads fault it in (a read failing in the middle, RK_FAULT read@N=eio: the pages of the
   reads never sent are not in memory, the load fails, nothing is held), and nothing is
   mapped ahead while it reads; the region for the next turn is mapped ahead once
   ckpt_restore_held copied the checkpoint out, and that turn takes it. Before, staging was
   populated whole before the first read and the next region mapped beside the reads. */
START_TEST(restore_faults_staging_in_maps_ahead_after)
{
    char *dir = th_tmpdir("rsprep");
    enum { N = 2 << 20 }; /* 16 MiB: four O_DIRECT reads of 4 MiB */
    double *v = malloc(N * sizeof(*v)), *out = calloc(N, sizeof(*out));
    ck_assert(v && out);
    for (size_t i = 0; i < N; i++)
        v[i] = (double)i * 0.5;
    int64_t shape[1] = {N};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = N * sizeof(*v)};
    ckpt_engine *e = engine_in(dir, 1, 5000);
    th_assert_rc(ckpt_start(e, 2, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    t.ptr = out;
    /* the reads a clean load makes: the opener's, then the tensor's (four of 4 MiB) */
    char step[4300], rule[64];
    snprintf(step, sizeof(step), "%s/%s", dir, S2);
    setenv("RK_FAULT_PATH", "shard-0.h5", 1);
    copy_faults("read@100000=eio", NULL);
    fmt_ckpt *c = NULL;
    th_assert_rc(fmt_ckpt_open(step, &c), 0);
    fmt_ckpt_close(&c);
    uint64_t opened = rk__fault_count(RK_FAULT_OP_READ);
    copy_faults("read@100000=eio", NULL);
    e = engine_in(dir, 1, 5000);
    drop_shard(dir, S2);
    th_assert_rc(ckpt_load(e, 2, &t, 1), 0);
    uint64_t data = rk__fault_count(RK_FAULT_OP_READ) - opened;
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    ck_assert_uint_ge(data, 4);
    snprintf(rule, sizeof(rule), "read@%llu=eio", (unsigned long long)(opened + data / 2)); /* the middle */
    copy_faults(rule, NULL);
    e = engine_in(dir, 1, 5000);
    drop_shard(dir, S2);
    th_assert_rc(ckpt_load(e, 2, &t, 1), -EIO);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    size_t absent = not_resident(e->s.g.staging, e->s.g.staging_cap);
    ck_assert_msg(absent >= (4u << 20), "%zu bytes of %zu-byte staging not in memory: populated before the reads",
                  absent, e->s.g.staging_cap);
    ck_assert(e->s.prep.job == NULL);
    copy_faults(NULL, NULL);
    unsetenv("RK_FAULT_PATH");
    drop_shard(dir, S2);
    th_assert_rc(ckpt_load(e, 2, &t, 1), 0);
    ck_assert_msg(e->s.prep.job == NULL, "the next region is mapped ahead beside the reads");
    ck_assert(memcmp(out, v, N * sizeof(*v)) != 0); /* S3: not before the copy out */
    th_assert_rc(ckpt_restore_held(e, &t, 1), 0);
    ck_assert(memcmp(out, v, N * sizeof(*v)) == 0);
    ck_assert_msg(e->s.prep.job != NULL, "nothing mapped ahead after the copy out");
    th_assert_rc(ckpt_snapshot_take(e, 3, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert(e->s.prep.p != NULL && ckpt_snapshot_held(e)->out == e->s.prep.p);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 2);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    free(v);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* The host copy engine: a batch runs without the caller; its completion is queried and
   waited for with a deadline (a copy held by RK_FAULT's hang: RK_E_TIMEOUT, then done
   once released); one batch at a time; a copy failing halfway
   leaves the copies before it done and the rest not, naming which failed; a batch
   replaced by a later one is not waited for. */
START_TEST(copy_engine_batches)
{
    char *dir = th_tmpdir("copyeng"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ck_assert_int_eq(th_write_file(hold, "", 0), 0);
    copy_faults("copy@0=hang,copy@4=eio", hold); /* batch 1: copies 0..2, batch 2: 3..5 */
    ckpt_copy *c = NULL;
    th_assert_rc(ckpt_copy_host_create(&c), 0);
    char a[3][64], b[3][64];
    for (int i = 0; i < 3; i++)
        memset(a[i], 'a' + i, sizeof(a[i]));
    memset(b, 0, sizeof(b));
    ckpt_copy_op ops[3] = {{b[0], a[0], 64}, {b[1], a[1], 64}, {b[2], a[2], 64}};
    uint64_t g1 = 0, g2 = 0;
    th_assert_rc(ckpt_copy_start(c, ops, 3, &g1), 0);
    ck_assert(g1 != 0 && !ckpt_copy_done(c, g1));
    th_assert_rc(ckpt_copy_start(c, ops, 3, &g2), RK_E_BUSY);
    int64_t t0 = rk__mono_ns();
    th_assert_rc(ckpt_copy_wait(c, g1, rk__deadline_ns(100)), RK_E_TIMEOUT);
    ck_assert_msg(rk__ms_since(t0) >= 90, "the wait ended before its deadline: %.0f ms", rk__ms_since(t0));
    ck_assert(!ckpt_copy_done(c, g1)); /* (b is the engine's until then: not read here) */
    unlink(hold);
    th_assert_rc(ckpt_copy_wait(c, g1, rk__deadline_ns(10000)), 0);
    ck_assert(ckpt_copy_done(c, g1));
    ck_assert(memcmp(b, a, sizeof(a)) == 0);
    memset(b, 0, sizeof(b));
    th_assert_rc(ckpt_copy_start(c, ops, 3, &g2), 0);
    th_assert_rc(ckpt_copy_wait(c, g2, rk__deadline_ns(10000)), -EIO);
    ck_assert_msg(strstr(rk_last_error(), "copy 2 of 3"), "unclear: %s", rk_last_error());
    ck_assert_msg(memcmp(b[0], a[0], 64) == 0 && b[1][0] == 0 && b[2][0] == 0, "not stopped at the failed copy");
    th_assert_rc(ckpt_copy_wait(c, g1, rk__deadline_ns(10)), RK_E_ABORTED); /* replaced by g2 */
    th_assert_rc(ckpt_copy_destroy(&c, rk__deadline_ns(10000)), 0);
    ck_assert(c == NULL);
    copy_faults(NULL, NULL);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Whether p[0..n) are all byte c. */
static bool all_bytes(const unsigned char *p, size_t n, unsigned char c)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != c)
            return false;
    return true;
}

/* The host engine streams a copy of 1 MiB or more past the caches, a smaller one is a
   memcpy (ckpt/copy_host.c): every byte arrives whatever the alignment of either end and
   the length (a head up to the destination's 16-byte boundary, 64-byte blocks, a tail),
   nothing beside the destination is written; and a batch of streamed copies failing
   halfway (RK_FAULT copy@1=eio) leaves the copy before the failure whole and the rest
   untouched, as copy.h says of any batch. */
START_TEST(copy_engine_streams_large_copies)
{
    ckpt_copy *c = NULL;
    th_assert_rc(ckpt_copy_host_create(&c), 0);
    const size_t mib = (size_t)1 << 20, cap = 4 * mib + 64, pad = 32;
    const size_t sizes[] = {mib - 1, mib, mib + 77, 3 * mib + 4095};
    const size_t align[][2] = {{0, 0}, {1, 0}, {0, 5}, {7, 13}, {15, 1}}; /* src, dst offsets */
    unsigned char *src = malloc(cap), *dst = malloc(cap + 2 * pad);
    ck_assert(src && dst);
    for (size_t i = 0; i < cap; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 11));
    for (size_t s = 0; s < RK_ARRAY_LEN(sizes); s++)
        for (size_t a = 0; a < RK_ARRAY_LEN(align); a++) {
            size_t n = sizes[s], so = align[a][0], d = pad + align[a][1];
            memset(dst, 0xee, cap + 2 * pad);
            ckpt_copy_op op = {dst + d, src + so, n};
            uint64_t g = 0;
            th_assert_rc(ckpt_copy_start(c, &op, 1, &g), 0);
            th_assert_rc(ckpt_copy_wait(c, g, rk__deadline_ns(10000)), 0);
            ck_assert_msg(memcmp(dst + d, src + so, n) == 0, "%zu bytes from +%zu to +%zu: not the same", n,
                          so, align[a][1]);
            ck_assert_msg(all_bytes(dst, d, 0xee) && all_bytes(dst + d + n, pad, 0xee),
                          "%zu bytes from +%zu to +%zu: written beside the destination", n, so, align[a][1]);
        }
    copy_faults("copy@1=eio", NULL);
    memset(dst, 0, cap + 2 * pad);
    ckpt_copy_op ops[3] = {{dst + 3, src + 1, mib + 5}, {dst + 2 * mib, src, mib}, {dst + 3 * mib, src, mib}};
    uint64_t g = 0;
    th_assert_rc(ckpt_copy_start(c, ops, 3, &g), 0);
    th_assert_rc(ckpt_copy_wait(c, g, rk__deadline_ns(10000)), -EIO);
    ck_assert_msg(strstr(rk_last_error(), "copy 2 of 3"), "unclear: %s", rk_last_error());
    ck_assert_msg(memcmp(dst + 3, src + 1, mib + 5) == 0, "the copy before the failure is not whole");
    ck_assert_msg(all_bytes(dst + 2 * mib, 2 * mib, 0), "a copy after the failure was made");
    copy_faults(NULL, NULL);
    th_assert_rc(ckpt_copy_destroy(&c, rk__deadline_ns(10000)), 0);
    free(src);
    free(dst);
}
END_TEST

static void *unlink_later(void *path)
{
    rk__sleep_ns(300 * 1000000LL);
    unlink(path);
    return NULL;
}

/* The snapshot's copy runs on the host engine while the caller goes on (ckpt_start returns
   with the copy held by a fault), sees the writes made before ckpt_start, and ckpt_copied
   waits for it: an update right after the wait never reaches the checkpoint, in memory or
   on disk, and the writer wrote only once the copy was done (S5, ckpt/writer.c W5). Without the
   wait, the update (300 ms before the copy is released) would be what got copied. */
START_TEST(snapshot_copied_before_the_update)
{
    char *dir = th_tmpdir("copywait"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ck_assert_int_eq(th_write_file(hold, "", 0), 0);
    copy_faults("copy@0=hang", hold);
    ckpt_engine *e = engine_in(dir, 2, 20000);
    static double v[4096], out[4096];
    int64_t shape[1] = {4096};
    for (int i = 0; i < 4096; i++)
        v[i] = i;
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    th_assert_rc(ckpt_start(e, 2, &t, 1), 0); /* returns: the copy is held, not waited for */
    pthread_t thr;
    ck_assert_int_eq(pthread_create(&thr, NULL, unlink_later, hold), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(20000)), 0);
    for (int i = 0; i < 4096; i++) /* the update */
        v[i] = -1;
    pthread_join(thr, NULL);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    const ckpt_snapshot *s = ckpt_snapshot_held(e);
    ck_assert_int_eq(s->step, 2);
    ck_assert(((const double *)s->own[0].data)[4095] == 4095.0);
    rk_reader *r = NULL;
    th_assert_rc(rk_reader_open(&r, dir, 2), 0);
    th_assert_rc(rk_reader_read(r, 0, out, sizeof(out)), 0);
    rk_reader_close(&r);
    for (int i = 0; i < 4096; i++)
        ck_assert_msg(out[i] == i, "element %d on disk: %g", i, out[i]);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    copy_faults(NULL, NULL);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* A copy into staging that fails halfway fails its checkpoint (ckpt_copied and ckpt_wait
   report it; nothing of it is committed; the one before stays) and holds no snapshot; the
   next checkpoint commits. A restore whose copy fails says so, and restores once it works. */
START_TEST(copy_failing_halfway_fails_the_checkpoint)
{
    char *dir = th_tmpdir("copyfail");
    ckpt_engine *e = engine_in(dir, 3, 20000);
    static double v1[512], v2[512], out[512];
    int64_t shape[1] = {512};
    ckpt_tensor t[2] = {{.name = "a", .ptr = v1, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v1)},
                        {.name = "b", .ptr = v2, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v2)}};
    v1[0] = v2[0] = 2;
    th_assert_rc(ckpt_start(e, 2, t, 2), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    copy_faults("copy@1=eio", NULL); /* the second tensor's copy */
    v1[0] = v2[0] = 4;
    th_assert_rc(ckpt_start(e, 4, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(20000)), -EIO);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), -EIO);
    ck_assert(th_exists(dir, S2) && !th_exists(dir, S4));
    copy_faults(NULL, NULL);
    v1[0] = v2[0] = 6;
    th_assert_rc(ckpt_start(e, 6, t, 2), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    ck_assert(th_exists(dir, S6));
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 6);
    /* the restore goes through the same engine */
    t[1].ptr = out;
    copy_faults("copy@1=eio", NULL);
    th_assert_rc(ckpt_restore_held(e, t, 2), -EIO);
    ck_assert_msg(strstr(rk_last_error(), "restore of the snapshot of step 6"), "unclear: %s", rk_last_error());
    copy_faults(NULL, NULL);
    v1[0] = 0;
    th_assert_rc(ckpt_restore_held(e, t, 2), 0);
    ck_assert(v1[0] == 6 && out[0] == 6);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S10: the writer writes a tensor as soon as its copy into staging is done, while the
   copies after it still run: with the second tensor's copy held, the writer is seen working
   on the shard file (it exists in the attempt's directory); before, it waited for the
   whole copy and had made no file. The checkpoint then commits whole (W6). */
START_TEST(writer_writes_while_the_copy_runs)
{
    char *dir = th_tmpdir("pipe"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ckpt_engine *e = engine_in(dir, 3, 20000);
    static double v1[512], v2[512];
    int64_t shape[1] = {512};
    ckpt_tensor t[2] = {{.name = "a", .ptr = v1, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v1)},
                        {.name = "b", .ptr = v2, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v2)}};
    for (int i = 0; i < 512; i++)
        v1[i] = v2[i] = 2;
    th_assert_rc(th_write_file(hold, "", 0), 0);
    copy_faults("copy@1=hang", hold); /* the second tensor's copy */
    th_assert_rc(ckpt_start(e, 2, t, 2), 0);
    bool seen = false;
    for (int i = 0; i < 400 && !seen; i++) { /* the attempt's shard file, made by the writer */
        DIR *d = opendir(dir);
        ck_assert_ptr_nonnull(d);
        for (struct dirent *de; !seen && (de = readdir(d)) != NULL;) {
            char p[8500];
            snprintf(p, sizeof(p), "%s/%s/shard-0.h5", dir, de->d_name);
            seen = strncmp(de->d_name, ".tmp-step-", 10) == 0 && access(p, F_OK) == 0;
        }
        closedir(d);
        if (!seen)
            rk__sleep_ns(25 * 1000000LL);
    }
    ck_assert_msg(seen, "the writer did not start on the shard while the copy ran");
    unlink(hold);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(20000)), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    copy_faults(NULL, NULL);
    ck_assert(th_exists(dir, S2));
    memset(v1, 0, sizeof(v1));
    memset(v2, 0, sizeof(v2));
    th_assert_rc(ckpt_load(e, 2, t, 2), 0);
    th_assert_rc(ckpt_restore_held(e, t, 2), 0);
    ck_assert(v1[0] == 2 && v1[511] == 2 && v2[0] == 2 && v2[511] == 2);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Two generations (S6): a snapshot whose copy fails, or is given up on at its
   deadline, leaves the one before it whole, and ckpt_snapshot_select makes that one the
   held snapshot again; restoring it gives that step's bytes. */
START_TEST(failed_snapshot_leaves_the_one_before)
{
    char *dir = th_tmpdir("gens"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ckpt_engine *e = engine_in(dir, 3, 800);
    static double v[1024];
    int64_t shape[1] = {1024};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    for (int s = 1; s <= 2; s++) {
        v[0] = v[1023] = s;
        th_assert_rc(ckpt_snapshot_take(e, s, &t, 1), 0);
        th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    }
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 2);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 1);
    /* Step 3's copy fails: 2 stays, in the older generation. */
    copy_faults("copy@0=eio", NULL);
    v[0] = v[1023] = 3;
    th_assert_rc(ckpt_snapshot_take(e, 3, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), -EIO);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 2);
    /* Step 4's copy hangs past its deadline (timeout_ms / 4): given up on, never held; the
       older generation is still 2, written over by neither. */
    th_assert_rc(th_write_file(hold, "", 0), 0);
    copy_faults("copy@0=hang", hold);
    v[0] = v[1023] = 4;
    th_assert_rc(ckpt_snapshot_take(e, 4, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(50)), RK_E_TIMEOUT);
    unlink(hold);
    copy_ended(e);
    copy_faults(NULL, NULL);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 2);
    /* What a recovery is offered: the older generation only; with sharded state, nothing
       (no partner copy, S4); a layout that is not t's, nothing. */
    ckpt_offer o = ckpt_snapshot_offer(e, &t, 1, false);
    ck_assert(o.held == -1 && o.older == 2 && o.committed == -1);
    o = ckpt_snapshot_offer(e, &t, 1, true);
    ck_assert(o.held == -1 && o.older == -1);
    o = ckpt_snapshot_offer(e, NULL, 1, false);
    ck_assert(o.held == -1 && o.older == -1);
    th_assert_rc(ckpt_snapshot_restore(e, 4, &t, 1), RK_E_NOCKPT);
    th_assert_rc(ckpt_snapshot_select(e, 4), RK_E_NOCKPT);
    th_assert_rc(ckpt_snapshot_select(e, 2), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 2);
    v[0] = v[1023] = -1;
    th_assert_rc(ckpt_restore_held(e, &t, 1), 0);
    ck_assert(v[0] == 2 && v[1023] == 2);
    /* and the next snapshot goes into the other region: 2 stays held as the older one */
    v[0] = v[1023] = 5;
    th_assert_rc(ckpt_snapshot_take(e, 5, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 5);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 2);
    ck_assert(((const double *)ckpt_snapshot_older(e)->own[0].data)[1023] == 2);
    /* the rollback of a member that holds step 2 itself: selected, then restored */
    v[0] = v[1023] = -1;
    th_assert_rc(ckpt_snapshot_restore(e, 2, &t, 1), 0);
    ck_assert(v[0] == 2 && v[1023] == 2);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 2);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S6, S7: a snapshot's copy given up on at its deadline (held by a fault) still writes the
   newest generation's region: no generation is selected while it runs (the older one is not
   made the held one under it), and once it ends, failing at the frozen tensor's copy, that
   generation keeps no frozen bytes it never got: the next snapshot there copies the frozen
   tensor again. (Before: the select swapped the generations under the copy, its failure
   cleared the other generation's frozen marks, and the snapshot of step 3 held zeros for
   the frozen tensor.) */
START_TEST(select_waits_for_a_given_up_copy)
{
    char *dir = th_tmpdir("gens-sel"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    ckpt_engine *e = engine_in(dir, 3, 800);
    static double w[256], emb[256];
    int64_t shape[1] = {256};
    ckpt_tensor t[2] = {
        {.name = "w", .ptr = w, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(w)},
        {.name = "emb", .ptr = emb, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(emb), .frozen = true}};
    emb[0] = emb[255] = 7;
    w[0] = 1;
    th_assert_rc(ckpt_snapshot_take(e, 1, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    th_assert_rc(th_write_file(hold, "", 0), 0);
    copy_faults("copy@0=hang,copy@1=eio", hold); /* step 2: w's copy held, then emb's fails */
    w[0] = 2;
    th_assert_rc(ckpt_snapshot_take(e, 2, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(50)), RK_E_TIMEOUT);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 1);
    th_assert_rc(ckpt_snapshot_select(e, 1), RK_E_TIMEOUT);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, -1);
    unlink(hold);
    copy_ended(e);
    copy_faults(NULL, NULL);
    w[0] = 3;
    th_assert_rc(ckpt_snapshot_take(e, 3, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    const ckpt_snapshot *h = ckpt_snapshot_held(e);
    ck_assert_int_eq(h->step, 3);
    ck_assert(((const double *)h->own[0].data)[0] == 3);
    ck_assert_msg(((const double *)h->own[1].data)[0] == 7 && ((const double *)h->own[1].data)[255] == 7,
                  "the frozen tensor held at step 3: %g (want 7)", ((const double *)h->own[1].data)[0]);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 1);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S6: the generations turn before a snapshot's staging is made; when that fails (here its
   new, larger region cannot be mapped: RK_FAULT=stage), the region it would have filled
   holds nothing, and the newest whole snapshot stays offered, as the older generation.
   (Before: the generation turned to held the snapshot before the older one, step 1, and
   ckpt_snapshot_held offered it, behind the older generation's step 2.) */
START_TEST(failed_staging_keeps_the_newest_offered)
{
    char *dir = th_tmpdir("gens-stage");
    ckpt_engine *e = engine_in(dir, 3, 5000);
    static double v[2048];
    int64_t shape[1] = {1024}, grown[1] = {2048};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = 1024 * 8};
    for (int s = 1; s <= 2; s++) {
        v[0] = s;
        th_assert_rc(ckpt_snapshot_take(e, s, &t, 1), 0);
        th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    }
    copy_faults("stage@0=eio", NULL);
    t.shape = grown;
    t.nbytes = sizeof(v);
    v[0] = 3;
    th_assert_rc(ckpt_snapshot_take(e, 3, &t, 1), -EIO);
    copy_faults(NULL, NULL);
    int64_t held = ckpt_snapshot_held(e)->step, older = ckpt_snapshot_older(e)->step;
    ck_assert_msg(held == -1 && older == 2, "held %lld, older %lld: want -1 and 2 (never one older than the older)",
                  (long long)held, (long long)older);
    th_assert_rc(ckpt_snapshot_select(e, 2), 0);
    ck_assert(((const double *)ckpt_snapshot_held(e)->own[0].data)[0] == 2);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* RK_FROZEN: each generation copies a frozen tensor once and keeps it; the others are
   copied at every snapshot. A frozen tensor changed anyway (against its promise) shows it:
   the snapshots keep its first bytes, while the other tensor's follow every step. A copy
   that fails leaves that generation without it: the next snapshot there copies it again. */
START_TEST(frozen_tensor_copied_once_a_generation)
{
    char *dir = th_tmpdir("frozen");
    ckpt_engine *e = engine_in(dir, 3, 20000);
    static double emb[256], w[256];
    int64_t shape[1] = {256};
    ckpt_tensor t[2] = {
        {.name = "emb", .ptr = emb, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(emb), .frozen = true},
        {.name = "w", .ptr = w, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(w)}};
    for (int s = 1; s <= 4; s++) {
        emb[0] = w[0] = s;
        th_assert_rc(ckpt_snapshot_take(e, s, t, 2), 0);
        th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
        const ckpt_snapshot *h = ckpt_snapshot_held(e);
        ck_assert_int_eq(h->step, s);
        /* generation A took steps 1 and 3, B 2 and 4: each holds emb as first copied */
        ck_assert_msg(((const double *)h->own[0].data)[0] == (s % 2 ? 1 : 2), "step %d: emb %g", s,
                      ((const double *)h->own[0].data)[0]);
        ck_assert(((const double *)h->own[1].data)[0] == s);
    }
    /* a copy that fails (w's, at step 5, into A) leaves A without emb: the next snapshot
       there (step 7: nothing whole in A, so A again) copies it again; B still keeps 2 */
    copy_faults("copy@0=eio", NULL);
    emb[0] = w[0] = 5;
    th_assert_rc(ckpt_snapshot_take(e, 5, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), -EIO);
    copy_faults(NULL, NULL);
    emb[0] = w[0] = 7;
    th_assert_rc(ckpt_snapshot_take(e, 7, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert(((const double *)ckpt_snapshot_held(e)->own[0].data)[0] == 7);
    ck_assert(((const double *)ckpt_snapshot_older(e)->own[0].data)[0] == 2);
    emb[0] = w[0] = 8;
    th_assert_rc(ckpt_snapshot_take(e, 8, t, 2), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert(((const double *)ckpt_snapshot_held(e)->own[0].data)[0] == 2);
    ck_assert(((const double *)ckpt_snapshot_held(e)->own[1].data)[0] == 8);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* Snapshots at every step while a checkpoint's write lasts longer than a step (its fsync
   held): they never write the region the writer reads, so the checkpoint commits the
   bytes of its own step; that region is put aside (park) and the two generations go on,
   so the older one is always the step before the newest (S6, ckpt/writer.c W5). (Before: the older
   generation stayed the step being written and the newest was overwritten in place, so a
   loss during a copy rolled back to the written step, several steps back: seed-3300
   campaign, run 140.) */
START_TEST(snapshots_leave_the_written_generation_alone)
{
    char *dir = th_tmpdir("gens-w"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    th_assert_rc(th_write_file(hold, "", 0), 0);
    ckpt_engine *e = engine_in(dir, 3, 20000);
    static double v[4096], out[4096];
    int64_t shape[1] = {4096};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    copy_faults("sync@0=hang", hold);
    for (int i = 0; i < 4096; i++)
        v[i] = 2;
    th_assert_rc(ckpt_start(e, 2, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    for (int s = 3; s <= 6; s++) {
        for (int i = 0; i < 4096; i++)
            v[i] = s;
        th_assert_rc(ckpt_snapshot_take(e, s, &t, 1), 0);
        th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
        ck_assert_int_eq(ckpt_snapshot_held(e)->step, s);
        ck_assert_int_eq(ckpt_snapshot_older(e)->step, s - 1);
        for (int i = 0; i < 4096; i += 4095)
            ck_assert(((const double *)ckpt_snapshot_older(e)->own[0].data)[i] == s - 1);
    }
    ck_assert(ckpt_busy(e));
    unlink(hold);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    copy_faults(NULL, NULL);
    rk_reader *r = NULL;
    th_assert_rc(rk_reader_open(&r, dir, 2), 0);
    th_assert_rc(rk_reader_read(r, 0, out, sizeof(out)), 0);
    rk_reader_close(&r);
    for (int i = 0; i < 4096; i++)
        ck_assert_msg(out[i] == 2, "element %d of checkpoint 2 on disk: %g", i, out[i]);
    /* the writer idle: the next snapshot turns the generations again */
    th_assert_rc(ckpt_snapshot_take(e, 7, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 7);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 6);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* S13: an engine with one_copy (RK_SNAPSHOT_EVERY=0) holds one generation: no region mapped
   ahead for another, each checkpoint's snapshot copied into the same region, nothing older
   held; while the writer still reads that region (its fsync held), the next snapshot takes
   a new one and the one written stays whole and held as the older, until the next turn
   after the write, which unmaps it; a rebuild's seal unmaps the region it replaced. Every
   checkpoint on disk holds its own step's bytes. */
START_TEST(one_copy_holds_one_generation)
{
    char *dir = th_tmpdir("onecopy"), hold[4300];
    snprintf(hold, sizeof(hold), "%s/hold", dir);
    th_assert_rc(th_write_file(hold, "", 0), 0);
    ckpt_config cfg = {.dir = dir, .rank = 0, .world = 1, .keep = 3, .timeout_ms = 20000, .nonce = 7, .one_copy = true};
    ckpt_engine *e = NULL;
    th_assert_rc(ckpt_create(&e, &cfg), 0);
    static double v[1 << 16];
    int64_t shape[1] = {1 << 16};
    ckpt_tensor t = {.name = "w", .ptr = v, .dtype = RK_F64, .ndim = 1, .shape = shape, .nbytes = sizeof(v)};
    const void *region = NULL;
    for (int s = 2; s <= 4; s += 2) {
        for (int i = 0; i < 1 << 16; i++)
            v[i] = s;
        th_assert_rc(ckpt_start(e, s, &t, 1), 0);
        th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
        th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
        ck_assert_int_eq(ckpt_snapshot_held(e)->step, s);
        ck_assert_msg(e->s.prep.job == NULL && e->s.prep.p == NULL, "a region mapped ahead for a second generation");
        ck_assert_ptr_null(e->s.old.staging);
        ck_assert_int_eq(ckpt_snapshot_older(e)->step, -1);
        if (region)
            ck_assert_msg(ckpt_snapshot_held(e)->out == region, "step %d copied into a new region", s);
        region = ckpt_snapshot_held(e)->out;
    }
    /* the writer of checkpoint 6 held in its fsync: snapshot 7 leaves its region alone */
    copy_faults("sync@0=hang", hold);
    for (int i = 0; i < 1 << 16; i++)
        v[i] = 6;
    th_assert_rc(ckpt_start(e, 6, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    for (int i = 0; i < 1 << 16; i++)
        v[i] = 7;
    th_assert_rc(ckpt_snapshot_take(e, 7, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 7);
    ck_assert(ckpt_snapshot_held(e)->out != region);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, 6);
    ck_assert(((const double *)ckpt_snapshot_older(e)->own[0].data)[0] == 6);
    ck_assert(ckpt_busy(e));
    unlink(hold);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    copy_faults(NULL, NULL);
    region = ckpt_snapshot_held(e)->out;
    for (int i = 0; i < 1 << 16; i++)
        v[i] = 8;
    th_assert_rc(ckpt_start(e, 8, &t, 1), 0);
    th_assert_rc(ckpt_copied(e, false, rk__deadline_ns(5000)), 0);
    th_assert_rc(ckpt_wait(e, rk__deadline_ns(20000)), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 8);
    ck_assert(ckpt_snapshot_held(e)->out == region);
    ck_assert_ptr_null(e->s.old.staging);
    ck_assert_int_eq(ckpt_snapshot_older(e)->step, -1);
    /* a rebuild (S11) leaves no second region behind: the one it replaced goes at the seal */
    unsigned char *where[1];
    const ckpt_snapshot *before = NULL;
    th_assert_rc(ckpt_hold_open(e, 8, &t, 1, where, &before), 0);
    ck_assert_int_eq(before->step, 8);
    memcpy(where[0], before->own[0].data, sizeof(v));
    th_assert_rc(ckpt_hold_seal(e, 8, &t, 1), 0);
    ck_assert_int_eq(ckpt_snapshot_held(e)->step, 8);
    ck_assert_msg(e->s.old.staging == NULL && e->s.prev == NULL, "a second region kept after the rebuild");
    ck_assert(v[0] == 8 && v[(1 << 16) - 1] == 8);
    for (int s = 4; s <= 8; s += 2)
        check_ckpt(e, s, 1 << 16, s);
    th_assert_rc(ckpt_destroy(&e, rk__deadline_ns(10000)), 0);
    th_rmrf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_snap");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cancelled_hold_keeps_the_held_snapshot);
    tcase_add_test(tc, copy_engine_batches);
    tcase_add_test(tc, copy_engine_streams_large_copies);
    tcase_add_test(tc, snapshot_copied_before_the_update);
    tcase_add_test(tc, copy_failing_halfway_fails_the_checkpoint);
    tcase_add_test(tc, failed_snapshot_leaves_the_one_before);
    tcase_add_test(tc, snapshots_leave_the_written_generation_alone);
    tcase_add_test(tc, frozen_tensor_copied_once_a_generation);
    tcase_add_test(tc, select_waits_for_a_given_up_copy);
    tcase_add_test(tc, failed_staging_keeps_the_newest_offered);
    tcase_add_test(tc, checkpoint_writes_from_the_snapshot_in_flight);
    tcase_add_test(tc, next_region_mapped_ahead);
    tcase_add_test(tc, restore_faults_staging_in_maps_ahead_after);
    tcase_add_test(tc, writer_writes_while_the_copy_runs);
    tcase_add_test(tc, one_copy_holds_one_generation);
    suite_add_tcase(s, tc);
    return th_main(s);
}
