/*
 * examples/rk-train.c - the example trainer: a data-parallel multi-layer perceptron
 * trained with Adam on a deterministic synthetic regression task, written against the
 * public API (include/rekindle.h) only.
 *
 *   rk-train --steps N [--hidden H] [--layers L] [--batch B] [--seed S] [--zero] [--mem]
 *            [--device cpu|cuda]
 *
 * The task: inputs x in [-1,1)^IN_DIM come from a counter-based generator keyed by
 * (seed, step, sample index), so any rank can produce any sample of any step; targets
 * are y = teacher(x), a fixed random one-hidden-layer ReLU network (the same for every
 * seed). The student has L linear layers (ReLU between them): IN_DIM -> H -> ... -> OUT_DIM,
 * trained on the mean squared error.
 *
 * Data parallelism: the global batch of a step is B samples whatever the world size;
 * rank r of W computes samples [r*B/W, (r+1)*B/W), sums their gradients (and losses)
 * into one flat f32 buffer, allreduces it with RK_SUM and divides by B. Every rank then
 * applies the same Adam update to the same state, so the replicas stay bitwise equal.
 *
 * Everything that determines the future is registered with rk_register, in this order:
 * per layer l "model/layer<l>/w" and "model/layer<l>/b"; then per layer
 * "optim/layer<l>/{w,b}/m" and ".../v" (Adam's moments); then "optim/t" (Adam's step
 * counter, i64). The final hash is XXH64 (seed 0) of their bytes in that order.
 *
 * --zero (ZeRO stage 1): Adam's moments are sharded. The parameters, flattened, are split
 * evenly over the W ranks (rank r: P/W of them, one more if r < P%W, in rank order); rank
 * r holds m and v of its slice only, registered RK_SHARDED as "optim/m" and "optim/v",
 * updates its slice of the parameters from the allreduced gradient, and the weights are
 * made whole again by an allgather (a byte-wise MAX allreduce of the parameters, zero
 * outside each rank's slice: exact). Each rank also keeps a per-rank RNG ("data/rng",
 * RK_PER_RANK) that shuffles its share of the batch: its samples of a step are drawn at an
 * offset the RNG picks; rank r's starts from r (zero_seed: a spare's once it has a rank, so a
 * job grown in place onto spares has the bits of one launched at the larger world from a
 * checkpoint of that step). Registration order: the model's tensors, "optim/m", "optim/v",
 * "optim/t", "data/rng". The final hash covers the global tensors in that order: the
 * parameters, m and v of every rank's slice end to end, t, and every rank's RNG state in
 * rank order, so it is the same on every rank. After a recovery the slices are those of the
 * new world (rk_shard_rows, rk_rebind).
 *
 * --mem: after the last step (before the final hash) every rank prints its memory: peak
 * and current resident set (VmHWM, VmRSS of /proc/self/status) and the bytes of the
 * trainer's own state arrays, so that the rest is the library's and the runtime's.
 *
 * --device cuda: the parameters, the gradients and Adam's moments live on a CUDA device
 * (rank r of a node-wide job takes device r % count), registered RK_DEVICE; the passes run
 * as kernels (examples/rk-train-cuda.cu) that compute the very f32 operations of the C loops
 * in the same order, so the output lines are the same bits as with --device cpu. The
 * samples are made on the host, a chunk at a time, on either device. One training loop
 * drives both through struct backend.
 *
 * Checkpoints: with RK_CKPT_DIR unset there are none, rk_resume and rk_wait are not
 * called, and a run starts at step 0. With RK_CKPT_DIR set the run resumes from the
 * latest consistent checkpoint (rk_resume) and waits for its checkpoints at the end; a
 * checkpoint that failed along the way is reported on stderr as a warning (training went
 * on, later checkpoints were taken), not as a failure of the run.
 *
 * Exit status: 0 done, 1 a Rekindle or CUDA call failed (message on stderr; --device cuda
 * with no usable device too), 2 bad arguments (--device cuda in a build without CUDA too).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "rekindle.h"
#ifdef RK_TRAIN_CUDA
#include "rk-train-cuda.h"
#endif

/* CHUNK: samples made on the host and handed to the device's passes at a time. */
enum { IN_DIM = 16, OUT_DIM = 4, TEACHER_HIDDEN = 32, MAX_LAYERS = 16, MAX_HIDDEN = 4096, CHUNK = 1024 };
/* A backend's own failure, already reported on stderr (no Rekindle code describes it). */
enum { E_BACKEND = -100000 };
/* The teacher's key is fixed: the task is the same for every --seed. */
static const uint64_t teacher_seed = 0x72656b696e646c65ull; /* "rekindle" */

static const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, adam_eps = 1e-8f;

struct args {
    int64_t steps;
    int hidden, layers, batch;
    uint64_t seed;
    bool zero, mem, cuda;
};

/* One linear layer's place in the flat parameter vector. */
struct layer {
    int in, out;
    size_t w, b; /* offsets (in floats) of the weights [out][in] and the biases [out] */
};

struct model;

/* Where the state lives and the passes run: the host's C loops or a CUDA device. Each
   returns 0 or E_BACKEND (message printed). */
