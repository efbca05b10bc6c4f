/* cli/cmd_run.c: `gpusync run`: sync, launch a multi-rank job on the server (the bundled trainer,
 * a [job "NAME"] from the config, or any command), and follow its logs. Ctrl-C detaches (the job
 * keeps running); a second Ctrl-C within two seconds, or --stop-on-interrupt, stops it. The exit
 * code is the job's. Multi-node runs (--hosts) are in run_nodes.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/run.h"
#include "cli/run_slurm.h"
#include "cli/run_util.h"
#include "common/clock.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/exec.h"
#include "remote/runs.h"
#include "remote/target.h"
#include "remote/trainer_install.h"
#include "syncd/session.h"

_Static_assert(GS_CONFIG_MAX_CPU == GS_RUNS_MAX_RANKS, "one limit on ranks per node");

/* The most restarts the server's launcher takes (agent/launch.c, --max-restarts). */
#define GS_RUN_MAX_RESTARTS 1000000

enum {
    OPT_GPUS = 2000,
    OPT_CPU,
    OPT_MAX_RESTARTS,
    OPT_DETACH,
    OPT_NO_SYNC,
    OPT_NAME,
    OPT_RANKS,
    OPT_STOP_ON_INT,
    OPT_HOSTS,
    OPT_GRACE,
    OPT_WAIT,
    OPT_MASTER_ADDR,
    OPT_SLURM,
    OPT_NODES,
    OPT_GPUS_PER_NODE,
    OPT_PARTITION
};

static const struct option run_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"gpus", required_argument, NULL, OPT_GPUS},
    {"cpu", required_argument, NULL, OPT_CPU},
    {"max-restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"detach", no_argument, NULL, OPT_DETACH},
    {"no-sync", no_argument, NULL, OPT_NO_SYNC},
    {"name", required_argument, NULL, OPT_NAME},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"stop-on-interrupt", no_argument, NULL, OPT_STOP_ON_INT},
    {"hosts", required_argument, NULL, OPT_HOSTS},
    {"grace", required_argument, NULL, OPT_GRACE},
    {"wait", no_argument, NULL, OPT_WAIT},
    {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
    {"slurm", no_argument, NULL, OPT_SLURM},
    {"nodes", required_argument, NULL, OPT_NODES},
    {"gpus-per-node", required_argument, NULL, OPT_GPUS_PER_NODE},
    {"partition", required_argument, NULL, OPT_PARTITION},
    {NULL, 0, NULL, 0},
};

volatile sig_atomic_t gs_runcmd_interrupted;

void gs_runcmd_on_sigint(int sig)
{
    (void)sig;
    gs_runcmd_interrupted++;
}

/* ---- choosing GPUs ---- */

struct gpu {
    int index;
    double used;
};

static int gpu_cmp(const void *a, const void *b)
{
    const struct gpu *x = a, *y = b;
    return x->used < y->used ? -1 : x->used > y->used ? 1 : x->index - y->index;
}

/* Lists the server's GPUs by memory in use (nvidia-smi). Returns the count (0: none). */
static int list_gpus(struct gs_cli *cli, struct gpu *gpus, int max)
{
    struct gs_buf out = GS_BUF_INIT;
    int rc = gs_cli_capture(cli,
                            "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,"
                            "nounits 2>/dev/null",
                            &out);
    int n = 0;
    for (char *p = out.data; rc == 0 && p && *p && n < max; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (sscanf(p, "%d, %lf", &gpus[n].index, &gpus[n].used) == 2)
            n++;
        if (!strchr(p, '\n'))
            break;
    }
    gs_buf_release(&out);
    return n;
}

/* Checks a GPU list against the server's GPUs: every number must be one of theirs (a server
 * with none takes the list as given: CUDA_VISIBLE_DEVICES then means nothing). */
static int check_gpu_list(struct gs_cli *cli, const struct run_args *a, const struct gpu *gpus,
                          int have)
{
    for (const char *p = a->gpus; have > 0 && *p; p += strcspn(p, ","), p += *p == ',') {
        int dev = atoi(p), found = 0;
        for (int i = 0; i < have && !found; i++)
            found = gpus[i].index == dev;
        if (!found)
            return gs_error_set(&cli->err, GS_E_USAGE,
                                "%s has no GPU %d (it has %d: 0 to %d); %s names it",
                                gs_cli_server_name(cli), dev, have, have - 1, a->gpus_src);
    }
    return 0;
}

