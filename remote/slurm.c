/* remote/slurm.c: the shell lines of a Slurm run (see slurm.h). They run on the login node through
 * whatever carries commands there (our SSH connection or the watch daemon's), so each is one
 * self-contained `sh` line, and their output is one '|'-separated line per run. */
#include "remote/slurm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/shell.h"

#define RUNS_DIR ".gpusync/runs"

/* A shell function, gs_st RUNDIR, printing "id|job|STATE|reason|exit|started": squeue while
 * the scheduler still lists the job, then scontrol (final state and ExitCode for MinJobAge),
 * then sacct (the accounting database, where the site has one). */
static const char state_fn[] =
    "gs_st() { r=$1; id=${r##*/}; j=$(cat \"$r/slurm_job_id\" 2>/dev/null) || return 0; "
    "s=0; [ -f \"$r/status.json\" ] && s=1; "
    "q=$(squeue -h -j \"$j\" -t PD,CF,R,CG,S,ST -o '%T|%r' 2>/dev/null | head -n 1); "
    "if [ -n \"$q\" ]; then echo \"$id|$j|$q|-|$s\"; return 0; fi; "
    "o=$(scontrol -o show job \"$j\" 2>/dev/null); "
    "if [ -n \"$o\" ]; then "
    "st=$(printf '%s\\n' \"$o\" | sed -n 's/.* JobState=\\([^ ]*\\).*/\\1/p'); "
    "ec=$(printf '%s\\n' \"$o\" | sed -n 's/.* ExitCode=\\([0-9]*:[0-9]*\\).*/\\1/p'); "
    "else o=$(sacct -n -X -P -j \"$j\" -o State,ExitCode 2>/dev/null | head -n 1); "
    "st=${o%%|*}; st=${st%% *}; ec=${o#*|}; [ -n \"$o\" ] || ec=; fi; "
    "echo \"$id|$j|${st:-UNKNOWN}|None|${ec:--}|$s\"; }; ";

/* The status.json the batch script writes: the layout `gpusync-agent tail` reads (one entry per
 * task in ranks); state "running" with a null exit code until srun returns. */
static void script_status_fn(const struct gs_slurm_job *job, struct gs_buf *out)
{
    int ntasks = job->tasks_per_node * (job->cfg->nodes > 0 ? job->cfg->nodes : 1);
    gs_buf_addf(out,
                "# status.json, as gpusync-agent tail reads it: STATE EXIT_CODE END\n"
                "gs_status() {\n"
                "    { printf '{\"id\":\"%s\",\"state\":\"%%s\",\"exit_code\":%%s,' \"$1\" \"$2\"\n"
                "      printf '\"start\":\"%%s\",\"end\":%%s,\"supervisor_pid\":%%s,' "
                "\"$start\" \"$3\" \"$$\"\n"
                "      printf '\"master_port\":%%s,\"slurm_job_id\":\"%%s\",\"ranks\":[' "
                "\"$MASTER_PORT\" \"$SLURM_JOB_ID\"\n"
                "      i=0; while [ $i -lt %d ]; do [ $i = 0 ] || printf ','; "
                "printf '{\"rank\":%%d}' $i; i=$((i + 1)); done\n"
                "      printf ']}\\n'; } > \"$run/status.json.tmp\" && "
                "mv \"$run/status.json.tmp\" \"$run/status.json\"\n"
                "}\n"
                "now() { date -u +%%Y-%%m-%%dT%%H:%%M:%%S.%%3NZ; }\n",
                job->id, ntasks);
}

/* #SBATCH lines for what the config (or the command line) asks for. */
static void script_directives(const struct gs_slurm_job *job, struct gs_buf *out)
{
    const struct gs_slurm_config *c = job->cfg;
    gs_buf_addf(out, "#SBATCH --job-name=gpusync-%s\n", job->id);
    gs_buf_addf(out, "#SBATCH --output=" RUNS_DIR "/%s/slurm.out\n", job->id);
    gs_buf_addf(out, "#SBATCH --nodes=%d\n", c->nodes > 0 ? c->nodes : 1);
    gs_buf_addf(out, "#SBATCH --ntasks-per-node=%d\n", job->tasks_per_node);
    if (job->gpus)
        gs_buf_addf(out, "#SBATCH --gpus-per-node=%d\n", job->tasks_per_node);
    if (c->cpus_per_task)
        gs_buf_addf(out, "#SBATCH --cpus-per-task=%d\n", c->cpus_per_task);
    const char *names[] = {"partition", "account", "time", "mem"};
    const char *values[] = {c->partition, c->account, c->time, c->mem};
    for (int i = 0; i < 4; i++)
        if (values[i])
            gs_buf_addf(out, "#SBATCH --%s=%s\n", names[i], values[i]);
}

