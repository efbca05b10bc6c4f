/* The resident listener (resident.h): starting it detached from `serve`, and the listener's loop,
 * which hands each connection, after its OPEN frame, to a fresh `serve` of the same binary. */
/* POSIX.1-2008 with XSI (fexecve, readlink); _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "resident.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/sync.h"

extern char **environ;

#define SOCKET_MAX  (sizeof(((struct sockaddr_un *)0)->sun_path))
#define OPEN_MAX_IN (GS_PROTO_HDR + 4 + GS_PROTO_MAX_PATH) /* the largest OPEN frame */

/* ---- where: ~/.gpusync/run/<this binary's name>.sock --------------------------------------- */

/* This binary's path, from /proc (a content-named build under ~/.gpusync/bin). */
static int self_path(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return -1;
    out[n] = '\0';
    return 0;
}

/* Makes dir if missing and checks that it is ours alone: a socket in it can then only be ours. */
static int private_dir(const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -1;
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return -1;
    return 0;
}

/* This machine's name as a file name part: a home shared over NFS by several servers holds one
 * socket per server (a socket works only on the machine that made it), and their listeners'
 * locks do not collide. */
static void host_part(char *out, size_t cap)
{
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
        snprintf(host, sizeof(host), "localhost");
    size_t n = 0;
    for (const char *c = host; *c && n + 1 < cap; c++)
        out[n++] = (isalnum((unsigned char)*c) || *c == '.' || *c == '-') ? *c : '_';
    out[n] = '\0';
}

/* The socket's path for this build on this machine (and, with suffix ".lock", its lock file's):
 * ~/.gpusync/run/HOST-gpusync-agent-KEY.sock. */