/* Turns the GPU request (a->gpus, checked when parsed) into what the launcher reserves: a list
 * as it is, a count N as every GPU of the server, least-used first, of which the launcher takes
 * the first N that no other run of ours holds (*count = N): only the server can choose among its
 * runs' reservations without a race. Asks the server (nvidia-smi), so it runs before the sync: a
 * request the server cannot meet at all is refused before any byte is sent. Returns 0 or a usage
 * error naming where the request came from. */
static int pick_gpus(struct gs_cli *cli, const struct run_args *a, struct gs_buf *list, int *count,
                     int *nproc)
{
    char why[300];
    const char *want = a->gpus ? a->gpus : "1";
    int n = gs_config_gpus_check(want, why, sizeof(why));
    struct gpu gpus[64];
    int have = list_gpus(cli, gpus, 64);
    if (strchr(want, ',')) {
        gs_buf_adds(list, want);
        *nproc = n;
        return check_gpu_list(cli, a, gpus, have);
    }
    if (have == 0)
        return gs_error_set(&cli->err, GS_E_USAGE,
                            "%s has no NVIDIA GPU (nvidia-smi found none); run CPU ranks with "
                            "--cpu N (in a [job]: cpu = N)",
                            gs_cli_server_name(cli));
    if (have < n)
        return gs_error_set(&cli->err, GS_E_USAGE, "%s has %d GPU%s; %s asks for %d",
                            gs_cli_server_name(cli), have, have == 1 ? "" : "s", a->gpus_src, n);
    qsort(gpus, (size_t)have, sizeof(gpus[0]), gpu_cmp);
    for (int i = 0; i < have; i++)
        gs_buf_addf(list, "%s%d", i ? "," : "", gpus[i].index);
    *count = n;
    *nproc = n;
    return 0;
}

/* ---- what to run ---- */

static void add_word(struct run_command *c, const char *w)
{
    if (c->argc >= 63)
        return;
    gs_buf_init(&c->words[c->argc]);
    gs_buf_adds(&c->words[c->argc], w);
    c->argv[c->argc] = c->words[c->argc].data;
    c->argc++;
}

void gs_runcmd_command_release(struct run_command *c)
{
    for (int i = 0; i < c->argc; i++)
        gs_buf_release(&c->words[i]);
}

/* Asks (through the watch daemon) whether this trainer build is on the server: 0 with its path,
 * 1 when it must be built, or a negative code. */
static int trainer_cached(struct gs_cli *cli, struct gs_buf *path)
{
    struct gs_buf probe = GS_BUF_INIT, out = GS_BUF_INIT;
    int rc = gs_trainer_locate(path, &probe, &cli->err);
    if (rc == 0)
        rc = gs_cli_capture(cli, probe.data, &out);
    if (rc >= 0)
        rc = out.data && strstr(out.data, "present") ? 0 : 1;
    if (rc != 0)
        gs_buf_reset(path);
    gs_buf_release(&probe);
    gs_buf_release(&out);
    return rc;
}

/* Appends argv, each quoted, to the shell line and adds `sh -c LINE` to the command. */
static void add_shell_line(struct run_command *c, struct gs_buf *line, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        gs_buf_addc(line, ' ');
        gs_shell_quote(line, argv[i]);
    }
    add_word(c, "sh");
    add_word(c, "-c");
    add_word(c, line->data);
}

/* The bundled trainer: built on the server on first use; its remote path starts with "~", which
 * the launcher's shell must expand, so it runs through sh -c. */
static int trainer_command(struct gs_cli *cli, const struct run_args *a, struct run_command *c)
{
    struct gs_buf path = GS_BUF_INIT, line = GS_BUF_INIT;
    const char *how = "";
    int rc = cli->ssh ? 1 : trainer_cached(cli, &path);
    if (rc == 1) { /* a build says what it does, step by step, on stderr */
        rc = gs_cli_ensure_connected(cli);
        if (rc == 0)
            rc = gs_trainer_install(cli->ssh, &path, &how, STDERR_FILENO, &cli->err);
    }
    if (rc == 0) {
        gs_buf_addf(&line, "exec %s --device %s", path.data, a->cpu ? "cpu" : "cuda");
        add_shell_line(c, &line, a->argc, a->argv);
    }
    gs_buf_release(&path);
    gs_buf_release(&line);
    return rc;
}

