/* tests/unit/test_hostkey.c: known_hosts naming and lookup (remote/known_hosts.c) against files
 * written by OpenSSH's own tools (plain, hashed, [host]:port, patterns, @revoked and
 * @cert-authority markers, unreadable lines, several files), and SHA256 fingerprints compared
 * with what `ssh-keygen -lf` prints for the same key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <libssh2.h>

#include "remote/hostkey.h"
#include "remote/known_hosts.h"

struct fixture {
    char dir[64];
};

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* Output of a shell command, first line, without the newline. */
static void capture(char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void capture(char *out, size_t size, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = '\0';
    if (!fgets(out, (int)size, p))
        out[0] = '\0';
    pclose(p);
    out[strcspn(out, "\n")] = '\0';
}

static int b64_value(int c)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = c ? strchr(alphabet, c) : NULL;
    return p ? (int)(p - alphabet) : -1;
}

/* Decodes base64 (stopping at '=' or any other byte) into `out`; returns the length. */
static size_t b64_decode(const char *in, unsigned char *out)
{
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (; b64_value((unsigned char)*in) >= 0; in++) {
        acc = (acc << 6) | (unsigned)b64_value((unsigned char)*in);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

/* Makes a key of `type` as DIR/NAME and returns its public blob (decoded from NAME.pub). */
static size_t make_key(struct fixture *f, const char *type, const char *name, unsigned char *blob,
                       char *b64, size_t b64_size)
{
    assert_int_equal(
        run("ssh-keygen -q -t %s -N '' -C test -f '%s/%s' </dev/null", type, f->dir, name), 0);
    char line[4096];
    capture(line, sizeof(line), "cat '%s/%s.pub'", f->dir, name);
    char *sp = strchr(line, ' ');
    assert_non_null(sp);
    char *end = strchr(sp + 1, ' ');
    if (end)
        *end = '\0';
    snprintf(b64, b64_size, "%s", sp + 1);
    return b64_decode(sp + 1, blob);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/gs-test-hostkey.XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    run("rm -rf '%s'", f->dir);
    free(f);
    return 0;
}

/* Writes `text` to DIR/NAME (hashed with ssh-keygen -H when asked) and returns its path in a
 * static buffer. */
static const char *write_known_hosts(struct fixture *f, const char *name, const char *text,
                                     int hash)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", f->dir, name);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    if (hash) {
        assert_int_equal(run("ssh-keygen -q -H -f '%s' >/dev/null 2>&1", path), 0);
        char first[64];
        capture(first, sizeof(first), "cut -c1-3 '%s'", path);
        assert_string_equal(first, "|1|"); /* really hashed */
    }
    return path;
}

/* The verdict for host:port and key in one known_hosts file holding `text`. */
static enum gs_kh_verdict check(struct fixture *f, const char *text, int hash, const char *host,
                                int port, const unsigned char *blob, size_t len,
                                struct gs_kh_result *r)
{
    const char *files[1] = {write_known_hosts(f, "known_hosts", text, hash)};
    char name[300];
    struct gs_kh_result local;
    r = r ? r : &local;
    gs_hostkey_entry_name(host, port, name, sizeof(name));
    gs_kh_lookup(files, 1, name, blob, len, r);
    return r->verdict;
}

static void test_entry_name__port_22_is_bare_other_ports_bracketed(void **state)
{
    (void)state;
    char name[300];
    gs_hostkey_entry_name("gpu.example.com", 22, name, sizeof(name));
    assert_string_equal(name, "gpu.example.com");
    gs_hostkey_entry_name("127.0.0.1", 2222, name, sizeof(name));
    assert_string_equal(name, "[127.0.0.1]:2222");
    gs_hostkey_entry_name("::1", 2200, name, sizeof(name));
    assert_string_equal(name, "[::1]:2200");
    gs_hostkey_entry_name("h", 0, name, sizeof(name));
    assert_string_equal(name, "h");
}

