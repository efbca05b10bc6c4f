/* launch: `gpusync-agent launch`, the run supervisor. Starts N local ranks of a command with
 * torchrun's environment, each in its own process group, detached from the caller (double fork
 * + setsid) so the run survives the SSH channel closing; fails fast, restarts the whole group up
 * to --max-restarts, and records everything in DIR/.gpusync/runs/<id>/ (see runs.h). */
#ifndef GA_LAUNCH_H
#define GA_LAUNCH_H

/* `gpusync-agent launch --root DIR --id ID --nproc N [--gpus 0,2] [--max-restarts K]
 *  [--name NAME] [--nnodes M --node-rank R --master-addr HOST --master-port P] [--grace-ms MS]
 *  -- CMD ARGS...` (argv[0] = "launch").
 * Once the supervisor runs and has started the ranks, prints
 * `started ID SUPERVISOR_PID MASTER_PORT` and returns 0; otherwise prints the reason on stderr
 * and returns 1 (2 for bad usage). The supervisor itself never returns to the caller. */
int ga_launch_main(int argc, char **argv);

#endif
