/*
 * examples/rk-train-cuda.cu - rk-train's model on a CUDA device (--device cuda): the
 * forward and backward passes of a chunk of samples and Adam's update, as kernels.
 *
 * Bitwise the same as the C loops of examples/rk-train.c: every f32 value is computed by
 * one thread with the operations in the loops' order (a dot product from the bias, the
 * input index ascending; a gradient summed over the samples in sample order; the error
 * of the layer below from 0, the output index ascending), built with -fmad=false (no fused
 * multiply-add; gcc contracts none on x86-64 either) and IEEE division and square root.
 * Parallelism comes only from independent values: outputs of a sample, samples of a layer,
 * parameters of a gradient. Everything runs on the legacy default stream, the one the
 * library orders its snapshot copies after (rk_options' stream, by default). Waits are
 * for that stream alone (cudaStreamSynchronize(0)): the library's copy stream is not
 * waited for, so training goes on while a snapshot is copied.
 */
#include <stdio.h>
#ifdef RKT_EMULATE
/* The kernels on the host, one thread after another (tests/cuda_emu.h): how the tests
   check these passes against the C loops on a machine without a GPU. */
#include <math.h>

#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#define LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif

#include "rk-train-cuda.h"

static char g_err[256];
/* The work buffers of a chunk: activations of every layer, the error of the current and
   of the next layer down, and the targets; kept between calls, grown on demand. */
static struct {
    float *act, *delta, *delta2, *y;
    size_t cap; /* floats in act */
    int ncap;   /* samples the other three hold */
} g_ws;

static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(g_err, sizeof(g_err), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

/* After a launch: the launch's own error (a bad configuration), if any. */
#define LAUNCHED(name) check(cudaGetLastError(), "launch of " name)

static unsigned blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

extern "C" const char *rkt_cuda_error(void)
{
    return g_err;
}

extern "C" int rkt_cuda_devices(void)
{
    int n = 0;
    if (check(cudaGetDeviceCount(&n), "cudaGetDeviceCount") != 0)
        return 0;
    if (n < 1)
        snprintf(g_err, sizeof(g_err), "cudaGetDeviceCount: no device");
    return n;
}

extern "C" int rkt_cuda_use(int dev)
{
    return check(cudaSetDevice(dev), "cudaSetDevice");
}

extern "C" void *rkt_cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc") != 0)
        return NULL;
    if (check(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset") != 0) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

extern "C" void rkt_cuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

extern "C" int rkt_cuda_copy(void *dst, const void *src, size_t bytes, int to_device)
{
    return check(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
                 to_device ? "cudaMemcpy to the device" : "cudaMemcpy from the device");
}

extern "C" int rkt_cuda_zero(void *p, size_t bytes)
{
    return check(cudaMemset(p, 0, bytes), "cudaMemset");
}

extern "C" void rkt_cuda_release(void)
{
    cudaFree(g_ws.act);
    cudaFree(g_ws.delta);
    cudaFree(g_ws.delta2);
    cudaFree(g_ws.y);
    g_ws.act = g_ws.delta = g_ws.delta2 = g_ws.y = NULL;
    g_ws.cap = 0;
    g_ws.ncap = 0;
}

/* ---- kernels: W is the row stride (the widest layer) of act, delta and delta2 ---------- */

/* out[s][o] = relu?(b[o] + sum_i w[o][i] * in[s][i]), i ascending: one thread per (s, o). */
__global__ void forward(const float *w, const float *b, const float *in, float *out, int n, int nin, int nout,
                        int W, int relu)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * nout)
        return;
    int s = (int)(t / nout), o = (int)(t % nout);
    const float *wr = w + (size_t)o * nin, *x = in + (size_t)s * W;
    float acc = b[o];
    for (int i = 0; i < nin; i++)
        acc += wr[i] * x[i];
    out[(size_t)s * W + o] = relu && acc < 0 ? 0 : acc;
}

/* The squared error of each sample and the error at the outputs (2 (pred - y)); then the
   errors summed in sample order into *lsum by one thread, as the C loop adds them. */
__global__ void output_error(const float *pred, const float *y, float *delta, float *loss, int n, int W)
{
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n)
        return;
    float l = 0;
    for (int k = 0; k < RKT_OUT_DIM; k++) {
        float d = pred[(size_t)s * W + k] - y[s * RKT_OUT_DIM + k];
        l += d * d;
        delta[(size_t)s * W + k] = 2 * d;
    }
    loss[s] = l;
}

__global__ void loss_sum(const float *loss, float *lsum, int n)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    float acc = *lsum;
    for (int s = 0; s < n; s++)
        acc += loss[s];
    *lsum = acc;
}

/* gw[o][i] += delta[s][o] * in[s][i] and gb[o] += delta[s][o], s ascending: one thread per
   weight (t < nout * nin) or bias (the nout threads after them). */
__global__ void grad_wb(const float *delta, const float *in, float *gw, float *gb, int n, int nin, int nout,
                        int W)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nw = (size_t)nout * nin;
    if (t < nw) {
        int o = (int)(t / nin), i = (int)(t % nin);
        float acc = gw[t];
        for (int s = 0; s < n; s++)
            acc += delta[(size_t)s * W + o] * in[(size_t)s * W + i];
        gw[t] = acc;
    } else if (t < nw + (size_t)nout) {
        int o = (int)(t - nw);
        float acc = gb[o];
        for (int s = 0; s < n; s++)
            acc += delta[(size_t)s * W + o];
        gb[o] = acc;
    }
}

