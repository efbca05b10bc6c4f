/* cli/cmd_flush.c: `gpusync flush`: returns once the server matches what was on disk when it was
 * called (through the daemon), or does a push itself when no daemon runs. `gpusync run` uses it. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_util.h"
#include "syncd/control.h"

enum { OPT_TIMEOUT = 2000 };

static const struct option flush_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {NULL, 0, NULL, 0},
};

/* After --timeout ran out: says what the daemon is doing, so that a server that does not answer
 * (a login that hangs, an outage) is not taken for a daemon that does not. Leaves the message as
 * it is when the daemon does not answer `status` either. */
static void explain_timeout(struct gs_cli *cli, int timeout_s)
{
    json_t *st;
    struct gs_error ignored = {0};
    if (gs_control_request(cli->root.data, "status", 2000, &st, &ignored) < 0)
        return;
    const char *target = json_string_value(json_object_get(st, "target"));
    const char *since = json_string_value(json_object_get(st, "unreachable_since"));
    const char *why = json_string_value(json_object_get(st, "last_error"));
    long long pending = (long long)json_integer_value(json_object_get(st, "pending"));
    const char *s = pending == 1 ? "" : "s";
    if (json_is_true(json_object_get(st, "connected")))
        gs_error_set(&cli->err, GS_E_TIMEOUT,
                     "gave up after %d s: the daemon is still syncing to %s (%lld change%s "
                     "pending); 'gpusync flush' waits again",
                     timeout_s, target ? target : "the server", pending, s);
    else if (!since) /* its first login: what waits is known once it checks every file */
        gs_error_set(&cli->err, GS_E_TIMEOUT,
                     "gave up after %d s: %s has not answered the daemon's login yet; the daemon "
                     "keeps trying, and checks every file once in",
                     timeout_s, target ? target : "the server");
    else
        gs_error_set(&cli->err, GS_E_TIMEOUT,
                     "gave up after %d s: %s has been unreachable since %s%s%s; the daemon keeps "
                     "trying, and %lld change%s wait%s",
                     timeout_s, target ? target : "the server", since, why ? ": " : "",
                     why ? why : "", pending, s, pending == 1 ? "s" : "");
    json_decref(st);
}

/* Asks the daemon; returns 0 or an exit code after an error, or sets *none (no daemon: the caller
 * pushes). */
static int flush_daemon(struct gs_cli *cli, int timeout_s, int *none)
{
    json_t *reply;
    int rc = gs_cli_daemon_sync(cli, "flush", timeout_s * 1000,
                                "waiting for the watch daemon to send every change", &reply);
    *none = rc == GS_E_NOTFOUND;
    if (*none)
        return 0;
    if (rc == GS_E_TIMEOUT)
        explain_timeout(cli, timeout_s);
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    int ok = json_is_true(json_object_get(reply, "ok"));
    /* the daemon answers, but the server does not: a connection failure, not the daemon's */
    int unreachable = json_is_string(json_object_get(reply, "unreachable_since"));
    int stopped = json_is_true(json_object_get(reply, "stopped")); /* the daemon, not the server */
    int local = json_is_true(json_object_get(reply, "local"));     /* a file unreadable here */
    int code = unreachable ? GS_E_CONNECT : stopped ? GS_E_ERR : local ? GS_E_IO : GS_E_REMOTE;
    if (!ok)
        gs_error_set(&cli->err, code, "%s%s", unreachable || stopped ? "" : "flush failed: ",
                     json_string_value(json_object_get(reply, "error")));
    if (ok && cli->json) {
        json_object_set_new(reply, "daemon", json_true());
        gs_cli_json_print(json_incref(reply));
    } else if (ok) {
        printf("up to date (%lld ms)\n",
               (long long)json_integer_value(json_object_get(reply, "ms")));
        gs_cli_print_conflicts(json_object_get(reply, "conflicts"));
    }
    json_decref(reply);
    return ok ? 0 : gs_cli_fail(cli, code);
}

static int timeout_s = 300; /* --timeout */

static int flush_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli;
    if (opt != OPT_TIMEOUT)
        return gs_cli_usage_error(&gs_cmd_flush, "unexpected option");
    long s;
    if (gs_cli_parse_number(arg, 1, 86400, &s) < 0)
        return gs_cli_usage_error(&gs_cmd_flush, "--timeout %s: expected seconds (1 to 86400)",
                                  arg);
    timeout_s = (int)s;
    return 0;
}

static int flush_parse(struct gs_cli *cli, int argc, char **argv)
{
    return gs_cli_parse_options(cli, &gs_cmd_flush, argc, argv, "h", flush_options, flush_option);
}

static int flush_exec(struct gs_cli *cli)
{
    int none;
    int rc = flush_daemon(cli, timeout_s > 0 ? timeout_s : 300, &none);
    if (!none)
        return rc;
    /* No daemon: do the work ourselves, as `push` (the project stays loaded). */
    char *push_argv[] = {"push", cli->json ? "--json" : NULL, NULL};
    return gs_cli_run(cli, &gs_cmd_push, cli->json ? 2 : 1, push_argv);
}

const struct gs_cmd gs_cmd_flush = {
    .name = "flush",
    .usage = "flush [--timeout SECONDS]",
    .summary = "Wait until the server has every change made so far",
    .help = "  --timeout SECONDS      give up after this long, 1 to 86400 (default 300)\n"
            "  With 'gpusync watch' disconnected, it reconnects at once, and fails if the\n"
            "  server cannot be reached. Without a running 'gpusync watch', pushes instead.\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = flush_parse,
    .exec = flush_exec,
};
