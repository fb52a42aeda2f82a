/*
 * tests/prog_common.h - what the integration-test workers (tests/prog_*.c) share.
 */
#ifndef RK_PROG_COMMON_H
#define RK_PROG_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* A worker's wrong result: "FAIL rank R: <message>" on stdout, then _exit(1) (no atexit
   handler of MPI's: the others see a lost peer, as after a crash). */
#define PROG_FAIL(rank, ...)                                                               \
    do {                                                                                   \
        printf("FAIL rank %d: ", (rank));                                                  \
        printf(__VA_ARGS__);                                                               \
        printf("\n");                                                                      \
        fflush(stdout);                                                                    \
        _exit(1);                                                                          \
    } while (0)

/* The test pattern: byte i of a tensor (key t) at step `step` of a run seeded `seed`. */
static inline uint8_t prog_byte_at(uint64_t t, uint64_t i, int64_t step, uint64_t seed)
{
    uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (t << 48) ^ ((uint64_t)step << 32) ^ i;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (uint8_t)x;
}

/* The test-only membership oracle of the ring's jobs (all ranks run on this host): a peer
   is dead once /proc/<pid> is gone or a zombie. */
static inline bool prog_pid_dead(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return !p || p[2] == 'Z' || p[2] == 'X';
}

#endif
