/* dist.c: TCP rendezvous and ring collectives. Every socket is non-blocking and every wait goes
 * through poll() with the remaining time, so the only ways out are success, a peer's EOF/error,
 * or a timeout — each reported with this rank and the peer's. */
#include "dist.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDZV_MAGIC   0x47535452u /* "GSTR" */
#define RDZV_VERSION 1u

/* What a rank tells rank 0 at the rendezvous (network byte order on the wire). */
typedef struct hello {
    uint32_t magic, version, rank, world, ring_port;
} hello;

/* One row of the table rank 0 sends back; ip 0 means "the master address". */
typedef struct peer_addr {
    uint32_t ip, port;
} peer_addr;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int remaining_ms(double deadline)
{
    double left = deadline - now_s();
    return left <= 0 ? 0 : (int)(left * 1000.0) + 1;
}

static int env_int(const char *name, int fallback, int *out, gt_err *err)
{
    const char *s = getenv(name);
    if (!s || !*s) {
        *out = fallback;
        return 0;
    }
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1 << 24)
        return gt_errf(err, "environment %s=%s is not a valid number", name, s);
    *out = (int)v;
    return 0;
}

int gt_dist_config_from_env(gt_dist_config *c, gt_err *err)
{
    memset(c, 0, sizeof(*c));
    c->world = 1;
    c->port = 29500;
    c->rdzv_timeout_s = 60;
    c->timeout_s = 300;
    c->source = "single process";
    const char *addr = getenv("MASTER_ADDR");
    int rc = env_int("MASTER_PORT", 29500, &c->port, err);
    if (getenv("RANK") && getenv("WORLD_SIZE")) {
        c->source = "torchrun env";
        rc = rc ? rc : env_int("RANK", 0, &c->rank, err);
        rc = rc ? rc : env_int("WORLD_SIZE", 1, &c->world, err);
        rc = rc ? rc : env_int("LOCAL_RANK", c->rank, &c->local_rank, err);
    } else if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS")) {
        c->source = "slurm env";
        rc = rc ? rc : env_int("SLURM_PROCID", 0, &c->rank, err);
        rc = rc ? rc : env_int("SLURM_NTASKS", 1, &c->world, err);
        rc = rc ? rc : env_int("SLURM_LOCALID", 0, &c->local_rank, err);
        if (!addr)
            addr = getenv("SLURM_LAUNCH_NODE_IPADDR");
    }
    rc = rc ? rc : env_int("TORCHELASTIC_RESTART_COUNT", 0, &c->restart, err);
    snprintf(c->host, sizeof(c->host), "%s", addr && *addr ? addr : "127.0.0.1");
    return rc;
}

