/*
 * tests/test_read.c - the restore's reads (formats/fmt_readdirect.c R1-R6, fmt_read.c's
 * requests): one batch of whole tensors and rows of sharded ones, cold (O_DIRECT straight
 * into the destination, or through the reader's buffers) and warm (pread from the page
 * cache), a fault in the middle of each way, a damaged byte in the middle of a large
 * tensor; then rk_resume in a real process (tests/prog_ckpt) with the same fault and
 * damage, its buffers untouched (ckpt/snapshot.h S3).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/fmt.h"
#include "ckpt_prog.h" /* prog_ckpt: its path, a job's environment */
#include "common.h"
#include "harness.h"

#define MIB    ((size_t)1 << 20)
#define NRANK  2
#define ROWB   12000 /* bytes of a row of the sharded tensor: not a multiple of 4 KiB */
#define PROWS  700   /* its rows in each piece (blocks of 87 rows) */

/* Tensors: order, name, bytes, rank (-1: the sharded one). */
static const struct {
    const char *name;
    size_t bytes;
    int rank;
} spec[] = {
    {"a", 6 * MIB + 4097, 0}, {"b", 9 * MIB, 0}, {"c", 100, 0}, {"sh/w", 0, -1}, {"d", 5 * MIB + 12, 1}};
#define NT (sizeof(spec) / sizeof(spec[0]))

typedef struct {
    char *top, step[4200];
    unsigned char *data[NT]; /* each tensor's bytes (the sharded one: global) */
    size_t bytes[NT];
    fmt_manifest *m[NRANK];
} ckpt_files;

static void quiet(const char *fault, const char *path)
{
    if (fault)
        setenv("RK_FAULT", fault, 1);
    else
        unsetenv("RK_FAULT");
    if (path)
        setenv("RK_FAULT_PATH", path, 1);
    else
        unsetenv("RK_FAULT_PATH");
    setenv("RK_LOG", "error", 1);
    unsetenv("RK_LOG_SUBSYS");
    rk__log_reload();
    rk__fault_reset();
}

static void write_files(ckpt_files *w)
{
    quiet(NULL, NULL);
    memset(w, 0, sizeof(*w));
    w->top = th_tmpdir("read");
    snprintf(w->step, sizeof(w->step), "%s/step-000000000003", w->top);
    ck_assert_int_eq(mkdir(w->step, 0755), 0);
    for (size_t k = 0; k < NT; k++) {
        w->bytes[k] = spec[k].rank < 0 ? (size_t)NRANK * PROWS * ROWB : spec[k].bytes;
        ck_assert_ptr_nonnull(w->data[k] = malloc(w->bytes[k]));
        th_pattern(w->data[k], w->bytes[k], (unsigned)k + 1);
    }
    char io_path[FMT_IO_PATH_LEN] = "";
    for (int r = 0; r < NRANK; r++) {
        fmt_manifest *m = calloc(1, sizeof(*m));
        ck_assert_ptr_nonnull(m);
        *m = (fmt_manifest){.version = FMT_VERSION, .step = 3, .rank = r, .world = NRANK, .nonce = 9};
        ck_assert_ptr_nonnull(m->t = calloc(NT, sizeof(*m->t)));
        for (size_t k = 0; k < NT; k++) {
            fmt_tensor *t = &m->t[m->n];
            if (spec[k].rank >= 0 && spec[k].rank != r)
                continue;
            m->n++;
            if (spec[k].rank >= 0) {
                *t = (fmt_tensor){.name = strdup(spec[k].name),
                                  .dtype = RK_U8,
                                  .ndim = 1,
                                  .shape = {(int64_t)spec[k].bytes},
                                  .nbytes = spec[k].bytes,
                                  .order = (uint32_t)k,
                                  .rank = r,
                                  .data = w->data[k]};
                continue;
            }
            *t = (fmt_tensor){.name = strdup(spec[k].name),
                              .dtype = RK_F32,
                              .ndim = 2,
                              .shape = {PROWS, ROWB / 4},
                              .nbytes = (uint64_t)PROWS * ROWB,
                              .order = (uint32_t)k,
                              .rank = r,
                              .data = w->data[k] + (size_t)r * PROWS * ROWB,
                              .kind = FMT_SHARDED,
                              .rows = NRANK * PROWS,
                              .row0 = (int64_t)r * PROWS};
        }
        char path[4300];
        fmt_write_stats st;
        snprintf(path, sizeof(path), "%s/shard-%d.h5", w->step, r);
        ck_assert_msg(fmt_shard_write(path, m, "auto", &st) == 0, "%s", rk_last_error());
        snprintf(m->io_path, sizeof(m->io_path), "%s", st.io_path);
        snprintf(io_path, sizeof(io_path), "%s", st.io_path);
        snprintf(path, sizeof(path), "%s/shard-%d.ok", w->step, r);
        ck_assert_int_eq(fmt_manifest_write(path, m), 0);
        w->m[r] = m;
    }
    ck_assert_msg(fmt_index_write(w->step, 3, NRANK, w->m, io_path, 1) == 0, "%s", rk_last_error());
}

