/* test_wansim: integration tests of the WAN simulator through its harness, against a small
 * threaded echo / source / sink server that each test starts on 127.0.0.1. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "wansim_harness.h"

#define SRV_MAX_CONNS 256
#define IO_TIMEOUT_MS 10000

/* ---- a local test server: echo, source (sends a payload then closes) or sink ---- */

enum srv_mode { SRV_ECHO, SRV_SOURCE, SRV_SINK };

struct srv {
    enum srv_mode mode;
    const unsigned char *payload; /* SRV_SOURCE: borrowed, outlives the server */
    size_t payload_len;
    int lfd, port;
    pthread_t acceptor;
    pthread_mutex_t mu;
    int nconns;
    int fds[SRV_MAX_CONNS];
    pthread_t threads[SRV_MAX_CONNS];
};

struct srv_conn {
    struct srv *srv;
    int fd;
};

static void srv_serve_echo(int fd)
{
    char buf[65536];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        for (ssize_t off = 0, w; off < n; off += w)
            if ((w = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL)) <= 0)
                return;
}

static void *srv_conn_main(void *arg)
{
    struct srv_conn sc = *(struct srv_conn *)arg;
    free(arg);
    char buf[65536];
    if (sc.srv->mode == SRV_ECHO)
        srv_serve_echo(sc.fd);
    else if (sc.srv->mode == SRV_SINK)
        while (recv(sc.fd, buf, sizeof(buf), 0) > 0)
            ;
    else
        for (size_t off = 0; off < sc.srv->payload_len;) {
            ssize_t w = send(sc.fd, sc.srv->payload + off, sc.srv->payload_len - off, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
    shutdown(sc.fd, SHUT_WR); /* the fd itself is closed by srv_stop, after this thread ends */
    return NULL;
}

static void *srv_accept_main(void *arg)
{
    struct srv *s = arg;
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            return NULL; /* srv_stop shut the listener down */
        struct srv_conn *sc = malloc(sizeof(*sc));
        *sc = (struct srv_conn){.srv = s, .fd = fd};
        pthread_mutex_lock(&s->mu);
        if (s->nconns == SRV_MAX_CONNS ||
            pthread_create(&s->threads[s->nconns], NULL, srv_conn_main, sc) != 0) {
            close(fd);
            free(sc);
        } else {
            s->fds[s->nconns++] = fd;
        }
        pthread_mutex_unlock(&s->mu);
    }
}

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

static struct srv *srv_start(enum srv_mode mode, const unsigned char *payload, size_t len)
{
    struct srv *s = calloc(1, sizeof(*s));
    struct sockaddr_in sa = loopback(0);
    socklen_t sl = sizeof(sa);
    assert_non_null(s);
    *s = (struct srv){.mode = mode, .payload = payload, .payload_len = len};
    pthread_mutex_init(&s->mu, NULL);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(s->lfd, 512), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&sa, &sl), 0);
    s->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&s->acceptor, NULL, srv_accept_main, s), 0);
    return s;
}

