/* remote/ssh.h: one SSH connection to a server, through libssh2 1.10 in non-blocking mode.
 *
 * gs_ssh_connect resolves the target (an ~/.ssh/config alias is honoured through `ssh -G`),
 * connects with a timeout, verifies the host key against known_hosts (remote/hostkey.c) and
 * authenticates (remote/auth.c). Every later libssh2 call on the session is retried through
 * gs_ssh_wait, which also runs our own keepalive: libssh2 1.10's keepalive cannot tell a dead link
 * from a quiet one, so we record when bytes last arrived (a recv callback) and declare the
 * connection dead when a keepalive goes unanswered for `dead_after_ms`. */
#ifndef GS_SSH_H
#define GS_SSH_H

#include <libssh2.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Asks the user a yes/no question; returns 1 for yes. NULL callback: no one to ask. */
typedef int (*gs_ssh_confirm_fn)(void *ctx, const char *question);
/* Asks for a secret (password, passphrase) without echo; returns a malloc'd string or NULL. */
typedef char *(*gs_ssh_secret_fn)(void *ctx, const char *prompt);
/* Tells the user what a long wait is waiting for (one line, no newline). */
typedef void (*gs_ssh_notice_fn)(void *ctx, const char *message);

/* Called by gs_ssh_wait about every GS_SSH_WAITING_EVERY_MS while a call waits on the server, so
 * a single-threaded caller (the watch daemon) answers its own clients meanwhile. A nonzero return
 * abandons the wait: the call fails with GS_E_INTERRUPTED, and the session must be freed, since a
 * request may be half sent. */
typedef int (*gs_ssh_waiting_fn)(void *ctx);
#define GS_SSH_WAITING_EVERY_MS 100

struct gs_ssh_opts {
    const char *host;        /* name, address or ~/.ssh/config alias */
    int port;                /* 0: from ssh -G, else 22 */
    const char *user;        /* NULL: from ssh -G, else $USER */
    const char *identity;    /* an identity file to try before the defaults; may be NULL */
    const char *password;    /* GPUSYNC_PASSWORD or --password-stdin; may be NULL */
    const char *known_hosts; /* NULL: the files OpenSSH reads (ssh -G); else only this one */
    int accept_new_host_key; /* record an unknown host key without asking */
    int installing_key;      /* the login is for installing a key (init --install-key, hosts
                              * add): auth's advice must not point back to that */
    int connect_timeout_ms;  /* 0: 10 s */
    int keepalive_ms;        /* 0: 5 s */
    int dead_after_ms;       /* 0: 15 s without any byte from the server while waiting */
    gs_ssh_confirm_fn confirm;
    gs_ssh_secret_fn ask_secret;
    gs_ssh_notice_fn notice; /* NULL: long waits are logged at info level */
    void *prompt_ctx;
    /* Also while connecting (TCP, handshake, login), from the connecting thread: a daemon that is
     * told to stop abandons a login to an unreachable server instead of waiting it out. */
    gs_ssh_waiting_fn waiting;
    void *waiting_ctx;
};

struct gs_ssh;

/* Connects, verifies the host key and authenticates. On success stores a new session in *out (free
 * it with gs_ssh_free) and returns 0. On failure returns GS_E_CONNECT, GS_E_TIMEOUT,
 * GS_E_HOSTKEY_UNKNOWN, GS_E_HOSTKEY_CHANGED or GS_E_AUTH with a message that says what to do, and
 * *out is NULL. */
int gs_ssh_connect(struct gs_ssh **out, const struct gs_ssh_opts *opts, struct gs_error *err);

/* Disconnects and frees everything. NULL is a no-op. */
void gs_ssh_free(struct gs_ssh *s);

/* Changes keepalive_ms and dead_after_ms of a connected session (0: the defaults), for a caller
 * that tolerates a slow login but must notice a dead link quickly afterwards. */
void gs_ssh_set_liveness(struct gs_ssh *s, int keepalive_ms, int dead_after_ms);

LIBSSH2_SESSION *gs_ssh_session(struct gs_ssh *s);
int gs_ssh_fd(struct gs_ssh *s);

