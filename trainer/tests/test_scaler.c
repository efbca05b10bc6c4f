/* test_scaler.c: GradScaler's logic (skip and halve on inf/NaN, unscale, double after 2000
 * clean steps) and the bf16/fp16 rounding the CPU path emulates mixed precision with. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model.h"
#include "scaler.h"
#include "testutil.h"

static void test_scaler__overflow_skips_the_step_and_halves_the_scale(void **state)
{
    (void)state;
    gt_scaler s;
    gt_scaler_init(&s, GT_SCALER_INIT);
    float g[3] = {1.0f, INFINITY, 2.0f};
    assert_int_equal(gt_scaler_unscale_and_update(&s, g, 3), 0);
    assert_true(s.scale == 32768.0f);
    assert_int_equal(s.skipped, 1);
    float n[2] = {NAN, 0.0f};
    assert_int_equal(gt_scaler_unscale_and_update(&s, n, 2), 0);
    assert_true(s.scale == 16384.0f);
    assert_int_equal(s.skipped, 2);
}

static void test_scaler__clean_steps_unscale_and_double_after_2000(void **state)
{
    (void)state;
    gt_scaler s;
    gt_scaler_init(&s, 1024.0f);
    float g[2] = {2048.0f, -512.0f};
    assert_int_equal(gt_scaler_unscale_and_update(&s, g, 2), 1);
    assert_true(g[0] == 2.0f && g[1] == -0.5f);
    for (int i = 1; i < GT_SCALER_GROWTH_INTERVAL - 1; i++) {
        float one = 1.0f;
        gt_scaler_unscale_and_update(&s, &one, 1);
    }
    assert_true(s.scale == 1024.0f); /* 1999 clean steps */
    float one = 1.0f;
    gt_scaler_unscale_and_update(&s, &one, 1);
    assert_true(s.scale == 2048.0f); /* the 2000th doubles it */
    float bad = INFINITY;
    gt_scaler_unscale_and_update(&s, &bad, 1); /* an overflow restarts the count */
    for (int i = 0; i < GT_SCALER_GROWTH_INTERVAL - 1; i++) {
        float x = 1.0f;
        gt_scaler_unscale_and_update(&s, &x, 1);
    }
    assert_true(s.scale == 1024.0f);
    assert_int_equal(s.skipped, 1);
}

static void test_rounding__bf16_and_fp16_round_to_nearest_even(void **state)
{
    (void)state;
    /* bf16 keeps 8 significant bits: 1 + 2^-8 is a tie and goes to even (1), 1 + 3*2^-8 up. */
    assert_true(gt_round_to(GT_PREC_BF16, 1.0f + 0x1p-8f) == 1.0f);
    assert_true(gt_round_to(GT_PREC_BF16, 1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    assert_true(gt_round_to(GT_PREC_BF16, 1e30f) != 1e30f); /* fp32's range, not its bits */
    assert_true(isfinite(gt_round_to(GT_PREC_BF16, 1e30f)));
    /* fp16: 11 significant bits, largest finite 65504; the halfway point to 65536 overflows. */
    assert_true(gt_round_to(GT_PREC_FP16, 1.0f + 0x1p-11f) == 1.0f);
    assert_true(gt_round_to(GT_PREC_FP16, 65504.0f) == 65504.0f);
    assert_true(isinf(gt_round_to(GT_PREC_FP16, 65520.0f)));
    assert_true(gt_round_to(GT_PREC_FP16, 1e-8f) == 0.0f); /* below the smallest subnormal */
    assert_true(gt_round_to(GT_PREC_FP32, 1.0f + 0x1p-20f) == 1.0f + 0x1p-20f);
}

static void test_gemm__bf16_rounds_the_inputs_and_accumulates_in_fp32(void **state)
{
    (void)state;
    /* (1 + 2^-9) * 1, 256 times: in bf16 the input rounds to 1 and the sum is exactly 256. */
    float a[256], b[256], c = 0;
    for (int i = 0; i < 256; i++)
        a[i] = 1.0f + 0x1p-9f, b[i] = 1.0f;
    gt_gemm_set_precision(GT_PREC_BF16);
    gt_gemm(0, 0, 1, 1, 256, a, 256, b, 1, &c, 1);
    gt_gemm_set_precision(GT_PREC_FP32);
    assert_true(c == 256.0f);
    gt_gemm(0, 0, 1, 1, 256, a, 256, b, 1, &c, 1);
    assert_near(c, 256.5, 1e-4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scaler__overflow_skips_the_step_and_halves_the_scale),
        cmocka_unit_test(test_scaler__clean_steps_unscale_and_double_after_2000),
        cmocka_unit_test(test_rounding__bf16_and_fp16_round_to_nearest_even),
        cmocka_unit_test(test_gemm__bf16_rounds_the_inputs_and_accumulates_in_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