static void srv_stop(struct srv *s)
{
    shutdown(s->lfd, SHUT_RDWR); /* wakes the blocked accept */
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    for (int i = 0; i < s->nconns; i++) {
        shutdown(s->fds[i], SHUT_RDWR);
        pthread_join(s->threads[i], NULL);
        close(s->fds[i]);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- fixture: one server and one wansim in front of it ---- */

struct fixture {
    struct srv *srv;
    struct wansim_proc w;
    int w_running;
};

static int fx_setup(void **state)
{
    *state = calloc(1, sizeof(struct fixture));
    return *state ? 0 : -1;
}

static int fx_teardown(void **state)
{
    struct fixture *fx = *state;
    /* a crash, sanitizer report or hang in wansim shows up as a non-zero stop status */
    int rc = fx->w_running && wansim_stop(&fx->w) != 0 ? -1 : 0;
    if (fx->srv)
        srv_stop(fx->srv);
    free(fx);
    return rc;
}

static void fx_start(struct fixture *fx, enum srv_mode mode, const unsigned char *payload,
                     size_t len, double delay_ms, double rate_mbit)
{
    char err[512];
    fx->srv = srv_start(mode, payload, len);
    struct wansim_opts o = {
        .target_port = fx->srv->port, .delay_ms = delay_ms, .rate_mbit = rate_mbit};
    if (wansim_start(&fx->w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim_start: %s", err);
    fx->w_running = 1;
}

static void fx_command(struct fixture *fx, const char *cmd)
{
    char reply[600];
    if (wansim_command(&fx->w, cmd, reply, sizeof(reply)) < 0)
        fail_msg("'%s' answered: %s", cmd, reply);
}

/* ---- client helpers ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Connects to 127.0.0.1:port; returns the fd, or -1 with errno set. */
static int tcp_connect(int port)
{
    struct sockaddr_in sa = loopback(port);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Receives exactly len bytes within timeout_ms; returns len, or what recv/poll last returned. */
static ssize_t recv_exact(int fd, void *buf, size_t len, int timeout_ms)
{
    size_t got = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (got < len) {
        int r = poll(&p, 1, timeout_ms);
        if (r <= 0)
            return r;
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0)
            return n;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Sends `len` bytes and receives `inlen` bytes at the same time, so that neither side of a
 * pipelined exchange can block the other. Returns 0 once all is sent and received, -1 on error. */
static int exchange(int fd, const unsigned char *out, size_t len, unsigned char *in, size_t inlen)
{
    size_t sent = 0, got = 0;
    while (got < inlen) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (sent < len ? POLLOUT : 0)};
        if (poll(&p, 1, IO_TIMEOUT_MS) <= 0)
            return -1;
        if ((p.revents & POLLOUT) && sent < len) {
            ssize_t w = send(fd, out + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN)
                return -1;
            sent += w > 0 ? (size_t)w : 0;
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(fd, in + got, inlen - got, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN))
                return -1;
            got += n > 0 ? (size_t)n : 0;
        }
    }
    return sent == len ? 0 : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Wall-clock ms of a timespec; used only for differences between close stamps. */
static double timespec_ms(const struct timespec *ts)
{
    return (double)ts->tv_sec * 1e3 + (double)ts->tv_nsec / 1e6;
}

/* Receives exactly `len` bytes and returns the kernel's arrival stamp (SO_TIMESTAMPNS, wall clock)
 * of the last segment, in ms, or a negative value on error or timeout. Stamping in the kernel
 * keeps this process's own wake-up latency out of the measurement. */
static double recv_exact_stamped(int fd, unsigned char *buf, size_t len)
{
    double stamp = -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (size_t got = 0; got < len;) {
        union {
            char buf[CMSG_SPACE(sizeof(struct timespec))];
            struct cmsghdr align;
        } ctl;
        struct iovec iov = {.iov_base = buf + got, .iov_len = len - got};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = ctl.buf,
                            .msg_controllen = sizeof(ctl)};
        if (poll(&p, 1, IO_TIMEOUT_MS) <= 0)
            return -1;
        ssize_t n = recvmsg(fd, &mh, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
                stamp = timespec_ms(&ts);
            }
    }
    return stamp;
}

/* Median round-trip time in ms of `n` 32-byte ping-pongs on an echo connection: from just before
 * the send to the reply's arrival in the kernel. */
static double median_rtt_ms(int fd, int n)
{
    double samples[64];
    unsigned char msg[32], back[32];
    int one = 1;
    assert_true(n <= 64);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)), 0);
    for (int i = 0; i < n; i++) {
        struct timespec t0;
        memset(msg, 'a' + i % 26, sizeof(msg));
        clock_gettime(CLOCK_REALTIME, &t0);
        assert_int_equal(send(fd, msg, sizeof(msg), MSG_NOSIGNAL), sizeof(msg));
        double arrived = recv_exact_stamped(fd, back, sizeof(back));
        assert_true(arrived > 0);
        samples[i] = arrived - timespec_ms(&t0);
        assert_memory_equal(msg, back, sizeof(msg));
    }
    qsort(samples, (size_t)n, sizeof(double), cmp_double);
    return (samples[(n - 1) / 2] + samples[n / 2]) / 2;
}

