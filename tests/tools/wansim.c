/* wansim: a single-process userspace TCP proxy that adds a one-way delay and a bandwidth cap in
 * each direction and stalls, cuts or resets connections on command, standing in for netem (which
 * this kernel lacks) in gpusync's benchmarks and fault tests.
 *
 * Design: one epoll loop. Every connection is a pair of sockets (client side, target side) and two
 * directions; each direction is a FIFO of chunks stamped with the time they may leave (the
 * kernel's arrival stamp + delay). A chunk leaves when its stamp has passed, the link is not
 * stalled, and the link's "free at" time (serialisation at the capped rate; one link per
 * direction, shared round-robin by all connections) has passed. One timerfd, armed at the earliest
 * such time over all connections, wakes the loop. A direction stops reading from its source once
 * its queue holds --queue-kb, so memory per connection is bounded and the sender feels
 * backpressure through TCP, as it would behind a slow link. The control socket speaks one line per
 * command and answers one line; see usage(). */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define WANSIM_READ_MAX   (64 * 1024)
#define WANSIM_QUEUE_KB   4096
#define WANSIM_CATCHUP_NS 25000000ull /* link time a late wake-up may still reclaim */
#define WANSIM_CTL_LINE   512
#define WANSIM_EXIT_USE   2
#define WANSIM_EXIT_FAIL  1

enum ep_kind { EP_LISTEN, EP_CTL_LISTEN, EP_CTL_CLIENT, EP_TIMER, EP_SIGNAL, EP_PEER };

struct conn;

/* One registered fd. `mask` is what epoll currently watches (0: not registered). */
struct endpoint {
    enum ep_kind kind;
    int fd;
    uint32_t mask;
    struct conn *conn; /* EP_PEER only */
    int side;          /* EP_PEER: 0 client side, 1 target side */
};

/* Bytes read at one time, or (eof) the source's FIN; owned by the direction's queue. */
struct chunk {
    struct chunk *next;
    uint64_t ready_ns;
    size_t len, off;
    int eof;
    unsigned char data[];
};

/* One direction of a connection: dir[0] carries client -> target, dir[1] target -> client. */
struct dir {
    struct chunk *head, *tail;
    size_t queued;
    int src_eof;     /* source sent FIN; an eof chunk is queued or was forwarded */
    int fin_sent;    /* FIN forwarded to the destination */
    int dst_blocked; /* last send hit EAGAIN: wait for EPOLLOUT */
};

struct conn {
    struct conn *prev, *next;
    struct endpoint ep[2];
    struct dir dir[2];
    int connecting; /* non-blocking connect to the target still in progress */
    int served;     /* sent on the capped link this round: goes to the back of the line */
};

struct ctl_client {
    struct endpoint ep; /* first member: the epoll pointer doubles as the client pointer */
    struct ctl_client *prev, *next;
    char line[WANSIM_CTL_LINE];
    size_t len;
};

