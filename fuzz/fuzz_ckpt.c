/*
 * fuzz/fuzz_ckpt.c - libFuzzer target: opening a checkpoint (fmt_ckpt_open, the one
 * opener that rk_resume, restore and every CLI command use) over arbitrary files, then
 * fmt_index_info (the order of a directory), reading every tensor back, and reading row
 * ranges of every sharded tensor (fmt_ckpt_read_rows, as a restore into another world
 * size or a rollback from disk after a shrink does: blocks read in part).
 *
 * Input: one flags byte, then operations, each [op u8][len u32 LE][payload]: op & 7 names
 * the file (0 index.h5, 1 commit.ok, 2 shard-0.ok, 3 shard-0.h5, 4 shard-1.ok,
 * 5 shard-1.h5, 6 shard-2.ok, 7 shard-2.h5) and the payload is appended to it; with op & 8
 * `len` zero bytes are appended instead (no payload), which keeps the 1 MiB metadata
 * blocks of real shard files small in the corpus; op & 16 (no payload) is a row range to
 * read instead, first = len & 0xffff and count = len >> 16, each taken modulo what the
 * tensor has; without one, the range is rows [1 + (flags >> 1 & 7), rows - 1 - (flags >> 4
 * & 7)), which cuts a block at both ends in the seeds as they are. The files go into a
 * fresh step directory. Flags bit 0: the harness first makes the text files' own
 * checksums right (each manifest's and the record's `end` line, the record's lines for
 * the manifests and for the shard files), so the checks behind them are reached too. It
 * never touches the record's line for index.h5: libhdf5 must only ever see an index.h5
 * whose checksum matched what was committed, and a finding there is a bug of that rule.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../formats/fmt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NFILES 8
#define NRANGES 8
#define BUF_MAX (1u << 20) /* the most bytes read into buf at once */
#define FILE_MAX (4u << 20)
#define TEXT_MAX (256u << 10) /* real manifests of the seeds are under 2 KiB */

static const char *const names[NFILES] = {"index.h5",   "commit.ok",  "shard-0.ok", "shard-0.h5",
                                          "shard-1.ok", "shard-1.h5", "shard-2.ok", "shard-2.h5"};

/* A file being made: the text files (commit.ok, manifests) in memory, for the fix-ups,
   written at the end; the others straight to disk, runs of zeros as holes. */
struct file {
    char *p;
    size_t len, cap;
    int fd;
    bool present;
};

static char dir[256];

static bool is_text(int i)
{
    return i == 1 || (i >= 2 && i % 2 == 0);
}

static void path_of(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "%s/%s", dir, names[i]);
}

static void append(struct file *f, int i, const void *src, size_t n)
{
    if (!f->present) {
        char path[512];
        path_of(path, sizeof(path), i);
        f->present = true;
        f->fd = is_text(i) ? -1 : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    size_t max = f->fd >= 0 ? FILE_MAX : TEXT_MAX;
    if (f->len + n > max)
        n = f->len < max ? max - f->len : 0;
    if (!n)
        return;
    if (f->fd >= 0) {
        if (src && pwrite(f->fd, src, n, (off_t)f->len) != (ssize_t)n)
            abort();
        f->len += n;
        if (!src && ftruncate(f->fd, (off_t)f->len) != 0)
            abort();
        return;
    }
    if (f->len + n > f->cap) {
        size_t cap = (f->len + n) * 2;
        if (!(f->p = realloc(f->p, cap)))
            abort();
        f->cap = cap;
    }
    if (src)
        memcpy(f->p + f->len, src, n);
    else
        memset(f->p + f->len, 0, n);
    f->len += n;
}

static void put(int i, const char *p, size_t len)
{
    char path[512];
    path_of(path, sizeof(path), i);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || (len && write(fd, p, len) != (ssize_t)len))
        abort();
    close(fd);
}

/* The file's last line replaced by "end <XXH3-64 of everything before it>". */
static void fix_end(struct file *f)
{
    size_t body = f->len;
    if (body && f->p[body - 1] == '\n') {
        size_t s = body - 1;
        while (s > 0 && f->p[s - 1] != '\n')
            s--;
        if (body - s >= 4 && memcmp(f->p + s, "end ", 4) == 0)
            body = s;
    }
    char line[32];
    int n = snprintf(line, sizeof(line), "end %016" PRIx64 "\n", fmt_xxh3(f->p, body));
    f->len = body;
    append(f, 1, line, (size_t)n);
}

