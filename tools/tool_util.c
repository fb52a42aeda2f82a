/* tools/tool_util.c - errors, progress and sizes shared by the CLI's subcommands. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "tools.h"

int tool_error(int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rekindle: %s\n", msg);
    return status;
}

void tool_progress_start(tool_progress *p, const char *what, uint64_t total)
{
    p->what = what;
    p->total = total;
    p->done = 0;
    p->start_ns = p->last_ns = rk__mono_ns();
    p->tty = isatty(STDERR_FILENO) != 0;
}

static void progress_draw(tool_progress *p, bool final)
{
    char a[32], b[32];
    double secs = (double)(rk__mono_ns() - p->start_ns) / 1e9;
    double rate = secs > 0 ? (double)p->done / secs : 0;
    fprintf(stderr, "\r%s: %s / %s (%3.0f%%, %s/s)%s", p->what, tool_human_bytes(p->done, a, sizeof(a)),
            tool_human_bytes(p->total, b, sizeof(b)),
            p->total ? 100.0 * (double)p->done / (double)p->total : 100.0,
            tool_human_bytes((uint64_t)rate, b, sizeof(b)), final ? "\n" : "");
    fflush(stderr);
}

void tool_progress_add(tool_progress *p, uint64_t n)
{
    p->done += n;
    if (!p->tty)
        return;
    int64_t now = rk__mono_ns();
    if (now - p->last_ns >= 200000000LL) { /* at most 5 redraws a second */
        p->last_ns = now;
        progress_draw(p, false);
    }
}

void tool_progress_done(tool_progress *p)
{
    if (p->tty && p->last_ns != p->start_ns)
        progress_draw(p, true);
}

const char *tool_human_bytes(uint64_t n, char *buf, int cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, (size_t)cap, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, (size_t)cap, "%.1f %s", v, unit[u]);
    return buf;
}
