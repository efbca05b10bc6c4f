/* remote/exec.c: exec channels (see exec.h). */
#include "remote/exec.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

/* Maps an SSH signal name ("TERM", "KILL") to its number; 0 when unknown. */
static int exec_signal_number(const char *name)
{
    static const struct {
        const char *name;
        int number;
    } signals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ILL", SIGILL},
                   {"ABRT", SIGABRT}, {"FPE", SIGFPE},   {"KILL", SIGKILL}, {"SEGV", SIGSEGV},
                   {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"TERM", SIGTERM}, {"USR1", SIGUSR1},
                   {"USR2", SIGUSR2}, {"BUS", SIGBUS}};
    for (size_t i = 0; name && i < sizeof(signals) / sizeof(signals[0]); i++)
        if (strcmp(name, signals[i].name) == 0)
            return signals[i].number;
    return 0;
}

LIBSSH2_CHANNEL *gs_exec_open(struct gs_ssh *s, const char *command, struct gs_error *err)
{
    LIBSSH2_SESSION *session = gs_ssh_session(s);
    LIBSSH2_CHANNEL *ch;
    int rc;
    GS_SSH_RETRY_PTR(s, ch, libssh2_channel_open_session(session), 0, err, rc);
    if (rc < 0)
        return NULL;
    if (!ch) {
        gs_ssh_error(s, libssh2_session_last_errno(session), "opening a channel", err);
        return NULL;
    }
    GS_SSH_RETRY(s, rc, libssh2_channel_exec(ch, command), 0, err);
    if (rc < 0) {
        if (!GS_IS_ERROR(rc))
            gs_ssh_error(s, rc, "starting a remote command", err);
        libssh2_channel_free(ch);
        return NULL;
    }
    return ch;
}

static int exit_result(LIBSSH2_CHANNEL *ch)
{
    char *signame = NULL;
    size_t len = 0;
    libssh2_channel_get_exit_signal(ch, &signame, &len, NULL, NULL, NULL, NULL);
    if (signame && len) {
        int sig = exec_signal_number(signame);
        free(signame);
        return 128 + (sig ? sig : 1);
    }
    free(signame);
    return libssh2_channel_get_exit_status(ch);
}

/* Closes `ch` (sending EOF first unless it was sent) and returns the command's exit result. */
static int close_channel(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, int send_eof, struct gs_error *err)
{
    int rc = 0;
    if (send_eof)
        GS_SSH_RETRY(s, rc, libssh2_channel_send_eof(ch), 0, err);
    if (rc == 0)
        GS_SSH_RETRY(s, rc, libssh2_channel_close(ch), 0, err);
    if (rc == 0)
        GS_SSH_RETRY(s, rc, libssh2_channel_wait_closed(ch), 0, err);
    int result = rc < 0 ? (GS_IS_ERROR(rc) ? rc : gs_ssh_error(s, rc, "closing a channel", err))
                        : exit_result(ch);
    libssh2_channel_free(ch);
    return result;
}

int gs_exec_close(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, struct gs_error *err)
{
    return close_channel(s, ch, 1, err);
}

