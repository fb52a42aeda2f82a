/* common/clock.c - monotonic and realtime clocks, deadlines. */
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "common.h"

static int64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t rk__mono_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

int64_t rk__real_ns(void)
{
    return clock_ns(CLOCK_REALTIME);
}

int64_t rk__deadline_ns(int64_t timeout_ms)
{
    if (timeout_ms < 0 || timeout_ms > INT64_MAX / 2000000)
        return INT64_MAX;
    return rk__mono_ns() + timeout_ms * 1000000LL;
}

bool rk__deadline_passed(int64_t deadline_ns)
{
    return rk__mono_ns() >= deadline_ns;
}

int rk__ms_left(int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX)
        return INT_MAX;
    int64_t left = deadline_ns - rk__mono_ns();
    if (left <= 0)
        return 0;
    left = (left + 999999) / 1000000;
    return left > INT_MAX ? INT_MAX : (int)left;
}

void rk__sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

double rk__ms_since(int64_t mono_ns_then)
{
    return (double)(rk__mono_ns() - mono_ns_then) / 1e6;
}