/* A timing measurement: one attempt on its own connection(s), returning the measured value. */
typedef double measure_fn(struct fixture *fx);

/* Asserts that `fn` measures within 10% of `expected`. Too fast fails at once: wansim must never
 * deliver sooner or faster than its setting. Too slow is retried (up to `attempts` in all),
 * because on a small shared machine CPU starvation of the proxy, the test or its server only
 * ever makes a measurement slower; a proxy that is really too slow fails every attempt. For a
 * rate, pass `higher_is_faster` so that "too fast" means above the cap. */
static void assert_within_10pct(measure_fn *fn, struct fixture *fx, double expected,
                                int higher_is_faster, int attempts, const char *what)
{
    for (int attempt = 1;; attempt++) {
        double m = fn(fx);
        int too_fast = higher_is_faster ? m > expected * 1.1 : m < expected * 0.9;
        print_message("%s: measured %.2f, expected %.2f (%+.1f%%), attempt %d\n", what, m, expected,
                      (m - expected) / expected * 100, attempt);
        if (too_fast)
            fail_msg("%s: measured %.2f, faster than %.2f allows", what, m, expected);
        if (m >= expected * 0.9 && m <= expected * 1.1)
            return;
        if (attempt == attempts)
            fail_msg("%s: measured %.2f, slower than %.2f in all %d attempts", what, m, expected,
                     attempts);
    }
}

static void fill_random(unsigned char *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (unsigned char)(x >> 24);
    }
}

static void ping(int fd)
{
    unsigned char back[4];
    assert_int_equal(send(fd, "ping", 4, MSG_NOSIGNAL), 4);
    assert_int_equal(recv_exact(fd, back, 4, IO_TIMEOUT_MS), 4);
    assert_memory_equal(back, "ping", 4);
}

/* ---- tests ---- */

static int rtt_fd; /* the echo connection measure_rtt uses */

static double measure_rtt(struct fixture *fx)
{
    (void)fx;
    return median_rtt_ms(rtt_fd, 20);
}

static void test_wansim__rtt_is_twice_the_delay_and_follows_the_delay_command(void **state)
{
    struct fixture *fx = *state;
    fx_start(fx, SRV_ECHO, NULL, 0, 25, 0);
    rtt_fd = tcp_connect(fx->w.port);
    assert_true(rtt_fd >= 0);
    ping(rtt_fd); /* the first exchange may also wait for the proxy's connect to the target */
    assert_within_10pct(measure_rtt, fx, 50, 0, 4, "RTT (ms) at delay 25");
    fx_command(fx, "delay 40");
    assert_within_10pct(measure_rtt, fx, 80, 0, 3, "RTT (ms) after 'delay 40'");
    close(rtt_fd);
}

enum { RATE_LEN = 5000000 };

/* Downloads RATE_LEN bytes from a SRV_SOURCE server through wansim; returns Mbit/s. */
static double measure_download(struct fixture *fx)
{
    unsigned char *got = malloc(RATE_LEN);
    assert_non_null(got);
    double t0 = now_ms();
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    assert_int_equal(recv_exact(fd, got, RATE_LEN, IO_TIMEOUT_MS), RATE_LEN);
    double secs = (now_ms() - t0) / 1e3;
    assert_memory_equal(fx->srv->payload, got, RATE_LEN);
    close(fd);
    free(got);
    return RATE_LEN * 8 / secs / 1e6;
}