static void files_free(ckpt_files *w)
{
    for (int r = 0; r < NRANK; r++)
        fmt_manifest_free(&w->m[r]);
    for (size_t k = 0; k < NT; k++)
        free(w->data[k]);
    th_rmrf(w->top);
    free(w->top);
    quiet(NULL, NULL);
}

/* The shards' pages dropped from the page cache (cold) or read into it (warm). */
static void cache(const ckpt_files *w, bool warm)
{
    static char buf[1 << 16];
    for (int r = 0; r < NRANK; r++) {
        char path[4300];
        snprintf(path, sizeof(path), "%s/shard-%d.h5", w->step, r);
        int fd = open(path, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        if (warm) {
            for (off_t at = 0; pread(fd, buf, sizeof(buf), at) > 0; at += (off_t)sizeof(buf))
                ;
        } else {
            ck_assert_int_eq(fdatasync(fd), 0);
            ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        }
        close(fd);
    }
}

/* One destination region: every tensor at a 4 KiB boundary with the room to a 4 KiB end
   (as staging lays them out), a sentinel byte pattern everywhere else. */
typedef struct {
    unsigned char *mem;
    size_t at[NT], size;
} region;

#define ALIGN(x) (((x) + 4095u) & ~(size_t)4095u)

static void region_make(region *g, const ckpt_files *w)
{
    g->size = 0;
    for (size_t k = 0; k < NT; k++) {
        g->at[k] = g->size;
        g->size += ALIGN(w->bytes[k]) + 4096; /* a page of sentinel after each */
    }
    ck_assert_int_eq(posix_memalign((void **)&g->mem, 4096, g->size), 0);
    memset(g->mem, 0xA5, g->size);
}

/* Requests for every tensor whole into g, in order; drop as asked. */
static int read_all(fmt_ckpt *c, region *g, const ckpt_files *w, bool drop)
{
    fmt_read_req r[NT];
    for (size_t k = 0; k < NT; k++) {
        long i = fmt_ckpt_find(c, spec[k].name);
        ck_assert_int_ge(i, 0);
        r[k] = (fmt_read_req){.i = (size_t)i,
                              .first = 0,
                              .nrows = NRANK * PROWS,
                              .dst = g->mem + g->at[k],
                              .cap = ALIGN(w->bytes[k])};
    }
    return fmt_ckpt_read_many(c, r, NT, drop);
}

/* Every tensor's bytes right, and the sentinel after each untouched. */
static void region_check(const region *g, const ckpt_files *w)
{
    for (size_t k = 0; k < NT; k++) {
        ck_assert_msg(memcmp(g->mem + g->at[k], w->data[k], w->bytes[k]) == 0, "tensor %s differs",
                      spec[k].name);
        const unsigned char *after = g->mem + g->at[k] + ALIGN(w->bytes[k]);
        for (size_t j = 0; j < 4096; j++)
            ck_assert_msg(after[j] == 0xA5, "past tensor %s's room, byte %zu written", spec[k].name, j);
    }
}

/* The reader's debug line of the last batch ("... straight B, bounce B, buffered B, most in
   flight N: ok"), captured from the log. */
typedef struct {
    unsigned long long straight, bounce, buffered, most;
} ways;

/* The reader's debug lines captured from here on; log_end stops and, where out is not
   NULL, reads the last batch's line into it. */
static void log_begin(th_capture *cap, bool debug)
{
    setenv("RK_LOG", debug ? "debug" : "error", 1);
    setenv("RK_LOG_SUBSYS", "fmt", 1);
    rk__log_reload();
    th_capture_begin(cap);
}

static void log_end(th_capture *cap, ways *out)
{
    char *log = th_capture_end(cap);
    setenv("RK_LOG", "error", 1);
    rk__log_reload();
    const char *l = log ? strstr(log, "bytes straight ") : NULL;
    ck_assert_msg(!out ||
                      (l && sscanf(l, "bytes straight %llu, bounce %llu, buffered %llu, most in flight %llu",
                                   &out->straight, &out->bounce, &out->buffered, &out->most) == 4),
                  "log: %s", log ? log : "");
    free(log);
}

static int read_logged(fmt_ckpt *c, region *g, const ckpt_files *w, bool drop, ways *out)
{
    th_capture cap;
    log_begin(&cap, true);
    int rc = read_all(c, g, w, drop);
    log_end(&cap, out);
    return rc;
}

/* R1, R2 (straight): a cold batch goes O_DIRECT into the destinations themselves, more
   reads in flight at once than any one tensor has (3 at most of 4 MiB), and each tensor
   lands whole with nothing written past its room. Before, every tensor drained the queue
   (its own reads only in flight) and came through the reader's buffers. */
START_TEST(cold_batch_straight_queue_across_tensors)
{
    ckpt_files w;
    write_files(&w);
    region g;
    region_make(&g, &w);
    cache(&w, false);
    fmt_ckpt *c = NULL;
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    ways h;
    th_assert_rc(read_logged(c, &g, &w, true, &h), 0);
    region_check(&g, &w);
    /* a, b, d and sh/w's first piece straight; its second piece's rows start past a 4 KiB
       boundary of the destination: through the reader's buffers */
    ck_assert_msg(h.straight >= 20 * MIB + (size_t)PROWS * ROWB && h.bounce == (size_t)PROWS * ROWB,
                  "straight %llu bounce %llu", h.straight, h.bounce);
    ck_assert_msg(h.most > 3, "at most %llu reads in flight", h.most);
    fmt_ckpt_close(&c);
    free(g.mem);
    files_free(&w);
}
END_TEST

/* R2 (buffered, bounce): the same batch from a file in the page cache is read with pread
   (no O_DIRECT read, no io_uring ring made), and without drop a cold one goes through the
   reader's buffers; both whole. Before, a warm file was read from the disk again. */
START_TEST(warm_batch_buffered_and_bounce)
{
    ckpt_files w;
    write_files(&w);
    region g;
    region_make(&g, &w);
    cache(&w, true);
    quiet("read@100000=eio", NULL); /* counts the operations */
    fmt_ckpt *c = NULL;
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    ways h;
    th_assert_rc(read_logged(c, &g, &w, true, &h), 0);
    region_check(&g, &w);
    ck_assert_msg(h.straight == 0 && h.bounce == 0 && h.buffered > 20 * MIB,
                  "straight %llu bounce %llu buffered %llu", h.straight, h.bounce, h.buffered);
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_URING), 0);
    fmt_ckpt_close(&c);
    memset(g.mem, 0xA5, g.size);
    cache(&w, false);
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    th_assert_rc(read_logged(c, &g, &w, false, &h), 0);
    region_check(&g, &w);
    ck_assert_msg(h.straight == 0 && h.bounce >= 20 * MIB, "straight %llu bounce %llu", h.straight, h.bounce);
    fmt_ckpt_close(&c);
    free(g.mem);
    files_free(&w);
}
END_TEST

