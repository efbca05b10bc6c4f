/* gpu_model.cu: a model on one GPU per rank, llm.c style: every buffer is allocated once at
 * init, each layer is a cuBLAS GEMM plus small element-wise kernels, kernels are named *_kernel
 * and launched on the rank's compute stream, and every call goes through a check macro. The MLP
 * lives here; the LeNet and the ResNet in gpu_cnn.cu, on gpu_layers.cu's layers. Shapes are
 * row-major as on the CPU (gt_gl_gemm swaps operands for cuBLAS). GEMMs run in --precision
 * (16-bit inputs, fp32 accumulation); fp16 scales the loss as the CPU step does and skips steps
 * whose averaged gradients are not finite. Gradients are averaged by NCCL, or over the TCP ring
 * of dist.c when two ranks share a GPU (NCCL refuses that) or GT_GPU_ALLREDUCE=tcp.
 * The optimiser kernels copy optim.c's formulas term by term so the two paths agree. */
extern "C" {
#include "dist.h"
#include "gt_err.h"
#include "idx.h"
#include "layers.h"
#include "model.h"
#include "optim.h"
#include "scaler.h"
}
#include "gpu.h"
#include "gpu_check.h"
#include "gpu_cnn.h"
#include "gpu_layers.h"
#include "nccl_comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gt_gpu {
    int rank, device, world;
    gt_gl gl; /* the compute stream, cuBLAS, the GEMM precision */
    gt_dist *dist;
    gt_nccl *comm;           /* NULL with the TCP all-reduce */
    int tcp;                 /* gradients averaged over dist's TCP ring */
    float *host_grads;       /* (nparams) the TCP all-reduce's host copy */
    gt_gpu_cnn *cnn;         /* the LeNet or ResNet, NULL for the MLP */
    int cnn_sync_bn;         /* its BatchNorms are SyncBatchNorms (m->reduce was set) */
    float *logits, *dlogits; /* CNN: (capacity, classes) */
    int nlayers, sizes[GT_MLP_MAX_LAYERS + 1], max_batch, dim;
    size_t w_off[GT_MLP_MAX_LAYERS], b_off[GT_MLP_MAX_LAYERS], nparams;
    float *params, *grads;         /* (nparams) */
    gt_optim opt;                  /* hyper-parameters and step; m/v point to device memory */
    float *train_x, *test_x;       /* (count, dim) */
    uint8_t *train_y, *test_y;     /* (count) */
    int64_t *train_idx, *test_idx; /* uploaded shards */
    int64_t train_idx_n, test_idx_n;
    float *xb;   /* (max_batch, dim) gathered rows */
    uint8_t *yb; /* (max_batch) */
    float *acts[GT_MLP_MAX_LAYERS + 1], *dacts[GT_MLP_MAX_LAYERS + 1]; /* (max_batch, sizes[l]) */
    double *stats;                                                     /* (2) loss sum, correct */
    double samples; /* host-side count since the last take_stats */
};

/* ---- kernels ------------------------------------------------------------------------------- */

__global__ void gather_kernel(float *xb, uint8_t *yb, const float *x, const uint8_t *y,
                              const int64_t *idx, int B, int dim)
{
    int row = blockIdx.x; /* rows on x: y is limited to 65,535 blocks, an eval batch is not */
    int64_t src = idx[row];
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < dim; j += gridDim.y * blockDim.x)
        xb[(size_t)row * dim + j] = x[(size_t)src * dim + j];
    if (blockIdx.y == 0 && threadIdx.x == 0)
        yb[row] = y[src];
}

__global__ void bias_act_kernel(float *Y, const float *b, int B, int out, int relu)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * out)
        return;
    float v = Y[i] + b[i % out];
    Y[i] = relu && v < 0.0f ? 0.0f : v;
}

/* One thread per row: C (the class count) is small. Loss and argmax as gt_mlp_loss, with the
 * log-sum-exp in double; dlogits = (softmax - onehot) / B when dlogits is non-NULL. */
