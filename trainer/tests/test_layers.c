/* test_layers.c: the convolutional layers on the CPU. conv2d (stride and padding; against its
 * definition; its batch split between threads), max pooling
 * and dropout / dropout2d each against central finite differences of a random projection of
 * their output; the dropout masks' determinism, rate and shape; BatchNorm2d likewise, with its
 * running statistics; average pooling; layer_index.h's im2col/col2im index math (shared with
 * the CUDA kernels) against the definition; SyncBatchNorm on two ranks (threads sharing a
 * reduction) against BatchNorm on the whole batch, forward and backward; and the whole LeNet's and
 * ResNet's gradients against finite differences of the mean loss, dropout and batch statistics on.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "layer_index.h"
#include "layers.h"
#include "lenet.h"
#include "pool.h"
#include "resnet.h"
#include "sampler.h"
#include "testutil.h"

static void fill(float *x, size_t n, uint64_t seed)
{
    gt_mt19937 mt;
    gt_mt_seed(&mt, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = 2.0f * gt_mt_uniform(&mt) - 1.0f;
}

/* Float central differences of a smooth function: 1e-2 relative plus 2e-3 absolute at eps 1e-2
 * (the functions here are linear or piecewise linear in each input, so the error is rounding). */
static void expect_close(const char *what, size_t i, double analytic, double numeric)
{
    double tol = 1e-2 * fmax(fabs(numeric), fabs(analytic)) + 2e-3;
    if (fabs(numeric - analytic) > tol)
        fail_msg("%s[%zu]: analytic %.6g numeric %.6g", what, i, analytic, numeric);
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

typedef struct conv_case {
    gt_conv2d s;
    int B;
    float *x, *w, *b, *y, *r, *col, *dx, *dw, *db;
} conv_case;

/* The projection sum(y * r) whose gradient with respect to y is r. */
static double conv_objective(conv_case *t)
{
    gt_conv2d_forward(&t->s, t->B, t->x, t->w, t->b, t->y, t->col);
    return dot(t->y, t->r, (size_t)t->B * t->s.K * t->s.OH * t->s.OW);
}

static void check_numeric(conv_case *t, float *v, const float *grad, size_t n, const char *what)
{
    const float eps = 1e-2f;
    for (size_t i = 0; i < n; i++) {
        float keep = v[i];
        v[i] = keep + eps;
        double up = conv_objective(t);
        v[i] = keep - eps;
        double down = conv_objective(t);
        v[i] = keep;
        expect_close(what, i, grad[i], (up - down) / (2.0 * eps));
    }
}

/* y from nn.Conv2d's definition, one multiply-add at a time. */
static void conv_definition(const gt_conv2d *s, int B, const float *x, const float *w,
                            const float *b, float *y)
{
    for (int n = 0; n < B; n++)
        for (int k = 0; k < s->K; k++)
            for (int oy = 0; oy < s->OH; oy++)
                for (int ox = 0; ox < s->OW; ox++) {
                    double acc = b ? b[k] : 0.0;
                    for (int c = 0; c < s->C; c++)
                        for (int i = 0; i < s->k; i++)
                            for (int j = 0; j < s->k; j++) {
                                int iy = oy * s->stride - s->pad + i;
                                int ix = ox * s->stride - s->pad + j;
                                if (iy < 0 || iy >= s->H || ix < 0 || ix >= s->W)
                                    continue;
                                acc += (double)w[((k * s->C + c) * s->k + i) * s->k + j] *
                                       x[(((size_t)n * s->C + c) * s->H + iy) * s->W + ix];
                            }
                    y[(((size_t)n * s->K + k) * s->OH + oy) * s->OW + ox] = (float)acc;
                }
}

static conv_case conv_case_new(int B, int C, int H, int W, int K, int k, int stride, int pad)
{
    conv_case t = {.B = B};
    assert_int_equal(gt_conv2d_init(&t.s, C, H, W, K, k, stride, pad), 0);
    size_t nx = (size_t)B * C * H * W, nw = (size_t)K * C * k * k;
    size_t ny = (size_t)B * K * t.s.OH * t.s.OW;
    t.x = malloc(nx * 4), t.dx = malloc(nx * 4), t.w = malloc(nw * 4), t.dw = malloc(nw * 4);
    t.b = malloc((size_t)K * 4), t.db = malloc((size_t)K * 4), t.y = malloc(ny * 4);
    t.r = malloc(ny * 4), t.col = malloc(gt_conv2d_col_len(&t.s) * 4);
    fill(t.x, nx, 1), fill(t.w, nw, 2), fill(t.b, (size_t)K, 3), fill(t.r, ny, 4);
    return t;
}

static void conv_case_free(conv_case *t)
{
    float *bufs[] = {t->x, t->dx, t->w, t->dw, t->b, t->db, t->y, t->r, t->col};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
}

/* Geometries that take each im2col path: stride 2 (row by row), "same" stride 1 (one shifted
 * copy per tap, with columns wrapped from the neighbouring row cleared), a 5x5 kernel with
 * padding 2 on a non-square input, no padding (LeNet's), and padding wider than half the
 * kernel (output wider than the input: row by row again). */
static const int CONV_CASES[][8] = {
    /* B, C, H, W, K, k, stride, pad */
    {2, 2, 7, 6, 3, 3, 2, 1}, {2, 2, 5, 6, 3, 3, 1, 1}, {2, 1, 6, 5, 2, 5, 1, 2},
    {2, 2, 6, 7, 2, 3, 1, 0}, {1, 2, 4, 4, 2, 3, 1, 2},
};

static void
test_conv2d__forward_and_gradients_match_the_definition_and_finite_differences(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(CONV_CASES) / sizeof(CONV_CASES[0]); c++) {
        const int *g = CONV_CASES[c];
        conv_case t = conv_case_new(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
        size_t nx = (size_t)t.B * t.s.C * t.s.H * t.s.W, nw = (size_t)t.s.K * t.s.C * t.s.k * t.s.k;
        size_t ny = (size_t)t.B * t.s.K * t.s.OH * t.s.OW;
        float *want = malloc(ny * 4);
        conv_definition(&t.s, t.B, t.x, t.w, t.b, want);
        conv_objective(&t);
        for (size_t i = 0; i < ny; i++)
            assert_near(t.y[i], want[i], 1e-5);
        gt_conv2d_backward(&t.s, t.B, t.x, t.w, t.r, t.dw, t.db, t.dx, t.col);
        check_numeric(&t, t.w, t.dw, nw, "dw");
        check_numeric(&t, t.b, t.db, (size_t)t.s.K, "db");
        check_numeric(&t, t.x, t.dx, nx, "dx");
        free(want);
        conv_case_free(&t);
    }
    conv_case t = conv_case_new(2, 2, 7, 6, 3, 3, 2, 1);
    assert_int_equal(t.s.OH, 4); /* (7 + 2 - 3) / 2 + 1, as nn.Conv2d */
    assert_int_equal(t.s.OW, 3);
    conv_case_free(&t);
}

/* The pool splits a batch between threads: the output and dx are per sample, so they are
 * bit-identical to one thread's; dw and db add the threads' partial sums, so they differ only
 * by rounding, and are the same from run to run with the same thread count. */
static void test_conv2d__threads_split_the_batch_and_sum_alike(void **state)
{
    (void)state;
    conv_case t = conv_case_new(7, 5, 9, 9, 4, 3, 1, 1);
    size_t nx = (size_t)t.B * 5 * 81, nw = 4 * 5 * 9, ny = (size_t)t.B * 4 * 81;
    float *y1 = malloc(ny * 4), *dx1 = malloc(nx * 4), *dw1 = malloc(nw * 4), db1[4];
    conv_objective(&t);
    gt_conv2d_backward(&t.s, t.B, t.x, t.w, t.r, t.dw, t.db, t.dx, t.col);
    memcpy(y1, t.y, ny * 4), memcpy(dx1, t.dx, nx * 4), memcpy(dw1, t.dw, nw * 4);
    memcpy(db1, t.db, sizeof(db1));
    assert_int_equal(gt_pool_start(3), 0);
    assert_int_equal(gt_pool_threads(), 3);
    float *dw3 = malloc(nw * 4);
    for (int run = 0; run < 2; run++) {
        memset(t.y, 0, ny * 4), memset(t.dx, 0, nx * 4);
        conv_objective(&t);
        gt_conv2d_backward(&t.s, t.B, t.x, t.w, t.r, t.dw, t.db, t.dx, t.col);
        assert_memory_equal(t.y, y1, ny * 4);
        assert_memory_equal(t.dx, dx1, nx * 4);
        for (size_t i = 0; i < nw; i++)
            assert_near(t.dw[i], dw1[i], 1e-5 * fmax(1.0, fabs(dw1[i])));
        for (int k = 0; k < 4; k++)
            assert_near(t.db[k], db1[k], 1e-5 * fmax(1.0, fabs(db1[k])));
        if (run == 1)
            assert_memory_equal(t.dw, dw3, nw * 4);
        memcpy(dw3, t.dw, nw * 4);
    }
    gt_pool_stop();
    assert_int_equal(gt_pool_threads(), 1);
    free(y1), free(dx1), free(dw1), free(dw3);
    conv_case_free(&t);
}

static void test_maxpool__routes_the_gradient_to_each_window_maximum(void **state)
{
    (void)state;
    enum { BC = 3, H = 6, W = 5, K = 2, OH = 3, OW = 2 }; /* floor mode drops the last column */
    float x[BC * H * W], y[BC * OH * OW], r[BC * OH * OW], dx[BC * H * W];
    int32_t arg[BC * OH * OW];
    fill(x, BC * H * W, 5), fill(r, BC * OH * OW, 6);
    gt_maxpool2d_forward(BC, H, W, K, K, x, y, arg);
    gt_maxpool2d_backward(BC, H, W, K, K, r, arg, dx);
    const float eps = 1e-4f; /* below the gap between distinct random inputs in a window */
    for (int i = 0; i < BC * H * W; i++) {
        float keep = x[i], yy[BC * OH * OW];
        x[i] = keep + eps;
        gt_maxpool2d_forward(BC, H, W, K, K, x, yy, arg);
        double up = dot(yy, r, BC * OH * OW);
        x[i] = keep - eps;
        gt_maxpool2d_forward(BC, H, W, K, K, x, yy, arg);
        double down = dot(yy, r, BC * OH * OW);
        x[i] = keep;
        expect_close("dx", (size_t)i, dx[i], (up - down) / (2.0 * eps));
    }
    gt_maxpool2d_forward(BC, H, W, K, K, x, y, arg);
    float m = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[W], x[W + 1]));
    assert_true(y[0] == m);
}

