/*
 * tests/ring_exact.h - values whose allreduce is exact in every order: the NCCL ring's
 * checks on a GPU compare device results bit for bit with a host reference
 * (tests/prog_ring_nccl.c), and tests/test_ring.c `nccl_exact_values` proves on the CPU
 * that they may.
 *
 * NCCL reduces in an order of its own (rings or trees, 16-bit types perhaps in 16 bits,
 * avg as a sum of values pre-multiplied by 1/n), so a bitwise comparison holds only for
 * values where every order gives the same bits. Small integers do: rank p's value at
 * element i is an integer in [-span, span), and with the span of each type
 * (ring_exact_span: f32 2^20, f16 128, bf16 32) every partial sum of up to 4 ranks' values,
 * and of their quarters (avg over 4 ranks), is representable in the type, so no addition
 * anywhere rounds. The reference is the MPI ring's host kernels (ring_reduce) applied hop
 * by hop in the type: the same bits as any other order, given those spans.
 */
#ifndef RK_TEST_RING_EXACT_H
#define RK_TEST_RING_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "../ring/ring.h"

/* The span of values for dtype t that keeps sums (and sums of quarters) of 4 ranks exact. */
static inline int ring_exact_span(rk_dtype t)
{
    return t == RK_F16 ? 128 : t == RK_BF16 ? 32 : 1 << 20;
}

/* Rank p's integer at element i, in [-span, span). */
static inline int ring_exact_int(int p, size_t i, int span)
{
    uint64_t x = ((uint64_t)i << 8 | (uint64_t)(p & 255)) * 0x9E3779B97F4A7C15ull; /* ranks independent */
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (int)(x % (uint64_t)(2 * span)) - span;
}

/* n elements of rank p's values in dtype t (RK_F32, RK_F16 or RK_BF16) into buf. */
static inline void ring_exact_fill(void *buf, size_t n, rk_dtype t, int p, int span)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)ring_exact_int(p, i, span);
        if (t == RK_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = t == RK_F16 ? ring_f32_to_f16(v) : ring_f32_to_bf16(v);
    }
}

/* Element i of buf (dtype t) as a float, for messages. */
static inline float ring_exact_get(const void *buf, size_t i, rk_dtype t)
{
    if (t == RK_F32)
        return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return t == RK_F16 ? ring_f16_to_f32(h) : ring_bf16_to_f32(h);
}

/* The reduction of ranks[0..nr)'s values, in that order, one hop at a time in the type
   (ring_reduce; avg divided at the last hop) into out; tmp has room for n elements.
   0, or ring_reduce's error. */
static inline int ring_exact_reference(void *out, void *tmp, size_t n, rk_dtype t, rk_op op, const int *ranks,
                                       int nr, int span)
{
    ring_exact_fill(out, n, t, ranks[0], span);
    for (int k = 1; k < nr; k++) {
        ring_exact_fill(tmp, n, t, ranks[k], span);
        int rc = ring_reduce(out, out, tmp, n, t, op, op == RK_AVG && k == nr - 1 ? nr : 0);
        if (rc != 0)
            return rc;
    }
    return 0;
}

#endif
