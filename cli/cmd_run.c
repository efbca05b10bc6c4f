/* cli/cmd_run.c: `gpusync run`: sync, launch a multi-rank job on the server (the bundled trainer,
 * a [job "NAME"] from the config, or any command), and follow its logs. Ctrl-C detaches (the job
 * keeps running); a second Ctrl-C within two seconds, or --stop-on-interrupt, stops it. The exit
 * code is the job's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/run_util.h"
#include "common/clock.h"
#include "common/shell.h"
#include "remote/exec.h"
#include "remote/trainer_install.h"

enum {
    OPT_GPUS = 2000,
    OPT_CPU,
    OPT_MAX_RESTARTS,
    OPT_DETACH,
    OPT_NO_SYNC,
    OPT_NAME,
    OPT_RANKS,
    OPT_STOP_ON_INT
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
    {NULL, 0, NULL, 0},
};

struct run_args {
    const char *gpus; /* "2" or "0,2" */
    int cpu;          /* CPU ranks */
    int max_restarts;
    int detach, no_sync, stop_on_interrupt;
    const char *name;
    const char *ranks;
    const char *target;
    int argc; /* the command (after --), or extra arguments for TARGET */
    char **argv;
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted++;
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
    int rc = gs_exec_capture(cli->ssh,
                             "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,"
                             "nounits 2>/dev/null",
                             &out, NULL, &cli->err);
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

/* Turns --gpus N into the N least-used GPUs ("0,2"). Returns 0 or a usage error. */
static int pick_gpus(struct gs_cli *cli, const char *want, struct gs_buf *list, int *nproc)
{
    if (strchr(want, ',')) {
        gs_buf_adds(list, want);
        *nproc = 1;
        for (const char *p = want; *p; p++)
            *nproc += *p == ',';
        return 0;
    }
    int n = atoi(want);
    struct gpu gpus[64];
    int have = list_gpus(cli, gpus, 64);
    if (n < 1)
        return gs_error_set(&cli->err, GS_E_USAGE, "--gpus %s: expected a count or a list", want);
    if (have == 0)
        return gs_error_set(&cli->err, GS_E_USAGE,
                            "%s has no NVIDIA GPU (nvidia-smi found none); run CPU ranks with "
                            "--cpu N",
                            gs_ssh_target(cli->ssh));
    if (have < n)
        return gs_error_set(&cli->err, GS_E_USAGE, "%s has %d GPU%s; --gpus %d asks for more",
                            gs_ssh_target(cli->ssh), have, have == 1 ? "" : "s", n);
    qsort(gpus, (size_t)have, sizeof(gpus[0]), gpu_cmp);
    for (int i = 0; i < n; i++)
        gs_buf_addf(list, "%s%d", i ? "," : "", gpus[i].index);
    *nproc = n;
    return 0;
}

/* ---- what to run ---- */

struct command {
    struct gs_buf words[64]; /* argv for the launcher */
    char *argv[64];
    int argc;
};

static void add_word(struct command *c, const char *w)
{
    if (c->argc >= 63)
        return;
    gs_buf_init(&c->words[c->argc]);
    gs_buf_adds(&c->words[c->argc], w);
    c->argv[c->argc] = c->words[c->argc].data;
    c->argc++;
}

static void release_command(struct command *c)
{
    for (int i = 0; i < c->argc; i++)
        gs_buf_release(&c->words[i]);
}

/* The bundled trainer: built on the server on first use; its remote path starts with "~", which
 * the launcher's shell must expand, so it runs through sh -c. */
static int trainer_command(struct gs_cli *cli, const struct run_args *a, struct command *c)
{
    struct gs_buf path = GS_BUF_INIT, line = GS_BUF_INIT;
    const char *how = "";
    fprintf(stderr, "gpusync: preparing the bundled trainer on the server...\n");
    int rc = gs_trainer_install(cli->ssh, &path, &how, &cli->err);
    if (rc == 0) {
        gs_buf_addf(&line, "exec %s --device %s", path.data, a->cpu ? "cpu" : "cuda");
        for (int i = 0; i < a->argc; i++) {
            gs_buf_addc(&line, ' ');
            gs_shell_quote(&line, a->argv[i]);
        }
        add_word(c, "sh");
        add_word(c, "-c");
        add_word(c, line.data);
    }
    gs_buf_release(&path);
    gs_buf_release(&line);
    return rc;
}

