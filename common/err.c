/*
 * common/err.c - error codes and messages: rk_strerror(), rk_last_error(), rk__fail().
 * The messages come from RK_ERROR_TABLE in include/rekindle.h, the one table of codes.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

static _Thread_local char last_error[512];

const char *rk_error_name(int code)
{
    switch (code) {
    case RK_OK:
        return "RK_OK";
    case RK_RECOVERED:
        return "RK_RECOVERED";
#define RK_ERROR_NAME_(name, c, msg)                                                       \
    case c:                                                                                \
        return #name;
        RK_ERROR_TABLE(RK_ERROR_NAME_)
#undef RK_ERROR_NAME_
    default:
        return NULL;
    }
}

const char *rk_strerror(int code)
{
    switch (code) {
    case RK_OK:
        return "success";
    case RK_RECOVERED:
        return "recovered: a member was lost and the job rolled back; continue from rk_next_step()";
#define RK_ERROR_CASE_(name, c, msg)                                                       \
    case c:                                                                                \
        return msg;
        RK_ERROR_TABLE(RK_ERROR_CASE_)
#undef RK_ERROR_CASE_
    default:
        break;
    }
    if (code < 0 && code > -4096) {
        /* strerrordesc_np is static and thread-safe (glibc >= 2.32). */
        const char *s = strerrordesc_np(-code);
        if (s)
            return s;
    }
    return "unknown error code";
}

bool rk__is_rk_error(int code)
{
    switch (code) {
#define RK_ERROR_IS_(name, c, msg) case c:
        RK_ERROR_TABLE(RK_ERROR_IS_)
#undef RK_ERROR_IS_
        return true;
    default:
        return false;
    }
}

const char *rk_last_error(void)
{
    return last_error;
}

void rk__set_last_error(const char *fmt, ...)
{
    va_list ap;
    char msg[sizeof(last_error)]; /* an argument may be rk_last_error() itself */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof(msg));
}

int rk__fail(int sub, int level, int code, const char *fmt, ...)
{
    va_list ap;
    char msg[sizeof(last_error)]; /* an argument may be rk_last_error() itself */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof(msg));
    RK_LOG_AT(sub, level, "%s (%s)", last_error, rk_strerror(code));
    return code;
}

const char *rk_version(void)
{
    return REKINDLE_VERSION_STRING;
}

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [RK_F32] = {"f32", 4}, [RK_F64] = {"f64", 8}, [RK_F16] = {"f16", 2}, [RK_BF16] = {"bf16", 2},
    [RK_I32] = {"i32", 4}, [RK_I64] = {"i64", 8}, [RK_U8] = {"u8", 1},
};

size_t rk__dtype_size(rk_dtype t)
{
    return (unsigned)t < RK_ARRAY_LEN(dtypes) ? dtypes[t].size : 0;
}

const char *rk__dtype_name(rk_dtype t)
{
    return (unsigned)t < RK_ARRAY_LEN(dtypes) ? dtypes[t].name : NULL;
}
