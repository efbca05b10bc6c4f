/* remote/auth.h: user authentication in the order of design decision 5: ssh-agent, identity files
 * (ed25519, ECDSA; a passphrase is asked for when needed), then password or keyboard-interactive.
 * Each method is tried at most once per key or password, so a wrong password never becomes a retry
 * storm that trips the server's MaxAuthTries or fail2ban. */
#ifndef GS_AUTH_H
#define GS_AUTH_H

#include "common/error.h"
#include "remote/ssh.h"
#include "remote/target.h"

/* Authenticates `s` as t->user. On success returns 0 and stores a malloc'd description of the
 * method that worked in *method. On failure returns GS_E_AUTH with a message that gives the cause
 * first (a rejected password, an unreadable `identity =` file, an RSA-only setup, no password to
 * try) with what was tried, and what to do next. */
int gs_auth_login(struct gs_ssh *s, const struct gs_target *t, const struct gs_ssh_opts *opts,
                  char **method, struct gs_error *err);

/* Creates GS_TARGET_MANAGED_KEY (ed25519, no passphrase) and its .pub with ssh-keygen unless it
 * exists. Returns 0, or GS_E_IO (or GS_E_NOTFOUND without ssh-keygen) with nothing created. */
int gs_auth_managed_key_ensure(struct gs_error *err);

/* Adds the managed key's public half to ~/.ssh/authorized_keys on the server `s` is logged in to,
 * unless a line there already holds that key, whatever its options or comment: installing twice
 * leaves one line. A last line without a newline is ended first, so it is never joined to ours.
 * Sets *added to 1 when it wrote, 0 when the key was there. Returns 0, GS_E_IO (the local .pub
 * cannot be read), GS_E_REMOTE (the server's file could not be changed) or a connection error. */
int gs_auth_managed_key_install(struct gs_ssh *s, int *added, struct gs_error *err);

#endif
