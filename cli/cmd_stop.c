/* cli/cmd_stop.c: `gpusync stop [--grace S] RUN`: TERM, then KILL after the grace period, to
 * every process of the run (its ranks, and whatever they started, setsid or not), a report of
 * what it killed, and a check that none remains; on every node of a multi-node run
 * (run_nodes_attach.c). */
#include <stdio.h>

#include "cli/run_nodes.h"
#include "cli/run_slurm.h"

/* From 2000, as every command's own options: 1000-1002 are the common ones (GS_OPT_JSON is 1000,
 * so --grace used to be taken for --json and its value never read). */
enum { OPT_GRACE = 2000 };

static const struct option stop_options[] = {
    GS_CLI_COMMON_LONGOPTS, {"grace", required_argument, NULL, OPT_GRACE}, {NULL, 0, NULL, 0}};

static long grace_ms = -1; /* the run's own */

static int stop_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli;
    char why[128];
    if (opt == OPT_GRACE && gs_cli_parse_grace(arg, &grace_ms, why, sizeof(why)) < 0)
        return gs_cli_usage_error(&gs_cmd_stop, "%s", why);
    return 0;
}

static int stop_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_stop, argc, argv, "h", stop_options, stop_option);
    if (r == 0 && cli->argc != 1)
        return gs_cli_usage_error(&gs_cmd_stop, "expected one RUN (an id or a --name)");
    return r;
}

/* Stops run `id` on the [remote] server and prints the agent's report. Returns the exit code. */
static int stop_on_server(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id)
{
    struct gs_buf out = GS_BUF_INIT;
    int r = gs_run_ctx_stop(cli, rc, id, grace_ms, &out), code = 0;
    if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:s}", "v", 1, "ok", 1, "id", id, "report",
                                    out.data ? out.data : ""));
    else
        fputs(out.data ? out.data : "stopped\n", stdout);
    gs_buf_release(&out);
    return code;
}

static int stop_exec(struct gs_cli *cli)
{
    struct gs_run_ctx rc;
    struct gs_buf id = GS_BUF_INIT;
    int r, code;
    if (cli->cfg.slurm.enabled) /* scancel: the scheduler owns the job's processes */
        return gs_slurm_stop(cli, cli->argv[0]);
    gs_run_ctx_init(cli, &rc);
    /* Several runs may share a --name: stop the newest that still runs, not a newer one that
     * has ended while an older one of that name runs on. */
    json_t *rec = gs_nodes_resolve(cli, &rc, cli->argv[0], 1, &id, &r);
    if (rec) /* a multi-node run: every node */
        code = gs_nodes_stop(cli, rec, grace_ms);
    else
        code = r < 0 ? gs_cli_fail(cli, r) : stop_on_server(cli, &rc, id.data);
    json_decref(rec);
    gs_buf_release(&id);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_stop = {
    .name = "stop",
    .usage = "stop [--grace SECONDS] RUN",
    .summary = "Stop a run: every rank and its children, confirmed gone",
    .help = "  --grace SECONDS  how long processes get to exit after SIGTERM before SIGKILL\n"
            "                   (default: the run's, 10 s unless 'run --grace' set it)\n"
            "  RUN is a run id or a --name (of several runs with that name, the newest still\n"
            "  running; the report names it). Every process the run started is stopped, also\n"
            "  those that left the rank's process group (setsid, daemons). Prints what got\n"
            "  SIGTERM and what had to be killed; fails (exit 1, naming them) if any process of\n"
            "  the run is still alive afterwards. A multi-node run (run --hosts) is stopped on\n"
            "  every node at once, each node's report on its own line; stop fails, naming the\n"
            "  node, when a node cannot be reached or something of the run survives there. On\n"
            "  Slurm ([remote] scheduler = slurm) RUN is a run id, stopped with scancel and\n"
            "  confirmed when the scheduler no longer lists its job.\n",
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_NEED_SERVER,
    .parse = stop_parse,
    .exec = stop_exec,
};
