/*
 * tests/prog_common.h - what the integration-test workers (tests/prog_*.c) share.
 */
#ifndef RK_PROG_COMMON_H
#define RK_PROG_COMMON_H

#include <stdio.h>

#include "rekindle.h"

/* rk_init with the RK_* environment; on failure prints "rk_init: <code>: <detail>" on stderr
   and returns NULL (the worker then exits 3). */
static inline rk_ctx *prog_rk_init(void)
{
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int rc = rk_init(&ctx, &o);
    if (rc != 0) {
        fprintf(stderr, "rk_init: %s: %s\n", rk_strerror(rc), rk_last_error());
        return NULL;
    }
    return ctx;
}

#endif