/* Decides what TARGET names, from the command line and the config alone (nothing remote), and
 * takes the job's GPUs or CPU ranks unless the command line gave some: what the config gets
 * wrong is reported before anything is synced. Returns 0 or a negative code in cli->err. */
static int choose_target(struct gs_cli *cli, struct run_args *a)
{
    snprintf(a->gpus_src, sizeof(a->gpus_src), "--gpus %s", a->gpus ? a->gpus : "1");
    a->kind = TARGET_ARGV;
    if (!a->target)
        return 0;
    const struct gs_job *job = gs_config_job(&cli->cfg, a->target);
    int trainer = strcmp(a->target, "train") == 0;
    if (!job && !trainer)
        return gs_error_set(&cli->err, GS_E_USAGE,
                            "no [job \"%s\"] in %s; run a command with: gpusync run -- CMD "
                            "ARGS...",
                            a->target, cli->cfg.file);
    if (job && !job->command && !trainer) /* only [job "train"] may leave it to the trainer */
        return gs_error_set(&cli->err, GS_E_CONFIG,
                            "%s: [job \"%s\"] has no command; add a line: command = CMD ARGS...",
                            cli->cfg.file, a->target);
    a->kind = job && job->command ? TARGET_JOB : TARGET_TRAINER;
    a->job = job;
    if (job && !a->gpus && !a->cpu) {
        a->gpus = job->gpus;
        a->cpu = job->cpu;
        snprintf(a->gpus_src, sizeof(a->gpus_src), "gpus = %s of [job \"%s\"] in %s",
                 job->gpus ? job->gpus : "1", job->name, cli->cfg.file);
    }
    if (a->kind == TARGET_TRAINER && !a->ranks)
        a->ranks = "0"; /* the trainer prints on rank 0 */
    return 0;
}

/* The launcher's argv for what choose_target decided (the trainer is built on the server first
 * if it must be). Returns 0 or a negative code in cli->err. */
int gs_runcmd_resolve(struct gs_cli *cli, struct run_args *a, struct run_command *c)
{
    if (a->kind == TARGET_TRAINER)
        return trainer_command(cli, a, c);
    if (a->kind == TARGET_ARGV) {
        for (int i = 0; i < a->argc; i++)
            add_word(c, a->argv[i]);
        return 0;
    }
    struct gs_buf line = GS_BUF_INIT;
    gs_buf_adds(&line, a->job->command);
    add_shell_line(c, &line, a->argc, a->argv);
    gs_buf_release(&line);
    return 0;
}

/* Settles the command and the devices on the connected server (cli): everything that asks the
 * server, so a request it cannot meet is refused before the sync. Returns 0 or a negative code in
 * cli->err; `p` is to be released either way. */
int gs_runcmd_plan(struct gs_cli *cli, struct run_args *a, struct run_plan *p)
{
    memset(p, 0, sizeof(*p));
    gs_buf_init(&p->gpus);
    p->nproc = a->cpu;
    int r = a->cpu ? 0 : pick_gpus(cli, a, &p->gpus, &p->gpu_count, &p->nproc);
    return r < 0 ? r : gs_runcmd_resolve(cli, a, &p->c);
}

void gs_runcmd_plan_release(struct run_plan *p)
{
    gs_runcmd_command_release(&p->c);
    gs_buf_release(&p->gpus);
}

void gs_runcmd_new_id(char id[64])
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(id, 64, "%Y%m%d-%H%M%S", &tm);
    snprintf(id + strlen(id), 64 - strlen(id), "-%04x", (unsigned)(gs_clock_mono_us() & 0xffff));
}

/* ---- following and interrupting ---- */

int gs_runcmd_wants_stop(const struct run_args *a, const char *detached)
{
    if (a->stop_on_interrupt)
        return 1;
    /* Every Ctrl-C after the first counts, from the first on: one that came while following
     * ended (slow when a node's link stalls) was typed within the 2 s, before this message. */
    fputs(detached, stderr);
    for (int i = 0; i < 20 && gs_runcmd_interrupted < 2; i++)
        usleep(100000);
    return gs_runcmd_interrupted >= 2;
}