static void test_entry_name__is_what_openssh_looks_up(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], name[300], found[4096];
    make_key(f, "ed25519", "k", blob, b64, sizeof(b64));
    gs_hostkey_entry_name("127.0.0.1", 2222, name, sizeof(name));
    assert_int_equal(run("printf '%%s ssh-ed25519 %%s\\n' '%s' '%s' > '%s/kh'", name, b64, f->dir),
                     0);
    /* ssh-keygen -F takes the same [host]:port syntax as ssh uses for lookups */
    capture(found, sizeof(found), "ssh-keygen -F '[127.0.0.1]:2222' -f '%s/kh' | grep -v '^#'",
            f->dir);
    assert_non_null(strstr(found, b64));
}

/* Fingerprint of DIR/NAME.pub as ssh-keygen prints it (second field of -lf). */
static void keygen_fingerprint(struct fixture *f, const char *name, char *out, size_t size)
{
    capture(out, size, "ssh-keygen -lf '%s/%s.pub' | awk '{print $2}'", f->dir, name);
}

static void check_fingerprint(struct fixture *f, const char *type, const char *name)
{
    unsigned char blob[4096];
    char b64[4096], ours[64], theirs[128];
    size_t len = make_key(f, type, name, blob, b64, sizeof(b64));
    assert_true(len > 32);
    gs_kh_fingerprint(blob, len, ours);
    keygen_fingerprint(f, name, theirs, sizeof(theirs));
    assert_true(strncmp(theirs, "SHA256:", 7) == 0);
    assert_string_equal(ours, theirs);
}

static void test_fingerprint__equals_ssh_keygen_for_ed25519(void **state)
{
    check_fingerprint(*state, "ed25519", "fp_ed");
}

static void test_fingerprint__equals_ssh_keygen_for_ecdsa(void **state)
{
    check_fingerprint(*state, "ecdsa", "fp_ec");
}

static void test_fingerprint__equals_ssh_keygen_for_rsa(void **state)
{
    check_fingerprint(*state, "rsa", "fp_rsa");
}

static void test_known_hosts__plain_entry_matches_its_key(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "plain", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "other.example ssh-ed25519 %s\ngpu1 ssh-ed25519 %s\n", b64, b64);
    struct gs_kh_result r;
    assert_int_equal(check(f, text, 0, "gpu1", 22, blob, len, &r), GS_KH_MATCH);
    assert_int_equal(r.line, 2);
    assert_int_equal(check(f, text, 0, "gpu2", 22, blob, len, NULL), GS_KH_UNKNOWN);
}

static void test_known_hosts__bracketed_port_entry_matches_only_that_port(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "port", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "[127.0.0.1]:2222 ssh-ed25519 %s\n", b64);
    assert_int_equal(check(f, text, 0, "127.0.0.1", 2222, blob, len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 0, "127.0.0.1", 2223, blob, len, NULL), GS_KH_UNKNOWN);
    assert_int_equal(check(f, text, 0, "127.0.0.1", 22, blob, len, NULL), GS_KH_UNKNOWN);
}

static void test_known_hosts__hashed_entries_match(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "hashed", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "gpu1 ssh-ed25519 %s\n[10.0.0.7]:2200 ssh-ed25519 %s\n", b64, b64);
    assert_int_equal(check(f, text, 1, "gpu1", 22, blob, len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 1, "10.0.0.7", 2200, blob, len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 1, "10.0.0.8", 2200, blob, len, NULL), GS_KH_UNKNOWN);
}