__global__ void xent_kernel(const float *logits, const uint8_t *y, int B, int C, float *dlogits,
                            double *stats)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B)
        return;
    const float *z = logits + (size_t)i * C;
    int best = 0;
    for (int j = 1; j < C; j++)
        if (z[j] > z[best])
            best = j;
    double sum = 0.0;
    for (int j = 0; j < C; j++)
        sum += exp((double)z[j] - z[best]);
    double lse = z[best] + log(sum);
    atomicAdd(&stats[0], lse - z[y[i]]);
    if (best == y[i])
        atomicAdd(&stats[1], 1.0);
    if (!dlogits)
        return;
    for (int j = 0; j < C; j++) {
        double p = exp((double)z[j] - lse);
        dlogits[(size_t)i * C + j] = (float)((p - (j == y[i])) / B);
    }
}

/* db[j] = sum over rows of dY[:, j]; one thread per column, rows summed in order as on the CPU. */
__global__ void bias_grad_kernel(float *db, const float *dY, int B, int out)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= out)
        return;
    float s = 0.0f;
    for (int i = 0; i < B; i++)
        s += dY[(size_t)i * out + j];
    db[j] = s;
}

__global__ void relu_back_kernel(float *dX, const float *X, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && X[i] <= 0.0f)
        dX[i] = 0.0f;
}

__global__ void sgd_kernel(float *p, const float *g, float *buf, size_t n, float lr, float mom,
                           float wd, int first)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float d = g[i] + wd * p[i];
    if (mom != 0.0f) {
        buf[i] = first ? d : mom * buf[i] + d;
        d = buf[i];
    }
    p[i] -= lr * d;
}

__global__ void adam_kernel(float *p, const float *g, float *m, float *v, size_t n, float w1,
                            float b2, float w2, float bc2_sqrt, float neg_step, float eps, float wd)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float d = g[i] + wd * p[i];
    m[i] = m[i] + w1 * (d - m[i]);
    v[i] = v[i] * b2 + w2 * (d * d);
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + neg_step * (m[i] / denom);
}

static unsigned blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* ---- host side ----------------------------------------------------------------------------- */

int gt_gpu_device_count(const char **why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        n = 0;
    if (why)
        *why = e != cudaSuccess ? cudaGetErrorString(e) : n == 0 ? "no device" : NULL;
    return n;
}

/* Row-major C(M,N) = op(A) op(B), beta 0, on the rank's stream, in --precision. */
static int gemm(gt_gpu *g, int ta, int tb, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float *C, int ldc, gt_err *err)
{
    return gt_gl_gemm(&g->gl, ta, tb, M, N, K, A, lda, B, ldb, 0.0f, C, ldc, err);
}

