/* syncd/relay.c: a warm spare connection, and workers that run client commands on it (see
 * relay.h). */
#include "syncd/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/wrapper.h"
#include "remote/exec.h"
#include "syncd/control.h"

#define SPARE_RETRY_FIRST_MS 1000
#define SPARE_RETRY_MAX_MS   30000
#define SPARE_CHECK_MS       60000 /* an idle spare is checked this often (a NAT may drop it) */
#define SPARES               2 /* kept ready: a second request soon after one finds a spare too */

/* What the spare's channel runs ahead of need: the server's login shell (and whatever its rc
 * files do: 100+ ms with pyenv or conda there) starts now, then waits for a command on stdin,
 * ending at EOF, and hands it to /bin/sh. A request then costs one round trip, not a channel
 * open, an exec and a shell start. */
#define PRESTART_COMMAND "exec /bin/sh -c \"$(cat)\""

struct gs_relay {
    const struct gs_ssh_opts *opts;
    struct gs_ssh_opts spare_opts; /* opts, with a login that gs_relay_stop abandons */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    struct spare {
        struct gs_ssh *ssh;        /* connected and unused */
        LIBSSH2_CHANNEL *prestart; /* its waiting shell (PRESTART_COMMAND), or NULL */
    } spares[SPARES];
    int n_spares;
    long relayed; /* commands handed to workers so far */
    int recheck;  /* gs_relay_recheck: check the spares now, connect without backoff */
    int stop;
};

struct job {
    const struct gs_ssh_opts *opts;
    struct gs_ssh *ssh;        /* the spare, or NULL: connect first */
    LIBSSH2_CHANNEL *prestart; /* its waiting shell, or NULL */
    struct gs_exec_gate gate;  /* for the command's channel: nothing of it has been read yet */
    int fd;
    char *command;
};

/* Commands running for clients now, in every relay of the process: each holds a thread and an
 * SSH session, so a client that floods exec requests is told to wait instead. */
static _Atomic int workers_running;

/* ---- the spare ---- */

/* Waits until a spare is taken (or the relay stops), up to `ms`. Lock held. */
static void wait_for_need(struct gs_relay *r, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&r->wake, &r->lock, &until);
}

/* Checks the idle spares with a round trip each, taking them out meanwhile (a request that comes
 * then connects anew). Lock held on entry and exit. */
static void check_spares(struct gs_relay *r)
{
    struct spare idle[SPARES];
    int n = r->n_spares;
    memcpy(idle, r->spares, sizeof(idle));
    r->n_spares = 0;
    pthread_mutex_unlock(&r->lock);
    int alive[SPARES] = {0};
    for (int i = 0; i < n; i++) {
        int64_t rtt;
        alive[i] = gs_ssh_ping(idle[i].ssh, &rtt, NULL) == 0 && idle[i].prestart &&
                   !libssh2_channel_eof(idle[i].prestart);
        if (!alive[i]) {
            gs_debug("a spare connection died; connecting another");
            gs_ssh_free(idle[i].ssh); /* frees its channel too */
        }
    }
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < n; i++)
        if (alive[i] && r->n_spares < SPARES)
            r->spares[r->n_spares++] = idle[i];
        else if (alive[i])
            gs_ssh_free(idle[i].ssh);
}

/* Keeps SPARES connected spares, reconnecting with capped backoff while the server is
 * unreachable. */