/* layer_index.h's im2col offsets against the definition, and its col2im gather (what the CUDA
 * kernel runs) against a scatter written from the definition, over strides, paddings and
 * kernel sizes that leave partial windows. Host-side, so the index math is checked here in CI. */
static void test_layer_index__im2col_and_col2im_match_the_definition(void **state)
{
    (void)state;
    const int g[][6] = {/* C, H, W, k, stride, pad */
                        {2, 7, 6, 3, 2, 1},
                        {1, 12, 12, 5, 1, 0},
                        {3, 7, 7, 1, 2, 0},
                        {2, 9, 8, 3, 3, 2},
                        {2, 6, 7, 4, 2, 1}};
    for (size_t t = 0; t < sizeof(g) / sizeof(g[0]); t++) {
        int C = g[t][0], H = g[t][1], W = g[t][2], k = g[t][3], st = g[t][4], pad = g[t][5];
        int OH = (H + 2 * pad - k) / st + 1, OW = (W + 2 * pad - k) / st + 1, P = OH * OW;
        size_t ncol = (size_t)C * k * k * P, nx = (size_t)C * H * W;
        float *col = malloc(ncol * sizeof(float)), *want = calloc(nx, sizeof(float));
        fill(col, ncol, 40 + t);
        for (int c = 0; c < C; c++)
            for (int ki = 0; ki < k; ki++)
                for (int kj = 0; kj < k; kj++)
                    for (int oy = 0; oy < OH; oy++)
                        for (int ox = 0; ox < OW; ox++) {
                            int iy = oy * st - pad + ki, ix = ox * st - pad + kj;
                            int in = iy >= 0 && iy < H && ix >= 0 && ix < W;
                            int64_t at = gt_im2col_src(H, W, st, pad, c, ki, kj, oy, ox);
                            assert_int_equal(at, in ? (c * H + iy) * W + ix : -1);
                            size_t r = (size_t)((c * k + ki) * k + kj) * P + oy * OW + ox;
                            if (in)
                                want[(c * H + iy) * W + ix] += col[r];
                        }
        for (int c = 0; c < C; c++)
            for (int iy = 0; iy < H; iy++)
                for (int ix = 0; ix < W; ix++) {
                    float sum = 0.0f;
                    for (int ki = 0; ki < k; ki++)
                        for (int kj = 0; kj < k; kj++) {
                            int oy = gt_col2im_out(iy, ki, st, pad, OH);
                            int ox = gt_col2im_out(ix, kj, st, pad, OW);
                            if (oy >= 0 && ox >= 0)
                                sum += col[(size_t)((c * k + ki) * k + kj) * P + oy * OW + ox];
                        }
                    assert_near(sum, want[(c * H + iy) * W + ix], 1e-5);
                }
        free(col);
        free(want);
    }
}

