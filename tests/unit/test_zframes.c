/* Unit tests for proto/zframes.c: batches of frames packed into one session's zstd stream, some
 * going plain after incompressible data, unpack in order to exactly the frames that went in; a
 * damaged ZFRAMES is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/sync.h"
#include "proto/zframes.h"

/* Appends a PUT frame of `n` bytes of text (compressible) or noise to b. */
static void put_frame(struct gs_proto_buf *b, uint32_t id, size_t n, int noise)
{
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = noise ? (char)(rand() & 0xff) : "def f(x):\n    return x\n"[i % 24];
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = id};
    m.path = gs_proto_cstr("a.py");
    m.data = (struct gs_proto_str){data, (uint32_t)n};
    assert_int_equal(gs_proto_encode(b, &m), 0);
    free(data);
}

/* Unpacks every frame of `wire` (ZFRAMES or plain) with `rx` into `got`. */
static void receive(struct gs_zframes *rx, const struct gs_proto_buf *wire,
                    struct gs_proto_buf *got)
{
    struct gs_proto_buf raw;
    gs_proto_buf_init(&raw);
    for (size_t at = 0; at < wire->len;) {
        struct gs_proto_frame f;
        long len = gs_proto_parse_frame(wire->data + at, wire->len - at, &f);
        assert_true(len > 0);
        if (f.type == GS_MSG_ZFRAMES) {
            struct gs_proto_msg m;
            assert_int_equal(gs_proto_decode(&f, &m), 0);
            assert_int_equal(gs_zframes_unpack(rx, &m, &raw), 0);
            assert_int_equal(gs_proto_buf_reserve(got, raw.len), 0);
            memcpy(got->data + got->len, raw.data, raw.len);
            got->len += raw.len;
        } else {
            assert_int_equal(gs_proto_buf_reserve(got, (size_t)len), 0);
            memcpy(got->data + got->len, wire->data + at, (size_t)len);
            got->len += (size_t)len;
        }
        at += (size_t)len;
    }
    gs_proto_buf_release(&raw);
}

static void test_zframes__batches_of_one_stream_arrive_exact(void **state)
{
    (void)state;
    struct gs_zframes *tx = gs_zframes_new(1), *rx = gs_zframes_new(1);
    assert_non_null(tx);
    assert_non_null(rx);
    struct gs_proto_buf sent, wire, got;
    gs_proto_buf_init(&sent), gs_proto_buf_init(&wire), gs_proto_buf_init(&got);
    for (size_t i = 0; i < 7; i++) {
        struct gs_proto_buf batch;
        gs_proto_buf_init(&batch);
        put_frame(&batch, (uint32_t)i * 2 + 1, 20000 + i * 1000, 0);
        /* batch 3 holds 3 MB of noise: it goes compressed once, then the rest plain */
        put_frame(&batch, (uint32_t)i * 2 + 2, i == 3 ? 3u << 20 : 3000, i == 3);
        for (size_t at = 0; at < batch.len;) {
            long used = gs_zframes_pack(tx, GS_MSG_ZFRAMES, batch.data + at, batch.len - at, &wire);
            assert_true(used > 0);
            at += (size_t)used;
        }
        assert_int_equal(gs_proto_buf_reserve(&sent, batch.len), 0);
        memcpy(sent.data + sent.len, batch.data, batch.len);
        sent.len += batch.len;
        gs_proto_buf_release(&batch);
    }
    unsigned long long plain, on_wire;
    gs_zframes_stats(tx, &plain, &on_wire);
    assert_int_equal(plain, sent.len);
    assert_int_equal(on_wire, wire.len);
    assert_true(wire.len < sent.len - 100000); /* the 170 kB of text shrank */
    assert_true(wire.len > (3u << 20));        /* the 3 MiB of noise did not */
    receive(rx, &wire, &got);
    assert_int_equal(got.len, sent.len);
    assert_memory_equal(got.data, sent.data, sent.len);
    gs_proto_buf_release(&sent), gs_proto_buf_release(&wire), gs_proto_buf_release(&got);
    gs_zframes_free(tx);
    gs_zframes_free(rx);
}

/* A PUT frame of `n` bytes of source-like text: lines from a small vocabulary with numbers, which
 * zstd's higher levels shrink further than level 1 (as they do real code). */
