/* remote/ssh.c: connecting, waiting and keepalive for one libssh2 session (see ssh.h). */
#include "remote/ssh.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/wrapper.h"
#include "remote/auth.h"
#include "remote/hostkey.h"
#include "remote/target.h"

struct gs_ssh {
    LIBSSH2_SESSION *session;
    int fd;
    char target[512];
    char fingerprint[64];
    char *auth_method;
    int keepalive_ms;
    int dead_after_ms;
    int64_t last_recv_ms;                   /* when the server last sent us anything */
    int64_t last_keepalive_ms;              /* when we last asked it to answer */
    int64_t handshake_ms;                   /* how long the SSH handshake took */
    char shell_noise[GS_SSH_NOISE_MAX + 1]; /* what the login shell printed before a command */
    int64_t shell_wait_since; /* a command was started and its shell has not run it yet; or 0 */
    int shell_wait_told;      /* the user has been told about that wait */
    gs_ssh_notice_fn notice;
    void *notice_ctx;
    gs_ssh_waiting_fn waiting; /* see gs_ssh_set_waiting */
    void *waiting_ctx;
};

/* libssh2 reads the socket through this, so we know when the server last said anything. */
static ssize_t recv_hook(libssh2_socket_t fd, void *buf, size_t len, int flags, void **abstract)
{
    struct gs_ssh *s = *abstract;
    ssize_t n = recv(fd, buf, len, flags);
    if (n > 0)
        s->last_recv_ms = gs_clock_mono_ms();
    else if (n < 0)
        return -errno; /* libssh2 expects a negated errno */
    return n;
}

static void set_socket_options(int fd)
{
    int one = 1;
    /* Interactive traffic: a save must not wait for Nagle's algorithm. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

/* Waits until `fd` is writable (connected or failed), the deadline passes (0, errno ETIMEDOUT),
 * or the waiting callback gives up (0, errno EINTR). Returns poll's result. */
static int await_connect(struct gs_ssh *s, int fd, int64_t deadline)
{
    for (;;) {
        if (s->waiting && s->waiting(s->waiting_ctx)) {
            errno = EINTR;
            return 0;
        }
        int64_t left = deadline - gs_clock_mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return 0;
        }
        if (s->waiting && left > GS_SSH_WAITING_EVERY_MS)
            left = GS_SSH_WAITING_EVERY_MS;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int ready = poll(&p, 1, (int)left);
        if (ready != 0 && !(ready < 0 && errno == EINTR))
            return ready;
    }
}

/* Non-blocking connect to one address, bounded by the deadline. Returns the fd or -1 (errno set).
 */
static int connect_one(struct gs_ssh *s, const struct addrinfo *ai, int64_t deadline)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0)
        return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS)
        goto fail;
    int ready = await_connect(s, fd, deadline);
    if (ready <= 0)
        goto fail;
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr == 0)
        return fd;
    errno = soerr;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static int open_socket(struct gs_ssh *s, const char *host, int port, int timeout_ms,
                       struct gs_error *err)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0)
        return gs_error_set(err, GS_E_CONNECT, "cannot resolve host '%s': %s", host,
                            gai_strerror(gai));
    int64_t deadline = gs_clock_mono_ms() + timeout_ms;
    int fd = -1;
    int saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0 && saved != EINTR; ai = ai->ai_next) {
        fd = connect_one(s, ai, deadline);
        saved = fd < 0 ? errno : 0;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        set_socket_options(fd);
        return fd;
    }
    errno = saved;
    if (saved == EINTR)
        return gs_error_set(err, GS_E_INTERRUPTED, "connecting to %s port %d: interrupted", host,
                            port);
    return gs_error_errno(err, saved == ETIMEDOUT ? GS_E_TIMEOUT : GS_E_CONNECT,
                          "cannot connect to %s port %d", host, port);
}

void gs_ssh_set_liveness(struct gs_ssh *s, int keepalive_ms, int dead_after_ms)
{
    s->keepalive_ms = keepalive_ms > 0 ? keepalive_ms : 5000;
    s->dead_after_ms = dead_after_ms > 0 ? dead_after_ms : 15000;
}

