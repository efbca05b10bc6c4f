/* cli/cmd_logs.c: `gpusync logs [RUN] [-f] [--rank N] [--tail N]`: a run's logs (the newest run
 * by default), several ranks' lines in the order they were printed (to the server's 10 ms
 * log-times resolution, agent/logtimes.h); -f follows until the run ends, resuming after a
 * dropped connection. A run the server no longer has (it was recreated)
 * is shown from the local copy, and the user is told so. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>

#include "cli/run_local.h"
#include "cli/run_nodes.h"
#include "cli/run_slurm.h"
#include "common/path.h"
#include "common/wrapper.h"

enum { OPT_RANK = 2000, OPT_TAIL };

/* The highest rank number --rank takes: the launcher's limit on ranks per node, times nodes. */
#define GS_LOGS_MAX_RANK 1000000

static const struct option logs_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"follow", no_argument, NULL, 'f'},
    {"rank", required_argument, NULL, OPT_RANK},
    {"tail", required_argument, NULL, OPT_TAIL},
    {NULL, 0, NULL, 0},
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Prefixes "[rank N] " unless one rank is asked for. */
static int want_prefix(const char *ranks)
{
    return !ranks || strchr(ranks, ',') || !strcmp(ranks, "all");
}

/* How many ranks the run of ps entry `entry` has; 0 when unknown (no entry, or none listed). */
static int run_nranks(json_t *entry)
{
    return (int)json_array_size(json_object_get(entry, "ranks"));
}

/* As want_prefix, for a run of `nranks` (0: unknown): a one-rank run's lines go bare, as `run`
 * prints them. */
static int run_wants_prefix(int nranks, const char *ranks)
{
    return nranks != 1 && want_prefix(ranks);
}

/* --rank against the ranks run `id` has (its ps entry, which resolving it kept). */
static int check_ranks(struct gs_cli *cli, const struct gs_run_ctx *rc, const char *id,
                       const char *ranks)
{
    struct gs_buf what = GS_BUF_INIT;
    gs_buf_addf(&what, "run %s", id);
    int r = gs_run_check_ranks(cli, "--rank", ranks, run_nranks(rc->resolved), what.data);
    gs_buf_release(&what);
    return r;
}

/* Shows the local copy of run `id`, which the server does not have (`asked`: the run as the user
 * named it). Returns the exit code: 0, or 1 with -f (the run cannot be followed, and its exit
 * status is unknown here). */
static int show_local(struct gs_cli *cli, const char *asked, const char *id, int follow,
                      const char *ranks, int tail)
{
    struct gs_log_printer printer;
    gs_log_printer_init(&printer, cli, id, want_prefix(ranks));
    printer.from_local_copy = 1;
    printer.tail_lines = tail;
    fprintf(stderr,
            "gpusync: %s has no run '%s' (a new or recreated server?); showing the local copy "
            "in %s/runs/%s/ (what this machine received)\n",
            gs_cli_server_name(cli), asked, GS_DIR, id);
    gs_error_clear(&cli->err);
    int r =
        gs_run_local_replay(cli->root.data, id, ranks, gs_log_printer_chunk, &printer, &cli->err);
    gs_log_printer_finish(&printer);
    if (r < 0)
        return gs_cli_fail(cli, r);
    if (follow)
        fprintf(stderr, "gpusync: run %s cannot be followed: the server does not have it\n", id);
    return follow ? GS_EXIT_ERR : 0;
}

static int show(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, int follow,
                const char *ranks, int tail)
{
    struct gs_log_printer printer;
    int prefix = run_wants_prefix(run_nranks(rc->resolved), ranks);
    gs_log_printer_init(&printer, cli, id, prefix);
    printer.name = json_string_value(json_object_get(rc->resolved, "name"));
    printer.tail_lines = tail;
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int r = 0, code = 0;
    struct gs_tail_state st;
    memset(&st, 0, sizeof(st));
    if (!follow || tail) /* with -f: the last lines so far, printed, then the rest as it comes */
        r = gs_run_ctx_tail(cli, rc, id, ranks, 0, &st, &printer, &interrupted);
    if (follow && tail && r == 0) {
        const char *name = printer.name;
        gs_log_printer_end_tail(&printer, &st);
        gs_log_printer_init(&printer, cli, id, prefix);
        printer.name = name;
    }
    if (follow && r == 0)
        r = gs_run_ctx_follow_from(cli, rc, id, ranks, &printer, &interrupted, &code, &st);
    gs_log_printer_finish(&printer);
    if (r == GS_E_INTERRUPTED)
        return 130;
    return r < 0 ? gs_cli_fail(cli, r) : follow ? code : 0;
}

static struct {
    int follow, tail;
    const char *rank;
} opts;