struct backend {
    const char *name;
    unsigned flags; /* rk_register's flags of the state: 0 or RK_DEVICE */
    /* Moves the host-made state (params, grads, m, v) where it lives; once, after rk_init. */
    int (*place)(struct model *md, int rank);
    void (*release)(void *p);
    int (*to_host)(void *dst, const void *src, size_t bytes);
    int (*zero)(void *p, size_t bytes);
    /* Adds the gradients of n samples into grads[0, nparam) and their squared errors, in
       sample order, into grads[nparam]. */
    int (*grads)(struct model *md, const float *x, const float *y, int n);
    /* Adam on this rank's parameters (all, or its slice with --zero): m and v hold those. */
    int (*adam)(struct model *md, float inv_batch, float c1, float c2);
    void (*finish)(void); /* after the state is released; may be NULL */
};

struct model {
    const struct backend *be;
    bool placed; /* params, grads, m and v are where be keeps them (be->place ran) */
    int nl;
    struct layer l[MAX_LAYERS];
    size_t nparam; /* floats in params, grads (plus one: the loss), m, v */
    int widest;
    float *params, *grads, *m, *v;
    int64_t t; /* Adam's step counter */
    /* --zero: this rank's slice of the flat parameters, m and v holding only it */
    bool zero;
    int64_t off, rows;
    uint64_t rng; /* per-rank RNG state (--zero) */
    float *act; /* per-layer activations of one sample: (nl+1) * widest (host passes) */
    float *delta, *delta2;
    float *xs, *ys; /* a chunk of samples: CHUNK x IN_DIM, CHUNK x OUT_DIM */
    float teacher_w1[TEACHER_HIDDEN][IN_DIM], teacher_b1[TEACHER_HIDDEN];
    float teacher_w2[OUT_DIM][TEACHER_HIDDEN];
    /* registration order, for the hash */
    int ntensor;
    struct {
        const void *ptr;
        size_t bytes;
        bool dev; /* on the device: hashed from a host copy */
    } tensor[MAX_LAYERS * 6 + 1];
};

/* ---- counter-based random numbers ---------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A uniform float in [-1, 1) from the key (a, b, c, d): exact, no libm. */
static float urand(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t h = splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d);
    return (float)(int32_t)(h >> 32) * (1.0f / 2147483648.0f);
}

/* ---- the task ------------------------------------------------------------------------ */

static void teacher_init(struct model *md)
{
    for (int j = 0; j < TEACHER_HIDDEN; j++) {
        for (int i = 0; i < IN_DIM; i++)
            md->teacher_w1[j][i] = urand(teacher_seed, 1, (uint64_t)j, (uint64_t)i) * 0.6f;
        md->teacher_b1[j] = urand(teacher_seed, 2, (uint64_t)j, 0) * 0.3f;
    }
    for (int k = 0; k < OUT_DIM; k++)
        for (int j = 0; j < TEACHER_HIDDEN; j++)
            md->teacher_w2[k][j] = urand(teacher_seed, 3, (uint64_t)k, (uint64_t)j) * 0.4f;
}

static void sample(const struct model *md, uint64_t seed, int64_t step, int idx, float *x, float *y)
{
    for (int i = 0; i < IN_DIM; i++)
        x[i] = urand(seed, (uint64_t)step, (uint64_t)idx, (uint64_t)i);
    float h[TEACHER_HIDDEN];
    for (int j = 0; j < TEACHER_HIDDEN; j++) {
        float s = md->teacher_b1[j];
        for (int i = 0; i < IN_DIM; i++)
            s += md->teacher_w1[j][i] * x[i];
        h[j] = s > 0 ? s : 0;
    }
    for (int k = 0; k < OUT_DIM; k++) {
        float s = 0;
        for (int j = 0; j < TEACHER_HIDDEN; j++)
            s += md->teacher_w2[k][j] * h[j];
        y[k] = s;
    }
}

/* ---- the model ------------------------------------------------------------------------ */

static int model_create(struct model *md, const struct args *a)
{
    memset(md, 0, sizeof(*md));
    md->nl = a->layers;
    md->widest = a->hidden > IN_DIM ? a->hidden : IN_DIM;
    size_t off = 0;
    for (int l = 0; l < md->nl; l++) {
        struct layer *L = &md->l[l];
        L->in = l == 0 ? IN_DIM : a->hidden;
        L->out = l == md->nl - 1 ? OUT_DIM : a->hidden;
        L->w = off;
        off += (size_t)L->in * (size_t)L->out;
        L->b = off;
        off += (size_t)L->out;
    }
    md->nparam = off;
    md->params = calloc(off, sizeof(float));
    md->grads = calloc(off + 1, sizeof(float));
    md->zero = a->zero;
    md->rows = (int64_t)off; /* until registration knows the world */
    md->m = calloc(off ? off : 1, sizeof(float));
    md->v = calloc(off ? off : 1, sizeof(float));
    md->act = calloc((size_t)(md->nl + 1) * (size_t)md->widest, sizeof(float));
    md->delta = calloc((size_t)md->widest, sizeof(float));
    md->delta2 = calloc((size_t)md->widest, sizeof(float));
    md->xs = calloc(CHUNK * IN_DIM, sizeof(float));
    md->ys = calloc(CHUNK * OUT_DIM, sizeof(float));
    if (!md->params || !md->grads || !md->m || !md->v || !md->act || !md->delta || !md->delta2 || !md->xs ||
        !md->ys)
        return -ENOMEM;
    /* Uniform (Glorot) initialisation from the seed; biases start at zero. */
    for (int l = 0; l < md->nl; l++) {
        const struct layer *L = &md->l[l];
        float scale = sqrtf(6.0f / (float)(L->in + L->out)); /* IEEE: correctly rounded */
        size_t n = (size_t)L->in * (size_t)L->out;
        for (size_t i = 0; i < n; i++)
            md->params[L->w + i] = urand(a->seed, 0xffffffffull, (uint64_t)l, i) * scale;
    }
    teacher_init(md);
    return 0;
}

