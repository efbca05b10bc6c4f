/* test_model.c: the CPU MLP. gt_gemm against a naive product for every transpose combination;
 * the loss against a hand-computed cross-entropy; and the gradient of every layer's weights and
 * biases against central finite differences of the mean loss (float, so the tolerance is 1e-2
 * relative plus 2e-4 absolute, with eps 1e-3), after checking the gradients are not trivially 0. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "testutil.h"
#include "sampler.h"

static void test_gemm__all_transposes_match_a_naive_product(void **state)
{
    (void)state;
    enum { M = 3, N = 4, K = 5 };
    float A[M * K], B[K * N], At[K * M], Bt[N * K], want[M * N], got[M * N];
    for (int i = 0; i < M * K; i++)
        A[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < K * N; i++)
        B[i] = (float)(i % 5) * 0.5f - 1.0f;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++)
            At[k * M + i] = A[i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            Bt[j * K + k] = B[k * N + j];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += A[i * K + k] * B[k * N + j];
            want[i * N + j] = s;
        }
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gt_gemm(ta, tb, M, N, K, ta ? At : A, ta ? M : K, tb ? Bt : B, tb ? K : N, got, N);
            for (int i = 0; i < M * N; i++)
                assert_near(got[i], want[i], 1e-5f);
        }
}

static void test_loss__matches_hand_computed_cross_entropy(void **state)
{
    (void)state;
    gt_mlp m;
    int hidden[1] = {2};
    assert_int_equal(gt_mlp_init(&m, 2, hidden, 1, 3, 2, 1, NULL), 0);
    float *z = m.acts[m.nlayers]; /* set the logits directly */
    const float logits[6] = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, -1.0f};
    memcpy(z, logits, sizeof(logits));
    const uint8_t y[2] = {2, 0};
    int64_t correct = 0;
    double sum = gt_mlp_loss(&m, y, 2, 1, &correct);
    double l0 = log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0;
    double l1 = log(exp(0.5) + exp(0.5) + exp(-1.0)) - 0.5;
    assert_near(sum, l0 + l1, 1e-6);
    assert_int_equal(correct, 2); /* row 1 ties 0 and 1: argmax takes the first, as torch does */
    double p02 = exp(3.0 - (l0 + 3.0));
    assert_near(m.dacts[m.nlayers][2], (float)((p02 - 1.0) / 2.0), 1e-6f);
    gt_mlp_release(&m);
}

static double mean_loss(gt_mlp *m, const float *x, const uint8_t *y, int B)
{
    int64_t c = 0;
    gt_mlp_forward(m, x, B);
    return gt_mlp_loss(m, y, B, 0, &c) / B;
}

/* Checks d(loss)/d(params[off .. off+n)) against central differences. */
static void check_block(gt_mlp *m, const float *x, const uint8_t *y, int B, size_t off, size_t n,
                        const float *analytic)
{
    const float eps = 1e-3f;
    for (size_t i = off; i < off + n; i++) {
        float keep = m->params[i];
        m->params[i] = keep + eps;
        double up = mean_loss(m, x, y, B);
        m->params[i] = keep - eps;
        double down = mean_loss(m, x, y, B);
        m->params[i] = keep;
        double num = (up - down) / (2.0 * eps), ana = analytic[i];
        double tol = 1e-2 * fmax(fabs(num), fabs(ana)) + 2e-4;
        if (fabs(num - ana) > tol)
            fail_msg("param %zu: analytic %.6g numeric %.6g", i, ana, num);
    }
}

static void test_backward__every_layer_matches_finite_differences(void **state)
{
    (void)state;
    enum { IN = 6, OUT = 4, B = 5 };
    int hidden[2] = {7, 5};
    gt_mlp m;
    assert_int_equal(gt_mlp_init(&m, IN, hidden, 2, OUT, B, 3, NULL), 0);
    gt_mt19937 mt;
    gt_mt_seed(&mt, 99);
    float x[B * IN];
    uint8_t y[B];
    for (int i = 0; i < B * IN; i++)
        x[i] = 2.0f * gt_mt_uniform(&mt) - 1.0f;
    for (int i = 0; i < B; i++)
        y[i] = (uint8_t)(i % OUT);
    gt_mlp_forward(&m, x, B);
    int64_t c = 0;
    gt_mlp_loss(&m, y, B, 1, &c);
    gt_mlp_backward(&m, x, B);
    float *grads = malloc(m.nparams * sizeof(float));
    memcpy(grads, m.grads, m.nparams * sizeof(float));
    size_t live = 0;
    for (size_t i = 0; i < m.nparams; i++)
        live += fabsf(grads[i]) > 1e-5f;
    assert_true(live > m.nparams / 3); /* most parameters get a real gradient to check */
    for (int l = 0; l < m.nlayers; l++) {
        check_block(&m, x, y, B, m.w_off[l], (size_t)m.sizes[l] * m.sizes[l + 1], grads);
        check_block(&m, x, y, B, m.b_off[l], (size_t)m.sizes[l + 1], grads);
    }
    free(grads);
    gt_mlp_release(&m);
}

static void test_init__is_deterministic_and_bounded_like_nn_linear(void **state)
{
    (void)state;
    int hidden[1] = {16};
    gt_mlp a, b, c;
    assert_int_equal(gt_mlp_init(&a, 25, hidden, 1, 10, 1, 7, NULL), 0);
    assert_int_equal(gt_mlp_init(&b, 25, hidden, 1, 10, 1, 7, NULL), 0);
    assert_int_equal(gt_mlp_init(&c, 25, hidden, 1, 10, 1, 8, NULL), 0);
    assert_memory_equal(a.params, b.params, a.nparams * sizeof(float));
    assert_memory_not_equal(a.params, c.params, a.nparams * sizeof(float));
    for (size_t i = a.w_off[0]; i < a.w_off[1]; i++)
        assert_true(fabsf(a.params[i]) <= 1.0f / 5.0f); /* 1/sqrt(25) */
    for (size_t i = a.w_off[1]; i < a.nparams; i++)
        assert_true(fabsf(a.params[i]) <= 0.25f); /* 1/sqrt(16) */
    gt_mlp_release(&a);
    gt_mlp_release(&b);
    gt_mlp_release(&c);
}

static void test_init__rejects_bad_sizes(void **state)
{
    (void)state;
    int hidden[1] = {0};
    gt_mlp m;
    gt_err err = {{0}};
    assert_int_equal(gt_mlp_init(&m, 4, hidden, 1, 2, 1, 0, &err), -1);
    assert_non_null(strstr(err.msg, "layer 0"));
    assert_null(m.params);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm__all_transposes_match_a_naive_product),
        cmocka_unit_test(test_loss__matches_hand_computed_cross_entropy),
        cmocka_unit_test(test_backward__every_layer_matches_finite_differences),
        cmocka_unit_test(test_init__is_deterministic_and_bounded_like_nn_linear),
        cmocka_unit_test(test_init__rejects_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
