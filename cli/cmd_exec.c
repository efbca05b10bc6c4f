/* cli/cmd_exec.c: `gpusync exec -- CMD...`: runs a command in the remote project directory,
 * streaming its output, and exits with its status. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/shell.h"
#include "remote/exec.h"

static const struct option exec_options[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};

/* One argument is a shell command line, as with ssh ('nvidia-smi | head'); several are exact
 * arguments, each quoted so spaces, quotes, $ and ; reach the program unchanged. */
#define EXIT_NO_FOLDER 254 /* the preamble's status when the project folder cannot be entered */

static void build_command(struct gs_cli *cli, int argc, char **argv, struct gs_buf *cmd)
{
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    /* a folder that cannot be entered exits EXIT_NO_FOLDER, so that only that status costs the
     * round trip asking why (check_folder); `||` and `;`, so that a command line of several
     * commands never runs a part of itself elsewhere */
    gs_buf_addf(cmd, "{ mkdir -p -- %s && cd -- %s; } 2>/dev/null || exit %d; ", dir.data, dir.data,
                EXIT_NO_FOLDER);
    if (argc == 1) {
        gs_buf_adds(cmd, argv[0]);
    } else {
        gs_buf_adds(cmd, "exec ");
        gs_shell_quote_argv(cmd, argc, argv);
    }
    gs_buf_release(&dir);
}

/* After EXIT_NO_FOLDER (the preamble's, or the command's own): whether the project folder could
 * be entered at all, asked again without hiding the reason. If not, the command never ran and
 * its status is not the user's: sets cli->err to a remote error naming the folder and returns
 * GS_E_REMOTE; else returns 0. */
static int check_folder(struct gs_cli *cli)
{
    struct gs_buf dir = GS_BUF_INIT, cmd = GS_BUF_INIT, why = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    gs_buf_addf(&cmd, GS_EXEC_PATH_PROBE "mkdir -p -- %s 2>&1 && cd -- %s 2>&1", dir.data,
                dir.data);
    int rc = gs_exec_capture(cli->ssh, cmd.data, &why, NULL, &cli->err);
    while (why.len && why.data[why.len - 1] == '\n')
        why.data[--why.len] = '\0';
    if (rc > 0 && gs_exec_path_broken(cli->ssh, why.data, &cli->err) < 0)
        rc = GS_E_REMOTE;
    else if (rc > 0)
        rc = gs_error_set(&cli->err, GS_E_REMOTE,
                          "cannot use the remote project folder on %s: %s; remove or rename what "
                          "is there, or choose another folder (gpusync init --path)",
                          gs_ssh_target(cli->ssh), why.len ? why.data : dir.data);
    gs_buf_release(&dir);
    gs_buf_release(&cmd);
    gs_buf_release(&why);
    return rc < 0 ? rc : 0;
}

static int exec_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_exec, argc, argv, "+h", exec_options, NULL);
    if (r == 0 && cli->argc == 0)
        return gs_cli_usage_error(&gs_cmd_exec, "no command given");
    return r;
}

/* The signal caught here and not yet passed on to the remote command, and Ctrl-Cs so far. */
static volatile sig_atomic_t pass_signal, interrupts;

/* How long exec waits for the command's end after the third Ctrl-C's SIGKILL, then gives up. */
#define KILL_WAIT_MS 5000

/* Ctrl-C, SIGTERM and SIGHUP end a local command, so they are the remote command's to receive: a
 * client that just exited would leave it running on the server with no terminal, where neither
 * `ps` nor `stop` finds it. The third Ctrl-C kills it, for a command that ignores the first two. */
static void on_signal(int sig)
{
    pass_signal = sig == SIGINT && ++interrupts == 3 ? SIGKILL : sig;
}

/* Says what the third Ctrl-C's SIGKILL did, once it is known: only a kill that happened. */
static void on_signal_passed(void *ctx, int sig, int groups)
{
    (void)ctx;
    if (sig != SIGKILL)
        return;
    if (groups > 0)
        fputs("\ngpusync: third Ctrl-C: killed the remote command (SIGKILL)\n", stderr);
    else
        fprintf(stderr,
                "\ngpusync: third Ctrl-C: found no process of the remote command to kill; "
                "waiting %d s for it to end\n",
                KILL_WAIT_MS / 1000);
}

static void pass_signals_on(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: the wait for the server returns to send it */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* The command did not end after the third Ctrl-C: says that it may still run, naming it, and
 * returns the exit status of an interrupted command (130). */
static int gave_up(struct gs_cli *cli)
{
    struct gs_buf shown = GS_BUF_INIT;
    if (cli->argc == 1)
        gs_buf_adds(&shown, cli->argv[0]);
    else
        gs_shell_quote_argv(&shown, cli->argc, cli->argv);
    gs_error_set(&cli->err, GS_E_INTERRUPTED,
                 "the remote command did not end within %d s of the third Ctrl-C; it, or a process "
                 "it started, may still run on %s: %s",
                 KILL_WAIT_MS / 1000, gs_ssh_target(cli->ssh), shown.data);
    gs_buf_release(&shown);
    return gs_cli_fail(cli, GS_E_INTERRUPTED);
}

static int exec_exec(struct gs_cli *cli)
{
    struct gs_buf cmd = GS_BUF_INIT;
    build_command(cli, cli->argc, cli->argv, &cmd);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdout_fd = STDOUT_FILENO;
    io.stderr_fd = STDERR_FILENO;
    if (!isatty(STDIN_FILENO))
        io.stdin_fd = STDIN_FILENO;
    io.pass_signal = &pass_signal;
    io.signal_passed = on_signal_passed;
    io.kill_wait_ms = KILL_WAIT_MS;
    pass_signals_on();
    int rc = gs_exec_run(cli->ssh, cmd.data, &io, &cli->err);
    gs_buf_release(&cmd);
    if (rc == EXIT_NO_FOLDER && check_folder(cli) < 0)
        rc = GS_E_REMOTE;
    if (rc == GS_E_INTERRUPTED)
        return gave_up(cli);
    if (rc < 0) { /* the channel broke, or the command never ran: its own status is unknown */
        gs_cli_fail(cli, rc);
        return GS_EXIT_REMOTE_LOST;
    }
    return rc;
}

const struct gs_cmd gs_cmd_exec = {
    .name = "exec",
    .usage = "exec [--] CMD [ARGS...]",
    .summary = "Run a command in the remote project directory; exit with its status",
    .help = "  One argument is a shell command line (gpusync exec 'nvidia-smi | head');\n"
            "  several are passed as exact arguments. Standard input is forwarded when it is\n"
            "  not a terminal. Ctrl-C, SIGTERM and SIGHUP are passed on to the command (to its\n"
            "  process group); a third Ctrl-C kills it, and if it has not ended 5 s later, exec\n"
            "  exits 130, saying that it may still run. Exit status: the command's, 128+N if it\n"
            "  died of signal N, 255 if the connection failed (as with ssh) or the remote\n"
            "  project folder cannot be used.\n",
    .flags = GS_CMD_NEED_CONNECTION | GS_CMD_REMOTE_STATUS,
    .parse = exec_parse,
    .exec = exec_exec,
};
