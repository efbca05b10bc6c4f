/* cli/cmd_watch.c: `gpusync watch`: live sync, in the foreground with a status line, or in the
 * background with -d (a log in .gpusync/daemon.log); `--stop` ends a running daemon. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "syncd/control.h"
#include "syncd/daemon.h"

enum { OPT_STOP = 2000 };

static const struct option watch_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"detach", no_argument, NULL, 'd'},
    {"stop", no_argument, NULL, OPT_STOP},
    {NULL, 0, NULL, 0},
};

/* Waits (up to 10 s) until no process holds the project's daemon lock. The daemon closes its
 * control connections before it has finished tearing down, and the lock goes only when the
 * process exits: without this wait, `watch --stop && watch -d` is refused as "already running". */
static int wait_lock_free(struct gs_cli *cli)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, cli->root.data, GS_CONTROL_LOCK);
    int fd = open(path.data, O_RDONLY | O_CLOEXEC), rc = 0;
    int64_t end = gs_clock_mono_ms() + 10000;
    while (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (gs_clock_mono_ms() > end) {
            rc = gs_error_set(&cli->err, GS_E_TIMEOUT,
                              "gpusync watch for %s was told to stop but is still running "
                              "after 10 s (pid in %s)",
                              cli->root.data, path.data);
            break;
        }
        usleep(10000);
    }
    if (fd >= 0)
        close(fd); /* releases the lock if we took it */
    gs_buf_release(&path);
    return rc;
}

/* A daemon stopped in the middle of a batch, or before it could check every file, leaves changes
 * the server lacks (files deleted there behind its back included): say so, since "stopped" alone
 * reads as "and the server has everything". On stderr: a warning, which IDEs that show a tool's
 * console only for errors (JetBrains' Stop Watching) must show. */
static void print_stopped(const char *root, json_int_t unsent, int unchecked)
{
    printf("stopped gpusync watch for %s\n", root);
    fflush(stdout);
    if (unsent)
        fprintf(stderr,
                "gpusync: %lld change%s not sent to the server%s: 'gpusync push' sends %s\n",
                (long long)unsent, unsent == 1 ? " was" : "s were",
                unchecked ? ", nor was every file checked" : "", unsent == 1 ? "it" : "them");
    else if (unchecked)
        fprintf(stderr, "gpusync: it could not check every file against the server before it "
                        "stopped: 'gpusync push' does\n");
}

static int stop_daemon(struct gs_cli *cli)
{
    int fd = gs_control_connect(cli->root.data, &cli->err);
    if (fd < 0) {
        if (!cli->json)
            printf("no gpusync watch is running for %s\n", cli->root.data);
        else
            gs_cli_json_print(json_pack("{s:i,s:b,s:b}", "v", 1, "ok", 1, "was_running", 0));
        return 0;
    }
    json_t *req = json_pack("{s:s}", "cmd", "stop"), *reply = NULL;
    struct gs_buf buf = GS_BUF_INIT;
    int rc = gs_control_send(fd, req, &cli->err);
    if (rc == 0)
        rc = gs_control_recv(fd, &buf, &reply, 5000, &cli->err);
    json_decref(req);
    json_int_t unsent = json_integer_value(json_object_get(reply, "unsent"));
    int unchecked = json_is_true(json_object_get(reply, "unchecked"));
    json_decref(reply);
    /* Wait for the daemon to go: its end closes our connection. */
    json_t *more = NULL;
    if (rc == 0)
        gs_control_recv(fd, &buf, &more, 10000, NULL);
    json_decref(more);
    close(fd);
    gs_buf_release(&buf);
    if (rc == 0)
        rc = wait_lock_free(cli);
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:b,s:I,s:b}", "v", 1, "ok", 1, "was_running", 1,
                                    "unsent", unsent, "unchecked", unchecked));
    else
        print_stopped(cli->root.data, unsent, unchecked);
    return 0;
}