static void test_wansim__rate_caps_the_download(void **state)
{
    struct fixture *fx = *state;
    unsigned char *payload = malloc(RATE_LEN);
    assert_non_null(payload);
    fill_random(payload, RATE_LEN, 7);
    fx_start(fx, SRV_SOURCE, payload, RATE_LEN, 0, 20);
    assert_within_10pct(measure_download, fx, 20, 1, 2, "download rate (Mbit/s) at rate 20");
    srv_stop(fx->srv); /* before the payload it borrows goes */
    fx->srv = NULL;
    free(payload);
}

/* Uploads RATE_LEN bytes to a SRV_SINK server through wansim and waits for the sink's FIN, which
 * it sends once it has read everything; returns Mbit/s. */
static double measure_upload(struct fixture *fx)
{
    static unsigned char payload[RATE_LEN];
    unsigned char eof;
    double t0 = now_ms();
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    for (size_t off = 0; off < RATE_LEN;) {
        ssize_t w = send(fd, payload + off, RATE_LEN - off, MSG_NOSIGNAL);
        assert_true(w > 0);
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    assert_int_equal(recv_exact(fd, &eof, 1, IO_TIMEOUT_MS), 0);
    double secs = (now_ms() - t0) / 1e3;
    close(fd);
    return RATE_LEN * 8 / secs / 1e6;
}

static void test_wansim__rate_caps_the_upload(void **state)
{
    struct fixture *fx = *state;
    fx_start(fx, SRV_SINK, NULL, 0, 0, 20);
    assert_within_10pct(measure_upload, fx, 20, 1, 2, "upload rate (Mbit/s) at rate 20");
}

/* Reads two sockets to EOF at once; returns 0 and each one's finish time (ms since t0). */
static int drain_both(const int fd[2], size_t want, double t0, double done_ms[2])
{
    static char buf[65536];
    size_t got[2] = {0, 0};
    int open = 2;
    while (open) {
        struct pollfd p[2] = {{.fd = done_ms[0] ? -1 : fd[0], .events = POLLIN},
                              {.fd = done_ms[1] ? -1 : fd[1], .events = POLLIN}};
        if (poll(p, 2, IO_TIMEOUT_MS) <= 0)
            return -1;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            ssize_t n = recv(fd[i], buf, sizeof(buf), 0);
            if (n < 0)
                return -1;
            got[i] += (size_t)n;
            if (n == 0) {
                done_ms[i] = now_ms() - t0;
                open--;
            }
        }
    }
    return got[0] == want && got[1] == want ? 0 : -1;
}

/* Two concurrent downloads of RATE_LEN / 2 each; asserts both finish at about the same time (a
 * fair share; serving one first would finish it at half the time) and returns total Mbit/s. */
static double measure_two_downloads(struct fixture *fx)
{
    double done_ms[2] = {0, 0};
    double t0 = now_ms();
    int fd[2] = {tcp_connect(fx->w.port), tcp_connect(fx->w.port)};
    assert_true(fd[0] >= 0 && fd[1] >= 0);
    assert_int_equal(drain_both(fd, RATE_LEN / 2, t0, done_ms), 0);
    double last = done_ms[0] > done_ms[1] ? done_ms[0] : done_ms[1];
    double first = done_ms[0] + done_ms[1] - last;
    print_message("finish times: %.0f ms and %.0f ms\n", first, last);
    assert_true(first > 0.8 * last);
    close(fd[0]);
    close(fd[1]);
    return RATE_LEN * 8 / (last / 1e3) / 1e6;
}

static void test_wansim__connections_share_the_rate_fairly(void **state)
{
    struct fixture *fx = *state;
    unsigned char *payload = calloc(1, RATE_LEN / 2);
    assert_non_null(payload);
    fx_start(fx, SRV_SOURCE, payload, RATE_LEN / 2, 0, 20);
    assert_within_10pct(measure_two_downloads, fx, 20, 1, 2, "two downloads together (Mbit/s)");
    srv_stop(fx->srv);
    fx->srv = NULL;
    free(payload);
}

