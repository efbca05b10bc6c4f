/* tests/unit/test_auth.c: which keyboard-interactive prompts get the password. A server that
 * asks for a one-time code must never be sent the password in its place (remote/auth.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "remote/auth.h"

static int is_password(const char *prompt)
{
    return gs_auth_is_password_prompt(prompt, strlen(prompt));
}

static void test_prompt__password_prompts_as_servers_write_them(void **state)
{
    (void)state;
    assert_true(is_password("Password: "));
    assert_true(is_password("root@gpu-7's password:"));
    assert_true(is_password("PASSWORD for gsuser: "));
    /* the length bounds the search: the prompt is not NUL-terminated on the wire */
    assert_false(gs_auth_is_password_prompt("Passw", 5));
}

static void test_prompt__other_prompts_are_not_for_the_password(void **state)
{
    (void)state;
    assert_false(is_password("Verification code: "));
    assert_false(is_password("One-time token: "));
    assert_false(is_password("Enter PASSCODE: "));
    assert_false(is_password(""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt__password_prompts_as_servers_write_them),
        cmocka_unit_test(test_prompt__other_prompts_are_not_for_the_password),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
