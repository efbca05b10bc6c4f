/* remote/hostkey.h: host key verification against OpenSSH's known_hosts (design decision 6).
 *
 * Every file OpenSSH would read is consulted (remote/known_hosts.h parses them): the user's and
 * the global known_hosts files, as `ssh -G` names them. An unknown key is recorded only when the
 * user agrees (a prompt) or asked for it in advance (--accept-new-host-key), and only for a host
 * that no file has any entry for; a changed or @revoked key is always refused. New entries are
 * appended as one line to the first user file, so the rest of it is never rewritten. */
#ifndef GS_HOSTKEY_H
#define GS_HOSTKEY_H

#include <libssh2.h>

#include "common/error.h"
#include "remote/ssh.h"

#define GS_HOSTKEY_MAX_FILES 16

struct gs_hostkey_policy {
    const char *const *user_files; /* UserKnownHostsFile: read, and the first receives new keys */
    size_t n_user_files;
    const char *const *global_files; /* GlobalKnownHostsFile: read only */
    size_t n_global_files;
    int accept_new;
    gs_ssh_confirm_fn confirm;
    void *prompt_ctx;
};

/* Before the handshake: makes libssh2 ask the server for the key type already recorded for
 * host:port, so that a known host is not mistaken for a changed one (libssh2 prefers ECDSA).
 * Returns 0; failures to read the file are not errors here (verification reports them). */
int gs_hostkey_prefer_known_type(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                                 const char *host, int port);

/* After the handshake: checks the server's key. Writes the "SHA256:..." fingerprint to `fp` (at
 * least 64 bytes). Returns 0 when the key matches or was accepted and recorded;
 * GS_E_HOSTKEY_UNKNOWN when unknown and not accepted (or only a certificate authority is trusted
 * for the host, which gpusync cannot check); GS_E_HOSTKEY_CHANGED on a mismatch, with a message
 * naming the host, the file and line, both fingerprints and the ssh-keygen -R command, or for a
 * key marked @revoked; GS_E_IO when the key could not be recorded. */
int gs_hostkey_verify(LIBSSH2_SESSION *session, const struct gs_hostkey_policy *policy,
                      const char *host, int port, char *fp, struct gs_error *err);

/* The name a known_hosts line uses for host:port ("host" for 22, "[host]:port" otherwise). */
void gs_hostkey_entry_name(const char *host, int port, char *out, size_t size);

#endif