static void model_destroy(struct model *md)
{
    void (*release)(void *) = md->placed ? md->be->release : free;
    release(md->params);
    release(md->grads);
    release(md->m);
    release(md->v);
    if (md->placed && md->be->finish)
        md->be->finish();
    free(md->xs);
    free(md->ys);
    free(md->act);
    free(md->delta);
    free(md->delta2);
}

/* Registers one tensor of ndim 0..2 (dims rows, cols) and remembers it for the hash;
   on failure, `what` names it. */
static int reg(rk_ctx *ctx, struct model *md, char *what, size_t cap, void *ptr, rk_dtype dt, size_t esize,
               int ndim, int64_t rows, int64_t cols, unsigned flags)
{
    int64_t shape[2] = {rows, cols};
    int rc = rk_register(ctx, what, ptr, dt, ndim, shape, flags);
    if (rc != 0) {
        char name[64];
        snprintf(name, sizeof(name), "%s", what);
        snprintf(what, cap, "rk_register %s", name);
        return rc;
    }
    size_t elems = ndim == 0 ? 1 : ndim == 1 ? (size_t)rows : (size_t)rows * (size_t)cols;
    md->tensor[md->ntensor].ptr = ptr;
    md->tensor[md->ntensor].bytes = elems * esize;
    md->tensor[md->ntensor].dev = (flags & RK_DEVICE) != 0;
    md->ntensor++;
    return 0;
}

/* --zero: rank r's data stream starts at 0x9e3779b97f4a7c15 * (r + 1). A spare registers
   before it has a rank (rk_rank -1): its RNG stays 0, no stream, until a recovery brings it
   in. There it receives the RNG of the rank it takes, if that rank had one (it replaces a
   lost member); a rank new to the job (growth: rank 3 of a job grown 3 -> 4) has none, in
   memory as in a checkpoint of the smaller world, and starts its own stream here, as the
   worker of that rank in a job launched at the larger world does. (0 is never a state of
   the stream: splitmix64's output is 0 for one input in 2^64.) */
static void zero_seed(rk_ctx *ctx, struct model *md)
{
    int r = rk_rank(ctx);
    if (md->rng != 0 || r < 0)
        return;
    rk_before_update(ctx); /* registered state: after the copy of a snapshot in flight */
    md->rng = 0x9e3779b97f4a7c15ull * ((uint64_t)r + 1);
}

/* --zero: registers m and v as this rank's even slice of the flat parameters. */
static int zero_register(rk_ctx *ctx, struct model *md, char *what, size_t cap)
{
    int r = rk_rank(ctx), W = rk_world(ctx);
    int64_t P = (int64_t)md->nparam, q = P / W, rem = P % W;
    md->rows = q + (r < rem);
    md->off = r * q + (r < rem ? r : rem);
    int rc = 0;
    const char *names[2] = {"optim/m", "optim/v"};
    /* m and v of this rank's slice only: the full-size ones model_create made go. */
    float *mv[2] = {calloc(md->rows ? (size_t)md->rows : 1, sizeof(float)),
                    calloc(md->rows ? (size_t)md->rows : 1, sizeof(float))};
    if (!mv[0] || !mv[1]) {
        free(mv[0]);
        free(mv[1]);
        snprintf(what, cap, "the moments of this rank's slice");
        return -ENOMEM;
    }
    free(md->m);
    free(md->v);
    md->m = mv[0];
    md->v = mv[1];
    for (int k = 0; k < 2 && rc == 0; k++) {
        snprintf(what, cap, "rk_register %s", names[k]);
        rc = rk_register(ctx, names[k], mv[k], RK_F32, 1, &md->rows, RK_SHARDED);
    }
    if (rc == 0) {
        snprintf(what, cap, "rk_register optim/t");
        rc = rk_register(ctx, "optim/t", &md->t, RK_I64, 0, (int64_t[]){0}, 0);
    }
    md->rng = 0;
    zero_seed(ctx, md); /* a spare's waits for its rank */
    if (rc == 0) {
        snprintf(what, cap, "rk_register data/rng");
        rc = rk_register(ctx, "data/rng", &md->rng, RK_U8, 1, (int64_t[]){sizeof(md->rng)}, RK_PER_RANK);
    }
    return rc;
}

/* --zero after rk_resume and RK_RECOVERED: the slice of the new world, rebound if its size
   changed, and the stream of a rank new to the job (zero_seed). */