/* Average pooling (overlapping windows, 2x2 and global) against finite differences. */
static void test_avgpool__gradients_match_finite_differences(void **state)
{
    (void)state;
    const int g[][4] = {{6, 5, 2, 2}, {7, 7, 3, 2}, {7, 7, 7, 1}}; /* H, W, k, stride */
    for (size_t t = 0; t < sizeof(g) / sizeof(g[0]); t++) {
        enum { BC = 3 };
        int H = g[t][0], W = g[t][1], k = g[t][2], st = g[t][3];
        int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
        float x[BC * 49], y[BC * 49], r[BC * 49], dx[BC * 49], yy[BC * 49];
        size_t nx = (size_t)BC * H * W, ny = (size_t)BC * OH * OW;
        fill(x, nx, 50 + t), fill(r, ny, 60 + t);
        gt_avgpool2d_forward(BC, H, W, k, st, x, y);
        gt_avgpool2d_backward(BC, H, W, k, st, r, dx);
        const float eps = 1e-2f;
        for (size_t i = 0; i < nx; i++) {
            float keep = x[i];
            x[i] = keep + eps;
            gt_avgpool2d_forward(BC, H, W, k, st, x, yy);
            double up = dot(yy, r, ny);
            x[i] = keep - eps;
            gt_avgpool2d_forward(BC, H, W, k, st, x, yy);
            double down = dot(yy, r, ny);
            x[i] = keep;
            expect_close("dx", i, dx[i], (up - down) / (2.0 * eps));
        }
        double want = 0; /* the first window's mean */
        for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++)
                want += x[i * W + j];
        assert_near(y[0], want / (k * k), 1e-6);
    }
}

