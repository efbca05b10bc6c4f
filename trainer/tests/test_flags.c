/* test_flags.c: the command line's per-model defaults: --model picks its model's training
 * hyperparameters, and a flag given by the user wins whatever its position; values outside a
 * flag's range (NaN or negative lr, momentum or decay, a zero limit) are refused naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "flags.h"

static gt_config parsed(int argc, const char **argv)
{
    gt_config c;
    gt_err err = {{0}};
    gt_config_defaults(&c);
    assert_int_equal(gt_flags_parse(&c, argc, (char **)argv, &err), 0);
    return c;
}

static void test_flags__mlp_keeps_adam_1e3_for_10_epochs(void **state)
{
    (void)state;
    gt_config c = parsed(0, NULL);
    assert_int_equal(c.model, GT_MODEL_MLP);
    assert_int_equal(c.optim, GT_OPTIM_ADAM);
    assert_true(c.lr == 1e-3f && c.cosine && c.epochs == 10 && c.batch_size == 64);
}

static void test_flags__lenet_gets_its_own_defaults(void **state)
{
    (void)state;
    const char *argv[] = {"--model", "lenet"};
    gt_config c = parsed(2, argv);
    assert_int_equal(c.optim, GT_OPTIM_ADAM);
    assert_true(c.lr == 3e-3f && c.cosine && c.epochs == 20 && c.batch_size == 64);
    assert_true(c.dropout == 0.1f && !c.augment);
}

static void test_flags__resnet_defaults_to_sgd_with_weight_decay(void **state)
{
    (void)state;
    const char *argv[] = {"--model=resnet"};
    gt_config c = parsed(1, argv);
    assert_int_equal(c.optim, GT_OPTIM_SGD);
    assert_true(c.lr == 0.1f && c.momentum == 0.9f && c.weight_decay == 5e-4f);
    assert_true(c.cosine && c.epochs == 30 && c.batch_size == 128);
}

static void test_flags__a_given_flag_beats_the_model_default_before_or_after_it(void **state)
{
    (void)state;
    const char *before[] = {"--lr", "0.02", "--epochs", "3", "--model", "resnet"};
    const char *after[] = {"--model", "resnet", "--optim", "adam", "--batch-size=32"};
    gt_config b = parsed(6, before), a = parsed(5, after);
    assert_true(b.lr == 0.02f && b.epochs == 3 && b.optim == GT_OPTIM_SGD);
    assert_true(a.optim == GT_OPTIM_ADAM && a.batch_size == 32 && a.lr == 0.1f);
}

/* Parses argv expecting a refusal whose message names the flag and its accepted range. */
static void expect_refused(const char *flag, const char *value, const char *range)
{
    gt_config c;
    gt_err err = {{0}};
    const char *argv[] = {flag, value};
    gt_config_defaults(&c);
    assert_int_equal(gt_flags_parse(&c, 2, (char **)argv, &err), -1);
    print_message("%s %s: %s\n", flag, value, err.msg);
    assert_non_null(strstr(err.msg, flag));
    assert_non_null(strstr(err.msg, range));
}

static void test_flags__nan_and_negative_optimiser_numbers_are_refused(void **state)
{
    (void)state;
    expect_refused("--lr", "nan", ">= 0");
    expect_refused("--lr", "-0.001", ">= 0");
    expect_refused("--lr", "inf", ">= 0");
    expect_refused("--momentum", "nan", "[0, 1]");
    expect_refused("--momentum", "-0.5", "[0, 1]");
    expect_refused("--momentum", "1.5", "[0, 1]");
    expect_refused("--weight-decay", "-1e-4", ">= 0");
    expect_refused("--weight-decay", "nan", ">= 0");
}

static void test_flags__zero_or_negative_limits_are_refused(void **state)
{
    (void)state;
    expect_refused("--limit-train", "0", "at least 1");
    expect_refused("--limit-train", "-5", "at least 1");
    expect_refused("--max-steps", "0", "at least 1");
    expect_refused("--max-steps", "-1", "at least 1");
    expect_refused("--max-steps", "3x", "at least 1");
}

static void test_flags__edge_values_that_mean_something_are_accepted(void **state)
{
    (void)state;
    const char *argv[] = {"--lr",          "0", "--momentum",  "1", "--weight-decay", "0",
                          "--limit-train", "1", "--max-steps", "1"};
    gt_config c = parsed(10, argv);
    assert_true(c.lr == 0.0f && c.momentum == 1.0f && c.weight_decay == 0.0f);
    assert_true(c.limit_train == 1 && c.max_steps == 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags__mlp_keeps_adam_1e3_for_10_epochs),
        cmocka_unit_test(test_flags__lenet_gets_its_own_defaults),
        cmocka_unit_test(test_flags__resnet_defaults_to_sgd_with_weight_decay),
        cmocka_unit_test(test_flags__a_given_flag_beats_the_model_default_before_or_after_it),
        cmocka_unit_test(test_flags__nan_and_negative_optimiser_numbers_are_refused),
        cmocka_unit_test(test_flags__zero_or_negative_limits_are_refused),
        cmocka_unit_test(test_flags__edge_values_that_mean_something_are_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
