/* Unit tests for remote/delta.c: signatures and deltas over memory, checked by applying each delta
 * with librsync's patch job, and the signature store. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librsync.h>

#include "remote/delta.h"

#define SIZE (2u << 20)

/* Text-like content, different for each seed. */
static char *content(unsigned seed)
{
    char *p = malloc(SIZE);
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < SIZE; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (char)('a' + (x >> 16) % 26);
    }
    return p;
}

struct basis {
    const char *p;
    size_t n;
};

static rs_result copy_basis(void *arg, rs_long_t pos, size_t *len, void **buf)
{
    struct basis *b = arg;
    if ((size_t)pos >= b->n)
        return RS_INPUT_ENDED;
    if (*len > b->n - (size_t)pos)
        *len = b->n - (size_t)pos;
    memcpy(*buf, b->p + pos, *len);
    return RS_DONE;
}

/* Applies delta to basis as the agent does; returns the result (length in *n). */
static char *apply(const char *basis, size_t basis_len, const struct gs_buf *delta, size_t *n)
{
    struct basis b = {basis, basis_len};
    size_t cap = SIZE * 2;
    char *out = malloc(cap);
    rs_job_t *job = rs_patch_begin(copy_basis, &b);
    rs_buffers_t buf = {.next_in = delta->data, .avail_in = delta->len, .eof_in = 1};
    buf.next_out = out, buf.avail_out = cap;
    rs_result r;
    do
        r = rs_job_iter(job, &buf);
    while (r == RS_BLOCKED && buf.avail_out > 0);
    rs_job_free(job);
    assert_int_equal(r, RS_DONE);
    *n = cap - buf.avail_out;
    return out;
}

static void test_delta__small_edit_makes_small_delta_that_rebuilds_exactly(void **state)
{
    (void)state;
    char *old = content(1), *new = malloc(SIZE);
    memcpy(new, old, SIZE);
    memcpy(new + SIZE / 2, "{\"cell\": 42}", 12);
    struct gs_buf sig = GS_BUF_INIT, delta = GS_BUF_INIT;
    assert_int_equal(gs_delta_signature(old, SIZE, &sig, NULL), 0);
    assert_true(sig.len > 0 && sig.len < SIZE / 100);
    assert_int_equal(gs_delta_make(sig.data, sig.len, new, SIZE, SIZE, &delta, NULL), 0);
    assert_true(delta.len < 32 * 1024);
    size_t n;
    char *got = apply(old, SIZE, &delta, &n);
    assert_int_equal(n, SIZE);
    assert_memory_equal(got, new, SIZE);
    free(got), free(old), free(new);
    gs_buf_release(&sig), gs_buf_release(&delta);
}

static void test_delta__unrelated_content_passes_the_limit(void **state)
{
    (void)state;
    char *old = content(1), *new = content(2);
    struct gs_buf sig = GS_BUF_INIT, delta = GS_BUF_INIT;
    assert_int_equal(gs_delta_signature(old, SIZE, &sig, NULL), 0);
    assert_int_equal(gs_delta_make(sig.data, sig.len, new, SIZE, SIZE / 2, &delta, NULL), 1);
    assert_int_equal(delta.len, 0); /* left as it was */
    assert_int_equal(gs_delta_make("garbage!", 8, new, SIZE, SIZE, &delta, NULL), GS_E_PROTO);
    free(old), free(new);
    gs_buf_release(&sig), gs_buf_release(&delta);
}

static void test_delta__store_saves_loads_and_drops_by_hash(void **state)
{
    (void)state;
    char dir[64] = "/tmp/gs-delta-store.XXXXXX", sub[128];
    assert_non_null(mkdtemp(dir));
    snprintf(sub, sizeof(sub), "%s/sigs", dir); /* made on first save */
    uint8_t h1[16] = {1}, h2[16] = {2};
    struct gs_buf got = GS_BUF_INIT;
    assert_int_equal(gs_delta_sig_load(sub, h1, &got), GS_E_NOTFOUND);
    assert_int_equal(gs_delta_sig_save(sub, h1, "signature", 9, NULL), 0);
    assert_int_equal(gs_delta_sig_load(sub, h1, &got), 0);
    assert_int_equal(got.len, 9);
    assert_memory_equal(got.data, "signature", 9);
    assert_int_equal(gs_delta_sig_load(sub, h2, &got), GS_E_NOTFOUND);
    gs_delta_sig_drop(sub, h1);
    assert_int_equal(gs_delta_sig_load(sub, h1, &got), GS_E_NOTFOUND);
    gs_buf_release(&got);
    rmdir(sub);
    rmdir(dir);
}

/* A signature kept while its delta travels is used only once confirmed; one left pending by a
 * session that ended early is swept, and a confirmed one stays. */
static void test_delta__a_pending_signature_counts_only_once_confirmed(void **state)
{
    (void)state;
    char dir[64] = "/tmp/gs-delta-pending.XXXXXX";
    assert_non_null(mkdtemp(dir));
    uint8_t sent[16] = {3}, lost[16] = {4}, refused[16] = {5};
    char data[8192];
    memset(data, 'x', sizeof(data));
    struct gs_buf got = GS_BUF_INIT;
    gs_delta_keep_pending(dir, sent, data, sizeof(data));
    gs_delta_keep_pending(dir, lost, data, sizeof(data));
    gs_delta_keep_pending(dir, refused, data, sizeof(data));
    assert_int_equal(gs_delta_sig_load(dir, sent, &got), GS_E_NOTFOUND); /* not yet */
    gs_delta_pending_end(dir, sent, 1);
    gs_delta_pending_end(dir, refused, 0);
    assert_int_equal(gs_delta_sig_load(dir, sent, &got), 0);
    assert_true(got.len > 0);
    assert_int_equal(gs_delta_sig_load(dir, refused, &got), GS_E_NOTFOUND);
    gs_delta_sweep_pending(dir); /* `lost` was never answered */
    gs_delta_pending_end(dir, lost, 1);
    assert_int_equal(gs_delta_sig_load(dir, lost, &got), GS_E_NOTFOUND);
    assert_int_equal(gs_delta_sig_load(dir, sent, &got), 0);
    gs_delta_sig_drop(dir, sent);
    gs_buf_release(&got);
    assert_int_equal(rmdir(dir), 0); /* nothing else was left there */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delta__small_edit_makes_small_delta_that_rebuilds_exactly),
        cmocka_unit_test(test_delta__unrelated_content_passes_the_limit),
        cmocka_unit_test(test_delta__store_saves_loads_and_drops_by_hash),
        cmocka_unit_test(test_delta__a_pending_signature_counts_only_once_confirmed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
