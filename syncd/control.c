/* syncd/control.c: control socket plumbing shared by the daemon and its clients (see control.h). */
#include "syncd/control.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/path.h"

/* A peer whose socket takes no data for this long is not reading (a stopped editor plugin): the
 * daemon must not wait on it forever, so the send fails and the daemon drops that client. */
#define SEND_STALL_MS 2000

/* The socket is bound under this name and renamed to daemon.sock once it listens. */
#define SOCKET_NEW "daemon.sock.new"

/* Fills `addr` for the file `name` in the project's .gpusync/. A long project path would
 * overflow sun_path (108 bytes), so the path goes through /proc/self/fd/N of an open .gpusync
 * directory when needed; `dirfd` receives that descriptor (or -1) and must be closed after
 * bind/connect/rename. */
static int socket_addr(const char *root, const char *name, struct sockaddr_un *addr, int *dirfd,
                       struct gs_error *err)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    *dirfd = -1;
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, root, GS_DIR);
    gs_buf_addf(&path, "/%s", name);
    if (path.len < sizeof(addr->sun_path)) {
        memcpy(addr->sun_path, path.data, path.len + 1);
        gs_buf_release(&path);
        return 0;
    }
    gs_buf_reset(&path);
    gs_path_join(&path, root, GS_DIR);
    *dirfd = open(path.data, O_DIRECTORY | O_CLOEXEC);
    int rc = *dirfd < 0 ? gs_error_errno(err, GS_E_IO, "%s", path.data) : 0;
    if (rc == 0)
        snprintf(addr->sun_path, sizeof(addr->sun_path), "/proc/self/fd/%d/%s", *dirfd, name);
    gs_buf_release(&path);
    return rc;
}

/* Binds and listens under SOCKET_NEW, then renames it over daemon.sock (and any stale socket of
 * a dead daemon: the lock says we are the only one), so that daemon.sock, once there, always
 * accepts: an editor that sees a new socket file connects at once (ide/), never in the moment
 * between bind and listen. */
int gs_control_listen(const char *root, struct gs_error *err)
{
    struct sockaddr_un addr, tmp;
    int dirfd, tmp_dirfd = -1;
    if (socket_addr(root, GS_CONTROL_SOCKET_NAME, &addr, &dirfd, err) < 0 ||
        socket_addr(root, SOCKET_NEW, &tmp, &tmp_dirfd, err) < 0) {
        if (dirfd >= 0)
            close(dirfd);
        return GS_E_IO;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    unlink(tmp.sun_path); /* one a daemon killed while starting left */
    /* Only our user may connect (the daemon also checks each peer's uid): the socket is made
     * 0600 before it listens, in a .gpusync/ that is 0700 (gs_path_state_dir). */
    int rc = fd < 0 || bind(fd, (struct sockaddr *)&tmp, sizeof(tmp)) < 0 ||
                     chmod(tmp.sun_path, 0600) < 0 || listen(fd, 16) < 0 ||
                     rename(tmp.sun_path, addr.sun_path) < 0
                 ? gs_error_errno(err, GS_E_IO, "control socket %s", addr.sun_path)
                 : fd;
    if (rc < 0) {
        unlink(tmp.sun_path);
        if (fd >= 0)
            close(fd);
    }
    if (dirfd >= 0)
        close(dirfd);
    if (tmp_dirfd >= 0)
        close(tmp_dirfd);
    return rc;
}

int gs_control_connect(const char *root, struct gs_error *err)
{
    struct sockaddr_un addr;
    int dirfd;
    if (socket_addr(root, GS_CONTROL_SOCKET_NAME, &addr, &dirfd, err) < 0)
        return GS_E_NOTFOUND;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = fd;
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        rc = gs_error_errno(err, GS_E_NOTFOUND, "no gpusync daemon for %s", root);
        if (fd >= 0)
            close(fd);
    }
    if (dirfd >= 0)
        close(dirfd);
    return rc;
}

