/* remote/hostkey.c: known_hosts verification (see hostkey.h). */
#include "remote/hostkey.h"

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/path.h"

/* libssh2 known_hosts key types and the method names libssh2 1.10 negotiates for them. */
static const struct {
    int knownhost_type;
    int hostkey_type;
    const char *method;
    const char *label;
} key_types[] = {
    {LIBSSH2_KNOWNHOST_KEY_ED25519, LIBSSH2_HOSTKEY_TYPE_ED25519, "ssh-ed25519", "ED25519"},
    {LIBSSH2_KNOWNHOST_KEY_ECDSA_256, LIBSSH2_HOSTKEY_TYPE_ECDSA_256, "ecdsa-sha2-nistp256",
     "ECDSA"},
    {LIBSSH2_KNOWNHOST_KEY_ECDSA_384, LIBSSH2_HOSTKEY_TYPE_ECDSA_384, "ecdsa-sha2-nistp384",
     "ECDSA"},
    {LIBSSH2_KNOWNHOST_KEY_ECDSA_521, LIBSSH2_HOSTKEY_TYPE_ECDSA_521, "ecdsa-sha2-nistp521",
     "ECDSA"},
    {LIBSSH2_KNOWNHOST_KEY_SSHRSA, LIBSSH2_HOSTKEY_TYPE_RSA, "ssh-rsa", "RSA"},
};
#define N_KEY_TYPES (sizeof(key_types) / sizeof(key_types[0]))

void gs_hostkey_entry_name(const char *host, int port, char *out, size_t size)
{
    if (port == 22 || port <= 0)
        snprintf(out, size, "%s", host);
    else
        snprintf(out, size, "[%s]:%d", host, port);
}

void gs_hostkey_fingerprint(const unsigned char *blob, size_t len, char *out)
{
    unsigned char digest[SHA256_DIGEST_LENGTH];
    unsigned char b64[64];
    SHA256(blob, len, digest);
    int n = EVP_EncodeBlock(b64, digest, sizeof(digest));
    while (n > 0 && b64[n - 1] == '=') /* OpenSSH prints the base64 without padding */
        n--;
    snprintf(out, 64, "SHA256:%.*s", n, (const char *)b64);
}

static char *known_hosts_path(const struct gs_hostkey_policy *policy)
{
    return gs_path_expand_home(policy->known_hosts ? policy->known_hosts : "~/.ssh/known_hosts");
}

/* Loads known_hosts into a new collection; a missing file is an empty collection. */
static LIBSSH2_KNOWNHOSTS *load_known(LIBSSH2_SESSION *session, const char *path)
{
    LIBSSH2_KNOWNHOSTS *kh = libssh2_knownhost_init(session);
    if (kh && gs_path_exists(path))
        libssh2_knownhost_readfile(kh, path, LIBSSH2_KNOWNHOST_FILE_OPENSSH);
    return kh;
}

/* Finds the recorded entry for host:port by checking a key that cannot match: libssh2 then
 * reports the first entry with that host name as a mismatch (this also covers hashed entries,
 * whose names cannot be compared from outside). Returns the entry's key type, or 0. */
static int recorded_key_type(LIBSSH2_KNOWNHOSTS *kh, const char *host, int port,
                             struct libssh2_knownhost **entry)
{
    static const char probe[] = "gpusync-probe-key-that-matches-nothing";
    struct libssh2_knownhost *found = NULL;
    char name[300];
    gs_hostkey_entry_name(host, port, name, sizeof(name));
    int rc = libssh2_knownhost_checkp(kh, name, -1, probe, sizeof(probe) - 1,
                                      LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW,
                                      &found);
    if (rc != LIBSSH2_KNOWNHOST_CHECK_MISMATCH || !found)
        return 0;
    if (entry)
        *entry = found;
    return found->typemask & LIBSSH2_KNOWNHOST_KEY_MASK;
}

int gs_hostkey_prefer_known_type(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                                 const char *host, int port)
{
    char *path = known_hosts_path(policy);
    LIBSSH2_KNOWNHOSTS *kh = load_known(session, path);
    free(path);
    if (!kh)
        return 0;
    int type = recorded_key_type(kh, host, port, NULL);
    libssh2_knownhost_free(kh);
    struct gs_buf prefs = GS_BUF_INIT;
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].knownhost_type == type)
            gs_buf_adds(&prefs, key_types[i].method);
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].knownhost_type != type)
            gs_buf_addf(&prefs, "%s%s", prefs.len ? "," : "", key_types[i].method);
    libssh2_session_method_pref(session, LIBSSH2_METHOD_HOSTKEY, prefs.data);
    gs_buf_release(&prefs);
    return 0;
}

static int knownhost_type_of(int hostkey_type)
{
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].hostkey_type == hostkey_type)
            return key_types[i].knownhost_type;
    return LIBSSH2_KNOWNHOST_KEY_UNKNOWN;
}

static const char *label_of(int hostkey_type)
{
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].hostkey_type == hostkey_type)
            return key_types[i].label;
    return "unknown";
}