/* R4, R6: a read that fails in the middle of the batch (RK_FAULT read@N=eio, N half of the
   reads a clean batch makes) fails it with -EIO naming a tensor, each way (straight, through
   the reader's buffers, pread from the page cache); the reads in flight are collected and
   the next batch of the same reader reads everything right. */
static const struct {
    bool warm, drop;
} mid[] = {{false, true}, {false, false}, {true, true}};

START_TEST(fault_in_the_middle_of_each_way)
{
    ckpt_files w;
    write_files(&w);
    region g;
    region_make(&g, &w);
    fmt_ckpt *c = NULL;
    cache(&w, mid[_i].warm);
    quiet("read@100000=eio", "shard-");
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    uint64_t opened = rk__fault_count(RK_FAULT_OP_READ);
    th_assert_rc(read_all(c, &g, &w, mid[_i].drop), 0);
    uint64_t reads = rk__fault_count(RK_FAULT_OP_READ) - opened;
    fmt_ckpt_close(&c);
    ck_assert_uint_ge(reads, 6);
    char spec_[64];
    snprintf(spec_, sizeof(spec_), "read@%llu=eio", (unsigned long long)(opened + reads / 2));
    cache(&w, mid[_i].warm);
    quiet(spec_, "shard-");
    memset(g.mem, 0xA5, g.size);
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    th_assert_rc(read_all(c, &g, &w, mid[_i].drop), -EIO);
    ck_assert_msg(strstr(rk_last_error(), "reading tensor '"), "%s", rk_last_error());
    ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_READ), opened + reads / 2 + 1); /* it stopped there */
    quiet(NULL, NULL);
    th_assert_rc(read_all(c, &g, &w, mid[_i].drop), 0);
    region_check(&g, &w);
    fmt_ckpt_close(&c);
    free(g.mem);
    files_free(&w);
}
END_TEST

