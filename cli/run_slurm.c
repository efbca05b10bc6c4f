/* cli/run_slurm.c: gpusync on a Slurm cluster (see run_slurm.h). The login node is [remote] host
 * and the project is on the shared filesystem, so the sync is the usual one. The run directory
 * keeps the single-server layout (rankN.log from `srun --output`, a status.json the batch script
 * writes while it holds supervisor.lock), which lets `gpusync-agent tail` follow a Slurm run with
 * no Slurm code in the agent: logs -f, resuming after a dropped connection, and the exit code
 * come from the same code as a single-server run's. What only the scheduler knows (pending and
 * why, cancelled, the job id) is asked of squeue/scontrol/sacct by polling: Slurm has no event a
 * client on the login node could wait for. */
#include "cli/run_slurm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/run_util.h"
#include "remote/slurm.h"

#define POLL_MS     500 /* between two questions to the scheduler */
#define STOP_WAIT_S 60  /* how long stop waits for the scheduler to let the job go */

/* What this run asks Slurm for: the config's settings, the command line's on top. */
static int settle(struct gs_cli *cli, const struct run_args *a, struct gs_slurm_config *s,
                  struct gs_slurm_job *job)
{
    *s = cli->cfg.slurm; /* shallow: the strings stay the config's */
    if (a->slurm_nodes)
        s->nodes = a->slurm_nodes;
    if (a->slurm_gpus_per_node)
        s->gpus_per_node = a->slurm_gpus_per_node;
    if (a->slurm_partition)
        s->partition = (char *)a->slurm_partition;
    if (a->gpus && strchr(a->gpus, ','))
        return gs_cli_usage_error(&gs_cmd_run,
                                  "%s: on Slurm the scheduler picks the GPUs; ask "
                                  "for a count (--gpus-per-node N)",
                                  a->gpus_src);
    job->cfg = s;
    job->gpus = !a->cpu;
    job->tasks_per_node = a->cpu                   ? a->cpu
                          : a->slurm_gpus_per_node ? a->slurm_gpus_per_node
                          : a->gpus                ? atoi(a->gpus)
                          : s->gpus_per_node       ? s->gpus_per_node
                                                   : 1;
    return 0;
}

/* Asks the scheduler about run `id`. Returns 0 with *st, or a negative code in cli->err. */
static int query(struct gs_cli *cli, const char *dir, const char *id, struct gs_slurm_state *st)
{
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_slurm_state_command(dir, id, &cmd);
    int r = gs_cli_capture(cli, cmd.data, &out);
    if (r >= 0 && (!out.data || gs_slurm_state_parse(out.data, st) < 0))
        r = gs_error_set(&cli->err, GS_E_NOTFOUND,
                         "no Slurm run '%s' in %s on %s; 'gpusync ps' lists them", id, dir,
                         gs_cli_server_name(cli));
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    return r < 0 ? r : 0;
}

/* Polls until the batch script has started or the job has ended, saying "pending: REASON" each
 * time the reason changes. Returns 0 with *st, GS_E_INTERRUPTED, or an error. */
static int wait_started(struct gs_cli *cli, const char *dir, const char *id,
                        volatile sig_atomic_t *interrupted, struct gs_slurm_state *st)
{
    char shown[sizeof(st->reason)] = "";
    for (;;) {
        int r = query(cli, dir, id, st);
        if (r < 0 || st->started || gs_slurm_state_final(st->state))
            return r;
        /* "None": submitted, not yet looked at by the scheduler */
        if (strcmp(st->state, "PENDING") == 0 && strcmp(st->reason, "None") != 0 &&
            strcmp(shown, st->reason) != 0) {
            fprintf(stderr, "gpusync: run %s (Slurm job %s) pending: %s\n", id, st->job,
                    st->reason);
            snprintf(shown, sizeof(shown), "%s", st->reason);
        }
        for (int i = 0; i < POLL_MS / 50 && !*interrupted; i++)
            usleep(50000);
        if (*interrupted)
            return GS_E_INTERRUPTED;
    }
}

