/* gpu_model.cu: the MLP on one GPU per rank, llm.c style: every buffer is allocated once at
 * init, each layer is a cuBLAS GEMM plus small element-wise kernels, kernels are named *_kernel
 * and launched on the rank's compute stream, and every call goes through a check macro. Shapes
 * are row-major as on the CPU: a row-major (r, c) matrix is a column-major (c, r) one to cuBLAS,
 * so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands swapped.
 * The optimiser kernels copy optim.c's formulas term by term so the two paths agree. */
extern "C" {
#include "dist.h"
#include "gt_err.h"
#include "idx.h"
#include "model.h"
#include "optim.h"
}
#include "gpu.h"
#include "gpu_check.h"
#include "nccl_comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct gt_gpu {
    int rank, device, world;
    cudaStream_t stream;
    cublasHandle_t blas;
    gt_nccl *comm;
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
    int row = blockIdx.y;
    int64_t src = idx[row];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x)
        xb[(size_t)row * dim + j] = x[(size_t)src * dim + j];
    if (blockIdx.x == 0 && threadIdx.x == 0)
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

int gt_gpu_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* Row-major C(M,N) = op(A) op(B), beta 0, on the rank's stream. */
static int gemm(gt_gpu *g, int ta, int tb, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float *C, int ldc, gt_err *err)
{
    int rank = g->rank;
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSgemm(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                             ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B, ldb, A, lda, &zero,
                             C, ldc));
    return 0;
}

static int upload(int rank, void **dst, const void *src, size_t bytes, gt_err *err)
{
    CUDA_CHECK(cudaMalloc(dst, bytes ? bytes : 1));
    if (bytes)
        CUDA_CHECK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
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
    for (int l = 1; l <= g->nlayers; l++) {
        size_t bytes = (size_t)g->max_batch * g->sizes[l] * sizeof(float);
        CUDA_CHECK(cudaMalloc(&g->acts[l], bytes));
        CUDA_CHECK(cudaMalloc(&g->dacts[l], bytes));
    }
    CUDA_CHECK(cudaMalloc(&g->xb, (size_t)g->max_batch * g->dim * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&g->yb, (size_t)g->max_batch));
    return 0;
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

static int select_device(gt_gpu *g, const gt_dist *dist, gt_err *err)
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
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&g->blas));
    CUBLAS_CHECK(cublasSetStream(g->blas, g->stream));
    return 0;
}

int gt_gpu_init(gt_gpu **out, const gt_mlp *m, const gt_optim *o, const gt_dataset *train,
                const gt_dataset *test, int max_batch, gt_dist *dist, gt_err *err)
{
    *out = NULL;
    gt_gpu *g = (gt_gpu *)calloc(1, sizeof(*g));
    if (!g)
        return gt_errf(err, "rank %d: out of memory", dist->rank);
    g->rank = dist->rank;
    g->world = dist->world;
    g->max_batch = max_batch;
    g->dim = (int)train->dim;
    int rc = select_device(g, dist, err);
    rc = rc ? rc : alloc_model(g, m, o, err);
    rc = rc ? rc : upload_data(g, train, test, err);
    rc = rc ? rc : gt_nccl_init(&g->comm, dist, err);
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
    void *bufs[] = {g->params, g->grads,   g->opt.m,  g->opt.v,     g->train_x,
                    g->test_x, g->train_y, g->test_y, g->train_idx, g->test_idx,
                    g->xb,     g->yb,      g->stats};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        cudaFree(bufs[i]);
    for (int l = 0; l <= GT_MLP_MAX_LAYERS; l++) {
        cudaFree(g->acts[l]);
        cudaFree(g->dacts[l]);
    }
    if (g->blas)
        cublasDestroy(g->blas);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g);
}

/* Before any host synchronisation: a stuck NCCL reduction must fail, not block forever. */
static int drain(gt_gpu *g, gt_err *err)
{
    return g->world > 1 ? gt_nccl_drain(g->comm, err) : 0;
}

