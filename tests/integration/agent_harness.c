/* Test harness for the agent (see agent_harness.h): a pipe-based client built on the shared
 * protocol codec, with a poll loop so pipelined bursts never deadlock. */
#include "agent_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

const char *agent_h_binary(void)
{
    static char path[PATH_MAX];
    const char *dir = getenv("GS_BUILD_DIR");
    if (!dir)
        return NULL;
    snprintf(path, sizeof(path), "%s/agent/gpusync-agent", dir);
    return path;
}

int agent_h_start(struct agent_h *a, const char *root, const char *extra)
{
    int in[2], out[2];
    const char *bin = agent_h_binary();
    memset(a, 0, sizeof(*a));
    a->next_id = 1;
    if (!bin || pipe2(in, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) < 0)
        return -1;
    signal(SIGPIPE, SIG_IGN);
    a->pid = fork();
    if (a->pid < 0)
        return -1;
    if (a->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(bin, bin, "serve", "--root", root, extra, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    a->to_agent = in[1];
    a->from_agent = out[0];
    return 0;
}

int agent_h_open(struct agent_h *a, const char *root, char *root_out, size_t cap)
{
    struct gs_proto_msg m = {0}, r;
    if (agent_h_start(a, root, NULL) < 0)
        return -1;
    m.type = GS_MSG_HELLO;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION;
    if (agent_h_call(a, &m, &r) < 0 || r.type != GS_MSG_HELLO_OK)
        return -1;
    if (root_out)
        snprintf(root_out, cap, "%.*s", (int)r.path2.len, r.path2.p);
    return 0;
}

uint32_t agent_h_queue(struct agent_h *a, struct gs_proto_msg *m)
{
    if (m->id == 0)
        m->id = a->next_id++;
    if (gs_proto_encode(&a->tx, m) < 0)
        abort();
    return m->id;
}

void agent_h_queue_raw(struct agent_h *a, const void *p, size_t n)
{
    if (gs_proto_buf_reserve(&a->tx, n) < 0)
        abort();
    memcpy(a->tx.data + a->tx.len, p, n);
    a->tx.len += n;
}

/* Reads what the agent has written into rx; returns bytes read, 0 at EOF, -1 on error. */
static ssize_t pull(struct agent_h *a)
{
    if (gs_proto_buf_reserve(&a->rx, 1 << 16) < 0)
        return -1;
    ssize_t n = read(a->from_agent, a->rx.data + a->rx.len, a->rx.cap - a->rx.len);
    if (n > 0)
        a->rx.len += (size_t)n;
    return n;
}

int agent_h_flush(struct agent_h *a)
{
    size_t off = 0;
    while (off < a->tx.len) {
        struct pollfd p[2] = {{a->to_agent, POLLOUT, 0}, {a->from_agent, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            return -1;
        if (p[1].revents & (POLLIN | POLLHUP))
            pull(a);
        if (p[0].revents & (POLLERR | POLLHUP))
            return -1;
        if (p[0].revents & POLLOUT) {
            size_t chunk = a->tx.len - off > 65536 ? 65536 : a->tx.len - off;
            ssize_t w = write(a->to_agent, a->tx.data + off, chunk);
            if (w < 0 && errno != EINTR && errno != EAGAIN)
                return -1;
            if (w > 0)
                off += (size_t)w;
        }
    }
    a->tx.len = 0;
    return 0;
}

int agent_h_recv(struct agent_h *a, struct gs_proto_msg *m)
{
    struct gs_proto_frame f;
    if (agent_h_flush(a) < 0)
        return -1;
    gs_proto_buf_consume(&a->rx, a->rx_used);
    a->rx_used = 0;
    for (;;) {
        long n = gs_proto_parse_frame(a->rx.data, a->rx.len, &f);
        if (n < 0)
            return -1;
        if (n > 0) {
            a->rx_used = (size_t)n;
            return gs_proto_decode(&f, m) == 0 ? 0 : -1;
        }
        if (pull(a) <= 0)
            return -1;
    }
}

int agent_h_call(struct agent_h *a, struct gs_proto_msg *m, struct gs_proto_msg *reply)
{
    agent_h_queue(a, m);
    return agent_h_recv(a, reply);
}

int agent_h_close(struct agent_h *a)
{
    int status = 0;
    agent_h_flush(a);
    close(a->to_agent);
    /* Drain what is left so the agent never blocks on a full pipe while exiting. */
    while (pull(a) > 0)
        a->rx.len = 0;
    close(a->from_agent);
    waitpid(a->pid, &status, 0);
    gs_proto_buf_release(&a->tx);
    gs_proto_buf_release(&a->rx);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

void agent_h_hash(const void *p, size_t n, uint8_t out[GS_PROTO_HASH_LEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, GS_PROTO_HASH_LEN);
}