/* Whether `ranks` is "all" or a comma list of rank numbers, as --rank takes. */
static int ranks_valid(const char *ranks)
{
    if (strcmp(ranks, "all") == 0)
        return 1;
    char *list = gs_xstrdup(ranks), *save = NULL;
    long rank;
    int ok = ranks[0] && ranks[strlen(ranks) - 1] != ',';
    for (char *r = strtok_r(list, ",", &save); ok && r; r = strtok_r(NULL, ",", &save))
        ok = gs_cli_parse_number(r, 0, GS_LOGS_MAX_RANK, &rank) == 0;
    free(list);
    return ok;
}

static int logs_option(struct gs_cli *cli, int opt, const char *arg)
{
    long tail;
    if (opt == 'f') {
        /* exits with the run's status then, so a lost connection is 255, as for run */
        opts.follow = 1;
        cli->remote_status = 1;
    } else if (opt == OPT_RANK) {
        if (!ranks_valid(arg))
            return gs_cli_usage_error(&gs_cmd_logs,
                                      "--rank %s: expected a rank number (0, 1, ...), "
                                      "a list such as 0,2, or all",
                                      arg);
        opts.rank = arg;
    } else if (opt == OPT_TAIL) {
        /* 0 is refused rather than read as "all": leaving --tail out is how to get all */
        if (gs_cli_parse_number(arg, 1, INT_MAX, &tail) < 0)
            return gs_cli_usage_error(&gs_cmd_logs,
                                      "--tail %s: expected a number of lines, 1 or "
                                      "more (leave --tail out for the whole log)",
                                      arg);
        opts.tail = (int)tail;
    } else
        return gs_cli_usage_error(&gs_cmd_logs, "unexpected option");
    return 0;
}

static int logs_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_logs, argc, argv, "hf", logs_options, logs_option);
    if (r == 0 && cli->argc > 1)
        return gs_cli_usage_error(&gs_cmd_logs, "at most one RUN");
    return r;
}

static int logs_exec(struct gs_cli *cli)
{
    struct gs_run_ctx rc;
    struct gs_buf id = GS_BUF_INIT, local = GS_BUF_INIT;
    const char *run = cli->argc ? cli->argv[0] : NULL;
    int r, code;
    gs_run_ctx_init(cli, &rc);
    json_t *rec = gs_nodes_resolve(cli, &rc, run, 0, &id, &r);
    if (rec)
        code = gs_nodes_logs(cli, rec, opts.rank, opts.follow, opts.tail);
    else if (r == 0 && (r = check_ranks(cli, &rc, id.data, opts.rank)) < 0)
        code = gs_cli_fail(cli, r);
    else if (r == GS_E_NOTFOUND && run && gs_run_local_exists(cli->root.data, run))
        code = show_local(cli, run, run, opts.follow, opts.rank, opts.tail);
    else if (r == GS_E_NOTFOUND && run && gs_run_local_named(cli->root.data, run, &local) == 0)
        code = show_local(cli, run, local.data, opts.follow, opts.rank, opts.tail); /* a --name */
    else if (r == GS_E_NOTFOUND && !run && gs_run_local_newest(cli->root.data, &local) == 0)
        code =
            show_local(cli, local.data, local.data, opts.follow, opts.rank, opts.tail); /* newest */
    else if (r < 0 && !(cli->cfg.slurm.enabled && run && opts.follow))
        code = gs_cli_fail(cli, r);
    else if (r < 0 && (code = gs_slurm_logs_wait(cli, run)) != 0) /* a Slurm job still pending */
        ;
    else
        code = show(cli, &rc, r < 0 ? run : id.data, opts.follow, opts.rank, opts.tail);
    json_decref(rec);
    gs_buf_release(&id);
    gs_buf_release(&local);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_logs = {
    .name = "logs",
    .usage = "logs [RUN] [-f] [--rank N] [--tail N]",
    .summary = "Show a run's logs (the newest run by default)",
    .help = "  -f, --follow           follow until the run ends; exit with its status (255 when\n"
            "                         the connection failed)\n"
            "  --rank N               only rank N (a list such as 0,1 works too; or all); a\n"
            "                         rank the run does not have is a usage error\n"
            "  --tail N               only the last N lines, N >= 1 (of all ranks, in time order)\n"
            "  RUN is a run id or a --name. Several ranks' lines come in the order they were\n"
            "  printed, to about 10 ms: lines of different ranks printed closer together may\n"
            "  come rank by rank. A copy is kept in .gpusync/runs/<id>/; when the server no\n"
            "  longer has the run (it was recreated), RUN (an id) is shown from that copy, and\n"
            "  -f then exits 1. A multi-node run (run --hosts) shows every node's ranks, one\n"
            "  connection per node, lines prefixed by global rank; across nodes, lines come in\n"
            "  the order they arrive here (--tail N: the last N lines of each node). A node that\n"
            "  cannot be reached is named and shown from the local copy (exit 4); -f follows the\n"
            "  others meanwhile, and that node too, from where the copy ended, once it is back.\n"
            "  On Slurm, -f RUN waits while the job is pending, saying why. Text only: run\n"
            "  states are in 'gpusync ps --json'.\n",
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_NEED_SERVER | GS_CMD_TEXT_ONLY,
    .parse = logs_parse,
    .exec = logs_exec,
};