static int upload(int rank, void **dst, const void *src, size_t bytes, gt_err *err)
{
    CUDA_CHECK(cudaMalloc(dst, bytes ? bytes : 1));
    if (bytes)
        CUDA_CHECK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

/* The MLP's activations, or the CNN's device model and its logits. */
static int alloc_layers(gt_gpu *g, const gt_mlp *m, gt_err *err)
{
    int rank = g->rank, classes = m->sizes[m->nlayers];
    if (m->kind != GT_MODEL_MLP) {
        if (gt_gpu_cnn_init(&g->cnn, m, &g->gl, err) != 0)
            return -1;
        g->cnn_sync_bn = m->reduce != NULL;
        size_t bytes = (size_t)gt_gpu_cnn_capacity(g->cnn) * classes * sizeof(float);
        CUDA_CHECK(cudaMalloc(&g->logits, bytes));
        CUDA_CHECK(cudaMalloc(&g->dlogits, bytes));
        return 0;
    }
    for (int l = 1; l <= g->nlayers; l++) {
        size_t bytes = (size_t)g->max_batch * g->sizes[l] * sizeof(float);
        CUDA_CHECK(cudaMalloc(&g->acts[l], bytes));
        CUDA_CHECK(cudaMalloc(&g->dacts[l], bytes));
    }
    return 0;
}

static int alloc_model(gt_gpu *g, const gt_mlp *m, const gt_optim *o, gt_err *err)
{
    int rank = g->rank;
    g->nlayers = m->nlayers;
    memcpy(g->sizes, m->sizes, sizeof(g->sizes));
    memcpy(g->w_off, m->w_off, sizeof(g->w_off));
    memcpy(g->b_off, m->b_off, sizeof(g->b_off));
    g->nparams = m->nparams;
    g->opt = *o;
    g->opt.m = g->opt.v = NULL;
    size_t pb = m->nparams * sizeof(float);
    if (upload(rank, (void **)&g->params, m->params, pb, err) != 0 ||
        upload(rank, (void **)&g->opt.m, o->m, pb, err) != 0 ||
        (o->v && upload(rank, (void **)&g->opt.v, o->v, pb, err) != 0))
        return -1;
    CUDA_CHECK(cudaMalloc(&g->grads, pb));
    CUDA_CHECK(cudaMalloc(&g->stats, 2 * sizeof(double)));
    CUDA_CHECK(cudaMemset(g->stats, 0, 2 * sizeof(double)));
    CUDA_CHECK(cudaMalloc(&g->xb, (size_t)g->max_batch * g->dim * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&g->yb, (size_t)g->max_batch));
    return alloc_layers(g, m, err);
}

static int upload_data(gt_gpu *g, const gt_dataset *train, const gt_dataset *test, gt_err *err)
{
    int rank = g->rank;
    if (upload(rank, (void **)&g->train_x, train->x, train->count * train->dim * sizeof(float),
               err) != 0 ||
        upload(rank, (void **)&g->train_y, train->y, train->count, err) != 0)
        return -1;
    if (test && (upload(rank, (void **)&g->test_x, test->x, test->count * test->dim * sizeof(float),
                        err) != 0 ||
                 upload(rank, (void **)&g->test_y, test->y, test->count, err) != 0))
        return -1;
    return 0;
}

static int select_device(gt_gpu *g, const gt_dist *dist, gt_precision prec, gt_err *err)
{
    int rank = g->rank, n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (dist->local_rank >= n)
        return gt_errf(err,
                       "rank %d: local rank %d needs GPU %d but %d are visible "
                       "(CUDA_VISIBLE_DEVICES=%s)",
                       rank, dist->local_rank, dist->local_rank, n,
                       getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    g->device = dist->local_rank;
    CUDA_CHECK(cudaSetDevice(g->device));
    return gt_gl_init(&g->gl, rank, prec, err);
}

/* This rank's GPU as a number another rank compares: FNV-1a of the host name and the device's
 * UUID, below 2^32 so a double carries it exactly through the f64 all-reduce. */
static int device_id(gt_gpu *g, double *id, gt_err *err)
{
    int rank = g->rank;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, g->device));
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    uint32_t h = 2166136261u;
    for (size_t i = 0; host[i]; i++)
        h = (h ^ (uint8_t)host[i]) * 16777619u;
    for (size_t i = 0; i < sizeof(prop.uuid.bytes); i++)
        h = (h ^ (uint8_t)prop.uuid.bytes[i]) * 16777619u;
    *id = (double)h + 1.0; /* never 0, the slots of other ranks */
    return 0;
}

/* Collective: every rank learns every rank's device id (an all-gather through the sum of
 * one-hot slots) and the TCP votes, and all take the same decision: the TCP ring when two ranks
 * share a GPU (NCCL would refuse them) or any rank set GT_GPU_ALLREDUCE=tcp, else NCCL. */
static int choose_allreduce(gt_gpu *g, gt_dist *dist, gt_err *err)
{
    int W = g->world;
    if (W == 1)
        return 0;
    double *v = (double *)calloc((size_t)W + 1, sizeof(double));
    if (!v)
        return gt_errf(err, "rank %d: out of memory", g->rank);
    const char *env = getenv("GT_GPU_ALLREDUCE");
    v[W] = env && strcmp(env, "tcp") == 0;
    int rc = device_id(g, &v[g->rank], err);
    rc = rc ? rc : gt_dist_allreduce_f64(dist, v, (size_t)W + 1, err);
    g->tcp = rc == 0 && v[W] > 0;
    for (int i = 0; rc == 0 && i < W; i++)
        for (int j = i + 1; j < W; j++)
            g->tcp |= v[i] == v[j];
    free(v);
    if (rc == 0 && g->tcp && !(g->host_grads = (float *)malloc(g->nparams * sizeof(float))))
        rc = gt_errf(err, "rank %d: out of memory for the TCP all-reduce", g->rank);
    return rc;
}