static void test_dropout__masks_follow_the_sample_not_its_position(void **state)
{
    (void)state;
    enum { U = 4000 };
    float *a = malloc(2 * U * sizeof(float)), *b = malloc(2 * U * sizeof(float));
    const int64_t ids[2] = {17, 4242}, swapped[2] = {4242, 17};
    uint64_t key = gt_dropout_key(7, 3, 0);
    gt_dropout_mask(a, 2, U, 0.3f, key, ids);
    gt_dropout_mask(b, 2, U, 0.3f, key, swapped);
    assert_memory_equal(a, b + U, U * sizeof(float)); /* sample 17 on another row */
    assert_memory_equal(a + U, b, U * sizeof(float));
    size_t dropped = 0;
    for (int i = 0; i < 2 * U; i++) {
        assert_true(a[i] == 0.0f || a[i] == 1.0f / 0.7f); /* inverted dropout, as F.dropout */
        dropped += a[i] == 0.0f;
    }
    assert_true(dropped > 2 * U * 0.27 && dropped < 2 * U * 0.33);
    gt_dropout_mask(b, 2, U, 0.3f, gt_dropout_key(7, 4, 0), ids); /* next step: new masks */
    assert_memory_not_equal(a, b, 2 * U * sizeof(float));
    free(a);
    free(b);
}