static void *spare_main(void *arg)
{
    struct gs_relay *r = arg;
    int backoff = SPARE_RETRY_FIRST_MS;
    int64_t checked_ms = gs_clock_mono_ms();
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        if (r->recheck) {
            r->recheck = 0;
            backoff = SPARE_RETRY_FIRST_MS;
            if (r->n_spares)
                check_spares(r);
            checked_ms = gs_clock_mono_ms();
            continue;
        }
        if (r->n_spares == SPARES) {
            wait_for_need(r, SPARE_CHECK_MS);
            if (r->n_spares && !r->stop && gs_clock_mono_ms() - checked_ms >= SPARE_CHECK_MS) {
                check_spares(r);
                checked_ms = gs_clock_mono_ms();
            }
            continue;
        }
        pthread_mutex_unlock(&r->lock);
        struct gs_ssh *s = NULL;
        struct gs_error err = {0};
        int rc = gs_ssh_connect(&s, &r->spare_opts, &err);
        LIBSSH2_CHANNEL *ch = rc == 0 ? gs_exec_open(s, PRESTART_COMMAND, &err) : NULL;
        if (ch)
            gs_ssh_shell_starting(s, 0); /* nobody waits for it: it starts ahead of need */
        if (s) /* a worker may use it after the relay is gone: no callback into it */
            gs_ssh_set_waiting(s, NULL, NULL);
        pthread_mutex_lock(&r->lock);
        if (rc == 0) {
            r->spares[r->n_spares++] = (struct spare){s, ch};
            backoff = SPARE_RETRY_FIRST_MS;
            continue;
        }
        gs_debug("spare connection: %s", err.msg);
        wait_for_need(r, backoff);
        backoff = backoff * 2 > SPARE_RETRY_MAX_MS ? SPARE_RETRY_MAX_MS : backoff * 2;
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* The spares' waiting callback: a stop ends a login to an unreachable server at once, instead of
 * keeping the daemon's exit waiting for its timeout. Read without the lock: a flag, set once. */
static int relay_stopping(void *ctx)
{
    struct gs_relay *r = ctx;
    return __atomic_load_n(&r->stop, __ATOMIC_RELAXED);
}

int gs_relay_start(struct gs_relay **out, const struct gs_ssh_opts *ssh, struct gs_error *err)
{
    struct gs_relay *r = gs_xcalloc(1, sizeof(*r));
    r->opts = ssh;
    r->spare_opts = *ssh;
    r->spare_opts.waiting = relay_stopping;
    r->spare_opts.waiting_ctx = r;
    libssh2_init(0); /* before any thread: libssh2_session_init would do it, racily */
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->wake, NULL);
    if (pthread_create(&r->thread, NULL, spare_main, r) != 0) {
        free(r);
        return gs_error_set(err, GS_E_NOMEM, "cannot start the spare-connection thread");
    }
    *out = r;
    return 0;
}

void gs_relay_stats(struct gs_relay *r, int *spare_ready, long *relayed)
{
    pthread_mutex_lock(&r->lock);
    *spare_ready = r->n_spares > 0;
    *relayed = r->relayed;
    pthread_mutex_unlock(&r->lock);
}

void gs_relay_recheck(struct gs_relay *r)
{
    pthread_mutex_lock(&r->lock);
    r->recheck = 1;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
}

