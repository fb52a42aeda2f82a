/*
 * examples/rk-train-cuda.h - the CUDA side of rk-train --device cuda
 * (examples/rk-train-cuda.cu, built with nvcc when the toolkit is found).
 *
 * The kernels compute exactly what the trainer's C loops compute, in the same order of
 * f32 operations (no fused multiply-add: the .cu is built with -fmad=false; IEEE division
 * and square root), so the same arguments give the same bits on either device.
 * Every function returns 0, or -1 with rkt_cuda_error() saying which CUDA call failed and why.
 */
#ifndef RK_TRAIN_CUDA_H
#define RK_TRAIN_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* rk_register's flag for the state: RK_DEVICE; 0 where the kernels run on the host
   (tests/cuda_emu.h), whose "device" memory is host memory. */
#ifdef RKT_EMULATE
#define RKT_STATE_FLAGS 0u
#else
#define RKT_STATE_FLAGS RK_DEVICE
#endif

enum { RKT_IN_DIM = 16, RKT_OUT_DIM = 4, RKT_MAX_LAYERS = 16 };

/* The model's layout in the flat parameter vector (offsets in floats). */
struct rkt_net {
    int nl, widest;
    int in[RKT_MAX_LAYERS], out[RKT_MAX_LAYERS];
    size_t w[RKT_MAX_LAYERS], b[RKT_MAX_LAYERS];
    size_t nparam;
};

/* The number of usable CUDA devices; 0 with the runtime's reason in rkt_cuda_error(). */
int rkt_cuda_devices(void);
/* Makes device `dev` current. */
int rkt_cuda_use(int dev);
/* Zeroed device memory of `bytes` (at least one byte), or NULL. */
void *rkt_cuda_alloc(size_t bytes);
void rkt_cuda_free(void *p);
/* Synchronous copies; to_device: host src -> device dst, else device src -> host dst. */
int rkt_cuda_copy(void *dst, const void *src, size_t bytes, int to_device);
int rkt_cuda_zero(void *p, size_t bytes);
/* Adds the gradient of samples x[n][RKT_IN_DIM], y[n][RKT_OUT_DIM] (host arrays) into
   grads[0..nparam) and their squared errors, summed in sample order, into grads[nparam]:
   what the trainer's sample_grad does for each sample in turn. */
int rkt_cuda_grads(const struct rkt_net *net, const float *params, float *grads, const float *x,
                   const float *y, int n);
/* Adam on params[off, off + n) from grads (scaled by inv_batch); m and v hold those n. */
int rkt_cuda_adam(float *params, const float *grads, float *m, float *v, size_t off, size_t n,
                  float inv_batch, float c1, float c2, float lr, float beta1, float beta2, float eps);
/* Frees the work buffers kept between calls. */
void rkt_cuda_release(void);
const char *rkt_cuda_error(void);

#ifdef __cplusplus
}
#endif
#endif