static void test_wansim__stall_holds_data_and_resume_delivers_it_in_order(void **state)
{
    struct fixture *fx = *state;
    enum { MSGS = 100, MSG = 1000 };
    static unsigned char sent[MSGS * MSG], got[MSGS * MSG];
    char reply[600];
    fx_start(fx, SRV_ECHO, NULL, 0, 5, 0);
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    ping(fd);
    fx_command(fx, "stall");
    for (int i = 0; i < MSGS; i++) {
        memset(sent + i * MSG, i, MSG);
        assert_int_equal(send(fd, sent + i * MSG, MSG, MSG_NOSIGNAL), MSG);
    }
    /* nothing may come back while stalled: 200 ms is 20 times the RTT */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 200), 0);
    assert_int_equal(wansim_command(&fx->w, "stats", reply, sizeof(reply)), 0);
    assert_non_null(strstr(reply, "stalled=1"));
    assert_non_null(strstr(reply, "open=1"));
    fx_command(fx, "resume");
    assert_int_equal(recv_exact(fd, got, sizeof(got), IO_TIMEOUT_MS), sizeof(got));
    assert_memory_equal(sent, got, sizeof(got));
    close(fd);
}

static void test_wansim__cut_closes_connections_and_refuses_new_ones_until_restore(void **state)
{
    struct fixture *fx = *state;
    unsigned char c;
    fx_start(fx, SRV_ECHO, NULL, 0, 1, 0);
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    ping(fd);
    fx_command(fx, "cut");
    assert_true(recv_exact(fd, &c, 1, IO_TIMEOUT_MS) == 0 || errno == ECONNRESET);
    close(fd);
    assert_int_equal(tcp_connect(fx->w.port), -1);
    assert_int_equal(errno, ECONNREFUSED);
    fx_command(fx, "restore");
    fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    ping(fd);
    close(fd);
}

static void test_wansim__reset_gives_the_client_econnreset(void **state)
{
    struct fixture *fx = *state;
    unsigned char c;
    fx_start(fx, SRV_ECHO, NULL, 0, 1, 0);
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    ping(fd);
    fx_command(fx, "reset");
    errno = 0;
    assert_int_equal(recv_exact(fd, &c, 1, IO_TIMEOUT_MS), -1);
    assert_int_equal(errno, ECONNRESET);
    close(fd);
    /* reset, unlike cut, keeps accepting */
    fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    ping(fd);
    close(fd);
}

static void test_wansim__random_payload_arrives_intact_under_delay_and_rate(void **state)
{
    struct fixture *fx = *state;
    enum { LEN = 4 << 20 };
    unsigned char *out = malloc(LEN), *in = malloc(LEN);
    assert_non_null(out);
    assert_non_null(in);
    fill_random(out, LEN, 12345);
    fx_start(fx, SRV_ECHO, NULL, 0, 10, 100);
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    assert_int_equal(exchange(fd, out, LEN, in, LEN), 0);
    assert_memory_equal(out, in, LEN);
    close(fd);
    free(out);
    free(in);
}

