/* test_idx.c: IDX loading: plain and gzipped files load to the same data; every malformed form
 * (wrong magic, wrong type, truncated header, truncated data, count mismatch) fails with a message
 * that names the offending file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>

#include "idx.h"
#include "testutil.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    tu_mkdtemp(dir, sizeof(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(dir);
    return 0;
}

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

static void test_idx__plain_and_gzip_load_the_same_bytes(void **state)
{
    (void)state;
    uint8_t data[2 * 3 * 4];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    uint32_t dims[3] = {2, 3, 4};
    char p1[512], p2[512];
    path_of(p1, sizeof(p1), "a-idx3-ubyte");
    path_of(p2, sizeof(p2), "a-idx3-ubyte.gz");
    assert_int_equal(tu_write_idx(p1, 0, dims, 3, data), 0);
    assert_int_equal(tu_write_idx(p2, 1, dims, 3, data), 0);
    gt_idx a, b;
    gt_err err = {{0}};
    assert_int_equal(gt_idx_load(p1, &a, &err), 0);
    assert_int_equal(gt_idx_load(p2, &b, &err), 0);
    assert_int_equal(a.count, 2);
    assert_int_equal(a.item_size, 12);
    assert_int_equal(a.ndim, 3);
    assert_memory_equal(a.data, data, sizeof(data));
    assert_memory_equal(b.data, data, sizeof(data));
    gt_idx_release(&a);
    gt_idx_release(&b);
}

/* Loads path and checks it fails with a message that contains the path and `what`. */
static void expect_failure(const char *path, const char *what)
{
    gt_idx x;
    gt_err err = {{0}};
    assert_int_equal(gt_idx_load(path, &x, &err), -1);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, what));
    assert_null(x.data);
}

static void test_idx__wrong_magic_names_the_file(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "bad-magic");
    const uint8_t bytes[] = {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 5};
    assert_int_equal(tu_write_raw(p, bytes, sizeof(bytes)), 0);
    expect_failure(p, "not an IDX file");
}

static void test_idx__non_u8_type_is_rejected(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "float-type");
    const uint8_t bytes[] = {0, 0, 0x0d, 0x01, 0, 0, 0, 1, 0, 0, 0, 0};
    assert_int_equal(tu_write_raw(p, bytes, sizeof(bytes)), 0);
    expect_failure(p, "unsupported");
}

static void test_idx__truncated_header_names_the_file(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "short-header");
    const uint8_t bytes[] = {0, 0, 0x08, 0x03, 0, 0, 0, 2, 0, 0};
    assert_int_equal(tu_write_raw(p, bytes, sizeof(bytes)), 0);
    expect_failure(p, "truncated IDX header");
}

static void test_idx__truncated_data_names_the_file(void **state)
{
    (void)state;
    /* The header promises 11 one-byte items; only 3 follow, plain and inside a whole gzip. */
    const uint8_t bytes[] = {0, 0, 0x08, 0x01, 0, 0, 0, 11, 1, 2, 3};
    char p[512];
    path_of(p, sizeof(p), "short-data-plain");
    assert_int_equal(tu_write_raw(p, bytes, sizeof(bytes)), 0);
    expect_failure(p, "truncated");
    path_of(p, sizeof(p), "short-data.gz");
    gzFile g = gzopen(p, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, bytes, sizeof(bytes)), (int)sizeof(bytes));
    assert_int_equal(gzclose(g), Z_OK);
    expect_failure(p, "truncated");
}

static void test_idx__zero_dimension_is_rejected(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "zero-dim");
    const uint8_t bytes[] = {0, 0, 0x08, 0x02, 0, 0, 0, 3, 0, 0, 0, 0};
    assert_int_equal(tu_write_raw(p, bytes, sizeof(bytes)), 0);
    expect_failure(p, "zero");
}

static void test_idx__missing_file_names_the_file(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof(p), "does-not-exist");
    expect_failure(p, "cannot open");
}

static void test_dataset__count_mismatch_names_both_files(void **state)
{
    (void)state;
    uint8_t img[3 * 4] = {0}, lab[2] = {1, 2};
    uint32_t idims[3] = {3, 2, 2}, ldims[1] = {2};
    char p[512];
    path_of(p, sizeof(p), "train-images-idx3-ubyte");
    assert_int_equal(tu_write_idx(p, 0, idims, 3, img), 0);
    path_of(p, sizeof(p), "train-labels-idx1-ubyte.gz");
    assert_int_equal(tu_write_idx(p, 1, ldims, 1, lab), 0);
    gt_dataset ds;
    gt_err err = {{0}};
    assert_int_equal(gt_dataset_load(dir, "train", &ds, &err), -1);
    assert_non_null(strstr(err.msg, "train-images-idx3-ubyte"));
    assert_non_null(strstr(err.msg, "train-labels-idx1-ubyte.gz"));
    assert_non_null(strstr(err.msg, "3 images but 2 labels"));
    assert_null(ds.x);
}

static void test_dataset__pixels_scale_to_unit_range(void **state)
{
    (void)state;
    uint8_t img[2 * 2] = {0, 255, 51, 102}, lab[2] = {4, 1};
    uint32_t idims[3] = {2, 1, 2}, ldims[1] = {2};
    char p[512];
    path_of(p, sizeof(p), "x-images-idx3-ubyte.gz");
    assert_int_equal(tu_write_idx(p, 1, idims, 3, img), 0);
    path_of(p, sizeof(p), "x-labels-idx1-ubyte");
    assert_int_equal(tu_write_idx(p, 0, ldims, 1, lab), 0);
    gt_dataset ds;
    gt_err err = {{0}};
    assert_int_equal(gt_dataset_load(dir, "x", &ds, &err), 0);
    assert_int_equal(ds.count, 2);
    assert_int_equal(ds.dim, 2);
    assert_int_equal(ds.nclasses, 5);
    assert_near(ds.x[1], 1.0f, 0.0f);
    assert_near(ds.x[2], 0.2f, 1e-7f);
    assert_int_equal(ds.y[0], 4);
    gt_dataset_release(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx__plain_and_gzip_load_the_same_bytes),
        cmocka_unit_test(test_idx__wrong_magic_names_the_file),
        cmocka_unit_test(test_idx__non_u8_type_is_rejected),
        cmocka_unit_test(test_idx__truncated_header_names_the_file),
        cmocka_unit_test(test_idx__truncated_data_names_the_file),
        cmocka_unit_test(test_idx__zero_dimension_is_rejected),
        cmocka_unit_test(test_idx__missing_file_names_the_file),
        cmocka_unit_test(test_dataset__count_mismatch_names_both_files),
        cmocka_unit_test(test_dataset__pixels_scale_to_unit_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