/* Cancels run `id` and waits until the scheduler lets it go. Returns 0 with its final state in
 * *st, or a negative code in cli->err. */
static int cancel(struct gs_cli *cli, const char *dir, const char *id, struct gs_slurm_state *st)
{
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_slurm_cancel_command(dir, id, STOP_WAIT_S, &cmd);
    int r = gs_cli_capture(cli, cmd.data, &out);
    if (r == 2)
        r = gs_error_set(&cli->err, GS_E_NOTFOUND, "no Slurm run '%s' in %s on %s", id, dir,
                         gs_cli_server_name(cli));
    else if (r > 0 || (r == 0 && (!out.data || gs_slurm_state_parse(out.data, st) < 0)))
        r = gs_error_set(&cli->err, GS_E_REMOTE,
                         "scancel of run %s: the scheduler still lists its job after %d s; "
                         "check with: squeue -j $(cat .gpusync/runs/%s/slurm_job_id)",
                         id, STOP_WAIT_S, id);
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    return r;
}

/* Ctrl-C while attached: detach, or stop on a second Ctrl-C (or --stop-on-interrupt). */
static int interrupted(struct gs_cli *cli, const struct run_args *a, const char *dir,
                       const char *id, const char *job)
{
    struct gs_buf msg = GS_BUF_INIT;
    gs_buf_addf(&msg,
                "\ngpusync: detached; run %s (Slurm job %s) keeps going on the cluster.\n"
                "  re-attach: gpusync logs -f %s\n  stop:      gpusync stop %s\n"
                "(Ctrl-C again within 2 s stops it now)\n",
                id, job, id, id);
    int stop = gs_runcmd_wants_stop(a, msg.data);
    gs_buf_release(&msg);
    struct gs_slurm_state st;
    int r = stop ? cancel(cli, dir, id, &st) : 0;
    if (stop && r == 0)
        fprintf(stderr, "gpusync: stopped run %s (Slurm job %s: %s)\n", id, st.job, st.state);
    return r < 0 ? gs_cli_fail(cli, r) : 130;
}

/* The job ended before its batch script began (cancelled while pending, refused at start). */
static int ended_unstarted(const char *id, const struct gs_slurm_state *st)
{
    fprintf(stderr, "gpusync: run %s (Slurm job %s) ended %s before it started\n", id, st->job,
            st->state);
    return st->exit_code > 0 ? st->exit_code : 1;
}

/* Follows a submitted run: pending, then its logs until it ends. Returns the exit code. */
static int follow(struct gs_cli *cli, const struct run_args *a, struct gs_run_ctx *rc,
                  const char *id, const char *job, int ntasks)
{
    struct sigaction sa = {.sa_handler = gs_runcmd_on_sigint};
    sigaction(SIGINT, &sa, NULL);
    struct gs_slurm_state st;
    int r = wait_started(cli, rc->dir.data, id, &gs_runcmd_interrupted, &st);
    if (r == GS_E_INTERRUPTED)
        return interrupted(cli, a, rc->dir.data, id, job);
    if (r < 0)
        return gs_cli_fail(cli, r);
    if (!st.started)
        return ended_unstarted(id, &st);
    struct gs_log_printer printer;
    /* "[rank N] " prefixes as for a run on one server: unless one rank is shown */
    int one = a->ranks && !strchr(a->ranks, ',') && strcmp(a->ranks, "all") != 0;
    gs_log_printer_init(&printer, cli, id, ntasks > 1 && !one);
    int code = 0;
    r = gs_run_ctx_follow(cli, rc, id, a->ranks, &printer, &gs_runcmd_interrupted, &code);
    gs_log_printer_finish(&printer);
    if (r == GS_E_INTERRUPTED)
        return interrupted(cli, a, rc->dir.data, id, job);
    return r < 0 ? gs_cli_fail(cli, r) : code;
}

/* Writes the batch script into the run directory and submits it. Returns 0 with the Slurm job
 * id in `job`, or a negative code in cli->err (sbatch's refusal quoted). */