/* R2, R3 for rows of the sharded tensor, cold with drop: each range (a piece whole, both,
   from and to the middle of blocks, across the pieces, one row) lands right with nothing
   written past it (the room is the rows' bytes: no read rounded into the next bytes). */
static const int64_t ranges[][2] = {{0, PROWS}, {PROWS, PROWS}, {0, 2 * PROWS}, {50, 600},
                                    {650, 100}, {86, 88},       {699, 1},       {10, 1390}};

START_TEST(sharded_rows_cold_straight)
{
    ckpt_files w;
    write_files(&w);
    cache(&w, false);
    fmt_ckpt *c = NULL;
    ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
    long i = fmt_ckpt_find(c, "sh/w");
    ck_assert_int_ge(i, 0);
    unsigned char *buf = NULL;
    size_t most = ALIGN((size_t)2 * PROWS * ROWB) + 4096;
    ck_assert_int_eq(posix_memalign((void **)&buf, 4096, most), 0);
    for (size_t k = 0; k < RK_ARRAY_LEN(ranges); k++) {
        size_t n = (size_t)ranges[k][1] * ROWB;
        memset(buf, 0xA5, most);
        fmt_read_req r = {.i = (size_t)i, .first = ranges[k][0], .nrows = ranges[k][1], .dst = buf, .cap = n};
        th_assert_rc(fmt_ckpt_read_many(c, &r, 1, true), 0);
        ck_assert_msg(memcmp(buf, w.data[3] + (size_t)ranges[k][0] * ROWB, n) == 0, "rows %lld+%lld differ",
                      (long long)ranges[k][0], (long long)ranges[k][1]);
        size_t j = n;
        while (j < most && buf[j] == 0xA5)
            j++;
        ck_assert_msg(j == most, "rows %lld+%lld: byte %zu past them written", (long long)ranges[k][0],
                      (long long)ranges[k][1], j - n);
    }
    free(buf);
    fmt_ckpt_close(&c);
    files_free(&w);
}
END_TEST