static int resolve_command(struct gs_cli *cli, struct run_args *a, struct command *c)
{
    if (!a->target) {
        for (int i = 0; i < a->argc; i++)
            add_word(c, a->argv[i]);
        return 0;
    }
    const struct gs_job *job = gs_config_job(&cli->cfg, a->target);
    if (job && job->command) {
        struct gs_buf line = GS_BUF_INIT;
        gs_buf_adds(&line, job->command);
        for (int i = 0; i < a->argc; i++) {
            gs_buf_addc(&line, ' ');
            gs_shell_quote(&line, a->argv[i]);
        }
        add_word(c, "sh");
        add_word(c, "-c");
        add_word(c, line.data);
        gs_buf_release(&line);
        if (!a->gpus && !a->cpu && job->gpus)
            a->gpus = job->gpus;
        return 0;
    }
    if (strcmp(a->target, "train") == 0) {
        if (!a->ranks)
            a->ranks = "0"; /* the trainer prints on rank 0 */
        return trainer_command(cli, a, c);
    }
    return gs_error_set(&cli->err, GS_E_USAGE,
                        "no [job \"%s\"] in %s; run a command with: gpusync run -- CMD ARGS...",
                        a->target, cli->cfg.file);
}

static void make_run_id(char id[64])
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(id, 64, "%Y%m%d-%H%M%S", &tm);
    snprintf(id + strlen(id), 64 - strlen(id), "-%04x", (unsigned)(gs_clock_mono_us() & 0xffff));
}

/* ---- following and interrupting ---- */

static int handle_interrupt(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                            const struct run_args *a)
{
    int stop = a->stop_on_interrupt;
    if (!stop) {
        fprintf(stderr,
                "\ngpusync: detached; run %s keeps going on the server.\n"
                "  re-attach: gpusync logs -f %s\n  stop:      gpusync stop %s\n"
                "(Ctrl-C again within 2 s stops it now)\n",
                id, id, id);
        interrupted = 0;
        for (int i = 0; i < 20 && !interrupted; i++)
            usleep(100000);
        stop = interrupted > 0;
    }
    if (!stop)
        return 130;
    struct gs_buf out = GS_BUF_INIT;
    int r = gs_run_stop(cli->ssh, rc->agent.data, rc->dir.data, id, &out, &cli->err);
    if (r == 0)
        fprintf(stderr, "gpusync: %s", out.data ? out.data : "stopped\n");
    gs_buf_release(&out);
    return r < 0 ? gs_cli_fail(cli, r) : 130;
}

static int follow(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, int nprocs,
                  const struct run_args *a)
{
    struct gs_log_printer printer;
    gs_log_printer_init(&printer, cli, id,
                        nprocs > 1 &&
                            !(a->ranks && !strchr(a->ranks, ',') && strcmp(a->ranks, "all") != 0));
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int exit_code = 0;
    int r = gs_run_follow(cli, rc, id, a->ranks, &printer, &interrupted, &exit_code);
    gs_log_printer_finish(&printer);
    if (r == GS_E_INTERRUPTED)
        return handle_interrupt(cli, rc, id, a);
    if (r < 0)
        return gs_cli_fail(cli, r);
    return exit_code;
}

