/* cli/run.h: what `gpusync run` shares between its one-server path (cmd_run.c) and its
 * multi-node path (run_nodes.c): the parsed options, the plan settled for a node, run ids, Ctrl-C,
 * and the "[user@]host[:port][/path]" node syntax that `gpusync hosts` reads too. Private to cli/.
 */
#ifndef GS_CLI_RUN_H
#define GS_CLI_RUN_H

#include <signal.h>

#include "cli/cli.h"
#include "common/buf.h"
#include "common/config.h"

/* What TARGET names, decided from the command line and the config alone (choose_target). */
enum target_kind { TARGET_ARGV, TARGET_JOB, TARGET_TRAINER };

struct run_args {
    const char *gpus;   /* "2" or "0,2" (checked), from --gpus or the job; NULL: 1 */
    int cpu;            /* CPU ranks, from --cpu or the job */
    char gpus_src[600]; /* where `gpus` came from, for messages: "--gpus 5" */
    int max_restarts;
    long grace_ms; /* --grace: SIGTERM to SIGKILL; 0: the agent's default */
    int detach, no_sync, stop_on_interrupt;
    int wait; /* --wait: queue for GPUs that other runs hold */
    const char *name;
    const char *ranks;
    const char *target;
    const char *hosts;       /* --hosts, else [remote] hosts, else NULL (one server) */
    const char *master_addr; /* --master-addr, else [remote] master_addr, else NULL: detected */
    int argc;                /* the command (after --), or extra arguments for TARGET */
    char **argv;
    enum target_kind kind;
    const struct gs_job *job; /* TARGET_JOB: the [job] (owned by the config) */
    /* Slurm (run_slurm.c): --slurm, and what the command line sets over [remote]'s keys */
    int slurm, slurm_nodes, slurm_gpus_per_node;
    const char *slurm_partition;
};

struct run_command {
    struct gs_buf words[64]; /* argv for the launcher */
    char *argv[64];
    int argc;
};

/* What a node will run and on which devices, settled before its sync. */
struct run_plan {
    struct run_command c;
    struct gs_buf gpus; /* "0,2", empty for CPU ranks */
    int gpu_count;      /* > 0: the launcher reserves this many of `gpus`, its order of choice */
    int nproc;
};

/* Settles the command and the devices on the connected server (cli): everything that asks the
 * server, so a request it cannot meet is refused before the sync. Returns 0 or a negative code in
 * cli->err; `p` is to be released with gs_runcmd_plan_release either way. */
int gs_runcmd_plan(struct gs_cli *cli, struct run_args *a, struct run_plan *p);
void gs_runcmd_plan_release(struct run_plan *p);

/* The launcher's argv for TARGET or the command (the trainer is built on the server first if it
 * must be), without asking about GPUs: what a Slurm run needs. Returns 0 or a negative code in
 * cli->err; `c` (zeroed by the caller) is released with gs_runcmd_command_release either way. */
int gs_runcmd_resolve(struct gs_cli *cli, struct run_args *a, struct run_command *c);
void gs_runcmd_command_release(struct run_command *c);

/* A new run id: UTC time and 16 random-ish bits, "20261124-013000-1a2b". */
void gs_runcmd_new_id(char id[64]);

/* Ctrl-C: the handler counts into gs_runcmd_interrupted. After a first one,
 * gs_runcmd_wants_stop returns 1 when the run is to be stopped: --stop-on-interrupt, or another
 * Ctrl-C from the first on, however long the caller took to call it, until two seconds after the
 * message `detached`, which it prints first. */
extern volatile sig_atomic_t gs_runcmd_interrupted;
void gs_runcmd_on_sigint(int sig);
int gs_runcmd_wants_stop(const struct run_args *a, const char *detached);

/* A run on every host of a->hosts (run_nodes.c). Returns the exit code. */
int gs_runcmd_multi(struct gs_cli *cli, struct run_args *a);

/* A node as `run --hosts` reads "[user@]host[:port][/abs/path]": a missing user comes from
 * [remote], and so does the port when the host is [remote]'s; a missing path is [remote]'s.
 * `cfg` is a shallow copy of the project's (cli->cfg), pointing at the owned host/user/path. */
struct gs_node_spec {
    struct gs_config cfg;
    char *host, *user, *path; /* owned */
};

/* Parses `spec`. Returns 0 or GS_E_USAGE in cli->err; `n` is to be released either way. */
int gs_node_spec_parse(struct gs_cli *cli, const char *spec, struct gs_node_spec *n);
void gs_node_spec_release(struct gs_node_spec *n);

#endif