static void test_dropout2d__zeroes_whole_channels_and_backward_is_the_mask(void **state)
{
    (void)state;
    enum { B = 2, C = 16, HW = 9 };
    float x[B * C * HW], y[B * C * HW], mask[B * C], r[B * C * HW], g[B * C * HW];
    const int64_t ids[B] = {3, 9};
    fill(x, B * C * HW, 8), fill(r, B * C * HW, 9);
    gt_dropout_mask(mask, B, C, 0.5f, gt_dropout_key(1, 0, 0), ids);
    memcpy(y, x, sizeof(x));
    gt_dropout_apply(y, mask, B, C, HW);
    int zero_channels = 0;
    for (int u = 0; u < B * C; u++) {
        int zeros = 0;
        for (int e = 0; e < HW; e++)
            zeros += y[u * HW + e] == 0.0f;
        assert_true(zeros == 0 || zeros == HW);
        zero_channels += zeros == HW;
    }
    assert_true(zero_channels > 0 && zero_channels < B * C);
    /* d sum(r * drop(x)) / dx = r * mask, the same apply on the gradient. */
    memcpy(g, r, sizeof(r));
    gt_dropout_apply(g, mask, B, C, HW);
    for (int i = 0; i < B * C * HW; i++)
        assert_near(g[i], r[i] * mask[i / HW], 0.0);
}

static double lenet_mean_loss(gt_mlp *m, const float *x, const uint8_t *y, int B)
{
    int64_t c = 0;
    gt_mlp_forward(m, x, B);
    return gt_mlp_loss(m, y, B, 0, &c) / B;
}

/* Central difference of the mean loss in parameter i. */
static double lenet_numeric(gt_mlp *m, const float *x, const uint8_t *y, int B, size_t i, float eps)
{
    float keep = m->params[i];
    m->params[i] = keep + eps;
    double up = lenet_mean_loss(m, x, y, B);
    m->params[i] = keep - eps;
    double down = lenet_mean_loss(m, x, y, B);
    m->params[i] = keep;
    return (up - down) / (2.0 * eps);
}

/* Whether some eps in 1e-3, 3e-4, 1e-4 agrees: a max-pool or ReLU switching inside the interval
 * spoils a large eps but not a small one, while a wrong gradient disagrees at every eps. */
static int agrees(gt_mlp *m, const float *x, const uint8_t *y, int B, size_t i, double ana)
{
    const float eps[3] = {1e-3f, 3e-4f, 1e-4f};
    for (int e = 0; e < 3; e++) {
        double num = lenet_numeric(m, x, y, B, i, eps[e]);
        if (fabs(num - ana) <= 1e-2 * fmax(fabs(num), fabs(ana)) + 2e-4)
            return 1;
    }
    return 0;
}

static void test_lenet__every_parameter_matches_finite_differences_with_dropout(void **state)
{
    (void)state;
    enum { SIDE = 16, B = 3, OUT = 4 };
    gt_mlp m;
    assert_int_equal(gt_lenet_init(&m, SIDE * SIDE, OUT, B, 11, 0.3f, NULL), 0);
    float x[B * SIDE * SIDE];
    uint8_t y[B] = {0, 3, 1};
    const int64_t ids[B] = {5, 6, 7};
    fill(x, B * SIDE * SIDE, 12);
    gt_mlp_set_mode(&m, 1, gt_dropout_key(0, 1, 0), ids);
    double with_dropout = lenet_mean_loss(&m, x, y, B);
    int64_t c = 0;
    gt_mlp_loss(&m, y, B, 1, &c);
    gt_mlp_backward(&m, x, B);
    float *grads = malloc(m.nparams * sizeof(float));
    memcpy(grads, m.grads, m.nparams * sizeof(float));
    size_t live = 0;
    for (size_t i = 0; i < m.nparams; i++) {
        if (!agrees(&m, x, y, B, i, grads[i]))
            fail_msg("param %zu: analytic %.6g numeric %.6g", i, (double)grads[i],
                     lenet_numeric(&m, x, y, B, i, 1e-3f));
        live += fabsf(grads[i]) > 1e-6f;
    }
    assert_true(live > m.nparams / 3); /* the check is not vacuous */
    gt_mlp_set_mode(&m, 0, 0, NULL);   /* evaluation: no dropout, a different loss */
    assert_true(fabs(lenet_mean_loss(&m, x, y, B) - with_dropout) > 1e-6);
    free(grads);
    gt_mlp_release(&m);
}

