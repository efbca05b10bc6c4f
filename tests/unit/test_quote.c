/* tests/unit/test_quote.c: names and messages rendered for a terminal (common/quote.h): which
 * names are quoted, their exact form, that bash's $'...' reads each back to the same bytes, and
 * that a message's raw names are quoted and its other control bytes escaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/quote.h"
#include "fixtures/proc.h"

static void expect_quoted(const char *name, const char *shown)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_quote_path(&b, name);
    assert_string_equal(b.data, shown);
    gs_buf_release(&b);
}

static void test_quote__ordinary_names_are_shown_unchanged(void **state)
{
    (void)state;
    expect_quoted("src/main.py", "src/main.py");
    expect_quoted("with space.txt", "with space.txt");
    expect_quoted("it's.txt", "it's.txt");
    expect_quoted("donn\xc3\xa9"
                  "es.txt",
                  "donn\xc3\xa9"
                  "es.txt"); /* valid UTF-8 stays readable */
    expect_quoted("\xe6\x97\xa5\xe6\x9c\xac/\xf0\x9f\x98\x80",
                  "\xe6\x97\xa5\xe6\x9c\xac/\xf0\x9f\x98\x80");
    expect_quoted("", "");
}

static void test_quote__control_bytes_quotes_and_backslashes_are_escaped(void **state)
{
    (void)state;
    expect_quoted("two\nlines", "\"two\\nlines\"");
    expect_quoted("a\tb\rc", "\"a\\tb\\rc\"");
    expect_quoted("\x1b[31mred", "\"\\e[31mred\"");
    expect_quoted("say \"hi\"", "\"say \\\"hi\\\"\"");
    expect_quoted("back\\slash", "\"back\\\\slash\"");
    expect_quoted("bell\x07 del\x7f", "\"bell\\x07 del\\x7f\"");
    expect_quoted("it's\n", "\"it\\'s\\n\""); /* ' too, once quoted: bash's $'...' ends at one */
    expect_quoted("c1\xc2\x9b"
                  "2J",
                  "\"c1\\xc2\\x9b2J\""); /* a C1 CSI as UTF-8 */
    /* a right-to-left override would show "a\u202etxt.exe" as "aexe.txt" */
    expect_quoted("a\xe2\x80\xaetxt.exe", "\"a\\xe2\\x80\\xaetxt.exe\"");
    expect_quoted("iso\xe2\x81\xa6x", "\"iso\\xe2\\x81\\xa6x\"");
    assert_false(gs_quote_needed("arrow\xe2\x80\x94"
                                 "dash")); /* U+2014, an ordinary character */
}

static void test_quote__bytes_that_are_not_utf8_are_escaped(void **state)
{
    (void)state;
    expect_quoted("bad\xff", "\"bad\\xff\"");
    expect_quoted("caf\xe9.txt", "\"caf\\xe9.txt\"");       /* Latin-1 */
    expect_quoted("\xc0\xaf", "\"\\xc0\\xaf\"");            /* overlong '/' */
    expect_quoted("\xed\xa0\x80", "\"\\xed\\xa0\\x80\"");   /* a surrogate */
    expect_quoted("cut\xe6\x97", "\"cut\\xe6\\x97\"");      /* a sequence cut short */
    expect_quoted("ok\xc3\xa9\xff", "\"ok\xc3\xa9\\xff\""); /* the valid part stays readable */
}

/* What bash's printf %s $'...' prints for the quoted form of `name` (its outer quotes swapped). */
static void bash_reads_back(const char *name)
{
    struct gs_buf q = GS_BUF_INIT, script = GS_BUF_INIT;
    gs_quote_always(&q, name);
    q.data[q.len - 1] = '\0';
    gs_buf_addf(&script, "printf %%s $'%s'", q.data + 1);
    struct gs_test_result r =
        gs_test_run_prog(NULL, (const char *const[]){"bash", "-c", script.data, NULL}, 10000);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.out.len, strlen(name));
    assert_memory_equal(r.out.data, name, r.out.len);
    gs_test_result_release(&r);
    gs_buf_release(&q);
    gs_buf_release(&script);
}

static void test_quote__bash_reads_the_quoted_form_back_byte_for_byte(void **state)
{
    (void)state;
    const char *names[] = {
        "two\nlines",
        "\x1b[31mred",
        "tab\there\r",
        "say \"hi\" \\ it's",
        "bad\xff\xfe-x",
        "\x01\x02\x7f",
        "c1\xc2\x9b"
        "2J",
        "donn\xc3\xa9"
        "es\n",
        "hex\\x41 $HOME `x`",
        "rtl\xe2\x80\xaeoverride",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
        bash_reads_back(names[i]);
}

static void test_quote__a_message_has_its_names_quoted_and_no_raw_control_byte(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    const char *names[] = {"a\nb", NULL};
    gs_quote_message(&b, "put a\nb: No space left on device", names, 0);
    assert_string_equal(b.data, "put \"a\\nb\": No space left on device");
    gs_buf_reset(&b);
    const char *two[] = {"old\x1b", "new\xff", NULL};
    gs_quote_message(&b, "rename old\x1b -> new\xff: refused\n", two, 0);
    assert_string_equal(b.data, "rename \"old\\e\" -> \"new\\xff\": refused\\n");
    gs_buf_reset(&b);
    /* a name it was not told of: escaped in place, not quoted */
    gs_quote_message(&b, "cannot read x\x1b[2J\xff: gone", NULL, 0);
    assert_string_equal(b.data, "cannot read x\\e[2J\\xff: gone");
    gs_buf_reset(&b);
    /* a plain name is left as it is, wherever it appears */
    const char *plain[] = {"a", NULL};
    gs_quote_message(&b, "put a: failed", plain, 0);
    assert_string_equal(b.data, "put a: failed");
    gs_buf_reset(&b);
    gs_quote_message(&b, "build failed:\n\tline\x1b", NULL, GS_QUOTE_KEEP_LINES);
    assert_string_equal(b.data, "build failed:\n\tline\\e");
    gs_buf_reset(&b);
    gs_quote_message(&b, "", NULL, 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    gs_buf_release(&b);
}

static void test_quote__str_is_reused_for_each_argument(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    assert_string_equal(gs_quote_str(&b, "a\tb"), "\"a\\tb\"");
    assert_string_equal(gs_quote_str(&b, "plain"), "plain");
    assert_string_equal(gs_quote_str(&b, ""), "");
    assert_string_equal(gs_quote_str(&b, NULL), "");
    gs_buf_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote__ordinary_names_are_shown_unchanged),
        cmocka_unit_test(test_quote__control_bytes_quotes_and_backslashes_are_escaped),
        cmocka_unit_test(test_quote__bytes_that_are_not_utf8_are_escaped),
        cmocka_unit_test(test_quote__bash_reads_the_quoted_form_back_byte_for_byte),
        cmocka_unit_test(test_quote__a_message_has_its_names_quoted_and_no_raw_control_byte),
        cmocka_unit_test(test_quote__str_is_reused_for_each_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