/* "user@host:port" as connected (the resolved host name), for messages. */
const char *gs_ssh_target(struct gs_ssh *s);
/* How authentication succeeded, e.g. "publickey (~/.ssh/id_ed25519)" or "password". */
const char *gs_ssh_auth_method(struct gs_ssh *s);
/* Called by remote/exec.c with 1 when it starts a command and with 0 when the command's shell has
 * started it (or ended): a wait of more than 2 s in between is reported once, through opts.notice,
 * as a wait for the server's login shell, whose rc files can take that long (conda, pyenv). */
void gs_ssh_shell_starting(struct gs_ssh *s, int starting);

/* What the server's login shell printed before the last command started (a banner or nvidia-smi in
 * .bashrc; remote/exec.h separates it from the command's output), or "" when it printed nothing.
 * At most GS_SSH_NOISE_MAX bytes are kept. */
#define GS_SSH_NOISE_MAX 1024
const char *gs_ssh_shell_noise(struct gs_ssh *s);
void gs_ssh_set_shell_noise(struct gs_ssh *s, const char *noise, size_t len);

/* The host key fingerprint as OpenSSH prints it ("SHA256:..."). */
const char *gs_ssh_fingerprint(struct gs_ssh *s);

/* How long the SSH handshake (banners and key exchange: about three round trips) took, in ms. */
int64_t gs_ssh_handshake_ms(const struct gs_ssh *s);

/* Waits until the socket is ready in the directions libssh2 is blocked on, or `deadline_ms`
 * (gs_clock_mono_ms; 0 = no deadline) passes. Sends keepalives while it waits. Returns 0 when the
 * caller should retry its libssh2 call, GS_E_TIMEOUT at the deadline, GS_E_DISCONNECTED when the
 * server stopped answering, GS_E_INTERRUPTED when the waiting callback (below) said so. */
int gs_ssh_wait(struct gs_ssh *s, int64_t deadline_ms, struct gs_error *err);

/* As gs_ssh_wait, and returns 0 also when `fd` (if >= 0) is readable or at its end: for a loop
 * that forwards a local input (a pipe into `gpusync exec`) and must not block reading it. */
int gs_ssh_wait_or_fd(struct gs_ssh *s, int64_t deadline_ms, int fd, struct gs_error *err);

/* Sets (or, with NULL, clears) the waiting callback. */
void gs_ssh_set_waiting(struct gs_ssh *s, gs_ssh_waiting_fn fn, void *ctx);

/* Turns a failed libssh2 return code into a gs_error naming `what` and libssh2's own message.
 * Returns GS_E_DISCONNECTED for socket errors, GS_E_REMOTE otherwise. */
int gs_ssh_error(struct gs_ssh *s, int rc, const char *what, struct gs_error *err);

/* Measures one round trip (opening and closing a session channel). Returns 0 and the time in
 * microseconds, or a negative code. */
int gs_ssh_ping(struct gs_ssh *s, int64_t *rtt_us, struct gs_error *err);

/* Retries `expr` (a libssh2 call returning int or a pointer) while it would block. Used as
 *   GS_SSH_RETRY(s, rc, libssh2_channel_exec(ch, cmd), deadline, err);
 * after which `rc` holds the final result, or a negative GS_E_* code from gs_ssh_wait. */
#define GS_SSH_RETRY(s, rc, expr, deadline, err)                                                   \
    do {                                                                                           \
        while (((rc) = (expr)) == LIBSSH2_ERROR_EAGAIN) {                                          \
            int gs_wait_rc_ = gs_ssh_wait((s), (deadline), (err));                                 \
            if (gs_wait_rc_ < 0) {                                                                 \
                (rc) = gs_wait_rc_;                                                                \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* As GS_SSH_RETRY, for calls that return a pointer and signal EAGAIN through last_errno. */
#define GS_SSH_RETRY_PTR(s, ptr, expr, deadline, err, rc)                                          \
    do {                                                                                           \
        (rc) = 0;                                                                                  \
        while (!((ptr) = (expr)) &&                                                                \
               libssh2_session_last_errno(gs_ssh_session(s)) == LIBSSH2_ERROR_EAGAIN) {            \
            (rc) = gs_ssh_wait((s), (deadline), (err));                                            \
            if ((rc) < 0)                                                                          \
                break;                                                                             \
        }                                                                                          \
    } while (0)

#endif