static int zero_rebind(rk_ctx *ctx, struct model *md)
{
    int64_t off, rows;
    int rc = rk_shard_rows(ctx, "optim/m", &off, &rows, NULL);
    if (rc)
        return rc;
    zero_seed(ctx, md);
    md->off = off;
    if (rows == md->rows)
        return 0;
    float *m = calloc(rows ? (size_t)rows : 1, sizeof(float)), *v = calloc(rows ? (size_t)rows : 1, sizeof(float));
    if (!m || !v || (rc = rk_rebind(ctx, "optim/m", m)) != 0 || (rc = rk_rebind(ctx, "optim/v", v)) != 0) {
        free(m);
        free(v);
        return rc ? rc : -ENOMEM;
    }
    free(md->m);
    free(md->v);
    md->m = m;
    md->v = v;
    md->rows = rows;
    return 0;
}

/* Registers the state in the documented order; on failure `what` names the call. */
static int model_register(rk_ctx *ctx, struct model *md, char *what, size_t cap)
{
    static const char *const part[2] = {"w", "b"};
    unsigned fl = md->be->flags; /* where the state lives */
    int rc = 0;
    for (int l = 0; l < md->nl && rc == 0; l++) {
        const struct layer *L = &md->l[l];
        snprintf(what, cap, "model/layer%d/w", l);
        rc = reg(ctx, md, what, cap, md->params + L->w, RK_F32, sizeof(float), 2, L->out, L->in, fl);
        if (rc == 0) {
            snprintf(what, cap, "model/layer%d/b", l);
            rc = reg(ctx, md, what, cap, md->params + L->b, RK_F32, sizeof(float), 1, L->out, 0, fl);
        }
    }
    if (md->zero)
        return rc ? rc : zero_register(ctx, md, what, cap);
    for (int l = 0; l < md->nl && rc == 0; l++) {
        const struct layer *L = &md->l[l];
        for (int p = 0; p < 2 && rc == 0; p++) {
            size_t off = p == 0 ? L->w : L->b;
            float *mv[2] = {md->m + off, md->v + off};
            for (int k = 0; k < 2 && rc == 0; k++) {
                snprintf(what, cap, "optim/layer%d/%s/%c", l, part[p], k == 0 ? 'm' : 'v');
                rc = reg(ctx, md, what, cap, mv[k], RK_F32, sizeof(float), 2 - p, L->out, L->in, fl);
            }
        }
    }
    if (rc == 0) {
        snprintf(what, cap, "optim/t");
        rc = reg(ctx, md, what, cap, &md->t, RK_I64, sizeof(md->t), 0, 0, 0, 0);
    }
    return rc;
}

/* Forward and backward pass of one sample; adds its gradient into md->grads and returns
   its squared error summed over the outputs. */
static float sample_grad(struct model *md, const float *x, const float *y)
{
    int W = md->widest;
    memcpy(md->act, x, IN_DIM * sizeof(float));
    for (int l = 0; l < md->nl; l++) {
        const struct layer *L = &md->l[l];
        const float *in = md->act + (size_t)l * W, *w = md->params + L->w, *b = md->params + L->b;
        float *out = md->act + (size_t)(l + 1) * W;
        bool relu = l < md->nl - 1;
        for (int o = 0; o < L->out; o++) {
            const float *wr = w + (size_t)o * L->in;
            float s = b[o];
            for (int i = 0; i < L->in; i++)
                s += wr[i] * in[i];
            out[o] = relu && s < 0 ? 0 : s;
        }
    }
    /* loss = sum_k (out_k - y_k)^2 ; dloss/dout_k = 2 (out_k - y_k) */
    const float *pred = md->act + (size_t)md->nl * W;
    float loss = 0;
    for (int k = 0; k < OUT_DIM; k++) {
        float d = pred[k] - y[k];
        loss += d * d;
        md->delta[k] = 2 * d;
    }
    for (int l = md->nl - 1; l >= 0; l--) {
        const struct layer *L = &md->l[l];
        const float *in = md->act + (size_t)l * W, *w = md->params + L->w;
        float *gw = md->grads + L->w, *gb = md->grads + L->b;
        for (int o = 0; o < L->out; o++) {
            float d = md->delta[o];
            gb[o] += d;
            float *gr = gw + (size_t)o * L->in;
            for (int i = 0; i < L->in; i++)
                gr[i] += d * in[i];
        }
        if (l == 0)
            break;
        /* delta for the layer below, through its ReLU (in > 0 where it was active) */
        for (int i = 0; i < L->in; i++)
            md->delta2[i] = 0;
        for (int o = 0; o < L->out; o++) {
            const float *wr = w + (size_t)o * L->in;
            float d = md->delta[o];
            for (int i = 0; i < L->in; i++)
                md->delta2[i] += wr[i] * d;
        }
        for (int i = 0; i < L->in; i++)
            md->delta[i] = in[i] > 0 ? md->delta2[i] : 0;
    }
    return loss;
}

/* beta^t by squaring, in double: exact enough and the same everywhere (no libm). */
static double pow_i64(double beta, int64_t t)
{
    double r = 1.0;
    for (; t > 0; t >>= 1, beta *= beta)
        if (t & 1)
            r *= beta;
    return r;
}

/* One Adam step: the step counter and the bias corrections here, the update where the
   state lives. */
static int adam_update(struct model *md, float inv_batch)
{
    md->t++;
    float c1 = (float)(1.0 - pow_i64(beta1, md->t)), c2 = (float)(1.0 - pow_i64(beta2, md->t));
    return md->be->adam(md, inv_batch, c1, c2);
}

/* ---- the backends ------------------------------------------------------------------------ */

static int host_place(struct model *md, int rank)
{
    (void)rank;
    md->placed = true;
    return 0;
}