static int submit(struct gs_cli *cli, const struct gs_slurm_job *sj, struct gs_buf *job)
{
    struct gs_buf script = GS_BUF_INIT, cmd = GS_BUF_INIT;
    gs_slurm_script(sj, &script);
    gs_slurm_submit_command(sj, script.data, &cmd);
    int r = gs_cli_capture(cli, cmd.data, job);
    if (job->data)
        job->data[strcspn(job->data, "\n")] = 0;
    if (r > 0)
        r = gs_error_set(&cli->err, GS_E_REMOTE, "sbatch on %s refused run %s: %s",
                         gs_cli_server_name(cli), sj->id, job->data ? job->data : "");
    gs_buf_release(&script);
    gs_buf_release(&cmd);
    return r;
}

int gs_runcmd_slurm(struct gs_cli *cli, struct run_args *a)
{
    struct gs_slurm_config s;
    struct gs_slurm_job sj = {0};
    struct run_command c = {0};
    struct gs_run_ctx rc;
    struct gs_buf job = GS_BUF_INIT;
    char id[64];
    int r = settle(cli, a, &s, &sj);
    if (r != 0)
        return r;
    gs_run_ctx_init(cli, &rc);
    gs_runcmd_new_id(id);
    r = gs_runcmd_resolve(cli, a, &c);
    if (r == 0 && !a->no_sync)
        r = gs_cli_sync(cli);
    sj.id = id;
    sj.remote_dir = rc.dir.data;
    sj.argc = c.argc;
    sj.argv = c.argv;
    if (r == 0)
        r = submit(cli, &sj, &job);
    int code = r < 0 ? gs_cli_fail(cli, r) : 0, nodes = s.nodes > 0 ? s.nodes : 1,
        ntasks = sj.tasks_per_node * nodes;
    if (r == 0 && cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:s,s:i}", "v", 1, "ok", 1, "id", id,
                                    "slurm_job_id", job.data, "ranks", ntasks));
    else if (r == 0)
        fprintf(stderr, "gpusync: run %s submitted as Slurm job %s (%d task%s on %d node%s)\n", id,
                job.data, ntasks, ntasks == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
    if (r == 0 && !a->detach)
        code = follow(cli, a, &rc, id, job.data, ntasks);
    gs_runcmd_command_release(&c);
    gs_buf_release(&job);
    gs_run_ctx_release(&rc);
    return code;
}

int gs_slurm_logs_wait(struct gs_cli *cli, const char *id)
{
    struct gs_buf dir = GS_BUF_INIT;
    struct gs_slurm_state st;
    gs_cli_remote_dir(cli, &dir);
    struct sigaction sa = {.sa_handler = gs_runcmd_on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int r = wait_started(cli, dir.data, id, &gs_runcmd_interrupted, &st);
    gs_buf_release(&dir);
    if (r == GS_E_INTERRUPTED)
        return 130;
    if (r < 0)
        return gs_cli_fail(cli, r);
    return st.started ? 0 : ended_unstarted(id, &st);
}

int gs_slurm_stop(struct gs_cli *cli, const char *run)
{
    struct gs_buf dir = GS_BUF_INIT;
    struct gs_slurm_state st;
    gs_cli_remote_dir(cli, &dir);
    int r = cancel(cli, dir.data, run, &st), code = 0;
    if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:s,s:s}", "v", 1, "ok", 1, "id", run,
                                    "slurm_job_id", st.job, "state", st.state));
    else
        printf("stopped %s (Slurm job %s: %s)\n", run, st.job, st.state);
    gs_buf_release(&dir);
    return code;
}

/* One ps row from a state line, as JSON. */
static json_t *ps_row(const struct gs_slurm_state *st)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", st->id, "slurm_job_id", st->job, "state",
                     st->state, "reason", st->reason, "exit_code",
                     st->exit_code >= 0 ? json_integer(st->exit_code) : json_null());
}