struct wansim {
    int epfd;
    struct endpoint listen, ctl_listen, timer, sig;
    struct sockaddr_storage listen_addr; /* with the port actually bound, for `restore` */
    socklen_t listen_len;
    struct sockaddr_storage target;
    socklen_t target_len;
    const char *ctl_path;
    uint64_t delay_ns;
    uint64_t rate_bps; /* 0: unlimited */
    size_t queue_max;
    int stalled, cut, running;
    int accept_paused; /* out of fds: the listener is unwatched until a connection closes */
    struct conn *conns, *conns_tail; /* in link service order, for round-robin fairness */
    uint64_t link_free_ns[2];        /* per direction, shared by all connections, like a link */
    struct conn *dead; /* closed this iteration; freed once no event in the batch can name them */
    struct ctl_client *ctls;
    uint64_t n_total, n_open, bytes[2];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: wansim --listen [HOST:]PORT --target HOST:PORT [--delay-ms D] [--rate-mbit R]\n"
        "              [--control PATH] [--queue-kb K]\n"
        "       wansim --ctl PATH COMMAND [ARG]\n"
        "\n"
        "A userspace TCP proxy that simulates a WAN link between its clients and TARGET.\n"
        "\n"
        "  --listen [HOST:]PORT  address to accept on (HOST defaults to 127.0.0.1; PORT 0 picks\n"
        "                        a free one). Once ready it prints one line 'port N' on stdout.\n"
        "  --target HOST:PORT    where each accepted connection is forwarded\n"
        "  --delay-ms D          one-way delay added in EACH direction (RTT grows by 2*D); "
        "default 0\n"
        "  --rate-mbit R         bandwidth cap per direction in Mbit/s (10^6 bit/s); 0 = none.\n"
        "                        All connections share it, round-robin, as they would a link\n"
        "  --control PATH        UNIX socket accepting control commands, one per line\n"
        "  --queue-kb K          bytes buffered per direction before reading stops; default "
        "%d\n"
        "  --ctl PATH CMD...     send one command to a running wansim, print its answer, exit 0\n"
        "                        if it was 'ok...', 1 otherwise\n"
        "  -h, --help            this help\n"
        "\n"
        "Control commands (each answered by one line, 'ok...' or 'error: ...'):\n"
        "  delay D    set the one-way delay in ms for data read from now on (data already\n"
        "             queued keeps its time, and order is always kept)\n"
        "  rate R     set the cap in Mbit/s (0 = none)\n"
        "  stall      stop forwarding both ways; connections stay open and data is buffered\n"
        "  resume     forward again\n"
        "  cut        close all connections abruptly; refuse new ones until 'restore'\n"
        "  restore    accept connections again\n"
        "  reset      abort all connections with a TCP RST\n"
        "  stats      'ok connections=N open=N up=BYTES down=BYTES stalled=0|1 cut=0|1'\n"
        "\n"
        "Example: wansim --listen 127.0.0.1:0 --target 127.0.0.1:22 --delay-ms 25 "
        "--rate-mbit 20 --control /tmp/w.sock\n"
        "         wansim --ctl /tmp/w.sock stall\n",
        WANSIM_QUEUE_KB);
}

/* Parses a non-negative decimal number; returns -1 on anything else. */
static int parse_nonneg(const char *s, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Resolves "[HOST:]PORT" (HOST may be [v6]) into `ss`; `def_host` is used when HOST is absent. */
static int resolve(const char *spec, const char *def_host, int passive, struct sockaddr_storage *ss,
                   socklen_t *len)
{
    char host[256];
    const char *port = spec;
    const char *colon = strrchr(spec, ':');
    snprintf(host, sizeof(host), "%s", def_host ? def_host : "");
    if (colon) {
        size_t n = (size_t)(colon - spec);
        if (n >= sizeof(host))
            return -1;
        memcpy(host, spec, n);
        host[n] = 0;
        if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
            memmove(host, host + 1, n - 2);
            host[n - 2] = 0;
        }
        port = colon + 1;
    }
    if (!host[0] || !*port)
        return -1;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    struct addrinfo *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static int port_of(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

/* Makes epoll watch exactly `want` on `ep`, registering or removing it as needed. A socket with
 * nothing to watch is removed outright so that a hung-up peer cannot spin the loop on EPOLLHUP. */
static void ep_watch(struct wansim *w, struct endpoint *ep, uint32_t want)
{
    if (ep->fd < 0 || ep->mask == want)
        return;
    struct epoll_event ev = {.events = want, .data.ptr = ep};
    int op = !ep->mask ? EPOLL_CTL_ADD : !want ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    if (epoll_ctl(w->epfd, op, ep->fd, &ev) < 0)
        fprintf(stderr, "wansim: epoll_ctl on fd %d: %s\n", ep->fd, strerror(errno));
    ep->mask = want;
}

static void ep_close(struct wansim *w, struct endpoint *ep, int rst)
{
    if (ep->fd < 0)
        return;
    ep_watch(w, ep, 0);
    if (rst) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(ep->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    close(ep->fd);
    ep->fd = -1;
}

static void dir_clear(struct dir *d)
{
    while (d->head) {
        struct chunk *k = d->head;
        d->head = k->next;
        free(k);
    }
    d->tail = NULL;
    d->queued = 0;
}

static void conn_unlink(struct wansim *w, struct conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        w->conns_tail = c->prev;
    c->prev = c->next = NULL;
}

static void conn_append(struct wansim *w, struct conn *c)
{
    c->prev = w->conns_tail;
    c->next = NULL;
    if (w->conns_tail)
        w->conns_tail->next = c;
    else
        w->conns = c;
    w->conns_tail = c;
}

/* Closes both sockets (with RST when `rst`), drops queued data, and moves `c` to the dead list. */
static void conn_close(struct wansim *w, struct conn *c, int rst)
{
    ep_close(w, &c->ep[0], rst);
    ep_close(w, &c->ep[1], rst);
    dir_clear(&c->dir[0]);
    dir_clear(&c->dir[1]);
    conn_unlink(w, c);
    if (w->accept_paused) {
        w->accept_paused = 0;
        ep_watch(w, &w->listen, EPOLLIN);
    }
    c->next = w->dead;
    w->dead = c;
    w->n_open--;
}

static void conn_close_all(struct wansim *w, int rst)
{
    while (w->conns)
        conn_close(w, w->conns, rst);
}

static int conn_is_dead(const struct conn *c)
{
    return c->ep[0].fd < 0;
}

static uint64_t ts_ns(const struct timespec *ts)
{
    return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

/* Receives into `buf` and sets *arrived to the monotonic time the kernel took in the (last)
 * segment read (SO_TIMESTAMPNS), so that a wake-up delayed by a busy CPU does not lengthen the
 * simulated delay; without a usable stamp it is `now`. */
static ssize_t recv_stamped(int fd, void *buf, size_t len, uint64_t now, uint64_t *arrived)
{
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl)};
    ssize_t n = recvmsg(fd, &mh, 0);
    *arrived = now;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n > 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
        struct timespec stamp, real, mono;
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_TIMESTAMPNS)
            continue;
        memcpy(&stamp, CMSG_DATA(cm), sizeof(stamp));
        clock_gettime(CLOCK_REALTIME, &real);
        clock_gettime(CLOCK_MONOTONIC, &mono);
        /* the stamp is wall-clock time: trust it only if it is recent and not in the future */
        uint64_t age = ts_ns(&real) - ts_ns(&stamp);
        if (ts_ns(&stamp) <= ts_ns(&real) && age < 1000000000ull && age < ts_ns(&mono))
            *arrived = ts_ns(&mono) - age;
    }
    return n;
}