void gs_relay_stop(struct gs_relay *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    for (int i = 0; i < r->n_spares; i++)
        gs_ssh_free(r->spares[i].ssh);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* ---- workers ---- */

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_frame(int fd, char kind, const char *data, size_t len)
{
    char head[32];
    int n = snprintf(head, sizeof(head), "%c %zu\n", kind, len);
    return send_all(fd, head, (size_t)n) < 0 || send_all(fd, data, len) < 0 ? -1 : 0;
}

static int send_header(int fd, const char *error)
{
    json_t *msg =
        error ? json_pack("{s:b,s:s}", "ok", 0, "error", error) : json_pack("{s:b}", "ok", 1);
    int rc = gs_control_send(fd, msg, NULL);
    json_decref(msg);
    return rc;
}

/* 1 when the client hung up (or sent something, which it never should mid-stream). */
static int client_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* Copies stdout and stderr to the client as frames until the command ends (1), the client leaves
 * (0) or the connection fails (<0). */
static int relay_output(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, struct gs_exec_gate *gate, int fd)
{
    char buf[32768];
    for (;;) {
        int moved = 0;
        ssize_t n;
        while ((n = gs_exec_read(ch, gate, 1, buf, sizeof(buf))) > 0) {
            if (send_frame(fd, 'e', buf, (size_t)n) < 0)
                return 0;
            moved = 1;
        }
        n = gs_exec_read(ch, gate, 0, buf, sizeof(buf));
        if (n > 0 && send_frame(fd, 'o', buf, (size_t)n) < 0)
            return 0;
        if (n == 0 && libssh2_channel_eof(ch))
            return 1;
        if (n < 0 && n != LIBSSH2_ERROR_EAGAIN)
            return (int)n;
        if (n > 0 || moved)
            continue;
        if (client_gone(fd))
            return 0;
        /* Short waits, to notice a client that left; gs_ssh_wait's keepalives notice a server
         * that went silent (a dead spare would otherwise leave the client waiting forever). */
        int rc = gs_ssh_wait(s, gs_clock_mono_ms() + 300, NULL);
        if (rc < 0 && rc != GS_E_TIMEOUT)
            return rc;
    }
}

/* Hands the command to the spare's waiting shell. Returns its channel, or NULL if that shell is
 * gone (the server ended it, or the login shell could not parse PRESTART_COMMAND). */
static LIBSSH2_CHANNEL *give_to_prestart(struct job *j)
{
    LIBSSH2_CHANNEL *ch = j->prestart;
    const char *p = j->command;
    size_t left = strlen(p);
    int rc = 0;
    char junk[4096];
    j->prestart = NULL;
    /* Reading consumes the login shell's noise and marker (nothing of the command's can come
     * before the command is sent) and notices a shell that has gone (its EOF waited unread on
     * the idle connection). */
    while (gs_exec_read(ch, &j->gate, 0, junk, sizeof(junk)) > 0 ||
           gs_exec_read(ch, &j->gate, 1, junk, sizeof(junk)) > 0)
        ;
    while (rc == 0 && left && !libssh2_channel_eof(ch)) {
        ssize_t n = libssh2_channel_write(ch, p, left);
        if (n == LIBSSH2_ERROR_EAGAIN)
            rc = gs_ssh_wait(j->ssh, gs_clock_mono_ms() + 10000, NULL);
        else if (n < 0)
            rc = -1;
        else
            p += n, left -= (size_t)n;
    }
    if (rc == 0 && !left && !libssh2_channel_eof(ch))
        GS_SSH_RETRY(j->ssh, rc, libssh2_channel_send_eof(ch), gs_clock_mono_ms() + 10000, NULL);
    if (rc == 0 && !left)
        return ch;
    libssh2_channel_free(ch);
    return NULL;
}

/* Opens the command's channel: the spare's waiting shell, a new channel on the spare, or a new
 * connection when the spare has died meanwhile. */
static LIBSSH2_CHANNEL *open_command(struct job *j, struct gs_error *err)
{
    gs_exec_gate_init(&j->gate, j->ssh);
    LIBSSH2_CHANNEL *ch = j->prestart ? give_to_prestart(j) : NULL;
    if (!ch && j->ssh) {
        gs_exec_gate_init(&j->gate, j->ssh);
        ch = gs_exec_open(j->ssh, j->command, err);
    }
    if (ch)
        return ch;
    gs_ssh_free(j->ssh);
    j->ssh = NULL;
    gs_error_clear(err);
    if (gs_ssh_connect(&j->ssh, j->opts, err) < 0)
        return NULL;
    gs_exec_gate_init(&j->gate, j->ssh);
    return gs_exec_open(j->ssh, j->command, err);
}

static void *worker_main(void *arg)
{
    struct job *j = arg;
    struct gs_error err = {0};
    int flags = fcntl(j->fd, F_GETFL);
    fcntl(j->fd, F_SETFL, flags & ~O_NONBLOCK);
    LIBSSH2_CHANNEL *ch = open_command(j, &err);
    if (!ch) {
        send_header(j->fd, err.msg);
    } else if (send_header(j->fd, NULL) < 0 || relay_output(j->ssh, ch, &j->gate, j->fd) <= 0) {
        libssh2_channel_send_eof(ch); /* the client left, or the link failed: end it there */
    } else {
        char end[32];
        int n = snprintf(end, sizeof(end), "x %d\n", gs_exec_close(j->ssh, ch, NULL));
        ch = NULL;
        send_all(j->fd, end, (size_t)n);
    }
    close(j->fd);
    gs_ssh_free(j->ssh); /* frees a channel left open too */
    free(j->command);
    free(j);
    workers_running--;
    return NULL;
}

void gs_relay_exec(struct gs_relay *r, int fd, const char *command)
{
    if (workers_running >= GS_RELAY_MAX_WORKERS) {
        send_header(fd, "too many commands are running through the watch daemon; try again when "
                        "one ends");
        close(fd);
        return;
    }
    struct job *j = gs_xcalloc(1, sizeof(*j));
    char *copy = gs_xstrdup(command);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (j && copy) {
        pthread_mutex_lock(&r->lock);
        struct spare sp = r->n_spares ? r->spares[--r->n_spares] : (struct spare){NULL, NULL};
        *j = (struct job){
            .opts = r->opts, .ssh = sp.ssh, .prestart = sp.prestart, .fd = fd, .command = copy};
        r->relayed++;
        pthread_cond_signal(&r->wake); /* connect the next spare */
        pthread_mutex_unlock(&r->lock);
    }
    workers_running++;
    if (!j || !copy || pthread_create(&t, &attr, worker_main, j) != 0) {
        workers_running--;
        send_header(fd, "out of memory or threads");
        close(fd);
        if (j)
            gs_ssh_free(j->ssh);
        free(j);
        free(copy);
    }
    pthread_attr_destroy(&attr);
}