/* The environment each task computes from Slurm's, torchrun's names, then the command. */
static void script_srun(const struct gs_slurm_job *job, struct gs_buf *out)
{
    gs_buf_addf(out,
                "# A task that fails records its code: srun reports the code of the tasks it\n"
                "# killed after it (--kill-on-bad-exit), the run's is the first failure's.\n"
                "srun --kill-on-bad-exit=1 --output=\"$run/rank%%t.log\" sh -c '"
                "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS "
                "LOCAL_WORLD_SIZE=%d NODE_RANK=$SLURM_NODEID GROUP_RANK=$SLURM_NODEID; "
                "\"$@\"; c=$?; [ $c = 0 ] || echo $c > \"$GPUSYNC_RUN_DIR/rank$RANK.exit\"; "
                "exit $c' gpusync-task",
                job->tasks_per_node);
    for (int i = 0; i < job->argc; i++) {
        gs_buf_addc(out, ' ');
        gs_shell_quote(out, job->argv[i]);
    }
    gs_buf_adds(out, "\n");
}

void gs_slurm_script(const struct gs_slurm_job *job, struct gs_buf *out)
{
    gs_buf_adds(out, "#!/bin/sh\n");
    script_directives(job, out);
    gs_buf_addf(out,
                "# Written by gpusync for run %s (gpusync run --slurm); kept for you to read.\n"
                "# Each task gets torchrun's environment from Slurm's; its output goes to\n"
                "# rankN.log here, which 'gpusync logs -f' follows.\n"
                "run=" RUNS_DIR "/%s\n"
                "start=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%S.%%3NZ)\n"
                "# Held while the job runs (its tasks inherit it): gpusync-agent tail reads a\n"
                "# 'running' status with no holder as a lost run.\n"
                "exec 9>>\"$run/supervisor.lock\"\n"
                "flock -x 9\n"
                "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
                "# A port free on this, the first, node: not a fixed 29500 that two jobs share.\n"
                "MASTER_PORT=$((20000 + (SLURM_JOB_ID * 7919) %% 30000))\n"
                "while grep -qi \":$(printf %%04x $MASTER_PORT) \" /proc/net/tcp /proc/net/tcp6 "
                "2>/dev/null; do MASTER_PORT=$((MASTER_PORT + 1)); done\n"
                "GPUSYNC_RUN_ID=%s GPUSYNC_RUN_DIR=$PWD/$run\n"
                "export MASTER_ADDR MASTER_PORT GPUSYNC_RUN_ID GPUSYNC_RUN_DIR\n",
                job->id, job->id, job->id);
    script_status_fn(job, out);
    gs_buf_adds(out, "trap 'gs_status stopped 143 \"\\\"$(now)\\\"\"; exit 143' TERM\n"
                     "gs_status running null null\n");
    script_srun(job, out);
    gs_buf_adds(out, "code=$?\n"
                     "first=$(ls -tr \"$run\"/rank*.exit 2>/dev/null | head -n 1)\n"
                     "[ $code = 0 ] || [ -z \"$first\" ] || code=$(cat \"$first\")\n"
                     "end=\"\\\"$(now)\\\"\"\n"
                     "if [ $code = 0 ]; then gs_status succeeded 0 \"$end\"; "
                     "else gs_status failed $code \"$end\"; fi\n"
                     "exit $code\n");
}

void gs_slurm_submit_command(const struct gs_slurm_job *job, const char *script, struct gs_buf *cmd)
{
    gs_buf_addf(cmd,
                "cd %s && r=" RUNS_DIR "/%s && mkdir -p \"$r\" && cat > \"$r/job.sbatch\" "
                "<<'GPUSYNC_SBATCH_EOF'\n%sGPUSYNC_SBATCH_EOF\n",
                job->remote_dir, job->id, script);
    gs_buf_adds(cmd, "j=$(sbatch --parsable");
    if (job->cfg->sbatch_args)
        gs_buf_addf(cmd, " %s",
                    job->cfg->sbatch_args); /* the user's words, as a shell reads them */
    /* sbatch's complaint goes to stdout, which the caller shows: stderr may not come back */
    gs_buf_adds(cmd, " \"$r/job.sbatch\" 2>&1) || { printf '%s\\n' \"$j\"; exit 1; }; "
                     "j=${j%%;*}; echo \"$j\" > \"$r/slurm_job_id\" && echo \"$j\"\n");
}

void gs_slurm_state_command(const char *remote_dir, const char *id, struct gs_buf *cmd)
{
    gs_buf_addf(cmd, "%scd %s && gs_st " RUNS_DIR "/", state_fn, remote_dir);
    gs_shell_quote(cmd, id);
}

void gs_slurm_ps_command(const char *remote_dir, struct gs_buf *cmd)
{
    gs_buf_addf(cmd,
                "%scd %s 2>/dev/null || exit 0; for r in $(ls -1dr " RUNS_DIR
                "/*/ 2>/dev/null); do r=${r%%/}; [ -f \"$r/slurm_job_id\" ] && gs_st \"$r\"; "
                "done; exit 0",
                state_fn, remote_dir);
}

