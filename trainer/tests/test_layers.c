/* test_layers.c: the convolutional layers on the CPU. conv2d (stride and padding), max pooling
 * and dropout / dropout2d each against central finite differences of a random projection of
 * their output; the dropout masks' determinism, rate and shape; and the whole LeNet's gradient
 * of every parameter block against finite differences of the mean loss, dropout on. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "layers.h"
#include "lenet.h"
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

static void test_conv2d__stride_and_padding_gradients_match_finite_differences(void **state)
{
    (void)state;
    conv_case t = {.B = 2};
    assert_int_equal(gt_conv2d_init(&t.s, 2, 7, 6, 3, 3, 2, 1), 0);
    assert_int_equal(t.s.OH, 4); /* (7 + 2 - 3) / 2 + 1, as nn.Conv2d */
    assert_int_equal(t.s.OW, 3);
    size_t nx = (size_t)t.B * 2 * 7 * 6, nw = 3 * 2 * 9, ny = (size_t)t.B * 3 * 4 * 3;
    t.x = malloc(nx * 4), t.dx = malloc(nx * 4), t.w = malloc(nw * 4), t.dw = malloc(nw * 4);
    t.b = malloc(3 * 4), t.db = malloc(3 * 4), t.y = malloc(ny * 4), t.r = malloc(ny * 4);
    t.col = malloc(gt_conv2d_col_len(&t.s) * 4);
    fill(t.x, nx, 1), fill(t.w, nw, 2), fill(t.b, 3, 3), fill(t.r, ny, 4);
    conv_objective(&t);
    gt_conv2d_backward(&t.s, t.B, t.x, t.w, t.r, t.dw, t.db, t.dx, t.col);
    check_numeric(&t, t.w, t.dw, nw, "dw");
    check_numeric(&t, t.b, t.db, 3, "db");
    check_numeric(&t, t.x, t.dx, nx, "dx");
    /* A corner output sees the zero padding: its value is the bias plus the in-range taps. */
    conv_objective(&t);
    double want = t.b[0];
    for (int c = 0; c < 2; c++)
        for (int i = 1; i < 3; i++)
            for (int j = 1; j < 3; j++)
                want += t.w[(c * 3 + i) * 3 + j] * t.x[(c * 7 + i - 1) * 6 + j - 1];
    assert_near(t.y[0], want, 1e-5);
    float *bufs[] = {t.x, t.dx, t.w, t.dw, t.b, t.db, t.y, t.r, t.col};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d__stride_and_padding_gradients_match_finite_differences),
        cmocka_unit_test(test_maxpool__routes_the_gradient_to_each_window_maximum),
        cmocka_unit_test(test_dropout__masks_follow_the_sample_not_its_position),
        cmocka_unit_test(test_dropout2d__zeroes_whole_channels_and_backward_is_the_mask),
        cmocka_unit_test(test_lenet__every_parameter_matches_finite_differences_with_dropout),
        cmocka_unit_test(test_lenet__has_the_seeds_shapes_on_28x28),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
