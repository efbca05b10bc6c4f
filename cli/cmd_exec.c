/* cli/cmd_exec.c: `gpusync exec -- CMD...`: runs a command in the remote project directory,
 * streaming its output, and exits with its status. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/shell.h"
#include "remote/exec.h"

static const struct option exec_options[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};

/* One argument is a shell command line, as with ssh ('nvidia-smi | head'); several are exact
 * arguments, each quoted so spaces, quotes, $ and ; reach the program unchanged. */
static void build_command(struct gs_cli *cli, int argc, char **argv, struct gs_buf *cmd)
{
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    gs_buf_addf(cmd, "mkdir -p -- %s && cd -- %s && ", dir.data, dir.data);
    if (argc == 1) {
        gs_buf_adds(cmd, argv[0]);
    } else {
        gs_buf_adds(cmd, "exec ");
        gs_shell_quote_argv(cmd, argc, argv);
    }
    gs_buf_release(&dir);
}

static int exec_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_exec, argc, argv, "+h", exec_options, NULL);
    if (r == 0 && cli->argc == 0)
        return gs_cli_usage_error(&gs_cmd_exec, "no command given");
    return r;
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
    int rc = gs_exec_run(cli->ssh, cmd.data, &io, &cli->err);
    gs_buf_release(&cmd);
    if (rc < 0) { /* whatever broke the channel, the command's own status is unknown */
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
            "  not a terminal. Exit status: the command's, 128+N if it died of signal N, 255 if\n"
            "  the connection failed (as with ssh).\n",
    .flags = GS_CMD_NEED_CONNECTION | GS_CMD_REMOTE_STATUS,
    .parse = exec_parse,
    .exec = exec_exec,
};
