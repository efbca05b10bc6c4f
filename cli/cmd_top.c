/* cli/cmd_top.c: `gpusync top [--json] [--count N] [--interval S] [--node N]`: a live view of
 * the server while a run trains: GPUs, CPU, memory, disks, network and the current run's ranks
 * and samples/s; with `[remote] hosts` (several nodes), of one node, which the view names. One
 * `gpusync-agent sample` process on the server streams a JSON line per interval (agent/sample.h)
 * over one channel, the watch daemon's spare connection when a daemon runs; this file redraws a
 * plain-ANSI screen from each line, or passes the lines on (--json) for editors. Ctrl-C closes
 * the channel, and the sampler, which watches its stdout, exits with it. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/run_nodes.h"
#include "cli/run_util.h"

enum { OPT_COUNT = 2000, OPT_INTERVAL, OPT_NODE };

static const struct option top_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"count", required_argument, NULL, OPT_COUNT},
    {"interval", required_argument, NULL, OPT_INTERVAL},
    {"node", required_argument, NULL, OPT_NODE},
    {NULL, 0, NULL, 0},
};

static struct {
    long count;
    long interval_ms;
    long node; /* the index in [remote] hosts; 0 is [remote] itself */
} opts = {0, 1000, 0};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* What the stream's reader keeps between chunks. */
struct top_view {
    struct gs_cli *cli; /* pointed at the node shown */
    int node, nodes;    /* which node of how many ([remote] hosts); nodes 0 without a list */
    int tty;            /* stdout is a terminal: redraw in place */
    struct gs_buf line; /* the unfinished last line */
    struct gs_buf screen;
    long shown;
};

/* ---- formatting -------------------------------------------------------------------------- */

/* A string of the server's, made safe to draw (gs_cli_terminal_safe): each call has its own copy
 * among the last few, so that several may be held at once. */