/* R4, R6 for rows of the sharded tensor across both pieces (10..1399: a block of each
   piece read in part, the rest as runs), cold straight and warm: a fault at each of its
   reads in turn fails the read with -EIO naming the tensor, and a clean read after it on
   the same reader gets every row right. */
START_TEST(sharded_rows_fault_at_each_read)
{
    ckpt_files w;
    write_files(&w);
    unsigned char *buf = NULL;
    size_t n = (size_t)1390 * ROWB;
    ck_assert_int_eq(posix_memalign((void **)&buf, 4096, ALIGN(n)), 0);
    for (int warm = 0; warm < 2; warm++) {
        cache(&w, warm);
        quiet("read@100000=eio", "shard-");
        fmt_ckpt *c = NULL;
        ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
        fmt_read_req r = {
            .i = (size_t)fmt_ckpt_find(c, "sh/w"), .first = 10, .nrows = 1390, .dst = buf, .cap = n};
        uint64_t opened = rk__fault_count(RK_FAULT_OP_READ);
        th_assert_rc(fmt_ckpt_read_many(c, &r, 1, true), 0);
        uint64_t reads = rk__fault_count(RK_FAULT_OP_READ) - opened;
        fmt_ckpt_close(&c);
        ck_assert_uint_ge(reads, 4);
        for (uint64_t k = 0; k < reads; k++) {
            char f[64];
            snprintf(f, sizeof(f), "read@%llu=eio", (unsigned long long)(opened + k));
            cache(&w, warm);
            quiet(f, "shard-");
            ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
            th_assert_rc(fmt_ckpt_read_many(c, &r, 1, true), -EIO);
            ck_assert_msg(strstr(rk_last_error(), "tensor 'sh/w'"), "read %llu: %s", (unsigned long long)k,
                          rk_last_error());
            quiet(NULL, NULL);
            memset(buf, 0, n);
            th_assert_rc(fmt_ckpt_read_many(c, &r, 1, true), 0);
            ck_assert_msg(memcmp(buf, w.data[3] + (size_t)10 * ROWB, n) == 0, "read %llu: rows differ after",
                          (unsigned long long)k);
            fmt_ckpt_close(&c);
        }
    }
    free(buf);
    files_free(&w);
}
END_TEST

/* R3: a byte changed on disk in the middle of a large tensor (b, 9 MiB), or of a block of
   the sharded tensor, fails the batch with RK_E_CORRUPT naming the tensor (and the
   block's rows), cold (straight) and warm (pread). */
START_TEST(damaged_byte_in_the_middle_refused)
{
    ckpt_files w;
    write_files(&w);
    char path[4300];
    snprintf(path, sizeof(path), "%s/shard-0.h5", w.step);
    const fmt_tensor *b = &w.m[0]->t[1], *piece = &w.m[0]->t[3];
    ck_assert_str_eq(b->name, "b");
    ck_assert_str_eq(piece->name, "sh/w");
    const struct {
        off_t off;
        const char *names;
    } dmg[] = {
        {(off_t)(b->offset + b->nbytes / 2 + 3), "tensor 'b': checksum mismatch"},
        {(off_t)(piece->offset + 300 * ROWB + 5), "tensor 'sh/w': checksum mismatch in rows 261..347"}};
    region g;
    region_make(&g, &w);
    for (size_t k = 0; k < RK_ARRAY_LEN(dmg); k++) {
        th_flip_byte(path, dmg[k].off);
        for (int warm = 0; warm < 2; warm++) {
            cache(&w, warm);
            fmt_ckpt *c = NULL;
            ck_assert_msg(fmt_ckpt_open(w.step, &c) == 0, "%s", rk_last_error());
            th_assert_rc(read_all(c, &g, &w, true), RK_E_CORRUPT);
            ck_assert_msg(strstr(rk_last_error(), dmg[k].names), "'%s' does not say %s", rk_last_error(),
                          dmg[k].names);
            fmt_ckpt_close(&c);
        }
        th_flip_byte(path, dmg[k].off);
    }
    free(g.mem);
    files_free(&w);
}
END_TEST