/* Reads once from side `s` into dir[s]; data may leave `delay` after it arrived. */
static void conn_read(struct wansim *w, struct conn *c, int s, uint64_t now)
{
    static unsigned char buf[WANSIM_READ_MAX];
    struct dir *d = &c->dir[s];
    uint64_t arrived;
    ssize_t n = recv_stamped(c->ep[s].fd, buf, sizeof(buf), now, &arrived);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            conn_close(w, c, 1); /* the peer reset or failed: pass the abort on */
        return;
    }
    struct chunk *k = malloc(sizeof(*k) + (size_t)n);
    if (!k) {
        fprintf(stderr, "wansim: out of memory; aborting a connection\n");
        conn_close(w, c, 1);
        return;
    }
    *k = (struct chunk){.ready_ns = arrived + w->delay_ns, .len = (size_t)n, .eof = n == 0};
    memcpy(k->data, buf, (size_t)n);
    if (d->tail)
        d->tail->next = k;
    else
        d->head = k;
    d->tail = k;
    d->queued += (size_t)n;
    d->src_eof = n == 0;
}

/* Bytes one send may carry at the capped rate: about 1 ms worth, so pacing stays smooth. */
static size_t rate_quantum(uint64_t rate_bps)
{
    uint64_t q = rate_bps / 8 / 1000;
    return q < 1024 ? 1024 : q > 256 * 1024 ? 256 * 1024 : (size_t)q;
}

/* Marks `n` bytes as serialised onto link direction `s`: it is busy for n*8/rate seconds from
 * when it could first have sent them, the later of its previous free time and the data's due time.
 * Counting from then rather than from now lets a wake-up delayed by a loaded CPU catch up instead
 * of losing bandwidth; the catch-up is bounded so that a long stall does not end in a long burst.
 */
static void link_charge(struct wansim *w, int s, size_t n, uint64_t due, uint64_t now)
{
    if (!w->rate_bps)
        return;
    uint64_t base = w->link_free_ns[s] > due ? w->link_free_ns[s] : due;
    if (base + WANSIM_CATCHUP_NS < now)
        base = now - WANSIM_CATCHUP_NS;
    w->link_free_ns[s] = base + (uint64_t)n * 8ull * 1000000000ull / w->rate_bps;
}

/* Forwards what is due from dir[s] to the other side. Returns the time it next needs a wake-up
 * (0: none, it waits for data or EPOLLOUT), or UINT64_MAX when the connection was closed. */
