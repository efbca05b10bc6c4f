/* test_optim.c: SGD with momentum and weight decay, and Adam, against values computed by hand
 * (in double, from torch.optim's documented update rules) for two steps; the cosine lr schedule
 * against CosineAnnealingLR's own recursion. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "optim.h"
#include "testutil.h"
#include "train.h"

static void test_sgd__momentum_buffer_starts_at_first_gradient(void **state)
{
    (void)state;
    gt_optim o;
    assert_int_equal(gt_optim_init(&o, GT_OPTIM_SGD, 1, 0.1f, 0.9f, 0.01f, NULL), 0);
    float p = 1.0f, g = 0.5f;
    gt_optim_step(&o, &p, &g);
    /* d = 0.5 + 0.01*1 = 0.51; buf = d; p = 1 - 0.1*0.51 */
    assert_near(p, 0.949f, 1e-6f);
    gt_optim_step(&o, &p, &g);
    /* d = 0.5 + 0.00949; buf = 0.9*0.51 + d = 0.96849; p = 0.949 - 0.096849 */
    assert_near(p, 0.852151f, 1e-6f);
    assert_int_equal(o.step, 2);
    gt_optim_release(&o);
}

static void test_sgd__without_momentum_is_plain_descent(void **state)
{
    (void)state;
    gt_optim o;
    assert_int_equal(gt_optim_init(&o, GT_OPTIM_SGD, 2, 0.5f, 0.0f, 0.0f, NULL), 0);
    float p[2] = {1.0f, -2.0f}, g[2] = {0.25f, -1.0f};
    gt_optim_step(&o, p, g);
    assert_near(p[0], 0.875f, 0.0f);
    assert_near(p[1], -1.5f, 0.0f);
    gt_optim_release(&o);
}

static void test_adam__two_steps_match_bias_corrected_update(void **state)
{
    (void)state;
    gt_optim o;
    assert_int_equal(gt_optim_init(&o, GT_OPTIM_ADAM, 1, 0.1f, 0.0f, 0.0f, NULL), 0);
    float p = 1.0f, g = 0.5f;
    gt_optim_step(&o, &p, &g);
    assert_near(p, 0.900000002f, 1e-6f);
    g = -0.25f;
    gt_optim_step(&o, &p, &g);
    assert_near(p, 0.8733662987f, 1e-6f);
    assert_near(o.m[0], 0.02f, 1e-7f);
    assert_near(o.v[0], 0.00031225f, 1e-9f);
    gt_optim_release(&o);
}

static void test_adam__weight_decay_is_added_to_the_gradient(void **state)
{
    (void)state;
    gt_optim o;
    assert_int_equal(gt_optim_init(&o, GT_OPTIM_ADAM, 1, 0.1f, 0.0f, 0.1f, NULL), 0);
    float p = 1.0f, g = 0.5f;
    gt_optim_step(&o, &p, &g);
    /* g' = 0.6: m = 0.06, v = 0.00036; the first step is lr * sign, as without decay */
    assert_near(o.m[0], 0.06f, 1e-7f);
    assert_near(o.v[0], 0.00036f, 1e-9f);
    assert_near(p, 0.9f, 1e-6f);
    gt_optim_release(&o);
}

static void test_optim__parse_names(void **state)
{
    (void)state;
    gt_optim_kind k;
    assert_int_equal(gt_optim_parse("adam", &k), 0);
    assert_int_equal(k, GT_OPTIM_ADAM);
    assert_int_equal(gt_optim_parse("sgd", &k), 0);
    assert_int_equal(k, GT_OPTIM_SGD);
    assert_int_equal(gt_optim_parse("adamw", &k), -1);
}

/* The lr of every step of a 100-step run against torch.optim.lr_scheduler.CosineAnnealingLR
 * (T_max=100, eta_min=0) as PyTorch computes it: recursively from the previous lr. */
static void test_schedule__cosine_matches_torch_cosine_annealing_lr(void **state)
{
    (void)state;
    gt_config c;
    gt_config_defaults(&c);
    c.lr = 0.1f;
    const int T = 100;
    double torch_lr = c.lr;
    for (int e = 0; e <= T; e++) {
        if (e > 0)
            torch_lr *= (1.0 + cos(M_PI * e / T)) / (1.0 + cos(M_PI * (e - 1) / T));
        assert_true(fabs(gt_train_lr_at(&c, e, T) - torch_lr) <= 1e-6 * c.lr);
    }
    assert_true(gt_train_lr_at(&c, T / 2, T) == 0.05f);
    assert_true(gt_train_lr_at(&c, T, T) == 0.0f);
    c.cosine = false; /* --lr-schedule constant */
    assert_true(gt_train_lr_at(&c, T / 2, T) == c.lr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd__momentum_buffer_starts_at_first_gradient),
        cmocka_unit_test(test_sgd__without_momentum_is_plain_descent),
        cmocka_unit_test(test_adam__two_steps_match_bias_corrected_update),
        cmocka_unit_test(test_adam__weight_decay_is_added_to_the_gradient),
        cmocka_unit_test(test_optim__parse_names),
        cmocka_unit_test(test_schedule__cosine_matches_torch_cosine_annealing_lr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
