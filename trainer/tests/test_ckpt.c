/* test_ckpt.c: checkpoints round-trip parameters, optimiser state and run metadata exactly;
 * every corruption (payload byte, header byte, magic, truncation) and every mismatch (shapes,
 * optimiser, model kind) is refused with a message naming the file, leaving the live model
 * untouched; version-1 and -2 files (before the loss scaler, before the run's shape) still load;
 * the loss scaler's state and a ResNet's running statistics round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "ckpt.h"
#include "resnet.h"
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

/* The header tails after header_crc: version 2's loss scaler (a float, an int32, an int64) and
 * version 3's run shape (two uint32, a uint64, two uint32). */
#define V2_TAIL 16
#define V3_TAIL 24

/* Rewrites path as a file of an older version: the header cut after that version's tail,
 * the version field set, the header CRC over the shorter header. */
static void downgrade_to(uint32_t version, size_t payload_bytes)
{
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    assert_non_null(b);
    size_t v3 = n - payload_bytes, v1 = v3 - V3_TAIL - V2_TAIL;
    size_t keep = version == 1 ? v1 : v3 - V3_TAIL, cut = v3 - keep;
    uint32_t zero = 0;
    memcpy(b + 8, &version, 4);   /* version, right after the 8-byte magic */
    memcpy(b + v1 - 4, &zero, 4); /* header_crc, the last field of the v1 header */
    uint32_t c = (uint32_t)crc32(0, b, (uInt)keep);
    memcpy(b + v1 - 4, &c, 4);
    memmove(b + keep, b + v3, payload_bytes);
    assert_int_equal(tu_write_raw(path, b, n - cut), 0);
    free(b);
}

static void test_ckpt__version_1_files_still_load(void **state)
{
    (void)state;
    int hidden[1] = {4};
    fixture a, b;
    make(&a, hidden, 1, GT_OPTIM_ADAM, 1);
    make(&b, hidden, 1, GT_OPTIM_ADAM, 2);
    a.meta.loss_scale = 1024.0f;
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    downgrade_to(1, (a.m.nparams + 2 * a.o.n) * sizeof(float));
    gt_err err = {{0}};
    gt_ckpt_meta meta;
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), 0);
    assert_memory_equal(a.m.params, b.m.params, a.m.nparams * sizeof(float));
    assert_true(meta.loss_scale == 0.0f); /* a run without loss scaling */
    assert_int_equal(meta.epoch, 3);
    release(&a);
    release(&b);
}

/* Version 3's run shape round-trips; a version-2 file keeps its loss scaler and reads the
 * shape as 0 (unknown), which a resume then checks through the global batch alone. */
static void test_ckpt__run_shape_round_trips_and_version_2_reads_it_as_unknown(void **state)
{
    (void)state;
    int hidden[1] = {4};
    fixture a, b;
    make(&a, hidden, 1, GT_OPTIM_ADAM, 1);
    make(&b, hidden, 1, GT_OPTIM_ADAM, 2);
    a.meta.loss_scale = 1024.0f;
    a.meta.world_size = 2;
    a.meta.batch_size = 64;
    a.meta.train_samples = 4096;
    a.meta.drop_last = 1;
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    gt_err err = {{0}};
    gt_ckpt_meta meta;
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), 0);
    assert_int_equal(meta.world_size, 2);
    assert_int_equal(meta.batch_size, 64);
    assert_int_equal(meta.train_samples, 4096);
    assert_int_equal(meta.drop_last, 1);
    downgrade_to(2, (a.m.nparams + 2 * a.o.n) * sizeof(float));
    assert_int_equal(gt_ckpt_load(path, &b.m, &b.o, &meta, &err), 0);
    assert_memory_equal(a.m.params, b.m.params, a.m.nparams * sizeof(float));
    assert_true(meta.loss_scale == 1024.0f);
    assert_int_equal(meta.global_batch, 128);
    assert_int_equal(meta.world_size, 0);
    assert_int_equal(meta.train_samples, 0);
    release(&a);
    release(&b);
}

static void test_ckpt__resnet_statistics_and_loss_scale_round_trip(void **state)
{
    (void)state;
    gt_mlp a, b;
    gt_optim oa, ob;
    assert_int_equal(gt_resnet_init(&a, 64, 3, 2, 1, NULL), 0);
    assert_int_equal(gt_resnet_init(&b, 64, 3, 2, 2, NULL), 0);
    assert_int_equal(gt_optim_init(&oa, GT_OPTIM_SGD, a.nparams, 0.1f, 0.9f, 0.0f, NULL), 0);
    assert_int_equal(gt_optim_init(&ob, GT_OPTIM_SGD, b.nparams, 0.1f, 0.9f, 0.0f, NULL), 0);
    for (size_t i = 0; i < a.nbuffers; i++)
        a.buffers[i] = (float)i * 0.125f;
    gt_ckpt_meta meta = {.epoch = 1, .loss_scale = 512.0f, .scaler_clean = 7, .scaler_skipped = 3};
    gt_ckpt_meta got;
    assert_int_equal(gt_ckpt_save(path, &a, &oa, &meta, NULL), 0);
    assert_int_equal(gt_ckpt_load(path, &b, &ob, &got, NULL), 0);
    assert_memory_equal(a.params, b.params, a.nparams * sizeof(float));
    assert_memory_equal(a.buffers, b.buffers, a.nbuffers * sizeof(float));
    assert_true(got.loss_scale == 512.0f);
    assert_int_equal(got.scaler_clean, 7);
    assert_int_equal(got.scaler_skipped, 3);
    /* An MLP run refuses a ResNet checkpoint, naming both kinds. */
    fixture f;
    int hidden[1] = {4};
    make(&f, hidden, 1, GT_OPTIM_SGD, 1);
    gt_err err = {{0}};
    assert_int_equal(gt_ckpt_load(path, &f.m, &f.o, &got, &err), -1);
    assert_non_null(strstr(err.msg, "resnet"));
    release(&f);
    gt_mlp_release(&a);
    gt_mlp_release(&b);
    gt_optim_release(&oa);
    gt_optim_release(&ob);
}

/* --resume given the --save-dir folder: the message says it is a directory (not a damaged
 * file) and, once the folder holds one, suggests its last.ckpt. */
static void test_ckpt__a_directory_is_named_as_one(void **state)
{
    (void)state;
    int hidden[1] = {5};
    fixture a;
    make(&a, hidden, 1, GT_OPTIM_ADAM, 1);
    gt_ckpt_meta meta;
    gt_err err = {{0}};
    unlink(path); /* left by the tests before */
    assert_int_equal(gt_ckpt_load(dir, &a.m, &a.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "is a directory"));
    assert_null(strstr(err.msg, "truncated"));
    assert_null(strstr(err.msg, "did you mean"));
    assert_int_equal(gt_ckpt_save(path, &a.m, &a.o, &a.meta, NULL), 0);
    assert_int_equal(gt_ckpt_load(dir, &a.m, &a.o, &meta, &err), -1);
    assert_non_null(strstr(err.msg, "is a directory"));
    assert_non_null(strstr(err.msg, path)); /* did you mean DIR/last.ckpt? */
    unlink(path);
    release(&a);
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
        cmocka_unit_test(test_ckpt__version_1_files_still_load),
        cmocka_unit_test(test_ckpt__run_shape_round_trips_and_version_2_reads_it_as_unknown),
        cmocka_unit_test(test_ckpt__resnet_statistics_and_loss_scale_round_trip),
        cmocka_unit_test(test_ckpt__a_directory_is_named_as_one),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
