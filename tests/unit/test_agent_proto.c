/* Unit tests for the agent wire protocol codec (proto/sync.c): every message survives an
 * encode/parse/decode round trip, and short, oversized, undersized or padded frames are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/sync.h"

static const char hostile[] = "dir with space/-lead\nnew\xff\xfe";

/* Encodes m into a fresh buffer, parses exactly one frame and decodes it into *out. The
 * buffer is returned in *b (caller releases) because *out borrows from it. */
static void round_trip(const struct gs_proto_msg *m, struct gs_proto_buf *b,
                       struct gs_proto_msg *out)
{
    struct gs_proto_frame f;
    gs_proto_buf_init(b);
    assert_int_equal(gs_proto_encode(b, m), 0);
    assert_int_equal(gs_proto_parse_frame(b->data, b->len, &f), (long)b->len);
    assert_int_equal(f.type, m->type);
    assert_int_equal(f.id, m->id);
    assert_int_equal(gs_proto_decode(&f, out), 0);
    assert_int_equal(out->type, m->type);
    assert_int_equal(out->id, m->id);
}

static void assert_str(struct gs_proto_str a, struct gs_proto_str b)
{
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.p, b.p, a.len);
}

static struct gs_proto_msg sample(uint8_t type)
{
    struct gs_proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.id = 0xdeadbe00u + type;
    m.path = gs_proto_cstr(hostile);
    m.path2 = gs_proto_cstr("other/target");
    m.text = gs_proto_cstr("agent 0.1.0");
    m.data = gs_proto_cstr("file bytes\0with nul");
    m.meta.mode = 0755;
    m.meta.mtime_sec = -12345678901LL;
    m.meta.mtime_nsec = 999999999u;
    m.expect.kind = GS_EXPECT_HASH;
    for (int i = 0; i < GS_PROTO_HASH_LEN; i++)
        m.expect.hash[i] = (uint8_t)(i * 7 + 1), m.hash[i] = (uint8_t)(0xf0 - i);
    m.size = 0x0123456789abcdefULL;
    m.flags = 3;
    return m;
}

static void test_proto__hello_and_hello_ok_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_HELLO), d;
    m.magic = GS_PROTO_MAGIC, m.version = GS_PROTO_VERSION, m.flags = GS_HELLO_FSYNC;
    round_trip(&m, &b, &d);
    assert_int_equal(d.magic, GS_PROTO_MAGIC);
    assert_int_equal(d.version, GS_PROTO_VERSION);
    assert_int_equal(d.flags, GS_HELLO_FSYNC);
    gs_proto_buf_release(&b);

    m = sample(GS_MSG_HELLO_OK);
    m.magic = GS_PROTO_MAGIC, m.version = 7;
    round_trip(&m, &b, &d);
    assert_int_equal(d.version, 7);
    assert_str(d.text, m.text);
    assert_str(d.path2, m.path2);
    assert_str(d.path, m.path); /* the sync id */
    assert_str(d.data, m.data); /* v8: the resident listener's socket */
    gs_proto_buf_release(&b);

    m = sample(GS_MSG_OPEN); /* v8: the root, to the resident listener */
    m.data = gs_proto_cstr("/root/gpusync/project");
    round_trip(&m, &b, &d);
    assert_str(d.data, m.data);
    gs_proto_buf_release(&b);
}

static void test_proto__put_and_put_begin_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    uint8_t types[] = {GS_MSG_PUT, GS_MSG_PUT_BEGIN};
    for (int i = 0; i < 2; i++) {
        struct gs_proto_msg m = sample(types[i]), d;
        round_trip(&m, &b, &d);
        assert_str(d.path, m.path);
        assert_int_equal(d.meta.mode, 0755);
        assert_true(d.meta.mtime_sec == m.meta.mtime_sec);
        assert_int_equal(d.meta.mtime_nsec, m.meta.mtime_nsec);
        assert_int_equal(d.expect.kind, GS_EXPECT_HASH);
        assert_memory_equal(d.expect.hash, m.expect.hash, GS_PROTO_HASH_LEN);
        if (types[i] == GS_MSG_PUT)
            assert_str(d.data, m.data);
        else
            assert_true(d.size == m.size);
        gs_proto_buf_release(&b);
    }
}