/* ---- rk_resume in a real process (tests/prog_ckpt, with its 16 MiB tensor "big") ------ */

/* The shard's pages dropped from the page cache. */
static void drop_shard(const char *dir)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/step-000000000002/shard-0.h5", dir);
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* rk_resume (prog_ckpt untouched) of dir's only checkpoint, cold, with RK_FAULT=read@n=eio
   on shard-0.h5: where the fault is reached it must fail (RK_E_CORRUPT: none verifies)
   with every buffer untouched (with inplace, RK_RESTORE=inplace: part-written allowed),
   else restore step 2; whether its error names `name`. */
static bool fault_names(const char *dir, uint64_t n, const char *name, bool inplace)
{
    char fault[64], *out = NULL;
    snprintf(fault, sizeof(fault), "RK_FAULT=read@%llu=eio", (unsigned long long)n);
    drop_shard(dir);
    if (inplace)
        setenv("RK_RESTORE", "inplace", 1);
    int rc = run_prog(0, dir, "untouched", "0", fault, "RK_FAULT_PATH=shard-0.h5", &out);
    unsetenv("RK_RESTORE");
    bool failed = strstr(out, "resume: -1008 ") != NULL, named = failed && strstr(out, name);
    ck_assert_msg(rc == 0 && (failed ? inplace || strstr(out, "untouched 1") : strstr(out, "resume: 0 next 2") != NULL),
                  "read %llu: exit %d: %s", (unsigned long long)n, rc, out);
    free(out);
    return named;
}

/* How many of the reads in a row, counted from the restore's first, each fail the restore
   naming the 16 MiB tensor 'big' (fault_names), once the first of them is reached. */
static uint64_t big_reads_failing(const char *dir, bool inplace)
{
    uint64_t nbig = 0;
    for (uint64_t n = 0; n < 40; n++) {
        if (fault_names(dir, n, "reading tensor 'big'", inplace))
            nbig++;
        else if (nbig)
            break; /* past them */
    }
    return nbig;
}

/* A new directory under the test's own, with the checkpoints of prog_ckpt's 3 steps (2). */
static char *write_big(const char *name)
{
    char *dir = th_tmpdir(name), *out = NULL;
    int rc = run_prog(0, dir, "write", "3", NULL, NULL, &out);
    ck_assert_msg(rc == 0, "write: exit %d: %s", rc, out);
    free(out);
    return dir;
}

/* S3 with R4, R6: a read that fails anywhere in the restore's batch up to and through the
   16 MiB tensor's (read straight into staging: each of its 5 reads), and a byte changed in
   the middle of that tensor on disk (R3): rk_resume of the only checkpoint fails
   (RK_E_CORRUPT: none verifies) and every registered buffer is as it was. */
