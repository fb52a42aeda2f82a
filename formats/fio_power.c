/*
 * formats/fio_power.c - the power-loss model of the fault injector (fio.h): what a disk
 * holds after the power goes, given what was made durable. Active only in processes with
 * RK_FAULT_POWER=DIR; every hook is a no-op without it.
 *
 * DIR/journal, appended to by every process of the job with one write(2) per record
 * (O_APPEND: records of different processes never interleave), in the order they happened:
 *   F <ino> <copy>            a file was fsync'd: its bytes then are in DIR/<copy>
 *   D <ino> <n>               a directory was fsync'd: its n entries then follow, one per line
 *   e <type> <ino> <name>       (type: d directory, f regular file)
 *   G <ino>                   this inode is being removed (the number may be reused)
 *   X                         the power went (RK_FAULT_POWER); later records never happened
 * DIR/lost exists once the power went: every process that reaches its next file operation
 * SIGKILLs itself there, so nothing after the cut is done by anyone.
 *
 * Replaying the journal, an inode is (number, generation): G starts a new generation, so a
 * number reused by a new file never gets an old file's bytes or entries.
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fio.h"
#include "fmt.h"

#define PW_PATH 4352

static atomic_uint_fast64_t pw_seq;

static const char *pw_dir(void)
{
    const char *d = getenv("RK_FAULT_POWER");
    return d && *d ? d : NULL;
}

/* One record, in one write(2). */
static void pw_append(const char *dir, const char *rec, size_t len)
{
    char path[PW_PATH];
    snprintf(path, sizeof(path), "%s/journal", dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, rec, len);
    (void)w;
    close(fd);
}

static int copy_fd(int in, int out)
{
    char buf[1 << 16];
    for (;;) {
        ssize_t r = read(in, buf, sizeof(buf));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : 0;
        for (ssize_t done = 0; done < r;) {
            ssize_t w = write(out, buf + done, (size_t)(r - done));
            if (w < 0 && errno != EINTR)
                return -errno;
            done += w > 0 ? w : 0;
        }
    }
}

/* A copy of file `from` at new file `to` (mode 0644). */
static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        int rc = -errno;
        close(in);
        return rc;
    }
    int rc = copy_fd(in, out);
    close(in);
    close(out);
    return rc;
}

static void record_file(const char *dir, const struct stat *sb, const char *path)
{
    char copy[64], dst[PW_PATH], rec[128];
    snprintf(copy, sizeof(copy), "data-%d-%" PRIu64, (int)getpid(), (uint64_t)atomic_fetch_add(&pw_seq, 1));
    snprintf(dst, sizeof(dst), "%s/%s", dir, copy);
    if (copy_file(path, dst) != 0)
        return;
    int n = snprintf(rec, sizeof(rec), "F %" PRIu64 " %s\n", (uint64_t)sb->st_ino, copy);
    pw_append(dir, rec, (size_t)n);
}

