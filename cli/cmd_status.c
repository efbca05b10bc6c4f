/* cli/cmd_status.c: `gpusync status`: the watch daemon's state when one runs, else what is waiting
 * to be synced (local tree vs the index), without connecting; and the conflict copies the daemon
 * made, until `--ack`. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/progress.h"
#include "common/buf.h"
#include "common/quote.h"
#include "remote/target.h"
#include "syncd/conflicts.h"
#include "syncd/control.h"
#include "syncd/push.h"
#include "syncd/session.h"

enum { OPT_ACK = 2100 };

static const struct option status_options[] = {
    GS_CLI_COMMON_LONGOPTS, {"ack", no_argument, NULL, OPT_ACK}, {NULL, 0, NULL, 0}};

/* Adds op to `ops`: its path as JSON has it (U+FFFD for a byte that is not UTF-8), or for text
 * output as a human is shown it (common/quote.h), which the raw name is needed for. A file a push
 * would fail to send (`r`: unreadable here, a path too long) is pending too, with its `error`. */
static void collect_op(json_t *ops, const struct gs_plan_op *op, const struct gs_fop_result *r,
                       int text)
{
    struct gs_buf shown = GS_BUF_INIT;
    json_t *path = text ? json_string(gs_quote_str(&shown, op->path)) : gs_json_text(op->path);
    json_t *o = json_pack("{s:s,s:o}", "op", gs_plan_op_name(op->type), "path", path);
    if (r && !r->ok && r->message) {
        const char *names[] = {op->path, NULL};
        gs_buf_reset(&shown);
        gs_quote_message(&shown, r->message, names, 0);
        json_object_set_new(o, "error", text ? json_string(shown.data) : gs_json_text(r->message));
    }
    json_array_append_new(ops, o);
    gs_buf_release(&shown);
}

#define DAEMON_WAIT_MS 5000
static int daemon_silent; /* a daemon holds the project but did not answer in DAEMON_WAIT_MS */

static void print_human(struct gs_cli *cli, const char *target, json_t *ops,
                        const struct gs_push_stats *st, size_t unconfirmed)
{
    char b[32];
    printf("project: %s\nserver:  %s:%s\n", cli->root.data, target,
           cli->cfg.remote_path ? cli->cfg.remote_path : "");
    if (daemon_silent) /* stopped (SIGSTOP, a debugger) or stuck: what it does is unknown */
        printf("daemon:  running, but it did not answer in %d s; below is what waits here, seen "
               "from the folder\n",
               DAEMON_WAIT_MS / 1000);
    if (unconfirmed)
        printf("%zu operation%s of an interrupted sync unconfirmed: the server may hold more "
               "than the list below ('gpusync push' checks and settles them)\n",
               unconfirmed, unconfirmed == 1 ? "" : "s");
    if (json_array_size(ops) == 0 && !unconfirmed && daemon_silent) {
        printf("nothing to send since the last sync\n");
        return;
    }
    if (json_array_size(ops) == 0 && !unconfirmed) {
        printf("nothing to send since the last sync (no daemon running, so the server was not "
               "asked: 'gpusync push' checks it and puts back what was deleted or changed "
               "there; 'gpusync watch' keeps it so)\n");
        return;
    }
    printf("%zu change%s pending (%s to send):\n", json_array_size(ops),
           json_array_size(ops) == 1 ? "" : "s", gs_format_bytes(st->bytes_total, b));
    size_t i;
    json_t *op;
    json_array_foreach(ops, i, op)
    {
        if (i == 20) {
            printf("  ... and %zu more ('gpusync push --dry-run' lists them all)\n",
                   json_array_size(ops) - 20);
            break;
        }
        const char *error = json_string_value(json_object_get(op, "error"));
        if (error) /* it names the path itself */
            printf("  cannot send: %s\n", error);
        else
            printf("  %-8s %s\n", json_string_value(json_object_get(op, "op")),
                   json_string_value(json_object_get(op, "path")));
    }
}

void gs_cli_print_conflicts(json_t *conflicts)
{
    size_t n = json_array_size(conflicts), i;
    json_t *c;
    if (!n)
        return;
    printf("conflicts: the server had changed %zu file%s since gpusync wrote %s; its version%s "
           "kept beside:\n",
           n, n == 1 ? "" : "s", n == 1 ? "it" : "them", n == 1 ? " is" : "s are");
    struct gs_buf path = GS_BUF_INIT, kept = GS_BUF_INIT;
    json_array_foreach(conflicts, i, c)
    {
        printf("  %s -> %s\n", gs_quote_str(&path, json_string_value(json_object_get(c, "path"))),
               gs_quote_str(&kept, json_string_value(json_object_get(c, "kept"))));
    }
    gs_buf_release(&path);
    gs_buf_release(&kept);
    printf("  ('gpusync status --ack' once you have looked)\n");
}

