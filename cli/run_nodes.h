/* cli/run_nodes.h: a multi-node run as the client holds it: one connection per node
 * (run_nodes.c launches and follows it), and the node list this machine keeps of it,
 * .gpusync/runs/<id>/nodes.json, through which `logs`, `ps` and `stop` act on every node of a run
 * after `run` has returned (run_nodes_attach.c). Private to cli/. */
#ifndef GS_CLI_RUN_NODES_H
#define GS_CLI_RUN_NODES_H

#include <pthread.h>
#include <signal.h>

#include "cli/run.h"
#include "cli/run_util.h"

/* One host of a multi-node run. `cli` is a copy of the command's context that points at this
 * host: it shares the project, config and password (never released through it) and owns its
 * connection; its cfg is the node spec's. */
struct gs_node {
    struct gs_cli cli;
    struct gs_run_ctx rc;
    struct gs_node_spec spec;
    int primary;          /* the configured [remote] itself: synced as usual */
    struct run_plan plan; /* settled in nodes_prepare, before any node is synced */
    int planned;
    int launched, nproc;
    int start_code; /* its launch failed as its command could not start: 127 or 126; else 0 */
    pthread_t thread;
    int has_thread;
    volatile sig_atomic_t abort; /* ends this node's follow */
    int stop_wanted;             /* another node failed: stop this one, keep following */
    int done, result, exit_code;
    int end_seq;               /* 1 for the first node whose follow ended, 2 the next... */
    int unreached;             /* logs -f: not reached at attach; node_reach keeps trying */
    int said;                  /* ...and this was said, its local copy shown */
    struct gs_tail_state *end; /* how its part ended (state, exit code, summary); owned */
    struct gs_buf report;      /* what the agent said (stop) */
    char name[600];            /* gs_node_name's */
    struct gs_nodes *m;
};

struct gs_nodes {
    struct gs_node *nodes;
    int n;
    const char *id;
    const char *ranks;
    int ended;           /* followers ended so far (end_seq) */
    int stop_on_failure; /* a node failing gets the others stopped (run; not logs) */
    long grace_ms;       /* stop: SIGTERM to SIGKILL; < 0 the run's own */
    struct gs_log_printer printer;
    pthread_mutex_t lock;
    pthread_cond_t cond;
};

/* Initialises `m` for run `id` (not copied) with the nodes of the comma list `hosts`. Returns 0
 * or a usage error in cli->err; `m` is to be released with gs_nodes_release either way. */
int gs_nodes_init(struct gs_cli *cli, struct gs_nodes *m, const char *id, const char *hosts);
/* Closes every node's connection and frees what `m` holds. */
void gs_nodes_release(struct gs_nodes *m);

/* A node's spec written in full ("user@host:port/path", each part that is known), which
 * gs_node_spec_parse reads back as the same node. malloc'd. */
char *gs_node_spec_format(const struct gs_node *n);

/* "node R (user@host:port)" for messages, kept in n->name (valid until the next call). */
const char *gs_node_name(struct gs_node *n, int rank);

/* MASTER_ADDR for the connected nodes of `m`: `given` (--master-addr or [remote] master_addr)
 * when set, else node 0's address on its route to node 1 (asked of the agents), else the first
 * host's name. *how says which, for messages. malloc'd. */
char *gs_nodes_master_addr(struct gs_nodes *m, const char *given, const char **how);

/* Follows every node's ranks (`ranks`: NULL or "all", or global ranks) in a thread each, lines
 * printed as they arrive, then says once how the run ended: as the node that decides it ended
 * (as ps combines the nodes: a failed node before a lost, stopped or succeeded one, the first
 * to end among equals), with the other nodes' stopped ranks and processes folded in. A node not
 * reached at attach (n->unreached, logs -f) is shown from the local copy first and tried again
 * while another node is followed. Returns that exit code, 0, or an error's exit code (the failed
 * or never reached node named); *detached is 1 after Ctrl-C. */
int gs_nodes_follow(struct gs_cli *cli, struct gs_nodes *m, const char *ranks, int *detached);

/* logs -f: for each node that could not be reached at attach (n->unreached) and was not said
 * yet, says so on stderr, naming it, and shows its ranks' local copy through m->printer, leaving
 * in n->end the offsets that copy ends at, from which its follower goes on once it is reached. */
void gs_nodes_show_unreached(struct gs_cli *cli, struct gs_nodes *m);

/* Writes the node list of run `id` (.gpusync/runs/<id>/nodes.json) from the first `count`
 * nodes of `m`, those that have the run (all of them once it launched; fewer when a launch
 * failed part-way). A failure is warned about: the run goes on, and logs/ps/stop then reach
 * [remote] only. */
void gs_nodes_record(struct gs_cli *cli, const struct gs_nodes *m, int count, const char *name,
                     const char *master_addr, int master_port);

/* Resolves RUN (an id, a --name, or NULL for the newest run) over the [remote] server's runs and
 * this project's multi-node runs. Returns the node list (a new reference) when the newest match
 * is a multi-node run, with *r 0; else NULL, with *r and `id` as gs_run_ctx_resolve (with
 * `live`) leaves them. An exact id of a recorded run is not looked up on the server. */
json_t *gs_nodes_resolve(struct gs_cli *cli, struct gs_run_ctx *rc, const char *run, int live,
                         struct gs_buf *id, int *r);

/* `logs [-f] RUN` for the recorded run `rec`: every node's ranks; -f in a thread per node;
 * --tail N (tail > 0) the last N lines of each node, followed on from there with -f. A rank
 * the run does not have (over all its nodes) is a usage error, before any node is asked. A node
 * that cannot be reached is named and shown from the local copy; -f follows the others and
 * tries it again while they run, following it on from that copy once reached. Returns the exit
 * code (that of the node's error, as 4, when a node was never reached). */
int gs_nodes_logs(struct gs_cli *cli, json_t *rec, const char *ranks, int follow, int tail);

/* `stop RUN` for the recorded run `rec`: stops it on every node at once, prints each node's
 * report, and fails naming each node that could not be reached or kept a process. */
int gs_nodes_stop(struct gs_cli *cli, json_t *rec, long grace_ms);

/* `ps`: replaces, in `runs` (the [remote] server's list), each recorded multi-node run by one
 * entry combined over its nodes (each node asked once), with a "nodes" array; a node that
 * cannot be reached is named on stderr and in its entry. A run that has ended on every node is
 * kept in its record ("final") and shown from there after. Returns 0 or a negative code. */
int gs_nodes_ps_merge(struct gs_cli *cli, json_t *runs);

/* doctor: whether node 1 of `hosts` reaches MASTER_ADDR (`given`, else as a run would choose
 * it) on a port of node 0: a one-shot listener there, a connection from node 1. Returns 1 (yes)
 * or 0, with what was found in `detail`; leaves cli->err clear. */
int gs_nodes_check_reach(struct gs_cli *cli, const char *hosts, const char *given, char *detail,
                         size_t cap);

#endif