static const char *str(json_t *o, const char *key, const char *missing)
{
    static char ring[8][256];
    static unsigned next;
    const char *s = json_string_value(json_object_get(o, key));
    if (!s)
        return missing;
    char *copy = ring[next++ % 8];
    snprintf(copy, sizeof(ring[0]), "%s", s);
    return gs_cli_terminal_safe(copy);
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* A number with `decimals` places, or "-" when unknown (null), then `unit`. */
static void add_num(struct gs_buf *b, double v, int decimals, const char *unit)
{
    if (isnan(v))
        gs_buf_addf(b, "-%s", unit);
    else
        gs_buf_addf(b, "%.*f%s", decimals, v, unit);
}

/* A rate such as samples/s: whole from 100 up (51234), else to 3 significant digits (0.4, 12.3),
 * so a slow run does not read as 0. */
static void add_rate(struct gs_buf *b, double v, const char *unit)
{
    if (isnan(v) || v >= 100)
        add_num(b, v, 0, unit);
    else
        gs_buf_addf(b, "%.3g%s", v, unit);
}

/* "GPU0 87% 31.2/79.6 GiB 250 W 64°C" */
static void format_gpu(struct gs_buf *b, json_t *gpu)
{
    gs_buf_adds(b, "GPU");
    add_num(b, num(gpu, "index"), 0, " ");
    add_num(b, num(gpu, "util_pct"), 0, "% ");
    add_num(b, num(gpu, "mem_used_mib") / 1024, 1, "/");
    add_num(b, num(gpu, "mem_total_mib") / 1024, 1, " GiB ");
    add_num(b, num(gpu, "power_w"), 0, " W ");
    add_num(b, num(gpu, "temp_c"), 0,
            "\xc2\xb0"
            "C");
}

/* The one-line GPU summary editors show: each GPU's format_gpu, joined by " | ", or "no GPUs"
 * (gpu_error says why: too long for a status line). */
static void gpu_summary(json_t *sample, struct gs_buf *b)
{
    json_t *gpus = json_object_get(sample, "gpus"), *gpu;
    size_t i;
    json_array_foreach(gpus, i, gpu)
    {
        if (i)
            gs_buf_adds(b, " | ");
        format_gpu(b, gpu);
    }
    if (json_array_size(gpus) == 0)
        gs_buf_adds(b, "no GPUs");
}

static void render_cpu(struct gs_buf *b, json_t *s)
{
    json_t *cpu = json_object_get(s, "cpu"), *mem = json_object_get(s, "memory");
    gs_buf_adds(b, "CPU  ");
    add_num(b, num(cpu, "util_pct"), 1, "%");
    gs_buf_adds(b, " (iowait ");
    add_num(b, num(cpu, "iowait_pct"), 1, "%) ");
    gs_buf_adds(b, "load ");
    add_num(b, num(cpu, "load1"), 2, " ");
    add_num(b, num(cpu, "load5"), 2, " ");
    add_num(b, num(cpu, "load15"), 2, " ");
    add_num(b, num(cpu, "cores"), 0, " cores   Mem ");
    add_num(b, num(mem, "used_mib") / 1024, 1, "/");
    add_num(b, num(mem, "total_mib") / 1024, 1, " GiB\n");
}

static void render_gpus(struct gs_buf *b, json_t *s)
{
    json_t *gpus = json_object_get(s, "gpus"), *gpu;
    size_t i;
    json_array_foreach(gpus, i, gpu)
    {
        gs_buf_adds(b, "     ");
        format_gpu(b, gpu);
        gs_buf_addf(b, "  %s\n", str(gpu, "name", ""));
    }
    if (json_array_size(gpus) == 0)
        gs_buf_addf(b, "GPU  none: %s\n", str(s, "gpu_error", "nvidia-smi listed none"));
}

/* "Disk vda      read    0.5 MB/s  write 1920.0 MB/s", one line per device. */
static void render_rates(struct gs_buf *b, json_t *list, const char *title, const char *ka,
                         const char *la, const char *kb, const char *lb)
{
    json_t *d;
    size_t i;
    json_array_foreach(list, i, d)
    {
        gs_buf_addf(b, "%-5s%-12s %s ", i ? "" : title, str(d, "name", "?"), la);
        gs_buf_addf(b, "%8.1f MB/s  %s %8.1f MB/s\n", num(d, ka), lb, num(d, kb));
    }
}

static void render_run(struct gs_buf *b, json_t *s)
{
    json_t *run = json_object_get(s, "run"), *rank;
    size_t i;
    if (!json_is_object(run)) {
        gs_buf_adds(b, "Run  none running\n");
        return;
    }
    char paused[32]; /* "paused..." is ours; the server's own state is drawn made safe (str) */
    const char *state = gs_run_state_text(run, paused, sizeof(paused));
    gs_buf_addf(b, "Run  %s %s  samples/s ", str(run, "id", "?"),
                state == paused ? paused : str(run, "state", "?"));
    add_rate(b, num(run, "samples_per_s"), "\n");
    json_array_foreach(json_object_get(run, "ranks"), i, rank)
    {
        /* a stopped rank makes no progress: "running" would say it does */
        int held = json_is_true(json_object_get(rank, "paused"));
        gs_buf_addf(b, "     rank %-3.0f pid %-8.0f %s", num(rank, "rank"), num(rank, "pid"),
                    held ? "paused (stopped by a signal)" : str(rank, "state", "?"));
        if (json_is_integer(json_object_get(rank, "exit_code")))
            gs_buf_addf(b, " (exit %.0f)", num(rank, "exit_code"));
        gs_buf_addc(b, '\n');
    }
}

/* The whole screen for one sample. */
static void render(struct top_view *v, json_t *s)
{
    struct gs_buf *b = &v->screen;
    gs_buf_reset(b);
    if (v->tty)
        gs_buf_adds(b, "\033[H\033[J"); /* home, clear: a redraw in place */
    gs_buf_adds(b, "gpusync top  ");
    if (v->nodes > 1) /* the other nodes' ranks are not on this screen: say whose it is */
        gs_buf_addf(b, "node %d of %d  ", v->node, v->nodes);
    gs_buf_addf(b, "%s  %s%s\n", gs_cli_server_name(v->cli), str(s, "time", ""),
                v->tty ? "  (Ctrl-C quits)" : "");
    render_cpu(b, s);
    render_gpus(b, s);
    render_rates(b, json_object_get(s, "disks"), "Disk", "read_mb_s", "read ", "write_mb_s",
                 "write");
    render_rates(b, json_object_get(s, "net"), "Net", "rx_mb_s", "rx   ", "tx_mb_s", "tx   ");
    render_run(b, s);
    if (!v->tty)
        gs_buf_addc(b, '\n');
    fwrite(b->data, 1, b->len, stdout);
    fflush(stdout);
}

/* --json: the sampler's object with the contract's "v" and "ok", the editors' summary and, with
 * several nodes, which one it is. */
static void print_json(const struct top_view *v, json_t *s)
{
    struct gs_buf summary = GS_BUF_INIT;
    gpu_summary(s, &summary);
    if (v->nodes > 1) {
        json_object_set_new(s, "node", json_integer(v->node));
        json_object_set_new(s, "nodes", json_integer(v->nodes));
    }
    json_object_set_new(s, "gpu_summary", json_string(summary.data ? summary.data : ""));
    json_object_set_new(s, "ok", json_true());
    json_object_set_new(s, "v", json_integer(GS_CLI_JSON_VERSION));
    /* 10 significant digits: 2387.21, not 2387.2100000000000 */
    char *text = json_dumps(s, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(10));
    if (text)
        puts(text);
    free(text);
    fflush(stdout);
    gs_buf_release(&summary);
}

/* gs_run_out_fn: shows each complete line. Returns -1 on a line that is not a JSON object. */
static int on_output(void *ctx, const char *data, size_t len)
{
    struct top_view *v = ctx;
    gs_buf_add(&v->line, data, len);
    char *nl;
    while (v->line.len && (nl = memchr(v->line.data, '\n', v->line.len))) {
        json_t *s = json_loadb(v->line.data, (size_t)(nl - v->line.data), 0, NULL);
        gs_buf_consume(&v->line, (size_t)(nl - v->line.data) + 1);
        if (!json_is_object(s)) {
            json_decref(s);
            return -1;
        }
        if (v->cli->json)
            print_json(v, s);
        else
            render(v, s);
        v->shown++;
        json_decref(s);
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------- */

static int top_option(struct gs_cli *cli, int opt, const char *arg)
{
    char *end;
    if (opt == OPT_COUNT) {
        opts.count = strtol(arg, &end, 10);
        if (*end || end == arg || opts.count < 1)
            return gs_cli_usage_error(&gs_cmd_top, "--count needs a number of samples >= 1");
    } else if (opt == OPT_INTERVAL) {
        double s = strtod(arg, &end);
        if (*end || end == arg || !(s >= 0.1 && s <= 3600))
            return gs_cli_usage_error(&gs_cmd_top, "--interval needs seconds from 0.1 to 3600");
        opts.interval_ms = (long)(s * 1000 + 0.5);
    } else if (opt == OPT_NODE) {
        opts.node = strtol(arg, &end, 10);
        if (*end || end == arg || opts.node < 0 || opts.node > 9999)
            return gs_cli_usage_error(&gs_cmd_top, "--node needs a node index (0 is [remote])");
        if (opts.node > 0) /* another server: no need for [remote]'s connection */
            cli->needs &= ~GS_CMD_NEED_SERVER;
    } else {
        return gs_cli_usage_error(&gs_cmd_top, "unexpected option");
    }
    return 0;
}

static int top_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_top, argc, argv, "h", top_options, top_option);
    if (r == 0 && cli->argc)
        return gs_cli_usage_error(&gs_cmd_top, "no operands expected");
    return r;
}

/* Streams the sampler into `v` until --count samples, Ctrl-C or an error. Returns the exit
 * code. */
static int stream(struct gs_cli *cli, struct top_view *v)
{
    struct gs_run_ctx rc;
    struct gs_buf args = GS_BUF_INIT, errout = GS_BUF_INIT;
    gs_run_ctx_init(cli, &rc);
    gs_buf_addf(&args, "--interval-ms %ld --count %ld", opts.interval_ms, opts.count);
    int r = gs_run_ctx_stream(cli, &rc, GS_PROTO_RUN_SAMPLE, args.data, on_output, v, &errout,
                              &interrupted);
    int code = 0;
    if (r == GS_E_INTERRUPTED)
        code = 0; /* Ctrl-C is how a live view ends */
    else if (r == GS_E_PROTO)
        code = gs_cli_fail(cli, gs_error_set(&cli->err, r, "garbled readings from the server"));
    else if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (r > 0)
        code = gs_cli_fail(
            cli, gs_error_set(&cli->err, GS_E_REMOTE, "the sampler on %s failed (exit %d): %s",
                              gs_cli_server_name(cli), r, errout.len ? errout.data : "no message"));
    gs_buf_release(&args);
    gs_buf_release(&errout);
    gs_run_ctx_release(&rc);
    return code;
}

/* Points v at node opts.node of [remote] hosts (held in m), connected unless it is [remote]
 * itself, which keeps the watch daemon's way there. Returns 0 or an exit code, said. */
static int choose_node(struct gs_cli *cli, struct gs_nodes *m, struct top_view *v)
{
    if (!cli->cfg.hosts) {
        if (opts.node == 0)
            return 0;
        gs_error_set(&cli->err, GS_E_USAGE,
                     "--node %ld: this project has one server ([remote] has no hosts list)",
                     opts.node);
        return gs_cli_fail(cli, GS_E_USAGE);
    }
    int r = gs_nodes_init(cli, m, NULL, cli->cfg.hosts);
    if (r < 0)
        return gs_cli_fail(cli, r);
    if (opts.node >= m->n) {
        gs_error_set(&cli->err, GS_E_USAGE, "--node %ld: [remote] hosts has nodes 0 to %d",
                     opts.node, m->n - 1);
        return gs_cli_fail(cli, GS_E_USAGE);
    }
    struct gs_node *n = &m->nodes[opts.node];
    v->node = (int)opts.node;
    v->nodes = m->n;
    if (n->primary)
        return 0;
    v->cli = &n->cli;
    r = gs_cli_connect(&n->cli);
    if (r < 0) {
        struct gs_error why = n->cli.err; /* a copy: the message is rewritten in place */
        gs_error_set(&cli->err, r, "%s cannot be reached: %s", gs_node_name(n, v->node), why.msg);
        return gs_cli_fail(cli, r);
    }
    return 0;
}

static int top_exec(struct gs_cli *cli)
{
    struct top_view v = {.cli = cli, .line = GS_BUF_INIT, .screen = GS_BUF_INIT};
    struct gs_nodes m = {0};
    int code = choose_node(cli, &m, &v);
    v.tty = !cli->json && isatty(STDOUT_FILENO);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (v.tty && code == 0)
        fputs("\033[?25l", stdout); /* no cursor blinking over the redraws */
    if (code == 0)
        code = stream(v.cli, &v);
    if (v.tty)
        fputs("\033[?25h", stdout);
    fflush(stdout);
    gs_buf_release(&v.line);
    gs_buf_release(&v.screen);
    if (m.nodes)
        gs_nodes_release(&m);
    return code;
}

const struct gs_cmd gs_cmd_top = {
    .name = "top",
    .usage = "top [--json] [--count N] [--interval S] [--node N]",
    .summary = "Watch the server live: GPUs, CPU, disks, network, the current run",
    .help = "  --count N              stop after N samples (default: until Ctrl-C)\n"
            "  --interval S           seconds between samples (default 1; 0.1 to 3600)\n"
            "  --node N               with [remote] hosts (several nodes): show node N (default\n"
            "                         0, [remote] itself); the view names the node it shows\n"
            "  Per GPU: utilisation, memory, power, temperature (nvidia-smi); CPU utilisation\n"
            "  and load; memory; read/write MB/s per disk (/proc/diskstats, as iostat -m);\n"
            "  rx/tx MB/s per network interface; the newest running run's ranks and, for the\n"
            "  bundled trainer, its samples/s. One sampler process on the server streams the\n"
            "  readings (through the watch daemon's connection when it runs); Ctrl-C exits 0\n"
            "  and ends it. --json prints one object per sample, with a one-line\n"
            "  gpu_summary for editors (docs/json-contract.md).\n",
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_NEED_SERVER,
    .parse = top_parse,
    .exec = top_exec,
};