/* The error of the layer below: (sum_o w[o][i] * delta[s][o], from 0, o ascending) where
   that layer's output in[s][i] was active (> 0), else 0. One thread per (s, i). */
__global__ void error_below(const float *w, const float *delta, const float *in, float *below, int n, int nin,
                            int nout, int W)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * nin)
        return;
    int s = (int)(t / nin), i = (int)(t % nin);
    float acc = 0;
    for (int o = 0; o < nout; o++)
        acc += w[(size_t)o * nin + i] * delta[(size_t)s * W + o];
    below[(size_t)s * W + i] = in[(size_t)s * W + i] > 0 ? acc : 0;
}

__global__ void adam(float *params, const float *grads, float *m, float *v, size_t off, size_t n,
                     float inv_batch, float c1, float c2, float lr, float beta1, float beta2, float eps)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n)
        return;
    size_t i = off + k;
    float g = grads[i] * inv_batch;
    m[k] = beta1 * m[k] + (1 - beta1) * g;
    v[k] = beta2 * v[k] + (1 - beta2) * g * g;
    float mh = m[k] / c1, vh = v[k] / c2;
    params[i] -= lr * mh / (sqrtf(vh) + eps);
}

/* ---- the passes ----------------------------------------------------------------------- */

static int workspace(const struct rkt_net *net, int n)
{
    size_t W = (size_t)net->widest, need = (size_t)(net->nl + 1) * (size_t)n * W;
    if (need <= g_ws.cap && n <= g_ws.ncap)
        return 0;
    rkt_cuda_release();
    if (check(cudaMalloc((void **)&g_ws.act, need * sizeof(float)), "cudaMalloc (activations)") != 0 ||
        check(cudaMalloc((void **)&g_ws.delta, (size_t)n * W * sizeof(float)), "cudaMalloc (errors)") != 0 ||
        check(cudaMalloc((void **)&g_ws.delta2, (size_t)n * W * sizeof(float)), "cudaMalloc (errors)") != 0 ||
        check(cudaMalloc((void **)&g_ws.y, (size_t)n * RKT_OUT_DIM * sizeof(float)),
              "cudaMalloc (targets)") != 0) {
        rkt_cuda_release();
        return -1;
    }
    g_ws.cap = need;
    g_ws.ncap = n;
    return 0;
}

extern "C" int rkt_cuda_grads(const struct rkt_net *net, const float *params, float *grads, const float *x,
                              const float *y, int n)
{
    if (n <= 0)
        return 0;
    if (workspace(net, n) != 0)
        return -1;
    const int W = net->widest, T = 256;
    const size_t layer = (size_t)n * (size_t)W; /* floats of one layer's activations */
    float *act = g_ws.act, *delta = g_ws.delta, *below = g_ws.delta2;
    /* The inputs become layer 0's activations (row stride W), the targets go beside. */
    if (check(cudaMemcpy2D(act, (size_t)W * sizeof(float), x, RKT_IN_DIM * sizeof(float),
                           RKT_IN_DIM * sizeof(float), (size_t)n, cudaMemcpyHostToDevice),
              "cudaMemcpy2D of the inputs") != 0 ||
        check(cudaMemcpy(g_ws.y, y, (size_t)n * RKT_OUT_DIM * sizeof(float), cudaMemcpyHostToDevice),
              "cudaMemcpy of the targets") != 0)
        return -1;
    for (int l = 0; l < net->nl; l++) {
        int nin = net->in[l], nout = net->out[l];
        LAUNCH(forward, blocks((size_t)n * nout, T), T, params + net->w[l], params + net->b[l],
               act + l * layer, act + (l + 1) * layer, n, nin, nout, W, l < net->nl - 1);
        if (LAUNCHED("forward") != 0)
            return -1;
    }
    /* below[] holds each sample's squared error until the errors are summed. */
    LAUNCH(output_error, blocks((size_t)n, T), T, act + net->nl * layer, g_ws.y, delta, below, n, W);
    if (LAUNCHED("output_error") != 0)
        return -1;
    LAUNCH(loss_sum, 1, 1, below, grads + net->nparam, n);
    if (LAUNCHED("loss_sum") != 0)
        return -1;
    for (int l = net->nl - 1; l >= 0; l--) {
        int nin = net->in[l], nout = net->out[l];
        const float *in = act + l * layer;
        LAUNCH(grad_wb, blocks((size_t)nout * nin + nout, T), T, delta, in, grads + net->w[l],
               grads + net->b[l], n, nin, nout, W);
        if (LAUNCHED("grad_wb") != 0)
            return -1;
        if (l == 0)
            break;
        LAUNCH(error_below, blocks((size_t)n * nin, T), T, params + net->w[l], delta, in, below, n, nin, nout,
               W);
        if (LAUNCHED("error_below") != 0)
            return -1;
        float *t = delta;
        delta = below;
        below = t;
    }
    /* Faults of the kernels surface here, named, rather than in a later library call. */
    return check(cudaStreamSynchronize(0), "the gradient kernels");
}

extern "C" int rkt_cuda_adam(float *params, const float *grads, float *m, float *v, size_t off, size_t n,
                             float inv_batch, float c1, float c2, float lr, float beta1, float beta2,
                             float eps)
{
    if (n == 0)
        return 0;
    LAUNCH(adam, blocks(n, 256), 256, params, grads, m, v, off, n, inv_batch, c1, c2, lr, beta1, beta2, eps);
    if (LAUNCHED("adam") != 0)
        return -1;
    return check(cudaStreamSynchronize(0), "the Adam kernel");
}