static void test_proto__expect_hash_is_zeroed_unless_kind_hash(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_DELETE), d;
    static const uint8_t zero[GS_PROTO_HASH_LEN];
    m.expect.kind = GS_EXPECT_ABSENT;
    round_trip(&m, &b, &d);
    assert_int_equal(d.expect.kind, GS_EXPECT_ABSENT);
    assert_memory_equal(d.expect.hash, zero, GS_PROTO_HASH_LEN);
    assert_int_equal(d.flags, 3);
    gs_proto_buf_release(&b);
}

/* v5: a directory expectation (kind only, like ABSENT) and the LIST_SKIPPED report. */
static void test_proto__expect_dir_and_list_skipped_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_DELETE), d;
    m.expect.kind = GS_EXPECT_DIR;
    round_trip(&m, &b, &d);
    assert_int_equal(d.expect.kind, GS_EXPECT_DIR);
    gs_proto_buf_release(&b);

    m = sample(GS_MSG_LIST_SKIPPED);
    m.err = 36; /* ENAMETOOLONG */
    round_trip(&m, &b, &d);
    assert_int_equal(d.err, 36);
    assert_str(d.path, m.path);
    assert_string_equal(gs_proto_type_name(GS_MSG_LIST_SKIPPED), "LIST_SKIPPED");
    gs_proto_buf_release(&b);
}

static void test_proto__data_frames_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    uint8_t types[] = {GS_MSG_PUT_DATA, GS_MSG_GET_DATA};
    for (int i = 0; i < 2; i++) {
        struct gs_proto_msg m = sample(types[i]), d;
        round_trip(&m, &b, &d);
        assert_str(d.data, m.data);
        gs_proto_buf_release(&b);
    }
}

static void test_proto__put_end_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_PUT_END), d;
    m.flags = GS_PUTEND_VERIFY;
    round_trip(&m, &b, &d);
    assert_int_equal(d.flags, GS_PUTEND_VERIFY);
    assert_memory_equal(d.hash, m.hash, GS_PROTO_HASH_LEN);
    gs_proto_buf_release(&b);
}

static void test_proto__path_requests_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    uint8_t types[] = {GS_MSG_MKDIR, GS_MSG_CHMOD, GS_MSG_STAT,   GS_MSG_HASH,
                       GS_MSG_GET,   GS_MSG_LIST,  GS_MSG_RENAME, GS_MSG_SYMLINK};
    for (size_t i = 0; i < sizeof(types); i++) {
        struct gs_proto_msg m = sample(types[i]), d;
        round_trip(&m, &b, &d);
        assert_str(d.path, m.path);
        if (types[i] == GS_MSG_MKDIR || types[i] == GS_MSG_CHMOD)
            assert_int_equal(d.meta.mode, 0755);
        if (types[i] == GS_MSG_LIST)
            assert_int_equal(d.flags, 3);
        if (types[i] == GS_MSG_RENAME || types[i] == GS_MSG_SYMLINK) {
            assert_str(d.path2, m.path2);
            assert_memory_equal(d.expect.hash, m.expect.hash, GS_PROTO_HASH_LEN);
        }
        gs_proto_buf_release(&b);
    }
}

/* v10: a CHMOD may carry the mtime and the content hash after the mode (a `touch` sent without
 * the bytes); the v9 form, without them, still decodes, and a mtime before 1970 survives. */
