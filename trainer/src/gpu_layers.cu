/* gpu_layers.cu: see gpu_layers.h. A convolution unfolds the whole batch at once: im2col writes
 * columns (C*k*k, B*P) (P = OH*OW), one GEMM gives the output in (K, B*P) order, and a permute
 * kernel moves it to NCHW and adds the bias. The backward permutes dy to (K, B*P) so the weight
 * gradient is one GEMM summing over the batch, and col2im gathers (one thread per input element,
 * no atomics) from the columns of W^T dy. Element-wise kernels use one thread per element;
 * per-channel reductions (BatchNorm, biases) one block per channel, summing in the CPU path's
 * precision (double for BatchNorm). */
extern "C" {
#include "gt_err.h"
#include "layers.h"
#include "model.h"
}
#include "gpu_check.h"
#include "gpu_layers.h"
#include "layer_index.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#define THREADS 256

/* At least one block: a zero grid is a launch error, and every kernel checks its bound. */
static unsigned blocks_for(size_t n)
{
    return n ? (unsigned)((n + THREADS - 1) / THREADS) : 1u;
}

/* ---- GEMM ---------------------------------------------------------------------------------- */

static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void to_f16_kernel(__half *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __float2half_rn(src[i]);
}

/* Grows the 16-bit scratch to n elements. The old buffer may still be read by queued GEMMs,
 * so the stream is drained before it is freed (this happens in the first steps only). */
static int ensure_half(gt_gl *l, size_t n, gt_err *err)
{
    int rank = l->rank;
    if (n <= l->half_cap)
        return 0;
    CUDA_CHECK(cudaStreamSynchronize(l->stream));
    CUDA_CHECK(cudaFree(l->half));
    l->half = NULL;
    l->half_cap = 0;
    CUDA_CHECK(cudaMalloc(&l->half, n * sizeof(uint16_t)));
    l->half_cap = n;
    return 0;
}

