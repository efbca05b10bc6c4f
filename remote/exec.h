/* remote/exec.h: running a command on the server through an exec channel.
 *
 * The command string is passed to the user's login shell by sshd, so callers build it with
 * gs_shell_quote. Output streams stay separate (stdout, stderr). The result is the command's exit
 * status, or 128+N when it died of signal N, as a local shell reports it.
 *
 * The login shell runs its rc files first, and on rented servers those often print (a banner,
 * nvidia-smi, conda's messages) even when no one is at a terminal. That text would arrive ahead of
 * the command's own output and break any protocol spoken over it, so every command is started
 * behind a marker it prints first on stdout and on stderr: what comes before the marker is the
 * shell's noise (kept for `doctor` and for error messages, see gs_ssh_shell_noise), what comes
 * after is the command's. Readers of a channel from gs_exec_open read it through gs_exec_read. */
#ifndef GS_EXEC_H
#define GS_EXEC_H

#include <libssh2.h>
#include <signal.h>
#include <stddef.h>

#include "common/buf.h"
#include "common/error.h"
#include "remote/ssh.h"

/* Where the bytes of one run go: to a file descriptor (>= 0), into a buffer, or nowhere. */
struct gs_exec_io {
    const void *stdin_data; /* sent, then EOF; NULL: EOF at once unless stdin_fd >= 0 */
    size_t stdin_len;
    int stdin_fd;  /* read to EOF and sent; -1: none */
    int stdout_fd; /* -1: not written to an fd */
    int stderr_fd;
    struct gs_buf *stdout_buf; /* NULL: not captured */
    struct gs_buf *stderr_buf;
    int timeout_ms; /* 0: none (the keepalive still detects a dead link) */
    /* When set: a signal number the caller's handler stores there (SIGINT for a Ctrl-C) is passed
     * on to the command's process group on the server (exec.c, pass_signal_on), and the slot
     * cleared. The command then runs with GPUSYNC_EXEC=<random tag> in its environment. */
    volatile sig_atomic_t *pass_signal;
    /* With pass_signal, may be NULL: told after each signal passed on how many process groups
     * took it (0: no process of the command was found, so nothing received it). */
    void (*signal_passed)(void *ctx, int sig, int groups);
    void *signal_ctx;
    /* With pass_signal: how long to wait for the command's end once a SIGKILL was passed on
     * (whether or not it found anything); then gs_exec_run gives up. 0: as long as it takes. */
    int kill_wait_ms;
};

#define GS_EXEC_IO_INIT                                                                            \
    {                                                                                              \
        NULL, 0, -1, -1, -1, NULL, NULL, 0, NULL, NULL, NULL, 0                                    \
    }

/* Runs `command` and streams its output as `io` says. Returns the exit status (0-255 or 128+signal)
 * or a negative GS_E_* code when the channel failed (GS_E_DISCONNECTED if the server went away:
 * the remote command's fate is then unknown), or GS_E_INTERRUPTED when it did not end within
 * io->kill_wait_ms of a SIGKILL passed on (it may still run; its channel is dropped). */
int gs_exec_run(struct gs_ssh *s, const char *command, const struct gs_exec_io *io,
                struct gs_error *err);

/* A shell snippet for a probe: prints "path_broken=$PATH" on a line of its own when the login
 * shell finds no `mkdir` (a startup file set PATH without /usr/bin and /bin: nothing gpusync runs
 * there can work, and the errors it causes would otherwise read as something else). */
#define GS_EXEC_PATH_PROBE "command -v mkdir >/dev/null 2>&1 || echo \"path_broken=$PATH\"; "

/* When `out` (a probe's output) holds GS_EXEC_PATH_PROBE's line: sets err to a remote error naming
 * the PATH and returns GS_E_REMOTE. Returns 0 when it does not. */
int gs_exec_path_broken(struct gs_ssh *s, const char *out, struct gs_error *err);

/* Convenience: runs `command`, capturing stdout into `out` (stderr into `errout` if not NULL). */
int gs_exec_capture(struct gs_ssh *s, const char *command, struct gs_buf *out,
                    struct gs_buf *errout, struct gs_error *err);