static int handle_interrupt(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                            const struct run_args *a)
{
    struct gs_buf msg = GS_BUF_INIT;
    gs_buf_addf(&msg,
                "\ngpusync: detached; run %s keeps going on the server.\n"
                "  re-attach: gpusync logs -f %s\n  stop:      gpusync stop %s\n"
                "(Ctrl-C again within 2 s stops it now)\n",
                id, id, id);
    int stop = gs_runcmd_wants_stop(a, msg.data);
    gs_buf_release(&msg);
    if (!stop)
        return 130;
    struct gs_buf out = GS_BUF_INIT;
    int r = gs_run_ctx_stop(cli, rc, id, -1, &out);
    if (r == 0)
        fprintf(stderr, "gpusync: %s", out.data ? out.data : "stopped\n");
    gs_buf_release(&out);
    return r < 0 ? gs_cli_fail(cli, r) : 130;
}

/* What a single-host run prints: the logs, and the line that says it started. */
struct run_view {
    struct gs_log_printer printer; /* first: the log callbacks get this pointer */
    struct gs_cli *cli;
    const char *id;
    int nproc;
    int started; /* the launcher said so (until then it may be queuing for GPUs) */
};

/* "1,3" as a JSON array of integers; null for "". */
static json_t *gpus_json(const char *list)
{
    if (!*list)
        return json_null();
    json_t *arr = json_array();
    for (const char *p = list; *p; p += strcspn(p, ","), p += *p == ',')
        json_array_append_new(arr, json_integer(atoi(p)));
    return arr;
}

static void on_started(void *ctx, const struct gs_tail_state *st)
{
    struct run_view *v = ctx;
    if (!st->launched) { /* queued for GPUs (--wait); this says for which, and who holds them */
        fprintf(stderr, "gpusync: run %s waiting %s\n", v->id, st->waiting);
        return;
    }
    v->started = 1;
    char gpus[GS_PROTO_RUN_GPUS_MAX + 16] = "";
    if (st->gpus[0])
        snprintf(gpus, sizeof(gpus), ", GPU%s %s", strchr(st->gpus, ',') ? "s" : "", st->gpus);
    if (v->cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:i,s:i,s:o}", "v", 1, "ok", 1, "id", v->id,
                                    "ranks", v->nproc, "master_port", st->port, "gpus",
                                    gpus_json(st->gpus)));
    else
        fprintf(stderr, "gpusync: run %s started: %d rank%s on %s (MASTER_PORT %d%s)\n", v->id,
                v->nproc, v->nproc == 1 ? "" : "s", gs_cli_server_name(v->cli), st->port, gpus);
}

/* Says why a launch failed (r) and returns the exit status: the run's own code when its command
 * could not start (run_code > 0: 127 not found, 126 not executable), which is what `ps` records
 * and what `exec` of the same command exits with; else the error's. */
static int launch_failed(struct gs_cli *cli, int r, int run_code)
{
    int status = gs_cli_fail(cli, r);
    return run_code > 0 ? run_code : status;
}