void gs_exec_abandon(struct gs_ssh *s, LIBSSH2_CHANNEL *ch)
{
    int rc;
    GS_SSH_RETRY(s, rc, libssh2_channel_send_eof(ch), 0, NULL);
    (void)rc; /* a dead connection ends the command as surely as EOF does */
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The state of one gs_exec_run: what is left to send, and which streams have ended. */
struct exec_state {
    struct gs_ssh *s;
    LIBSSH2_CHANNEL *ch;
    const struct gs_exec_io *io;
    const char *in;
    size_t in_left;
    char in_buf[32768];
    int in_fd_done;
    int eof_sent;
    int out_done[2];
};

static void deliver(const struct gs_exec_io *io, int stream, const char *p, size_t n)
{
    int fd = stream ? io->stderr_fd : io->stdout_fd;
    struct gs_buf *b = stream ? io->stderr_buf : io->stdout_buf;
    if (fd >= 0)
        write_all(fd, p, n);
    if (b)
        gs_buf_add(b, p, n);
}

/* Pulls the next chunk of stdin into in/in_left from the fd, if one is being streamed. */
static void refill_stdin(struct exec_state *st)
{
    if (st->in_left || st->in_fd_done || st->io->stdin_fd < 0)
        return;
    ssize_t n = read(st->io->stdin_fd, st->in_buf, sizeof(st->in_buf));
    if (n <= 0) {
        st->in_fd_done = 1;
        return;
    }
    st->in = st->in_buf;
    st->in_left = (size_t)n;
}

/* Moves stdin forward by one step. Returns >0 on progress, 0 when blocked, <0 on error. */
static int pump_stdin(struct exec_state *st)
{
    refill_stdin(st);
    if (st->in_left) {
        ssize_t n = libssh2_channel_write(st->ch, st->in, st->in_left);
        if (n == LIBSSH2_ERROR_EAGAIN)
            return 0;
        if (n < 0)
            return (int)n;
        st->in += n;
        st->in_left -= (size_t)n;
        return 1;
    }
    if (st->eof_sent || (st->io->stdin_fd >= 0 && !st->in_fd_done))
        return 0;
    int rc = libssh2_channel_send_eof(st->ch);
    if (rc == LIBSSH2_ERROR_EAGAIN)
        return 0;
    st->eof_sent = 1;
    return rc < 0 ? rc : 1;
}

/* Reads what is available on one stream. Same return convention as pump_stdin. */
static int pump_output(struct exec_state *st, int stream)
{
    if (st->out_done[stream])
        return 0;
    char buf[32768];
    ssize_t n = libssh2_channel_read_ex(st->ch, stream, buf, sizeof(buf));
    if (n == LIBSSH2_ERROR_EAGAIN)
        return 0;
    if (n < 0)
        return (int)n;
    if (n == 0) {
        st->out_done[stream] = libssh2_channel_eof(st->ch);
        return st->out_done[stream];
    }
    deliver(st->io, stream, buf, (size_t)n);
    return 1;
}

static int exec_loop(struct exec_state *st, struct gs_error *err)
{
    int64_t deadline = st->io->timeout_ms ? gs_clock_mono_ms() + st->io->timeout_ms : 0;
    while (!(st->out_done[0] && st->out_done[1])) {
        int progress = 0, rc;
        if (!st->eof_sent && (rc = pump_stdin(st)) != 0)
            progress |= rc > 0;
        else
            rc = 0;
        for (int stream = 0; rc >= 0 && stream < 2; stream++)
            if ((rc = pump_output(st, stream)) > 0)
                progress = 1;
        if (rc < 0)
            return gs_ssh_error(st->s, rc, "running a remote command", err);
        if (!progress && (rc = gs_ssh_wait(st->s, deadline, err)) < 0)
            return rc;
    }
    return 0;
}

int gs_exec_run(struct gs_ssh *s, const char *command, const struct gs_exec_io *io,
                struct gs_error *err)
{
    struct exec_state st = {.s = s, .io = io, .in = io->stdin_data, .in_left = io->stdin_len};
    st.ch = gs_exec_open(s, command, err);
    if (!st.ch)
        return err && err->code ? err->code : GS_E_REMOTE;
    int rc = exec_loop(&st, err);
    if (rc < 0) {
        libssh2_channel_free(st.ch);
        return rc;
    }
    return close_channel(s, st.ch, !st.eof_sent, err);
}

int gs_exec_capture(struct gs_ssh *s, const char *command, struct gs_buf *out,
                    struct gs_buf *errout, struct gs_error *err)
{
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdout_buf = out;
    io.stderr_buf = errout;
    return gs_exec_run(s, command, &io, err);
}