static struct gs_ssh *ssh_new(const struct gs_ssh_opts *opts)
{
    struct gs_ssh *s = gs_xcalloc(1, sizeof(*s));
    s->fd = -1;
    gs_ssh_set_liveness(s, opts->keepalive_ms, opts->dead_after_ms);
    s->notice = opts->notice;
    s->notice_ctx = opts->prompt_ctx;
    s->waiting = opts->waiting;
    s->waiting_ctx = opts->waiting_ctx;
    s->session = libssh2_session_init_ex(NULL, NULL, NULL, s);
    if (!s->session) {
        free(s);
        return NULL;
    }
    libssh2_session_callback_set(s->session, LIBSSH2_CALLBACK_RECV, (void *)recv_hook);
    libssh2_session_set_blocking(s->session, 0);
    return s;
}

static int handshake(struct gs_ssh *s, int timeout_ms, struct gs_error *err)
{
    int rc;
    int64_t start = s->last_recv_ms = gs_clock_mono_ms();
    GS_SSH_RETRY(s, rc, libssh2_session_handshake(s->session, s->fd),
                 gs_clock_mono_ms() + timeout_ms, err);
    s->handshake_ms = gs_clock_mono_ms() - start;
    if (rc == GS_E_TIMEOUT)
        return gs_error_set(err, GS_E_TIMEOUT, "%s: no SSH handshake within %d ms", s->target,
                            timeout_ms);
    if (rc < 0 && !GS_IS_ERROR(rc)) /* a libssh2 error, not one of ours from the wait */
        return gs_ssh_error(s, rc, "SSH handshake", err);
    return rc;
}

static int establish(struct gs_ssh *s, const struct gs_target *t, const struct gs_ssh_opts *opts,
                     struct gs_error *err)
{
    int timeout = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
    snprintf(s->target, sizeof(s->target), "%s@%s:%d", t->user, t->hostname, t->port);
    const char *user_files[1] = {opts->known_hosts};
    struct gs_hostkey_policy policy = {.user_files = (const char *const *)t->user_known_hosts,
                                       .n_user_files = t->n_user_known_hosts,
                                       .global_files = (const char *const *)t->global_known_hosts,
                                       .n_global_files = t->n_global_known_hosts,
                                       .accept_new = opts->accept_new_host_key,
                                       .confirm = opts->confirm,
                                       .prompt_ctx = opts->prompt_ctx};
    if (opts->known_hosts) { /* an explicit file replaces the user's */
        policy.user_files = user_files;
        policy.n_user_files = 1;
    }
    gs_hostkey_prefer_known_type(s->session, &policy, t->hostname, t->port);
    s->fd = open_socket(s, t->hostname, t->port, timeout, err);
    if (s->fd < 0)
        return s->fd;
    int rc = handshake(s, timeout, err);
    if (rc == 0)
        rc = gs_hostkey_verify(s->session, &policy, t->hostname, t->port, s->fingerprint, err);
    if (rc == 0)
        rc = gs_auth_login(s, t, opts, &s->auth_method, err);
    return rc;
}

int gs_ssh_connect(struct gs_ssh **out, const struct gs_ssh_opts *opts, struct gs_error *err)
{
    *out = NULL;
    struct gs_target t;
    int rc = gs_target_resolve(&t, opts->host, opts->port, opts->user, err);
    if (rc < 0)
        return rc;
    struct gs_ssh *s = ssh_new(opts);
    rc = establish(s, &t, opts, err);
    gs_target_release(&t);
    if (rc < 0) {
        gs_ssh_free(s);
        return rc;
    }
    gs_debug("connected to %s (%s)", s->target, s->auth_method);
    *out = s;
    return 0;
}

void gs_ssh_free(struct gs_ssh *s)
{
    if (!s)
        return;
    if (s->session) {
        /* In non-blocking mode libssh2_session_free may answer EAGAIN and free nothing; blocking
         * with a short timeout makes teardown complete, and a dead link cannot stall it. */
        libssh2_session_set_blocking(s->session, 1);
        libssh2_session_set_timeout(s->session, 200);
        libssh2_session_disconnect(s->session, "gpusync done");
        /* Channels left open (gs_exec_abandon) would each wait for the server's close: with
         * the socket shut, their teardown sees a closed connection and ends at once. */
        if (s->fd >= 0)
            shutdown(s->fd, SHUT_RDWR);
        while (libssh2_session_free(s->session) == LIBSSH2_ERROR_EAGAIN)
            ;
    }
    if (s->fd >= 0)
        close(s->fd);
    free(s->auth_method);
    free(s);
}

LIBSSH2_SESSION *gs_ssh_session(struct gs_ssh *s)
{
    return s->session;
}

int gs_ssh_fd(struct gs_ssh *s)
{
    return s->fd;
}

const char *gs_ssh_target(struct gs_ssh *s)
{
    return s->target;
}