int gt_gpu_init(gt_gpu **out, const gt_mlp *m, const gt_optim *o, const gt_dataset *train,
                const gt_dataset *test, int max_batch, gt_precision prec, gt_dist *dist,
                gt_err *err)
{
    *out = NULL;
    gt_gpu *g = (gt_gpu *)calloc(1, sizeof(*g));
    if (!g)
        return gt_errf(err, "rank %d: out of memory", dist->rank);
    g->rank = dist->rank;
    g->world = dist->world;
    g->dist = dist;
    g->max_batch = max_batch;
    g->dim = (int)train->dim;
    int rc = select_device(g, dist, prec, err);
    rc = rc ? rc : alloc_model(g, m, o, err);
    rc = rc ? rc : upload_data(g, train, test, err);
    rc = rc ? rc : choose_allreduce(g, dist, err);
    /* One rank too: its communicator's creation is part of what a 1-rank run tries. But one rank
     * never uses it, so there a failure is a warning: the GPU's own work still runs and says
     * whether it is right where NCCL cannot start. */
    if (rc == 0 && !g->tcp) {
        rc = gt_nccl_init(&g->comm, dist, err);
        if (rc != 0 && g->world == 1) {
            fprintf(stderr, "gpusync-train: warning: %s (one rank does not need NCCL)\n",
                    err ? err->msg : "NCCL did not start");
            rc = 0;
        }
    }
    /* The uploads ran on the legacy stream; the non-blocking compute stream is not ordered
     * after them, so wait for them here once. */
    if (rc == 0 && cudaDeviceSynchronize() != cudaSuccess)
        rc = gt_errf(err, "rank %d: %s:%d: cudaDeviceSynchronize: %s", g->rank, __FILE__, __LINE__,
                     cudaGetErrorString(cudaGetLastError()));
    if (rc != 0) {
        gt_gpu_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void gt_gpu_free(gt_gpu *g)
{
    if (!g)
        return;
    gt_nccl_free(g->comm);
    gt_gpu_cnn_free(g->cnn);
    void *bufs[] = {g->params, g->grads,   g->opt.m,  g->opt.v,     g->train_x,
                    g->test_x, g->train_y, g->test_y, g->train_idx, g->test_idx,
                    g->xb,     g->yb,      g->stats,  g->logits,    g->dlogits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        cudaFree(bufs[i]);
    for (int l = 0; l <= GT_MLP_MAX_LAYERS; l++) {
        cudaFree(g->acts[l]);
        cudaFree(g->dacts[l]);
    }
    gt_gl_release(&g->gl);
    free(g->host_grads);
    free(g);
}

const char *gt_gpu_allreduce_name(const gt_gpu *g)
{
    return g->world == 1 ? "one rank" : g->tcp ? "TCP all-reduce" : "NCCL all-reduce";
}

/* Before any host synchronisation: a stuck NCCL reduction must fail, not block forever. */
static int drain(gt_gpu *g, gt_err *err)
{
    return g->comm ? gt_nccl_drain(g->comm, err) : 0;
}

int gt_gpu_set_indices(gt_gpu *g, int test, const int64_t *idx, int64_t n, gt_err *err)
{
    int rank = g->rank;
    int64_t **dst = test ? &g->test_idx : &g->train_idx;
    int64_t *cap = test ? &g->test_idx_n : &g->train_idx_n;
    /* Synchronous: the host array may change right after this returns, and the old device
     * array may still be read by queued work. */
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream));
    if (n > *cap) {
        CUDA_CHECK(cudaFree(*dst));
        *dst = NULL;
        CUDA_CHECK(cudaMalloc(dst, (size_t)n * sizeof(int64_t)));
        *cap = n;
    }
    /* On our stream, then waited for: a plain cudaMemcpy from pageable memory may return
     * before its DMA lands, and our non-blocking stream is not ordered after it. */
    CUDA_CHECK(cudaMemcpyAsync(*dst, idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice,
                               g->gl.stream));
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream));
    return 0;
}

/* Gathers rows idx[off..off+B) of the train or test set into xb, yb. */
static int gather(gt_gpu *g, int test, int64_t off, int B, gt_err *err)
{
    int rank = g->rank;
    const int64_t *idx = (test ? g->test_idx : g->train_idx) + off;
    dim3 grid((unsigned)B, blocks((size_t)g->dim, 256) > 4 ? 4 : blocks((size_t)g->dim, 256));
    gather_kernel<<<grid, 256, 0, g->gl.stream>>>(g->xb, g->yb, test ? g->test_x : g->train_x,
                                                  test ? g->test_y : g->train_y, idx, B, g->dim);
    KERNEL_CHECK();
    return 0;
}