int gs_slurm_ps(struct gs_cli *cli)
{
    struct gs_buf dir = GS_BUF_INIT, cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    gs_slurm_ps_command(dir.data, &cmd);
    int r = gs_cli_capture(cli, cmd.data, &out);
    json_t *runs = json_array();
    for (char *line = out.data; r >= 0 && line && *line; line = strchr(line, '\n')) {
        line += *line == '\n';
        struct gs_slurm_state st;
        if (*line && gs_slurm_state_parse(line, &st) == 0)
            json_array_append_new(runs, ps_row(&st));
        if (!strchr(line, '\n'))
            break;
    }
    int code = r < 0 ? gs_cli_fail(cli, r) : 0;
    if (r >= 0 && cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:O}", "v", 1, "ok", 1, "runs", runs));
    else if (r >= 0) {
        printf("%-22s %-10s %-12s %-16s %5s\n", "RUN", "SLURM JOB", "STATE", "REASON", "EXIT");
        size_t i;
        json_t *row;
        json_array_foreach(runs, i, row)
        {
            json_t *ec = json_object_get(row, "exit_code");
            char exit_s[16] = "-";
            if (json_is_integer(ec))
                snprintf(exit_s, sizeof(exit_s), "%lld", (long long)json_integer_value(ec));
            printf("%-22s %-10s %-12s %-16s %5s\n", json_string_value(json_object_get(row, "id")),
                   json_string_value(json_object_get(row, "slurm_job_id")),
                   json_string_value(json_object_get(row, "state")),
                   json_string_value(json_object_get(row, "reason")), exit_s);
        }
    }
    json_decref(runs);
    gs_buf_release(&dir);
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    return code;
}

/* The value of "key=" in the doctor probe's output, or "" (static). */
static const char *probe_value(const char *out, const char *key)
{
    static char value[256];
    size_t klen = strlen(key);
    value[0] = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p += p != NULL) {
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t n = strcspn(p + klen + 1, "\n");
            snprintf(value, sizeof(value), "%.*s", (int)(n < 255 ? n : 255), p + klen + 1);
            break;
        }
    }
    return value;
}

/* Appends what sinfo says is free: "4 of 4 CPUs idle, 0 GPUs on idle nodes". */
static void describe_idle(const char *out, char *detail, size_t cap)
{
    long alloc = 0, idle = 0, other = 0, total = 0;
    sscanf(probe_value(out, "cpus"), "%ld/%ld/%ld/%ld", &alloc, &idle, &other, &total);
    size_t len = strlen(detail);
    snprintf(detail + len, cap - len, "; %ld of %ld CPUs idle, %s GPU(s) on idle nodes", idle,
             total, probe_value(out, "gpus"));
}

int gs_slurm_doctor(struct gs_cli *cli, char *detail, size_t cap, const char **hint)
{
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    const struct gs_slurm_config *s = &cli->cfg.slurm;
    gs_slurm_doctor_command(s, &cmd);
    int r = gs_cli_capture(cli, cmd.data, &out), status = 0;
    const char *o = out.data ? out.data : "";
    *hint = NULL;
    if (r != 0 || strcmp(probe_value(o, "sinfo"), "ok") != 0) {
        snprintf(detail, cap, "sinfo failed on the login node: %s",
                 r < 0 ? cli->err.msg : probe_value(o, "why"));
        *hint = "install the Slurm client there, or check that slurmctld answers (scontrol ping)";
        status = 2;
    } else {
        snprintf(detail, cap, "sinfo ok");
        if (s->partition) {
            const char *avail = probe_value(o, "partition");
            size_t len = strlen(detail);
            snprintf(detail + len, cap - len, "; partition %s: %s", s->partition,
                     avail[0] ? avail : "not found");
            if (strcmp(avail, "up") != 0) {
                status = 2;
                *hint = "set [remote] partition to one that 'sinfo' lists as up";
            }
        }
        if (s->account) {
            const char *acct = probe_value(o, "account");
            size_t len = strlen(detail);
            snprintf(detail + len, cap - len, "; account %s: %s", s->account, acct);
            if (strcmp(acct, "missing") == 0) {
                status = 2;
                *hint = "set [remote] account to one of yours ('sacctmgr show assoc user=$USER')";
            }
        }
        describe_idle(o, detail, cap);
    }
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    return status;
}