const char *gs_ssh_auth_method(struct gs_ssh *s)
{
    return s->auth_method ? s->auth_method : "none";
}

void gs_ssh_shell_starting(struct gs_ssh *s, int starting)
{
    if (!starting)
        s->shell_wait_since = 0;
    else if (!s->shell_wait_since)
        s->shell_wait_since = gs_clock_mono_ms();
}

/* After SHELL_GIVE_UP_MS the wait for a shell to start a command is an error: a startup file
 * that waits for something (a mount, a license server), or that reads standard input and so took
 * the start of what was sent to the command, never lets it run; conda and pyenv take seconds. */
#define SHELL_GIVE_UP_MS 30000
static int shell_stuck(struct gs_ssh *s, int64_t now, struct gs_error *err)
{
    return gs_error_set(
        err, GS_E_REMOTE,
        "the login shell on %s has not started the command in %.0f s: a startup file "
        "(~/.bashrc, ~/.profile, /etc/profile.d) is stuck, or reads standard input (a `read` or "
        "`cat` outside its interactive-only part) and took what gpusync sent; `gpusync doctor` "
        "checks them",
        s->target, (double)(now - s->shell_wait_since) / 1000.0);
}

/* After SHELL_NOTICE_MS of waiting for a shell to start a command, says so, once per session. */
#define SHELL_NOTICE_MS 2000
static void tell_shell_wait(struct gs_ssh *s, int64_t now)
{
    if (!s->shell_wait_since || s->shell_wait_told || now - s->shell_wait_since < SHELL_NOTICE_MS)
        return;
    s->shell_wait_told = 1;
    char message[700];
    snprintf(message, sizeof(message),
             "waiting for the login shell on %s to start (%.0f s so far): its startup files "
             "(~/.bashrc, conda, pyenv) are slow or stuck",
             s->target, (double)(now - s->shell_wait_since) / 1000.0);
    if (s->notice)
        s->notice(s->notice_ctx, message);
    else
        gs_info("%s", message);
}

void gs_ssh_set_shell_noise(struct gs_ssh *s, const char *noise, size_t len)
{
    if (len > GS_SSH_NOISE_MAX)
        len = GS_SSH_NOISE_MAX;
    memcpy(s->shell_noise, noise, len);
    s->shell_noise[len] = '\0';
}

const char *gs_ssh_shell_noise(struct gs_ssh *s)
{
    return s->shell_noise;
}

int64_t gs_ssh_handshake_ms(const struct gs_ssh *s)
{
    return s->handshake_ms;
}

const char *gs_ssh_fingerprint(struct gs_ssh *s)
{
    return s->fingerprint;
}

int gs_ssh_error(struct gs_ssh *s, int rc, const char *what, struct gs_error *err)
{
    char *msg = NULL;
    libssh2_session_last_error(s->session, &msg, NULL, 0);
    int code = (rc == LIBSSH2_ERROR_SOCKET_DISCONNECT || rc == LIBSSH2_ERROR_SOCKET_RECV ||
                rc == LIBSSH2_ERROR_SOCKET_SEND || rc == LIBSSH2_ERROR_SOCKET_TIMEOUT ||
                rc == LIBSSH2_ERROR_BANNER_RECV || rc == LIBSSH2_ERROR_KEX_FAILURE)
                   ? GS_E_DISCONNECTED
                   : GS_E_REMOTE;
    if (code == GS_E_DISCONNECTED)
        return gs_error_set(err, code, "%s: connection to %s lost (%s)", what, s->target,
                            msg ? msg : "socket error");
    return gs_error_set(err, code, "%s on %s failed: %s (libssh2 error %d)", what, s->target,
                        msg && *msg ? msg : "unknown error", rc);
}

/* Dead: the server has said nothing for dead_after_ms although we asked it to (a keepalive) or
 * although we have data it will not take (outbound blocked). */
static int link_dead(struct gs_ssh *s, int64_t now, int outbound_blocked)
{
    int64_t quiet = now - s->last_recv_ms;
    return quiet >= s->dead_after_ms &&
           (s->last_keepalive_ms > s->last_recv_ms || outbound_blocked);
}

/* Runs the keepalive timer once, between gs_ssh_wait's polls. Returns 0 or
 * GS_E_DISCONNECTED. */