/* Asks a running daemon. With `ack` one request both reads the status and acknowledges the
 * conflicts it lists, so that one found in between is not acknowledged unseen. Returns 0 after
 * printing, 1 when no daemon runs. */
static int daemon_status(struct gs_cli *cli, int ack)
{
    json_t *st;
    int rc = gs_control_request(cli->root.data, ack ? "ack_conflicts" : "status", DAEMON_WAIT_MS,
                                &st, &cli->err);
    daemon_silent = rc == GS_E_TIMEOUT;
    if (rc < 0)
        return 1;
    if (json_is_true(json_object_get(st, "stopped"))) { /* it stopped on its own: answer here */
        const char *why = json_string_value(json_object_get(st, "error"));
        struct gs_buf text = GS_BUF_INIT;
        gs_quote_message(&text, why ? why : "the watch daemon stopped", NULL, 0);
        if (!cli->json)
            fprintf(stderr, "gpusync: %s\n", text.data);
        gs_buf_release(&text);
        json_decref(st);
        return 1;
    }
    if (cli->json) {
        gs_cli_json_print(st);
        return 0;
    }
    json_t *err = json_object_get(st, "last_error"), *lat = json_object_get(st, "last_latency_ms");
    const char *transport = json_string_value(json_object_get(st, "transport"));
    printf("daemon:  running (pid %lld), %s %s%s\nstate:   %s, %lld pending\n",
           (long long)json_integer_value(json_object_get(st, "pid")),
           json_string_value(json_object_get(st, "target")),
           transport && *transport ? "via " : "(not connected)", transport ? transport : "",
           json_string_value(json_object_get(st, "state")),
           (long long)json_integer_value(json_object_get(st, "pending")));
    json_t *batch = json_object_get(st, "batch");
    /* no operation planned yet: the batch is still reading (and hashing) the changed files */
    if (batch && json_integer_value(json_object_get(batch, "ops_total")) == 0) {
        char done[32], total[32];
        printf(
            "sending: nothing yet, reading the changed files (%s of %s)\n",
            gs_format_bytes((uint64_t)json_integer_value(json_object_get(batch, "read_bytes")),
                            done),
            gs_format_bytes(
                (uint64_t)json_integer_value(json_object_get(batch, "read_bytes_total")), total));
    } else if (batch) {
        char done[32], total[32];
        printf("sending: %lld of %lld operations, %s of %s\n",
               (long long)json_integer_value(json_object_get(batch, "ops_done")),
               (long long)json_integer_value(json_object_get(batch, "ops_total")),
               gs_format_bytes((uint64_t)json_integer_value(json_object_get(batch, "bytes")), done),
               gs_format_bytes((uint64_t)json_integer_value(json_object_get(batch, "bytes_total")),
                               total));
    }
    if (json_is_integer(lat))
        printf("latency: last sync took %lld ms\n", (long long)json_integer_value(lat));
    json_t *since = json_object_get(st, "unreachable_since");
    if (json_is_string(since))
        printf("server:  unreachable since %s\n", json_string_value(since));
    if (json_is_string(err)) { /* it may name a file */
        struct gs_buf text = GS_BUF_INIT;
        gs_quote_message(&text, json_string_value(err), NULL, 0);
        printf("error:   %s\n", text.data);
        gs_buf_release(&text);
    }
    gs_cli_print_conflicts(json_object_get(st, "conflicts"));
    if (ack && json_array_size(json_object_get(st, "conflicts")))
        printf("(acknowledged: not listed again)\n");
    json_decref(st);
    return 0;
}

/* Acknowledges the conflict copies a daemon recorded before it stopped: none is listed again. */
static int acknowledge_recorded(struct gs_cli *cli, struct gs_session *s)
{
    json_t *none = json_array();
    int rc = gs_conflicts_save(s->idx, none, &cli->err);
    json_decref(none);
    return rc;
}

struct local_plan {
    json_t *ops;
    int text;               /* for text output: the paths as shown (collect_op) */
    struct gs_progress bar; /* reading the changed files, on a terminal (text output) */
};

static void collect_planned(void *ctx, const struct gs_plan_op *op, const struct gs_fop_result *r)
{
    struct local_plan *lp = ctx;
    collect_op(lp->ops, op, r, lp->text);
}