/* The MLP's forward on the gathered rows; leaves logits in acts[nlayers]. */
static int mlp_forward(gt_gpu *g, int B, gt_err *err)
{
    int rank = g->rank;
    for (int l = 0; l < g->nlayers; l++) {
        int in = g->sizes[l], out = g->sizes[l + 1];
        const float *X = l == 0 ? g->xb : g->acts[l]; /* (B, in) */
        float *Y = g->acts[l + 1];                    /* (B, out) */
        if (gemm(g, 0, 1, B, out, in, X, in, g->params + g->w_off[l], in, Y, out, err) != 0)
            return -1;
        size_t n = (size_t)B * out;
        bias_act_kernel<<<blocks(n, 256), 256, 0, g->gl.stream>>>(Y, g->params + g->b_off[l], B,
                                                                  out, l + 1 < g->nlayers);
        KERNEL_CHECK();
    }
    return 0;
}

static float *logits_of(gt_gpu *g)
{
    return g->cnn ? g->logits : g->acts[g->nlayers];
}

static float *dlogits_of(gt_gpu *g)
{
    return g->cnn ? g->dlogits : g->dacts[g->nlayers];
}

/* Training forward on shard rows [off, off+B): dropout keyed by (drop_key, dataset index). */
static int forward_train(gt_gpu *g, int64_t off, int B, uint64_t drop_key, gt_err *err)
{
    if (gather(g, 0, off, B, err) != 0)
        return -1;
    if (!g->cnn)
        return mlp_forward(g, B, err);
    return gt_gpu_cnn_forward(g->cnn, g->params, g->xb, B, 1, drop_key, g->train_idx + off,
                              g->logits, err);
}

/* Cross-entropy of B rows of logits against y, into the stats; dlogits unless NULL. */
static int loss(gt_gpu *g, const float *logits, const uint8_t *y, int B, float *dlogits,
                gt_err *err)
{
    int rank = g->rank, C = g->sizes[g->nlayers];
    xent_kernel<<<blocks((size_t)B, 128), 128, 0, g->gl.stream>>>(logits, y, B, C, dlogits,
                                                                  g->stats);
    KERNEL_CHECK();
    g->samples += B;
    return 0;
}

static int mlp_backward(gt_gpu *g, int B, gt_err *err)
{
    int rank = g->rank;
    for (int l = g->nlayers - 1; l >= 0; l--) {
        int in = g->sizes[l], out = g->sizes[l + 1];
        const float *X = l == 0 ? g->xb : g->acts[l]; /* (B, in) */
        const float *dY = g->dacts[l + 1];            /* (B, out) */
        if (gemm(g, 1, 0, out, in, B, dY, out, X, in, g->grads + g->w_off[l], in, err) != 0)
            return -1;
        bias_grad_kernel<<<blocks((size_t)out, 128), 128, 0, g->gl.stream>>>(g->grads + g->b_off[l],
                                                                             dY, B, out);
        KERNEL_CHECK();
        if (l == 0)
            break;
        float *dX = g->dacts[l]; /* (B, in) */
        if (gemm(g, 0, 0, B, in, out, dY, out, g->params + g->w_off[l], in, dX, in, err) != 0)
            return -1;
        size_t n = (size_t)B * in;
        relu_back_kernel<<<blocks(n, 256), 256, 0, g->gl.stream>>>(dX, X, n);
        KERNEL_CHECK();
    }
    return 0;
}

static int backward(gt_gpu *g, int B, gt_err *err)
{
    if (!g->cnn)
        return mlp_backward(g, B, err);
    return gt_gpu_cnn_backward(g->cnn, g->params, g->grads, g->xb, B, g->dlogits, err);
}