int gs_control_send(int fd, json_t *msg, struct gs_error *err)
{
    json_object_set_new(msg, "v", json_integer(GS_CONTROL_VERSION));
    char *text = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!text)
        return gs_error_set(err, GS_E_NOMEM, "cannot encode a control message");
    size_t len = strlen(text);
    text[len++] = '\n'; /* json_dumps leaves room: it NUL-terminates */
    int rc = 0;
    int64_t deadline = gs_clock_mono_ms() + SEND_STALL_MS;
    for (size_t off = 0; off < len && rc == 0;) {
        ssize_t n = send(fd, text + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int64_t left = deadline - gs_clock_mono_ms();
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (left <= 0 || poll(&p, 1, (int)left) == 0)
                rc = gs_error_set(err, GS_E_IO, "control socket peer is not reading");
            continue;
        }
        if (n <= 0)
            rc = gs_error_errno(err, GS_E_IO, "control socket write");
        else
            off += (size_t)n;
    }
    free(text);
    return rc;
}

int gs_control_pop(struct gs_buf *buf, json_t **msg, struct gs_error *err)
{
    *msg = NULL;
    char *nl = buf->len ? memchr(buf->data, '\n', buf->len) : NULL;
    if (!nl && buf->len > GS_CONTROL_MAX_LINE)
        return gs_error_set(err, GS_E_PROTO, "control message longer than %d bytes",
                            GS_CONTROL_MAX_LINE);
    if (!nl)
        return 0;
    json_error_t jerr;
    json_t *m = json_loadb(buf->data, (size_t)(nl - buf->data), 0, &jerr);
    gs_buf_consume(buf, (size_t)(nl - buf->data) + 1);
    if (!m)
        return gs_error_set(err, GS_E_PROTO, "control message is not JSON: %s", jerr.text);
    json_t *v = json_object_get(m, "v");
    if (!json_is_integer(v) || json_integer_value(v) != GS_CONTROL_VERSION) {
        json_decref(m);
        return gs_error_set(err, GS_E_PROTO, "control protocol version mismatch (want %d)",
                            GS_CONTROL_VERSION);
    }
    *msg = m;
    return 0;
}

/* Appends what `fd` has to `buf`. Returns 0 (also when interrupted), or GS_E_DISCONNECTED at EOF
 * or on an error. */
static int read_some(int fd, struct gs_buf *buf, struct gs_error *err)
{
    char chunk[8192];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0)
        return gs_error_set(err, GS_E_DISCONNECTED, "the gpusync daemon closed the connection");
    gs_buf_add(buf, chunk, (size_t)n);
    return 0;
}

/* Milliseconds left before `deadline` (-1: none), at least 0. */
static int time_left(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - gs_clock_mono_ms();
    return left > 0 ? (int)left : 0;
}

/* A second connection, subscribed to the event stream; -1 when that fails (no progress then). */
static int open_events(const char *root)
{
    int fd = gs_control_connect(root, NULL);
    json_t *req = json_pack("{s:s}", "cmd", "events");
    if (fd >= 0 && gs_control_send(fd, req, NULL) < 0) {
        close(fd);
        fd = -1;
    }
    json_decref(req);
    return fd;
}

/* Hands the "progress" events complete in `buf` to fn; the rest of the stream is not ours. */
static void pass_progress(struct gs_buf *buf, gs_control_progress_fn fn, void *ctx)
{
    json_t *ev;
    while (gs_control_pop(buf, &ev, NULL) == 0 && ev) {
        const char *kind = json_string_value(json_object_get(ev, "event"));
        if (kind && strcmp(kind, "progress") == 0)
            fn(ctx, ev);
        json_decref(ev);
    }
}

/* Waits up to `timeout_ms` (-1: forever) for the next message on `fd`; meanwhile, while *efd is
 * open, hands its progress events to fn (an ended stream is closed and set to -1). */
