/* tests/unit/test_hash.c: syncd/hash: streaming XXH3-128 of files equals the one-shot hash of the
 * same bytes, in the agent's canonical byte order, and symlinks are refused rather than followed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/buf.h"
#include "syncd/hash.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-hash-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *tmp_path(const char *name)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_addf(&b, "%s/%s", tmpdir, name);
    return gs_buf_detach(&b, NULL);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Canonical order is the high 64 bits big-endian, then the low 64 bits big-endian. */
static void expected_hex(const void *data, size_t len, char out[GS_HASH_HEX_LEN + 1])
{
    XXH128_hash_t h = XXH3_128bits(data, len);
    snprintf(out, GS_HASH_HEX_LEN + 1, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

static void test_hash__file_spanning_many_chunks_equals_one_shot_hash(void **state)
{
    (void)state;
    size_t len = 3 * 1024 * 1024 + 17; /* not a multiple of any chunk size */
    unsigned char *data = malloc(len);
    assert_non_null(data);
    for (size_t i = 0; i < len; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    char *path = tmp_path("big.bin");
    write_file(path, data, len);
    struct gs_hash h;
    struct gs_error err = {0};
    assert_int_equal(gs_hash_file(path, &h, &err), 0);
    char got[GS_HASH_HEX_LEN + 1], want[GS_HASH_HEX_LEN + 1];
    expected_hex(data, len, want);
    assert_string_equal(gs_hash_hex(&h, got), want);
    free(data);
    free(path);
}

static void test_hash__empty_file_equals_hash_of_no_bytes(void **state)
{
    (void)state;
    char *path = tmp_path("empty");
    write_file(path, "", 0);
    struct gs_hash h, m;
    assert_int_equal(gs_hash_file(path, &h, NULL), 0);
    gs_hash_bytes("", 0, &m);
    assert_true(gs_hash_equal(&h, &m));
    char got[GS_HASH_HEX_LEN + 1], want[GS_HASH_HEX_LEN + 1];
    expected_hex("", 0, want);
    assert_string_equal(gs_hash_hex(&m, got), want);
    free(path);
}

static void test_hash__hex_round_trips_and_rejects_garbage(void **state)
{
    (void)state;
    struct gs_hash h, back;
    gs_hash_bytes("gpusync", 7, &h);
    char hex[GS_HASH_HEX_LEN + 1];
    gs_hash_hex(&h, hex);
    assert_int_equal(gs_hash_from_hex(hex, &back, NULL), 0);
    assert_true(gs_hash_equal(&h, &back));
    struct gs_error err = {0};
    assert_int_equal(gs_hash_from_hex("abc", &back, &err), GS_E_USAGE);
    assert_non_null(strstr(err.msg, "abc"));
    hex[5] = 'g';
    assert_int_equal(gs_hash_from_hex(hex, &back, NULL), GS_E_USAGE);
}

static void test_hash__symlink_is_refused_not_followed(void **state)
{
    (void)state;
    char *target = tmp_path("target");
    char *link = tmp_path("link");
    write_file(target, "secret", 6);
    assert_int_equal(symlink(target, link), 0);
    struct gs_hash h;
    struct gs_error err = {0};
    assert_int_equal(gs_hash_file(link, &h, &err), GS_E_IO);
    assert_non_null(strstr(err.msg, "link"));
    free(target);
    free(link);
}

static void test_hash__missing_file_is_notfound(void **state)
{
    (void)state;
    char *path = tmp_path("nope");
    struct gs_hash h;
    struct gs_error err = {0};
    assert_int_equal(gs_hash_file(path, &h, &err), GS_E_NOTFOUND);
    free(path);
}

static void test_hash__directory_is_refused(void **state)
{
    (void)state;
    struct gs_hash h;
    assert_int_equal(gs_hash_file(tmpdir, &h, NULL), GS_E_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hash__file_spanning_many_chunks_equals_one_shot_hash,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash__empty_file_equals_hash_of_no_bytes, setup,
                                        teardown),
        cmocka_unit_test(test_hash__hex_round_trips_and_rejects_garbage),
        cmocka_unit_test_setup_teardown(test_hash__symlink_is_refused_not_followed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hash__missing_file_is_notfound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash__directory_is_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
