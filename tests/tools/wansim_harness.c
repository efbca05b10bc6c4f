/* wansim_harness: fork/exec the WAN simulator, read its "port N" line, talk to its control socket
 * and stop it; used by wansim's own tests and by later benchmarks and fault tests. */
#include "wansim_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WANSIM_WAIT_MS 5000

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes a message into err (if any) and returns -1, so callers can `return fail(...)`. */
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int wansim_binary(const char *explicit_path, char *out, size_t outlen, char *err, size_t errlen)
{
    const char *build = getenv("GS_BUILD_DIR");
    if (explicit_path)
        snprintf(out, outlen, "%s", explicit_path);
    else if (build && *build)
        snprintf(out, outlen, "%s/tests/tools/wansim", build);
    else
        return fail(err, errlen,
                    "cannot locate wansim: set GS_BUILD_DIR to the build folder "
                    "(ctest does) or pass the binary's path");
    if (access(out, X_OK) < 0)
        return fail(err, errlen, "wansim binary %s: %s (build the 'wansim' target first)", out,
                    strerror(errno));
    return 0;
}

/* In the child: stdout to the pipe, every other inherited fd closed, then exec. Never returns. */
static void child_exec(int out_fd, char **argv)
{
    if (dup2(out_fd, STDOUT_FILENO) < 0)
        _exit(127);
    /* the test's own sockets must not stay open in the proxy, or closes would not propagate */
    if (close_range(3, ~0u, 0) < 0)
        for (int fd = 3; fd < 4096; fd++)
            close(fd);
    execv(argv[0], argv);
    fprintf(stderr, "wansim_harness: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* Reads from `fd` until a full line arrives or WANSIM_WAIT_MS passes; returns 0 on a line. */
static int read_line(int fd, char *buf, size_t len)
{
    size_t used = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (used + 1 < len) {
        if (poll(&p, 1, WANSIM_WAIT_MS) <= 0)
            return -1;
        ssize_t n = read(fd, buf + used, len - 1 - used);
        if (n <= 0)
            return -1;
        used += (size_t)n;
        buf[used] = 0;
        char *nl = strchr(buf, '\n');
        if (nl) {
            *nl = 0;
            return 0;
        }
    }
    return -1;
}

/* Waits up to `ms` for the child; returns its raw wait status, or -1 if it is still running. */
static int wait_child(pid_t pid, int ms)
{
    int status;
    for (int waited = 0;; waited += 5) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 || waited >= ms)
            return -1;
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
}

static void kill_and_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static pid_t spawn(const struct wansim_opts *o, const char *bin, const char *ctl, int *out_fd)
{
    char target[300], delay[32], rate[32];
    int fds[2];
    snprintf(target, sizeof(target), "%s:%d", o->target_host ? o->target_host : "127.0.0.1",
             o->target_port);
    snprintf(delay, sizeof(delay), "%g", o->delay_ms);
    snprintf(rate, sizeof(rate), "%g", o->rate_mbit);
    char *argv[] = {(char *)bin, "--listen",   "127.0.0.1:0", "--target",
                    target,      "--delay-ms", delay,         "--rate-mbit",
                    rate,        "--control",  (char *)ctl,   NULL};
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0)
        child_exec(fds[1], argv);
    close(fds[1]);
    if (pid < 0)
        close(fds[0]);
    else
        *out_fd = fds[0];
    return pid;
}

int wansim_start(struct wansim_proc *w, const struct wansim_opts *opts, char *err, size_t errlen)
{
    char bin[4096], line[128];
    int out_fd = -1;
    memset(w, 0, sizeof(*w));
    if (wansim_binary(opts->binary, bin, sizeof(bin), err, errlen) < 0)
        return -1;
    snprintf(w->dir, sizeof(w->dir), "/tmp/wansim-XXXXXX");
    if (!mkdtemp(w->dir))
        return fail(err, errlen, "mkdtemp %s: %s", w->dir, strerror(errno));
    snprintf(w->ctl_path, sizeof(w->ctl_path), "%s/ctl", w->dir);
    w->pid = spawn(opts, bin, w->ctl_path, &out_fd);
    if (w->pid < 0) {
        fail(err, errlen, "cannot start %s: %s", bin, strerror(errno));
        goto err;
    }
    int ok = read_line(out_fd, line, sizeof(line)) == 0 && sscanf(line, "port %d", &w->port) == 1;
    close(out_fd);
    if (ok)
        return 0;
    int status = wait_child(w->pid, 100);
    fail(err, errlen, "%s did not report its port within %d ms (%s %d; see its stderr)", bin,
         WANSIM_WAIT_MS, status < 0 ? "still running, killed" : "exit status",
         status < 0 ? 0 : WEXITSTATUS(status));
    if (status < 0)
        kill_and_reap(w->pid);
err:
    unlink(w->ctl_path);
    rmdir(w->dir);
    w->pid = 0;
    return -1;
}

int wansim_command(struct wansim_proc *w, const char *cmd, char *reply, size_t replylen)
{
    char buf[1024], line[600];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = WANSIM_WAIT_MS / 1000};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", w->ctl_path);
    snprintf(line, sizeof(line), "%s\n", cmd);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fail(reply, replylen, "error: socket: %s", strerror(errno));
    int rc = -1;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
        fail(reply, replylen, "error: control socket %s: %s", w->ctl_path, strerror(errno));
        goto out;
    }
    if (read_line(fd, buf, sizeof(buf)) < 0) {
        fail(reply, replylen, "error: no answer to '%s' within %d ms", cmd, WANSIM_WAIT_MS);
        goto out;
    }
    if (reply && replylen)
        snprintf(reply, replylen, "%s", buf);
    rc = strncmp(buf, "ok", 2) == 0 ? 0 : -1;
out:
    close(fd);
    return rc;
}

int wansim_stop(struct wansim_proc *w)
{
    if (w->pid <= 0)
        return -1;
    kill(w->pid, SIGTERM);
    int status = wait_child(w->pid, WANSIM_WAIT_MS);
    if (status < 0) {
        kill_and_reap(w->pid);
        status = SIGKILL; /* reads as "killed by a signal" below */
    }
    w->pid = 0;
    unlink(w->ctl_path); /* wansim removes it itself on a clean stop */
    rmdir(w->dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
