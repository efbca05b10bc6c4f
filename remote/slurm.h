/* remote/slurm.h: the remote commands of a Slurm run, as shell lines for the login node. A run
 * keeps the single-server layout in the project's .gpusync/runs/<id>/ on the shared filesystem:
 * the batch script gpusync writes (job.sbatch, kept for the user), the Slurm job id
 * (slurm_job_id), one log per task (rankN.log, from `srun --output`) and a status.json that
 * the batch script writes while it holds supervisor.lock, so `gpusync-agent tail` follows a
 * Slurm run's logs as it follows any run's. What the job is doing (pending and why, running,
 * how it ended) comes from the scheduler: squeue, then scontrol, then sacct. */
#ifndef GS_REMOTE_SLURM_H
#define GS_REMOTE_SLURM_H

#include "common/buf.h"
#include "common/config_slurm.h"

/* One Slurm run: what to ask sbatch for and what each task runs. */
struct gs_slurm_job {
    const char *id;         /* the gpusync run id: .gpusync/runs/<id>/ */
    const char *remote_dir; /* the project on the shared filesystem (shell word) */
    const struct gs_slurm_config *cfg;
    int tasks_per_node; /* one per GPU (gpus_per_node), or CPU tasks */
    int gpus;           /* tasks are GPU tasks: the job asks for tasks_per_node GPUs a node */
    int argc;
    char *const *argv; /* each task's command, exactly */
};

/* Appends the batch script for `job`. */
void gs_slurm_script(const struct gs_slurm_job *job, struct gs_buf *out);

/* Appends the command that creates the run directory, writes `script` there as job.sbatch and
 * submits it from the project directory; it prints the Slurm job id, or exits non-zero with
 * sbatch's message on stdout. */
void gs_slurm_submit_command(const struct gs_slurm_job *job, const char *script,
                             struct gs_buf *cmd);

/* Appends the command that prints run `id`'s state as one line (gs_slurm_state_parse). */
void gs_slurm_state_command(const char *remote_dir, const char *id, struct gs_buf *cmd);

/* Appends the command that prints one state line per Slurm run of the project, newest first. */
void gs_slurm_ps_command(const char *remote_dir, struct gs_buf *cmd);

/* Appends the command that cancels run `id` with scancel and waits (up to `wait_s`) until the
 * scheduler no longer lists it; it then prints a state line and exits 0, or exits 1 when the job
 * is still there, 2 when the run is no Slurm run. */
void gs_slurm_cancel_command(const char *remote_dir, const char *id, int wait_s,
                             struct gs_buf *cmd);

/* Appends the command `doctor` runs on the login node: lines "sinfo=ok|fail" (and "why=..."),
 * "partition=up|down|..." ("" when unknown) when the config names one, "account=ok|missing|
 * unknown" when it names one (unknown: the site keeps no accounting to ask), "cpus=A/I/O/T"
 * (sinfo %C) and "gpus=N" (GPUs of idle nodes, from their gres). */
void gs_slurm_doctor_command(const struct gs_slurm_config *cfg, struct gs_buf *cmd);

/* A run's state as the scheduler reports it. */
struct gs_slurm_state {
    char id[64];
    char job[32];    /* Slurm job id */
    char state[32];  /* PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ..., UNKNOWN */
    char reason[64]; /* squeue's reason while pending ("Resources"), else "None" */
    int exit_code;   /* the job's (128+N for signal N); -1 while unknown */
    int started;     /* the batch script has begun (status.json exists) */
};

/* Parses one state line. Returns 0, or -1 when `line` is not one. */
int gs_slurm_state_parse(const char *line, struct gs_slurm_state *st);

/* 1 when `state` is final (the job left the queue). */
int gs_slurm_state_final(const char *state);

#endif
