/* layers.c: CPU conv2d, max pooling and dropout. Convolutions unfold one sample at a time
 * (im2col), so the scratch is one sample's columns and the GEMMs stay BLAS-sized; the batch's
 * samples are split between pool.h's threads, and gradients of the weights accumulate over each
 * thread's samples through gt_gemm_ex's beta, then over the threads in order. */
#include "layers.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "layer_index.h"
#include "model.h"
#include "pool.h"

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

/* One tap (c, ki, kj) of a stride-1 convolution whose output rows are as wide as the input's
 * (OW == W, "same" padding): its column row is the input plane shifted by a constant, so the
 * rows inside the input are one contiguous run [*start, *end) of row, entry q of which reads the
 * plane's entry q + *off. Columns outside [lo, hi) (tap_span's) of each row inside it wrapped
 * around from the neighbouring input row: callers clear them. Returns false when the tap reads
 * only padding. */
static bool shifted_run(const gt_conv2d *s, int ki, int kj, int lo, int hi, int *oy0, int *oy1,
                        size_t *start, size_t *end, ptrdiff_t *off)
{
    *oy0 = s->pad - ki > 0 ? s->pad - ki : 0;
    *oy1 = s->H + s->pad - ki < s->OH ? s->H + s->pad - ki : s->OH;
    if (*oy0 >= *oy1 || lo >= hi)
        return false;
    *start = (size_t)*oy0 * s->OW + lo;
    *end = (size_t)(*oy1 - 1) * s->OW + hi;
    *off = (ptrdiff_t)(ki - s->pad) * s->W + kj - s->pad;
    return true;
}

static bool is_shifted_plane(const gt_conv2d *s)
{
    return s->stride == 1 && s->OW == s->W;
}

/* Zeroes the entries of a tap's column row (OH, OW) that read padding: rows outside [oy0, oy1)
 * (all of them when oy0 >= oy1) and, inside, the columns outside [lo, hi), leaving the rest as
 * it is. Those columns are few (at most the padding), so they go a column at a time: strided
 * stores, where a short zeroing loop per row compiles to a memset call per row. */
static void clear_padding(const gt_conv2d *s, float *row, int oy0, int oy1, int lo, int hi)
{
    size_t P = (size_t)s->OH * s->OW;
    if (oy0 >= oy1 || lo >= hi) {
        memset(row, 0, P * sizeof(float));
        return;
    }
    memset(row, 0, (size_t)oy0 * s->OW * sizeof(float));
    memset(row + (size_t)oy1 * s->OW, 0, (P - (size_t)oy1 * s->OW) * sizeof(float));
    for (int ox = 0; ox < lo; ox++)
        for (int oy = oy0; oy < oy1; oy++)
            row[(size_t)oy * s->OW + ox] = 0.0f;
    for (int ox = hi; ox < s->OW; ox++)
        for (int oy = oy0; oy < oy1; oy++)
            row[(size_t)oy * s->OW + ox] = 0.0f;
}

/* im2col for one tap of a shifted-plane convolution: one copy of the run, then the padding. */
static void im2col_shifted(const gt_conv2d *s, const float *plane, int ki, int kj, float *row)
{
    int lo, hi, oy0, oy1;
    size_t start, end;
    ptrdiff_t off;
    tap_span(s, kj, &lo, &hi);
    if (shifted_run(s, ki, kj, lo, hi, &oy0, &oy1, &start, &end, &off))
        memcpy(row + start, plane + (ptrdiff_t)start + off, (end - start) * sizeof(float));
    else
        oy0 = oy1 = 0;
    clear_padding(s, row, oy0, oy1, lo, hi);
}

/* col (C*k*k, OH*OW) from one sample x (C, H, W); padding reads as zero. Row by row: the taps of
 * one output row that fall inside the input are one span, so no element pays a bounds test (the
 * per-element test was half of a ResNet step); a stride-1 "same" convolution copies each tap
 * whole (im2col_shifted). layer_index.h's gt_im2col_src, which the CUDA kernel uses, is the
 * definition; test_layers (finite differences, strides and padding) and test_torch_steps
 * (PyTorch) check the convolutions built on this one. */
