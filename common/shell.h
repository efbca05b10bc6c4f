/* common/shell.h: POSIX shell quoting for arguments sent to a remote shell.
 *
 * Every argument that crosses SSH in a command line goes through here: OpenSSH runs commands with
 * the user's login shell, so unquoted names with spaces, `$`, `;` or newlines would be
 * reinterpreted. */
#ifndef GS_SHELL_H
#define GS_SHELL_H

#include "common/buf.h"

/* Appends `arg` single-quoted (each ' becomes '\''), so any byte string round-trips through sh. */
void gs_shell_quote(struct gs_buf *out, const char *arg);

/* Appends argv[0..argc) quoted and separated by spaces. */
void gs_shell_quote_argv(struct gs_buf *out, int argc, char *const argv[]);

#endif
