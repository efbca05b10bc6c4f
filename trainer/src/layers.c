/* layers.c: CPU conv2d, max pooling and dropout. Convolutions unfold one sample at a time
 * (im2col), so the scratch is one sample's columns and the GEMMs stay BLAS-sized; gradients of
 * the weights accumulate over the batch through gt_gemm_ex's beta. */
#include "layers.h"

#include <math.h>
#include <string.h>

#include "layer_index.h"
#include "model.h"

int gt_conv2d_init(gt_conv2d *s, int C, int H, int W, int K, int k, int stride, int pad)
{
    memset(s, 0, sizeof(*s));
    if (C < 1 || K < 1 || k < 1 || stride < 1 || pad < 0 || H + 2 * pad < k || W + 2 * pad < k)
        return -1;
    *s = (gt_conv2d){.C = C, .H = H, .W = W, .K = K, .k = k, .stride = stride, .pad = pad};
    s->OH = (H + 2 * pad - k) / stride + 1;
    s->OW = (W + 2 * pad - k) / stride + 1;
    return 0;
}

size_t gt_conv2d_col_len(const gt_conv2d *s)
{
    return (size_t)s->C * s->k * s->k * s->OH * s->OW;
}

/* The output columns ox in [*lo, *hi) whose tap kj lands inside a row of width W: ix = ox *
 * stride - pad + kj in [0, W). Outside it the tap reads padding. */
static void tap_span(const gt_conv2d *s, int kj, int *lo, int *hi)
{
    int a = s->pad - kj, b = s->W + s->pad - kj; /* ox * stride in [a, b) */
    *lo = a > 0 ? (a + s->stride - 1) / s->stride : 0;
    *hi = b > 0 ? (b + s->stride - 1) / s->stride : 0;
    *lo = *lo < s->OW ? *lo : s->OW;
    *hi = *hi < s->OW ? *hi : s->OW;
    *hi = *hi > *lo ? *hi : *lo;
}

/* col (C*k*k, OH*OW) from one sample x (C, H, W); padding reads as zero. Row by row: the taps of
 * one output row that fall inside the input are one span, so no element pays a bounds test (the
 * per-element test was half of a ResNet step). layer_index.h's gt_im2col_src, which the CUDA
 * kernel uses, is the definition; test_layers (finite differences, strides and padding) and
 * test_torch_steps (PyTorch) check the convolutions built on this one. */
static void im2col(const gt_conv2d *s, const float *x, float *col)
{
    int P = s->OH * s->OW;
    for (int c = 0; c < s->C; c++)
        for (int ki = 0; ki < s->k; ki++)
            for (int kj = 0; kj < s->k; kj++) {
                float *row = col + (size_t)((c * s->k + ki) * s->k + kj) * P;
                int lo, hi;
                tap_span(s, kj, &lo, &hi);
                for (int oy = 0; oy < s->OH; oy++) {
                    float *out = row + (size_t)oy * s->OW;
                    int iy = oy * s->stride - s->pad + ki;
                    int lo_y = lo, hi_y = hi;
                    if (iy < 0 || iy >= s->H)
                        lo_y = hi_y = 0;
                    const float *in = x + ((size_t)c * s->H + (lo_y < hi_y ? iy : 0)) * s->W;
                    int shift = kj - s->pad; /* ix = ox * stride + shift, >= 0 from lo on */
                    /* rows are short (7 to 28): plain loops beat memset/memcpy calls here */
                    for (int ox = 0; ox < lo_y; ox++)
                        out[ox] = 0.0f;
                    if (s->stride == 1)
                        for (int ox = lo_y; ox < hi_y; ox++)
                            out[ox] = in[ox + shift];
                    else
                        for (int ox = lo_y; ox < hi_y; ox++)
                            out[ox] = in[ox * s->stride + shift];
                    for (int ox = hi_y; ox < s->OW; ox++)
                        out[ox] = 0.0f;
                }
            }
}

/* The adjoint of im2col: adds col's entries back onto dx (C, H, W), which the caller zeroed. */
static void col2im(const gt_conv2d *s, const float *col, float *dx)
{
    int P = s->OH * s->OW;
    for (int c = 0; c < s->C; c++)
        for (int ki = 0; ki < s->k; ki++)
            for (int kj = 0; kj < s->k; kj++) {
                const float *row = col + (size_t)((c * s->k + ki) * s->k + kj) * P;
                int lo, hi;
                tap_span(s, kj, &lo, &hi);
                for (int oy = 0; oy < s->OH; oy++) {
                    int iy = oy * s->stride - s->pad + ki;
                    if (iy < 0 || iy >= s->H)
                        continue;
                    const float *in = row + (size_t)oy * s->OW;
                    float *out = dx + ((size_t)c * s->H + iy) * s->W;
                    int shift = kj - s->pad;
                    for (int ox = lo; ox < hi; ox++)
                        out[ox * s->stride + shift] += in[ox];
                }
            }
}