static int host_to_host(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}

static int host_zero(void *p, size_t bytes)
{
    memset(p, 0, bytes);
    return 0;
}

static int host_grads(struct model *md, const float *x, const float *y, int n)
{
    for (int s = 0; s < n; s++) {
        float l = sample_grad(md, x + (size_t)s * IN_DIM, y + (size_t)s * OUT_DIM);
        md->grads[md->nparam] += l;
    }
    return 0;
}

/* Adam on parameters [off, off + n) (all of them, or this rank's slice with --zero); m
   and v hold exactly those. */
static int host_adam(struct model *md, float inv_batch, float c1, float c2)
{
    size_t off = md->zero ? (size_t)md->off : 0, n = md->zero ? (size_t)md->rows : md->nparam;
    for (size_t k = 0; k < n; k++) {
        size_t i = off + k;
        float g = md->grads[i] * inv_batch;
        md->m[k] = beta1 * md->m[k] + (1 - beta1) * g;
        md->v[k] = beta2 * md->v[k] + (1 - beta2) * g * g;
        float mh = md->m[k] / c1, vh = md->v[k] / c2;
        md->params[i] -= lr * mh / (sqrtf(vh) + adam_eps);
    }
    return 0;
}

static const struct backend host_backend = {
    .name = "cpu", .flags = 0, .place = host_place, .release = free, .to_host = host_to_host,
    .zero = host_zero, .grads = host_grads, .adam = host_adam,
};

#ifdef RK_TRAIN_CUDA
_Static_assert((int)RKT_IN_DIM == (int)IN_DIM && (int)RKT_OUT_DIM == (int)OUT_DIM &&
                   (int)RKT_MAX_LAYERS == (int)MAX_LAYERS,
               "examples/rk-train-cuda.h describes this model");

static int cuda_failed(const char *what)
{
    fprintf(stderr, "rk-train: --device cuda: %s: %s\n", what, rkt_cuda_error());
    return E_BACKEND;
}

/* Rank r takes device r % count; the state made on the host moves there. */
static int cuda_place(struct model *md, int rank)
{
    int ndev = rkt_cuda_devices();
    if (ndev < 1)
        return cuda_failed("no CUDA device");
    if (rkt_cuda_use(rank % ndev) != 0)
        return cuda_failed("the device of this rank");
    float **host[4] = {&md->params, &md->grads, &md->m, &md->v}, *dev[4] = {NULL};
    size_t bytes[4] = {md->nparam * sizeof(float), (md->nparam + 1) * sizeof(float), md->nparam * sizeof(float),
                       md->nparam * sizeof(float)};
    int k = 0;
    for (; k < 4; k++)
        if (!(dev[k] = rkt_cuda_alloc(bytes[k])) || rkt_cuda_copy(dev[k], *host[k], bytes[k], 1) != 0)
            break;
    if (k < 4) {
        int rc = cuda_failed("the model's state");
        for (int j = 0; j <= k && j < 4; j++)
            rkt_cuda_free(dev[j]);
        return rc;
    }
    for (k = 0; k < 4; k++) {
        free(*host[k]);
        *host[k] = dev[k];
    }
    md->placed = true;
    return 0;
}

static int cuda_to_host(void *dst, const void *src, size_t bytes)
{
    return rkt_cuda_copy(dst, src, bytes, 0) == 0 ? 0 : cuda_failed("a copy to the host");
}

static int cuda_zero(void *p, size_t bytes)
{
    return rkt_cuda_zero(p, bytes) == 0 ? 0 : cuda_failed("clearing the gradients");
}

static int cuda_grads(struct model *md, const float *x, const float *y, int n)
{
    struct rkt_net net = {.nl = md->nl, .widest = md->widest, .nparam = md->nparam};
    for (int l = 0; l < md->nl; l++) {
        net.in[l] = md->l[l].in;
        net.out[l] = md->l[l].out;
        net.w[l] = md->l[l].w;
        net.b[l] = md->l[l].b;
    }
    return rkt_cuda_grads(&net, md->params, md->grads, x, y, n) == 0 ? 0 : cuda_failed("the gradients");
}

static int cuda_adam(struct model *md, float inv_batch, float c1, float c2)
{
    return rkt_cuda_adam(md->params, md->grads, md->m, md->v, 0, md->nparam, inv_batch, c1, c2, lr, beta1, beta2,
                         adam_eps) == 0
               ? 0
               : cuda_failed("the Adam update");
}

static const struct backend cuda_backend = {
    .name = "cuda", .flags = RKT_STATE_FLAGS, .place = cuda_place, .release = rkt_cuda_free,
    .to_host = cuda_to_host, .zero = cuda_zero, .grads = cuda_grads, .adam = cuda_adam,
    .finish = rkt_cuda_release,
};
#endif

/* The allgather of --zero: every rank contributes the bytes of [off, off + n) of a vector
   of `total` bytes and zeros elsewhere; a byte-wise MAX makes it whole on every rank. */
static int allgather(rk_ctx *ctx, void *buf, size_t total, size_t off, size_t n)
{
    unsigned char *b = buf;
    memset(b, 0, off);
    memset(b + off + n, 0, total - off - n);
    return rk_allreduce(ctx, b, total, RK_U8, RK_MAX);
}

