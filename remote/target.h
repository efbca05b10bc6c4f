/* remote/target.h: who to connect to. Resolves a host (possibly an ~/.ssh/config alias) into the
 * real host name, port, user and identity files the way OpenSSH would, by asking `ssh -G` when the
 * OpenSSH client is installed; without it, the given values and defaults are used as they are. */
#ifndef GS_TARGET_H
#define GS_TARGET_H

#include <stddef.h>

#include "common/error.h"

struct gs_target {
    char *alias;    /* what the user wrote */
    char *hostname; /* what to connect to */
    int port;
    char *user;
    char **identities; /* identity files to try, in order, "~" expanded; may not exist */
    size_t n_identities;
    /* known_hosts files OpenSSH reads for it (UserKnownHostsFile, GlobalKnownHostsFile), "~"
     * expanded */
    char **user_known_hosts;
    size_t n_user_known_hosts;
    char **global_known_hosts;
    size_t n_global_known_hosts;
};

/* The key `gpusync init --install-key` and `gpusync hosts add` create and install on servers. It is
 * always among the identities (first), so every project on a server that holds it logs in without
 * a password, whatever its config names. */
#define GS_TARGET_MANAGED_KEY "~/.ssh/gpusync_ed25519"

/* Fills `t` for `host` with explicit overrides `port` (0: none) and `user` (NULL: none).
 * Returns 0, or GS_E_USAGE for an empty host. `t` must be released with gs_target_release. */
int gs_target_resolve(struct gs_target *t, const char *host, int port, const char *user,
                      struct gs_error *err);

/* "user@hostname:port" of a resolved target (malloc'd): one server however it was written (an
 * alias, an address, the default port left out or not). */
char *gs_target_id(const struct gs_target *t);

/* Parses `ssh -G` output into `t` (exposed for tests). */
void gs_target_apply_ssh_g(struct gs_target *t, const char *output);

void gs_target_release(struct gs_target *t);

/* "user@host:port" for `host` (an alias or a name) as a connection would resolve it, into `out`;
 * the host as written when it cannot be resolved. For messages about a server not connected. */
void gs_target_name(const char *host, int port, const char *user, char *out, size_t size);

#endif
