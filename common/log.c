/*
 * common/log.c - the one logging module (STYLE.md convention 10).
 *
 * RK_LOG=error|warn|info|debug sets the threshold (default warn: the library is silent on
 * success). RK_LOG_SUBSYS=det,ring,... limits output to those subsystems (default all;
 * errors are always shown). Both are read once, at first use, like NCCL_DEBUG: they are
 * process-wide settings of the environment, which is why this module alone keeps its
 * state in statics (atomics, so any thread may log).
 *
 * Each line is "[rekindle r<rank> <host> +<s.mmm>s LEVEL sub] message\n", built whole
 * and written to stderr with one write(2), so lines never interleave.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const subsys_names[RK_SUB_COUNT] = {
    "common", "fmt", "ckpt", "det", "ring", "rec", "tool", "chaos",
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int threshold = RK_LOG_WARN;
static atomic_uint subsys_mask = ~0u;
static atomic_int log_rank = -1;
static int64_t start_ns;
static char host[64] = "?";

const char *rk__log_level_name(int level)
{
    return level >= 0 && level < (int)RK_ARRAY_LEN(level_names) ? level_names[level] : NULL;
}

const char *rk__log_subsys_name(int sub)
{
    return sub >= 0 && sub < RK_SUB_COUNT ? subsys_names[sub] : NULL;
}

static int parse_level(const char *s, int *out)
{
    for (int i = 0; i < (int)RK_ARRAY_LEN(level_names); i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return RK_E_OPTION;
}

static int parse_subsys(const char *s, unsigned *out)
{
    unsigned mask = 0;
    int rc = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcasecmp(tok, "all") == 0) {
            mask = ~0u;
            continue;
        }
        int found = 0;
        for (int i = 0; i < RK_SUB_COUNT; i++) {
            if (strcasecmp(tok, subsys_names[i]) == 0) {
                mask |= 1u << i;
                found = 1;
            }
        }
        if (!found)
            rc = RK_E_OPTION;
    }
    *out = mask ? mask : ~0u;
    return rc;
}

static int load_env(void)
{
    int rc = 0, level = RK_LOG_WARN;
    unsigned mask = ~0u;
    const char *lv = getenv("RK_LOG");
    const char *ss = getenv("RK_LOG_SUBSYS");
    if (lv && *lv && parse_level(lv, &level) != 0) {
        level = RK_LOG_WARN;
        rc = RK_E_OPTION;
        fprintf(stderr, "[rekindle] RK_LOG='%s': not one of error, warn, info, debug; using warn\n", lv);
    }
    if (ss && *ss && parse_subsys(ss, &mask) != 0) {
        rc = RK_E_OPTION;
        fprintf(stderr, "[rekindle] RK_LOG_SUBSYS='%s': unknown subsystem ignored "
                        "(known: all,common,fmt,ckpt,det,ring,rec,tool,chaos)\n", ss);
    }
    atomic_store(&threshold, level);
    atomic_store(&subsys_mask, mask);
    return rc;
}

static void init_once(void)
{
    start_ns = rk__mono_ns();
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot)
        *dot = '\0';
    load_env();
}

int rk__log_reload(void)
{
    pthread_once(&once, init_once);
    return load_env();
}

void rk__log_set_rank(int rank)
{
    atomic_store(&log_rank, rank);
}

bool rk__log_enabled(int sub, int level)
{
    pthread_once(&once, init_once);
    if (level > atomic_load_explicit(&threshold, memory_order_relaxed))
        return false;
    if (level == RK_LOG_ERROR)
        return true;
    unsigned mask = atomic_load_explicit(&subsys_mask, memory_order_relaxed);
    return sub >= 0 && sub < RK_SUB_COUNT && (mask & (1u << sub));
}

void rk__log_vwrite(int sub, int level, const char *fmt, va_list ap)
{
    pthread_once(&once, init_once);
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    double secs = (double)(rk__mono_ns() - start_ns) / 1e9;
    int rank = atomic_load(&log_rank);
    char rbuf[16];
    if (rank >= 0)
        snprintf(rbuf, sizeof(rbuf), "r%d", rank);
    else
        snprintf(rbuf, sizeof(rbuf), "r-");
    const char *sname = rk__log_subsys_name(sub);
    const char *tag = level >= 0 && level < 4 ? tags[level] : "?";
    int n = snprintf(line, sizeof(line), "[rekindle %s %s +%.3fs %s %s] ", rbuf, host, secs, tag,
                     sname ? sname : "?");
    if (n < 0)
        return;
    if ((size_t)n < sizeof(line)) {
        int m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        if (m > 0)
            n += m;
    }
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2; /* truncated: keep the newline */
    line[n++] = '\n';
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = write(STDERR_FILENO, line + off, (size_t)n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
}

void rk__log_write(int sub, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rk__log_vwrite(sub, level, fmt, ap);
    va_end(ap);
}