START_TEST(resume_fault_and_damage_leave_buffers)
{
    char *dir = write_big("resume"), *out = NULL;
    /* the reads of big (5 of 4 MiB, queued ahead of the small tensors' preads), each */
    ck_assert_uint_eq(big_reads_failing(dir, false), 5);
    char path[4300];
    snprintf(path, sizeof(path), "%s/step-000000000002/shard-0.ok", dir);
    fmt_manifest *m = NULL;
    ck_assert_int_eq(fmt_manifest_read(path, &m), 0);
    const fmt_tensor *big = &m->t[m->n - 1];
    ck_assert_str_eq(big->name, "big");
    snprintf(path, sizeof(path), "%s/step-000000000002/shard-0.h5", dir);
    th_flip_byte(path, (off_t)(big->offset + big->nbytes / 2 + 1));
    fmt_manifest_free(&m);
    int rc = run_prog(0, dir, "untouched", "0", NULL, NULL, &out);
    ck_assert_msg(rc == 0 && strstr(out, "resume: -1008 ") && strstr(out, "untouched 1") &&
                      strstr(out, "tensor 'big': checksum mismatch"),
                  "exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* ckpt/snapshot.h S12 with R4, R6: RK_RESTORE=inplace reads straight into the registered
   buffers through the reader's own (bounce, R2): a read that fails at each of the 16 MiB
   tensor's reads fails rk_resume of the only checkpoint (RK_E_CORRUPT: none verifies,
   naming the tensor) with no crash and its bound kept, the buffers part-written as the
   option says; the same checkpoint, cold and unharmed, is then restored whole. */
START_TEST(resume_inplace_fault_at_each_read)
{
    char *dir = write_big("inplace"), *out = NULL;
    ck_assert_uint_eq(big_reads_failing(dir, true), 5);
    drop_shard(dir);
    setenv("RK_RESTORE", "inplace", 1);
    int rc = run_prog(0, dir, "resume", "2", NULL, NULL, &out);
    unsetenv("RK_RESTORE");
    ck_assert_msg(rc == 0 && strstr(out, "resumed 2"), "exit %d: %s", rc, out);
    free(out);
    th_rmrf(dir);
    free(dir);
}
END_TEST

/* ---- rk_reader_read_many, the public batch (recover/api_read.c A1-A3) ---------------- */

/* Every tensor of w whole into g through the public reader, in spec order; bad: the
   request whose nbytes is one too many (-1: none). The reader's log line of the (last)
   batch in *h when h is not NULL. */
static int reader_batch(rk_reader *r, region *g, const ckpt_files *w, unsigned flags, int bad, ways *h)
{
    rk_read_req q[NT];
    for (size_t k = 0; k < NT; k++) {
        long i = rk_reader_find(r, spec[k].name);
        ck_assert_int_ge(i, 0);
        q[k] =
            (rk_read_req){.i = (size_t)i, .buf = g->mem + g->at[k], .nbytes = w->bytes[k] + ((int)k == bad)};
    }
    th_capture cap;
    log_begin(&cap, h != NULL);
    int rc = rk_reader_read_many(r, q, NT, flags);
    log_end(&cap, h);
    return rc;
}

/* A1-A3: rk_reader_read_many of every tensor (the sharded one whole), cold: one request
   one byte too long fails the batch with -EINVAL naming it and writes nothing; without
   RK_READ_SHARED the batch goes O_DIRECT (the reader's buffers: the caller's memory is
   not its to drop), with it through the page cache (the hint made every page cached
   before the reads: pread, no O_DIRECT read); a byte damaged in b fails either with
   RK_E_CORRUPT naming b; RK_FAULT read@N=eio half-way fails it with -EIO naming a
   tensor, and the same reader's next batch reads everything right. */
START_TEST(reader_read_many_shared_corrupt_fault)
{
    ckpt_files w;
    write_files(&w);
    region g;
    region_make(&g, &w);
    for (unsigned flags = 0; flags <= RK_READ_SHARED; flags++) {
        rk_reader *r = NULL;
        cache(&w, false);
        th_assert_rc(rk_reader_open(&r, w.top, 3), 0);
        memset(g.mem, 0xA5, g.size);
        th_assert_rc(reader_batch(r, &g, &w, flags, 2, NULL), -EINVAL);
        ck_assert_msg(strstr(rk_last_error(), "request 2: tensor 'c' has 100 bytes, the buffer 101"), "%s",
                      rk_last_error());
        size_t j = 0;
        while (j < g.size && g.mem[j] == 0xA5)
            j++;
        ck_assert_msg(j == g.size, "byte %zu written by a refused batch", j);
        ways h;
        th_assert_rc(reader_batch(r, &g, &w, flags, -1, &h), 0);
        region_check(&g, &w);
        if (flags & RK_READ_SHARED)
            ck_assert_msg(h.straight == 0 && h.bounce == 0 && h.buffered >= 20 * MIB,
                          "shared: straight %llu bounce %llu buffered %llu", h.straight, h.bounce,
                          h.buffered);
        else
            ck_assert_msg(h.bounce >= 20 * MIB && h.buffered < MIB, "bounce %llu buffered %llu", h.bounce,
                          h.buffered);
        rk_reader_close(&r);
        ck_assert_ptr_null(r);

        char path[4300];
        snprintf(path, sizeof(path), "%s/shard-0.h5", w.step);
        const fmt_tensor *b = &w.m[0]->t[1];
        th_flip_byte(path, (off_t)(b->offset + b->nbytes / 2 + 3));
        cache(&w, false);
        th_assert_rc(rk_reader_open(&r, w.top, 3), 0);
        th_assert_rc(reader_batch(r, &g, &w, flags, -1, NULL), RK_E_CORRUPT);
        ck_assert_msg(strstr(rk_last_error(), "tensor 'b': checksum mismatch"), "%s", rk_last_error());
        rk_reader_close(&r);
        th_flip_byte(path, (off_t)(b->offset + b->nbytes / 2 + 3));

        cache(&w, false);
        quiet("read@100000=eio", "shard-");
        th_assert_rc(rk_reader_open(&r, w.top, 3), 0);
        uint64_t opened = rk__fault_count(RK_FAULT_OP_READ);
        th_assert_rc(reader_batch(r, &g, &w, flags, -1, NULL), 0);
        uint64_t reads = rk__fault_count(RK_FAULT_OP_READ) - opened;
        rk_reader_close(&r);
        ck_assert_uint_ge(reads, 6);
        char fault[64];
        snprintf(fault, sizeof(fault), "read@%llu=eio", (unsigned long long)(opened + reads / 2));
        cache(&w, false);
        quiet(fault, "shard-");
        th_assert_rc(rk_reader_open(&r, w.top, 3), 0);
        memset(g.mem, 0xA5, g.size);
        th_assert_rc(reader_batch(r, &g, &w, flags, -1, NULL), -EIO);
        ck_assert_msg(strstr(rk_last_error(), "reading tensor '"), "%s", rk_last_error());
        ck_assert_uint_eq(rk__fault_count(RK_FAULT_OP_READ), opened + reads / 2 + 1); /* it stopped there */
        quiet(NULL, NULL);
        th_assert_rc(reader_batch(r, &g, &w, flags, -1, NULL), 0);
        region_check(&g, &w);
        rk_reader_close(&r);
    }
    free(g.mem);
    files_free(&w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("read");
    TCase *tc = tcase_create("batch");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cold_batch_straight_queue_across_tensors);
    tcase_add_test(tc, warm_batch_buffered_and_bounce);
    tcase_add_loop_test(tc, fault_in_the_middle_of_each_way, 0, (int)RK_ARRAY_LEN(mid));
    tcase_add_test(tc, sharded_rows_cold_straight);
    tcase_add_test(tc, sharded_rows_fault_at_each_read);
    tcase_add_test(tc, damaged_byte_in_the_middle_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("resume");
    tcase_set_timeout(tc, 180);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, resume_fault_and_damage_leave_buffers);
    tcase_add_test(tc, resume_inplace_fault_at_each_read);
    suite_add_tcase(s, tc);
    tc = tcase_create("reader");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, reader_read_many_shared_corrupt_fault);
    suite_add_tcase(s, tc);
    return th_main(s);
}