static uint64_t dir_pump(struct wansim *w, struct conn *c, int s, uint64_t now)
{
    struct dir *d = &c->dir[s];
    int dst = c->ep[1 - s].fd;
    while (d->head && !w->stalled && !d->dst_blocked && !c->connecting) {
        struct chunk *k = d->head;
        if (k->ready_ns > now)
            return k->ready_ns;
        if (k->eof) {
            shutdown(dst, SHUT_WR);
            d->fin_sent = 1;
        } else {
            if (w->rate_bps && w->link_free_ns[s] > now)
                return w->link_free_ns[s];
            size_t n = k->len - k->off;
            if (w->rate_bps && n > rate_quantum(w->rate_bps))
                n = rate_quantum(w->rate_bps);
            ssize_t sent = send(dst, k->data + k->off, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                d->dst_blocked = 1;
                return 0;
            }
            if (sent < 0) {
                conn_close(w, c, 1);
                return UINT64_MAX;
            }
            link_charge(w, s, (size_t)sent, k->ready_ns, now);
            c->served = w->rate_bps != 0;
            w->bytes[s] += (uint64_t)sent;
            k->off += (size_t)sent;
            d->queued -= (size_t)sent;
            if (k->off < k->len)
                continue;
        }
        d->head = k->next;
        if (!d->head)
            d->tail = NULL;
        free(k);
    }
    return 0;
}

/* Watches, for side s, reading into dir[s] and writing out of dir[1-s], as their state needs. */
static void conn_watch(struct wansim *w, struct conn *c)
{
    for (int s = 0; s < 2; s++) {
        uint32_t want = 0;
        const struct dir *in = &c->dir[s], *out = &c->dir[1 - s];
        if (!in->src_eof && in->queued < w->queue_max && !(s == 1 && c->connecting))
            want |= EPOLLIN;
        if ((s == 1 && c->connecting) || out->dst_blocked)
            want |= EPOLLOUT;
        ep_watch(w, &c->ep[s], want);
    }
}