static void test_proto__chmod_round_trips_with_and_without_mtime_and_hash(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_CHMOD), d;
    round_trip(&m, &b, &d); /* v9 form: has_hash unset */
    assert_int_equal(b.len, GS_PROTO_HDR + 4 + strlen(hostile) + 4);
    assert_int_equal(d.has_hash, 0);
    assert_int_equal(d.meta.mode, 0755);
    assert_int_equal(d.meta.mtime_sec, 0);
    gs_proto_buf_release(&b);

    m.has_hash = 1; /* v10 form: mtime_sec -12345678901 (1578), nsec 999999999 */
    round_trip(&m, &b, &d);
    assert_int_equal(b.len, GS_PROTO_HDR + 4 + strlen(hostile) + 16 + GS_PROTO_HASH_LEN);
    assert_int_equal(d.has_hash, 1);
    assert_str(d.path, m.path);
    assert_int_equal(d.meta.mode, 0755);
    assert_true(d.meta.mtime_sec == -12345678901LL);
    assert_int_equal(d.meta.mtime_nsec, 999999999u);
    assert_memory_equal(d.hash, m.hash, GS_PROTO_HASH_LEN);
    gs_proto_buf_release(&b);

    m.meta.mtime_sec = -1, m.meta.mtime_nsec = 1; /* 1969-12-31 23:59:59.000000001 */
    round_trip(&m, &b, &d);
    assert_true(d.meta.mtime_sec == -1);
    assert_int_equal(d.meta.mtime_nsec, 1);
    gs_proto_buf_release(&b);

    m.meta.mtime_nsec = 1000000000u; /* not a time: malformed, as in every meta */
    struct gs_proto_frame f;
    gs_proto_buf_init(&b);
    assert_int_equal(gs_proto_encode(&b, &m), 0);
    assert_true(gs_proto_parse_frame(b.data, b.len, &f) > 0);
    assert_int_equal(gs_proto_decode(&f, &d), -1);
    for (int cut = 1; cut < 16 + GS_PROTO_HASH_LEN; cut += 7) { /* a v10 form cut short */
        f.len = (uint32_t)(4 + strlen(hostile) + 16 + GS_PROTO_HASH_LEN - (size_t)cut);
        assert_int_equal(gs_proto_decode(&f, &d), -1);
    }
    gs_proto_buf_release(&b);
}

static void test_proto__replies_round_trip(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_DONE), d;
    m.flags = GS_DONE_KEPT;
    round_trip(&m, &b, &d);
    assert_int_equal(d.flags, GS_DONE_KEPT);
    assert_str(d.path2, m.path2);
    gs_proto_buf_release(&b);

    m = sample(GS_MSG_ERROR);
    m.err = -5;
    round_trip(&m, &b, &d);
    assert_int_equal(d.err, -5);
    assert_str(d.text, m.text);
    gs_proto_buf_release(&b);

    m = sample(GS_MSG_STAT_R);
    m.kind = GS_KIND_SYMLINK;
    round_trip(&m, &b, &d);
    assert_int_equal(d.kind, GS_KIND_SYMLINK);
    assert_true(d.size == m.size);
    assert_int_equal(d.meta.mtime_nsec, m.meta.mtime_nsec);
    assert_str(d.path2, m.path2);
    gs_proto_buf_release(&b);

    uint8_t hashed[] = {GS_MSG_HASH_R, GS_MSG_GET_END, GS_MSG_LIST_END};
    for (size_t i = 0; i < sizeof(hashed); i++) {
        m = sample(hashed[i]);
        round_trip(&m, &b, &d);
        assert_true(d.size == m.size);
        if (hashed[i] != GS_MSG_LIST_END)
            assert_memory_equal(d.hash, m.hash, GS_PROTO_HASH_LEN);
        if (hashed[i] == GS_MSG_GET_END)
            assert_true(d.meta.mtime_sec == m.meta.mtime_sec);
        gs_proto_buf_release(&b);
    }

    /* GET_END's writer is optional: absent, it decodes as "" (an agent before it); present, as
     * sent */
    m = sample(GS_MSG_GET_END);
    m.text = gs_proto_cstr("");
    round_trip(&m, &b, &d);
    assert_int_equal(d.text.len, 0);
    gs_proto_buf_release(&b);
    m.text = gs_proto_cstr("pid 4242 (python)");
    round_trip(&m, &b, &d);
    assert_str(d.text, m.text);
    assert_true(d.size == m.size);
    gs_proto_buf_release(&b);
}