/* Rounds n floats of src into dst (16-bit elements) in l->prec. */
static int round16(gt_gl *l, uint16_t *dst, const float *src, size_t n, gt_err *err)
{
    int rank = l->rank;
    if (l->prec == GT_PREC_BF16)
        to_bf16_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>((__nv_bfloat16 *)dst, src, n);
    else
        to_f16_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>((__half *)dst, src, n);
    KERNEL_CHECK();
    return 0;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: operands swap places. */
int gt_gl_gemm(gt_gl *l, int ta, int tb, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc, gt_err *err)
{
    int rank = l->rank;
    const float one = 1.0f;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (M <= 0 || N <= 0)
        return 0;
    if (l->prec == GT_PREC_FP32 || K <= 0) {
        CUBLAS_CHECK(cublasSgemm(l->blas, opb, opa, N, M, K, &one, B, ldb, A, lda, &beta, C, ldc));
        return 0;
    }
    /* The stored extents of A and B, as the CPU emulation rounds them (model.c). */
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    size_t na = (size_t)(ar - 1) * lda + ac, nb = (size_t)(br - 1) * ldb + bc;
    size_t boff = (na + 7) & ~(size_t)7; /* B's copy 16-byte aligned, as tensor cores prefer */
    if (ensure_half(l, boff + nb, err) != 0 || round16(l, l->half, A, na, err) != 0 ||
        round16(l, l->half + boff, B, nb, err) != 0)
        return -1;
    cudaDataType t = l->prec == GT_PREC_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    CUBLAS_CHECK(cublasGemmEx(l->blas, opb, opa, N, M, K, &one, l->half + boff, t, ldb, l->half, t,
                              lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---- context ------------------------------------------------------------------------------- */

int gt_gl_init(gt_gl *l, int rank, gt_precision prec, gt_err *err)
{
    memset(l, 0, sizeof(*l));
    l->rank = rank;
    l->prec = prec;
    size_t sums = (2 * GT_BN_MAX_C + 1) * sizeof(double);
    CUDA_CHECK(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&l->blas));
    CUBLAS_CHECK(cublasSetStream(l->blas, l->stream));
    CUDA_CHECK(cudaMalloc(&l->sums, sums));
    CUDA_CHECK(cudaMallocHost(&l->host_sums, sums));
    CUDA_CHECK(cudaMalloc(&l->flag, sizeof(int)));
    return 0;
}

void gt_gl_release(gt_gl *l)
{
    cudaFree(l->half);
    cudaFree(l->sums);
    cudaFreeHost(l->host_sums);
    cudaFree(l->flag);
    if (l->blas)
        cublasDestroy(l->blas);
    if (l->stream)
        cudaStreamDestroy(l->stream);
    memset(l, 0, sizeof(*l));
}

/* ---- convolution --------------------------------------------------------------------------- */

/* col (C*k*k, B*P) from x (B, C, H, W); one thread per column entry. */
static __global__ void im2col_kernel(float *col, const float *x, gt_conv2d s, int B)
{
    size_t P = (size_t)s.OH * s.OW, BP = (size_t)B * P;
    size_t n_all = (size_t)s.C * s.k * s.k * BP;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_all)
        return;
    int r = (int)(i / BP);
    size_t q = i % BP;
    int n = (int)(q / P), p = (int)(q % P);
    int c = r / (s.k * s.k), ki = (r / s.k) % s.k, kj = r % s.k;
    int64_t at = gt_im2col_src(s.H, s.W, s.stride, s.pad, c, ki, kj, p / s.OW, p % s.OW);
    col[i] = at >= 0 ? x[(size_t)n * s.C * s.H * s.W + at] : 0.0f;
}

/* dx (B, C, H, W) = the adjoint of im2col applied to col; one thread per input element, taps
 * summed in the CPU's (ki, kj) order. */
static __global__ void col2im_kernel(float *dx, const float *col, gt_conv2d s, int B)
{
    size_t P = (size_t)s.OH * s.OW, BP = (size_t)B * P, plane = (size_t)s.H * s.W;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * s.C * plane)
        return;
    int n = (int)(i / (s.C * plane)), c = (int)(i / plane % s.C);
    int iy = (int)(i % plane / s.W), ix = (int)(i % s.W);
    float sum = 0.0f;
    for (int ki = 0; ki < s.k; ki++) {
        int oy = gt_col2im_out(iy, ki, s.stride, s.pad, s.OH);
        if (oy < 0)
            continue;
        for (int kj = 0; kj < s.k; kj++) {
            int ox = gt_col2im_out(ix, kj, s.stride, s.pad, s.OW);
            if (ox < 0)
                continue;
            size_t r = (size_t)(c * s.k + ki) * s.k + kj;
            sum += col[r * BP + (size_t)n * P + (size_t)oy * s.OW + ox];
        }
    }
    dx[i] = sum;
}

/* y (B, K, P) = t (K, B*P) permuted, plus b (K) unless NULL. */
static __global__ void from_kbp_kernel(float *y, const float *t, const float *b, int B, int K,
                                       int P)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * K * P)
        return;
    int n = (int)(i / ((size_t)K * P)), k = (int)(i / P % K), p = (int)(i % P);
    float v = t[(size_t)k * B * P + (size_t)n * P + p];
    y[i] = b ? v + b[k] : v;
}

/* t (K, B*P) = y (B, K, P) permuted. */
static __global__ void to_kbp_kernel(float *t, const float *y, int B, int K, int P)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * K * P)
        return;
    int n = (int)(i / ((size_t)K * P)), k = (int)(i / P % K), p = (int)(i % P);
    t[(size_t)k * B * P + (size_t)n * P + p] = y[i];
}

/* out[r] = sum of row r of a (rows, len); one block per row, float sums as the CPU's. */
static __global__ void row_sums_kernel(float *out, const float *a, size_t len)
{
    __shared__ float part[THREADS];
    const float *row = a + (size_t)blockIdx.x * len;
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x)
        s += row[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = part[0];
}

size_t gt_gl_conv2d_scratch_len(const gt_conv2d *s, int B)
{
    size_t BP = (size_t)B * s->OH * s->OW;
    return (size_t)s->C * s->k * s->k * BP + (size_t)s->K * BP;
}