static void test_lenet__has_the_seeds_shapes_on_28x28(void **state)
{
    (void)state;
    gt_mlp m;
    assert_int_equal(gt_lenet_init(&m, 784, 10, 2, 0, 0.5f, NULL), 0);
    assert_int_equal(m.cnn->flat, 320);
    assert_int_equal(m.nparams, 250 + 10 + 5000 + 20 + 16000 + 50 + 500 + 10);
    for (size_t i = m.cnn->off[4]; i < m.cnn->off[6]; i++)
        assert_true(fabsf(m.params[i]) <= 1.0f / sqrtf(320.0f)); /* fc1's fan-in bound */
    gt_mlp_release(&m);
    gt_err err = {{0}};
    assert_int_equal(gt_lenet_init(&m, 10 * 10, 10, 2, 0, 0.5f, &err), -1);
    assert_non_null(strstr(err.msg, "16x16"));
}

enum { BN_B = 4, BN_C = 3, BN_HW = 5, BN_N = BN_B * BN_C * BN_HW };

typedef struct bn_case {
    float x[BN_N], gamma[BN_C], beta[BN_C], y[BN_N], r[BN_N], dx[BN_N], dg[BN_C], db[BN_C];
    float mean[BN_C], invstd[BN_C], rm[BN_C], rv[BN_C];
} bn_case;

static double bn_objective(bn_case *t)
{
    gt_bn_forward_train(BN_B, BN_C, BN_HW, t->x, t->gamma, t->beta, t->y, t->mean, t->invstd, t->rm,
                        t->rv, NULL, NULL);
    return dot(t->y, t->r, BN_N);
}

static void bn_check(bn_case *t, float *v, const float *grad, size_t n, const char *what)
{
    const float eps = 1e-2f;
    for (size_t i = 0; i < n; i++) {
        float keep = v[i];
        v[i] = keep + eps;
        double up = bn_objective(t);
        v[i] = keep - eps;
        double down = bn_objective(t);
        v[i] = keep;
        expect_close(what, i, grad[i], (up - down) / (2.0 * eps));
    }
}

static void bn_case_init(bn_case *t)
{
    memset(t, 0, sizeof(*t));
    fill(t->x, BN_N, 21), fill(t->gamma, BN_C, 22), fill(t->beta, BN_C, 23), fill(t->r, BN_N, 24);
    for (int c = 0; c < BN_C; c++)
        t->x[c * BN_HW] += 3.0f, t->rv[c] = 1.0f; /* a mean away from 0 */
}

static void test_batchnorm__gradients_and_running_statistics_match_pytorch(void **state)
{
    (void)state;
    bn_case t;
    bn_case_init(&t);
    bn_objective(&t);
    gt_bn_backward(BN_B, BN_C, BN_HW, t.x, t.r, t.gamma, t.mean, t.invstd, t.dx, t.dg, t.db, NULL,
                   NULL);
    bn_check(&t, t.x, t.dx, BN_N, "dx");
    bn_check(&t, t.gamma, t.dg, BN_C, "dgamma");
    bn_check(&t, t.beta, t.db, BN_C, "dbeta");
    /* One update from (0, 1): momentum 0.1 of the batch mean and UNBIASED variance. */
    memset(t.rm, 0, sizeof(t.rm));
    for (int c = 0; c < BN_C; c++)
        t.rv[c] = 1.0f;
    bn_objective(&t);
    double s = 0, s2 = 0, n = BN_B * BN_HW;
    for (int b = 0; b < BN_B; b++)
        for (int i = 0; i < BN_HW; i++)
            s += t.x[b * BN_C * BN_HW + i],
                s2 += (double)t.x[b * BN_C * BN_HW + i] * t.x[b * BN_C * BN_HW + i];
    double mu = s / n, var = s2 / n - mu * mu;
    assert_near(t.rm[0], 0.1 * mu, 1e-6);
    assert_near(t.rv[0], 0.9 + 0.1 * var * n / (n - 1), 1e-5);
    /* Evaluation normalises with the running statistics. */
    float ye[BN_N];
    gt_bn_forward_eval(BN_B, BN_C, BN_HW, t.x, t.gamma, t.beta, t.rm, t.rv, ye);
    assert_near(ye[0], (t.x[0] - t.rm[0]) / sqrt(t.rv[0] + 1e-5) * t.gamma[0] + t.beta[0], 1e-5);
}

/* Two "ranks" as threads: each adds its vector into a shared sum, so both see the total. */
typedef struct two_ranks {
    pthread_barrier_t bar;
    double sum[2 * BN_C + 1];
} two_ranks;