static int socket_path(const char *self, const char *suffix, char *out, size_t cap)
{
    const char *home = getenv("HOME");
    const char *name = strrchr(self, '/');
    name = name ? name + 1 : self;
    if (!home || home[0] != '/')
        return -1;
    char dir[4096], host[64];
    snprintf(dir, sizeof(dir), "%s/.gpusync", home);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -1;
    int n = snprintf(dir, sizeof(dir), "%s/.gpusync/run", home);
    if (n <= 0 || (size_t)n >= sizeof(dir) || private_dir(dir) < 0)
        return -1;
    host_part(host, sizeof(host));
    n = snprintf(out, cap, "%s/%s-%s%s", dir, host, name, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* ---- starting it ------------------------------------------------------------------------- */

/* Closes every descriptor from 3 up: the listener must not keep the session's pipes open, or
 * sshd would wait for them. */
static void close_inherited(void)
{
    int fds[256], n;
    do { /* in rounds: closing while reading /proc/self/fd would change what it lists */
        DIR *d = opendir("/proc/self/fd");
        if (!d) {
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            return;
        }
        int own = dirfd(d);
        struct dirent *e;
        n = 0;
        while (n < 256 && (e = readdir(d))) {
            int fd = atoi(e->d_name);
            if (fd >= 3 && fd != own)
                fds[n++] = fd;
        }
        closedir(d);
        for (int i = 0; i < n; i++)
            close(fds[i]);
    } while (n == 256);
}

/* Runs `self listen --socket path` in a new session, its parent gone, stdio on /dev/null. */
static int spawn_listener(const char *self, const char *path)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setsid();
        if (fork() != 0)
            _exit(0);
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++)
            dup2(null, fd);
        close_inherited();
        signal(SIGPIPE, SIG_DFL);
        char *argv[] = {(char *)self, "listen", "--socket", (char *)path, NULL};
        execv(self, argv);
        _exit(127);
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

/* Whether this binary is an installed build, named by its content (~/.gpusync/bin/gpusync-agent-
 * KEY): the socket's name is then this build's alone. Another (a build tree's gpusync-agent) gets
 * no listener, since two different builds of that name would share one. */
static int content_named(const char *self)
{
    const char *name = strrchr(self, '/');
    name = name ? name + 1 : self;
    return strncmp(name, "gpusync-agent-", 14) == 0 && name[14] != '\0';
}

/* Opens the lock file that a running listener holds. */
static int open_lock(const char *self)
{
    char lock[SOCKET_MAX + 8];
    if (socket_path(self, ".lock", lock, sizeof(lock)) < 0)
        return -1;
    return open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
}

int ga_resident_offer(char *path, size_t cap)
{
    char self[4096];
    path[0] = '\0';
    if (self_path(self, sizeof(self)) < 0 || !content_named(self) ||
        socket_path(self, ".sock", path, cap) < 0 || strlen(path) >= SOCKET_MAX) {
        path[0] = '\0';
        return -1;
    }
    int fd = open_lock(self);
    if (fd < 0) {
        path[0] = '\0';
        return -1;
    }
    int running = flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    close(fd); /* a lock we took is dropped here, for the listener to take */
    if (!running && spawn_listener(self, path) < 0) {
        path[0] = '\0';
        return -1;
    }
    return running;
}

/* ---- one connection: its OPEN frame, then `serve` ------------------------------------------ */

/* Reads exactly n bytes before the deadline (never more: what follows OPEN is serve's). */
static int read_exact(int fd, uint8_t *p, size_t n, time_t deadline)
{
    while (n > 0) {
        int left_ms = (int)(deadline - time(NULL)) * 1000;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left_ms <= 0 || poll(&pfd, 1, left_ms) <= 0)
            return -1;
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Reads the OPEN frame and copies its root (an absolute path, no NUL) into root. */
static int read_open(int fd, char *root, size_t cap)
{
    static uint8_t in[OPEN_MAX_IN];
    time_t deadline = time(NULL) + GA_RESIDENT_OPEN_S;
    if (read_exact(fd, in, 4, deadline) < 0)
        return -1;
    uint32_t len = (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
    if (len < 5 || len > sizeof(in) - 4 || read_exact(fd, in + 4, len, deadline) < 0)
        return -1;
    struct gs_proto_frame f;
    struct gs_proto_msg m;
    if (gs_proto_parse_frame(in, len + 4, &f) != (long)len + 4 || f.type != GS_MSG_OPEN ||
        gs_proto_decode(&f, &m) < 0)
        return -1;
    if (m.data.len == 0 || m.data.len >= cap || m.data.p[0] != '/' ||
        memchr(m.data.p, '\0', m.data.len))
        return -1;
    memcpy(root, m.data.p, m.data.len);
    root[m.data.len] = '\0';
    return 0;
}

/* In the child for one connection: becomes `serve --root ROOT` on it, or exits. */
static void serve_connection(int conn, int self_fd, const char *self)
{
    static char root[GS_PROTO_MAX_PATH + 1];
    signal(SIGCHLD, SIG_DFL);
    if (read_open(conn, root, sizeof(root)) < 0)
        _exit(2);
    if (dup2(conn, 0) < 0 || dup2(conn, 1) < 0)
        _exit(1);
    if (conn > 1)
        close(conn);
    char *argv[] = {(char *)self, "serve", "--root", root, NULL};
    fexecve(self_fd, argv, environ); /* the binary we run, even if its file was replaced */
    _exit(127);
}

/* ---- the listener ------------------------------------------------------------------------ */

struct listener {
    const char *path;
    int fd, lock_fd, self_fd;
    char self[4096];
    ino_t ino;
    time_t last_used;
};

static int listen_on(struct listener *l)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (strlen(l->path) >= sizeof(addr.sun_path))
        return -1;
    strcpy(addr.sun_path, l->path);
    unlink(l->path); /* a dead listener's: we hold the lock, so no live one has it */
    l->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (l->fd < 0)
        return -1;
    fcntl(l->fd, F_SETFD, FD_CLOEXEC);
    mode_t old = umask(077);
    int rc = bind(l->fd, (struct sockaddr *)&addr, sizeof(addr));
    umask(old);
    struct stat st;
    if (rc < 0 || listen(l->fd, 64) < 0 || stat(l->path, &st) < 0)
        return -1;
    l->ino = st.st_ino;
    return 0;
}

/* True while the listener should go on: used lately, its socket file still the one it made, its
 * build still installed (a removed build is one gpusync no longer uses). */
static int still_wanted(const struct listener *l)
{
    struct stat st;
    if (time(NULL) - l->last_used > GA_RESIDENT_IDLE_S || access(l->self, X_OK) != 0)
        return 0;
    return stat(l->path, &st) == 0 && st.st_ino == l->ino;
}

static void accept_one(struct listener *l)
{
    int conn = accept(l->fd, NULL, NULL);
    if (conn < 0)
        return; /* EINTR, ECONNABORTED, a full descriptor table: try again at the next poll */
    l->last_used = time(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(l->fd);
        close(l->lock_fd);
        serve_connection(conn, l->self_fd, l->self);
    }
    close(conn);
}

int ga_resident_main(int argc, char **argv)
{
    struct listener l = {.fd = -1, .last_used = time(NULL)};
    if (argc != 3 || strcmp(argv[1], "--socket") != 0) {
        fprintf(stderr, "usage: gpusync-agent listen --socket PATH\n");
        return 2;
    }
    l.path = argv[2];
    if (self_path(l.self, sizeof(l.self)) < 0 ||
        (l.self_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)) < 0 ||
        (l.lock_fd = open_lock(l.self)) < 0) {
        fprintf(stderr, "gpusync-agent listen: cannot find this program or its lock\n");
        return 1;
    }
    if (flock(l.lock_fd, LOCK_EX | LOCK_NB) < 0)
        return 0;             /* another listener has it */
    signal(SIGCHLD, SIG_IGN); /* connections' serve processes are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    if (listen_on(&l) < 0) {
        fprintf(stderr, "gpusync-agent listen: %s: %s\n", l.path, strerror(errno));
        return 1;
    }
    while (still_wanted(&l)) {
        struct pollfd pfd = {.fd = l.fd, .events = POLLIN};
        if (poll(&pfd, 1, GA_RESIDENT_CHECK_S * 1000) > 0)
            accept_one(&l);
    }
    struct stat st;
    if (stat(l.path, &st) == 0 && st.st_ino == l.ino)
        unlink(l.path);
    return 0;
}