int gt_gl_conv2d_forward(gt_gl *l, const gt_conv2d *s, int B, const float *x, const float *w,
                         const float *b, float *y, float *scratch, gt_err *err)
{
    int rank = l->rank, P = s->OH * s->OW, CKK = s->C * s->k * s->k, BP = B * P;
    float *col = scratch, *t = scratch + (size_t)CKK * BP; /* (CKK, BP), (K, BP) */
    im2col_kernel<<<blocks_for((size_t)CKK * BP), THREADS, 0, l->stream>>>(col, x, *s, B);
    KERNEL_CHECK();
    if (gt_gl_gemm(l, 0, 0, s->K, BP, CKK, w, CKK, col, BP, 0.0f, t, BP, err) != 0)
        return -1;
    from_kbp_kernel<<<blocks_for((size_t)s->K * BP), THREADS, 0, l->stream>>>(y, t, b, B, s->K, P);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_conv2d_backward(gt_gl *l, const gt_conv2d *s, int B, const float *x, const float *w,
                          const float *dy, float *dw, float *db, float *dx, float *scratch,
                          gt_err *err)
{
    int rank = l->rank, P = s->OH * s->OW, CKK = s->C * s->k * s->k, BP = B * P;
    float *col = scratch, *t = scratch + (size_t)CKK * BP; /* (CKK, BP), (K, BP) */
    to_kbp_kernel<<<blocks_for((size_t)s->K * BP), THREADS, 0, l->stream>>>(t, dy, B, s->K, P);
    KERNEL_CHECK();
    if (db) {
        row_sums_kernel<<<s->K, THREADS, 0, l->stream>>>(db, t, (size_t)BP);
        KERNEL_CHECK();
    }
    im2col_kernel<<<blocks_for((size_t)CKK * BP), THREADS, 0, l->stream>>>(col, x, *s, B);
    KERNEL_CHECK();
    /* dw (K, CKK) = t (K, BP) col^T (BP, CKK): the batch sum is the GEMM's inner dimension. */
    if (gt_gl_gemm(l, 0, 1, s->K, CKK, BP, t, BP, col, BP, 0.0f, dw, CKK, err) != 0)
        return -1;
    if (!dx)
        return 0;
    /* dcol (CKK, BP) = w^T (CKK, K) t (K, BP), over the columns (no longer needed). */
    if (gt_gl_gemm(l, 1, 0, CKK, BP, s->K, w, CKK, t, BP, 0.0f, col, BP, err) != 0)
        return -1;
    size_t in_len = (size_t)B * s->C * s->H * s->W;
    col2im_kernel<<<blocks_for(in_len), THREADS, 0, l->stream>>>(dx, col, *s, B);
    KERNEL_CHECK();
    return 0;
}

/* ---- pooling ------------------------------------------------------------------------------- */

/* relu: y = max(window max, 0), the ReLU LeNet applies after each pool (they commute). */
static __global__ void maxpool_kernel(float *y, int32_t *arg, const float *x, int BC, int H, int W,
                                      int k, int stride, int OH, int OW, int relu)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)BC * OH * OW)
        return;
    int pl = (int)(o / ((size_t)OH * OW)), oy = (int)(o / OW % OH), ox = (int)(o % OW);
    const float *xp = x + (size_t)pl * H * W;
    int best = oy * stride * W + ox * stride;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            int at = (oy * stride + i) * W + ox * stride + j;
            if (xp[at] > xp[best])
                best = at;
        }
    y[o] = relu && !(xp[best] > 0.0f) ? 0.0f : xp[best]; /* relu_kernel's test, -0 and NaN too */
    arg[o] = best;
}

/* The gradient one pool output routes to its input's maximum: zero where a fused ReLU cut the
 * output (y <= 0), scaled by the plane's dropout factor where dropout2d preceded the pool. */
static __device__ float routed_grad(const float *dy, const float *y, const float *mask, size_t o,
                                    size_t plane)
{
    if (y && y[o] <= 0.0f)
        return 0.0f;
    return mask ? dy[o] * mask[plane] : dy[o];
}

/* dx was zeroed; overlapping windows may route to one input, hence the atomic add. */
static __global__ void maxpool_back_kernel(float *dx, const float *dy, const int32_t *arg,
                                           const float *y, const float *mask, int BC, int HW,
                                           int OHW)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)BC * OHW)
        return;
    atomicAdd(&dx[o / OHW * HW + arg[o]], routed_grad(dy, y, mask, o, o / OHW));
}

