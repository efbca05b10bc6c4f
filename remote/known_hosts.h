/* remote/known_hosts.h: reading OpenSSH known_hosts files the way OpenSSH does.
 *
 * libssh2 1.10's reader stops at the first line it cannot parse (dropping every entry after it)
 * and reads @revoked and @cert-authority markers as host names, so a key revoked or pinned
 * further down was invisible and "accept new" recorded the server's new key over it. This reader
 * goes line by line through every file OpenSSH would read (the user's and the global ones, as
 * `ssh -G` names them): a bad line is skipped and counted, markers are honoured, hashed names
 * (|1|salt|hash), patterns (*, ?, !negation) and [host]:port names match as in OpenSSH. */
#ifndef GS_KNOWN_HOSTS_H
#define GS_KNOWN_HOSTS_H

#include <limits.h>
#include <stddef.h>

enum gs_kh_verdict {
    GS_KH_UNKNOWN, /* no entry of any kind names the host */
    GS_KH_MATCH,   /* an entry for the host holds this key */
    GS_KH_CHANGED, /* entries for the host exist, none holds this key */
    GS_KH_REVOKED, /* an @revoked entry for the host holds this key */
    GS_KH_CA_ONLY, /* only @cert-authority entries name the host (not verifiable here) */
};

struct gs_kh_result {
    enum gs_kh_verdict verdict;
    char file[PATH_MAX]; /* the deciding entry (CHANGED: the first entry for the host) */
    int line;
    char recorded_type[64];        /* that entry's key type, e.g. "ssh-ed25519" */
    char recorded_fp[64];          /* and its SHA256 fingerprint */
    int bad_lines;                 /* lines skipped as unreadable, in every file read */
    char first_bad[PATH_MAX + 16]; /* "file:line" of the first of them */
};

/* The OpenSSH-style SHA256 fingerprint of a raw key blob, into `out` (at least 64 bytes). */
void gs_kh_fingerprint(const unsigned char *blob, size_t len, char *out);

/* Looks up `name` (as OpenSSH writes it: "host" for port 22, "[host]:port" otherwise) with the
 * server's key `blob` (the SSH wire form, as libssh2_session_hostkey returns it) in `files`, in
 * order. Missing files are skipped. */
void gs_kh_lookup(const char *const *files, size_t n_files, const char *name,
                  const unsigned char *blob, size_t len, struct gs_kh_result *out);

/* The key type ("ssh-ed25519", ...) of the first usable entry for `name`, into `type`; returns 0,
 * or -1 when there is none. */
int gs_kh_recorded_type(const char *const *files, size_t n_files, const char *name, char *type,
                        size_t size);

#endif