static void im2col(const gt_conv2d *s, const float *x, float *col)
{
    int P = s->OH * s->OW;
    for (int c = 0; c < s->C; c++)
        for (int ki = 0; ki < s->k; ki++)
            for (int kj = 0; kj < s->k; kj++) {
                float *row = col + (size_t)((c * s->k + ki) * s->k + kj) * P;
                if (is_shifted_plane(s)) {
                    im2col_shifted(s, x + (size_t)c * s->H * s->W, ki, kj, row);
                    continue;
                }
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

/* col2im for one tap of a shifted-plane convolution: the entries that read padding are zeroed
 * in row (a scratch the caller is done with), so the whole run adds onto the plane in one loop;
 * each input element still receives its taps in the same order as row by row. */
static void col2im_shifted(const gt_conv2d *s, float *row, int ki, int kj, float *plane)
{
    int lo, hi, oy0, oy1;
    size_t start, end;
    ptrdiff_t off;
    tap_span(s, kj, &lo, &hi);
    if (!shifted_run(s, ki, kj, lo, hi, &oy0, &oy1, &start, &end, &off))
        return;
    clear_padding(s, row, oy0, oy1, lo, hi);
    float *restrict out = plane + (ptrdiff_t)start + off;
    const float *restrict in = row + start;
    for (size_t q = 0; q < end - start; q++)
        out[q] += in[q];
}

/* The adjoint of im2col: adds col's entries back onto dx (C, H, W), which the caller zeroed.
 * col is scratch: the shifted-plane path clears its padding entries. */
static void col2im(const gt_conv2d *s, float *col, float *dx)
{
    int P = s->OH * s->OW;
    for (int c = 0; c < s->C; c++)
        for (int ki = 0; ki < s->k; ki++)
            for (int kj = 0; kj < s->k; kj++) {
                float *row = col + (size_t)((c * s->k + ki) * s->k + kj) * P;
                if (is_shifted_plane(s)) {
                    col2im_shifted(s, row, ki, kj, dx + (size_t)c * s->H * s->W);
                    continue;
                }
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

/* One convolution call's operands, shared by the pool's workers; each sample is one worker's. */
typedef struct conv_call {
    const gt_conv2d *s;
    const float *x, *w, *b, *dy;
    float *y, *dw, *db, *dx;
    float *col; /* worker 0's scratch (the caller's); the others' come from the pool */
} conv_call;

/* Worker w's scratch: the im2col columns, then (backward, w >= 1) its partial dw and db. */
static float *worker_col(const conv_call *c, int w)
{
    return w == 0 ? c->col : gt_pool_scratch(w);
}

static void forward_samples(void *ctx, int w, int lo, int hi)
{
    const conv_call *c = ctx;
    const gt_conv2d *s = c->s;
    int P = s->OH * s->OW, CKK = s->C * s->k * s->k;
    float *col = worker_col(c, w);
    for (int n = lo; n < hi; n++) {
        float *yn = c->y + (size_t)n * s->K * P; /* (K, P) */
        im2col(s, c->x + (size_t)n * s->C * s->H * s->W, col);
        gt_gemm(0, 0, s->K, P, CKK, c->w, CKK, col, P, yn, P);
        for (int k = 0; c->b && k < s->K; k++)
            for (int p = 0; p < P; p++)
                yn[(size_t)k * P + p] += c->b[k];
    }
}

void gt_conv2d_forward(const gt_conv2d *s, int B, const float *x, const float *w, const float *b,
                       float *y, float *col)
{
    conv_call c = {.s = s, .x = x, .w = w, .b = b, .y = y, .col = col};
    gt_pool_for(B, gt_pool_reserve(gt_conv2d_col_len(s)), forward_samples, &c);
}

static void backward_samples(void *ctx, int w, int lo, int hi)
{
    const conv_call *c = ctx;
    const gt_conv2d *s = c->s;
    int P = s->OH * s->OW, CKK = s->C * s->k * s->k;
    size_t in_len = (size_t)s->C * s->H * s->W;
    float *col = worker_col(c, w);
    /* Worker 0 sums into dw and db themselves, the others into partials after their columns. */
    float *dw = w == 0 ? c->dw : col + gt_conv2d_col_len(s);
    float *db = w == 0 ? c->db : dw + (size_t)s->K * CKK;
    if (c->db)
        memset(db, 0, (size_t)s->K * sizeof(float));
    for (int n = lo; n < hi; n++) {
        const float *dyn = c->dy + (size_t)n * s->K * P; /* (K, P) */
        im2col(s, c->x + (size_t)n * in_len, col);
        /* dw (K, CKK) (+)= dyn (K, P) * col^T (P, CKK); the chunk's first sample overwrites. */
        gt_gemm_ex(0, 1, s->K, CKK, P, dyn, P, col, P, n > lo ? 1.0f : 0.0f, dw, CKK);
        for (int k = 0; c->db && k < s->K; k++)
            for (int p = 0; p < P; p++)
                db[k] += dyn[(size_t)k * P + p];
        if (!c->dx)
            continue;
        /* dcol (CKK, P) = w^T (CKK, K) * dyn (K, P), folded back onto the input. */
        gt_gemm(1, 0, CKK, P, s->K, c->w, CKK, dyn, P, col, P);
        memset(c->dx + (size_t)n * in_len, 0, in_len * sizeof(float));
        col2im(s, col, c->dx + (size_t)n * in_len);
    }
}

void gt_conv2d_backward(const gt_conv2d *s, int B, const float *x, const float *w, const float *dy,
                        float *dw, float *db, float *dx, float *col)
{
    conv_call c = {.s = s, .x = x, .w = w, .dy = dy, .dw = dw, .db = db, .dx = dx, .col = col};
    if (B < 1 && db)
        memset(db, 0, (size_t)s->K * sizeof(float));
    size_t dw_len = (size_t)s->K * s->C * s->k * s->k;
    int workers = gt_pool_reserve(gt_conv2d_col_len(s) + dw_len + (size_t)s->K);
    workers = gt_pool_for(B, workers, backward_samples, &c);
    /* The partials in worker order, so a given thread count always sums alike. */
    for (int i = 1; i < workers; i++) {
        const float *part = gt_pool_scratch(i) + gt_conv2d_col_len(s);
        for (size_t j = 0; j < dw_len; j++)
            dw[j] += part[j];
        for (int k = 0; db && k < s->K; k++)
            db[k] += part[dw_len + k];
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

/* One BatchNorm call's operands, shared by the pool's workers (pool.h), which split the batch's
 * samples: each worker's partial sums are added in worker order. */
typedef struct bn_call {
    int C, HW;
    const float *a, *b;                                 /* the sums' operands */
    const float *x, *dy, *gamma, *beta, *mean, *invstd; /* invstd: eval's from run_var */
    float *y, *dx;
    double *v;        /* the sums: (2C) */
    const double *mv; /* backward: mean dy and mean dy*xhat per channel (2C) */
} bn_call;

/* v (2C) += per channel: sum of a, and sum of a * b (b NULL: a * a), over samples [lo, hi). */
static void sums_samples(void *ctx, int w, int lo, int hi)
{
    const bn_call *b = ctx;
    int C = b->C, HW = b->HW;
    double *v = w == 0 ? b->v : (double *)gt_pool_scratch(w);
    if (w != 0)
        memset(v, 0, 2 * (size_t)C * sizeof(double));
    for (int n = lo; n < hi; n++)
        for (int c = 0; c < C; c++) {
            const float *pa = b->a + ((size_t)n * C + c) * HW;
            const float *pb = b->b ? b->b + ((size_t)n * C + c) * HW : pa;
            double s = 0, s2 = 0;
            for (int i = 0; i < HW; i++) {
                s += pa[i];
                s2 += (double)pa[i] * pb[i];
            }
            v[c] += s;
            v[C + c] += s2;
        }
}

/* v[0..C) += per-channel sums of a, v[C..2C) += of a*b (b NULL: a*a), over (B, C, HW). */
static void channel_sums(int B, int C, int HW, const float *a, const float *b, double *v)
{
    bn_call call = {.C = C, .HW = HW, .a = a, .b = b, .v = v};
    size_t doubles = 2 * (size_t)C;
    int workers = gt_pool_for(B, gt_pool_reserve(doubles * 2), sums_samples, &call);
    for (int w = 1; w < workers; w++) {
        const double *part = (const double *)gt_pool_scratch(w);
        for (size_t i = 0; i < doubles; i++)
            v[i] += part[i];
    }
}

/* y = (x - mean) * invstd * gamma + beta over samples [lo, hi). */
static void normalise_samples(void *ctx, int w, int lo, int hi)
{
    const bn_call *b = ctx;
    (void)w;
    for (int n = lo; n < hi; n++)
        for (int c = 0; c < b->C; c++) {
            size_t o = ((size_t)n * b->C + c) * b->HW;
            float m = b->mean[c], inv = b->invstd[c], g = b->gamma[c], be = b->beta[c];
            for (int i = 0; i < b->HW; i++)
                b->y[o + i] = (b->x[o + i] - m) * inv * g + be;
        }
}

/* y = (x - mean) * invstd * gamma + beta, the batch's samples split between the pool's threads. */
static void normalise(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                      const float *mean, const float *invstd, float *y)
{
    bn_call call = {.C = C,
                    .HW = HW,
                    .x = x,
                    .gamma = gamma,
                    .beta = beta,
                    .mean = mean,
                    .invstd = invstd,
                    .y = y};
    gt_pool_for(B, gt_pool_threads(), normalise_samples, &call);
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
    normalise(B, C, HW, x, gamma, beta, mean, invstd, y);
    return rc;
}

void gt_bn_forward_eval(int B, int C, int HW, const float *x, const float *gamma, const float *beta,
                        const float *run_mean, const float *run_var, float *y)
{
    float inv[GT_BN_MAX_C];
    for (int c = 0; c < C; c++)
        inv[c] = (float)(1.0 / sqrt((double)run_var[c] + GT_BN_EPS));
    normalise(B, C, HW, x, gamma, beta, run_mean, inv, y);
}

/* dx = gamma * invstd * (dy - mean dy - xhat * mean(dy xhat)) over samples [lo, hi). */
static void bn_dx_samples(void *ctx, int w, int lo, int hi)
{
    const bn_call *b = ctx;
    (void)w;
    for (int n = lo; n < hi; n++)
        for (int c = 0; c < b->C; c++) {
            size_t o = ((size_t)n * b->C + c) * b->HW;
            double mdy = b->mv[c], mdyx = b->mv[b->C + c];
            float m = b->mean[c], inv = b->invstd[c], g = b->gamma[c];
            for (int i = 0; i < b->HW; i++) {
                double xhat = (b->x[o + i] - m) * inv;
                b->dx[o + i] = (float)(g * inv * (b->dy[o + i] - mdy - xhat * mdyx));
            }
        }
}

int gt_bn_backward(int B, int C, int HW, const float *x, const float *dy, const float *gamma,
                   const float *mean, const float *invstd, float *dx, float *dgamma, float *dbeta,
                   gt_reduce_fn reduce, void *ctx)
{
    /* v: sum(dy), sum(dy * x) per channel; sum(dy * xhat) = invstd * (sum(dy x) - mean sum(dy)). */
    double v[2 * GT_BN_MAX_C + 1] = {0}, mv[2 * GT_BN_MAX_C];
    channel_sums(B, C, HW, dy, x, v);
    v[2 * C] = (double)B * HW;
    for (int c = 0; c < C; c++) {
        v[C + c] = invstd[c] * (v[C + c] - mean[c] * v[c]);
        dbeta[c] = (float)v[c];
        dgamma[c] = (float)v[C + c];
    }
    int rc = reduce ? reduce(ctx, v, 2 * (size_t)C + 1) : 0;
    for (int i = 0; i < 2 * C; i++)
        mv[i] = v[i] / v[2 * C];
    bn_call call = {.C = C,
                    .HW = HW,
                    .x = x,
                    .dy = dy,
                    .gamma = gamma,
                    .mean = mean,
                    .invstd = invstd,
                    .dx = dx,
                    .mv = mv};
    gt_pool_for(B, gt_pool_threads(), bn_dx_samples, &call);
    return rc;
}

/* One element-wise pass over [0, len), split between the pool's threads. */
typedef struct relu_call {
    float *x;
    const float *y;
} relu_call;

static void relu_elements(void *ctx, int w, int lo, int hi)
{
    const relu_call *r = ctx;
    (void)w;
    for (int i = lo; i < hi; i++)
        r->x[i] = r->x[i] > 0.0f ? r->x[i] : 0.0f;
}

/* fn over [0, len) on the pool, in pieces an int can count. */
static void elementwise(size_t len, gt_pool_fn fn, relu_call r)
{
    for (size_t at = 0; at < len; at += INT_MAX) {
        relu_call piece = {.x = r.x + at, .y = r.y ? r.y + at : NULL};
        size_t n = len - at < INT_MAX ? len - at : INT_MAX;
        gt_pool_for((int)n, gt_pool_threads(), fn, &piece);
    }
}

void gt_relu(float *x, size_t len)
{
    elementwise(len, relu_elements, (relu_call){.x = x});
}

static void relu_backward_elements(void *ctx, int w, int lo, int hi)
{
    const relu_call *r = ctx;
    (void)w;
    for (int i = lo; i < hi; i++)
        if (r->y[i] <= 0.0f)
            r->x[i] = 0.0f;
}

/* dx = 0 wherever the ReLU's output y was clamped to 0. */
void gt_relu_backward(float *dx, const float *y, size_t len)
{
    elementwise(len, relu_backward_elements, (relu_call){.x = dx, .y = y});
}

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