static int ssh_tick(struct gs_ssh *s, struct gs_error *err)
{
    int64_t now = gs_clock_mono_ms();
    int outbound = libssh2_session_block_directions(s->session) & LIBSSH2_SESSION_BLOCK_OUTBOUND;
    if (link_dead(s, now, outbound))
        return gs_error_set(err, GS_E_DISCONNECTED, "connection to %s lost: no answer for %lld ms",
                            s->target, (long long)(now - s->last_recv_ms));
    /* Never while a packet is half sent: libssh2 1.10 must finish that one first. */
    if (!outbound && now - s->last_recv_ms >= s->keepalive_ms &&
        now - s->last_keepalive_ms >= s->keepalive_ms) {
        int next = 0;
        /* want_reply=1: the server must answer (with a failure), which the recv hook sees. */
        libssh2_keepalive_config(s->session, 1, 1);
        libssh2_keepalive_send(s->session, &next);
        s->last_keepalive_ms = now;
    }
    return 0;
}

static short poll_events(struct gs_ssh *s)
{
    int dir = libssh2_session_block_directions(s->session);
    short ev = 0;
    if (dir & LIBSSH2_SESSION_BLOCK_INBOUND)
        ev |= POLLIN;
    if (dir & LIBSSH2_SESSION_BLOCK_OUTBOUND)
        ev |= POLLOUT;
    return ev ? ev : POLLIN;
}

void gs_ssh_set_waiting(struct gs_ssh *s, gs_ssh_waiting_fn fn, void *ctx)
{
    s->waiting = fn;
    s->waiting_ctx = ctx;
}

int gs_ssh_wait(struct gs_ssh *s, int64_t deadline_ms, struct gs_error *err)
{
    return gs_ssh_wait_or_fd(s, deadline_ms, -1, err);
}

int gs_ssh_wait_or_fd(struct gs_ssh *s, int64_t deadline_ms, int fd, struct gs_error *err)
{
    for (;;) {
        if (s->waiting && s->waiting(s->waiting_ctx))
            return gs_error_set(err, GS_E_INTERRUPTED, "%s: interrupted", s->target);
        int64_t now = gs_clock_mono_ms();
        if (deadline_ms && now >= deadline_ms)
            return gs_error_set(err, GS_E_TIMEOUT, "%s: timed out", s->target);
        int64_t wait = s->keepalive_ms / 2;
        if (s->waiting && wait > GS_SSH_WAITING_EVERY_MS)
            wait = GS_SSH_WAITING_EVERY_MS;
        if (deadline_ms && deadline_ms - now < wait)
            wait = deadline_ms - now;
        int64_t notice_at = s->shell_wait_since + SHELL_NOTICE_MS;
        if (s->shell_wait_since && !s->shell_wait_told && notice_at - now < wait)
            wait = notice_at > now ? notice_at - now : 0;
        if (s->shell_wait_since && now - s->shell_wait_since >= SHELL_GIVE_UP_MS)
            return shell_stuck(s, now, err);
        if (s->shell_wait_since && s->shell_wait_since + SHELL_GIVE_UP_MS - now < wait)
            wait = s->shell_wait_since + SHELL_GIVE_UP_MS - now;
        struct pollfd p[2] = {{.fd = s->fd, .events = poll_events(s)},
                              {.fd = fd, .events = POLLIN}};
        int ready = poll(p, fd >= 0 ? 2 : 1, (int)wait);
        if (ready < 0 && errno != EINTR)
            return gs_error_errno(err, GS_E_DISCONNECTED, "%s: poll", s->target);
        tell_shell_wait(s, gs_clock_mono_ms());
        if (ready != 0)
            return 0; /* ready, or a signal: let the caller retry its call */
        int rc = ssh_tick(s, err);
        if (rc < 0)
            return rc;
    }
}

int gs_ssh_ping(struct gs_ssh *s, int64_t *rtt_us, struct gs_error *err)
{
    int64_t start = gs_clock_mono_us();
    int64_t deadline = gs_clock_mono_ms() + s->dead_after_ms;
    LIBSSH2_CHANNEL *ch;
    int rc;
    GS_SSH_RETRY_PTR(s, ch, libssh2_channel_open_session(s->session), deadline, err, rc);
    if (rc < 0)
        return rc;
    if (!ch)
        return gs_ssh_error(s, libssh2_session_last_errno(s->session), "opening a channel", err);
    *rtt_us = gs_clock_mono_us() - start;
    GS_SSH_RETRY(s, rc, libssh2_channel_close(ch), deadline, err);
    GS_SSH_RETRY(s, rc, libssh2_channel_free(ch), deadline, err);
    return 0;
}
