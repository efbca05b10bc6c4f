/* tests/unit/test_shell.c: shell quoting, checked by a real /bin/sh: every quoted string must come
 * back byte for byte from `sh -c "printf %s QUOTED"`. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/shell.h"
#include "fixtures/proc.h"

/* Runs /bin/sh -c `script` and captures its stdout into `out`. Returns the exit status. */
static int run_sh(const char *script, struct gs_buf *out)
{
    struct gs_test_result r =
        gs_test_run_prog(NULL, (const char *const[]){"/bin/sh", "-c", script, NULL}, 10000);
    gs_buf_add(out, r.out.data, r.out.len);
    int status = r.status;
    gs_test_result_release(&r);
    return status;
}

/* `arg` quoted and printed by sh must equal `arg`. */
static void round_trip(const char *arg)
{
    struct gs_buf script = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_adds(&script, "printf %s ");
    gs_shell_quote(&script, arg);
    assert_int_equal(run_sh(script.data, &out), 0);
    if (out.len != strlen(arg) || memcmp(out.data ? out.data : "", arg, out.len) != 0)
        fail_msg("'%s' came back as '%s' (script: %s)", arg, out.data ? out.data : "", script.data);
    gs_buf_release(&script);
    gs_buf_release(&out);
}

static void test_shell_quote__plain_and_empty(void **state)
{
    (void)state;
    round_trip("plain");
    round_trip("");
}

static void test_shell_quote__spaces_and_tabs(void **state)
{
    (void)state;
    round_trip("two words");
    round_trip("  leading and trailing  ");
    round_trip("tab\there");
}

static void test_shell_quote__single_and_double_quotes(void **state)
{
    (void)state;
    round_trip("it's");
    round_trip("'");
    round_trip("''");
    round_trip("\"double\"");
    round_trip("mix 'of' \"both\" '\"'");
}

static void test_shell_quote__dollar_backtick_and_backslash_stay_literal(void **state)
{
    (void)state;
    round_trip("$HOME");
    round_trip("${PATH}$(id)`id`");
    round_trip("back\\slash\\");
    round_trip("\\'");
}

static void test_shell_quote__command_separators_stay_literal(void **state)
{
    (void)state;
    round_trip("a; touch /tmp/gs-test-shell-pwned");
    round_trip("a && b || c | d & e");
    round_trip("> out < in 2>&1");
    round_trip("*?[a-z]~{a,b}#!");
    assert_int_not_equal(access("/tmp/gs-test-shell-pwned", F_OK), 0);
}

static void test_shell_quote__newlines(void **state)
{
    (void)state;
    round_trip("line1\nline2");
    round_trip("\n");
    round_trip("trailing\n\n");
}

static void test_shell_quote__non_utf8_bytes(void **state)
{
    (void)state;
    round_trip("\xff\xfe\x80 latin1 caf\xe9");
    round_trip("\x01\x02\x1b[31m\x7f");
}

static void test_shell_quote__leading_dash(void **state)
{
    (void)state;
    /* printf %s X: X is an argument, not an option, even with a leading dash */
    round_trip("-n");
    round_trip("--help");
    round_trip("-");
}

static void test_shell_quote__quoted_word_is_one_argument(void **state)
{
    (void)state;
    struct gs_buf script = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_adds(&script, "set -- ");
    gs_shell_quote(&script, "a b 'c' $d");
    gs_buf_adds(&script, "; printf %s $#");
    assert_int_equal(run_sh(script.data, &out), 0);
    assert_string_equal(out.data, "1");
    gs_buf_release(&script);
    gs_buf_release(&out);
}

static void test_shell_quote_argv__each_argument_arrives_separately(void **state)
{
    (void)state;
    char *argv[] = {"first arg", "it's", "$x;y", "line\nbreak", "", "-v", "\xff"};
    int argc = (int)(sizeof(argv) / sizeof(argv[0]));
    struct gs_buf script = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_adds(&script, "printf '<%s>' ");
    gs_shell_quote_argv(&script, argc, argv);
    assert_int_equal(run_sh(script.data, &out), 0);
    assert_string_equal(out.data, "<first arg><it's><$x;y><line\nbreak><><-v><\xff>");
    gs_buf_release(&script);
    gs_buf_release(&out);
}

static void test_shell_quote__exact_form(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    gs_shell_quote(&b, "it's");
    assert_string_equal(b.data, "'it'\\''s'");
    gs_buf_reset(&b);
    char *argv[] = {"a", "b c"};
    gs_shell_quote_argv(&b, 2, argv);
    assert_string_equal(b.data, "'a' 'b c'");
    gs_buf_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shell_quote__plain_and_empty),
        cmocka_unit_test(test_shell_quote__spaces_and_tabs),
        cmocka_unit_test(test_shell_quote__single_and_double_quotes),
        cmocka_unit_test(test_shell_quote__dollar_backtick_and_backslash_stay_literal),
        cmocka_unit_test(test_shell_quote__command_separators_stay_literal),
        cmocka_unit_test(test_shell_quote__newlines),
        cmocka_unit_test(test_shell_quote__non_utf8_bytes),
        cmocka_unit_test(test_shell_quote__leading_dash),
        cmocka_unit_test(test_shell_quote__quoted_word_is_one_argument),
        cmocka_unit_test(test_shell_quote_argv__each_argument_arrives_separately),
        cmocka_unit_test(test_shell_quote__exact_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