static void test_known_hosts__different_key_is_a_change_plain_and_hashed(void **state)
{
    struct fixture *f = *state;
    unsigned char old_blob[4096], new_blob[4096];
    char old_b64[4096], new_b64[4096], text[16384], old_fp[64];
    size_t old_len = make_key(f, "ed25519", "old", old_blob, old_b64, sizeof(old_b64));
    size_t len = make_key(f, "ed25519", "new", new_blob, new_b64, sizeof(new_b64));
    gs_kh_fingerprint(old_blob, old_len, old_fp);
    snprintf(text, sizeof(text), "[127.0.0.1]:2222 ssh-ed25519 %s\n", old_b64);
    for (int hash = 0; hash <= 1; hash++) {
        struct gs_kh_result r;
        assert_int_equal(check(f, text, hash, "127.0.0.1", 2222, new_blob, len, &r), GS_KH_CHANGED);
        /* the old entry's fingerprint and place are reported, for the message */
        assert_string_equal(r.recorded_fp, old_fp);
        assert_string_equal(r.recorded_type, "ssh-ed25519");
        assert_int_equal(r.line, 1);
    }
}

static void test_known_hosts__second_key_type_for_same_host_still_matches(void **state)
{
    /* known_hosts with an ECDSA and an ed25519 line for one host: either key is a match */
    struct fixture *f = *state;
    unsigned char ed[4096], ec[4096];
    char ed64[4096], ec64[4096], text[16384];
    size_t ed_len = make_key(f, "ed25519", "two_ed", ed, ed64, sizeof(ed64));
    size_t ec_len = make_key(f, "ecdsa", "two_ec", ec, ec64, sizeof(ec64));
    snprintf(text, sizeof(text), "[h]:2222 ecdsa-sha2-nistp256 %s\n[h]:2222 ssh-ed25519 %s\n", ec64,
             ed64);
    assert_int_equal(check(f, text, 0, "h", 2222, ed, ed_len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 0, "h", 2222, ec, ec_len, NULL), GS_KH_MATCH);
}

static void test_known_hosts__recorded_type_is_found_even_when_hashed(void **state)
{
    /* the type recorded for a host is preferred in the handshake */
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384], type[64];
    make_key(f, "ecdsa", "rec", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "[h]:2222 ecdsa-sha2-nistp256 %s\n", b64);
    const char *files[1] = {write_known_hosts(f, "known_hosts", text, 1)};
    assert_int_equal(gs_kh_recorded_type(files, 1, "[h]:2222", type, sizeof(type)), 0);
    assert_string_equal(type, "ecdsa-sha2-nistp256");
    assert_int_equal(gs_kh_recorded_type(files, 1, "[h]:2223", type, sizeof(type)), -1);
}

static void test_known_hosts__revoked_key_is_refused_even_beside_a_matching_line(void **state)
{
    /* libssh2 1.10 read "@revoked" as a host name, so the revocation was invisible */
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "revoked", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "gpu1 ssh-ed25519 %s\n@revoked gpu1 ssh-ed25519 %s\n", b64, b64);
    struct gs_kh_result r;
    assert_int_equal(check(f, text, 0, "gpu1", 22, blob, len, &r), GS_KH_REVOKED);
    assert_int_equal(r.line, 2);
    /* with only the revocation, the host is not unknown either */
    snprintf(text, sizeof(text), "@revoked * ssh-ed25519 %s\n", b64);
    assert_int_equal(check(f, text, 0, "gpu1", 22, blob, len, NULL), GS_KH_REVOKED);
}

static void test_known_hosts__entries_after_an_unreadable_line_still_count(void **state)
{
    /* libssh2's reader stopped at the first line it could not parse */
    struct fixture *f = *state;
    unsigned char old_blob[4096], new_blob[4096];
    char old_b64[4096], new_b64[4096], text[16384];
    make_key(f, "ed25519", "after_old", old_blob, old_b64, sizeof(old_b64));
    size_t len = make_key(f, "ed25519", "after_new", new_blob, new_b64, sizeof(new_b64));
    snprintf(text, sizeof(text),
             "# a comment\n\ngarbage-without-a-key\n@bogus-marker h ssh-ed25519 %s\n"
             "h ssh-ed25519 not*base64\n[h]:2222 ssh-ed25519 %s\n",
             old_b64, old_b64);
    struct gs_kh_result r;
    assert_int_equal(check(f, text, 0, "h", 2222, new_blob, len, &r), GS_KH_CHANGED);
    assert_int_equal(r.line, 6);
    assert_int_equal(r.bad_lines, 3);
    assert_non_null(strstr(r.first_bad, ":3"));
}

