/*
 * tools/cmd_ckpt.c - the checkpoint subcommands of `rekindle` (contract section 4):
 *   ls DIR [--json]            verify DIR [--step S | --all]      inspect DIR [--step S]
 *   restore DIR [--step S] --out FILE.h5                          gc DIR --keep K
 * Exit status: 0 success, 1 the checked thing is bad, 2 usage or environment error.
 */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../formats/fmt.h"
#include "tools.h"

struct args {
    const char *dir, *out;
    int64_t step; /* -1: default */
    long keep;    /* -1: not given */
    bool all, json;
};

/* Whether opt is one of the space-separated words of allowed. */
static bool opt_allowed(const char *allowed, const char *opt)
{
    size_t n = strlen(opt);
    for (const char *p = strstr(allowed, opt); p; p = strstr(p + 1, opt))
        if ((p == allowed || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static int parse(int argc, char **argv, const char *usage, const char *allowed, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->step = -1;
    a->keep = -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            printf("usage: rekindle %s\n", usage);
            return TOOL_OK + 100;
        }
        bool has_val = strcmp(s, "--step") == 0 || strcmp(s, "--out") == 0 || strcmp(s, "--keep") == 0;
        if (s[0] == '-' && (!opt_allowed(allowed, s) || (has_val && i + 1 >= argc)))
            return tool_error(TOOL_USAGE, "%s: bad option '%s' (usage: rekindle %s)", argv[0], s, usage);
        long v;
        const char *why;
        if (strcmp(s, "--step") == 0 || strcmp(s, "--keep") == 0) {
            if (rk__parse_int(argv[++i], strcmp(s, "--keep") == 0 ? 1 : 0, 999999999999L, &v, &why) != 0)
                return tool_error(TOOL_USAGE, "%s: %s '%s': %s", argv[0], s, argv[i], why);
            if (s[2] == 's')
                a->step = v;
            else
                a->keep = v;
        } else if (strcmp(s, "--out") == 0) {
            a->out = argv[++i];
        } else if (strcmp(s, "--all") == 0) {
            a->all = true;
        } else if (strcmp(s, "--json") == 0) {
            a->json = true;
        } else if (!a->dir) {
            a->dir = s;
        } else {
            return tool_error(TOOL_USAGE, "%s: unexpected argument '%s' (usage: rekindle %s)", argv[0], s, usage);
        }
    }
    struct stat sb;
    if (!a->dir)
        return tool_error(TOOL_USAGE, "%s: no directory given (usage: rekindle %s)", argv[0], usage);
    if (stat(a->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return tool_error(TOOL_USAGE, "%s: %s: %s", argv[0], a->dir, errno ? strerror(errno) : "not a directory");
    return 0;
}

#define PARSE(usage, allowed)                                                               \
    struct args a;                                                                         \
    int prc_ = parse(argc, argv, usage, allowed, &a);                                      \
    if (prc_)                                                                              \
        return prc_ == TOOL_OK + 100 ? TOOL_OK : prc_;

static void step_path(char *buf, size_t cap, const char *dir, int64_t step)
{
    char name[64];
    fmt_step_name(name, sizeof(name), step);
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* The step to work on: --step S (must exist), else the newest committed (the one a job
   would resume from first: ckpt_list's order). -1: reported. */
static int64_t pick_step(const char *cmd, const struct args *a)
{
    char p[4200];
    struct stat sb;
    if (a->step >= 0) {
        step_path(p, sizeof(p), a->dir, a->step);
        if (stat(p, &sb) != 0) {
            tool_error(TOOL_USAGE, "%s: no committed checkpoint of step %" PRId64 " in %s", cmd, a->step, a->dir);
            return -1;
        }
        return a->step;
    }
    int64_t s = -1;
    if (ckpt_newest_below(a->dir, INT64_MAX, &s) != 0)
        tool_error(TOOL_USAGE, "%s: %s", cmd, rk_last_error());
    else if (s < 0)
        tool_error(TOOL_USAGE, "%s: no committed checkpoint in %s", cmd, a->dir);
    return s;
}

static uint64_t total_bytes(const fmt_ckpt *c)
{
    uint64_t b = 0;
    for (size_t i = 0; i < c->n; i++)
        b += c->t[i].nbytes;
    return b;
}

/* ---- ls ------------------------------------------------------------------------------ */

/* Names of the attempts in progress (or dead) of a directory. */
struct names {
    char **v;
    size_t n;
};

static int add_tmp(void *arg, const char *name)
{
    struct names *l = arg;
    if (!fmt_is_tmp_name(name))
        return 0;
    char **q = realloc(l->v, (l->n + 1) * sizeof(*q));
    if (!q || !(q[l->n] = strdup(name))) {
        if (q)
            l->v = q;
        return -ENOMEM;
    }
    l->v = q;
    l->n++;
    return 0;
}

/* One line of ls: a committed checkpoint (e != NULL) or an attempt (name). */
static void ls_row(const struct args *a, const ckpt_entry *e, const char *name, bool *first)
{
    char p[4200], when[32] = "", step_name[64];
    int64_t step = -1;
    if (e) {
        step = e->step;
        fmt_step_name(step_name, sizeof(step_name), step);
        name = step_name;
    } else {
        fmt_parse_tmp_name(name, &step, NULL);
    }
    snprintf(p, sizeof(p), "%s/%s", a->dir, name);
    struct stat sb;
    time_t t = e && e->commit_ns > 0 ? (time_t)(e->commit_ns / 1000000000) : stat(p, &sb) == 0 ? sb.st_mtime : 0;
    if (t) {
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    }
    fmt_ckpt *c = NULL;
    const char *state = !e ? "incomplete" : (fmt_ckpt_open(p, &c) == 0 ? "committed" : "corrupt");
    const char *timeline = !e ? "-" : e->abandoned ? "abandoned" : "current";
    int world = c ? c->world : 0;
    size_t nt = c ? c->n : 0;
    uint64_t bytes = c ? total_bytes(c) : 0;
    if (a->json)
        printf("%s\n {\"step\": %" PRId64 ", \"state\": \"%s\", \"world_size\": %d, \"tensors\": %zu, \"bytes\": %" PRIu64
               ", \"time\": \"%s\", \"commit_time_ns\": %" PRId64 ", \"timeline\": \"%s\", \"path\": \"%s\"}",
               *first ? "" : ",", step, state, world, nt, bytes, when, e ? e->commit_ns : 0, timeline, name);
    else
        printf("%-14" PRId64 " %-10s %6d %8zu %12" PRIu64 "  %-19s  %s\n", step, state, world, nt, bytes, when, timeline);
    *first = false;
    fmt_ckpt_close(&c);
}

int cmd_ls(int argc, char **argv)
{
    PARSE("ls DIR [--json]", "--json")
    ckpt_entry *l = NULL;
    size_t n = 0;
    struct names tmp = {0};
    if (ckpt_list(a.dir, &l, &n) != 0 || fmt_list_dir(a.dir, add_tmp, &tmp) != 0) {
        int status = tool_error(TOOL_USAGE, "ls: %s", rk_last_error());
        free(l);
        for (size_t i = 0; i < tmp.n; i++)
            free(tmp.v[i]);
        free(tmp.v);
        return status;
    }
    bool first = true;
    if (a.json)
        printf("[");
    else
        printf("%-14s %-10s %6s %8s %12s  %-19s  %s\n", "step", "state", "world", "tensors", "bytes", "time", "timeline");
    /* Attempts first, then the committed ones, the newest (resumed from first) last. */
    for (size_t i = 0; i < tmp.n; i++) {
        ls_row(&a, NULL, tmp.v[i], &first);
        free(tmp.v[i]);
    }
    for (size_t i = n; i-- > 0;)
        ls_row(&a, &l[i], NULL, &first);
    free(tmp.v);
    free(l);
    if (a.json)
        printf("%s]\n", first ? "" : "\n");
    return TOOL_OK;
}

/* ---- verify -------------------------------------------------------------------------- */

int cmd_verify(int argc, char **argv)
{
    PARSE("verify DIR [--step S | --all]", "--step --all")
    ckpt_entry *steps = NULL;
    size_t n = 0;
    if (a.all) {
        int rc = ckpt_list(a.dir, &steps, &n);
        if (rc || n == 0) {
            free(steps);
            return rc ? tool_error(TOOL_USAGE, "verify: %s", rk_last_error())
                      : tool_error(TOOL_USAGE, "verify: no committed checkpoint in %s", a.dir);
        }
    } else {
        int64_t s = pick_step("verify", &a);
        if (s < 0)
            return TOOL_USAGE;
        steps = calloc(1, sizeof(*steps));
        if (!steps)
            return TOOL_USAGE;
        steps[n++].step = s;
    }
    int status = TOOL_OK;
    for (size_t i = 0; i < n; i++) {
        char p[4200], bad[4096];
        step_path(p, sizeof(p), a.dir, steps[i].step);
        int rc = ckpt_verify_dir(p, bad, sizeof(bad));
        if (rc == 0) {
            printf("%s: ok\n", p);
        } else {
            printf("%s: BAD (%s): %s\n", p, rk_strerror(rc), bad);
            status = TOOL_BAD;
        }
    }
    free(steps);
    return status;
}

/* ---- inspect ------------------------------------------------------------------------- */

int cmd_inspect(int argc, char **argv)
{
    PARSE("inspect DIR [--step S]", "--step")
    int64_t s = pick_step("inspect", &a);
    if (s < 0)
        return TOOL_USAGE;
    char p[4200];
    step_path(p, sizeof(p), a.dir, s);
    fmt_ckpt *c = NULL;
    int rc = fmt_ckpt_open(p, &c);
    if (rc)
        return tool_error(TOOL_BAD, "inspect: %s: %s", p, rk_last_error());
    printf("%s: step %" PRId64 ", world_size %d, format_version %d, io_path %s, %zu tensors, %" PRIu64 " bytes\n", p,
           c->step, c->world, c->version, c->io_path, c->n, total_bytes(c));
    for (size_t i = 0; i < c->n; i++) {
        const fmt_tensor *t = &c->t[i];
        char shape[200];
        size_t len = (size_t)snprintf(shape, sizeof(shape), "(");
        for (int d = 0; d < t->ndim && len < sizeof(shape); d++)
            len += (size_t)snprintf(shape + len, sizeof(shape) - len, "%s%" PRId64, d ? "," : "", t->shape[d]);
        if (len < sizeof(shape))
            snprintf(shape + len, sizeof(shape) - len, ")");
        if (t->kind == FMT_SHARDED) /* its pieces, one per shard, checksummed per block */
            printf("%s\t%s\t%s\t%" PRIu64 "\tshard-0..%d.h5 (sharded: %zu pieces)\txxh3:per-block\n", t->name,
                   rk__dtype_name(t->dtype), shape, t->nbytes, c->world - 1, t->npieces);
        else
            printf("%s\t%s\t%s\t%" PRIu64 "\tshard-%d.h5\txxh3:%016" PRIx64 "\n", t->name, rk__dtype_name(t->dtype),
                   shape, t->nbytes, t->rank, t->xxh3);
    }
    fmt_ckpt_close(&c);
    return TOOL_OK;
}

/* ---- restore ------------------------------------------------------------------------- */

static void restored(void *pr, uint64_t bytes)
{
    tool_progress_add(pr, bytes);
}

int cmd_restore(int argc, char **argv)
{
    PARSE("restore DIR [--step S] --out FILE.h5", "--step --out")
    if (!a.out)
        return tool_error(TOOL_USAGE, "restore: --out FILE.h5 is required");
    int64_t s = pick_step("restore", &a);
    if (s < 0)
        return TOOL_USAGE;
    char p[4200];
    step_path(p, sizeof(p), a.dir, s);
    fmt_ckpt *c = NULL;
    int rc = fmt_ckpt_open(p, &c);
    if (rc)
        return tool_error(TOOL_BAD, "restore: %s: %s", p, rk_last_error());
    tool_progress pr;
    tool_progress_start(&pr, "restore", total_bytes(c));
    bool bad = false;
    rc = fmt_write_flat(c, a.out, restored, &pr, &bad);
    tool_progress_done(&pr);
    int status = rc ? tool_error(bad ? TOOL_BAD : TOOL_USAGE, "restore: %s", rk_last_error()) : TOOL_OK;
    if (!rc)
        printf("restored step %" PRId64 " (%zu tensors) into %s\n", c->step, c->n, a.out);
    fmt_ckpt_close(&c);
    return status;
}

/* ---- gc ------------------------------------------------------------------------------ */

static void gc_note(void *arg, enum ckpt_retain_what what, const char *path, const char *why)
{
    int *status = arg;
    if (what == CKPT_RETAIN_REMOVED) {
        printf("removed %s\n", path);
    } else if (what == CKPT_RETAIN_UNVERIFIED) {
        printf("%s does not verify: %s\n", path, why);
    } else {
        *status = tool_error(TOOL_USAGE, "gc: %s", why);
    }
}

int cmd_gc(int argc, char **argv)
{
    PARSE("gc DIR --keep K", "--keep")
    if (a.keep < 1)
        return tool_error(TOOL_USAGE, "gc: --keep K (K >= 1) is required");
    /* The engine's retention: never the newest checkpoint that verifies. */
    int status = TOOL_OK;
    int rc = ckpt_retain(a.dir, (int)a.keep, gc_note, &status);
    if (rc && status == TOOL_OK)
        status = tool_error(TOOL_USAGE, "gc: %s", rk_last_error());
    return status;
}