void fio_power_synced(int fd, const char *path)
{
    const char *dir = pw_dir();
    struct stat sb;
    if (dir && path && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        record_file(dir, &sb, path);
}

struct pw_buf {
    char *p;
    size_t len, cap;
};

static void buf_add(struct pw_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = 2 * b->cap + n + 256;
        char *q = realloc(b->p, cap);
        if (!q)
            return;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void fio_power_synced_dir(const char *path)
{
    const char *dir = pw_dir();
    if (!dir)
        return;
    DIR *d = opendir(path);
    if (!d)
        return;
    struct stat sb;
    struct pw_buf body = {0};
    char line[512];
    size_t n = 0;
    for (struct dirent *e; fstat(dirfd(d), &sb) == 0 && (e = readdir(d)) != NULL;) {
        struct stat es;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            fstatat(dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0 || !(S_ISDIR(es.st_mode) || S_ISREG(es.st_mode)))
            continue;
        int k = snprintf(line, sizeof(line), "e %c %" PRIu64 " %s\n", S_ISDIR(es.st_mode) ? 'd' : 'f',
                         (uint64_t)es.st_ino, e->d_name);
        buf_add(&body, line, (size_t)k);
        n++;
    }
    int k = snprintf(line, sizeof(line), "D %" PRIu64 " %zu\n", (uint64_t)sb.st_ino, n);
    struct pw_buf rec = {0};
    buf_add(&rec, line, (size_t)k);
    if (body.len)
        buf_add(&rec, body.p, body.len);
    if (rec.p)
        pw_append(dir, rec.p, rec.len);
    free(rec.p);
    free(body.p);
    closedir(d);
}

void fio_power_removing(const char *path)
{
    const char *dir = pw_dir();
    struct stat sb;
    char rec[64];
    if (!dir || lstat(path, &sb) != 0)
        return;
    int n = snprintf(rec, sizeof(rec), "G %" PRIu64 "\n", (uint64_t)sb.st_ino);
    pw_append(dir, rec, (size_t)n);
}

void fio_power_check(void)
{
    const char *dir = pw_dir();
    char path[PW_PATH];
    if (!dir)
        return;
    snprintf(path, sizeof(path), "%s/lost", dir);
    if (access(path, F_OK) == 0)
        raise(SIGKILL);
}

void fio_power_cut(void)
{
    const char *dir = pw_dir();
    char path[PW_PATH];
    if (!dir)
        return;
    pw_append(dir, "X\n", 2);
    snprintf(path, sizeof(path), "%s/lost", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
}

/* ---- the baseline: a tree at rest ---------------------------------------------------- */

static const char *base_log;

static int base_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type == FTW_F && S_ISREG(sb->st_mode))
        record_file(base_log, sb, path);
    else if (type == FTW_D)
        fio_power_synced_dir(path);
    return 0;
}

int fmt_power_baseline(const char *root, const char *logdir)
{
    /* fio_power_synced_dir reads RK_FAULT_POWER: this process must name the same DIR. */
    const char *env = pw_dir();
    if (!env || strcmp(env, logdir) != 0)
        setenv("RK_FAULT_POWER", logdir, 1);
    base_log = logdir;
    int rc = nftw(root, base_one, 16, FTW_PHYS) == 0 ? 0 : -EIO;
    if (!env)
        unsetenv("RK_FAULT_POWER");
    else if (strcmp(env, logdir) != 0)
        setenv("RK_FAULT_POWER", env, 1);
    return rc;
}

/* ---- replay ---------------------------------------------------------------------------- */

struct pw_ent {
    char type;
    uint64_t ino, gen;
    char *name;
};

struct pw_node { /* one (inode, generation): its last durable bytes or entries */
    uint64_t ino, gen;
    char *copy;          /* files: DIR/<copy>, NULL if never fsync'd */
    bool listed;         /* directories: ent[] is durable */
    struct pw_ent *ent;
    size_t n;
};

struct pw_state {
    struct pw_node *node;
    size_t n, cap;
    struct { uint64_t ino, gen; } *gen;
    size_t ngen, gencap;
};

static uint64_t *gen_of(struct pw_state *s, uint64_t ino)
{
    for (size_t i = 0; i < s->ngen; i++)
        if (s->gen[i].ino == ino)
            return &s->gen[i].gen;
    if (s->ngen == s->gencap) {
        size_t cap = 2 * s->gencap + 64;
        void *q = realloc(s->gen, cap * sizeof(*s->gen));
        if (!q)
            return NULL;
        s->gen = q;
        s->gencap = cap;
    }
    s->gen[s->ngen].ino = ino;
    s->gen[s->ngen].gen = 0;
    return &s->gen[s->ngen++].gen;
}

static struct pw_node *node_of(struct pw_state *s, uint64_t ino, uint64_t gen, bool create)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->node[i].ino == ino && s->node[i].gen == gen)
            return &s->node[i];
    if (!create)
        return NULL;
    if (s->n == s->cap) {
        size_t cap = 2 * s->cap + 64;
        void *q = realloc(s->node, cap * sizeof(*s->node));
        if (!q)
            return NULL;
        s->node = q;
        s->cap = cap;
    }
    memset(&s->node[s->n], 0, sizeof(s->node[0]));
    s->node[s->n].ino = ino;
    s->node[s->n].gen = gen;
    return &s->node[s->n++];
}

static void node_clear_entries(struct pw_node *nd)
{
    for (size_t i = 0; i < nd->n; i++)
        free(nd->ent[i].name);
    free(nd->ent);
    nd->ent = NULL;
    nd->n = 0;
}

static void state_free(struct pw_state *s)
{
    for (size_t i = 0; i < s->n; i++) {
        node_clear_entries(&s->node[i]);
        free(s->node[i].copy);
    }
    free(s->node);
    free(s->gen);
}

