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
/* y (B, K, OH, OW) = conv(x (B, C, H, W), w (K, C, k, k)) + b (K). col: scratch. */
void gt_conv2d_forward(const gt_conv2d *s, int B, const float *x, const float *w, const float *b,
                       float *y, float *col);
/* From dy (B, K, OH, OW): overwrites dw (K, C, k, k), db (K) and, unless NULL, dx (B, C, H, W). */
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

/* Draws a dropout mask (B, units): 0 with probability p, else 1/(1-p), unit u of sample i from
 * hash(key, ids[i], u) (ids NULL: i). dropout uses one unit per element, dropout2d one per channel.
 */
void gt_dropout_mask(float *mask, int B, int units, float p, uint64_t key, const int64_t *ids);
/* x (B, units, per) *= mask (B, units), in place; the same call applies the backward pass. */
void gt_dropout_apply(float *x, const float *mask, int B, int units, int per);

/* A key for one dropout layer of one optimiser step of a run seeded with seed. */
uint64_t gt_dropout_key(uint64_t seed, int64_t step, int layer);

#endif
