/* cli/cmd_ps.c: `gpusync ps [--json]`: the runs on the server with state, GPUs, start, duration
 * and exit code; a multi-node run once, its state combined over its nodes (run_nodes_attach.c). */
#include <stdio.h>
#include <string.h>

#include "cli/run_nodes.h"
#include "cli/run_slurm.h"

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "-";
}

/* A run's "gpus" array as "1,3" in buf; "-" for CPU ranks (null). */
static const char *gpus_text(json_t *r, char *buf, size_t cap)
{
    size_t i, len = 0;
    json_t *g;
    buf[0] = '\0';
    json_array_foreach(json_object_get(r, "gpus"), i, g)
    {
        int n = snprintf(buf + len, cap - len, "%s%lld", i ? "," : "",
                         (long long)json_integer_value(g));
        if (n < 0 || (size_t)n >= cap - len)
            break;
        len += (size_t)n;
    }
    return buf[0] ? buf : "-";
}

static void print_table(json_t *runs)
{
    printf("%-22s %-12s %-10s %5s %5s %-8s %-20s %9s %5s\n", "RUN", "NAME", "STATE", "NODES",
           "RANKS", "GPUS", "STARTED", "DURATION", "EXIT");
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r)
    {
        json_t *code = json_object_get(r, "exit_code");
        char exit_s[16] = "-";
        if (json_is_integer(code))
            snprintf(exit_s, sizeof(exit_s), "%lld", (long long)json_integer_value(code));
        /* -1 when unknown (a lost run has no end): a dash, not "-0s" */
        json_t *dur = json_object_get(r, "duration_ms");
        char gpus[64], dur_s[24] = "-", state[32];
        if (json_is_number(dur) && json_number_value(dur) >= 0)
            snprintf(dur_s, sizeof(dur_s), "%.0fs", json_number_value(dur) / 1000.0);
        json_t *nodes = json_object_get(r, "nodes");
        printf("%-22s %-12s %-10s %5zu %5zu %-8s %-20s %9s %5s\n", str(r, "id"), str(r, "name"),
               gs_run_state_text(r, state, sizeof(state)), nodes ? json_array_size(nodes) : 1,
               json_array_size(json_object_get(r, "ranks")), gpus_text(r, gpus, sizeof(gpus)),
               str(r, "start"), dur_s, exit_s);
    }
    if (json_array_size(runs) == 0)
        printf("(no runs yet: start one with 'gpusync run')\n");
}

static int ps_exec(struct gs_cli *cli)
{
    if (cli->cfg.slurm.enabled) /* the scheduler's view, with Slurm job ids */
        return gs_slurm_ps(cli);
    struct gs_run_ctx rc;
    struct gs_buf out = GS_BUF_INIT;
    gs_run_ctx_init(cli, &rc);
    int r = gs_run_ctx_list(cli, &rc, &out);
    json_t *runs = r == 0 ? json_loads(out.data ? out.data : "[]", 0, NULL) : NULL;
    if (r == 0 && !json_is_array(runs))
        r = gs_error_set(&cli->err, GS_E_PROTO, "the agent's run list is not a JSON array");
    if (r == 0)
        r = gs_nodes_ps_merge(cli, runs);
    int code = 0;
    if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:O}", "v", 1, "ok", 1, "runs", runs));
    else
        print_table(runs);
    json_decref(runs);
    gs_buf_release(&out);
    gs_run_ctx_release(&rc);
    return code;
}

const struct gs_cmd gs_cmd_ps = {
    .name = "ps",
    .usage = "ps [--json]",
    .summary = "List runs on the server",
    .help =
        "  A multi-node run (run --hosts) is listed once, each of its nodes asked: STATE is\n"
        "  running while any node runs, else failed if any failed, else lost, unknown (a\n"
        "  node could not be asked; it is named on stderr), stopped, succeeded. --json\n"
        "  adds \"nodes\": [{node, host, state, exit_code}] to such a run. A running run\n"
        "  reads paused while each of its running ranks is stopped by a signal (kill -STOP,\n"
        "  a debugger) until SIGCONT, paused:1/4 while 1 of its 4 ranks is; --json\n"
        "  keeps state \"running\" and marks such ranks \"paused\": true. On Slurm ([remote]\n"
        "  scheduler = slurm) it lists the project's jobs: run id, Slurm job id, the\n"
        "  scheduler's state (PENDING with its reason, RUNNING, COMPLETED, FAILED, ...), exit.\n",
    .flags = GS_CMD_NEED_PROJECT | GS_CMD_NEED_SERVER,
    .exec = ps_exec,
};