/* What one channel's reader knows about the marker: whether it has passed on each stream, and the
 * noise seen before it (both streams, in arrival order, at most GS_SSH_NOISE_MAX bytes). */
struct gs_exec_gate {
    struct gs_ssh *s; /* its noise is copied there as it arrives */
    int passed[2];    /* the marker has been read on stdout (0) / stderr (1) */
    size_t matched[2];
    char noise[GS_SSH_NOISE_MAX + 1];
    size_t noise_len;
};

void gs_exec_gate_init(struct gs_exec_gate *g, struct gs_ssh *s);

/* libssh2_channel_read_ex for a channel from gs_exec_open: returns only the command's bytes (the
 * shell's noise and the marker are consumed here), LIBSSH2_ERROR_EAGAIN when nothing of the
 * command's is available yet, 0 at the end of the stream (libssh2_channel_eof tells which), or a
 * libssh2 error. A stream that ends before its marker came had no command output (the shell
 * failed to start the command); its bytes are in g->noise. */
ssize_t gs_exec_read(LIBSSH2_CHANNEL *ch, struct gs_exec_gate *g, int stream, char *buf,
                     size_t len);

/* Appends ", and the server's shell printed: «…»" to `err`'s message when the gate saw noise: for
 * errors that the noise may explain (a command that never started). */
void gs_exec_blame_noise(const struct gs_exec_gate *g, struct gs_error *err);

/* Opens an exec channel for `command` and leaves it open for the caller to stream over (the agent
 * client does this). Returns the channel or NULL with err set. Free with gs_exec_close. */
LIBSSH2_CHANNEL *gs_exec_open(struct gs_ssh *s, const char *command, struct gs_error *err);

/* Opens a channel to the UNIX socket `path` on the server ("direct-streamlocal@openssh.com", which
 * OpenSSH allows unless AllowStreamLocalForwarding or DisableForwarding says otherwise): a byte
 * stream to whatever listens there, with no shell and no marker, read with plain
 * libssh2_channel_read. Waits one round trip for the server's answer. Returns the channel, or NULL
 * with err set (GS_E_REMOTE when the server refused it: nothing listens there, or forwarding is
 * off). Free with libssh2_channel_free, or gs_exec_abandon once its answers are in. */
LIBSSH2_CHANNEL *gs_exec_open_socket(struct gs_ssh *s, const char *path, struct gs_error *err);

/* Whether the server opens a channel to `path` now: the channel is closed at once (a resident
 * listener's child for it ends without an OPEN). Returns 1 when it opened, 0 when the server
 * refused it (err says why), or a negative code when the connection failed. */
int gs_exec_socket_opens(struct gs_ssh *s, const char *path, struct gs_error *err);

/* An exec request whose answer has not come yet (gs_exec_start). */
struct gs_exec_pending {
    struct gs_buf request; /* the command as sent: libssh2 wants it again to collect the answer */
    int answered;
};

/* As gs_exec_open, without waiting for the server's answer to the exec request: the caller may
 * write to the channel at once (the server reads it once the command runs), saving a round trip,
 * and must call gs_exec_answered from its I/O loop until it returns 1. Returns the channel, or
 * NULL with err set (then `p` holds nothing). */
LIBSSH2_CHANNEL *gs_exec_start(struct gs_ssh *s, const char *command, struct gs_exec_pending *p,
                               struct gs_error *err);

/* Collects the answer to gs_exec_start's request without blocking: 1 once the server has
 * accepted it (p is released), 0 while it has not answered, or a negative code with err set when
 * it refused to run the command or the connection failed. */
int gs_exec_answered(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, struct gs_exec_pending *p,
                     struct gs_error *err);

/* Sends EOF, waits for the close and returns the exit status as gs_exec_run does; frees `ch`. */
int gs_exec_close(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, struct gs_error *err);

/* Sends EOF on `ch` and leaves it to the session, which frees it in gs_ssh_free, instead of waiting
 * a round trip for an exit status nobody reads: for a command whose answers have all arrived. */
void gs_exec_abandon(struct gs_ssh *s, LIBSSH2_CHANNEL *ch);

#endif