static void test_known_hosts__patterns_and_negation_as_openssh(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096], other[4096];
    char b64[4096], other64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "pat", blob, b64, sizeof(b64));
    make_key(f, "ed25519", "pat_other", other, other64, sizeof(other64));
    snprintf(text, sizeof(text),
             "*.gpu.example,!bad.gpu.example ssh-ed25519 %s\n"
             "[10.0.0.?]:22022 ssh-ed25519 %s\n",
             b64, b64);
    assert_int_equal(check(f, text, 0, "n1.GPU.example", 22, blob, len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 0, "bad.gpu.example", 22, blob, len, NULL), GS_KH_UNKNOWN);
    assert_int_equal(check(f, text, 0, "10.0.0.7", 22022, blob, len, NULL), GS_KH_MATCH);
    assert_int_equal(check(f, text, 0, "10.0.0.77", 22022, blob, len, NULL), GS_KH_UNKNOWN);
    assert_int_equal(check(f, text, 0, "n2.gpu.example", 22, other, len, NULL), GS_KH_CHANGED);
}

static void test_known_hosts__every_file_counts_and_a_ca_alone_is_not_trust(void **state)
{
    struct fixture *f = *state;
    unsigned char old_blob[4096], new_blob[4096];
    char old_b64[4096], new_b64[4096], text[16384];
    make_key(f, "ed25519", "multi_old", old_blob, old_b64, sizeof(old_b64));
    size_t len = make_key(f, "ed25519", "multi_new", new_blob, new_b64, sizeof(new_b64));
    char user[128], global[128];
    snprintf(user, sizeof(user), "%s", write_known_hosts(f, "user_kh", "", 0));
    snprintf(text, sizeof(text), "[h]:2222 ssh-ed25519 %s\n", old_b64);
    snprintf(global, sizeof(global), "%s", write_known_hosts(f, "global_kh", text, 0));
    const char *files[3] = {user, "/nonexistent/known_hosts", global};
    struct gs_kh_result r;
    gs_kh_lookup(files, 3, "[h]:2222", new_blob, len, &r);
    assert_int_equal(r.verdict, GS_KH_CHANGED);
    assert_string_equal(r.file, global);
    snprintf(text, sizeof(text), "@cert-authority *.example ssh-ed25519 %s\n", old_b64);
    assert_int_equal(check(f, text, 0, "h.example", 22, new_blob, len, NULL), GS_KH_CA_ONLY);
}

int main(void)
{
    libssh2_init(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_name__port_22_is_bare_other_ports_bracketed),
        cmocka_unit_test_setup_teardown(test_entry_name__is_what_openssh_looks_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint__equals_ssh_keygen_for_ed25519, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint__equals_ssh_keygen_for_ecdsa, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint__equals_ssh_keygen_for_rsa, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_known_hosts__plain_entry_matches_its_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__bracketed_port_entry_matches_only_that_port, setup, teardown),
        cmocka_unit_test_setup_teardown(test_known_hosts__hashed_entries_match, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__different_key_is_a_change_plain_and_hashed, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__second_key_type_for_same_host_still_matches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_known_hosts__recorded_type_is_found_even_when_hashed,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__revoked_key_is_refused_even_beside_a_matching_line, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__entries_after_an_unreadable_line_still_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_known_hosts__patterns_and_negation_as_openssh, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__every_file_counts_and_a_ca_alone_is_not_trust, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    libssh2_exit();
    return rc;
}
