/* cli/run_slurm.h: `run`, `ps`, `stop` and `logs -f` on a Slurm cluster ([remote] scheduler =
 * slurm, or run --slurm): the run is submitted with sbatch on the login node and its state comes
 * from the scheduler (remote/slurm.h); its logs are followed as a single-server run's are. */
#ifndef GS_CLI_RUN_SLURM_H
#define GS_CLI_RUN_SLURM_H

#include "cli/run.h"

/* Syncs to the login node, submits the run and follows it (a->detach: returns once submitted).
 * Returns the exit code: the job's, 130 after Ctrl-C, or gs_cli_fail's. */
int gs_runcmd_slurm(struct gs_cli *cli, struct run_args *a);

/* `ps` of a Slurm project: its runs with their Slurm job ids and the scheduler's states. */
int gs_slurm_ps(struct gs_cli *cli);

/* `stop RUN`: scancel, confirmed by the scheduler no longer listing the job. */
int gs_slurm_stop(struct gs_cli *cli, const char *run);

/* For `logs -f RUN`: waits (saying "pending: REASON") until run `id`'s batch script has started
 * or the job has ended. Returns 0, 130 after Ctrl-C, or gs_cli_fail's exit code. */
int gs_slurm_logs_wait(struct gs_cli *cli, const char *id);

/* `doctor` on a Slurm remote: sinfo answers, the partition is up, the account is the user's
 * (where the site keeps accounting), and how many CPUs and GPUs are idle. Fills `detail` and
 * *hint (a static string or NULL). Returns 0 (ok), 1 (warn) or 2 (fail). */
int gs_slurm_doctor(struct gs_cli *cli, char *detail, size_t cap, const char **hint);

#endif