static int optimise(gt_gpu *g, float lr, gt_err *err)
{
    int rank = g->rank;
    gt_optim *o = &g->opt;
    unsigned nb = blocks(g->nparams, 256);
    if (o->kind == GT_OPTIM_ADAM) {
        double t = (double)(o->step + 1);
        adam_kernel<<<nb, 256, 0, g->gl.stream>>>(
            g->params, g->grads, o->m, o->v, g->nparams, (float)(1.0 - o->beta1), (float)o->beta2,
            (float)(1.0 - o->beta2), (float)sqrt(1.0 - pow(o->beta2, t)),
            (float)(-(double)lr / (1.0 - pow(o->beta1, t))), o->eps, o->weight_decay);
    } else {
        sgd_kernel<<<nb, 256, 0, g->gl.stream>>>(g->params, g->grads, o->m, g->nparams, lr,
                                                 o->momentum, o->weight_decay, o->step == 0);
    }
    KERNEL_CHECK();
    o->step++;
    return 0;
}

/* The average over ranks through dist's TCP ring, as the CPU step computes it (a sum, then a
 * multiplication by 1/world), for ranks that share a GPU. */
static int tcp_average(gt_gpu *g, gt_err *err)
{
    int rank = g->rank;
    size_t bytes = g->nparams * sizeof(float);
    CUDA_CHECK(
        cudaMemcpyAsync(g->host_grads, g->grads, bytes, cudaMemcpyDeviceToHost, g->gl.stream));
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream));
    if (gt_dist_allreduce_f32(g->dist, g->host_grads, g->nparams, err) != 0)
        return -1;
    float scale = 1.0f / (float)g->world;
    for (size_t i = 0; i < g->nparams; i++)
        g->host_grads[i] *= scale;
    CUDA_CHECK(
        cudaMemcpyAsync(g->grads, g->host_grads, bytes, cudaMemcpyHostToDevice, g->gl.stream));
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream)); /* host_grads is rewritten next step */
    return 0;
}

static int average(gt_gpu *g, gt_err *err)
{
    if (g->world == 1)
        return 0;
    if (g->tcp)
        return tcp_average(g, err);
    return gt_nccl_allreduce_avg(g->comm, g->grads, g->nparams, g->gl.stream, err);
}

/* DDP's broadcast_buffers: without SyncBatchNorm each step starts from rank 0's running
 * statistics, as the CPU step does (train.c). */
static int broadcast_buffers(gt_gpu *g, gt_err *err)
{
    int rank = g->rank;
    size_t nb = 0;
    float *dev = g->cnn ? gt_gpu_cnn_buffers(g->cnn, &nb) : NULL;
    if (g->world == 1 || nb == 0 || g->cnn_sync_bn)
        return 0;
    float *host = (float *)malloc(nb * sizeof(float));
    if (!host)
        return gt_errf(err, "rank %d: out of memory", rank);
    int rc = drain(g, err);
    cudaError_t e =
        rc ? cudaSuccess
           : cudaMemcpyAsync(host, dev, nb * sizeof(float), cudaMemcpyDeviceToHost, g->gl.stream);
    e = e == cudaSuccess && rc == 0 ? cudaStreamSynchronize(g->gl.stream) : e;
    if (e == cudaSuccess && rc == 0)
        rc = gt_dist_broadcast(g->dist, host, nb * sizeof(float), err);
    if (e == cudaSuccess && rc == 0)
        e = cudaMemcpyAsync(dev, host, nb * sizeof(float), cudaMemcpyHostToDevice, g->gl.stream);
    e = e == cudaSuccess && rc == 0 ? cudaStreamSynchronize(g->gl.stream) : e;
    free(host);
    if (e != cudaSuccess)
        return gt_errf(err, "rank %d: %s:%d: broadcasting the BatchNorm statistics: %s", rank,
                       __FILE__, __LINE__, cudaGetErrorString(e));
    return rc;
}

/* fp16: 1 when the averaged gradients are finite (then unscaled by the scale read before the
 * update, as gt_scaler_unscale_and_update), 0 when the step must be skipped. */
static int unscale(gt_gpu *g, gt_scaler *s, int *finite, gt_err *err)
{
    int bad = 0;
    if (drain(g, err) != 0 || gt_gl_nonfinite(&g->gl, g->grads, g->nparams, &bad, err) != 0)
        return -1;
    *finite = !bad;
    float inv = 1.0f / s->scale;
    if (*finite && gt_gl_scale(&g->gl, g->grads, inv, g->nparams, err) != 0)
        return -1;
    gt_scaler_update(s, *finite);
    return 0;
}

