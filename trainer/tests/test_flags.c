/* test_flags.c: the command line's per-model defaults: --model picks its model's training
 * hyperparameters, and a flag given by the user wins whatever its position. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags__mlp_keeps_adam_1e3_for_10_epochs),
        cmocka_unit_test(test_flags__lenet_gets_its_own_defaults),
        cmocka_unit_test(test_flags__resnet_defaults_to_sgd_with_weight_decay),
        cmocka_unit_test(test_flags__a_given_flag_beats_the_model_default_before_or_after_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
