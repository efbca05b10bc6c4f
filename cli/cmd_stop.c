/* cli/cmd_stop.c: `gpusync stop RUN`: TERM, then KILL, to every process of the run, and a check
 * that none remains. */
#include <stdio.h>

#include "cli/run_util.h"

static const struct option stop_options[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};

static int stop_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_stop, argc, argv, "h", stop_options, NULL);
    if (r == 0 && cli->argc != 1)
        return gs_cli_usage_error(&gs_cmd_stop, "expected one RUN (an id or a --name)");
    return r;
}

static int stop_exec(struct gs_cli *cli)
{
    struct gs_run_ctx rc;
    struct gs_buf id = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_run_ctx_init(cli, &rc);
    int r = gs_run_ctx_resolve(cli, &rc, cli->argv[0], &id);
    if (r == 0)
        r = gs_run_ctx_stop(cli, &rc, id.data, &out);
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
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_NEED_SERVER,
    .parse = stop_parse,
    .exec = stop_exec,
};