void gs_slurm_cancel_command(const char *remote_dir, const char *id, int wait_s, struct gs_buf *cmd)
{
    gs_buf_addf(cmd, "%scd %s && r=" RUNS_DIR "/", state_fn, remote_dir);
    gs_shell_quote(cmd, id);
    gs_buf_addf(
        cmd,
        " && j=$(cat \"$r/slurm_job_id\" 2>/dev/null) || exit 2; scancel \"$j\" || exit 1; "
        "i=0; while [ -n \"$(squeue -h -j \"$j\" -t PD,CF,R,CG,S,ST -o %%T 2>/dev/null)\" "
        "]; do i=$((i + 1)); [ $i -le %d ] || exit 1; sleep 0.2; done; "
        /* a batch script killed before its trap ran leaves "running" behind */
        "[ -f \"$r/status.json\" ] && sed -i "
        "'s/\"state\":\"running\",\"exit_code\":null/\"state\":\"stopped\",\"exit_code\":143/' "
        "\"$r/status.json\"; gs_st \"$r\"",
        wait_s * 5);
}

/* Copies field `n` of the '|'-separated `line` into `dst`. */
static int field(const char *line, int n, char *dst, size_t cap)
{
    for (int i = 0; i < n; i++) {
        line = strchr(line, '|');
        if (!line)
            return -1;
        line++;
    }
    size_t len = strcspn(line, "|\n");
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, line, len);
    dst[len] = 0;
    return 0;
}

/* "N:S" (ExitCode, sacct) as a shell would report it: 128+S after signal S, else N. */
static int exit_code_of(const char *ec)
{
    int code, sig;
    if (sscanf(ec, "%d:%d", &code, &sig) != 2)
        return -1;
    return sig ? 128 + sig : code;
}

int gs_slurm_state_parse(const char *line, struct gs_slurm_state *st)
{
    char ec[32], started[8];
    memset(st, 0, sizeof(*st));
    if (field(line, 0, st->id, sizeof(st->id)) || field(line, 1, st->job, sizeof(st->job)) ||
        field(line, 2, st->state, sizeof(st->state)) ||
        field(line, 3, st->reason, sizeof(st->reason)) || field(line, 4, ec, sizeof(ec)) ||
        field(line, 5, started, sizeof(started)) || !st->job[0])
        return -1;
    st->exit_code = exit_code_of(ec);
    if (strncmp(st->state, "CANCELLED", 9) == 0 && st->exit_code == 0)
        st->exit_code = -1; /* cancelled before it ran: Slurm's 0:0 is no exit code */
    st->started = started[0] == '1';
    return 0;
}

int gs_slurm_state_final(const char *state)
{
    static const char *live[] = {"PENDING",   "CONFIGURING", "RUNNING",  "COMPLETING",
                                 "SUSPENDED", "STOPPED",     "REQUEUED", "RESIZING"};
    for (size_t i = 0; i < sizeof(live) / sizeof(live[0]); i++)
        if (strcmp(state, live[i]) == 0)
            return 0;
    return 1;
}

/* Appends "-p 'P'" when the config names a partition. */
static void partition_opt(const struct gs_slurm_config *cfg, struct gs_buf *cmd)
{
    if (cfg->partition) {
        gs_buf_adds(cmd, " -p ");
        gs_shell_quote(cmd, cfg->partition);
    }
}

void gs_slurm_doctor_command(const struct gs_slurm_config *cfg, struct gs_buf *cmd)
{
    gs_buf_adds(cmd, "sinfo -h -o %P >/dev/null 2>&1 || { echo sinfo=fail; "
                     "sinfo 2>&1 | head -n 1 | sed 's/^/why=/'; exit 0; }; echo sinfo=ok; ");
    if (cfg->partition) {
        gs_buf_adds(cmd, "echo \"partition=$(sinfo -h -o %a");
        partition_opt(cfg, cmd);
        gs_buf_adds(cmd, " 2>/dev/null | head -n 1)\"; ");
    }
    if (cfg->account) {
        gs_buf_adds(cmd, "a=");
        gs_shell_quote(cmd, cfg->account);
        /* without accounting (no slurmdbd) the account cannot be checked, only named */
        gs_buf_adds(cmd,
                    "; if sacctmgr -n -P show assoc where user=$(id -un) account=\"$a\" "
                    "format=Account 2>/dev/null | grep -q .; then echo account=ok; "
                    "elif sacctmgr -n show cluster >/dev/null 2>&1; then echo account=missing; "
                    "else echo account=unknown; fi; ");
    }
    gs_buf_adds(cmd, "echo \"cpus=$(sinfo -h -o %C");
    partition_opt(cfg, cmd);
    gs_buf_adds(cmd, " | head -n 1)\"; echo \"gpus=$(sinfo -h -N -t idle -o %G");
    partition_opt(cfg, cmd);
    gs_buf_adds(cmd, " | awk -F, '{for (i = 1; i <= NF; i++) if ($i ~ /^gpu/) { g = $i; "
                     "sub(/\\(.*/, \"\", g); n = split(g, a, \":\"); s += a[n] }} "
                     "END { print s + 0 }')\"");
}