static int thread_reduce(void *ctx, double *v, size_t n)
{
    two_ranks *t = ctx;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_barrier_wait(&t->bar); /* the previous round's readers are done */
    if (pthread_barrier_wait(&t->bar) == PTHREAD_BARRIER_SERIAL_THREAD)
        memset(t->sum, 0, sizeof(t->sum));
    pthread_barrier_wait(&t->bar);
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n; i++)
        t->sum[i] += v[i];
    pthread_mutex_unlock(&mu);
    pthread_barrier_wait(&t->bar);
    memcpy(v, t->sum, n * sizeof(double));
    return 0;
}

typedef struct half {
    two_ranks *shared;
    const bn_case *whole;
    int rank;
    float y[BN_N / 2], dx[BN_N / 2], dg[BN_C], db[BN_C], rm[BN_C], rv[BN_C];
} half;

static void *sync_rank(void *arg)
{
    half *h = arg;
    const bn_case *w = h->whole;
    size_t off = (size_t)h->rank * BN_N / 2;
    float mean[BN_C], invstd[BN_C];
    for (int c = 0; c < BN_C; c++)
        h->rm[c] = 0.0f, h->rv[c] = 1.0f;
    gt_bn_forward_train(BN_B / 2, BN_C, BN_HW, w->x + off, w->gamma, w->beta, h->y, mean, invstd,
                        h->rm, h->rv, thread_reduce, h->shared);
    gt_bn_backward(BN_B / 2, BN_C, BN_HW, w->x + off, w->r + off, w->gamma, mean, invstd, h->dx,
                   h->dg, h->db, thread_reduce, h->shared);
    return NULL;
}

static void test_syncbatchnorm__two_ranks_equal_batchnorm_on_the_whole_batch(void **state)
{
    (void)state;
    bn_case w;
    bn_case_init(&w);
    for (int c = 0; c < BN_C; c++)
        w.rm[c] = 0.0f, w.rv[c] = 1.0f;
    bn_objective(&w); /* whole batch, one rank: already checked against finite differences */
    gt_bn_backward(BN_B, BN_C, BN_HW, w.x, w.r, w.gamma, w.mean, w.invstd, w.dx, w.dg, w.db, NULL,
                   NULL);
    two_ranks shared;
    pthread_barrier_init(&shared.bar, NULL, 2);
    half h[2] = {{.shared = &shared, .whole = &w, .rank = 0},
                 {.shared = &shared, .whole = &w, .rank = 1}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&th[r], NULL, sync_rank, &h[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&shared.bar);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < BN_N / 2; i++) {
            assert_near(h[r].y[i], w.y[r * BN_N / 2 + i], 1e-5);
            /* The loss of each rank is its half of the whole, so dx matches the whole's. */
            assert_near(h[r].dx[i], w.dx[r * BN_N / 2 + i], 1e-5);
        }
    for (int c = 0; c < BN_C; c++) {
        assert_near(h[0].dg[c] + h[1].dg[c], w.dg[c], 1e-5); /* local, summed by DDP */
        assert_near(h[0].db[c] + h[1].db[c], w.db[c], 1e-5);
        assert_near(h[0].rm[c], w.rm[c], 1e-6); /* global statistics on both ranks */
        assert_near(h[1].rv[c], w.rv[c], 1e-6);
    }
}

static double model_mean_loss(gt_mlp *m, const float *x, const uint8_t *y, int B)
{
    int64_t c = 0;
    gt_mlp_forward(m, x, B);
    return gt_mlp_loss(m, y, B, 0, &c) / B;
}

/* Whether the central difference of the mean loss in parameter i agrees with ana at eps 1e-3,
 * 3e-4 or 1e-4 (a ReLU switching inside the interval spoils a large eps, float rounding a small
 * one); 5% relative plus 1e-3 absolute. */
static int resnet_param_agrees(gt_mlp *m, const float *x, const uint8_t *y, int B, size_t i,
                               float ana)
{
    const float eps[3] = {1e-3f, 3e-4f, 1e-4f};
    for (int e = 0; e < 3; e++) {
        float keep = m->params[i];
        m->params[i] = keep + eps[e];
        double up = model_mean_loss(m, x, y, B);
        m->params[i] = keep - eps[e];
        double down = model_mean_loss(m, x, y, B);
        m->params[i] = keep;
        double num = (up - down) / (2.0 * eps[e]);
        if (fabs(num - ana) <= 5e-2 * fmax(fabs(num), fabs(ana)) + 1e-3)
            return 1;
    }
    return 0;
}

