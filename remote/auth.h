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
 * method that worked in *method. On failure returns GS_E_AUTH with a message listing what the
 * server accepts and what was tried, and, for an RSA-only setup, why it cannot work and what to do.
 */
int gs_auth_login(struct gs_ssh *s, const struct gs_target *t, const struct gs_ssh_opts *opts,
                  char **method, struct gs_error *err);

#endif
