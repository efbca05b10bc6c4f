/* net: the network probes of a multi-node run (see net.h). IPv4 and IPv6; a host name is
 * resolved with `getent ahosts`, so that the static agent needs no NSS libraries of its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/run.h"

#define NET_DEFAULT_TIMEOUT_MS 5000

/* A socket address of either family. */
struct net_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Parses a numeric address into a (port 0 unless set later). Returns 0 or -1. */
static int addr_numeric(const char *text, struct net_addr *a)
{
    struct sockaddr_in *v4 = (struct sockaddr_in *)&a->ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&a->ss;
    memset(a, 0, sizeof(*a));
    if (inet_pton(AF_INET, text, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        a->len = sizeof(*v4);
        return 0;
    }
    if (inet_pton(AF_INET6, text, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        a->len = sizeof(*v6);
        return 0;
    }
    return -1;
}

/* Resolves `host` (an address, or a name through `getent ahosts`, as the ranks' resolver would
 * see it). Returns 0 or -1 with the reason on stderr. */
static int addr_resolve(const char *host, struct net_addr *a)
{
    if (addr_numeric(host, a) == 0)
        return 0;
    if (strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") !=
        strlen(host)) {
        fprintf(stderr, "gpusync-agent net: '%s' is not a host name or address\n", host);
        return -1;
    }
    char cmd[600], first[256] = "";
    snprintf(cmd, sizeof(cmd), "getent ahosts '%s' 2>/dev/null", host);
    FILE *p = popen(cmd, "r");
    int got = p && fscanf(p, "%255s", first) == 1;
    if (p)
        pclose(p);
    if (!got || addr_numeric(first, a) < 0) {
        fprintf(stderr, "gpusync-agent net: cannot resolve '%s' on this server\n", host);
        return -1;
    }
    return 0;
}

static void addr_set_port(struct net_addr *a, int port)
{
    if (a->ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&a->ss)->sin_port = htons((unsigned short)port);
    else
        ((struct sockaddr_in6 *)&a->ss)->sin6_port = htons((unsigned short)port);
}

static void addr_print(const struct net_addr *a, char *buf, size_t cap)
{
    const void *raw = a->ss.ss_family == AF_INET
                          ? (const void *)&((const struct sockaddr_in *)&a->ss)->sin_addr
                          : (const void *)&((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
    const struct in6_addr *v6 = raw;
    if (a->ss.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(v6)) /* an IPv4 peer, as IPv4 */
        raw = &v6->s6_addr[12];
    int family = raw == (const void *)&v6->s6_addr[12] ? AF_INET : a->ss.ss_family;
    if (!inet_ntop(family, raw, buf, (socklen_t)cap))
        snprintf(buf, cap, "?");
}

/* `net src ADDR`: the local address the routing table picks to reach ADDR. */
static int net_src(const char *host)
{
    struct net_addr to, from;
    if (addr_resolve(host, &to) < 0)
        return 1;
    addr_set_port(&to, 9); /* any port: a UDP connect sends nothing */
    int s = socket(to.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    from.len = sizeof(from.ss);
    if (s < 0 || connect(s, (struct sockaddr *)&to.ss, to.len) < 0 ||
        getsockname(s, (struct sockaddr *)&from.ss, &from.len) < 0) {
        fprintf(stderr, "gpusync-agent net: no route from this server to %s: %s\n", host,
                strerror(errno));
        if (s >= 0)
            close(s);
        return 1;
    }
    close(s);
    char text[INET6_ADDRSTRLEN];
    addr_print(&from, text, sizeof(text));
    printf("%s\n", text);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* A listening socket on a free port of every address (IPv6 with IPv4 mapped where the server
 * has IPv6, else IPv4), as the run's master listens. Returns the fd and *port, or -1. */
static int listen_any(int *port)
{
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    int off = 0, s = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)) < 0 ||
                   bind(s, (struct sockaddr *)&a6, sizeof(a6)) < 0)) {
        close(s);
        s = -1;
    }
    if (s < 0 && (s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
        bind(s, (struct sockaddr *)&a4, sizeof(a4)) < 0) {
        close(s);
        s = -1;
    }
    struct net_addr got = {.len = sizeof(got.ss)};
    if (s < 0 || listen(s, 4) < 0 || getsockname(s, (struct sockaddr *)&got.ss, &got.len) < 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    *port = ntohs(got.ss.ss_family == AF_INET ? ((struct sockaddr_in *)&got.ss)->sin_port
                                              : ((struct sockaddr_in6 *)&got.ss)->sin6_port);
    return s;
}

/* `net listen`: prints "port N", waits for one connection, prints "accepted FROM". */
static int net_listen(int timeout_ms)
{
    int port, s = listen_any(&port);
    if (s < 0) {
        fprintf(stderr, "gpusync-agent net: cannot listen on a free port: %s\n", strerror(errno));
        return 1;
    }
    printf("port %d\n", port);
    fflush(stdout);
    struct pollfd p = {.fd = s, .events = POLLIN};
    int ready = poll(&p, 1, timeout_ms);
    struct net_addr from = {.len = sizeof(from.ss)};
    int c = ready > 0 ? accept(s, (struct sockaddr *)&from.ss, &from.len) : -1;
    close(s);
    if (c < 0) {
        fprintf(stderr, "gpusync-agent net: no connection to port %d within %d ms\n", port,
                timeout_ms);
        return 1;
    }
    close(c);
    char text[INET6_ADDRSTRLEN];
    addr_print(&from, text, sizeof(text));
    printf("accepted %s\n", text);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* One connect attempt within `ms`. Returns 0, or an errno value. */
static int connect_once(const struct net_addr *to, int ms)
{
    int s = socket(to->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return errno;
    int e = 0;
    if (connect(s, (const struct sockaddr *)&to->ss, to->len) < 0) {
        e = errno;
        struct pollfd p = {.fd = s, .events = POLLOUT};
        socklen_t len = sizeof(e);
        if (e == EINPROGRESS)
            e = poll(&p, 1, ms) <= 0                                ? ETIMEDOUT
                : getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len) < 0 ? errno
                                                                    : e;
    }
    close(s);
    return e;
}

/* `net connect ADDR PORT`: one connection, within the timeout (the client starts it once the
 * listener said its port, so a refusal means no listener, not a late one). */
static int net_connect(const char *host, int port, int timeout_ms)
{
    struct net_addr to;
    if (addr_resolve(host, &to) < 0)
        return 1;
    addr_set_port(&to, port);
    int e = connect_once(&to, timeout_ms);
    if (e != 0) {
        fprintf(stderr, "gpusync-agent net: cannot connect to %s port %d: %s\n", host, port,
                strerror(e));
        return 1;
    }
    printf("connected\n");
    return fflush(stdout) == 0 ? 0 : 1;
}

/* Reads "--timeout-ms MS" at argv[i] (if there). Returns the index past it, or -1. */
static int timeout_opt(int argc, char **argv, int i, int *ms)
{
    if (i >= argc)
        return i;
    char *end;
    long v = i + 1 < argc && !strcmp(argv[i], "--timeout-ms") ? strtol(argv[i + 1], &end, 10) : -1;
    if (v < 1 || v > 600000 || *end)
        return -1;
    *ms = (int)v;
    return i + 2;
}

int ga_net_main(int argc, char **argv)
{
    int ms = NET_DEFAULT_TIMEOUT_MS;
    if (argc > 2 && !strcmp(argv[1], "--root")) { /* the client's common prefix: unused here */
        argv[2] = argv[0];
        argc -= 2;
        argv += 2;
    }
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, GS_PROTO_NET_SRC) && argc == 3)
        return net_src(argv[2]);
    if (!strcmp(mode, GS_PROTO_NET_LISTEN) && timeout_opt(argc, argv, 2, &ms) == argc)
        return net_listen(ms);
    if (!strcmp(mode, GS_PROTO_NET_CONNECT) && argc >= 4 &&
        timeout_opt(argc, argv, 4, &ms) == argc) {
        char *end;
        long port = strtol(argv[3], &end, 10);
        if (!*end && port > 0 && port < 65536)
            return net_connect(argv[2], (int)port, ms);
    }
    fprintf(stderr, "usage: gpusync-agent net src ADDR | listen [--timeout-ms MS] | connect ADDR "
                    "PORT [--timeout-ms MS]\n");
    return 2;
}