void gt_conv2d_forward(const gt_conv2d *s, int B, const float *x, const float *w, const float *b,
                       float *y, float *col)
{
    int P = s->OH * s->OW, CKK = s->C * s->k * s->k;
    for (int n = 0; n < B; n++) {
        float *yn = y + (size_t)n * s->K * P; /* (K, P) */
        im2col(s, x + (size_t)n * s->C * s->H * s->W, col);
        gt_gemm(0, 0, s->K, P, CKK, w, CKK, col, P, yn, P);
        for (int k = 0; b && k < s->K; k++)
            for (int p = 0; p < P; p++)
                yn[(size_t)k * P + p] += b[k];
    }
}

void gt_conv2d_backward(const gt_conv2d *s, int B, const float *x, const float *w, const float *dy,
                        float *dw, float *db, float *dx, float *col)
{
    int P = s->OH * s->OW, CKK = s->C * s->k * s->k;
    size_t in_len = (size_t)s->C * s->H * s->W;
    if (db)
        memset(db, 0, (size_t)s->K * sizeof(float));
    for (int n = 0; n < B; n++) {
        const float *dyn = dy + (size_t)n * s->K * P; /* (K, P) */
        im2col(s, x + (size_t)n * in_len, col);
        /* dw (K, CKK) (+)= dyn (K, P) * col^T (P, CKK); the first sample overwrites. */
        gt_gemm_ex(0, 1, s->K, CKK, P, dyn, P, col, P, n ? 1.0f : 0.0f, dw, CKK);
        for (int k = 0; db && k < s->K; k++)
            for (int p = 0; p < P; p++)
                db[k] += dyn[(size_t)k * P + p];
        if (!dx)
            continue;
        /* dcol (CKK, P) = w^T (CKK, K) * dyn (K, P), folded back onto the input. */
        gt_gemm(1, 0, CKK, P, s->K, w, CKK, dyn, P, col, P);
        memset(dx + (size_t)n * in_len, 0, in_len * sizeof(float));
        col2im(s, col, dx + (size_t)n * in_len);
    }
}

void gt_maxpool2d_forward(int BC, int H, int W, int k, int stride, const float *x, float *y,
                          int32_t *arg)
{
    int OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    for (int pl = 0; pl < BC; pl++) {
        const float *xp = x + (size_t)pl * H * W;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                int best = oy * stride * W + ox * stride;
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) {
                        int at = (oy * stride + i) * W + ox * stride + j;
                        if (xp[at] > xp[best])
                            best = at;
                    }
                size_t o = ((size_t)pl * OH + oy) * OW + ox;
                y[o] = xp[best];
                arg[o] = best;
            }
    }
}

void gt_maxpool2d_backward(int BC, int H, int W, int k, int stride, const float *dy,
                           const int32_t *arg, float *dx)
{
    int OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    memset(dx, 0, (size_t)BC * H * W * sizeof(float));
    for (int pl = 0; pl < BC; pl++)
        for (int o = 0; o < OH * OW; o++) {
            size_t i = (size_t)pl * OH * OW + o;
            dx[(size_t)pl * H * W + arg[i]] += dy[i];
        }
}

void gt_avgpool2d_forward(int BC, int H, int W, int k, int stride, const float *x, float *y)
{
    int OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    for (int pl = 0; pl < BC; pl++) {
        const float *xp = x + (size_t)pl * H * W;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                double s = 0; /* in double, as the ResNet's global pooling always summed */
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++)
                        s += xp[(oy * stride + i) * W + ox * stride + j];
                y[((size_t)pl * OH + oy) * OW + ox] = (float)(s / (k * k));
            }
    }
}

void gt_avgpool2d_backward(int BC, int H, int W, int k, int stride, const float *dy, float *dx)
{
    int OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
    memset(dx, 0, (size_t)BC * H * W * sizeof(float));
    for (int pl = 0; pl < BC; pl++)
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float g = dy[((size_t)pl * OH + oy) * OW + ox] / (float)(k * k);
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++)
                        dx[(size_t)pl * H * W + (oy * stride + i) * W + ox * stride + j] += g;
            }
}

/* v[0..C) += per-channel sums of a, v[C..2C) += of a*b (b NULL: a*a), over (B, C, HW). */
static void channel_sums(int B, int C, int HW, const float *a, const float *b, double *v)
{
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            const float *pa = a + ((size_t)n * C + c) * HW;
            const float *pb = b ? b + ((size_t)n * C + c) * HW : pa;
            double s = 0, s2 = 0;
            for (int i = 0; i < HW; i++) {
                s += pa[i];
                s2 += (double)pa[i] * pb[i];
            }
            v[c] += s;
            v[C + c] += s2;
        }
}

