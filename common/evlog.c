/*
 * common/evlog.c - the event log of contract section 5.
 *
 * One JSON object per line, appended to PATH.<rank at start>. A line is formatted whole
 * into a local buffer, then written with one write(2) to an O_APPEND descriptor while
 * holding the handle's mutex: threads of a worker never interleave, and O_APPEND keeps
 * lines whole even if several processes were pointed at the same file.
 * Event logging never fails the caller's operation: a write error is logged once and
 * counted, the operation goes on.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

struct rk__evlog {
    atomic_int refs; /* rk__evlog_ref; the last rk__evlog_close closes */
    int fd;
    int rank;
    int write_errors;
    pthread_mutex_t mu;
};

int rk__evlog_open(rk__evlog **ev, const char *path, int rank)
{
    *ev = NULL;
    if (!path || !*path)
        return 0;
    char full[4096];
    int n = snprintf(full, sizeof(full), "%s.%d", path, rank);
    if (n < 0 || (size_t)n >= sizeof(full))
        return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, -ENAMETOOLONG, "RK_EVENT_LOG='%s': path too long", path);
    rk__evlog *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->fd = open(full, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (e->fd < 0) {
        int err = -errno;
        free(e);
        return rk__fail(RK_SUB_COMMON, RK_LOG_ERROR, err, "event log %s: cannot open", full);
    }
    e->rank = rank;
    atomic_init(&e->refs, 1);
    pthread_mutex_init(&e->mu, NULL);
    *ev = e;
    return 0;
}

rk__evlog *rk__evlog_ref(rk__evlog *ev)
{
    if (ev)
        atomic_fetch_add(&ev->refs, 1);
    return ev;
}

void rk__evlog_close(rk__evlog **ev)
{
    if (!ev || !*ev)
        return;
    if (atomic_fetch_sub(&(*ev)->refs, 1) != 1) {
        *ev = NULL;
        return;
    }
    close((*ev)->fd);
    pthread_mutex_destroy(&(*ev)->mu);
    free(*ev);
    *ev = NULL;
}

/* Appends s to buf as a JSON string (with quotes). Returns the new length or -ENOSPC. */
static int put_json_string(char *buf, size_t cap, size_t len, const char *s)
{
    if (!s)
        s = "";
    if (len + 1 >= cap)
        return -ENOSPC;
    buf[len++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        const char *out = esc;
        size_t k;
        switch (*p) {
        case '"': out = "\\\""; break;
        case '\\': out = "\\\\"; break;
        case '\n': out = "\\n"; break;
        case '\r': out = "\\r"; break;
        case '\t': out = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", *p);
            } else {
                esc[0] = (char)*p;
                esc[1] = '\0';
            }
        }
        k = strlen(out);
        if (len + k + 1 >= cap)
            return -ENOSPC;
        memcpy(buf + len, out, k);
        len += k;
    }
    buf[len++] = '"';
    return (int)len;
}

#define APPENDF(...)                                                                       \
    do {                                                                                   \
        int m_ = snprintf(buf + len, cap - len, __VA_ARGS__);                              \
        if (m_ < 0 || (size_t)m_ >= cap - len)                                             \
            return -ENOSPC;                                                                \
        len += (size_t)m_;                                                                 \
    } while (0)

int rk__evlog_format(char *buf, size_t cap, int64_t t_ns, int rank, const char *name,
                     const rk__evfield *fields, size_t n)
{
    size_t len = 0;
    int r;
    APPENDF("{\"t_ns\": %" PRId64 ", \"rank\": %d, \"event\": ", t_ns, rank);
    if ((r = put_json_string(buf, cap, len, name)) < 0)
        return r;
    len = (size_t)r;
    for (size_t i = 0; i < n; i++) {
        const rk__evfield *f = &fields[i];
        APPENDF(", ");
        if ((r = put_json_string(buf, cap, len, f->key)) < 0)
            return r;
        len = (size_t)r;
        APPENDF(": ");
        switch (f->type) {
        case 'i':
            APPENDF("%" PRId64, f->v.i);
            break;
        case 'd':
            if (isfinite(f->v.d))
                APPENDF("%.9g", f->v.d);
            else
                APPENDF("null");
            break;
        case 'b':
            APPENDF("%s", f->v.b ? "true" : "false");
            break;
        case 'r':
            APPENDF("%s", f->v.s ? f->v.s : "null");
            break;
        case 's':
        default:
            if ((r = put_json_string(buf, cap, len, f->v.s)) < 0)
                return r;
            len = (size_t)r;
            break;
        }
    }
    APPENDF("}\n");
    return (int)len;
}

int rk__evlog_emit(rk__evlog *ev, const char *name, const rk__evfield *fields, size_t n)
{
    if (!ev)
        return 0;
    char buf[4096];
    int len = rk__evlog_format(buf, sizeof(buf), rk__real_ns(), ev->rank, name, fields, n);
    if (len < 0) {
        RK_LOG_WARN(RK_SUB_COMMON, "event '%s' too large for one line: dropped", name);
        return len;
    }
    int rc = 0;
    pthread_mutex_lock(&ev->mu);
    for (size_t off = 0; off < (size_t)len;) {
        ssize_t w = write(ev->fd, buf + off, (size_t)len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            if (ev->write_errors++ == 0)
                RK_LOG_ERR(RK_SUB_COMMON, "event log write failed: %s (further failures not shown)",
                           rk_strerror(rc));
            break;
        }
        off += (size_t)w;
    }
    pthread_mutex_unlock(&ev->mu);
    return rc;
}
