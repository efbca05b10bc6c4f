/* remote/hostkey.c: known_hosts verification (see hostkey.h). */
#include "remote/hostkey.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "remote/known_hosts.h"

/* Host key types libssh2 1.10 negotiates: the method name, which is also the key's type in
 * known_hosts, and the label OpenSSH prints. */
static const struct {
    int hostkey_type;
    const char *method;
    const char *label;
} key_types[] = {
    {LIBSSH2_HOSTKEY_TYPE_ED25519, "ssh-ed25519", "ED25519"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_256, "ecdsa-sha2-nistp256", "ECDSA"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_384, "ecdsa-sha2-nistp384", "ECDSA"},
    {LIBSSH2_HOSTKEY_TYPE_ECDSA_521, "ecdsa-sha2-nistp521", "ECDSA"},
    {LIBSSH2_HOSTKEY_TYPE_RSA, "ssh-rsa", "RSA"},
};
#define N_KEY_TYPES (sizeof(key_types) / sizeof(key_types[0]))

void gs_hostkey_entry_name(const char *host, int port, char *out, size_t size)
{
    if (port == 22 || port <= 0)
        snprintf(out, size, "%s", host);
    else
        snprintf(out, size, "[%s]:%d", host, port);
}

/* Every file OpenSSH reads, the user's first (the first of them receives new keys). */
static void all_files(const struct gs_hostkey_policy *policy, const char **files, size_t *n)
{
    *n = 0;
    for (size_t i = 0; i < policy->n_user_files && *n < GS_HOSTKEY_MAX_FILES; i++)
        files[(*n)++] = policy->user_files[i];
    for (size_t i = 0; i < policy->n_global_files && *n < GS_HOSTKEY_MAX_FILES; i++)
        files[(*n)++] = policy->global_files[i];
}

int gs_hostkey_prefer_known_type(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                                 const char *host, int port)
{
    const char *files[GS_HOSTKEY_MAX_FILES];
    size_t n;
    all_files(policy, files, &n);
    char name[300], type[64] = "";
    gs_hostkey_entry_name(host, port, name, sizeof(name));
    gs_kh_recorded_type(files, n, name, type, sizeof(type));
    struct gs_buf prefs = GS_BUF_INIT;
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (strcmp(key_types[i].method, type) == 0)
            gs_buf_adds(&prefs, key_types[i].method);
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (strcmp(key_types[i].method, type) != 0)
            gs_buf_addf(&prefs, "%s%s", prefs.len ? "," : "", key_types[i].method);
    libssh2_session_method_pref(session, LIBSSH2_METHOD_HOSTKEY, prefs.data);
    gs_buf_release(&prefs);
    return 0;
}

static const char *method_of(int hostkey_type)
{
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].hostkey_type == hostkey_type)
            return key_types[i].method;
    return NULL;
}

static const char *label_of(int hostkey_type)
{
    for (size_t i = 0; i < N_KEY_TYPES; i++)
        if (key_types[i].hostkey_type == hostkey_type)
            return key_types[i].label;
    return "unknown";
}

/* "ssh-keygen -R 'NAME'", with -f when the entry is not in the default file. */
static void removal_command(const char *name, const char *file, char *out, size_t size)
{
    char *home_file = gs_path_expand_home("~/.ssh/known_hosts");
    int default_file = home_file && strcmp(home_file, file) == 0;
    free(home_file);
    if (default_file)
        snprintf(out, size, "ssh-keygen -R '%s'", name);
    else
        snprintf(out, size, "ssh-keygen -R '%s' -f '%s'", name, file);
}

static int refuse_changed(const struct gs_kh_result *r, const char *name, int type, const char *fp,
                          struct gs_error *err)
{
    char fix[PATH_MAX + 400];
    removal_command(name, r->file, fix, sizeof(fix));
    return gs_error_set(err, GS_E_HOSTKEY_CHANGED,
                        "host key for %s changed: %s:%d has %s %s, the server now offers %s key "
                        "%s. This could be an attack; if the server was reinstalled, remove the "
                        "old entry with: %s",
                        name, r->file, r->line, r->recorded_type, r->recorded_fp, label_of(type),
                        fp, fix);
}

