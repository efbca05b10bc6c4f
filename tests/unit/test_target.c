/* tests/unit/test_target.c: resolving a target: parsing `ssh -G` output, and an ~/.ssh/config
 * alias resolved through the real OpenSSH client with HOME pointed at a temporary directory. */
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/proc.h"
#include "remote/target.h"

static void test_apply_ssh_g__reads_hostname_port_user_identities(void **state)
{
    (void)state;
    setenv("HOME", "/home/tester", 1);
    struct gs_target t;
    memset(&t, 0, sizeof(t));
    gs_target_apply_ssh_g(&t, "host gpu\n"
                              "user alice\n"
                              "hostname 10.1.2.3\n"
                              "port 2222\n"
                              "addressfamily any\n"
                              "identityfile ~/.ssh/special\n"
                              "identityfile /abs/key\n"
                              "identityfile ~/.ssh/special\n" /* duplicate: kept once */
                              "userknownhostsfile ~/.ssh/known_hosts ~/.ssh/known_hosts2\n");
    assert_string_equal(t.hostname, "10.1.2.3");
    assert_int_equal(t.port, 2222);
    assert_string_equal(t.user, "alice");
    assert_int_equal(t.n_identities, 2);
    assert_string_equal(t.identities[0], "/home/tester/.ssh/special");
    assert_string_equal(t.identities[1], "/abs/key");
    gs_target_release(&t);
    assert_null(t.hostname);
}

static void test_apply_ssh_g__ignores_unknown_and_malformed_lines(void **state)
{
    (void)state;
    struct gs_target t;
    memset(&t, 0, sizeof(t));
    gs_target_apply_ssh_g(&t, "hostnamex nope\nportable 9\nnospace\n\nuserx y\nhostname h");
    assert_string_equal(t.hostname, "h"); /* the last line has no newline */
    assert_int_equal(t.port, 0);
    assert_null(t.user);
    gs_target_release(&t);
}

static void test_apply_ssh_g__passwd_home_paths_follow_home(void **state)
{
    (void)state;
    /* ssh -G prints UserKnownHostsFile expanded from the passwd home; gpusync follows $HOME */
    struct passwd *pw = getpwuid(getuid());
    if (!pw || !pw->pw_dir || strlen(pw->pw_dir) < 2)
        skip();
    setenv("HOME", "/tmp/gs-other-home", 1);
    char out[1024];
    snprintf(out, sizeof(out), "userknownhostsfile %s/.ssh/known_hosts /srv/kh\n", pw->pw_dir);
    struct gs_target t;
    memset(&t, 0, sizeof(t));
    gs_target_apply_ssh_g(&t, out);
    assert_int_equal(t.n_user_known_hosts, 2);
    assert_string_equal(t.user_known_hosts[0], "/tmp/gs-other-home/.ssh/known_hosts");
    assert_string_equal(t.user_known_hosts[1], "/srv/kh");
    gs_target_release(&t);
}

static void test_resolve__explicit_port_and_user_override(void **state)
{
    (void)state;
    struct gs_target t;
    struct gs_error err = {0};
    assert_int_equal(gs_target_resolve(&t, "127.0.0.1", 2200, "bob", &err), 0);
    assert_string_equal(t.alias, "127.0.0.1");
    assert_string_equal(t.hostname, "127.0.0.1");
    assert_int_equal(t.port, 2200);
    assert_string_equal(t.user, "bob");
    assert_true(t.n_identities >= 1);
    gs_target_release(&t);
}

static void test_resolve__empty_host_is_usage_error(void **state)
{
    (void)state;
    struct gs_target t;
    struct gs_error err = {0};
    assert_int_equal(gs_target_resolve(&t, "", 0, NULL, &err), GS_E_USAGE);
    assert_true(err.msg[0] != '\0');
    gs_target_release(&t);
}

static void test_resolve__defaults_port_22_and_default_identities(void **state)
{
    (void)state;
    char home[] = "/tmp/gs-test-target-def.XXXXXX";
    assert_non_null(mkdtemp(home));
    setenv("HOME", home, 1);
    struct gs_target t;
    assert_int_equal(gs_target_resolve(&t, "plainhost.invalid", 0, NULL, NULL), 0);
    assert_string_equal(t.hostname, "plainhost.invalid");
    assert_int_equal(t.port, 22);
    assert_non_null(t.user);
    char want[128];
    snprintf(want, sizeof(want), "%s/.ssh/id_ed25519", home);
    int found = 0;
    for (size_t i = 0; i < t.n_identities; i++)
        found |= strcmp(t.identities[i], want) == 0;
    if (!found)
        fail_msg("%s not among the identities (first: %s)", want,
                 t.n_identities ? t.identities[0] : "none");
    gs_target_release(&t);
    rmdir(home);
}