int gt_bn_forward_train(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                        float *y, float *mean, float *invstd, float *run_mean, float *run_var,
                        gt_reduce_fn reduce, void *ctx)
{
    double v[2 * GT_BN_MAX_C + 1] = {0};
    channel_sums(B, C, HW, x, NULL, v);
    v[2 * C] = (double)B * HW;
    int rc = reduce ? reduce(ctx, v, 2 * (size_t)C + 1) : 0;
    double N = v[2 * C];
    for (int c = 0; c < C; c++) {
        double mu = v[c] / N, var = v[C + c] / N - mu * mu;
        var = var > 0 ? var : 0;
        mean[c] = (float)mu;
        invstd[c] = (float)(1.0 / sqrt(var + GT_BN_EPS));
        if (rc == 0) {
            double unbiased = N > 1 ? var * N / (N - 1) : var;
            run_mean[c] = (float)((1 - GT_BN_MOMENTUM) * run_mean[c] + GT_BN_MOMENTUM * mu);
            run_var[c] = (float)((1 - GT_BN_MOMENTUM) * run_var[c] + GT_BN_MOMENTUM * unbiased);
        }
    }
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            size_t o = ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++)
                y[o + i] = (x[o + i] - mean[c]) * invstd[c] * gamma[c] + beta[c];
        }
    return rc;
}

void gt_bn_forward_eval(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                        const float *run_mean, const float *run_var, float *y)
{
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            size_t o = ((size_t)n * C + c) * HW;
            float inv = (float)(1.0 / sqrt((double)run_var[c] + GT_BN_EPS));
            for (int i = 0; i < HW; i++)
                y[o + i] = (x[o + i] - run_mean[c]) * inv * gamma[c] + beta[c];
        }
}

int gt_bn_backward(int B, int C, int HW, const float *x, const float *dy, const float *gamma,
                   const float *mean, const float *invstd, float *dx, float *dgamma, float *dbeta,
                   gt_reduce_fn reduce, void *ctx)
{
    /* v: sum(dy), sum(dy * x) per channel; sum(dy * xhat) = invstd * (sum(dy x) - mean sum(dy)). */
    double v[2 * GT_BN_MAX_C + 1] = {0};
    channel_sums(B, C, HW, dy, x, v);
    v[2 * C] = (double)B * HW;
    for (int c = 0; c < C; c++) {
        v[C + c] = invstd[c] * (v[C + c] - mean[c] * v[c]);
        dbeta[c] = (float)v[c];
        dgamma[c] = (float)v[C + c];
    }
    int rc = reduce ? reduce(ctx, v, 2 * (size_t)C + 1) : 0;
    double N = v[2 * C];
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            size_t o = ((size_t)n * C + c) * HW;
            double mdy = v[c] / N, mdyx = v[C + c] / N;
            for (int i = 0; i < HW; i++) {
                double xhat = (x[o + i] - mean[c]) * invstd[c];
                dx[o + i] = (float)(gamma[c] * invstd[c] * (dy[o + i] - mdy - xhat * mdyx));
            }
        }
    return rc;
}

void gt_relu(float *x, size_t len)
{
    for (size_t i = 0; i < len; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* dx = 0 wherever the ReLU's output y was clamped to 0. */
void gt_relu_backward(float *dx, const float *y, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (y[i] <= 0.0f)
            dx[i] = 0.0f;
}

/* Y (B, out) = X (B, in) W^T + b, as nn.Linear. */
void gt_linear_forward(const float *X, int B, int in, int out, const float *W, const float *b,
                       float *Y)
{
    gt_gemm(0, 1, B, out, in, X, in, W, in, Y, out);
    for (int i = 0; i < B; i++)
        for (int j = 0; j < out; j++)
            Y[(size_t)i * out + j] += b[j];
}

/* dW (out, in), db (out) and, unless NULL, dX (B, in) from dY (B, out). */
void gt_linear_backward(const float *X, const float *dY, int B, int in, int out, const float *W,
                        float *dW, float *db, float *dX)
{
    gt_gemm(1, 0, out, in, B, dY, out, X, in, dW, in);
    memset(db, 0, (size_t)out * sizeof(float));
    for (int i = 0; i < B; i++)
        for (int j = 0; j < out; j++)
            db[j] += dY[(size_t)i * out + j];
    if (dX)
        gt_gemm(0, 0, B, in, out, dY, out, W, in, dX, in);
}

uint64_t gt_dropout_key(uint64_t seed, int64_t step, int layer)
{
    return gt_mix64(gt_mix64(gt_mix64(seed) ^ (uint64_t)step) ^ (uint64_t)layer);
}

void gt_dropout_mask(float *mask, int B, int units, float p, uint64_t key, const int64_t *ids)
{
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (int i = 0; i < B; i++)
        for (int u = 0; u < units; u++)
            mask[(size_t)i * units + u] = gt_dropout_unit(key, ids ? ids[i] : i, u, p, keep);
}

void gt_dropout_apply(float *x, const float *mask, int B, int units, int per)
{
    for (size_t iu = 0; iu < (size_t)B * units; iu++)
        for (int e = 0; e < per; e++)
            x[iu * per + e] *= mask[iu];
}