static int recv_following(int fd, struct gs_buf *buf, json_t **msg, int timeout_ms, int *efd,
                          struct gs_buf *events, gs_control_progress_fn fn, void *ctx,
                          struct gs_error *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : gs_clock_mono_ms() + timeout_ms;
    for (;;) {
        int rc = gs_control_pop(buf, msg, err);
        if (rc < 0 || *msg)
            return rc;
        int wait = time_left(deadline);
        if (wait == 0)
            return gs_error_set(err, GS_E_TIMEOUT, "no answer from the gpusync daemon");
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = *efd, .events = POLLIN}};
        if (poll(p, *efd >= 0 ? 2 : 1, wait) <= 0)
            continue;
        if (p[0].revents && (rc = read_some(fd, buf, err)) < 0)
            return rc;
        if (*efd >= 0 && p[1].revents && read_some(*efd, events, NULL) < 0) {
            close(*efd); /* the stream ended: the reply tells why */
            *efd = -1;
        } else if (*efd >= 0 && p[1].revents) {
            pass_progress(events, fn, ctx);
        }
    }
}

int gs_control_recv(int fd, struct gs_buf *buf, json_t **msg, int timeout_ms, struct gs_error *err)
{
    int none = -1;
    return recv_following(fd, buf, msg, timeout_ms, &none, NULL, NULL, NULL, err);
}

int gs_control_request_progress(const char *root, const char *cmd, int timeout_ms,
                                gs_control_progress_fn fn, void *ctx, json_t **reply,
                                struct gs_error *err)
{
    *reply = NULL;
    int fd = gs_control_connect(root, NULL);
    if (fd < 0)
        return GS_E_NOTFOUND;
    json_t *req = json_pack("{s:s}", "cmd", cmd);
    struct gs_buf buf = GS_BUF_INIT, events = GS_BUF_INIT;
    int rc = gs_control_send(fd, req, err);
    json_decref(req);
    int efd = rc == 0 && fn ? open_events(root) : -1;
    if (rc == 0)
        rc = recv_following(fd, &buf, reply, timeout_ms, &efd, &events, fn, ctx, err);
    if (efd >= 0)
        close(efd);
    gs_buf_release(&events);
    gs_buf_release(&buf);
    close(fd);
    return rc;
}

int gs_control_request(const char *root, const char *cmd, int timeout_ms, json_t **reply,
                       struct gs_error *err)
{
    return gs_control_request_progress(root, cmd, timeout_ms, NULL, NULL, reply, err);
}

int gs_control_exec(const char *root, const char *command, struct gs_buf *buf, struct gs_error *err)
{
    int fd = gs_control_connect(root, NULL);
    if (fd < 0)
        return GS_E_NOTFOUND;
    json_t *req = json_pack("{s:s,s:s}", "cmd", "exec", "command", command), *reply = NULL;
    struct gs_error ignored = {0};
    int rc = gs_control_send(fd, req, &ignored);
    if (rc == 0)
        rc = gs_control_recv(fd, buf, &reply, 30000, &ignored);
    json_decref(req);
    const char *error = json_string_value(json_object_get(reply, "error"));
    int gone = json_is_true(json_object_get(reply, "stopped")) ||
               (error && strcmp(error, "unknown command") == 0); /* or from before the relay */
    if (rc == 0 && !json_is_true(json_object_get(reply, "ok")))
        rc = error && !gone ? gs_error_set(err, GS_E_REMOTE, "%s", error) : GS_E_NOTFOUND;
    else if (rc < 0)
        rc = GS_E_NOTFOUND; /* it went away: do the work here */
    json_decref(reply);
    if (rc < 0)
        close(fd);
    return rc < 0 ? rc : fd;
}

int gs_control_frame_pop(struct gs_buf *buf, char *kind, struct gs_buf *data, int *status)
{
    char *nl = buf->len ? memchr(buf->data, '\n', buf->len) : NULL;
    if (!nl)
        return buf->len > 64 ? -1 : 0;
    size_t head = (size_t)(nl - buf->data) + 1;
    unsigned long long len;
    if (buf->data[0] == 'x' && sscanf(buf->data, "x %d", status) == 1) {
        *kind = 'x';
        gs_buf_consume(buf, head);
        return 1;
    }
    if ((buf->data[0] != 'o' && buf->data[0] != 'e') || sscanf(buf->data + 1, " %llu", &len) != 1 ||
        len > (64u << 20))
        return -1;
    if (buf->len < head + len)
        return 0;
    *kind = buf->data[0];
    gs_buf_reset(data);
    gs_buf_add(data, buf->data + head, (size_t)len);
    gs_buf_consume(buf, head + (size_t)len);
    return 1;
}