static void test_proto__list_entries_round_trip_and_split_at_limit(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    size_t mark;
    struct gs_proto_entry e, got;
    memset(&e, 0, sizeof(e));
    e.path = gs_proto_cstr(hostile);
    e.kind = GS_KIND_FILE;
    e.meta.mode = 0644;
    e.meta.mtime_sec = 1700000000;
    e.meta.mtime_nsec = 5;
    e.size = 42;
    e.has_hash = 1;
    memset(e.hash, 0xab, sizeof(e.hash));
    e.link = gs_proto_cstr("");
    assert_int_equal(gs_proto_list_begin(&b, GS_MSG_LIST_ENTRIES, 9, 0, &mark), 0);
    int added = 0;
    while (gs_proto_list_add(&b, mark, 300, &e) == 0)
        added++;
    gs_proto_list_end(&b, mark);
    assert_true(added >= 2 && added < 10); /* the 300-byte limit stopped it */

    struct gs_proto_frame f;
    struct gs_proto_msg m;
    assert_int_equal(gs_proto_parse_frame(b.data, b.len, &f), (long)b.len);
    assert_true(f.len <= 300);
    assert_int_equal(gs_proto_decode(&f, &m), 0);
    assert_int_equal(m.count, (uint32_t)added);
    size_t pos = 0;
    int seen = 0;
    while (gs_proto_list_next(&m, &pos, &got) == 1) {
        assert_str(got.path, e.path);
        assert_int_equal(got.kind, GS_KIND_FILE);
        assert_true(got.size == 42);
        assert_int_equal(got.has_hash, 1);
        assert_memory_equal(got.hash, e.hash, GS_PROTO_HASH_LEN);
        seen++;
    }
    assert_int_equal(seen, added);
    gs_proto_buf_release(&b);
}

static void test_proto__every_prefix_of_a_frame_needs_more_bytes(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(GS_MSG_PUT);
    struct gs_proto_frame f;
    gs_proto_buf_init(&b);
    assert_int_equal(gs_proto_encode(&b, &m), 0);
    for (size_t n = 0; n < b.len; n++)
        assert_int_equal(gs_proto_parse_frame(b.data, n, &f), 0);
    gs_proto_buf_release(&b);
}

static void test_proto__oversized_and_undersized_lengths_are_rejected(void **state)
{
    (void)state;
    uint8_t big[9] = {0x00, 0x40, 0x00, 0x06, GS_MSG_PUT, 0, 0, 0, 7}; /* 4 MiB + 6 */
    uint8_t tiny[9] = {0, 0, 0, 4, GS_MSG_PUT, 0, 0, 0, 7};
    uint8_t max[9] = {0x00, 0x40, 0x00, 0x00, GS_MSG_PUT_DATA, 0, 0, 0, 7};
    struct gs_proto_frame f;
    assert_int_equal(gs_proto_parse_frame(big, sizeof(big), &f), -1);
    assert_int_equal(f.id, 7); /* still addressable for the error reply */
    assert_int_equal(gs_proto_parse_frame(tiny, sizeof(tiny), &f), -1);
    assert_int_equal(gs_proto_parse_frame(max, sizeof(max), &f), 0); /* legal, incomplete */
}

static void test_proto__encoder_refuses_a_frame_over_the_maximum(void **state)
{
    (void)state;
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    static char huge[GS_PROTO_MAX_PAYLOAD + 1];
    struct gs_proto_msg m = sample(GS_MSG_PUT_DATA);
    m.data.p = huge;
    m.data.len = sizeof(huge);
    assert_int_equal(gs_proto_encode(&b, &m), -1);
    assert_int_equal(b.len, 0);
    m.data.len = GS_PROTO_MAX_PAYLOAD;
    assert_int_equal(gs_proto_encode(&b, &m), 0);
    assert_int_equal(b.len, GS_PROTO_HDR + GS_PROTO_MAX_PAYLOAD);
    gs_proto_buf_release(&b);
}

/* Decodes a frame after changing its payload length by delta (bytes cut or appended). */
static int decode_resized(uint8_t type, int delta)
{
    struct gs_proto_buf b;
    struct gs_proto_msg m = sample(type), d;
    struct gs_proto_frame f;
    gs_proto_buf_init(&b);
    assert_int_equal(gs_proto_encode(&b, &m), 0);
    assert_int_equal(gs_proto_buf_reserve(&b, 8), 0);
    memset(b.data + b.len, 0, 8);
    assert_true(gs_proto_parse_frame(b.data, b.len, &f) > 0);
    f.len = (uint32_t)((int)f.len + delta);
    int rc = gs_proto_decode(&f, &d);
    gs_proto_buf_release(&b);
    return rc;
}