/* XXH64 of every registered tensor's bytes in registration order; with --zero of the
   global tensors (the slices and the per-rank states gathered from every rank), so that
   every rank prints the same. */
static int state_hash(rk_ctx *ctx, const struct model *md, uint64_t *h)
{
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    for (int i = 0; i < md->ntensor; i++) {
        if (!md->tensor[i].dev) {
            XXH64_update(&st, md->tensor[i].ptr, md->tensor[i].bytes);
            continue;
        }
        void *copy = malloc(md->tensor[i].bytes);
        if (!copy)
            return -ENOMEM;
        int rc = md->be->to_host(copy, md->tensor[i].ptr, md->tensor[i].bytes);
        if (rc == 0)
            XXH64_update(&st, copy, md->tensor[i].bytes);
        free(copy);
        if (rc)
            return rc;
    }
    if (md->zero) {
        int W = rk_world(ctx), rc = 0;
        size_t P = md->nparam * sizeof(float);
        unsigned char *g = malloc(P > (size_t)W * 8 ? P : (size_t)W * 8);
        if (!g)
            return -ENOMEM;
        const float *mv[2] = {md->m, md->v};
        for (int k = 0; k < 2 && rc == 0; k++) {
            memcpy(g + md->off * sizeof(float), mv[k], (size_t)md->rows * sizeof(float));
            if ((rc = allgather(ctx, g, P, (size_t)md->off * sizeof(float), (size_t)md->rows * sizeof(float))) == 0)
                XXH64_update(&st, g, P);
        }
        XXH64_update(&st, &md->t, sizeof(md->t));
        memcpy(g + (size_t)rk_rank(ctx) * 8, &md->rng, 8);
        if (rc == 0 && (rc = allgather(ctx, g, (size_t)W * 8, (size_t)rk_rank(ctx) * 8, 8)) == 0)
            XXH64_update(&st, g, (size_t)W * 8);
        free(g);
        if (rc)
            return rc;
    }
    *h = XXH64_digest(&st);
    return 0;
}

/* ---- command line --------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rk-train --steps N [--hidden H] [--layers L] [--batch B] [--seed S] [--zero] [--mem]\n"
            "                [--device cpu|cuda]\n"
            "       rk-train --help\n\n"
            "Trains a multi-layer perceptron (L linear layers, ReLU between them, %d inputs,\n"
            "H hidden units, %d outputs) with Adam on a deterministic synthetic regression\n"
            "task, data parallel over the job's workers through Rekindle.\n\n"
            "  --steps N    steps to train (the run ends after step N-1)      (required)\n"
            "  --hidden H   hidden units per layer, 1..%d                   (default 64)\n"
            "  --layers L   linear layers, 1..%d                              (default 3)\n"
            "  --batch B    global batch: samples per step over all workers   (default 64)\n"
            "  --seed S     seed of the initial weights and of the data       (default 1)\n"
            "  --zero       shard Adam's moments over the workers (ZeRO-1), with a\n"
            "               per-worker RNG that shuffles each worker's samples\n"
            "  --mem        print each worker's memory after the last step (below)\n"
            "  --device D   cpu, or cuda: the model, its gradients and Adam's state on a\n"
            "               CUDA device (worker r: device r %% count), the same bits as cpu;\n"
            "               not with --zero                                   (default cpu)\n\n"
            "Output: rank 0 prints 'step S loss L world W' after each step (L: the global\n"
            "mean squared error of the step's batch before the update); every rank prints\n"
            "'final step=N world=W hash=H' at the end, H being XXH64 of every registered\n"
            "tensor's bytes. Same checkpoint, world size and arguments: the same bits.\n"
            "With --mem every rank prints before it 'memory rank=R hwm=B rss=B params=B\n"
            "grads=B moments=B' (bytes: peak and current resident set, the trainer's arrays).\n\n"
            "Checkpoints come from the RK_* environment (RK_CKPT_DIR, RK_CKPT_EVERY, RK_KEEP,\n"
            "...). With RK_CKPT_DIR set the run resumes from the latest checkpoint there;\n"
            "unset, it starts from step 0 and writes none.\n"
            "Run it on several workers with: rekindle run -n W -- rk-train --steps N\n\n"
            "exit status: 0 done, 1 a Rekindle or CUDA call failed (or --device cuda found no\n"
            "device), 2 bad arguments (or --device cuda in a build without CUDA).\n",
            IN_DIM, OUT_DIM, MAX_HIDDEN, MAX_LAYERS);
}

static int parse_num(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "rk-train: %s '%s': want an integer in %" PRId64 "..%" PRId64 " (see --help)\n",
                opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* 0 parsed, 1 --help shown, -1 bad arguments (message printed). */