/* Windows that tile the plane exactly (k == stride, as LeNet's): each output writes its whole
 * window, the gradient at the maximum and zero elsewhere, so dx needs no clearing first. */
static __global__ void maxpool_back_tiled_kernel(float *dx, const float *dy, const int32_t *arg,
                                                 const float *y, const float *mask, int BC, int W,
                                                 int k, int OH, int OW)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)BC * OH * OW)
        return;
    size_t pl = o / ((size_t)OH * OW);
    int oy = (int)(o / OW % OH), ox = (int)(o % OW);
    float g = routed_grad(dy, y, mask, o, pl);
    float *dp = dx + pl * (size_t)OH * k * W;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            int at = (oy * k + i) * W + ox * k + j;
            dp[at] = at == arg[o] ? g : 0.0f;
        }
}

static __global__ void avgpool_kernel(float *y, const float *x, int BC, int H, int W, int k,
                                      int stride, int OH, int OW)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)BC * OH * OW)
        return;
    int pl = (int)(o / ((size_t)OH * OW)), oy = (int)(o / OW % OH), ox = (int)(o % OW);
    const float *xp = x + (size_t)pl * H * W;
    double s = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            s += xp[(oy * stride + i) * W + ox * stride + j];
    y[o] = (float)(s / (k * k));
}

static __global__ void avgpool_back_kernel(float *dx, const float *dy, int BC, int H, int W, int k,
                                           int stride, int OH, int OW)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)BC * OH * OW)
        return;
    int pl = (int)(o / ((size_t)OH * OW)), oy = (int)(o / OW % OH), ox = (int)(o % OW);
    float g = dy[o] / (float)(k * k);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            atomicAdd(&dx[(size_t)pl * H * W + (oy * stride + i) * W + ox * stride + j], g);
}

int gt_gl_maxpool2d_forward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *x,
                            float *y, int32_t *arg, int relu, gt_err *err)
{
    int rank = l->rank, OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    size_t n = (size_t)BC * OH * OW;
    maxpool_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(y, arg, x, BC, H, W, k, stride, OH, OW,
                                                             relu);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_maxpool2d_backward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *dy,
                             const int32_t *arg, const float *y, const float *mask, float *dx,
                             gt_err *err)
{
    int rank = l->rank, OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    size_t n = (size_t)BC * OH * OW;
    if (k == stride && OH * k == H && OW * k == W) {
        maxpool_back_tiled_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dx, dy, arg, y, mask,
                                                                            BC, W, k, OH, OW);
        KERNEL_CHECK();
        return 0;
    }
    CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)BC * H * W * sizeof(float), l->stream));
    maxpool_back_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dx, dy, arg, y, mask, BC, H * W,
                                                                  OH * OW);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_avgpool2d_forward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *x,
                            float *y, gt_err *err)
{
    int rank = l->rank, OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    size_t n = (size_t)BC * OH * OW;
    avgpool_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(y, x, BC, H, W, k, stride, OH, OW);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_avgpool2d_backward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *dy,
                             float *dx, gt_err *err)
{
    int rank = l->rank, OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    size_t n = (size_t)BC * OH * OW;
    CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)BC * H * W * sizeof(float), l->stream));
    avgpool_back_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dx, dy, BC, H, W, k, stride, OH,
                                                                  OW);
    KERNEL_CHECK();
    return 0;
}

/* ---- dropout and element-wise -------------------------------------------------------------- */

/* One thread per element of x (B, units, per): each computes its unit's factor (a hash, cheaper
 * than a second launch) and the first of the unit's elements records it in mask. */
static __global__ void dropout_kernel(float *x, float *mask, size_t n, int units, int per, float p,
                                      float keep, uint64_t key, const int64_t *ids)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    size_t q = i / per;
    int row = (int)(q / units), u = (int)(q % units);
    float m = gt_dropout_unit(key, ids ? ids[row] : row, u, p, keep);
    if (i % per == 0)
        mask[q] = m;
    x[i] *= m;
}

static __global__ void dropout_apply_kernel(float *x, const float *mask, size_t n, int per)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= mask[i / per];
}