static void test_proto__truncated_or_padded_payloads_are_malformed(void **state)
{
    (void)state;
    uint8_t types[] = {GS_MSG_HELLO,    GS_MSG_OPEN,        GS_MSG_PUT,      GS_MSG_PUT_BEGIN,
                       GS_MSG_PUT_END,  GS_MSG_MKDIR,       GS_MSG_DELETE,   GS_MSG_RENAME,
                       GS_MSG_SYMLINK,  GS_MSG_CHMOD,       GS_MSG_STAT,     GS_MSG_HASH,
                       GS_MSG_GET,      GS_MSG_LIST,        GS_MSG_HELLO_OK, GS_MSG_DONE,
                       GS_MSG_ERROR,    GS_MSG_STAT_R,      GS_MSG_HASH_R,   GS_MSG_GET_END,
                       GS_MSG_LIST_END, GS_MSG_LIST_SKIPPED};
    for (size_t i = 0; i < sizeof(types); i++) {
        assert_int_equal(decode_resized(types[i], -1), -1);
        assert_int_equal(decode_resized(types[i], +1), -1);
    }
}

static void test_proto__unknown_type_and_bad_enums_are_refused(void **state)
{
    (void)state;
    uint8_t raw[9] = {0, 0, 0, 5, 0x3f, 0, 0, 0, 1};
    struct gs_proto_frame f;
    struct gs_proto_msg m;
    assert_int_equal(gs_proto_parse_frame(raw, sizeof(raw), &f), 9);
    assert_int_equal(gs_proto_decode(&f, &m), -2);

    struct gs_proto_buf b;
    struct gs_proto_msg put = sample(GS_MSG_PUT);
    gs_proto_buf_init(&b);
    put.expect.kind = 9; /* not a GS_EXPECT_* */
    assert_int_equal(gs_proto_encode(&b, &put), 0);
    assert_true(gs_proto_parse_frame(b.data, b.len, &f) > 0);
    assert_int_equal(gs_proto_decode(&f, &m), -1);
    b.len = 0;
    put = sample(GS_MSG_PUT);
    put.meta.mtime_nsec = 1000000000u;
    assert_int_equal(gs_proto_encode(&b, &put), 0);
    assert_true(gs_proto_parse_frame(b.data, b.len, &f) > 0);
    assert_int_equal(gs_proto_decode(&f, &m), -1);
    gs_proto_buf_release(&b);
}

static void test_proto__string_length_past_the_payload_is_malformed(void **state)
{
    (void)state;
    /* STAT whose path claims 0xffffffff bytes. */
    uint8_t raw[] = {0, 0, 0, 11, GS_MSG_STAT, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 'a', 'b'};
    struct gs_proto_frame f;
    struct gs_proto_msg m;
    assert_int_equal(gs_proto_parse_frame(raw, sizeof(raw), &f), (long)sizeof(raw));
    assert_int_equal(gs_proto_decode(&f, &m), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proto__hello_and_hello_ok_round_trip),
        cmocka_unit_test(test_proto__put_and_put_begin_round_trip),
        cmocka_unit_test(test_proto__expect_hash_is_zeroed_unless_kind_hash),
        cmocka_unit_test(test_proto__expect_dir_and_list_skipped_round_trip),
        cmocka_unit_test(test_proto__data_frames_round_trip),
        cmocka_unit_test(test_proto__put_end_round_trip),
        cmocka_unit_test(test_proto__path_requests_round_trip),
        cmocka_unit_test(test_proto__replies_round_trip),
        cmocka_unit_test(test_proto__list_entries_round_trip_and_split_at_limit),
        cmocka_unit_test(test_proto__every_prefix_of_a_frame_needs_more_bytes),
        cmocka_unit_test(test_proto__oversized_and_undersized_lengths_are_rejected),
        cmocka_unit_test(test_proto__encoder_refuses_a_frame_over_the_maximum),
        cmocka_unit_test(test_proto__truncated_or_padded_payloads_are_malformed),
        cmocka_unit_test(test_proto__chmod_round_trips_with_and_without_mtime_and_hash),
        cmocka_unit_test(test_proto__unknown_type_and_bad_enums_are_refused),
        cmocka_unit_test(test_proto__string_length_past_the_payload_is_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