static int run_daemon(struct gs_cli *cli, int ready_fd, FILE *status_out)
{
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    struct gs_daemon_opts o = {.root = cli->root.data,
                               .cfg = &cli->cfg,
                               .remote_dir = dir.data,
                               .debounce_ms = 8,
                               .debounce_cap_ms = 100,
                               .status_out = status_out,
                               .ready_fd = ready_fd};
    gs_cli_ssh_opts(cli, &o.ssh);
    /* A liveness ping or a batch runs on the daemon's one thread: while it waits on a dead link,
     * the control socket goes unanswered, and `gpusync status` gives up on the daemon after 5 s.
     * Keep those waits below that: after 2 s of silence a keepalive goes out, and 4 s of silence
     * with it unanswered means a dead link. A connection attempt runs on a thread of its own
     * (syncd/daemon.c), so it keeps the usual connect timeout: a slow server's handshake must
     * not fail every attempt for good. */
    o.ssh.keepalive_ms = 2000;
    o.ssh.dead_after_ms = 4000;
    if (ready_fd >= 0) { /* nobody to ask in the background */
        o.ssh.confirm = NULL;
        o.ssh.ask_secret = NULL;
    }
    int rc = gs_daemon_run(&o, &cli->err);
    gs_buf_release(&dir);
    return rc < 0 ? gs_cli_fail(cli, rc) : 0;
}

/* Forks the daemon into the background; returns once it serves (or failed to start). */
static int detach(struct gs_cli *cli, int lock_fd)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return gs_cli_fail(cli, gs_error_errno(&cli->err, GS_E_IO, "pipe"));
    pid_t pid = fork();
    if (pid < 0)
        return gs_cli_fail(cli, gs_error_errno(&cli->err, GS_E_IO, "fork"));
    if (pid == 0) {
        close(pipefd[0]);
        setsid();
        struct gs_buf log = GS_BUF_INIT;
        gs_path_join(&log, cli->root.data, GS_CONTROL_LOG);
        int fd = gs_path_open_private(log.data, O_WRONLY | O_CREAT | O_APPEND);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (!gs_log_enabled(GS_LOG_INFO)) /* at least info in the log; GPUSYNC_LOG=debug more */
            gs_log_set_level(GS_LOG_INFO);
        /* The inherited lock descriptor keeps the lock; record our pid in it. */
        char pid[32];
        int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
        if (ftruncate(lock_fd, 0) < 0 || pwrite(lock_fd, pid, (size_t)len, 0) != len)
            gs_warn("cannot record the daemon pid");
        _exit(run_daemon(cli, pipefd[1], NULL));
    }
    close(pipefd[1]);
    close(lock_fd); /* the child holds it (flock is shared across fork) */
    char c;
    ssize_t n = read(pipefd[0], &c, 1);
    close(pipefd[0]);
    if (n != 1)
        return gs_cli_fail(cli,
                           gs_error_set(&cli->err, GS_E_ERR, "the daemon did not start; see %s/%s",
                                        cli->root.data, GS_CONTROL_LOG));
    if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:i}", "v", 1, "ok", 1, "pid", (int)pid));
    else
        printf("gpusync watch running in the background (pid %d); log: %s/%s\n", (int)pid,
               cli->root.data, GS_CONTROL_LOG);
    return 0;
}

static struct {
    int background, stop; /* -d, --stop */
} opts;

static int watch_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli, (void)arg;
    if (opt == 'd')
        opts.background = 1;
    else if (opt == OPT_STOP)
        opts.stop = 1;
    else
        return gs_cli_usage_error(&gs_cmd_watch, "unexpected option");
    return 0;
}

static int watch_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_watch, argc, argv, "hd", watch_options, watch_option);
    if (r == 0 && cli->argc > 0)
        return gs_cli_usage_error(&gs_cmd_watch, "unexpected argument '%s'", cli->argv[0]);
    return r;
}

static int watch_exec(struct gs_cli *cli)
{
    if (opts.stop)
        return stop_daemon(cli);
    int lock_fd = gs_daemon_lock(cli->root.data, &cli->err);
    if (lock_fd < 0)
        return gs_cli_fail(cli, lock_fd);
    if (opts.background)
        return detach(cli, lock_fd);
    return run_daemon(cli, -1, isatty(STDERR_FILENO) ? stderr : NULL);
}

const struct gs_cmd gs_cmd_watch = {
    .name = "watch",
    .usage = "watch [-d] [--stop]",
    .summary = "Mirror every save to the server as it happens (live sync)",
    .help = "  -d, --detach           run in the background (log: .gpusync/daemon.log)\n"
            "  --stop                 stop the background daemon\n"
            "  First pushes what changed while no daemon ran. One daemon per project.\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = watch_parse,
    .exec = watch_exec,
};