int gt_gpu_set_indices(gt_gpu *g, int test, const int64_t *idx, int64_t n, gt_err *err)
{
    int rank = g->rank;
    int64_t **dst = test ? &g->test_idx : &g->train_idx;
    int64_t *cap = test ? &g->test_idx_n : &g->train_idx_n;
    if (n > *cap) {
        CUDA_CHECK(cudaFree(*dst));
        *dst = NULL;
        CUDA_CHECK(cudaMalloc(dst, (size_t)n * sizeof(int64_t)));
        *cap = n;
    }
    /* Synchronous: the host array may change right after this returns. */
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    /* On our stream, then waited for: a plain cudaMemcpy from pageable memory may return
     * before its DMA lands, and our non-blocking stream is not ordered after it. */
    CUDA_CHECK(
        cudaMemcpyAsync(*dst, idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return 0;
}

/* Gathers rows idx[off..off+B) and runs the forward pass; leaves logits in acts[nlayers]. */
static int forward(gt_gpu *g, int test, int64_t off, int B, gt_err *err)
{
    int rank = g->rank;
    const int64_t *idx = (test ? g->test_idx : g->train_idx) + off;
    dim3 grid(blocks((size_t)g->dim, 256) > 4 ? 4 : blocks((size_t)g->dim, 256), (unsigned)B);
    gather_kernel<<<grid, 256, 0, g->stream>>>(g->xb, g->yb, test ? g->test_x : g->train_x,
                                               test ? g->test_y : g->train_y, idx, B, g->dim);
    KERNEL_CHECK();
    for (int l = 0; l < g->nlayers; l++) {
        int in = g->sizes[l], out = g->sizes[l + 1];
        const float *X = l == 0 ? g->xb : g->acts[l]; /* (B, in) */
        float *Y = g->acts[l + 1];                    /* (B, out) */
        if (gemm(g, 0, 1, B, out, in, X, in, g->params + g->w_off[l], in, Y, out, err) != 0)
            return -1;
        size_t n = (size_t)B * out;
        bias_act_kernel<<<blocks(n, 256), 256, 0, g->stream>>>(Y, g->params + g->b_off[l], B, out,
                                                               l + 1 < g->nlayers);
        KERNEL_CHECK();
    }
    return 0;
}

static int loss(gt_gpu *g, int B, int with_grad, gt_err *err)
{
    int rank = g->rank, C = g->sizes[g->nlayers];
    xent_kernel<<<blocks((size_t)B, 128), 128, 0, g->stream>>>(
        g->acts[g->nlayers], g->yb, B, C, with_grad ? g->dacts[g->nlayers] : NULL, g->stats);
    KERNEL_CHECK();
    g->samples += B;
    return 0;
}

static int backward(gt_gpu *g, int B, gt_err *err)
{
    int rank = g->rank;
    for (int l = g->nlayers - 1; l >= 0; l--) {
        int in = g->sizes[l], out = g->sizes[l + 1];
        const float *X = l == 0 ? g->xb : g->acts[l]; /* (B, in) */
        const float *dY = g->dacts[l + 1];            /* (B, out) */
        if (gemm(g, 1, 0, out, in, B, dY, out, X, in, g->grads + g->w_off[l], in, err) != 0)
            return -1;
        bias_grad_kernel<<<blocks((size_t)out, 128), 128, 0, g->stream>>>(g->grads + g->b_off[l],
                                                                          dY, B, out);
        KERNEL_CHECK();
        if (l == 0)
            break;
        float *dX = g->dacts[l]; /* (B, in) */
        if (gemm(g, 0, 0, B, in, out, dY, out, g->params + g->w_off[l], in, dX, in, err) != 0)
            return -1;
        size_t n = (size_t)B * in;
        relu_back_kernel<<<blocks(n, 256), 256, 0, g->stream>>>(dX, X, n);
        KERNEL_CHECK();
    }
    return 0;
}

static int optimise(gt_gpu *g, float lr, gt_err *err)
{
    int rank = g->rank;
    gt_optim *o = &g->opt;
    unsigned nb = blocks(g->nparams, 256);
    if (o->kind == GT_OPTIM_ADAM) {
        double t = (double)(o->step + 1);
        adam_kernel<<<nb, 256, 0, g->stream>>>(
            g->params, g->grads, o->m, o->v, g->nparams, (float)(1.0 - o->beta1), (float)o->beta2,
            (float)(1.0 - o->beta2), (float)sqrt(1.0 - pow(o->beta2, t)),
            (float)(-(double)lr / (1.0 - pow(o->beta1, t))), o->eps, o->weight_decay);
    } else {
        sgd_kernel<<<nb, 256, 0, g->stream>>>(g->params, g->grads, o->m, g->nparams, lr,
                                              o->momentum, o->weight_decay, o->step == 0);
    }
    KERNEL_CHECK();
    o->step++;
    return 0;
}

int gt_gpu_train_step(gt_gpu *g, int64_t off, int B, float lr, gt_err *err)
{
    if (forward(g, 0, off, B, err) != 0 || loss(g, B, 1, err) != 0 || backward(g, B, err) != 0)
        return -1;
    if (g->world > 1 && gt_nccl_allreduce_avg(g->comm, g->grads, g->nparams, g->stream, err) != 0)
        return -1;
    return optimise(g, lr, err);
}

int gt_gpu_eval_batch(gt_gpu *g, int64_t off, int count, gt_err *err)
{
    if (count <= 0)
        return 0;
    return forward(g, 1, off, count, err) != 0 ? -1 : loss(g, count, 0, err);
}

int gt_gpu_take_stats(gt_gpu *g, double *stats, gt_err *err)
{
    int rank = g->rank;
    double dev[2];
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaMemcpyAsync(dev, g->stats, sizeof(dev), cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaMemsetAsync(g->stats, 0, sizeof(dev), g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    stats[0] = dev[0];
    stats[1] = dev[1];
    stats[2] = g->samples;
    g->samples = 0;
    return 0;
}

int gt_gpu_grads(gt_gpu *g, int64_t off, int B, float *grads, double *loss_sum, gt_err *err)
{
    int rank = g->rank;
    double stats[3];
    if (gt_gpu_take_stats(g, stats, err) != 0 || forward(g, 0, off, B, err) != 0 ||
        loss(g, B, 1, err) != 0 || backward(g, B, err) != 0)
        return -1;
    CUDA_CHECK(cudaMemcpyAsync(grads, g->grads, g->nparams * sizeof(float), cudaMemcpyDeviceToHost,
                               g->stream));
    if (gt_gpu_take_stats(g, stats, err) != 0)
        return -1;
    *loss_sum = stats[0];
    return 0;
}

int gt_gpu_download(gt_gpu *g, gt_mlp *m, gt_optim *o, gt_err *err)
{
    int rank = g->rank;
    size_t pb = g->nparams * sizeof(float);
    if (drain(g, err) != 0)
        return -1;
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(m->params, g->params, pb, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(o->m, g->opt.m, pb, cudaMemcpyDeviceToHost));
    if (o->v && g->opt.v)
        CUDA_CHECK(cudaMemcpy(o->v, g->opt.v, pb, cudaMemcpyDeviceToHost));
    o->step = g->opt.step;
    return 0;
}
