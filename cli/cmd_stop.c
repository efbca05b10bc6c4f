/* cli/cmd_stop.c: `gpusync stop RUN`: TERM, then KILL, to every process of the run, and a check
 * that none remains. */
#include <stdio.h>

#include "cli/run_util.h"

static const struct option stop_options[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};

static int stop_main(struct gs_cli *cli, int argc, char **argv)
{
    int opt, r;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", stop_options, NULL)) != -1)
        if ((r = gs_cli_common_option(cli, &gs_cmd_stop, opt)) <= 0)
            return GS_EXIT_USAGE;
    if (argc - optind != 1)
        return gs_cli_usage_error(&gs_cmd_stop, "expected one RUN (an id or a --name)");
    if ((r = gs_cli_prepare(cli, &gs_cmd_stop)) != 0)
        return r;
    struct gs_run_ctx rc;
    struct gs_buf id = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_run_ctx_init(cli, &rc);
    r = gs_run_connect_unless_daemon(cli);
    if (r == 0)
        r = gs_run_resolve(cli, &rc, argv[optind], &id);
    if (r == 0)
        r = gs_run_stop_any(cli, &rc, id.data, &out);
    int code = 0;
    if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s}", "v", 1, "ok", 1, "id", id.data));
    else
        fputs(out.data ? out.data : "stopped\n", stdout);
    gs_buf_release(&id);
    gs_buf_release(&out);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_stop = {
    .name = "stop",
    .usage = "stop RUN",
    .summary = "Stop a run: every rank and its children, confirmed gone",
    .flags = GS_CMD_NEED_PROJECT, /* through the watch daemon when one runs, else connects */
    .exec = stop_main,
};