/* Starts the run and follows its logs until it ends or Ctrl-C. */
static int launch_and_follow(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_run_spec *spec,
                             const struct run_args *a)
{
    struct run_view v = {.cli = cli, .id = spec->id, .nproc = spec->nproc};
    gs_log_printer_init(&v.printer, cli, spec->id,
                        spec->nproc > 1 &&
                            !(a->ranks && !strchr(a->ranks, ',') && strcmp(a->ranks, "all") != 0));
    v.printer.name = spec->name;
    struct sigaction sa = {.sa_handler = gs_runcmd_on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int exit_code = 0;
    int r = gs_run_ctx_launch_follow(cli, rc, spec, a->ranks, on_started, &v.printer,
                                     &gs_runcmd_interrupted, &exit_code);
    gs_log_printer_finish(&v.printer);
    if (r == GS_E_INTERRUPTED && !v.started) { /* the launcher sees us go and gives up */
        fprintf(stderr, "\ngpusync: stopped waiting; run %s was not started\n", spec->id);
        return 130;
    }
    if (r == GS_E_INTERRUPTED)
        return handle_interrupt(cli, rc, spec->id, a);
    if (r < 0)
        return launch_failed(cli, r, exit_code);
    return exit_code;
}

/* Starts the run and returns (--detach). */
static int launch_detached(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_run_spec *spec)
{
    struct gs_tail_state *st = gs_xcalloc(1, sizeof(*st)); /* zeroed: read even if never launched */
    struct gs_notice notice;
    int r = gs_run_ctx_agent(cli, rc);
    spec->agent = rc->agent.data;
    if (spec->wait_gpus)
        gs_notice_begin(&notice, GS_NOTICE_MS,
                        "run %s is waiting for GPUs that other runs hold (--wait); 'gpusync ps' "
                        "shows them; Ctrl-C gives up",
                        spec->id);
    if (r == 0)
        r = gs_run_launch_state(cli->ssh, spec, st, &cli->err);
    if (spec->wait_gpus)
        gs_notice_end(&notice);
    struct run_view v = {.cli = cli, .id = spec->id, .nproc = spec->nproc};
    if (r == 0)
        on_started(&v, st);
    int code = r < 0 ? launch_failed(cli, r, st->finished ? st->exit_code : 0) : 0;
    free(st);
    return code;
}

static int launch(struct gs_cli *cli, struct run_args *a, struct gs_run_ctx *rc, struct run_plan *p)
{
    char id[64];
    gs_runcmd_new_id(id);
    struct gs_run_spec spec = {.remote_dir = rc->dir.data,
                               .id = id,
                               .name = a->name,
                               .nproc = p->nproc,
                               .gpus = p->gpus.len ? p->gpus.data : NULL,
                               .gpu_count = p->gpu_count,
                               .wait_gpus = a->wait,
                               .max_restarts = a->max_restarts,
                               .grace_ms = a->grace_ms,
                               .argc = p->c.argc,
                               .argv = p->c.argv};
    return a->detach ? launch_detached(cli, rc, &spec) : launch_and_follow(cli, rc, &spec, a);
}

/* ---- options ---- */

static int parse_run_args(struct gs_cli *cli, int argc, char **argv, struct run_args *a)
{
    int opt, r;
    char why[300], *end;
    long restarts;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "+hd", run_options, NULL)) != -1) {
        switch (opt) {
        case OPT_GPUS:
            if (gs_config_gpus_check(optarg, why, sizeof(why)) < 1)
                return gs_cli_usage_error(&gs_cmd_run, "--gpus: %s", why);
            a->gpus = optarg;
            break;
        case OPT_CPU:
            a->cpu = (int)strtol(optarg, &end, 10);
            if (a->cpu < 1 || a->cpu > GS_CONFIG_MAX_CPU || *end || end == optarg)
                return gs_cli_usage_error(&gs_cmd_run, "--cpu %s: expected a rank count (1 to %d)",
                                          optarg, GS_CONFIG_MAX_CPU);
            break;
        case OPT_MAX_RESTARTS: /* checked here: the launcher would refuse it after the sync */
            if (gs_cli_parse_number(optarg, 0, GS_RUN_MAX_RESTARTS, &restarts) < 0)
                return gs_cli_usage_error(&gs_cmd_run,
                                          "--max-restarts %s: expected a count (0 to %d)", optarg,
                                          GS_RUN_MAX_RESTARTS);
            a->max_restarts = (int)restarts;
            break;
        case 'd':
        case OPT_DETACH:
            a->detach = 1;
            break;
        case OPT_NO_SYNC:
            a->no_sync = 1;
            break;
        case OPT_NAME:
            a->name = optarg;
            break;
        case OPT_RANKS:
            a->ranks = optarg;
            break;
        case OPT_STOP_ON_INT:
            a->stop_on_interrupt = 1;
            break;
        case OPT_HOSTS:
            a->hosts = optarg;
            break;
        case OPT_GRACE:
            if (gs_cli_parse_grace(optarg, &a->grace_ms, why, sizeof(why)) < 0)
                return gs_cli_usage_error(&gs_cmd_run, "%s", why);
            break;
        case OPT_WAIT:
            a->wait = 1;
            break;
        case OPT_MASTER_ADDR:
            a->master_addr = optarg;
            break;
        case OPT_SLURM:
            a->slurm = 1;
            break;
        case OPT_NODES:
        case OPT_GPUS_PER_NODE:
            if ((r = atoi(optarg)) < 1 || r > 4096)
                return gs_cli_usage_error(&gs_cmd_run, "--%s %s: expected a count (1 to 4096)",
                                          opt == OPT_NODES ? "nodes" : "gpus-per-node", optarg);
            *(opt == OPT_NODES ? &a->slurm_nodes : &a->slurm_gpus_per_node) = r;
            break;
        case OPT_PARTITION:
            a->slurm_partition = optarg;
            break;
        default:
            if ((r = gs_cli_common_option(cli, &gs_cmd_run, opt)) <= 0)
                return GS_EXIT_USAGE;
        }
    }
    if (a->gpus && a->cpu)
        return gs_cli_usage_error(&gs_cmd_run, "--gpus and --cpu exclude each other");
    if (a->slurm_gpus_per_node && a->cpu)
        return gs_cli_usage_error(&gs_cmd_run, "--gpus-per-node and --cpu exclude each other");
    if (a->wait && a->cpu)
        return gs_cli_usage_error(&gs_cmd_run, "--wait queues for GPUs; --cpu ranks use none");
    /* TARGET [-- ARGS...]  or  -- CMD ARGS... (getopt has consumed a leading "--") */
    int dashdash = optind > 1 && strcmp(argv[optind - 1], "--") == 0;
    if (optind < argc && !dashdash) {
        a->target = argv[optind++];
        if (optind < argc && strcmp(argv[optind], "--") == 0)
            optind++;
    }
    a->argc = argc - optind;
    a->argv = argv + optind;
    if (!a->target && a->argc == 0)
        return gs_cli_usage_error(&gs_cmd_run, "nothing to run: give a TARGET or -- CMD ARGS...");
    return 0;
}

