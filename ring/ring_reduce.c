/*
 * ring/ring_reduce.c - the reduction kernels of the ring (dtype x op) and the 16-bit float
 * conversions. out = acc op in, element by element: acc is the running partial result
 * (the contributions of the members before this one in the ring order), in is this
 * member's contribution. The order of the operands is part of the reduction order that
 * makes results reproducible (ring.c invariant 3).
 *
 * max/min: in wins if it is NaN or strictly greater (smaller); otherwise acc stays. So a
 * NaN anywhere propagates, and between +0 and -0 the earlier member wins.
 * 16-bit floats: both operands are converted to f32, combined (and divided, for the last
 * hop of avg) in f32, and rounded to nearest even once per hop.
 * Integers: wrap-around sum (no undefined overflow); avg is refused (RK_E_OP).
 */
#include <math.h>
#include <string.h>

#include "ring.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float ring_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t ring_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top of the payload, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to infinity (and infinity stays) */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* Below the smallest normal: adding 0.5 leaves the result in the low mantissa bits,
           rounded to a multiple of 2^-24 by the FPU (nearest even). */
        float t = bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (f32_bits(t) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias the exponent (-112 << 23) and round to nearest even */
    return (uint16_t)(sign | (a >> 13));
}

float ring_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t ring_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void ring_segment(size_t count, int size, int s, size_t *off, size_t *len)
{
    size_t n = (size_t)size, i = (size_t)s;
    size_t base = count / n, rem = count % n;
    *len = base + (i < rem ? 1 : 0);
    *off = i * base + (i < rem ? i : rem);
}

/* Float kernels: T the element type, A the arithmetic type (T itself for f32/f64). */
#define RK_FLOAT_KERNELS(name, T)                                                          \
    static void name##_sum(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = acc[i] + in[i];                                                       \
    }                                                                                      \
    static void name##_avg(T *out, const T *acc, const T *in, size_t n, T d)               \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = (acc[i] + in[i]) / d;                                                 \
    }                                                                                      \
    static void name##_max(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = (isnan(in[i]) || in[i] > acc[i]) ? in[i] : acc[i];                    \
    }                                                                                      \
    static void name##_min(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = (isnan(in[i]) || in[i] < acc[i]) ? in[i] : acc[i];                    \
    }

RK_FLOAT_KERNELS(kf32, float)
RK_FLOAT_KERNELS(kf64, double)

/* Integers: U the unsigned type of the same width, for a defined wrap-around sum. */
#define RK_INT_KERNELS(name, T, U)                                                         \
    static void name##_sum(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = (T)((U)acc[i] + (U)in[i]);                                            \
    }                                                                                      \
    static void name##_max(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = in[i] > acc[i] ? in[i] : acc[i];                                      \
    }                                                                                      \
    static void name##_min(T *out, const T *acc, const T *in, size_t n)                    \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            out[i] = in[i] < acc[i] ? in[i] : acc[i];                                      \
    }

RK_INT_KERNELS(ki32, int32_t, uint32_t)
RK_INT_KERNELS(ki64, int64_t, uint64_t)
RK_INT_KERNELS(ku8, uint8_t, uint8_t)

/* 16-bit floats through f32, one rounding per hop. */
static void k16(uint16_t *out, const uint16_t *acc, const uint16_t *in, size_t n, rk_op op,
                int divisor, bool bf)
{
    float d = (float)divisor;
    for (size_t i = 0; i < n; i++) {
        float a = bf ? ring_bf16_to_f32(acc[i]) : ring_f16_to_f32(acc[i]);
        float b = bf ? ring_bf16_to_f32(in[i]) : ring_f16_to_f32(in[i]);
        float r;
        switch (op) {
        case RK_SUM: r = a + b; break;
        case RK_AVG: r = divisor > 0 ? (a + b) / d : a + b; break;
        case RK_MAX: r = (isnan(b) || b > a) ? b : a; break;
        default: r = (isnan(b) || b < a) ? b : a; break;
        }
        out[i] = bf ? ring_f32_to_bf16(r) : ring_f32_to_f16(r);
    }
}

#define RK_DISPATCH_INT(name, T)                                                           \
    do {                                                                                   \
        switch (op) {                                                                      \
        case RK_SUM: name##_sum((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        case RK_MAX: name##_max((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        case RK_MIN: name##_min((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        default: return RK_E_OP;                                                           \
        }                                                                                  \
    } while (0)

#define RK_DISPATCH_FLOAT(name, T)                                                         \
    do {                                                                                   \
        switch (op) {                                                                      \
        case RK_SUM: name##_sum((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        case RK_AVG:                                                                       \
            if (divisor > 0)                                                               \
                name##_avg((T *)out, (const T *)acc, (const T *)in, n, (T)divisor);        \
            else                                                                           \
                name##_sum((T *)out, (const T *)acc, (const T *)in, n);                    \
            return 0;                                                                      \
        case RK_MAX: name##_max((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        case RK_MIN: name##_min((T *)out, (const T *)acc, (const T *)in, n); return 0;     \
        default: return RK_E_OP;                                                           \
        }                                                                                  \
    } while (0)

int ring_reduce(void *out, const void *acc, const void *in, size_t n, rk_dtype dtype, rk_op op,
                int divisor)
{
    if ((unsigned)op > RK_MIN)
        return RK_E_OP;
    switch (dtype) {
    case RK_F32: RK_DISPATCH_FLOAT(kf32, float);
    case RK_F64: RK_DISPATCH_FLOAT(kf64, double);
    case RK_F16:
    case RK_BF16:
        k16(out, acc, in, n, op, divisor, dtype == RK_BF16);
        return 0;
    case RK_I32: RK_DISPATCH_INT(ki32, int32_t);
    case RK_I64: RK_DISPATCH_INT(ki64, int64_t);
    case RK_U8: RK_DISPATCH_INT(ku8, uint8_t);
    }
    return RK_E_DTYPE;
}