static __global__ void relu_kernel(float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static __global__ void relu_back_kernel(float *dx, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && y[i] <= 0.0f)
        dx[i] = 0.0f;
}

static __global__ void add_relu_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float v = a[i] + b[i];
    out[i] = v > 0.0f ? v : 0.0f;
}

static __global__ void relu_grad_kernel(float *dst, const float *dy, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static __global__ void add_kernel(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] += src[i];
}

static __global__ void scale_kernel(float *x, float s, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= s;
}

int gt_gl_dropout(gt_gl *l, float *x, float *mask, int B, int units, int per, float p, uint64_t key,
                  const int64_t *ids, gt_err *err)
{
    int rank = l->rank;
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* gt_dropout_mask's expression */
    size_t n = (size_t)B * units * per;
    dropout_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(x, mask, n, units, per, p, keep, key,
                                                             ids);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_dropout_apply(gt_gl *l, float *x, const float *mask, int B, int units, int per,
                        gt_err *err)
{
    int rank = l->rank;
    size_t n = (size_t)B * units * per;
    dropout_apply_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(x, mask, n, per);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_relu(gt_gl *l, float *x, size_t n, gt_err *err)
{
    int rank = l->rank;
    relu_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(x, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_relu_backward(gt_gl *l, float *dx, const float *y, size_t n, gt_err *err)
{
    int rank = l->rank;
    relu_back_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dx, y, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_add_relu(gt_gl *l, float *out, const float *a, const float *b, size_t n, gt_err *err)
{
    int rank = l->rank;
    add_relu_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(out, a, b, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_relu_grad(gt_gl *l, float *dst, const float *dy, const float *y, size_t n, gt_err *err)
{
    int rank = l->rank;
    relu_grad_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dst, dy, y, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_add(gt_gl *l, float *dst, const float *src, size_t n, gt_err *err)
{
    int rank = l->rank;
    add_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dst, src, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_scale(gt_gl *l, float *x, float s, size_t n, gt_err *err)
{
    int rank = l->rank;
    scale_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(x, s, n);
    KERNEL_CHECK();
    return 0;
}

/* ---- linear -------------------------------------------------------------------------------- */

static __global__ void add_bias_kernel(float *Y, const float *b, int B, int out, int relu)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * out)
        return;
    float v = Y[i] + b[i % out];
    Y[i] = relu && !(v > 0.0f) ? 0.0f : v;
}

/* db[j] = sum over rows of dY[:, j], rows in order as on the CPU; one thread per column. */
static __global__ void col_sums_kernel(float *db, const float *dY, int B, int out)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= out)
        return;
    float s = 0.0f;
    for (int i = 0; i < B; i++)
        s += dY[(size_t)i * out + j];
    db[j] = s;
}

int gt_gl_linear_forward(gt_gl *l, const float *X, int B, int in, int out, const float *W,
                         const float *b, float *Y, int relu, gt_err *err)
{
    int rank = l->rank;
    if (gt_gl_gemm(l, 0, 1, B, out, in, X, in, W, in, 0.0f, Y, out, err) != 0)
        return -1;
    add_bias_kernel<<<blocks_for((size_t)B * out), THREADS, 0, l->stream>>>(Y, b, B, out, relu);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_linear_backward(gt_gl *l, const float *X, const float *dY, int B, int in, int out,
                          const float *W, float *dW, float *db, float *dX, gt_err *err)
{
    int rank = l->rank;
    if (gt_gl_gemm(l, 1, 0, out, in, B, dY, out, X, in, 0.0f, dW, in, err) != 0)
        return -1;
    col_sums_kernel<<<blocks_for((size_t)out), THREADS, 0, l->stream>>>(db, dY, B, out);
    KERNEL_CHECK();
    if (dX && gt_gl_gemm(l, 0, 0, B, in, out, dY, out, W, in, 0.0f, dX, in, err) != 0)
        return -1;
    return 0;
}

/* ---- BatchNorm ----------------------------------------------------------------------------- */

/* v[c] = sum of a over channel c of (B, C, HW), v[C+c] = of a*b (b NULL: a*a), in double as
 * layers.c's channel_sums; v[2C] = B*HW, the element count a SyncBatchNorm reduce adds up.
 * One block per channel. */
static __global__ void bn_sums_kernel(double *v, const float *a, const float *b, int B, int C,
                                      int HW)
{
    __shared__ double s1[THREADS], s2[THREADS];
    int c = blockIdx.x;
    double x1 = 0, x2 = 0;
    for (size_t j = threadIdx.x; j < (size_t)B * HW; j += blockDim.x) {
        size_t o = ((j / HW) * C + c) * HW + j % HW;
        float av = a[o], bv = b ? b[o] : av;
        x1 += av;
        x2 += (double)av * bv;
    }
    s1[threadIdx.x] = x1;
    s2[threadIdx.x] = x2;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            s1[threadIdx.x] += s1[threadIdx.x + w];
            s2[threadIdx.x] += s2[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        v[c] = s1[0];
        v[C + c] = s2[0];
        if (c == 0)
            v[2 * C] = (double)B * HW;
    }
}

/* Per channel: batch mean and invstd from the (reduced) sums, and the running statistics
 * (unbiased variance, momentum 0.1), term by term as gt_bn_forward_train. */
static __global__ void bn_stats_kernel(const double *v, int C, float *mean, float *invstd,
                                       float *run_mean, float *run_var)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double N = v[2 * C], mu = v[c] / N, var = v[C + c] / N - mu * mu;
    var = var > 0 ? var : 0;
    mean[c] = (float)mu;
    invstd[c] = (float)(1.0 / sqrt(var + GT_BN_EPS));
    double unbiased = N > 1 ? var * N / (N - 1) : var;
    run_mean[c] = (float)((1 - GT_BN_MOMENTUM) * run_mean[c] + GT_BN_MOMENTUM * mu);
    run_var[c] = (float)((1 - GT_BN_MOMENTUM) * run_var[c] + GT_BN_MOMENTUM * unbiased);
}

static __global__ void bn_apply_kernel(float *y, const float *x, const float *mean,
                                       const float *invstd, const float *gamma, const float *beta,
                                       int C, int HW, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int c = (int)(i / HW % C);
    y[i] = (x[i] - mean[c]) * invstd[c] * gamma[c] + beta[c];
}

static __global__ void bn_eval_kernel(float *y, const float *x, const float *run_mean,
                                      const float *run_var, const float *gamma, const float *beta,
                                      int C, int HW, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int c = (int)(i / HW % C);
    float inv = (float)(1.0 / sqrt((double)run_var[c] + GT_BN_EPS));
    y[i] = (x[i] - run_mean[c]) * inv * gamma[c] + beta[c];
}

/* Backward's per-channel step before the reduction: v[C+c] becomes sum(dy * xhat), and the
 * local dbeta, dgamma are taken (as gt_bn_backward). */
static __global__ void bn_back_prep_kernel(double *v, int C, const float *mean, const float *invstd,
                                           float *dgamma, float *dbeta)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    v[C + c] = invstd[c] * (v[C + c] - mean[c] * v[c]);
    dbeta[c] = (float)v[c];
    dgamma[c] = (float)v[C + c];
}

static __global__ void bn_back_dx_kernel(float *dx, const float *x, const float *dy,
                                         const double *v, const float *gamma, const float *mean,
                                         const float *invstd, int C, int HW, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int c = (int)(i / HW % C);
    double N = v[2 * C], mdy = v[c] / N, mdyx = v[C + c] / N;
    double xhat = (x[i] - mean[c]) * invstd[c];
    dx[i] = (float)(gamma[c] * invstd[c] * (dy[i] - mdy - xhat * mdyx));
}

/* Sums l->sums (2C+1) over ranks through the host: copy out, reduce, copy back. */
static int reduce_sums(gt_gl *l, int C, gt_reduce_fn reduce, void *ctx, gt_err *err)
{
    int rank = l->rank;
    size_t bytes = (2 * (size_t)C + 1) * sizeof(double);
    if (!reduce)
        return 0;
    CUDA_CHECK(cudaMemcpyAsync(l->host_sums, l->sums, bytes, cudaMemcpyDeviceToHost, l->stream));
    CUDA_CHECK(cudaStreamSynchronize(l->stream));
    if (reduce(ctx, l->host_sums, 2 * (size_t)C + 1) != 0)
        return gt_errf(err, "rank %d: SyncBatchNorm: the reduction over ranks failed", rank);
    /* Pinned memory: the copy reads host_sums asynchronously, and nothing writes it before
     * the next reduce, which first waits for this stream. */
    CUDA_CHECK(cudaMemcpyAsync(l->sums, l->host_sums, bytes, cudaMemcpyHostToDevice, l->stream));
    return 0;
}

static int check_channels(gt_gl *l, int C, gt_err *err)
{
    if (C < 1 || C > GT_BN_MAX_C)
        return gt_errf(err, "rank %d: BatchNorm over %d channels (at most %d)", l->rank, C,
                       GT_BN_MAX_C);
    return 0;
}

int gt_gl_bn_forward_train(gt_gl *l, int B, int C, int HW, const float *x, const float *gamma,
                           const float *beta, float *y, float *mean, float *invstd, float *run_mean,
                           float *run_var, gt_reduce_fn reduce, void *ctx, gt_err *err)
{
    int rank = l->rank;
    size_t n = (size_t)B * C * HW;
    if (check_channels(l, C, err) != 0)
        return -1;
    bn_sums_kernel<<<C, THREADS, 0, l->stream>>>(l->sums, x, NULL, B, C, HW);
    KERNEL_CHECK();
    if (reduce_sums(l, C, reduce, ctx, err) != 0)
        return -1;
    bn_stats_kernel<<<blocks_for((size_t)C), THREADS, 0, l->stream>>>(l->sums, C, mean, invstd,
                                                                      run_mean, run_var);
    KERNEL_CHECK();
    bn_apply_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(y, x, mean, invstd, gamma, beta, C,
                                                              HW, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_bn_forward_eval(gt_gl *l, int B, int C, int HW, const float *x, const float *gamma,
                          const float *beta, const float *run_mean, const float *run_var, float *y,
                          gt_err *err)
{
    int rank = l->rank;
    size_t n = (size_t)B * C * HW;
    bn_eval_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(y, x, run_mean, run_var, gamma, beta,
                                                             C, HW, n);
    KERNEL_CHECK();
    return 0;
}

int gt_gl_bn_backward(gt_gl *l, int B, int C, int HW, const float *x, const float *dy,
                      const float *gamma, const float *mean, const float *invstd, float *dx,
                      float *dgamma, float *dbeta, gt_reduce_fn reduce, void *ctx, gt_err *err)
{
    int rank = l->rank;
    size_t n = (size_t)B * C * HW;
    if (check_channels(l, C, err) != 0)
        return -1;
    bn_sums_kernel<<<C, THREADS, 0, l->stream>>>(l->sums, dy, x, B, C, HW);
    KERNEL_CHECK();
    bn_back_prep_kernel<<<blocks_for((size_t)C), THREADS, 0, l->stream>>>(l->sums, C, mean, invstd,
                                                                          dgamma, dbeta);
    KERNEL_CHECK();
    if (reduce_sums(l, C, reduce, ctx, err) != 0)
        return -1;
    bn_back_dx_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(dx, x, dy, l->sums, gamma, mean,
                                                                invstd, C, HW, n);
    KERNEL_CHECK();
    return 0;
}

/* ---- loss scaling -------------------------------------------------------------------------- */

static __global__ void nonfinite_kernel(int *flag, const float *g, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !isfinite(g[i]))
        *flag = 1; /* every writer writes the same value: no atomic needed */
}

int gt_gl_nonfinite(gt_gl *l, const float *g, size_t n, int *nonfinite, gt_err *err)
{
    int rank = l->rank;
    CUDA_CHECK(cudaMemsetAsync(l->flag, 0, sizeof(int), l->stream));
    nonfinite_kernel<<<blocks_for(n), THREADS, 0, l->stream>>>(l->flag, g, n);
    KERNEL_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(nonfinite, l->flag, sizeof(int), cudaMemcpyDeviceToHost, l->stream));
    CUDA_CHECK(cudaStreamSynchronize(l->stream));
    return 0;
}