static int refuse_revoked(const struct gs_kh_result *r, const char *name, int type, const char *fp,
                          struct gs_error *err)
{
    return gs_error_set(err, GS_E_HOSTKEY_CHANGED,
                        "host key for %s is revoked: the server offers %s key %s, which %s:%d "
                        "marks @revoked. Refusing to connect",
                        name, label_of(type), fp, r->file, r->line);
}

static int refuse_ca_only(const char *name, int type, const char *fp, struct gs_error *err)
{
    return gs_error_set(err, GS_E_HOSTKEY_UNKNOWN,
                        "known_hosts trusts a certificate authority for %s, and gpusync cannot "
                        "check host certificates. After checking the server's %s key %s with "
                        "your provider, add that key itself to ~/.ssh/known_hosts "
                        "(ssh-keyscan prints it)",
                        name, label_of(type), fp);
}

/* Appends one OpenSSH line for the new key (creating ~/.ssh if needed). */
static int record_key(const char *path, const char *name, int type, const char *key, size_t len,
                      struct gs_error *err)
{
    const char *method = method_of(type);
    if (!method)
        return gs_error_set(err, GS_E_IO, "cannot record a %s key for %s", label_of(type), name);
    unsigned char *b64 = gs_xmalloc(4 * ((len + 2) / 3) + 1);
    EVP_EncodeBlock(b64, (const unsigned char *)key, (int)len);
    char *dir = gs_xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdir(dir, 0700);
    }
    free(dir);
    FILE *fp = fopen(path, "a");
    int bad = !fp || fprintf(fp, "%s %s %s added by gpusync\n", name, method, b64) < 0;
    if (fp && fclose(fp) != 0)
        bad = 1;
    free(b64);
    return bad ? gs_error_errno(err, GS_E_IO, "cannot append to %s", path) : 0;
}

static int handle_unknown(const struct gs_hostkey_policy *policy, const char *name, const char *key,
                          size_t len, int type, const char *fp, struct gs_error *err)
{
    const char *path = policy->n_user_files ? policy->user_files[0] : NULL;
    if (!path)
        return gs_error_set(err, GS_E_HOSTKEY_UNKNOWN,
                            "host %s is unknown and no known_hosts "
                            "file is configured to record it in",
                            name);
    int accept = policy->accept_new;
    if (!accept && policy->confirm) {
        char question[PATH_MAX + 512];
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
    return record_key(path, name, type, key, len, err);
}

int gs_hostkey_verify(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                      const char *host, int port, char *fp, struct gs_error *err)
{
    size_t len = 0;
    int type = 0;
    const char *key = libssh2_session_hostkey(session, &len, &type);
    if (!key)
        return gs_error_set(err, GS_E_CONNECT, "%s: the server sent no host key", host);
    gs_kh_fingerprint((const unsigned char *)key, len, fp);
    char name[300];
    gs_hostkey_entry_name(host, port, name, sizeof(name));
    const char *files[GS_HOSTKEY_MAX_FILES];
    size_t n;
    all_files(policy, files, &n);
    struct gs_kh_result r;
    gs_kh_lookup(files, n, name, (const unsigned char *)key, len, &r);
    switch (r.verdict) {
    case GS_KH_MATCH:
        return 0;
    case GS_KH_REVOKED:
        return refuse_revoked(&r, name, type, fp, err);
    case GS_KH_CHANGED:
        return refuse_changed(&r, name, type, fp, err);
    case GS_KH_CA_ONLY:
        return refuse_ca_only(name, type, fp, err);
    case GS_KH_UNKNOWN:
        break;
    }
    return handle_unknown(policy, name, key, len, type, fp, err);
}
