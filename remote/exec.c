/* remote/exec.c: exec channels (see exec.h). */
#include "remote/exec.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/wrapper.h"

/* Printed by the server's shell just before the command runs. 0x1e starts it and appears nowhere
 * else in it, so a failed partial match restarts cleanly; the command line carries it as octal
 * escapes, so a shell that echoes commands (set -x in an rc file) never prints the bytes. */
#define MARK     "\036gpusync\037"
#define MARK_LEN (sizeof(MARK) - 1)
#define MARK_CMD "printf '\\036gpusync\\037'; printf '\\036gpusync\\037' >&2; "

/* The signal names SSH carries (RFC 4254, 6.10), without "SIG". */
static const struct {
    const char *name;
    int number;
} ssh_signals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ILL", SIGILL},
                   {"ABRT", SIGABRT}, {"FPE", SIGFPE},   {"KILL", SIGKILL}, {"SEGV", SIGSEGV},
                   {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"TERM", SIGTERM}, {"USR1", SIGUSR1},
                   {"USR2", SIGUSR2}, {"BUS", SIGBUS}};
#define N_SSH_SIGNALS (sizeof(ssh_signals) / sizeof(ssh_signals[0]))

/* Maps an SSH signal name ("TERM", "KILL") to its number; 0 when unknown. */
static int exec_signal_number(const char *name)
{
    for (size_t i = 0; name && i < N_SSH_SIGNALS; i++)
        if (strcmp(name, ssh_signals[i].name) == 0)
            return ssh_signals[i].number;
    return 0;
}

/* The SSH name of signal `number`; NULL when SSH has none for it. */
static const char *exec_signal_name(int number)
{
    for (size_t i = 0; i < N_SSH_SIGNALS; i++)
        if (ssh_signals[i].number == number)
            return ssh_signals[i].name;
    return NULL;
}

void gs_exec_gate_init(struct gs_exec_gate *g, struct gs_ssh *s)
{
    memset(g, 0, sizeof(*g));
    g->s = s;
}

static void add_noise(struct gs_exec_gate *g, const char *p, size_t n)
{
    size_t room = GS_SSH_NOISE_MAX - g->noise_len;
    n = n < room ? n : room;
    memcpy(g->noise + g->noise_len, p, n);
    g->noise_len += n;
    g->noise[g->noise_len] = '\0';
}

/* Consumes buf[0..n) up to and including the marker, keeping what precedes it as noise. Returns
 * the bytes consumed: n while the marker is still to come. */
static size_t pass_marker(struct gs_exec_gate *g, int stream, const char *buf, size_t n)
{
    size_t *m = &g->matched[stream], used = n;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == MARK[*m]) {
            if (++*m == MARK_LEN) {
                g->passed[stream] = 1;
                used = i + 1;
                break;
            }
            continue;
        }
        add_noise(g, MARK, *m); /* a partial match that failed was noise too */
        *m = buf[i] == MARK[0];
        if (!*m)
            add_noise(g, buf + i, 1);
    }
    if (g->s && g->noise_len)
        gs_ssh_set_shell_noise(g->s, g->noise, g->noise_len);
    return used;
}

ssize_t gs_exec_read(LIBSSH2_CHANNEL *ch, struct gs_exec_gate *g, int stream, char *buf, size_t len)
{
    for (;;) {
        ssize_t n = libssh2_channel_read_ex(ch, stream, buf, len);
        if (n == 0 && g->s && stream == 0 && !g->passed[0] && libssh2_channel_eof(ch))
            gs_ssh_shell_starting(g->s, 0); /* the shell ended without running the command */
        if (n <= 0 || g->passed[stream])
            return n;
        size_t used = pass_marker(g, stream, buf, (size_t)n);
        if (g->s && stream == 0 && g->passed[0])
            gs_ssh_shell_starting(g->s, 0);
        if (used < (size_t)n) {
            memmove(buf, buf + used, (size_t)n - used);
            return n - (ssize_t)used;
        }
    }
}

void gs_exec_blame_noise(const struct gs_exec_gate *g, struct gs_error *err)
{
    if (!err || !g->noise_len)
        return;
    char shown[160];
    size_t n = 0;
    for (size_t i = 0; i < g->noise_len && n + 4 < sizeof(shown); i++)
        shown[n++] = (unsigned char)g->noise[i] < 0x20 ? ' ' : g->noise[i];
    if (n < g->noise_len)
        shown[n++] = '.', shown[n++] = '.', shown[n++] = '.';
    shown[n] = '\0';
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof(err->msg) - len,
             " (the server's shell printed \"%s\" instead; `gpusync doctor` names the file)",
             shown);
}