/* A large changed file takes a while to read: a bar says so. */
static int show_reading(void *ctx, const struct gs_plan_reading *r)
{
    struct local_plan *lp = ctx;
    gs_progress_update(&lp->bar, r->files_done, r->files_total, r->bytes_done, r->bytes_total);
    return 0;
}

/* What a push would do, computed here: the operations into `ops`, their totals into `st`, and
 * the operations an interrupted sync left unconfirmed. Returns 0 or a negative code. */
static int local_plan(struct gs_cli *cli, struct gs_session *s, json_t *ops,
                      struct gs_push_stats *st, size_t *unconfirmed)
{
    struct local_plan lp = {.ops = ops, .text = !cli->json};
    gs_progress_init(&lp.bar);
    lp.bar.label = "reading";
    lp.bar.quiet_ms = GS_PROGRESS_READING_QUIET_MS;
    lp.bar.enabled = lp.bar.enabled && !cli->json;
    struct gs_push_opts o = {
        .dry_run = 1, .on_op = collect_planned, .on_reading = show_reading, .ctx = &lp};
    /* Operations sent by a process that died before their answer: until a connection settles
     * them (syncd/reconcile.h) nobody knows what the server holds there, so never "up to date". */
    int rc = gs_index_intent_count(s->idx, unconfirmed, &cli->err);
    if (rc == 0)
        rc = gs_push_run(cli->root.data, s->ig, s->idx, NULL, &o, st, &cli->err);
    gs_progress_end(&lp.bar);
    return rc;
}

/* Without a daemon: the local answer. Returns the exit code. */
static int local_status(struct gs_cli *cli, int ack)
{
    struct gs_session s;
    int rc = gs_session_open(&s, cli->root.data, &cli->cfg, &cli->err);
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    json_t *ops = json_array(), *conflicts = NULL;
    struct gs_push_stats st;
    size_t unconfirmed = 0;
    rc = gs_conflicts_load(s.idx, &conflicts, &cli->err);
    if (rc == 0)
        rc = local_plan(cli, &s, ops, &st, &unconfirmed);
    if (rc == 0 && ack && json_array_size(conflicts)) /* only once they can be shown */
        rc = acknowledge_recorded(cli, &s);
    gs_session_close(&s);
    char target[320];
    gs_target_name(cli->cfg.host, cli->cfg.port, cli->cfg.user, target, sizeof(target));
    if (rc == 0 && cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:b,s:b,s:s,s:s,s:i,s:I,s:i,s:O,s:O}", "v", 1, "ok",
                                    1, "daemon", 0, "daemon_silent", daemon_silent, "state",
                                    json_array_size(ops) || unconfirmed ? "pending" : "up_to_date",
                                    "target", target, "pending", (int)json_array_size(ops),
                                    "bytes_pending", (json_int_t)st.bytes_total, "unconfirmed",
                                    (int)unconfirmed, "ops", ops, "conflicts", conflicts));
    else if (rc == 0) {
        print_human(cli, target, ops, &st, unconfirmed);
        gs_cli_print_conflicts(conflicts);
        if (ack && json_array_size(conflicts))
            printf("(acknowledged: not listed again)\n");
    }
    json_decref(ops);
    json_decref(conflicts);
    return rc < 0 ? gs_cli_fail(cli, rc) : 0;
}

static int ack; /* --ack */

static int status_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli, (void)arg;
    if (opt != OPT_ACK)
        return gs_cli_usage_error(&gs_cmd_status, "unexpected option");
    ack = 1;
    return 0;
}

static int status_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r =
        gs_cli_parse_options(cli, &gs_cmd_status, argc, argv, "h", status_options, status_option);
    if (r == 0 && cli->argc > 0) /* it takes no PATH: a stray word is a mistake, not a filter */
        return gs_cli_usage_error(&gs_cmd_status, "unexpected argument '%s'", cli->argv[0]);
    return r;
}

static int status_exec(struct gs_cli *cli)
{
    return daemon_status(cli, ack) == 0 ? 0 : local_status(cli, ack);
}

const struct gs_cmd gs_cmd_status = {
    .name = "status",
    .alias = "st",
    .usage = "status [--ack] [--json]",
    .summary = "Show the daemon's state, or what is waiting to be synced",
    .help = "  Lists the conflict copies the watch daemon kept on the server (the server had\n"
            "  changed a file since gpusync wrote it) until acknowledged, with or without a\n"
            "  daemon running, and after it restarted:\n"
            "  --ack                  show them once more, then stop listing them\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = status_parse,
    .exec = status_exec,
};