static int launch(struct gs_cli *cli, struct run_args *a, struct gs_run_ctx *rc)
{
    struct command c = {.argc = 0};
    struct gs_buf gpus = GS_BUF_INIT;
    int nproc = a->cpu, r = 0;
    if (!a->cpu)
        r = pick_gpus(cli, a->gpus ? a->gpus : "1", &gpus, &nproc);
    if (r == 0)
        r = resolve_command(cli, a, &c);
    char id[64];
    make_run_id(id);
    struct gs_run_spec spec = {.agent = rc->agent.data,
                               .remote_dir = rc->dir.data,
                               .id = id,
                               .name = a->name,
                               .nproc = nproc,
                               .gpus = gpus.len ? gpus.data : NULL,
                               .max_restarts = a->max_restarts,
                               .argc = c.argc,
                               .argv = c.argv};
    long pid = 0;
    int port = 0;
    if (r == 0)
        r = gs_run_launch(cli->ssh, &spec, &pid, &port, &cli->err);
    release_command(&c);
    gs_buf_release(&gpus);
    if (r < 0)
        return gs_cli_fail(cli, r);
    if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:i,s:i}", "v", 1, "ok", 1, "id", id, "ranks",
                                    nproc, "master_port", port));
    else
        fprintf(stderr, "gpusync: run %s started: %d rank%s on %s (MASTER_PORT %d)\n", id, nproc,
                nproc == 1 ? "" : "s", gs_ssh_target(cli->ssh), port);
    return a->detach ? 0 : follow(cli, rc, id, nproc, a);
}

/* ---- options ---- */

static int parse_run_args(struct gs_cli *cli, int argc, char **argv, struct run_args *a)
{
    int opt, r;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "+hd", run_options, NULL)) != -1) {
        switch (opt) {
        case OPT_GPUS:
            a->gpus = optarg;
            break;
        case OPT_CPU:
            if ((a->cpu = atoi(optarg)) < 1)
                return gs_cli_usage_error(&gs_cmd_run, "--cpu %s: expected a rank count", optarg);
            break;
        case OPT_MAX_RESTARTS:
            a->max_restarts = atoi(optarg);
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
        default:
            if ((r = gs_cli_common_option(cli, &gs_cmd_run, opt)) <= 0)
                return GS_EXIT_USAGE;
        }
    }
    if (a->gpus && a->cpu)
        return gs_cli_usage_error(&gs_cmd_run, "--gpus and --cpu exclude each other");
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

static int run_main(struct gs_cli *cli, int argc, char **argv)
{
    struct run_args a = {0};
    int r = parse_run_args(cli, argc, argv, &a);
    if (r != 0)
        return r;
    if ((r = gs_cli_prepare(cli, &gs_cmd_run)) != 0)
        return r;
    struct gs_run_ctx rc;
    r = gs_run_ctx_open(cli, &rc);
    if (r == 0 && !a.no_sync)
        r = gs_run_sync(cli);
    int code = r < 0 ? gs_cli_fail(cli, r) : launch(cli, &a, &rc);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_run = {
    .name = "run",
    .usage =
        "run [--gpus N|LIST | --cpu N] [--max-restarts K] [--detach] [--no-sync] [--name NAME]\n"
        "                   [--ranks all|0,1] [--stop-on-interrupt] [TARGET [-- ARGS...] | -- "
        "CMD ARGS...]",
    .summary = "Sync, then run a multi-rank job on the server and follow its logs",
    .help = "  --gpus N | --gpus 0,2  the N least-busy GPUs, or exactly these (default: the job's\n"
            "                         gpus, else 1)\n"
            "  --cpu N                N CPU ranks (the trainer's TCP all-reduce)\n"
            "  --max-restarts K       restart the whole group up to K times after a failure\n"
            "  -d, --detach           start it and return; follow later with 'gpusync logs -f'\n"
            "  --no-sync              launch without syncing first\n"
            "  --name NAME            a name to use instead of the run id\n"
            "  --ranks all|0,1        whose logs to show (default all; the trainer: 0)\n"
            "  --stop-on-interrupt    Ctrl-C stops the run instead of detaching\n"
            "  TARGET is a [job \"NAME\"] from the config; 'train' is the bundled trainer when no\n"
            "  such job exists. Ranks get torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
            "  MASTER_ADDR, a free MASTER_PORT, ...). Exit status: the job's.\n",
    .flags = GS_CMD_NEED_CONNECTION,
    .exec = run_main,
};