static void test_wansim__many_connections_echo_concurrently(void **state)
{
    struct fixture *fx = *state;
    enum { N = 100 };
    int fds[N];
    char msg[32], back[32], reply[600];
    unsigned long long total = 0;
    fx_start(fx, SRV_ECHO, NULL, 0, 10, 0);
    for (int i = 0; i < N; i++) {
        fds[i] = tcp_connect(fx->w.port);
        assert_true(fds[i] >= 0);
    }
    for (int i = 0; i < N; i++) {
        snprintf(msg, sizeof(msg), "connection %04d", i);
        assert_int_equal(send(fds[i], msg, sizeof(msg), MSG_NOSIGNAL), sizeof(msg));
    }
    for (int i = 0; i < N; i++) {
        snprintf(msg, sizeof(msg), "connection %04d", i);
        assert_int_equal(recv_exact(fds[i], back, sizeof(back), IO_TIMEOUT_MS), sizeof(back));
        assert_memory_equal(msg, back, sizeof(msg));
    }
    assert_int_equal(wansim_command(&fx->w, "stats", reply, sizeof(reply)), 0);
    assert_int_equal(sscanf(reply, "ok connections=%llu", &total), 1);
    assert_int_equal(total, N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
}

static void test_wansim__unreachable_target_resets_the_client(void **state)
{
    struct fixture *fx = *state;
    char err[512];
    unsigned char c;
    /* a port that was just free: bind, read it, close */
    struct sockaddr_in sa = loopback(0);
    socklen_t sl = sizeof(sa);
    int tmp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(tmp, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(tmp, (struct sockaddr *)&sa, &sl), 0);
    close(tmp);
    struct wansim_opts o = {.target_port = ntohs(sa.sin_port)};
    if (wansim_start(&fx->w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim_start: %s", err);
    fx->w_running = 1;
    int fd = tcp_connect(fx->w.port);
    assert_true(fd >= 0);
    errno = 0;
    assert_int_equal(recv_exact(fd, &c, 1, IO_TIMEOUT_MS), -1);
    assert_int_equal(errno, ECONNRESET);
    close(fd);
}

/* Runs `wansim ARGS` with stdout captured; returns its exit status and the first output line. */
static int run_wansim(const char *args, char *line, size_t len)
{
    char bin[4096], err[512], cmd[8192];
    if (wansim_binary(NULL, bin, sizeof(bin), err, sizeof(err)) < 0)
        fail_msg("%s", err);
    snprintf(cmd, sizeof(cmd), "'%s' %s 2>/dev/null", bin, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    line[0] = 0;
    if (!fgets(line, (int)len, f))
        line[0] = 0;
    while (fgetc(f) != EOF)
        ;
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_wansim__ctl_mode_prints_the_answer_and_bad_flags_exit_2(void **state)
{
    struct fixture *fx = *state;
    char line[600], args[300];
    fx_start(fx, SRV_ECHO, NULL, 0, 0, 0);
    snprintf(args, sizeof(args), "--ctl '%s' stats", fx->w.ctl_path);
    assert_int_equal(run_wansim(args, line, sizeof(line)), 0);
    assert_int_equal(strncmp(line, "ok connections=0 ", 17), 0);
    snprintf(args, sizeof(args), "--ctl '%s' rate fast", fx->w.ctl_path);
    assert_int_equal(run_wansim(args, line, sizeof(line)), 1);
    assert_int_equal(strncmp(line, "error: ", 7), 0);
    assert_int_equal(
        run_wansim("--listen 0 --target 127.0.0.1:1 --no-such-flag", line, sizeof(line)), 2);
    assert_int_equal(
        run_wansim("--listen 0 --target 127.0.0.1:1 --delay-ms -3", line, sizeof(line)), 2);
    assert_int_equal(run_wansim("--help", line, sizeof(line)), 0);
    assert_int_equal(strncmp(line, "usage: wansim", 13), 0);
}

/* Asks for a 0.1 ms EEVDF slice (Linux >= 6.12; refused harmlessly elsewhere), inherited by the
 * server threads and the wansim child: on a small shared machine, a woken echo thread would
 * otherwise wait behind compilers for milliseconds, which the RTT test would blame on wansim. */
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

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
    sched_prefer_latency();
    const struct CMUnitTest tests[] = {
        T(test_wansim__rtt_is_twice_the_delay_and_follows_the_delay_command),
        T(test_wansim__rate_caps_the_download),
        T(test_wansim__rate_caps_the_upload),
        T(test_wansim__connections_share_the_rate_fairly),
        T(test_wansim__stall_holds_data_and_resume_delivers_it_in_order),
        T(test_wansim__cut_closes_connections_and_refuses_new_ones_until_restore),
        T(test_wansim__reset_gives_the_client_econnreset),
        T(test_wansim__random_payload_arrives_intact_under_delay_and_rate),
        T(test_wansim__many_connections_echo_concurrently),
        T(test_wansim__unreachable_target_resets_the_client),
        T(test_wansim__ctl_mode_prints_the_answer_and_bad_flags_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