int gt_gpu_train_step(gt_gpu *g, const gt_gpu_step *st, int *applied, gt_err *err)
{
    int finite = 1;
    *applied = 0;
    /* SyncBatchNorm synchronises with the host mid-pass: settle NCCL first (see drain). */
    if (broadcast_buffers(g, err) != 0 || (g->cnn_sync_bn && drain(g, err) != 0) ||
        forward_train(g, st->off, st->B, st->drop_key, err) != 0 ||
        loss(g, logits_of(g), g->yb, st->B, dlogits_of(g), err) != 0)
        return -1;
    if (st->scaler && gt_gl_scale(&g->gl, dlogits_of(g), st->scaler->scale,
                                  (size_t)st->B * g->sizes[g->nlayers], err) != 0)
        return -1;
    if (backward(g, st->B, err) != 0 || average(g, err) != 0)
        return -1;
    if (st->scaler && unscale(g, st->scaler, &finite, err) != 0)
        return -1;
    if (!finite)
        return 0;
    *applied = 1;
    return optimise(g, st->lr, err);
}

/* Evaluation forward and loss of the gathered rows, in chunks the CNN holds. */
static int eval_rows(gt_gpu *g, int count, gt_err *err)
{
    if (!g->cnn)
        return mlp_forward(g, count, err) != 0 ? -1
                                               : loss(g, logits_of(g), g->yb, count, NULL, err);
    int cap = gt_gpu_cnn_capacity(g->cnn);
    for (int s = 0; s < count; s += cap) {
        int b = count - s < cap ? count - s : cap;
        if (gt_gpu_cnn_forward(g->cnn, g->params, g->xb + (size_t)s * g->dim, b, 0, 0, NULL,
                               g->logits, err) != 0 ||
            loss(g, g->logits, g->yb + s, b, NULL, err) != 0)
            return -1;
    }
    return 0;
}

int gt_gpu_eval_batch(gt_gpu *g, int64_t off, int count, gt_err *err)
{
    if (count <= 0)
        return 0;
    return gather(g, 1, off, count, err) != 0 ? -1 : eval_rows(g, count, err);
}

int gt_gpu_take_stats(gt_gpu *g, double *stats, gt_err *err)
{
    int rank = g->rank;
    double dev[2];
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaMemcpyAsync(dev, g->stats, sizeof(dev), cudaMemcpyDeviceToHost, g->gl.stream));
    CUDA_CHECK(cudaMemsetAsync(g->stats, 0, sizeof(dev), g->gl.stream));
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream));
    stats[0] = dev[0];
    stats[1] = dev[1];
    stats[2] = g->samples;
    g->samples = 0;
    return 0;
}

int gt_gpu_grads(gt_gpu *g, int64_t off, int B, uint64_t drop_key, float *grads, double *loss_sum,
                 gt_err *err)
{
    int rank = g->rank;
    double stats[3];
    if (gt_gpu_take_stats(g, stats, err) != 0 || forward_train(g, off, B, drop_key, err) != 0 ||
        loss(g, logits_of(g), g->yb, B, dlogits_of(g), err) != 0 || backward(g, B, err) != 0)
        return -1;
    CUDA_CHECK(cudaMemcpyAsync(grads, g->grads, g->nparams * sizeof(float), cudaMemcpyDeviceToHost,
                               g->gl.stream));
    if (gt_gpu_take_stats(g, stats, err) != 0)
        return -1;
    *loss_sum = stats[0];
    return 0;
}

int gt_gpu_download(gt_gpu *g, gt_mlp *m, gt_optim *o, gt_err *err)
{
    int rank = g->rank;
    size_t pb = g->nparams * sizeof(float), nb = 0;
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaStreamSynchronize(g->gl.stream));
    CUDA_CHECK(cudaMemcpy(m->params, g->params, pb, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(o->m, g->opt.m, pb, cudaMemcpyDeviceToHost));
    if (o->v && g->opt.v)
        CUDA_CHECK(cudaMemcpy(o->v, g->opt.v, pb, cudaMemcpyDeviceToHost));
    float *buffers = g->cnn ? gt_gpu_cnn_buffers(g->cnn, &nb) : NULL;
    if (nb && m->buffers && m->nbuffers == nb)
        CUDA_CHECK(cudaMemcpy(m->buffers, buffers, nb * sizeof(float), cudaMemcpyDeviceToHost));
    o->step = g->opt.step;
    return 0;
}