/* The fingerprint of a recorded entry, whose key libssh2 keeps as "[type ]base64". */
static void recorded_fingerprint(const struct libssh2_knownhost *entry, char *out)
{
    const char *b64 = entry->key;
    const char *space = strrchr(b64, ' ');
    if (space)
        b64 = space + 1;
    size_t len = strlen(b64);
    unsigned char *blob = malloc(len + 3);
    int n = blob ? EVP_DecodeBlock(blob, (const unsigned char *)b64, (int)len) : -1;
    if (n < 0) {
        snprintf(out, 64, "(unreadable)");
    } else {
        while (len > 0 && b64[len - 1] == '=') { /* DecodeBlock counts padding as zero bytes */
            len--;
            n--;
        }
        gs_hostkey_fingerprint(blob, (size_t)n, out);
    }
    free(blob);
}

static int refuse_changed(const struct libssh2_knownhost *entry, const char *name,
                          const char *type_label, const char *fp, const char *path,
                          struct gs_error *err)
{
    char old_fp[64];
    recorded_fingerprint(entry, old_fp);
    return gs_error_set(err, GS_E_HOSTKEY_CHANGED,
                        "host key for %s changed: known_hosts (%s) has %s, the server now offers "
                        "%s key %s. This could be an attack; if the server was reinstalled, remove "
                        "the old entry with: ssh-keygen -R '%s'",
                        name, path, old_fp, type_label, fp, name);
}

/* Appends one line for the new key to the file (creating ~/.ssh if needed). */
static int record_key(LIBSSH2_KNOWNHOSTS *kh, const char *name, const char *key, size_t len,
                      int key_type, const char *path, struct gs_error *err)
{
    struct libssh2_knownhost *added = NULL;
    if (libssh2_knownhost_addc(
            kh, name, NULL, key, len, "added by gpusync", 16,
            LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | key_type, &added) != 0)
        return gs_error_set(err, GS_E_IO, "cannot record host key for %s", name);
    char line[8192];
    size_t line_len = 0;
    if (libssh2_knownhost_writeline(kh, added, line, sizeof(line), &line_len,
                                    LIBSSH2_KNOWNHOST_FILE_OPENSSH) != 0)
        return gs_error_set(err, GS_E_IO, "cannot format host key for %s", name);
    char *dir = strdup(path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdir(dir, 0700);
    }
    free(dir);
    FILE *fp = fopen(path, "a");
    if (!fp)
        return gs_error_errno(err, GS_E_IO, "cannot append to %s", path);
    size_t wrote = fwrite(line, 1, line_len, fp);
    if (fclose(fp) != 0 || wrote != line_len)
        return gs_error_errno(err, GS_E_IO, "cannot append to %s", path);
    return 0;
}

static int handle_unknown(const struct gs_hostkey_policy *policy, LIBSSH2_KNOWNHOSTS *kh,
                          const char *name, const char *key, size_t len, int type, const char *fp,
                          const char *path, struct gs_error *err)
{
    int accept = policy->accept_new;
    if (!accept && policy->confirm) {
        char question[512];
        snprintf(question, sizeof(question),
                 "The authenticity of host '%s' can't be established.\n%s key fingerprint is %s.\n"
                 "Record it in %s and continue connecting (yes/no)? ",
                 name, label_of(type), fp, path);
        accept = policy->confirm(policy->prompt_ctx, question);
    }
    if (!accept)
        return gs_error_set(err, GS_E_HOSTKEY_UNKNOWN,
                            "host %s is not in %s (%s key %s); check the fingerprint with your "
                            "provider, then run again with --accept-new-host-key",
                            name, path, label_of(type), fp);
    return record_key(kh, name, key, len, knownhost_type_of(type), path, err);
}

int gs_hostkey_verify(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                      const char *host, int port, char *fp, struct gs_error *err)
{
    size_t len = 0;
    int type = 0;
    const char *key = libssh2_session_hostkey(session, &len, &type);
    if (!key)
        return gs_error_set(err, GS_E_CONNECT, "%s: the server sent no host key", host);
    gs_hostkey_fingerprint((const unsigned char *)key, len, fp);
    char name[300];
    gs_hostkey_entry_name(host, port, name, sizeof(name));
    char *path = known_hosts_path(policy);
    LIBSSH2_KNOWNHOSTS *kh = load_known(session, path);
    int rc = 0;
    if (!kh) {
        rc = gs_error_set(err, GS_E_NOMEM, "cannot load %s", path);
        goto out;
    }
    struct libssh2_knownhost *entry = NULL;
    /* Only the exact name OpenSSH uses ("[host]:port" unless port 22): libssh2 would also accept
     * a bare "host" entry, which belongs to the server on port 22, not to this one. */
    int check = libssh2_knownhost_checkp(
        kh, name, -1, key, len, LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW,
        &entry);
    if (check == LIBSSH2_KNOWNHOST_CHECK_MISMATCH)
        rc = refuse_changed(entry, name, label_of(type), fp, path, err);
    else if (check != LIBSSH2_KNOWNHOST_CHECK_MATCH)
        rc = handle_unknown(policy, kh, name, key, len, type, fp, path, err);
    libssh2_knownhost_free(kh);
out:
    free(path);
    return rc;
}