static struct run_args args;

static int run_parse(struct gs_cli *cli, int argc, char **argv)
{
    return parse_run_args(cli, argc, argv, &args);
}

/* Needs the project first: whether the run needs [remote] (through the watch daemon when one
 * runs), or each of several hosts, is known once the config is read; and what the config gets
 * wrong is refused before anything connects. */
static int run_exec(struct gs_cli *cli)
{
    struct run_args *a = &args;
    int r = choose_target(cli, a);
    if (r < 0)
        return gs_cli_fail(cli, r);
    if ((a->slurm || cli->cfg.slurm.enabled) && (a->hosts || a->wait))
        return gs_cli_usage_error(&gs_cmd_run,
                                  "%s is for SSH servers; on Slurm the scheduler "
                                  "places and queues the job (--nodes N)",
                                  a->hosts ? "--hosts" : "--wait");
    if (a->slurm || cli->cfg.slurm.enabled) /* host is the login node */
        return (r = gs_cli_prepare(cli, GS_CMD_NEED_SERVER)) != 0 ? r : gs_runcmd_slurm(cli, a);
    if (!a->hosts)
        a->hosts = cli->cfg.hosts;
    if (a->hosts && a->wait) /* nodes that started would wait for one that queues */
        return gs_cli_usage_error(&gs_cmd_run, "--wait is for a run on one server, not --hosts");
    /* Each node's launcher restarts its own ranks only: the other nodes' ranks would go on
     * waiting in a collective for the ranks that failed, and the new ones would meet an old
     * rendezvous. Refused until the nodes restart together. */
    if (a->hosts && a->max_restarts > 0)
        return gs_cli_usage_error(&gs_cmd_run,
                                  "--max-restarts restarts the ranks of one server; with --hosts "
                                  "the other nodes would not restart with them, so it is refused "
                                  "(restart the run instead)");
    if (!a->master_addr)
        a->master_addr = cli->cfg.master_addr;
    if (a->hosts)
        return gs_runcmd_multi(cli, a);
    if ((r = gs_cli_prepare(cli, GS_CMD_NEED_SERVER)) != 0)
        return r;
    struct gs_run_ctx rc;
    struct run_plan plan;
    gs_run_ctx_init(cli, &rc); /* the agent is found by the launch itself */
    /* The server is asked what it can run (GPUs, the trainer) before the sync, not after it: the
     * answer needs the connection the sync uses anyway, and a refusal then costs no upload. */
    r = gs_runcmd_plan(cli, a, &plan);
    if (r == 0)
        r = gs_run_check_ranks(cli, "--ranks", a->ranks, plan.nproc, "the run");
    if (r == 0 && !a->no_sync)
        r = gs_cli_sync(cli);
    int code = r < 0 ? gs_cli_fail(cli, r) : launch(cli, a, &rc, &plan);
    gs_runcmd_plan_release(&plan);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_run = {
    .name = "run",
    .usage = "run [--gpus N|LIST [--wait] | --cpu N] [--hosts H1,H2... [--master-addr ADDR]]\n"
             "                   [--max-restarts K] [--detach] [--no-sync] [--name NAME]\n"
             "                   [--ranks all|0,1] [--stop-on-interrupt] [--grace SECONDS]\n"
             "                   [--slurm [--nodes N] [--gpus-per-node G] [--partition P]]\n"
             "                   [TARGET [-- ARGS...] | -- CMD ARGS...]",
    .summary = "Sync, then run a multi-rank job on the server and follow its logs",
    .help =
        "  --gpus N | --gpus 0,2  the N least-busy GPUs that no other run holds, or exactly\n"
        "                         these (default: the job's gpus or cpu, else 1 GPU). A run\n"
        "                         holds its GPUs on the server until it ends; when too few are\n"
        "                         free the run is refused, naming the runs that hold them\n"
        "  --wait                 queue until enough GPUs are free instead (says what it waits\n"
        "                         for; Ctrl-C gives up)\n"
        "  --cpu N                N CPU ranks (the trainer's TCP all-reduce); they see no GPU\n"
        "  --max-restarts K       restart the whole group up to K times after a failure\n"
        "                         (one server only: not with --hosts)\n"
        "  -d, --detach           start it and return; follow later with 'gpusync logs -f'\n"
        "  --no-sync              launch without syncing first\n"
        "  --name NAME            a name to use instead of the run id (runs may share one:\n"
        "                         logs takes the newest, stop the newest still running)\n"
        "  --ranks all|0,1        whose logs to show (default all; the trainer: 0)\n"
        "  --stop-on-interrupt    Ctrl-C stops the run instead of detaching\n"
        "  --grace SECONDS        when the run is stopped (or a rank fails), how long its\n"
        "                         processes get after SIGTERM before SIGKILL (default 10)\n"
        "  --hosts H1,H2,...      a multi-node run (default: [remote] hosts): each host is\n"
        "                         [user@]host[:port][/abs/path] (path default: [remote] path);\n"
        "                         the first is the master. Each host is synced and runs the\n"
        "                         ranks (--gpus/--cpu) as node 0, 1, ... with WORLD_SIZE = nodes\n"
        "                         x ranks and node 0's free MASTER_PORT; when one node fails\n"
        "                         while run follows, the others are stopped (a detached run's\n"
        "                         go on: gpusync stop ID). logs, ps and stop then act on every\n"
        "                         node of the run (this machine keeps its node list)\n"
        "  --master-addr ADDR     MASTER_ADDR of a multi-node run (default: [remote]\n"
        "                         master_addr, else node 0's address on its route to node 1,\n"
        "                         as the agent finds it there; 'gpusync doctor' checks it)\n"
        "  --slurm                submit to Slurm through the login node (default when\n"
        "                         [remote] scheduler = slurm): sbatch runs a script gpusync\n"
        "                         writes to .gpusync/runs/<id>/job.sbatch, srun starts one task\n"
        "                         per GPU (or --cpu N tasks) with torchrun's environment from\n"
        "                         Slurm's; shows 'pending: REASON' while it waits. The exit\n"
        "                         status is the job's; ps, logs -f and stop (scancel) follow it\n"
        "  --nodes N, --gpus-per-node G, --partition P\n"
        "                         override [remote] nodes, gpus_per_node, partition\n"
        "  TARGET is a [job \"NAME\"] from the config (command, and gpus or cpu); 'train' is\n"
        "  the bundled trainer unless such a job has a command. What the server cannot run\n"
        "  (more GPUs than it has) and what the config gets wrong are refused before the\n"
        "  sync. Ranks get torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK,\n"
        "  MASTER_ADDR, a free MASTER_PORT, CUDA_VISIBLE_DEVICES, ...). Exit status: the\n"
        "  job's (the first failing rank's; 128+N for signal N), 130 after Ctrl-C, 255 if the\n"
        "  connection failed.\n",
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_REMOTE_STATUS,
    .parse = run_parse,
    .exec = run_exec,
};
