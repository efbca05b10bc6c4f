/* tests/unit/test_agent_jsonw.c: the agent's JSON writer (agent/jsonw.c), which writes the run
 * files and `ps --json` that the client parses: the exact bytes for each kind of value, commas
 * and nesting, and string escaping (quotes, backslash, every control byte, DEL; other bytes,
 * invalid UTF-8 included, pass through unchanged). The reader must give back what was written. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "agent/jsonw.h"

/* The text of a document that is one string value. */
static void expect_string_written(const char *s, const char *json)
{
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_str(&w, s);
    assert_string_equal(w.buf, json);
    assert_int_equal(w.len, strlen(json));
    ga_jw_release(&w);
}

static void test_jsonw__quote_and_backslash_are_escaped(void **state)
{
    (void)state;
    expect_string_written("plain text", "\"plain text\"");
    expect_string_written("", "\"\"");
    expect_string_written("say \"hi\"", "\"say \\\"hi\\\"\"");
    expect_string_written("C:\\dir\\", "\"C:\\\\dir\\\\\"");
    expect_string_written("a/b", "\"a/b\""); /* '/' needs no escape */
}

static void test_jsonw__control_bytes_are_escaped(void **state)
{
    (void)state;
    expect_string_written("a\nb\tc", "\"a\\nb\\tc\"");
    expect_string_written("\r\b\f", "\"\\u000d\\u0008\\u000c\"");
    expect_string_written("\x01\x1f\x7f", "\"\\u0001\\u001f\\u007f\"");
    /* every byte below 0x20 comes out as an escape, never raw */
    for (int c = 1; c < 0x20; c++) {
        char s[2] = {(char)c, 0};
        struct ga_jw w;
        ga_jw_init(&w);
        ga_jw_str(&w, s);
        assert_true(w.len >= 4);
        assert_int_equal(w.buf[1], '\\');
        for (size_t i = 0; i < w.len; i++)
            assert_true((unsigned char)w.buf[i] >= 0x20);
        ga_jw_release(&w);
    }
}

static void test_jsonw__bytes_above_ascii_pass_through(void **state)
{
    (void)state;
    expect_string_written("caf\xc3\xa9 \xe2\x82\xac", "\"caf\xc3\xa9 \xe2\x82\xac\"");
    /* the writer does not validate UTF-8: a stray byte is written as it is */
    expect_string_written("bad \xff\xc3", "\"bad \xff\xc3\"");
}

static void test_jsonw__null_string_and_null_are_the_literal(void **state)
{
    (void)state;
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_arr(&w);
    ga_jw_str(&w, NULL);
    ga_jw_null(&w);
    ga_jw_arr_end(&w);
    assert_string_equal(w.buf, "[null,null]");
    ga_jw_release(&w);
}

static void test_jsonw__integers_cover_the_whole_range(void **state)
{
    (void)state;
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_arr(&w);
    ga_jw_int(&w, 0);
    ga_jw_int(&w, -1);
    ga_jw_int(&w, 4096);
    ga_jw_int(&w, LLONG_MAX);
    ga_jw_int(&w, LLONG_MIN);
    ga_jw_arr_end(&w);
    assert_string_equal(w.buf, "[0,-1,4096,9223372036854775807,-9223372036854775808]");
    ga_jw_release(&w);
}

static void test_jsonw__nesting_puts_commas_only_between_values(void **state)
{
    (void)state;
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_obj(&w);
    ga_jw_key(&w, "id");
    ga_jw_str(&w, "r1");
    ga_jw_key(&w, "ranks");
    ga_jw_arr(&w);
    ga_jw_obj(&w);
    ga_jw_key(&w, "rank");
    ga_jw_int(&w, 0);
    ga_jw_key(&w, "exit_code");
    ga_jw_null(&w);
    ga_jw_obj_end(&w);
    ga_jw_obj(&w);
    ga_jw_obj_end(&w);
    ga_jw_arr(&w);
    ga_jw_arr_end(&w);
    ga_jw_arr_end(&w);
    ga_jw_key(&w, "command");
    ga_jw_raw(&w, "[\"python\",\"t.py\"]", 17);
    ga_jw_key(&w, "k\"ey");
    ga_jw_int(&w, 7);
    ga_jw_obj_end(&w);
    ga_jw_text(&w, "\n");
    assert_string_equal(w.buf, "{\"id\":\"r1\",\"ranks\":[{\"rank\":0,\"exit_code\":null},{},[]],"
                               "\"command\":[\"python\",\"t.py\"],\"k\\\"ey\":7}\n");
    ga_jw_release(&w);
    assert_null(w.buf);
    assert_int_equal(w.len, 0);
}

static void test_jsonw__a_long_document_is_written_whole(void **state)
{
    (void)state;
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_arr(&w);
    for (int i = 0; i < 10000; i++)
        ga_jw_str(&w, "0123456789");
    ga_jw_arr_end(&w);
    assert_int_equal(w.len, 2 + 10000 * 12 + 9999);
    assert_int_equal(strlen(w.buf), w.len);
    assert_memory_equal(w.buf + w.len - 14, ",\"0123456789\"]", 14);
    ga_jw_release(&w);
}

static void test_jsonw__the_reader_gives_back_what_was_written(void **state)
{
    (void)state;
    const char *name = "q\"b\\n\nt\tc\x01\x7f"
                       "caf\xc3\xa9";
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_obj(&w);
    ga_jw_key(&w, "name");
    ga_jw_str(&w, name);
    ga_jw_key(&w, "n");
    ga_jw_int(&w, LLONG_MIN);
    ga_jw_key(&w, "gone");
    ga_jw_null(&w);
    ga_jw_obj_end(&w);
    struct ga_json_span doc = {w.buf, w.len}, v;
    char back[64];
    assert_int_equal(ga_json_get(doc, "name", &v), 0);
    assert_int_equal(ga_json_str(v, back, sizeof(back)), 0);
    assert_string_equal(back, name);
    assert_int_equal(ga_json_get_int(doc, "n", 0), LLONG_MIN);
    assert_int_equal(ga_json_get(doc, "gone", &v), 0);
    assert_true(ga_json_is_null(v));
    assert_int_equal(ga_json_get(doc, "missing", &v), -1);
    ga_jw_release(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonw__quote_and_backslash_are_escaped),
        cmocka_unit_test(test_jsonw__control_bytes_are_escaped),
        cmocka_unit_test(test_jsonw__bytes_above_ascii_pass_through),
        cmocka_unit_test(test_jsonw__null_string_and_null_are_the_literal),
        cmocka_unit_test(test_jsonw__integers_cover_the_whole_range),
        cmocka_unit_test(test_jsonw__nesting_puts_commas_only_between_values),
        cmocka_unit_test(test_jsonw__a_long_document_is_written_whole),
        cmocka_unit_test(test_jsonw__the_reader_gives_back_what_was_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