static LIBSSH2_CHANNEL *open_session(struct gs_ssh *s, struct gs_error *err)
{
    LIBSSH2_SESSION *session = gs_ssh_session(s);
    LIBSSH2_CHANNEL *ch;
    int rc;
    GS_SSH_RETRY_PTR(s, ch, libssh2_channel_open_session(session), 0, err, rc);
    if (rc == 0 && !ch)
        gs_ssh_error(s, libssh2_session_last_errno(session), "opening a channel", err);
    return ch;
}

LIBSSH2_CHANNEL *gs_exec_open_socket(struct gs_ssh *s, const char *path, struct gs_error *err)
{
    static const char type[] = "direct-streamlocal@openssh.com";
    /* RFC 4254 strings: the socket path, then OpenSSH's reserved string and uint32, both 0. */
    size_t len = strlen(path);
    struct gs_buf msg = GS_BUF_INIT;
    uint8_t be[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    gs_buf_add(&msg, be, 4);
    gs_buf_add(&msg, path, len);
    gs_buf_add(&msg, "\0\0\0\0\0\0\0\0", 8);
    LIBSSH2_SESSION *session = gs_ssh_session(s);
    LIBSSH2_CHANNEL *ch;
    int rc;
    GS_SSH_RETRY_PTR(
        s, ch,
        libssh2_channel_open_ex(session, type, sizeof(type) - 1, LIBSSH2_CHANNEL_WINDOW_DEFAULT,
                                LIBSSH2_CHANNEL_PACKET_DEFAULT, msg.data, (unsigned)msg.len),
        0, err, rc);
    gs_buf_release(&msg);
    if (rc == 0 && !ch) {
        int code = libssh2_session_last_errno(session);
        if (code == LIBSSH2_ERROR_CHANNEL_FAILURE)
            gs_error_set(err, GS_E_REMOTE, "%s refused a channel to %s", gs_ssh_target(s), path);
        else
            gs_ssh_error(s, code, "opening a channel to the resident agent", err);
    }
    return ch;
}

int gs_exec_socket_opens(struct gs_ssh *s, const char *path, struct gs_error *err)
{
    LIBSSH2_CHANNEL *ch = gs_exec_open_socket(s, path, err);
    if (ch)
        gs_exec_abandon(s, ch);
    return ch ? 1 : err && err->code == GS_E_REMOTE ? 0 : err && err->code ? err->code : GS_E_ERR;
}

/* Turns a failed exec request's code into err; returns the negative code. */
static int exec_failed(struct gs_ssh *s, int rc, struct gs_error *err)
{
    if (!GS_IS_ERROR(rc))
        rc = gs_ssh_error(s, rc, "starting a remote command", err);
    return rc;
}

LIBSSH2_CHANNEL *gs_exec_open(struct gs_ssh *s, const char *command, struct gs_error *err)
{
    LIBSSH2_CHANNEL *ch = open_session(s, err);
    if (!ch)
        return NULL;
    struct gs_buf marked = GS_BUF_INIT;
    gs_buf_adds(&marked, MARK_CMD);
    gs_buf_adds(&marked, command);
    int rc;
    GS_SSH_RETRY(s, rc, libssh2_channel_exec(ch, marked.data), 0, err);
    gs_buf_release(&marked);
    if (rc == 0)
        gs_ssh_shell_starting(s, 1);
    if (rc < 0) {
        exec_failed(s, rc, err);
        libssh2_channel_free(ch);
        return NULL;
    }
    return ch;
}

/* libssh2 answers EAGAIN both while the request is still being written and while its answer is
 * awaited; only the second lets the caller go on, and the blocked direction tells them apart. */
static int exec_request_written(struct gs_ssh *s)
{
    return !(libssh2_session_block_directions(gs_ssh_session(s)) & LIBSSH2_SESSION_BLOCK_OUTBOUND);
}

LIBSSH2_CHANNEL *gs_exec_start(struct gs_ssh *s, const char *command, struct gs_exec_pending *p,
                               struct gs_error *err)
{
    gs_buf_init(&p->request);
    p->answered = 0;
    LIBSSH2_CHANNEL *ch = open_session(s, err);
    if (!ch)
        return NULL;
    gs_buf_adds(&p->request, MARK_CMD);
    gs_buf_adds(&p->request, command);
    gs_ssh_shell_starting(s, 1);
    int rc;
    while ((rc = libssh2_channel_exec(ch, p->request.data)) == LIBSSH2_ERROR_EAGAIN &&
           !exec_request_written(s))
        if ((rc = gs_ssh_wait(s, 0, err)) < 0)
            break;
    if (rc == 0 || rc == LIBSSH2_ERROR_EAGAIN) {
        p->answered = rc == 0;
        return ch;
    }
    exec_failed(s, rc, err);
    libssh2_channel_free(ch);
    gs_buf_release(&p->request);
    return NULL;
}

int gs_exec_answered(struct gs_ssh *s, LIBSSH2_CHANNEL *ch, struct gs_exec_pending *p,
                     struct gs_error *err)
{
    if (p->answered)
        return 1;
    int rc = libssh2_channel_exec(ch, p->request.data); /* only collects the answer now */
    if (rc == LIBSSH2_ERROR_EAGAIN)
        return 0;
    if (rc < 0)
        return exec_failed(s, rc, err);
    p->answered = 1;
    gs_buf_release(&p->request);
    return 1;
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
    int stdin_half_sent; /* a stdin packet is partly written: libssh2 1.10 must finish it first */
    char tag[33];        /* GPUSYNC_EXEC's value in the command's environment, for pass_signal */
    int64_t give_up_at;  /* after a SIGKILL passed on: when to stop waiting for the end; 0: never */
    struct gs_exec_gate gate;
};

static void deliver(const struct gs_exec_io *io, int stream, const char *p, size_t n)
{
    int fd = stream ? io->stderr_fd : io->stdout_fd;
    struct gs_buf *b = stream ? io->stderr_buf : io->stdout_buf;
    if (fd >= 0)
        gs_write_all(fd, p, n);
    if (b)
        gs_buf_add(b, p, n);
}

/* Whether the loop waits for stdin's fd: it is streamed and nothing of it is held. */
static int awaits_stdin(const struct exec_state *st)
{
    return !st->in_left && !st->in_fd_done && st->io->stdin_fd >= 0;
}

/* Pulls the next chunk of stdin into in/in_left from the fd, if one is being streamed and has
 * something to read: a pipe that stays quiet must not stop the command's output, or a Ctrl-C. */
static void refill_stdin(struct exec_state *st)
{
    if (!awaits_stdin(st))
        return;
    struct pollfd p = {.fd = st->io->stdin_fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return;
    ssize_t n = read(st->io->stdin_fd, st->in_buf, sizeof(st->in_buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
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
        st->stdin_half_sent = n == LIBSSH2_ERROR_EAGAIN && !exec_request_written(st->s);
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
    st->stdin_half_sent = rc == LIBSSH2_ERROR_EAGAIN && !exec_request_written(st->s);
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
    ssize_t n = gs_exec_read(st->ch, &st->gate, stream, buf, sizeof(buf));
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

/* Fills `tag` (33 bytes) with 32 random hex digits: no other command's environment holds them. */
static void make_tag(char *tag)
{
    unsigned char r[16] = {0};
    /* before the kernel's pool is ready (early boot), the time and pid are unique enough */
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf((char *)r, sizeof(r), "%lx%ld", (long)ts.tv_nsec, (long)getpid());
    }
    for (int i = 0; i < 16; i++)
        snprintf(tag + 2 * i, 3, "%02x", r[i]);
}

/* The server-side finder for pass_signal_on (a printf format: the tag, the signal name, then what
 * follows each signalled group). It finds the command's processes by its tag: in the environment
 * of what the command line starts, and in the command line itself (the -c argument of the shell
 * sshd started, whose environment /proc shows as it was at its exec, before the export; a line
 * that runs no child, a shell loop, has no other process). The pattern's [C] keeps the finder's
 * own command line, which holds the pattern, from matching. Of each process it signals the group
 * that is its session's first (the one sshd started the command in; groups the command made with
 * job control keep running, as after a Ctrl-C in a terminal), once, and prints how many groups
 * took the signal. */
#define FIND_AND_SIGNAL                                                                            \
    "n=0; seen=; for f in $(grep -lsz 'GPUSYNC_EXE[C]=%s' /proc/[0-9]*/environ "                   \
    "/proc/[0-9]*/cmdline); do "                                                                   \
    "read -r s < \"${f%%/*}/stat\" || continue; set -- ${s##*') '}; "                              \
    "[ \"$3\" = \"$4\" ] || continue; case \" $seen \" in *\" $3 \"*) continue;; esac; "           \
    "seen=\"$seen $3\"; kill -s %s -- \"-$3\" 2>/dev/null || continue; n=$((n+1))%s; done; "       \
    "echo $n"

/* Passes a signal the caller caught on to the command's process group, as a terminal would. An
 * SSH "signal" request on the command's channel would do it where the server takes one, but
 * libssh2 1.10 sends no request on a channel whose command runs ("Channel can not be reused"),
 * so a second channel runs FIND_AND_SIGNAL. A stopped group is continued after any signal but
 * SIGKILL, so that it receives it (as bash's kill does for a stopped job). Returns 1 when a signal
 * was passed on (io->signal_passed told how many groups took it), 0 when none was waiting, or a
 * negative code when the second channel failed. */
static int pass_signal_on(struct exec_state *st, struct gs_error *err)
{
    volatile sig_atomic_t *slot = st->io->pass_signal;
    if (!slot || !*slot || st->stdin_half_sent)
        return 0;
    int sig = *slot;
    const char *name = exec_signal_name(sig);
    *slot = 0;
    if (!name)
        return 0;
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_addf(&cmd, FIND_AND_SIGNAL, st->tag, name,
                sig == SIGKILL ? "" : "; kill -s CONT -- \"-$3\" 2>/dev/null");
    int rc = gs_exec_capture(st->s, cmd.data, &out, NULL, err);
    gs_buf_release(&cmd);
    int groups = rc == 0 && out.data ? atoi(out.data) : 0;
    gs_buf_release(&out);
    if (rc < 0)
        return rc;
    if (sig == SIGKILL && st->io->kill_wait_ms > 0)
        st->give_up_at = gs_clock_mono_ms() + st->io->kill_wait_ms;
    if (st->io->signal_passed)
        st->io->signal_passed(st->io->signal_ctx, sig, groups);
    return 1;
}

/* Whether the wait for the command's end after a SIGKILL passed on is over (io->kill_wait_ms). */
static int gave_up(const struct exec_state *st)
{
    return st->give_up_at && gs_clock_mono_ms() >= st->give_up_at;
}

/* The sooner of two deadlines, 0 meaning none. */
static int64_t sooner(int64_t a, int64_t b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

static int exec_loop(struct exec_state *st, struct gs_error *err)
{
    int64_t deadline = st->io->timeout_ms ? gs_clock_mono_ms() + st->io->timeout_ms : 0;
    while (!(st->out_done[0] && st->out_done[1])) {
        int progress = 0, rc;
        if ((rc = pass_signal_on(st, err)) < 0)
            return rc;
        progress |= rc > 0;
        if (gave_up(st))
            return gs_error_set(err, GS_E_INTERRUPTED,
                                "the command did not end within %d s of SIGKILL on %s; it may "
                                "still run there",
                                st->io->kill_wait_ms / 1000, gs_ssh_target(st->s));
        if (!st->eof_sent && (rc = pump_stdin(st)) != 0)
            progress |= rc > 0;
        else
            rc = 0;
        for (int stream = 0; rc >= 0 && stream < 2; stream++)
            if ((rc = pump_output(st, stream)) > 0)
                progress = 1;
        if (rc < 0)
            return gs_ssh_error(st->s, rc, "running a remote command", err);
        int in_fd = awaits_stdin(st) ? st->io->stdin_fd : -1;
        if (!progress &&
            (rc = gs_ssh_wait_or_fd(st->s, sooner(deadline, st->give_up_at), in_fd, err)) < 0 &&
            !gave_up(st))
            return rc;
    }
    return 0;
}

int gs_exec_run(struct gs_ssh *s, const char *command, const struct gs_exec_io *io,
                struct gs_error *err)
{
    struct exec_state st = {.s = s, .io = io, .in = io->stdin_data, .in_left = io->stdin_len};
    gs_exec_gate_init(&st.gate, s);
    struct gs_buf tagged = GS_BUF_INIT;
    if (io->pass_signal) { /* POSIX sh: a command line of several commands gets it too */
        make_tag(st.tag);
        gs_buf_addf(&tagged, "GPUSYNC_EXEC=%s; export GPUSYNC_EXEC; ", st.tag);
    }
    gs_buf_adds(&tagged, command);
    st.ch = gs_exec_open(s, tagged.data, err);
    gs_buf_release(&tagged);
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

int gs_exec_path_broken(struct gs_ssh *s, const char *out, struct gs_error *err)
{
    const char *line = out ? strstr(out, "path_broken=") : NULL;
    if (!line || (line != out && line[-1] != '\n'))
        return 0;
    line += strlen("path_broken=");
    return gs_error_set(err, GS_E_REMOTE,
                        "the login shell on %s finds no basic commands (mkdir, uname): its PATH is "
                        "'%.*s'; a startup file (~/.bashrc, ~/.profile) sets it without /usr/bin "
                        "and /bin: fix it there",
                        gs_ssh_target(s), (int)strcspn(line, "\n"), line);
}