static int parse_args(int argc, char **argv, struct args *a)
{
    *a = (struct args){.steps = -1, .hidden = 64, .layers = 3, .batch = 64, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (strcmp(o, "--zero") == 0) {
            a->zero = true;
            continue;
        }
        if (strcmp(o, "--mem") == 0) {
            a->mem = true;
            continue;
        }
        if (strcmp(o, "--device") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "rk-train: --device needs a value (see --help)\n");
                return -1;
            }
            const char *d = argv[++i];
            if (strcmp(d, "cpu") != 0 && strcmp(d, "cuda") != 0) {
                fprintf(stderr, "rk-train: --device '%s': want cpu or cuda (see --help)\n", d);
                return -1;
            }
            a->cuda = strcmp(d, "cuda") == 0;
#ifndef RK_TRAIN_CUDA
            if (a->cuda) {
                fprintf(stderr, "rk-train: --device cuda: this rk-train was built without CUDA (no toolkit and "
                                "nvcc were found when it was built)\n");
                return -1;
            }
#endif
            continue;
        }
        static const struct {
            const char *name;
            int64_t lo, hi;
        } opts[] = {{"--steps", 0, INT64_MAX / 2}, {"--hidden", 1, MAX_HIDDEN}, {"--layers", 1, MAX_LAYERS},
                    {"--batch", 1, 1 << 24},       {"--seed", 0, INT64_MAX}};
        size_t k = 0;
        while (k < sizeof(opts) / sizeof(opts[0]) && strcmp(o, opts[k].name) != 0)
            k++;
        if (k == sizeof(opts) / sizeof(opts[0])) {
            fprintf(stderr, "rk-train: unknown argument '%s' (see --help)\n", o);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "rk-train: %s needs a value (see --help)\n", o);
            return -1;
        }
        int64_t v;
        if (parse_num(o, argv[++i], opts[k].lo, opts[k].hi, &v) != 0)
            return -1;
        switch (k) {
        case 0: a->steps = v; break;
        case 1: a->hidden = (int)v; break;
        case 2: a->layers = (int)v; break;
        case 3: a->batch = (int)v; break;
        default: a->seed = (uint64_t)v; break;
        }
    }
    if (a->steps < 0) {
        fprintf(stderr, "rk-train: --steps is required (see --help)\n");
        return -1;
    }
    if (a->zero && a->cuda) {
        fprintf(stderr, "rk-train: --zero is not available with --device cuda (see --help)\n");
        return -1;
    }
    return 0;
}

/* ---- training -------------------------------------------------------------------------- */