static void test_resolve__alias_from_home_ssh_config(void **state)
{
    (void)state;
    if (!gs_proc_in_path("ssh"))
        skip();
    char home[] = "/tmp/gs-test-target.XXXXXX";
    assert_non_null(mkdtemp(home));
    char path[128];
    snprintf(path, sizeof(path), "%s/.ssh", home);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/.ssh/config", home);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("Host gs-test-alias\n"
          "    HostName 10.9.8.7\n"
          "    Port 2345\n"
          "    User carol\n"
          "    IdentityFile ~/.ssh/gs_special_key\n",
          fp);
    fclose(fp);
    setenv("HOME", home, 1);

    struct gs_target t;
    struct gs_error err = {0};
    assert_int_equal(gs_target_resolve(&t, "gs-test-alias", 0, NULL, &err), 0);
    assert_string_equal(t.alias, "gs-test-alias");
    char want[128];
    snprintf(want, sizeof(want), "%s/.ssh/gs_special_key", home);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", home);
    if (strcmp(t.hostname, "10.9.8.7") != 0 || t.port != 2345 || strcmp(t.user, "carol") != 0 ||
        t.n_identities == 0 || strcmp(t.identities[0], want) != 0) {
        assert_int_equal(system(cmd), 0);
        fail_msg("alias resolved to %s@%s:%d, first identity %s (want carol@10.9.8.7:2345, %s)",
                 t.user, t.hostname, t.port, t.n_identities ? t.identities[0] : "none", want);
    }
    gs_target_release(&t);

    /* explicit values still win over the alias's */
    assert_int_equal(gs_target_resolve(&t, "gs-test-alias", 2400, "dave", &err), 0);
    assert_string_equal(t.hostname, "10.9.8.7");
    assert_int_equal(t.port, 2400);
    assert_string_equal(t.user, "dave");
    gs_target_release(&t);
    assert_int_equal(system(cmd), 0);
}

/* Index of `name` under HOME/.ssh among t's identities, or -1. */
static int identity_index(const struct gs_target *t, const char *home, const char *name)
{
    char want[256];
    snprintf(want, sizeof(want), "%s/.ssh/%s", home, name);
    for (size_t i = 0; i < t->n_identities; i++)
        if (strcmp(t->identities[i], want) == 0)
            return (int)i;
    return -1;
}

static void test_resolve__managed_key_after_configured_keys_before_defaults(void **state)
{
    (void)state;
    char home[] = "/tmp/gs-test-target-key.XXXXXX";
    assert_non_null(mkdtemp(home));
    setenv("HOME", home, 1);
    struct gs_target t;
    /* no ssh config: gpusync's key comes first */
    assert_int_equal(gs_target_resolve(&t, "plainhost.invalid", 0, NULL, NULL), 0);
    assert_int_equal(identity_index(&t, home, "gpusync_ed25519"), 0);
    assert_true(identity_index(&t, home, "id_ed25519") > 0);
    gs_target_release(&t);
    if (gs_proc_in_path("ssh")) {
        /* an alias with its own IdentityFile: that key, then gpusync's, then the defaults */
        char path[128];
        snprintf(path, sizeof(path), "%s/.ssh", home);
        assert_int_equal(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/.ssh/config", home);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fputs("Host gs-key-alias\n    HostName 10.9.8.7\n    IdentityFile ~/.ssh/lab_key\n", fp);
        fclose(fp);
        assert_int_equal(gs_target_resolve(&t, "gs-key-alias", 0, NULL, NULL), 0);
        assert_int_equal(identity_index(&t, home, "lab_key"), 0);
        assert_int_equal(identity_index(&t, home, "gpusync_ed25519"), 1);
        assert_true(identity_index(&t, home, "id_rsa") > 1);
        gs_target_release(&t);
        /* ssh's own default list (id_rsa first): gpusync's key before all of it */
        assert_int_equal(gs_target_resolve(&t, "other-host.invalid", 0, NULL, NULL), 0);
        assert_int_equal(identity_index(&t, home, "gpusync_ed25519"), 0);
        gs_target_release(&t);
    }
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", home);
    assert_int_equal(system(cmd), 0);
}

static void test_resolve__host_with_leading_dash_is_not_passed_as_option(void **state)
{
    (void)state;
    struct gs_target t;
    assert_int_equal(
        gs_target_resolve(&t, "-oProxyCommand=touch /tmp/gs-test-target-pwned", 0, NULL, NULL), 0);
    assert_int_not_equal(access("/tmp/gs-test-target-pwned", F_OK), 0);
    gs_target_release(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_ssh_g__reads_hostname_port_user_identities),
        cmocka_unit_test(test_apply_ssh_g__ignores_unknown_and_malformed_lines),
        cmocka_unit_test(test_apply_ssh_g__passwd_home_paths_follow_home),
        cmocka_unit_test(test_resolve__explicit_port_and_user_override),
        cmocka_unit_test(test_resolve__empty_host_is_usage_error),
        cmocka_unit_test(test_resolve__defaults_port_22_and_default_identities),
        cmocka_unit_test(test_resolve__alias_from_home_ssh_config),
        cmocka_unit_test(test_resolve__managed_key_after_configured_keys_before_defaults),
        cmocka_unit_test(test_resolve__host_with_leading_dash_is_not_passed_as_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