static void test_resnet__parameters_match_finite_differences(void **state)
{
    (void)state;
    enum { SIDE = 8, B = 3, OUT = 3 };
    gt_mlp m;
    assert_int_equal(gt_resnet_init(&m, SIDE * SIDE, OUT, B, 5, NULL), 0);
    float x[B * SIDE * SIDE];
    uint8_t y[B] = {2, 0, 1};
    fill(x, B * SIDE * SIDE, 31);
    /* Move BatchNorm's affine parameters off (1, 0) so their gradients are generic. */
    for (size_t i = 0; i < m.nparams; i++)
        if (m.params[i] == 1.0f || m.params[i] == 0.0f)
            m.params[i] += 0.3f * (float)((i * 2654435761u) % 1000) / 1000.0f - 0.15f;
    gt_mlp_set_mode(&m, 1, 0, NULL); /* batch statistics */
    model_mean_loss(&m, x, y, B);
    int64_t c = 0;
    gt_mlp_loss(&m, y, B, 1, &c);
    gt_mlp_backward(&m, x, B);
    float *grads = malloc(m.nparams * sizeof(float));
    memcpy(grads, m.grads, m.nparams * sizeof(float));
    /* Every 97th parameter (a prime: every block, at varied positions) and the last. A float
     * network of 14 BatchNorms over 12 to 192 values per channel is full of ReLU switches, so a
     * few parameters may sit on one at every eps: up to 2% may disagree; a wrong gradient
     * anywhere upstream of the head makes most of them disagree. */
    size_t checked = 0, bad = 0, live = 0;
    for (size_t i = 0; i < m.nparams;
         i = i + 97 < m.nparams || i == m.nparams - 1 ? i + 97 : m.nparams - 1) {
        checked++;
        live += fabsf(grads[i]) > 1e-5f;
        if (!resnet_param_agrees(&m, x, y, B, i, grads[i])) {
            bad++;
            print_message("param %zu: analytic %.6g disagrees\n", i, (double)grads[i]);
        }
    }
    print_message("%zu of %zu checked parameters disagree\n", bad, checked);
    assert_true(bad * 50 <= checked);
    assert_true(live * 2 > checked); /* the check is not vacuous */
    free(grads);
    gt_mlp_release(&m);
}

static void test_resnet__has_the_documented_size_on_28x28(void **state)
{
    (void)state;
    gt_mlp m;
    assert_int_equal(gt_resnet_init(&m, 784, 10, 2, 0, NULL), 0);
    assert_int_equal(m.nparams, 174970); /* as --help and the README state */
    assert_int_equal(m.nbuffers, 1120);
    assert_int_equal(m.rn->blk[GT_RESNET_BLOCKS - 1].side, 7);
    gt_mlp_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_conv2d__forward_and_gradients_match_the_definition_and_finite_differences),
        cmocka_unit_test(test_conv2d__threads_split_the_batch_and_sum_alike),
        cmocka_unit_test(test_maxpool__routes_the_gradient_to_each_window_maximum),
        cmocka_unit_test(test_layer_index__im2col_and_col2im_match_the_definition),
        cmocka_unit_test(test_avgpool__gradients_match_finite_differences),
        cmocka_unit_test(test_dropout__masks_follow_the_sample_not_its_position),
        cmocka_unit_test(test_dropout2d__zeroes_whole_channels_and_backward_is_the_mask),
        cmocka_unit_test(test_lenet__every_parameter_matches_finite_differences_with_dropout),
        cmocka_unit_test(test_lenet__has_the_seeds_shapes_on_28x28),
        cmocka_unit_test(test_batchnorm__gradients_and_running_statistics_match_pytorch),
        cmocka_unit_test(test_syncbatchnorm__two_ranks_equal_batchnorm_on_the_whole_batch),
        cmocka_unit_test(test_resnet__parameters_match_finite_differences),
        cmocka_unit_test(test_resnet__has_the_documented_size_on_28x28),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