/* --mem: "Name:  N kB" of /proc/self/status, in bytes (-1: not found). */
static long long proc_status_bytes(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            kb = strtoll(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static void print_memory(const rk_ctx *ctx, const struct model *md)
{
    size_t moments = 2 * sizeof(float) * (md->zero ? (size_t)md->rows : md->nparam);
    printf("memory rank=%d hwm=%lld rss=%lld params=%zu grads=%zu moments=%zu\n", rk_rank(ctx),
           proc_status_bytes("VmHWM"), proc_status_bytes("VmRSS"), md->nparam * sizeof(float),
           (md->nparam + 1) * sizeof(float), moments);
    fflush(stdout);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "rk-train: %s: %s: %s\n", what, rk_strerror(rc), rk_last_error());
    return rc;
}

/* One step's gradient over this rank's share of the global batch, allreduced; the samples
   are made here a chunk at a time, the passes run where the state lives. Returns
   rk_allreduce's result (0, RK_RECOVERED or an error), or E_BACKEND. */
static int step_grads(rk_ctx *ctx, struct model *md, const struct args *a, int64_t step, float *loss)
{
    int r = rk_rank(ctx), W = rk_world(ctx);
    int64_t lo = (int64_t)r * a->batch / W, hi = (int64_t)(r + 1) * a->batch / W, shift = 0;
    /* The per-rank RNG picks where this rank's samples start. Registered state changes only
       after the gradients' rk_allreduce (the snapshot of the step before may still be
       copied until then: rekindle.h, rk_before_update), so its new state is stored there. */
    uint64_t rng = md->zero ? splitmix64(md->rng) : 0;
    if (md->zero)
        shift = (int64_t)(rng % (uint64_t)a->batch) * 1000003;
    /* grads[nparam] sums the squared errors: the loss travels with the gradients, one allreduce */
    int rc = md->be->zero(md->grads, (md->nparam + 1) * sizeof(float));
    for (int64_t s = lo; s < hi && rc == 0;) {
        int n = 0;
        for (; n < CHUNK && s < hi; n++, s++)
            sample(md, a->seed, step, (int)((s + shift) & 0x7fffffff), md->xs + (size_t)n * IN_DIM,
                   md->ys + (size_t)n * OUT_DIM);
        rc = md->be->grads(md, md->xs, md->ys, n);
    }
    if (rc)
        return rc;
    rc = rk_allreduce(ctx, md->grads, md->nparam + 1, RK_F32, RK_SUM);
    if (rc == 0 && md->zero)
        md->rng = rng;
    float lsum = 0;
    int brc = md->be->to_host(&lsum, md->grads + md->nparam, sizeof(float));
    *loss = lsum / (float)(a->batch * OUT_DIM);
    return brc ? brc : rc;
}

/* After RK_RECOVERED from any collective (the last one too): the state was rolled back;
   --zero takes its new slice, and the loop goes on at rk_next_step(). */
static int recovered(rk_ctx *ctx, struct model *md, int64_t *step)
{
    int rc;
    if (md->zero && (rc = zero_rebind(ctx, md)) != 0)
        return fail("rk_rebind", rc);
    *step = rk_next_step(ctx);
    return 0;
}

static int train(rk_ctx *ctx, struct model *md, const struct args *a, bool ckpt_on)
{
    int64_t step = 0;
    int rc;
    if (ckpt_on && (rc = rk_resume(ctx, &step)) == RK_E_SPARE_UNUSED) {
        fprintf(stderr, "rk-train: spare worker not needed: the job finished without it\n");
        return 0; /* a spare (rekindle run --spares) that no loss called in */
    }
    if (ckpt_on && rc != 0)
        return fail("rk_resume", rc);
    /* A spare brought in learns its slice only now (docs/SHARDING.md). */
    if (md->zero && (rc = zero_rebind(ctx, md)) != 0)
        return fail("rk_rebind", rc);
    uint64_t h = 0;
    bool lost_at_end = false; /* a member was lost in the final hash's allgather */
again:
    while (step < a->steps) {
        float loss = 0;
        rc = step_grads(ctx, md, a, step, &loss);
        if (rc == 0)
            rc = adam_update(md, 1.0f / (float)a->batch);
        if (rc == 0 && md->zero)
            rc = allgather(ctx, md->params, md->nparam * sizeof(float), (size_t)md->off * sizeof(float),
                           (size_t)md->rows * sizeof(float));
        if (rc == E_BACKEND)
            return 1;
        if (rc == RK_RECOVERED) {
            if (recovered(ctx, md, &step) != 0)
                return 1;
            continue;
        }
        if (rc != 0)
            return fail("rk_allreduce", rc);
        if (rk_rank(ctx) == 0) {
            printf("step %" PRId64 " loss %.6g world %d\n", step, (double)loss, rk_world(ctx));
            fflush(stdout);
        }
        rc = rk_step_done(ctx, step);
        if (rc == RK_RECOVERED) {
            if (recovered(ctx, md, &step) != 0)
                return 1;
            continue;
        }
        if (rc != 0)
            return fail("rk_step_done", rc);
        step++;
    }
    if (a->mem)
        print_memory(ctx, md);
    /* The final hash before rk_wait: with --zero it is a collective, and rk_wait may wait up
       to RK_TIMEOUT_MS for a disk that stopped answering on this rank alone, while the
       others' allgather would wait for this one only as long. */
    if ((rc = state_hash(ctx, md, &h)) == RK_RECOVERED) { /* a member lost in the hash's allgather */
        if (recovered(ctx, md, &step) != 0)
            return 1;
        lost_at_end = true;
        goto again;
    }
    if (rc == E_BACKEND)
        return 1;
    if (rc != 0)
        return fail("the final hash's allgather", rc);
    /* A loss in the final allgather abandoned the last step's checkpoint if it was still
       being written: the survivors take it again (a label already committed is not). */
    if (ckpt_on && lost_at_end && (rc = rk_checkpoint(ctx)) != 0)
        fprintf(stderr, "rk-train: warning: the final checkpoint: %s: %s\n", rk_strerror(rc), rk_last_error());
    /* A checkpoint that failed along the way cost nothing of the training (the state is
       intact, later checkpoints went on): say so, and finish normally. */
    if (ckpt_on && (rc = rk_wait(ctx)) != 0)
        fprintf(stderr, "rk-train: warning: a checkpoint failed along the way: %s: %s (rekindle ls shows what was committed)\n",
                rk_strerror(rc), rk_last_error());
    printf("final step=%" PRId64 " world=%d hash=%016" PRIx64 "\n", step, rk_world(ctx), h);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    struct args a;
    int prc = parse_args(argc, argv, &a);
    if (prc != 0)
        return prc > 0 ? 0 : 2;

#ifdef RK_TRAIN_CUDA
    /* No device: say so before the job starts (its workers would all fail the same way). */
    if (a.cuda && rkt_cuda_devices() < 1) {
        fprintf(stderr, "rk-train: --device cuda: no CUDA device: %s\n", rkt_cuda_error());
        return 1;
    }
#endif
    struct model md;
    if (model_create(&md, &a) != 0) {
        fprintf(stderr, "rk-train: out of memory for a model of %d layers of %d\n", a.layers, a.hidden);
        model_destroy(&md);
        return 1;
    }
    rk_options o;
    rk_options_init(&o);
    rk_ctx *ctx = NULL;
    int status = 1, rc = rk_init(&ctx, &o);
    if (rc != 0) {
        fail("rk_init", rc);
        goto out_model;
    }
    md.be = &host_backend;
#ifdef RK_TRAIN_CUDA
    if (a.cuda)
        md.be = &cuda_backend;
#endif
    if (md.be->place(&md, rk_rank(ctx)) != 0)
        goto out_ctx;
    char what[96];
    if ((rc = model_register(ctx, &md, what, sizeof(what))) != 0) {
        fail(what, rc);
        goto out_ctx;
    }
    if (train(ctx, &md, &a, o.ckpt_dir != NULL) == 0)
        status = 0;
out_ctx:
    rc = rk_finalize(&ctx);
    if (rc == RK_E_TIMEOUT) {
        /* A checkpoint writer is stuck on a disk that stopped answering: the training is
           done, only that checkpoint is lost (a warning, like any failed checkpoint). The
           stuck thread holds HDF5's lock, so the library's exit handler would wait for it:
           leave without running exit handlers. */
        fprintf(stderr, "rk-train: warning: rk_finalize: %s: %s\n", rk_strerror(rc), rk_last_error());
        model_destroy(&md);
        fflush(NULL);
        _exit(status);
    }
    if (rc != 0 && status == 0) {
        fail("rk_finalize", rc);
        status = 1;
    }
out_model:
    model_destroy(&md);
    return status;
}