/* Reads logdir/journal up to the cut into s. */
static int replay(const char *logdir, struct pw_state *s)
{
    char path[PW_PATH];
    snprintf(path, sizeof(path), "%s/journal", logdir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    struct pw_node *dir = NULL; /* the D record whose entries follow */
    size_t left = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) > 0) {
        line[strcspn(line, "\n")] = '\0';
        uint64_t ino = 0;
        char *end = NULL;
        if (line[0] == 'X')
            break;
        if (line[0] == 'e' && left > 0 && line[1] == ' ' && line[2] && line[3] == ' ') {
            ino = strtoull(line + 4, &end, 10);
            uint64_t *g = gen_of(s, ino);
            struct pw_ent *q = realloc(dir->ent, (dir->n + 1) * sizeof(*q));
            if (!g || !q || *end != ' ') {
                rc = g && q ? -EINVAL : -ENOMEM;
                if (q)
                    dir->ent = q;
                break;
            }
            dir->ent = q;
            q[dir->n].type = line[2];
            q[dir->n].ino = ino;
            q[dir->n].gen = *g;
            q[dir->n].name = strdup(end + 1);
            dir->n++;
            left--;
            continue;
        }
        if (left > 0 || strlen(line) < 3 || line[1] != ' ') {
            rc = -EINVAL;
            break;
        }
        ino = strtoull(line + 2, &end, 10);
        uint64_t *g = gen_of(s, ino);
        if (!g) {
            rc = -ENOMEM;
            break;
        }
        if (line[0] == 'G') {
            (*g)++;
        } else if (line[0] == 'F' && *end == ' ') {
            struct pw_node *nd = node_of(s, ino, *g, true);
            if (!nd) {
                rc = -ENOMEM;
                break;
            }
            free(nd->copy);
            nd->copy = strdup(end + 1);
        } else if (line[0] == 'D' && *end == ' ') {
            dir = node_of(s, ino, *g, true);
            if (!dir) {
                rc = -ENOMEM;
                break;
            }
            node_clear_entries(dir);
            dir->listed = true;
            left = strtoull(end + 1, NULL, 10);
        } else {
            rc = -EINVAL;
        }
    }
    free(line);
    fclose(f);
    return rc;
}

/* The bytes of file (ino, gen) per the journal at path (a new file, or truncated). */
static int put_file(const char *logdir, struct pw_state *s, uint64_t ino, uint64_t gen, const char *path)
{
    struct pw_node *nd = node_of(s, ino, gen, false);
    char src[PW_PATH];
    if (nd && nd->copy) {
        snprintf(src, sizeof(src), "%s/%s", logdir, nd->copy);
        return copy_file(src, path);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}

static int build(const char *logdir, struct pw_state *s, uint64_t ino, uint64_t gen, const char *out, int depth)
{
    struct pw_node *nd = node_of(s, ino, gen, false);
    if (!nd || !nd->listed || depth > 64)
        return 0; /* never fsync'd: a directory with no durable entries */
    for (size_t i = 0; i < nd->n; i++) {
        char path[PW_PATH];
        const struct pw_ent *e = &nd->ent[i];
        snprintf(path, sizeof(path), "%s/%s", out, e->name);
        int rc = e->type == 'd' ? (mkdir(path, 0755) == 0 ? 0 : -errno) : put_file(logdir, s, e->ino, e->gen, path);
        if (rc == 0 && e->type == 'd')
            rc = build(logdir, s, e->ino, e->gen, path, depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

int fmt_power_rebuild(const char *root, const char *logdir, const char *out)
{
    struct pw_state s = {0};
    struct stat sb;
    if (stat(root, &sb) != 0)
        return -errno;
    int rc = replay(logdir, &s);
    if (!rc && mkdir(out, 0755) != 0)
        rc = -errno;
    uint64_t *g = rc ? NULL : gen_of(&s, sb.st_ino);
    if (!rc)
        rc = g ? build(logdir, &s, sb.st_ino, *g, out, 0) : -ENOMEM;
    state_free(&s);
    return rc;
}

static struct pw_state *drop_state;
static const char *drop_log;

static int drop_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !S_ISREG(sb->st_mode))
        return 0;
    uint64_t *g = gen_of(drop_state, sb->st_ino);
    return g && put_file(drop_log, drop_state, sb->st_ino, *g, path) == 0 ? 0 : -1;
}

int fmt_power_drop_data(const char *root, const char *logdir)
{
    struct pw_state s = {0};
    int rc = replay(logdir, &s);
    if (!rc) {
        drop_state = &s;
        drop_log = logdir;
        rc = nftw(root, drop_one, 16, FTW_PHYS) == 0 ? 0 : -EIO;
    }
    state_free(&s);
    return rc;
}
