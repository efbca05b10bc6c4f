/* test_ckpt.c: checkpoints round-trip parameters, optimiser state and run metadata exactly;
 * every corruption (payload byte, header byte, magic, truncation) and every mismatch (shapes,
 * optimiser) is refused with a message naming the file, leaving the live model untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt.h"
#include "testutil.h"

static char dir[256], path[512];

typedef struct fixture {
    gt_mlp m;
    gt_optim o;
    gt_ckpt_meta meta;
} fixture;

static void make(fixture *f, const int *hidden, int nh, gt_optim_kind kind, uint64_t seed)
{
    assert_int_equal(gt_mlp_init(&f->m, 6, hidden, nh, 3, 2, seed, NULL), 0);
    assert_int_equal(gt_optim_init(&f->o, kind, f->m.nparams, 0.01f, 0.9f, 0.0f, NULL), 0);
    for (size_t i = 0; i < f->m.nparams; i++) {
        f->o.m[i] = (float)i * 0.5f;
        if (f->o.v)
            f->o.v[i] = (float)i * 0.25f;
    }
    f->o.step = 17;
    f->meta = (gt_ckpt_meta){.epoch = 3, .seed = seed, .best_acc = 0.75, .global_batch = 128};
}

static void release(fixture *f)
{
    gt_mlp_release(&f->m);
    gt_optim_release(&f->o);
}

static int setup(void **state)
{
    (void)state;
    tu_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/last.ckpt", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(dir);
    return 0;
}

static void test_ckpt__round_trip_restores_everything(void **state)
{
    (void)state;
    int hidden[1] = {5};
    fixture a, b;
    make(&a, hidden, 1, GT_OPTIM_ADAM, 1);
    make(&b, hidden, 1, GT_OPTIM_ADAM, 2);
    memset(b.o.m, 0, b.o.n * sizeof(float));
    b.o.step = 0;
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, &err), 0);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1); /* renamed into place, no temp left */
    gt_ckpt_meta meta = {0};
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), 0);
    assert_memory_equal(a.m.params, b.m.params, a.m.nparams * sizeof(float));
    assert_memory_equal(a.o.m, b.o.m, a.o.n * sizeof(float));
    assert_memory_equal(a.o.v, b.o.v, a.o.n * sizeof(float));
    assert_int_equal(b.o.step, 17);
    assert_int_equal(meta.epoch, 3);
    assert_int_equal(meta.seed, 1);
    assert_int_equal(meta.global_batch, 128);
    assert_near(meta.best_acc, 0.75, 0.0);
    release(&a);
    release(&b);
}

/* Flips one byte at offset (from the end when negative) and expects load to fail with `what`
 * while leaving the target's parameters as they were. */
static void expect_corrupt(long offset, const char *what)
{
    int hidden[1] = {5};
    fixture a, b;
    make(&a, hidden, 1, GT_OPTIM_SGD, 1);
    make(&b, hidden, 1, GT_OPTIM_SGD, 2);
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    size_t n;
    unsigned char *bytes = tu_read_file(path, &n);
    assert_non_null(bytes);
    size_t at = offset >= 0 ? (size_t)offset : n - (size_t)(-offset);
    bytes[at] ^= 0x40;
    assert_int_equal(tu_write_raw(path, bytes, n), 0);
    free(bytes);
    float before = b.m.params[0];
    gt_ckpt_meta meta;
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, what));
    assert_near(b.m.params[0], before, 0.0f);
    release(&a);
    release(&b);
}

static void test_ckpt__corrupt_payload_is_detected(void **state)
{
    (void)state;
    expect_corrupt(-3, "payload is corrupt");
}

static void test_ckpt__corrupt_header_is_detected(void **state)
{
    (void)state;
    expect_corrupt(20, "header is corrupt");
}

static void test_ckpt__bad_magic_is_detected(void **state)
{
    (void)state;
    expect_corrupt(0, "bad magic");
}

static void test_ckpt__truncated_file_is_detected(void **state)
{
    (void)state;
    int hidden[1] = {5};
    fixture a;
    make(&a, hidden, 1, GT_OPTIM_ADAM, 1);
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    size_t n;
    void *bytes = tu_read_file(path, &n);
    assert_int_equal(tu_write_raw(path, bytes, n - 8), 0);
    free(bytes);
    gt_ckpt_meta meta;
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_load(path, &a.m, &a.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_int_equal(tu_write_raw(path, "GSTR", 4), 0);
    assert_int_equal(gt_ckpt_load(path, &a.m, &a.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "short header"));
    release(&a);
}

static void test_ckpt__other_shapes_are_refused(void **state)
{
    (void)state;
    int h5[1] = {5}, h4[1] = {4};
    fixture a, b;
    make(&a, h5, 1, GT_OPTIM_ADAM, 1);
    make(&b, h4, 1, GT_OPTIM_ADAM, 1);
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    gt_ckpt_meta meta;
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "layer sizes 6,5,3 differ"));
    release(&a);
    release(&b);
}

static void test_ckpt__other_optimiser_is_refused(void **state)
{
    (void)state;
    int h5[1] = {5};
    fixture a, b;
    make(&a, h5, 1, GT_OPTIM_ADAM, 1);
    make(&b, h5, 1, GT_OPTIM_SGD, 1);
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    gt_ckpt_meta meta;
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "--optim adam"));
    release(&a);
    release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ckpt__round_trip_restores_everything),
        cmocka_unit_test(test_ckpt__corrupt_payload_is_detected),
        cmocka_unit_test(test_ckpt__corrupt_header_is_detected),
        cmocka_unit_test(test_ckpt__bad_magic_is_detected),
        cmocka_unit_test(test_ckpt__truncated_file_is_detected),
        cmocka_unit_test(test_ckpt__other_shapes_are_refused),
        cmocka_unit_test(test_ckpt__other_optimiser_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
