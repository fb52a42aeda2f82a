/*
 * tests/cuda_emu.h - just enough of the CUDA runtime, on the host, to run a .cu file's
 * kernels and passes without a GPU: for kernels whose threads are independent (no shared
 * memory, no barriers, no atomics), running the threads one after another computes the
 * same values. "Device" memory is host memory; a launch is a loop over blocks and threads.
 *
 * Used by the build of build/tests/rk-train-emu (examples/rk-train-cuda.cu compiled as
 * host C++ with -DRKT_EMULATE), which the train suite compares with rk-train --device cpu:
 * the kernels' indexing and their order of f32 operations are checked on every machine.
 * What it cannot check: the device itself (its memory, its streams, its compiler's code).
 * RKT_EMU_FAIL_AFTER=N makes the Nth and later runtime calls fail (the error paths).
 */
#ifndef RK_TEST_CUDA_EMU_H
#define RK_TEST_CUDA_EMU_H

#include <stdlib.h>
#include <string.h>

#define __global__ static

struct emu_dim3 {
    unsigned x, y, z;
};
static struct emu_dim3 blockIdx, blockDim, threadIdx;

#define LAUNCH(kernel, grid, block, ...)                                                                     \
    do {                                                                                                     \
        unsigned emu_grid_ = (unsigned)(grid);                                                               \
        blockDim.x = (unsigned)(block);                                                                      \
        if (emu_fail())                                                                                      \
            break;                                                                                           \
        for (blockIdx.x = 0; blockIdx.x < emu_grid_; blockIdx.x++)                                           \
            for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++)                                   \
                kernel(__VA_ARGS__);                                                                         \
    } while (0)

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorLaunchFailure = 719 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

static cudaError_t emu_last;

/* Whether this call fails (RKT_EMU_FAIL_AFTER=N: the Nth call and every later one). */
static int emu_fail(void)
{
    static long calls, after = -1;
    if (after < 0) {
        const char *e = getenv("RKT_EMU_FAIL_AFTER");
        after = e && *e ? atol(e) : 0;
    }
    if (after > 0 && ++calls >= after) {
        emu_last = cudaErrorLaunchFailure;
        return 1;
    }
    return 0;
}

static cudaError_t emu_result(void)
{
    return emu_fail() ? cudaErrorLaunchFailure : cudaSuccess;
}

static inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "unspecified launch failure (emulated)";
}
static inline const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorLaunchFailure";
}
static inline cudaError_t cudaGetLastError(void)
{
    cudaError_t e = emu_last;
    emu_last = cudaSuccess;
    return e;
}
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int dev)
{
    return dev == 0 ? emu_result() : 101;
}
static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (emu_fail())
        return 2;
    *p = malloc(bytes);
    return *p ? cudaSuccess : 2;
}
static inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    if (emu_fail())
        return cudaErrorLaunchFailure;
    memset(p, v, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (emu_fail())
        return cudaErrorLaunchFailure;
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                       size_t height, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (emu_fail())
        return cudaErrorLaunchFailure;
    for (size_t r = 0; r < height; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
typedef void *cudaStream_t;
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return emu_result();
}

#endif