/* The record's `file` lines of the manifests and shard files made to match them. */
static void fix_record(struct file *rec, struct file *files)
{
    struct file out = {0};
    size_t at = 0;
    while (at < rec->len) {
        char *nl = memchr(rec->p + at, '\n', rec->len - at);
        size_t end = nl ? (size_t)(nl - rec->p) + 1 : rec->len;
        char line[512];
        size_t ll = end - at < sizeof(line) - 1 ? end - at : sizeof(line) - 1;
        memcpy(line, rec->p + at, ll);
        line[ll] = '\0';
        int r = -1;
        char kind[4] = "";
        const char *last = strrchr(line, ' ');
        if (strncmp(line, "file ", 5) == 0 && last && sscanf(last, " shard-%d.%2s", &r, kind) == 2 && r >= 0 && r < 3) {
            fmt_file_sum s = {0, 0};
            struct file *ok = &files[2 + 2 * r];
            if (strcmp(kind, "ok") == 0) {
                s.size = ok->len;
                s.xxh3 = fmt_xxh3(ok->p, ok->len);
            } else if (ok->present && ok->len) {
                char *copy = malloc(ok->len + 1), path[512];
                fmt_manifest *m = NULL;
                memcpy(copy, ok->p, ok->len);
                snprintf(path, sizeof(path), "%s/shard-%d.h5", dir, r);
                if (fmt_manifest_parse(path, copy, ok->len, &m) == 0)
                    fmt_file_sum_of(path, m, &s);
                fmt_manifest_free(&m);
                free(copy);
            }
            ll = (size_t)snprintf(line, sizeof(line), "file %" PRIu64 " %016" PRIx64 " shard-%d.%s\n", s.size, s.xxh3, r,
                                  kind);
        }
        append(&out, 1, line, ll);
        at = end;
    }
    free(rec->p);
    *rec = out;
}

/* Rows [first, first + count) of each sharded tensor of c, for each range (first, count)
   of r[0..n) (taken modulo the tensor's rows; n == 0: the one from the flags), at most
   BUF_MAX bytes of them. */
static void read_ranges(fmt_ckpt *c, const uint32_t *r, size_t n, unsigned flags, char *buf)
{
    for (size_t i = 0; i < c->n; i++) {
        const fmt_tensor *t = &c->t[i];
        if (t->kind != FMT_SHARDED)
            continue;
        uint64_t rows = (uint64_t)t->rows, rb = rows ? t->nbytes / rows : 0;
        for (size_t k = 0; k < (n ? n : 1); k++) {
            uint64_t first, count;
            if (n) {
                first = (r[k] & 0xffff) % (rows + 1);
                count = (r[k] >> 16) % (rows - first + 1);
            } else {
                uint64_t skip = 1 + (flags >> 1 & 7), cut = 1 + (flags >> 4 & 7);
                first = skip < rows ? skip : rows;
                count = rows > first + cut ? rows - first - cut : 0;
            }
            if (rb && count > BUF_MAX / rb)
                count = BUF_MAX / rb;
            fmt_ckpt_read_rows(c, i, (int64_t)first, (int64_t)count, buf);
        }
    }
}

/* The process's scratch directory goes when it ends (a crash leaves it, with the finding). */
static void remove_dir(void)
{
    char top[256];
    snprintf(top, sizeof(top), "%.*s", (int)(strrchr(dir, '/') - dir), dir);
    fmt_remove_tree(top);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char *buf;
    if (!dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof(dir), "%s/rk-fuzz-ckpt-%d", base, (int)getpid());
        mkdir(dir, 0755);
        strcat(dir, "/step-000000000006");
        mkdir(dir, 0755);
        atexit(remove_dir);
        if (!(buf = malloc(BUF_MAX)))
            abort();
    }
    if (size < 1)
        return 0;
    unsigned flags = data[0];
    bool fix = flags & 1;
    uint32_t ranges[NRANGES];
    size_t nranges = 0;
    data++, size--;
    struct file f[NFILES];
    memset(f, 0, sizeof(f));
    for (int i = 0; i < NFILES; i++) {
        char path[512];
        path_of(path, sizeof(path), i);
        unlink(path);
    }
    while (size >= 5) {
        unsigned op = data[0];
        size_t n = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 | (size_t)data[4] << 24;
        data += 5, size -= 5;
        if (op & 16) {
            if (nranges < NRANGES)
                ranges[nranges++] = (uint32_t)n;
            continue;
        }
        if (op & 8) {
            append(&f[op & 7], op & 7, NULL, n < FILE_MAX ? n : FILE_MAX);
            continue;
        }
        if (n > size)
            n = size;
        append(&f[op & 7], op & 7, data, n);
        data += n, size -= n;
    }
    for (int i = 0; i < NFILES; i++) {
        if (f[i].fd > 0)
            close(f[i].fd);
        if (f[i].present && is_text(i))
            put(i, f[i].p, f[i].len);
    }
    if (fix) {
        for (int i = 2; i < NFILES; i += 2)
            if (f[i].present) {
                fix_end(&f[i]);
                put(i, f[i].p, f[i].len);
            }
        if (f[1].present) {
            fix_record(&f[1], f);
            fix_end(&f[1]);
            put(1, f[1].p, f[1].len);
        }
    }
    int64_t step, commit_ns;
    fmt_index_info(dir, &step, &commit_ns);
    fmt_ckpt *c = NULL;
    if (fmt_ckpt_open(dir, &c) == 0) {
        for (size_t i = 0; i < c->n; i++) {
            if (fmt_ckpt_find(c, c->t[i].name) != (long)i)
                abort(); /* names are unique: each finds itself */
            if (c->t[i].nbytes <= BUF_MAX)
                fmt_ckpt_read(c, i, buf);
        }
        read_ranges(c, ranges, nranges, flags, buf);
        fmt_ckpt_close(&c);
    }
    for (int i = 0; i < NFILES; i++)
        free(f[i].p);
    return 0;
}
