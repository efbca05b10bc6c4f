/* layers.h: the CPU layers the convolutional models are built from, as plain functions on
 * caller-owned NCHW float buffers: conv2d (im2col + GEMM through gt_gemm_ex), max pooling with
 * its argmax kept for the backward pass, and dropout / dropout2d masks drawn from a
 * counter-based hash of (key, sample, unit). The hash makes a mask a pure function of the step
 * and the dataset index of the sample, so a sample gets the same mask whichever rank holds it
 * (1 rank x 64 equals 2 ranks x 32) and a resumed run draws exactly what the straight run drew. */
#ifndef GT_LAYERS_H
#define GT_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* A conv2d's geometry: input (B, C, H, W), weight (K, C, k, k), output (B, K, OH, OW). */
typedef struct gt_conv2d {
    int C, H, W;     /* input channels and size */
    int K, k;        /* output channels, square kernel side */
    int stride, pad; /* as nn.Conv2d's (zero padding) */
    int OH, OW;      /* output size, derived */
} gt_conv2d;

/* Fills s and its output size; returns -1 when the kernel does not fit the padded input. */
int gt_conv2d_init(gt_conv2d *s, int C, int H, int W, int K, int k, int stride, int pad);
/* Floats of im2col scratch one call needs: (C*k*k, OH*OW). */
size_t gt_conv2d_col_len(const gt_conv2d *s);
/* y (B, K, OH, OW) = conv(x (B, C, H, W), w (K, C, k, k)) + b (K) (b NULL: no bias). col:
 * scratch. */
void gt_conv2d_forward(const gt_conv2d *s, int B, const float *x, const float *w, const float *b,
                       float *y, float *col);
/* From dy (B, K, OH, OW): overwrites dw (K, C, k, k) and, unless NULL, db (K) and dx (B, C, H,
 * W). */
void gt_conv2d_backward(const gt_conv2d *s, int B, const float *x, const float *w, const float *dy,
                        float *dw, float *db, float *dx, float *col);

/* Max pooling with a square window k and stride (no padding, floor mode, as F.max_pool2d):
 * x (B*C planes of H x W) -> y (B*C planes of OH x OW); arg receives each output's input offset
 * within its plane. Ties go to the first maximum in row-major order. */
void gt_maxpool2d_forward(int BC, int H, int W, int k, int stride, const float *x, float *y,
                          int32_t *arg);
/* Overwrites dx (B*C planes of H x W) with dy routed to each window's maximum. */
void gt_maxpool2d_backward(int BC, int H, int W, int k, int stride, const float *dy,
                           const int32_t *arg, float *dx);

/* Average pooling, square window k and stride, no padding, floor mode (F.avg_pool2d); k = H =
 * W is global average pooling. Sums in double. */
void gt_avgpool2d_forward(int BC, int H, int W, int k, int stride, const float *x, float *y);
/* Overwrites dx with each output's gradient spread evenly over its window. */
void gt_avgpool2d_backward(int BC, int H, int W, int k, int stride, const float *dy, float *dx);

/* Draws a dropout mask (B, units): 0 with probability p, else 1/(1-p), unit u of sample i from
 * hash(key, ids[i], u) (ids NULL: i). dropout uses one unit per element, dropout2d one per channel.
 */
void gt_dropout_mask(float *mask, int B, int units, float p, uint64_t key, const int64_t *ids);
/* x (B, units, per) *= mask (B, units), in place; the same call applies the backward pass. */
void gt_dropout_apply(float *x, const float *mask, int B, int units, int per);

/* x = max(x, 0) in place. */
void gt_relu(float *x, size_t len);
/* dx = 0 wherever the ReLU's output y was clamped to 0. */
void gt_relu_backward(float *dx, const float *y, size_t len);
/* Y (B, out) = X (B, in) W^T + b, as nn.Linear. */
void gt_linear_forward(const float *X, int B, int in, int out, const float *W, const float *b,
                       float *Y);
/* dW (out, in), db (out) and, unless NULL, dX (B, in) from dY (B, out). */
void gt_linear_backward(const float *X, const float *dY, int B, int in, int out, const float *W,
                        float *dW, float *db, float *dX);

/* BatchNorm2d over x (B, C, HW), as nn.BatchNorm2d with eps 1e-5 and momentum 0.1. */
#define GT_BN_EPS      1e-5
#define GT_BN_MOMENTUM 0.1
#define GT_BN_MAX_C    1024

/* Sums v (n doubles) over all ranks in place; returns 0, or -1 having filled its own error.
 * NULL means one rank (plain BatchNorm under DDP); a real one makes it SyncBatchNorm. */
typedef gt_model_reduce_fn gt_reduce_fn;

/* Training forward: normalises with the batch's mean and biased variance (over every rank
 * through reduce), writes y and the per-channel mean and invstd (C) the backward needs, and
 * moves run_mean / run_var (unbiased variance) by the momentum. Returns -1 when reduce failed
 * (the local statistics are then used and the running ones are left alone). */
int gt_bn_forward_train(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                        float *y, float *mean, float *invstd, float *run_mean, float *run_var,
                        gt_reduce_fn reduce, void *ctx);
/* Evaluation forward with the running statistics. */
void gt_bn_forward_eval(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                        const float *run_mean, const float *run_var, float *y);
/* Backward of the last training forward on x: overwrites dx, dgamma and dbeta (C). With reduce,
 * the sums of dy and dy*xhat are reduced over ranks as torch.nn.SyncBatchNorm does (dgamma and
 * dbeta stay local: DDP averages them). Returns -1 when reduce failed. */
int gt_bn_backward(int B, int C, int HW, const float *x, const float *dy, const float *gamma,
                   const float *mean, const float *invstd, float *dx, float *dgamma, float *dbeta,
                   gt_reduce_fn reduce, void *ctx);

/* A key for one dropout layer of one optimiser step of a run seeded with seed. */
uint64_t gt_dropout_key(uint64_t seed, int64_t step, int layer);

#endif