static void put_code(struct gs_proto_buf *b, uint32_t id, size_t n, unsigned seed)
{
    static const char *words[] = {"model", "layer", "x", "batch", "grad", "loss", "torch", "self"};
    char *data = malloc(n + 64);
    size_t len = 0;
    while (len < n) {
        seed = seed * 1103515245u + 12345u;
        len += (size_t)sprintf(data + len, "%s_%u = %s.%s(%u)\n", words[(seed >> 8) % 8],
                               (seed >> 12) % 97, words[(seed >> 16) % 8], words[(seed >> 20) % 8],
                               (seed >> 4) % 1000);
    }
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = id};
    m.path = gs_proto_cstr("a.py");
    m.data = (struct gs_proto_str){data, (uint32_t)n};
    assert_int_equal(gs_proto_encode(b, &m), 0);
    free(data);
}

/* Packs 12 batches of code, the level set to `later` after the 4th; returns the wire bytes of all
 * and checks that they unpack exactly with a receiver that was told nothing. */
static size_t pack_with_level_change(int later)
{
    struct gs_zframes *tx = gs_zframes_new(1), *rx = gs_zframes_new(1);
    struct gs_proto_buf sent, wire, got;
    gs_proto_buf_init(&sent), gs_proto_buf_init(&wire), gs_proto_buf_init(&got);
    for (unsigned i = 0; i < 12; i++) {
        if (i == 4)
            gs_zframes_set_level(tx, later);
        size_t mark = sent.len;
        put_code(&sent, i + 1, 60000, i);
        assert_true(gs_zframes_pack(tx, GS_MSG_ZFRAMES, sent.data + mark, sent.len - mark, &wire) ==
                    (long)(sent.len - mark));
    }
    assert_int_equal(gs_zframes_level(tx), later);
    receive(rx, &wire, &got);
    assert_int_equal(got.len, sent.len);
    assert_memory_equal(got.data, sent.data, sent.len);
    size_t n = wire.len;
    gs_proto_buf_release(&sent), gs_proto_buf_release(&wire), gs_proto_buf_release(&got);
    gs_zframes_free(tx), gs_zframes_free(rx);
    return n;
}

/* A sender that finds the link slow raises its level mid-session: the batches after the change
 * are smaller, and the receiver's one stream still unpacks every batch exactly. */
static void test_zframes__a_level_raised_mid_session_shrinks_and_unpacks(void **state)
{
    (void)state;
    size_t same = pack_with_level_change(1), raised = pack_with_level_change(9);
    print_message("12 x 60 kB of code: %zu bytes at level 1, %zu raised to 9 after 4\n", same,
                  raised);
    assert_true(raised < same - same / 20);
}

static void test_zframes__a_damaged_or_oversized_batch_is_refused(void **state)
{
    (void)state;
    struct gs_zframes *tx = gs_zframes_new(1), *rx = gs_zframes_new(1);
    struct gs_proto_buf batch, wire, raw;
    gs_proto_buf_init(&batch), gs_proto_buf_init(&wire), gs_proto_buf_init(&raw);
    put_frame(&batch, 1, 50000, 0);
    assert_true(gs_zframes_pack(tx, GS_MSG_ZFRAMES, batch.data, batch.len, &wire) > 0);
    struct gs_proto_frame f;
    assert_true(gs_proto_parse_frame(wire.data, wire.len, &f) > 0);
    struct gs_proto_msg m;
    assert_int_equal(gs_proto_decode(&f, &m), 0);
    struct gs_proto_msg lie = m;
    lie.size = m.size + 1; /* says more than the stream holds */
    assert_int_equal(gs_zframes_unpack(rx, &lie, &raw), -1);
    struct gs_zframes *rx2 = gs_zframes_new(1);
    lie = m;
    lie.size = GS_PROTO_ZRAW_MAX + 1;
    assert_int_equal(gs_zframes_unpack(rx2, &lie, &raw), -1);
    char *garbage = malloc(m.data.len);
    memset(garbage, 0x5a, m.data.len);
    lie = m;
    lie.data.p = garbage;
    struct gs_zframes *rx3 = gs_zframes_new(1);
    assert_int_equal(gs_zframes_unpack(rx3, &lie, &raw), -1);
    free(garbage);
    gs_proto_buf_release(&batch), gs_proto_buf_release(&wire), gs_proto_buf_release(&raw);
    gs_zframes_free(tx), gs_zframes_free(rx), gs_zframes_free(rx2), gs_zframes_free(rx3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zframes__batches_of_one_stream_arrive_exact),
        cmocka_unit_test(test_zframes__a_level_raised_mid_session_shrinks_and_unpacks),
        cmocka_unit_test(test_zframes__a_damaged_or_oversized_batch_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