static uint64_t earliest(uint64_t a, uint64_t b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

/* Pumps both directions, closes the connection once both FINs went through, and updates what
 * epoll watches. Returns the next wake-up time (0: none). */
static uint64_t conn_pump(struct wansim *w, struct conn *c, uint64_t now)
{
    uint64_t next = 0;
    for (int s = 0; s < 2; s++) {
        uint64_t t = dir_pump(w, c, s, now);
        if (t == UINT64_MAX)
            return 0;
        next = earliest(next, t);
    }
    if (c->dir[0].fin_sent && c->dir[1].fin_sent) {
        conn_close(w, c, 0);
        return 0;
    }
    conn_watch(w, c);
    return next;
}

static void set_sockopts(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* delay is ours to add */
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
}

/* Out of file descriptors: stop watching the listener (level-triggered, it would spin) until a
 * connection closes; clients wait in the backlog meanwhile. */
static void accept_pause(struct wansim *w)
{
    if (!w->accept_paused)
        fprintf(stderr,
                "wansim: out of file descriptors (%llu connections open); new connections "
                "wait until one closes\n",
                (unsigned long long)w->n_open);
    w->accept_paused = 1;
    ep_watch(w, &w->listen, 0);
}

/* Accepts one client and starts its non-blocking connect to the target. The target socket is
 * made first so that running out of fds leaves the client waiting in the backlog, not reset. */
static void conn_accept(struct wansim *w)
{
    struct conn *c = NULL;
    int cfd = -1, sfd = socket(w->target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sfd >= 0)
        cfd = accept4(w->listen.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (sfd < 0 || cfd < 0) {
        if (errno == EMFILE || errno == ENFILE)
            accept_pause(w);
        if (sfd >= 0)
            close(sfd);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        fprintf(stderr, "wansim: out of memory; refusing a connection\n");
        goto err;
    }
    set_sockopts(cfd);
    set_sockopts(sfd);
    int rc = connect(sfd, (struct sockaddr *)&w->target, w->target_len);
    if (rc < 0 && errno != EINPROGRESS)
        goto err;
    c->connecting = rc < 0;
    c->ep[0] = (struct endpoint){.kind = EP_PEER, .fd = cfd, .conn = c, .side = 0};
    c->ep[1] = (struct endpoint){.kind = EP_PEER, .fd = sfd, .conn = c, .side = 1};
    conn_append(w, c);
    w->n_total++;
    w->n_open++;
    conn_watch(w, c);
    return;
err:
    /* refuse the client the way an unreachable target would: with a reset */
    setsockopt(cfd, SOL_SOCKET, SO_LINGER, &(struct linger){.l_onoff = 1}, sizeof(struct linger));
    close(cfd);
    close(sfd);
    free(c);
}

/* Handles readiness on one side of a connection; forwarding itself happens in conn_pump. */
static void conn_event(struct wansim *w, struct conn *c, int s, uint32_t ev, uint64_t now)
{
    if (s == 1 && c->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c->ep[1].fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            conn_close(w, c, 1);
            return;
        }
        c->connecting = 0;
        return;
    }
    if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        c->dir[1 - s].dst_blocked = 0; /* a failed peer shows up as an error on the next send */
    if (!c->dir[s].src_eof && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        conn_read(w, c, s, now);
}

/* Opens, binds and listens on w->listen_addr; records the bound port. Returns -1 with errno. */
static int listen_open(struct wansim *w)
{
    int fd = socket(w->listen_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&w->listen_addr, w->listen_len) < 0 || listen(fd, 512) < 0 ||
        getsockname(fd, (struct sockaddr *)&w->listen_addr, &w->listen_len) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    w->listen = (struct endpoint){.kind = EP_LISTEN, .fd = fd};
    ep_watch(w, &w->listen, EPOLLIN);
    return 0;
}

static int ctl_open(struct wansim *w)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(w->ctl_path) >= sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, w->ctl_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    unlink(w->ctl_path); /* a stale socket from a killed run would make bind fail */
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    w->ctl_listen = (struct endpoint){.kind = EP_CTL_LISTEN, .fd = fd};
    ep_watch(w, &w->ctl_listen, EPOLLIN);
    return 0;
}

/* Control commands. Each handler gets its argument (NULL for those without) and writes its
 * one-line answer into `out`, which holds "ok" on entry. */
typedef void ctl_fn(struct wansim *w, const char *arg, char *out, size_t outlen);

static void ctl_delay(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    double v;
    if (parse_nonneg(arg, 3600e3, &v) < 0)
        snprintf(out, outlen, "error: delay '%s' is not a number of ms in [0, 3600000]", arg);
    else
        w->delay_ns = (uint64_t)(v * 1e6); /* data already queued keeps its old stamp */
}

static void ctl_rate(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    double v;
    if (parse_nonneg(arg, 1e6, &v) < 0)
        snprintf(out, outlen, "error: rate '%s' is not a number of Mbit/s in [0, 1e6]", arg);
    else
        w->rate_bps = (uint64_t)(v * 1e6);
}

static void ctl_stall(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg, (void)out, (void)outlen;
    w->stalled = 1;
}

static void ctl_resume(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg, (void)out, (void)outlen;
    w->stalled = 0;
}

/* Closing the listener (rather than accepting and dropping) makes new connects fail with
 * ECONNREFUSED, which is what a client should see while the link is down. */
static void ctl_cut(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg, (void)out, (void)outlen;
    w->cut = 1;
    ep_close(w, &w->listen, 0);
    conn_close_all(w, 0);
}

static void ctl_restore(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg;
    if (w->cut && listen_open(w) < 0)
        snprintf(out, outlen, "error: cannot listen again on port %d: %s", port_of(&w->listen_addr),
                 strerror(errno));
    else
        w->cut = 0;
}

static void ctl_reset(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg, (void)out, (void)outlen;
    conn_close_all(w, 1);
}

static void ctl_stats(struct wansim *w, const char *arg, char *out, size_t outlen)
{
    (void)arg;
    snprintf(out, outlen, "ok connections=%llu open=%llu up=%llu down=%llu stalled=%d cut=%d",
             (unsigned long long)w->n_total, (unsigned long long)w->n_open,
             (unsigned long long)w->bytes[0], (unsigned long long)w->bytes[1], w->stalled, w->cut);
}

static const struct ctl_cmd {
    const char *name;
    int takes_arg;
    ctl_fn *fn;
} ctl_table[] = {
    {"delay", 1, ctl_delay},   {"rate", 1, ctl_rate},   {"stall", 0, ctl_stall},
    {"resume", 0, ctl_resume}, {"cut", 0, ctl_cut},     {"restore", 0, ctl_restore},
    {"reset", 0, ctl_reset},   {"stats", 0, ctl_stats},
};

/* Parses one command line and runs it; the one-line answer (no newline) goes into `out`. */
static void ctl_exec(struct wansim *w, char *line, char *out, size_t outlen)
{
    char *save, *cmd = strtok_r(line, " \t\r", &save);
    char *arg = cmd ? strtok_r(NULL, " \t\r", &save) : NULL;
    char *extra = arg ? strtok_r(NULL, " \t\r", &save) : NULL;
    if (!cmd) {
        snprintf(out, outlen, "error: empty command");
        return;
    }
    for (size_t i = 0; i < sizeof(ctl_table) / sizeof(ctl_table[0]); i++) {
        const struct ctl_cmd *c = &ctl_table[i];
        if (strcmp(cmd, c->name))
            continue;
        if (extra || (c->takes_arg ? !arg : arg != NULL)) {
            snprintf(out, outlen, "error: %s takes %s", cmd,
                     c->takes_arg ? "one number" : "no argument");
            return;
        }
        snprintf(out, outlen, "ok");
        c->fn(w, arg, out, outlen);
        return;
    }
    snprintf(out, outlen,
             "error: unknown command '%s' (commands: delay D, rate R, stall, resume, cut, restore, "
             "reset, stats)",
             cmd);
}

static void ctl_drop(struct wansim *w, struct ctl_client *cc)
{
    ep_close(w, &cc->ep, 0);
    if (cc->prev)
        cc->prev->next = cc->next;
    else
        w->ctls = cc->next;
    if (cc->next)
        cc->next->prev = cc->prev;
    free(cc);
}

/* Reads from a control client and answers every complete line; closes it on EOF or overflow. */
static void ctl_event(struct wansim *w, struct ctl_client *cc)
{
    ssize_t n = recv(cc->ep.fd, cc->line + cc->len, sizeof(cc->line) - 1 - cc->len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        ctl_drop(w, cc);
        return;
    }
    cc->len += (size_t)n;
    cc->line[cc->len] = 0;
    char *nl;
    while ((nl = memchr(cc->line, '\n', cc->len))) {
        char answer[WANSIM_CTL_LINE + 128];
        size_t used = (size_t)(nl - cc->line) + 1;
        *nl = 0;
        ctl_exec(w, cc->line, answer, sizeof(answer) - 1);
        strcat(answer, "\n");
        /* answers are short and the socket buffer empty, so one send suffices */
        send(cc->ep.fd, answer, strlen(answer), MSG_NOSIGNAL | MSG_DONTWAIT);
        memmove(cc->line, cc->line + used, cc->len - used);
        cc->len -= used;
    }
    if (cc->len == sizeof(cc->line) - 1) {
        const char *msg = "error: command line too long\n";
        send(cc->ep.fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
        ctl_drop(w, cc);
    }
}

static void ctl_accept(struct wansim *w)
{
    int fd = accept4(w->ctl_listen.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ctl_client *cc = calloc(1, sizeof(*cc));
    if (!cc) {
        close(fd);
        return;
    }
    cc->ep = (struct endpoint){.kind = EP_CTL_CLIENT, .fd = fd};
    cc->next = w->ctls;
    if (w->ctls)
        w->ctls->prev = cc;
    w->ctls = cc;
    ep_watch(w, &cc->ep, EPOLLIN);
}

/* Arms the timerfd for absolute time `at` (0 disarms it). */
static void timer_arm(struct wansim *w, uint64_t at)
{
    struct itimerspec its = {0};
    if (at) {
        its.it_value.tv_sec = (time_t)(at / 1000000000ull);
        its.it_value.tv_nsec = (long)(at % 1000000000ull);
    }
    timerfd_settime(w->timer.fd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void dispatch(struct wansim *w, struct epoll_event *ev, uint64_t now)
{
    struct endpoint *ep = ev->data.ptr;
    uint64_t junk;
    switch (ep->kind) {
    case EP_LISTEN:
        if (ep->fd >= 0)
            conn_accept(w);
        break;
    case EP_CTL_LISTEN:
        ctl_accept(w);
        break;
    case EP_CTL_CLIENT:
        ctl_event(w, (struct ctl_client *)ep);
        break;
    case EP_TIMER:
        if (read(ep->fd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
            fprintf(stderr, "wansim: timerfd read: %s\n", strerror(errno));
        break;
    case EP_SIGNAL:
        w->running = 0;
        break;
    case EP_PEER:
        if (!conn_is_dead(ep->conn))
            conn_event(w, ep->conn, ep->side, ev->events, now);
        break;
    }
}

/* The event loop: handle events, then pump every connection and sleep until the earliest due time.
 */
static void run(struct wansim *w)
{
    struct epoll_event evs[256];
    while (w->running) {
        int n = epoll_wait(w->epfd, evs, 256, -1);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "wansim: epoll_wait: %s\n", strerror(errno));
            return;
        }
        uint64_t now = now_ns(), next = 0;
        for (int i = 0; i < n; i++)
            dispatch(w, &evs[i], now);
        for (struct conn *c = w->conns, *nx; c; c = nx) {
            nx = c->next;
            c->served = 0;
            next = earliest(next, conn_pump(w, c, now));
            /* the capped link is shared: whoever just used it waits behind the others. It may
             * be pumped again at the end of this pass, which is harmless: the link is busy. */
            if (c->served && !conn_is_dead(c) && nx) {
                conn_unlink(w, c);
                conn_append(w, c);
            }
        }
        while (w->dead) {
            struct conn *c = w->dead;
            w->dead = c->next;
            free(c);
        }
        timer_arm(w, next && next <= now ? now + 1 : next);
    }
}

struct options {
    const char *listen, *target, *control;
    double delay_ms, rate_mbit, queue_kb;
};

static int die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "wansim: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'wansim --help'.\n");
    return WANSIM_EXIT_USE;
}

/* Parses argv into `o`; returns -1 to continue, or an exit status (help, errors, --ctl). */
static int parse_args(int argc, char **argv, struct options *o, const char **ctl)
{
    static const struct option longopts[] = {{"listen", required_argument, 0, 'l'},
                                             {"target", required_argument, 0, 't'},
                                             {"delay-ms", required_argument, 0, 'd'},
                                             {"rate-mbit", required_argument, 0, 'r'},
                                             {"control", required_argument, 0, 'c'},
                                             {"queue-kb", required_argument, 0, 'q'},
                                             {"ctl", required_argument, 0, 'C'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'l':
            o->listen = optarg;
            break;
        case 't':
            o->target = optarg;
            break;
        case 'c':
            o->control = optarg;
            break;
        case 'C':
            *ctl = optarg;
            return -1;
        case 'd':
            if (parse_nonneg(optarg, 3600e3, &o->delay_ms) < 0)
                return die_usage("--delay-ms: '%s' is not a number of ms in [0, 3600000]", optarg);
            break;
        case 'r':
            if (parse_nonneg(optarg, 1e6, &o->rate_mbit) < 0)
                return die_usage("--rate-mbit: '%s' is not a number of Mbit/s in [0, 1e6]", optarg);
            break;
        case 'q':
            if (parse_nonneg(optarg, 1 << 20, &o->queue_kb) < 0 || o->queue_kb < 64)
                return die_usage("--queue-kb: '%s' is not a number in [64, 1048576]", optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return die_usage("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return die_usage("unexpected argument '%s'", argv[optind]);
    if (!o->listen || !o->target)
        return die_usage("%s", "--listen and --target are both required");
    return -1;
}

/* --ctl mode: sends "CMD ARGS\n" to the control socket at `path` and prints the answer line. */
static int ctl_client_main(const char *path, int argc, char **argv)
{
    char line[WANSIM_CTL_LINE] = "", answer[WANSIM_CTL_LINE + 128];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 5};
    if (argc == 0)
        return die_usage("%s", "--ctl needs a command, e.g. 'wansim --ctl PATH stats'");
    for (int i = 0; i < argc; i++)
        snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s%s", i ? " " : "", argv[i]);
    strcat(line, "\n");
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
        fprintf(stderr, "wansim: cannot reach the control socket %s: %s (is wansim running?)\n",
                path, strerror(errno));
        return WANSIM_EXIT_FAIL;
    }
    size_t len = 0;
    ssize_t n;
    while (len < sizeof(answer) - 1 && !memchr(answer, '\n', len) &&
           (n = recv(fd, answer + len, sizeof(answer) - 1 - len, 0)) > 0)
        len += (size_t)n;
    close(fd);
    answer[len] = 0;
    if (!memchr(answer, '\n', len)) {
        fprintf(stderr, "wansim: no answer from %s\n", path);
        return WANSIM_EXIT_FAIL;
    }
    fputs(answer, stdout);
    return strncmp(answer, "ok", 2) == 0 ? 0 : WANSIM_EXIT_FAIL;
}

/* Asks the scheduler (EEVDF, Linux >= 6.12) for a 0.1 ms slice. A short slice gives an earlier
 * virtual deadline, so a wake-up preempts CPU-bound neighbours (compilers on a small shared box)
 * instead of queueing behind them, which would add milliseconds to the simulated delay. It needs
 * no privilege and changes nothing but latency; older kernels refuse it, which is harmless. */
static void sched_prefer_latency(void)
{
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } attr = {.size = sizeof(attr), .policy = 0 /* SCHED_OTHER */, .runtime = 100000};
#ifdef SYS_sched_setattr
    syscall(SYS_sched_setattr, 0, &attr, 0);
#else
    (void)attr;
#endif
}

/* Sets up signals, the timer, the listener and the control socket from `o`. */
static int setup(struct wansim *w, const struct options *o)
{
    sigset_t set;
    struct rlimit rl;
    signal(SIGPIPE, SIG_IGN);
    sched_prefer_latency();
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    /* many concurrent connections need two fds each */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->timer = (struct endpoint){.kind = EP_TIMER,
                                 .fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)};
    w->sig = (struct endpoint){.kind = EP_SIGNAL, .fd = signalfd(-1, &set, SFD_CLOEXEC)};
    if (w->epfd < 0 || w->timer.fd < 0 || w->sig.fd < 0) {
        fprintf(stderr, "wansim: cannot set up the event loop: %s\n", strerror(errno));
        return -1;
    }
    ep_watch(w, &w->timer, EPOLLIN);
    ep_watch(w, &w->sig, EPOLLIN);
    if (listen_open(w) < 0) {
        fprintf(stderr, "wansim: cannot listen on %s: %s\n", o->listen, strerror(errno));
        return -1;
    }
    if (o->control && ctl_open(w) < 0) {
        fprintf(stderr, "wansim: cannot create control socket %s: %s\n", o->control,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* True when the target is the proxy's own listening address (same port, same or wildcard host). */
static int targets_itself(const struct wansim *w)
{
    const struct sockaddr_storage *l = &w->listen_addr, *t = &w->target;
    if (l->ss_family != t->ss_family || port_of(l) != port_of(t))
        return 0;
    if (l->ss_family == AF_INET) {
        in_addr_t la = ((const struct sockaddr_in *)l)->sin_addr.s_addr;
        return la == htonl(INADDR_ANY) || la == ((const struct sockaddr_in *)t)->sin_addr.s_addr;
    }
    const struct in6_addr *la6 = &((const struct sockaddr_in6 *)l)->sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(la6) ||
           !memcmp(la6, &((const struct sockaddr_in6 *)t)->sin6_addr, sizeof(*la6));
}

int main(int argc, char **argv)
{
    struct options o = {0};
    const char *ctl = NULL;
    o.queue_kb = WANSIM_QUEUE_KB;
    int rc = parse_args(argc, argv, &o, &ctl);
    if (ctl)
        return ctl_client_main(ctl, argc - optind, argv + optind);
    if (rc >= 0)
        return rc;
    static struct wansim w;
    w.running = 1;
    w.delay_ns = (uint64_t)(o.delay_ms * 1e6);
    w.rate_bps = (uint64_t)(o.rate_mbit * 1e6);
    w.queue_max = (size_t)o.queue_kb * 1024;
    w.ctl_path = o.control;
    w.listen.fd = w.ctl_listen.fd = -1;
    if (resolve(o.listen, "127.0.0.1", 1, &w.listen_addr, &w.listen_len) < 0)
        return die_usage("--listen: cannot resolve '%s' (want [HOST:]PORT)", o.listen);
    if (resolve(o.target, NULL, 0, &w.target, &w.target_len) < 0)
        return die_usage("--target: cannot resolve '%s' (want HOST:PORT)", o.target);
    if (setup(&w, &o) < 0)
        return WANSIM_EXIT_FAIL;
    if (targets_itself(&w)) {
        fprintf(stderr,
                "wansim: --target %s is wansim's own --listen address; it would connect "
                "to itself forever\n",
                o.target);
        return WANSIM_EXIT_USE;
    }
    printf("port %d\n", port_of(&w.listen_addr));
    fflush(stdout);
    run(&w);
    conn_close_all(&w, 0);
    while (w.dead) {
        struct conn *c = w.dead;
        w.dead = c->next;
        free(c);
    }
    while (w.ctls)
        ctl_drop(&w, w.ctls);
    if (w.ctl_path)
        unlink(w.ctl_path);
    return 0;
}
