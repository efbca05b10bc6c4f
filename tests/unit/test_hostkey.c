/* tests/unit/test_hostkey.c: known_hosts naming and matching with a real libssh2 knownhost
 * collection (plain, hashed and [host]:port entries written by OpenSSH's own tools), and SHA256
 * fingerprints compared with what `ssh-keygen -lf` prints for the same key. */
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

struct fixture {
    char dir[64];
    LIBSSH2_SESSION *session;
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
    f->session = libssh2_session_init();
    if (!f->session)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    libssh2_session_free(f->session);
    run("rm -rf '%s'", f->dir);
    free(f);
    return 0;
}

/* Writes `text` to DIR/known_hosts and loads it into a new collection. */
static LIBSSH2_KNOWNHOSTS *load(struct fixture *f, const char *text, int hash)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/known_hosts", f->dir);
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
    LIBSSH2_KNOWNHOSTS *kh = libssh2_knownhost_init(f->session);
    assert_non_null(kh);
    int n = libssh2_knownhost_readfile(kh, path, LIBSSH2_KNOWNHOST_FILE_OPENSSH);
    assert_true(n >= 1);
    return kh;
}

static int check(LIBSSH2_KNOWNHOSTS *kh, const char *host, int port, const unsigned char *blob,
                 size_t len, struct libssh2_knownhost **entry)
{
    /* the same flags remote/hostkey.c uses */
    return libssh2_knownhost_checkp(kh, host, port, (const char *)blob, len,
                                    LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW,
                                    entry);
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
    gs_hostkey_fingerprint(blob, len, ours);
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
    LIBSSH2_KNOWNHOSTS *kh = load(f, text, 0);
    struct libssh2_knownhost *entry = NULL;
    assert_int_equal(check(kh, "gpu1", 22, blob, len, &entry), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    assert_non_null(entry);
    assert_int_equal(check(kh, "gpu2", 22, blob, len, NULL), LIBSSH2_KNOWNHOST_CHECK_NOTFOUND);
    libssh2_knownhost_free(kh);
}

static void test_known_hosts__bracketed_port_entry_matches_only_that_port(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "port", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "[127.0.0.1]:2222 ssh-ed25519 %s\n", b64);
    LIBSSH2_KNOWNHOSTS *kh = load(f, text, 0);
    assert_int_equal(check(kh, "127.0.0.1", 2222, blob, len, NULL), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    assert_int_equal(check(kh, "127.0.0.1", 2223, blob, len, NULL),
                     LIBSSH2_KNOWNHOST_CHECK_NOTFOUND);
    assert_int_equal(check(kh, "127.0.0.1", 22, blob, len, NULL), LIBSSH2_KNOWNHOST_CHECK_NOTFOUND);
    libssh2_knownhost_free(kh);
}

static void test_known_hosts__hashed_entries_match(void **state)
{
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    size_t len = make_key(f, "ed25519", "hashed", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "gpu1 ssh-ed25519 %s\n[10.0.0.7]:2200 ssh-ed25519 %s\n", b64, b64);
    LIBSSH2_KNOWNHOSTS *kh = load(f, text, 1);
    assert_int_equal(check(kh, "gpu1", 22, blob, len, NULL), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    assert_int_equal(check(kh, "10.0.0.7", 2200, blob, len, NULL), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    assert_int_equal(check(kh, "10.0.0.8", 2200, blob, len, NULL),
                     LIBSSH2_KNOWNHOST_CHECK_NOTFOUND);
    libssh2_knownhost_free(kh);
}

static void test_known_hosts__different_key_is_a_mismatch_plain_and_hashed(void **state)
{
    struct fixture *f = *state;
    unsigned char old_blob[4096], new_blob[4096];
    char old_b64[4096], new_b64[4096], text[16384];
    make_key(f, "ed25519", "old", old_blob, old_b64, sizeof(old_b64));
    size_t len = make_key(f, "ed25519", "new", new_blob, new_b64, sizeof(new_b64));
    snprintf(text, sizeof(text), "[127.0.0.1]:2222 ssh-ed25519 %s\n", old_b64);
    for (int hash = 0; hash <= 1; hash++) {
        LIBSSH2_KNOWNHOSTS *kh = load(f, text, hash);
        struct libssh2_knownhost *entry = NULL;
        assert_int_equal(check(kh, "127.0.0.1", 2222, new_blob, len, &entry),
                         LIBSSH2_KNOWNHOST_CHECK_MISMATCH);
        /* the mismatching entry carries the old key, from which the old fingerprint is shown */
        assert_non_null(entry);
        assert_non_null(strstr(entry->key, old_b64));
        libssh2_knownhost_free(kh);
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
    LIBSSH2_KNOWNHOSTS *kh = load(f, text, 0);
    assert_int_equal(check(kh, "h", 2222, ed, ed_len, NULL), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    assert_int_equal(check(kh, "h", 2222, ec, ec_len, NULL), LIBSSH2_KNOWNHOST_CHECK_MATCH);
    libssh2_knownhost_free(kh);
}

static void test_known_hosts__recorded_type_visible_through_mismatch_even_when_hashed(void **state)
{
    /* hostkey.c finds the recorded key type (to prefer it in the handshake) by checking a key
     * that matches nothing: libssh2 must report the entry, with its type, also for hashed lines */
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], text[16384];
    make_key(f, "ecdsa", "rec", blob, b64, sizeof(b64));
    snprintf(text, sizeof(text), "[h]:2222 ecdsa-sha2-nistp256 %s\n", b64);
    LIBSSH2_KNOWNHOSTS *kh = load(f, text, 1);
    static const unsigned char probe[] = "matches-nothing";
    struct libssh2_knownhost *entry = NULL;
    assert_int_equal(check(kh, "h", 2222, probe, sizeof(probe) - 1, &entry),
                     LIBSSH2_KNOWNHOST_CHECK_MISMATCH);
    assert_non_null(entry);
    assert_int_equal(entry->typemask & LIBSSH2_KNOWNHOST_KEY_MASK, LIBSSH2_KNOWNHOST_KEY_ECDSA_256);
    libssh2_knownhost_free(kh);
}

static void test_known_hosts__line_written_like_gpusync_reads_back_in_openssh(void **state)
{
    /* remote/hostkey.c records keys with addc + writeline; OpenSSH must find that line */
    struct fixture *f = *state;
    unsigned char blob[4096];
    char b64[4096], name[300], path[128], found[4096];
    size_t len = make_key(f, "ed25519", "rw", blob, b64, sizeof(b64));
    gs_hostkey_entry_name("127.0.0.1", 2345, name, sizeof(name));
    LIBSSH2_KNOWNHOSTS *kh = libssh2_knownhost_init(f->session);
    struct libssh2_knownhost *added = NULL;
    assert_int_equal(
        libssh2_knownhost_addc(kh, name, NULL, (const char *)blob, len, "added by gpusync", 16,
                               LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW |
                                   LIBSSH2_KNOWNHOST_KEY_ED25519,
                               &added),
        0);
    char line[8192];
    size_t line_len = 0;
    assert_int_equal(libssh2_knownhost_writeline(kh, added, line, sizeof(line), &line_len,
                                                 LIBSSH2_KNOWNHOST_FILE_OPENSSH),
                     0);
    libssh2_knownhost_free(kh);
    snprintf(path, sizeof(path), "%s/written", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fwrite(line, 1, line_len, fp);
    fclose(fp);
    capture(found, sizeof(found), "ssh-keygen -F '[127.0.0.1]:2345' -f '%s' | grep -v '^#'", path);
    assert_non_null(strstr(found, b64));
    assert_non_null(strstr(found, "ssh-ed25519"));
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
            test_known_hosts__different_key_is_a_mismatch_plain_and_hashed, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__second_key_type_for_same_host_still_matches, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__recorded_type_visible_through_mismatch_even_when_hashed, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_known_hosts__line_written_like_gpusync_reads_back_in_openssh, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    libssh2_exit();
    return rc;
}
