/* gpu_layers.h: the CUDA twins of layers.h, llm.c style: plain kernels plus cuBLAS GEMMs, on
 * device buffers in the CPU path's NCHW layouts, each launched on the context's stream. Every
 * function mirrors the layers.h function of the same name term by term (same reductions in
 * double, same dropout hash through layer_index.h), so the two paths differ only in summation
 * order. GEMMs honour the context's precision as the CPU emulation does: bf16/fp16 round both
 * inputs to 16 bits and accumulate in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F); fp32 uses
 * cublasSgemm without TF32, as PyTorch's default.
 * Every function returns 0, or -1 with a message naming the rank, file and line of the failing
 * call (gpu_check.h). Pointers are device memory unless said otherwise. Built only with CUDA. */
#ifndef GT_GPU_LAYERS_H
#define GT_GPU_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gt_err.h"
#include "layers.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's launch context: its stream and cuBLAS handle, the GEMM precision, and scratch. */
typedef struct gt_gl {
    int rank;
    cudaStream_t stream; /* non-blocking: not ordered after the legacy default stream */
    cublasHandle_t blas; /* bound to stream */
    gt_precision prec;
    uint16_t *half;    /* (half_cap) 16-bit copies of both GEMM operands, grown on demand */
    size_t half_cap;   /* elements */
    double *sums;      /* (2 * GT_BN_MAX_C + 1) BatchNorm per-channel sums and the count */
    double *host_sums; /* pinned host copy of sums, for a SyncBatchNorm reduction */
    int *flag;         /* (1) gt_gl_nonfinite's answer */
} gt_gl;

/* Creates the stream, the cuBLAS handle and the scratch on the current device. On failure the
 * context holds nothing that needs releasing beyond what gt_gl_release frees (call it anyway). */
int gt_gl_init(gt_gl *l, int rank, gt_precision prec, gt_err *err);
/* Frees what init made; safe on a zeroed or half-initialised context. */
void gt_gl_release(gt_gl *l);

/* Row-major C (M, N) = op(A) op(B) + beta C (beta 0 never reads C), in l->prec. */
int gt_gl_gemm(gt_gl *l, int ta, int tb, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc, gt_err *err);

/* Floats of scratch a conv2d of B samples needs: the batch's im2col columns (C*k*k, B*OH*OW)
 * and the output in (K, B*OH*OW) order. */
size_t gt_gl_conv2d_scratch_len(const gt_conv2d *s, int B);
/* As gt_conv2d_forward: y (B, K, OH, OW) = conv(x (B, C, H, W), w) + b (b NULL: no bias). */
int gt_gl_conv2d_forward(gt_gl *l, const gt_conv2d *s, int B, const float *x, const float *w,
                         const float *b, float *y, float *scratch, gt_err *err);
/* As gt_conv2d_backward: overwrites dw and, unless NULL, db and dx. */
int gt_gl_conv2d_backward(gt_gl *l, const gt_conv2d *s, int B, const float *x, const float *w,
                          const float *dy, float *dw, float *db, float *dx, float *scratch,
                          gt_err *err);

/* As gt_maxpool2d_forward / _backward (first maximum wins; arg is the offset in its plane).
 * Fused, to spare LeNet's steps kernel launches (its GPU step is bound by their count): relu
 * applies the ReLU that follows the pool; backward then takes that output as y (the gradient
 * passes where y > 0; NULL: no ReLU) and mask, the factor per plane of a dropout2d that came
 * before the pool (NULL: none). */
int gt_gl_maxpool2d_forward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *x,
                            float *y, int32_t *arg, int relu, gt_err *err);
int gt_gl_maxpool2d_backward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *dy,
                             const int32_t *arg, const float *y, const float *mask, float *dx,
                             gt_err *err);
/* As gt_avgpool2d_forward / _backward. */
int gt_gl_avgpool2d_forward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *x,
                            float *y, gt_err *err);
int gt_gl_avgpool2d_backward(gt_gl *l, int BC, int H, int W, int k, int stride, const float *dy,
                             float *dx, gt_err *err);

/* As gt_dropout_mask then gt_dropout_apply, in one pass: mask (B, units) gets the same masks,
 * with ids (B dataset indices) in device memory or NULL, and x (B, units, per) *= mask. */
int gt_gl_dropout(gt_gl *l, float *x, float *mask, int B, int units, int per, float p, uint64_t key,
                  const int64_t *ids, gt_err *err);
/* As gt_dropout_apply: x (B, units, per) *= mask (B, units). */
int gt_gl_dropout_apply(gt_gl *l, float *x, const float *mask, int B, int units, int per,
                        gt_err *err);

/* x = max(x, 0). */
int gt_gl_relu(gt_gl *l, float *x, size_t n, gt_err *err);
/* dx = 0 wherever y <= 0 (in place, as gt_relu_backward). */
int gt_gl_relu_backward(gt_gl *l, float *dx, const float *y, size_t n, gt_err *err);
/* The residual block's end: out = max(a + b, 0). */
int gt_gl_add_relu(gt_gl *l, float *out, const float *a, const float *b, size_t n, gt_err *err);
/* dst = y > 0 ? dy : 0 (the gradient through that ReLU, out of place). */
int gt_gl_relu_grad(gt_gl *l, float *dst, const float *dy, const float *y, size_t n, gt_err *err);
/* dst += src (the residual shortcut's gradient). */
int gt_gl_add(gt_gl *l, float *dst, const float *src, size_t n, gt_err *err);
/* x *= s. */
int gt_gl_scale(gt_gl *l, float *x, float s, size_t n, gt_err *err);

/* As gt_linear_forward / _backward (dX NULL: not computed); relu: Y = max(Y, 0) after the bias. */
int gt_gl_linear_forward(gt_gl *l, const float *X, int B, int in, int out, const float *W,
                         const float *b, float *Y, int relu, gt_err *err);
int gt_gl_linear_backward(gt_gl *l, const float *X, const float *dY, int B, int in, int out,
                          const float *W, float *dW, float *db, float *dX, gt_err *err);

/* As gt_bn_forward_train. reduce (a host function, may be NULL) sums the 2C+1 statistics over
 * ranks: the stream is synchronised around it. A failed reduce returns -1 with err saying so
 * (the reduce's own message is in its ctx) and leaves the running statistics alone. */
int gt_gl_bn_forward_train(gt_gl *l, int B, int C, int HW, const float *x, const float *gamma,
                           const float *beta, float *y, float *mean, float *invstd, float *run_mean,
                           float *run_var, gt_reduce_fn reduce, void *ctx, gt_err *err);
/* As gt_bn_forward_eval. */
int gt_gl_bn_forward_eval(gt_gl *l, int B, int C, int HW, const float *x, const float *gamma,
                          const float *beta, const float *run_mean, const float *run_var, float *y,
                          gt_err *err);
/* As gt_bn_backward (dgamma and dbeta stay local; dx uses the reduced sums). */
int gt_gl_bn_backward(gt_gl *l, int B, int C, int HW, const float *x, const float *dy,
                      const float *gamma, const float *mean, const float *invstd, float *dx,
                      float *dgamma, float *dbeta, gt_reduce_fn reduce, void *ctx, gt_err *err);

/* Sets *nonfinite (host) to whether g (n) holds an inf or NaN; synchronises the stream. */
int gt_gl_nonfinite(gt_gl *l, const float *g, size_t n, int *nonfinite, gt_err *err);

#ifdef __cplusplus
}
#endif

#endif