int gt_dist_parse_master(gt_dist_config *c, const char *url, gt_err *err)
{
    const char *p = strncmp(url, "tcp://", 6) == 0 ? url + 6 : url;
    const char *colon = strrchr(p, ':');
    if (!colon || colon == p || (size_t)(colon - p) >= sizeof(c->host))
        return gt_errf(err, "--master %s: expected tcp://HOST:PORT", url);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return gt_errf(err, "--master %s: bad port", url);
    memcpy(c->host, p, (size_t)(colon - p));
    c->host[colon - p] = '\0';
    c->port = (int)port;
    return 0;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    int one = 1, bufsz = 4 << 20; /* a whole gradient chunk in flight: fewer poll rounds */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Listens on port (0: any) on all interfaces; returns the fd and the bound port, or -1. */
static int listen_on(int port, int *bound, int rank, gt_err *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(sa);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || set_nonblock(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return gt_errf(err, "rank %d: cannot listen on port %d: %s", rank, port, strerror(e));
    }
    *bound = ntohs(sa.sin_port);
    return fd;
}

/* Accepts one connection before the deadline; returns the fd (non-blocking) or -1. */
static int accept_until(int lfd, double deadline, struct sockaddr_in *peer, int rank,
                        const char *what, gt_err *err)
{
    for (;;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int n = poll(&p, 1, remaining_ms(deadline));
        if (n == 0)
            return gt_errf(err, "rank %d: timed out waiting for %s", rank, what);
        if (n < 0 && errno != EINTR)
            return gt_errf(err, "rank %d: poll: %s", rank, strerror(errno));
        socklen_t len = sizeof(*peer);
        int fd = accept(lfd, (struct sockaddr *)peer, &len);
        if (fd >= 0)
            return set_nonblock(fd) == 0 ? fd : (close(fd), -1);
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
            return gt_errf(err, "rank %d: accept: %s", rank, strerror(errno));
    }
}

/* One connection attempt to ip:port; returns a connected non-blocking fd or -1 (errno set). */
static int try_connect(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0 || set_nonblock(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Retries until the peer listens or the deadline passes (the peer may not be up yet). */
static int connect_until(const struct sockaddr_in *sa, double deadline, int rank, const char *what,
                         gt_err *err)
{
    for (;;) {
        int fd = try_connect(sa);
        if (fd >= 0)
            return fd;
        int e = errno;
        if (now_s() >= deadline) {
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
            return gt_errf(err, "rank %d: cannot reach %s at %s:%d: %s (timed out)", rank, what, ip,
                           ntohs(sa->sin_port), strerror(e));
        }
        struct timespec ts = {0, 50 * 1000 * 1000}; /* retry pacing, not synchronisation */
        nanosleep(&ts, NULL);
    }
}

/* Moves bytes both ways at once until both are done: sending to `out` while receiving from `in`
 * avoids the deadlock two blocking sends would hit once socket buffers fill. Either side may be
 * empty (len 0). */
static int exchange(gt_dist *d, int out_fd, const void *sbuf, size_t slen, int out_rank, int in_fd,
                    void *rbuf, size_t rlen, int in_rank, gt_err *err)
{
    double deadline = now_s() + d->timeout_ms / 1000.0;
    size_t sent = 0, got = 0;
    while (sent < slen || got < rlen) {
        struct pollfd p[2] = {{.fd = sent < slen ? out_fd : -1, .events = POLLOUT},
                              {.fd = got < rlen ? in_fd : -1, .events = POLLIN}};
        int n = poll(p, 2, remaining_ms(deadline));
        if (n == 0)
            return gt_errf(err, "rank %d: collective timed out after %d s waiting for rank %d",
                           d->rank, d->timeout_ms / 1000, got < rlen ? in_rank : out_rank);
        if (n < 0 && errno != EINTR)
            return gt_errf(err, "rank %d: poll: %s", d->rank, strerror(errno));
        if (p[0].revents) {
            ssize_t w = send(out_fd, (const char *)sbuf + sent, slen - sent, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                return gt_errf(err, "rank %d: lost rank %d: %s", d->rank, out_rank,
                               strerror(errno));
            sent += w > 0 ? (size_t)w : 0;
        }
        if (p[1].revents) {
            ssize_t r = recv(in_fd, (char *)rbuf + got, rlen - got, 0);
            if (r == 0)
                return gt_errf(err, "rank %d: rank %d closed the connection (it probably failed)",
                               d->rank, in_rank);
            if (r < 0 && errno != EAGAIN && errno != EINTR)
                return gt_errf(err, "rank %d: lost rank %d: %s", d->rank, in_rank, strerror(errno));
            got += r > 0 ? (size_t)r : 0;
        }
    }
    return 0;
}

static int send_all(gt_dist *d, int fd, const void *buf, size_t n, int peer, gt_err *err)
{
    return exchange(d, fd, buf, n, peer, -1, NULL, 0, peer, err);
}

static int recv_all(gt_dist *d, int fd, void *buf, size_t n, int peer, gt_err *err)
{
    return exchange(d, -1, NULL, 0, peer, fd, buf, n, peer, err);
}

static int resolve_ipv4(const char *host, int port, struct sockaddr_in *sa, int rank, gt_err *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0)
        return gt_errf(err, "rank %d: cannot resolve master %s: %s", rank, host, gai_strerror(rc));
    *sa = *(struct sockaddr_in *)res->ai_addr;
    sa->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

/* Rank 0: collect every rank's hello, check it, and answer with the ring table. */
static int rdzv_host(gt_dist *d, const gt_dist_config *c, int ring_port, double deadline,
                     peer_addr *table, gt_err *err)
{
    int bound, lfd = listen_on(c->port, &bound, 0, err);
    if (lfd < 0)
        return -1;
    int *fds = calloc((size_t)c->world, sizeof(int));
    int rc = fds ? 0 : gt_errf(err, "rank 0: out of memory");
    table[0].port = htonl((uint32_t)ring_port);
    for (int i = 1; rc == 0 && i < c->world; i++) {
        struct sockaddr_in peer;
        char what[96];
        snprintf(what, sizeof(what), "%d more rank(s) at the rendezvous on port %d", c->world - i,
                 c->port);
        int fd = accept_until(lfd, deadline, &peer, 0, what, err);
        hello h;
        if (fd < 0 || recv_all(d, fd, &h, sizeof(h), -1, err) != 0) {
            rc = -1;
            if (fd >= 0)
                close(fd);
            break;
        }
        int r = (int)ntohl(h.rank);
        if (ntohl(h.magic) != RDZV_MAGIC || ntohl(h.version) != RDZV_VERSION)
            rc = gt_errf(err, "rank 0: a non-gpusync-train client connected to port %d", c->port);
        else if ((int)ntohl(h.world) != c->world)
            rc = gt_errf(err, "rank 0: rank %d says world size %u, rank 0 has %d", r,
                         ntohl(h.world), c->world);
        else if (r < 1 || r >= c->world || fds[r])
            rc = gt_errf(err, "rank 0: rank %d joined twice or is out of range", r);
        else {
            fds[r] = fd;
            table[r].ip = peer.sin_addr.s_addr;
            table[r].port = h.ring_port;
            continue;
        }
        close(fd);
    }
    size_t tlen = (size_t)c->world * sizeof(peer_addr);
    for (int r = 1; rc == 0 && r < c->world; r++)
        rc = send_all(d, fds[r], table, tlen, r, err);
    for (int r = 1; fds && r < c->world; r++)
        if (fds[r])
            close(fds[r]);
    free(fds);
    close(lfd);
    return rc;
}

/* Rank r > 0: report the ring port to rank 0 and receive the table. */
static int rdzv_join(gt_dist *d, const gt_dist_config *c, int ring_port, double deadline,
                     peer_addr *table, gt_err *err)
{
    struct sockaddr_in sa;
    if (resolve_ipv4(c->host, c->port, &sa, c->rank, err) != 0)
        return -1;
    int fd = connect_until(&sa, deadline, c->rank, "the rank 0 rendezvous", err);
    if (fd < 0)
        return -1;
    hello h = {htonl(RDZV_MAGIC), htonl(RDZV_VERSION), htonl((uint32_t)c->rank),
               htonl((uint32_t)c->world), htonl((uint32_t)ring_port)};
    int rc = send_all(d, fd, &h, sizeof(h), 0, err);
    if (rc == 0)
        rc = recv_all(d, fd, table, (size_t)c->world * sizeof(peer_addr), 0, err);
    close(fd);
    return rc;
}

/* Connects to the next rank's ring listener and accepts the previous rank's connection. */
static int link_ring(gt_dist *d, const gt_dist_config *c, int lfd, const peer_addr *table,
                     double deadline, gt_err *err)
{
    int next = (d->rank + 1) % d->world, prev = (d->rank + d->world - 1) % d->world;
    struct sockaddr_in sa;
    if (resolve_ipv4(c->host, (int)ntohl(table[next].port), &sa, d->rank, err) != 0)
        return -1;
    if (table[next].ip != 0)
        sa.sin_addr.s_addr = table[next].ip;
    d->next_fd = connect_until(&sa, deadline, d->rank, "the next rank's ring port", err);
    if (d->next_fd < 0)
        return -1;
    uint32_t me = htonl((uint32_t)d->rank), them = 0;
    if (send_all(d, d->next_fd, &me, sizeof(me), next, err) != 0)
        return -1;
    struct sockaddr_in peer;
    d->prev_fd = accept_until(lfd, deadline, &peer, d->rank, "the previous rank's ring link", err);
    if (d->prev_fd < 0 || recv_all(d, d->prev_fd, &them, sizeof(them), prev, err) != 0)
        return -1;
    if ((int)ntohl(them) != prev)
        return gt_errf(err, "rank %d: expected rank %d on the ring, got %u", d->rank, prev,
                       ntohl(them));
    return 0;
}

int gt_dist_init(gt_dist *d, const gt_dist_config *c, gt_err *err)
{
    memset(d, 0, sizeof(*d));
    d->rank = c->rank;
    d->world = c->world;
    d->local_rank = c->local_rank;
    d->next_fd = d->prev_fd = -1;
    d->timeout_ms = (c->timeout_s > 0 ? c->timeout_s : 300) * 1000;
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return gt_errf(err, "rank %d: not a valid rank for world size %d", c->rank, c->world);
    if (c->world == 1)
        return 0;
    double deadline = now_s() + (c->rdzv_timeout_s > 0 ? c->rdzv_timeout_s : 60);
    int ring_port, lfd = listen_on(0, &ring_port, c->rank, err);
    if (lfd < 0)
        return -1;
    peer_addr *table = calloc((size_t)c->world, sizeof(peer_addr));
    int rc = table ? 0 : gt_errf(err, "rank %d: out of memory", c->rank);
    if (rc == 0)
        rc = c->rank == 0 ? rdzv_host(d, c, ring_port, deadline, table, err)
                          : rdzv_join(d, c, ring_port, deadline, table, err);
    if (rc == 0)
        rc = link_ring(d, c, lfd, table, deadline, err);
    free(table);
    close(lfd);
    if (rc != 0)
        gt_dist_release(d);
    return rc;
}

void gt_dist_release(gt_dist *d)
{
    if (d->next_fd >= 0)
        close(d->next_fd);
    if (d->prev_fd >= 0)
        close(d->prev_fd);
    d->next_fd = d->prev_fd = -1;
    free(d->scratch);
    d->scratch = NULL;
    d->scratch_len = 0;
}

typedef void (*add_fn)(void *dst, const void *src, size_t n);

static void add_f32(void *dst, const void *src, size_t n)
{
    float *a = dst;
    const float *b = src;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

static void add_f64(void *dst, const void *src, size_t n)
{
    double *a = dst;
    const double *b = src;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* Chunk c of n elements split into world nearly equal parts: [*lo, *hi). */
static void chunk(const gt_dist *d, size_t n, int c, size_t *lo, size_t *hi)
{
    c = ((c % d->world) + d->world) % d->world;
    *lo = n * (size_t)c / (size_t)d->world;
    *hi = n * (size_t)(c + 1) / (size_t)d->world;
}

/* Ring all-reduce: W-1 reduce-scatter steps, then W-1 all-gather steps; each step sends one
 * chunk to the next rank while receiving another from the previous one. */
static int ring_allreduce(gt_dist *d, char *buf, size_t n, size_t esz, add_fn add, gt_err *err)
{
    if (d->world == 1 || n == 0)
        return 0;
    size_t need = (n / (size_t)d->world + 1) * esz;
    if (d->scratch_len < need) {
        void *p = realloc(d->scratch, need);
        if (!p)
            return gt_errf(err, "rank %d: out of memory in all-reduce", d->rank);
        d->scratch = p;
        d->scratch_len = need;
    }
    int W = d->world, r = d->rank, next = (r + 1) % W, prev = (r + W - 1) % W;
    for (int s = 0; s < W - 1; s++) {
        size_t slo, shi, rlo, rhi;
        chunk(d, n, r - s, &slo, &shi);
        chunk(d, n, r - s - 1, &rlo, &rhi);
        if (exchange(d, d->next_fd, buf + slo * esz, (shi - slo) * esz, next, d->prev_fd,
                     d->scratch, (rhi - rlo) * esz, prev, err) != 0)
            return -1;
        add(buf + rlo * esz, d->scratch, rhi - rlo);
    }
    for (int s = 0; s < W - 1; s++) {
        size_t slo, shi, rlo, rhi;
        chunk(d, n, r + 1 - s, &slo, &shi);
        chunk(d, n, r - s, &rlo, &rhi);
        if (exchange(d, d->next_fd, buf + slo * esz, (shi - slo) * esz, next, d->prev_fd,
                     buf + rlo * esz, (rhi - rlo) * esz, prev, err) != 0)
            return -1;
    }
    return 0;
}

int gt_dist_allreduce_f32(gt_dist *d, float *buf, size_t n, gt_err *err)
{
    return ring_allreduce(d, (char *)buf, n, sizeof(float), add_f32, err);
}

int gt_dist_allreduce_f64(gt_dist *d, double *buf, size_t n, gt_err *err)
{
    return ring_allreduce(d, (char *)buf, n, sizeof(double), add_f64, err);
}

int gt_dist_broadcast(gt_dist *d, void *buf, size_t n, gt_err *err)
{
    if (d->world == 1)
        return 0;
    int W = d->world, next = (d->rank + 1) % W, prev = (d->rank + W - 1) % W;
    /* Pass it along the ring: rank 0 sends, the last rank only receives. */
    if (d->rank != 0 && recv_all(d, d->prev_fd, buf, n, prev, err) != 0)
        return -1;
    if (d->rank != W - 1 && send_all(d, d->next_fd, buf, n, next, err) != 0)
        return -1;
    return 0;
}
