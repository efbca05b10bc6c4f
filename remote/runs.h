/* remote/runs.h: the client side of remote runs: starting `gpusync-agent launch`, following the
 * rank logs through `gpusync-agent tail` (frames carry byte offsets, so a follow resumes after a
 * dropped connection with no line lost or repeated), and `ps` / `stop`. */
#ifndef GS_RUNS_H
#define GS_RUNS_H

#include <signal.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/error.h"
#include "proto/run.h"
#include "remote/ssh.h"

/* Ranks per node: the run protocol's limit, which the agent checks too (`run` refuses more before
 * it launches, common/config.h's GS_CONFIG_MAX_CPU for --cpu and [job] cpu). */
#define GS_RUNS_MAX_RANKS GS_PROTO_RUN_MAX_RANKS

struct gs_run_spec {
    const char *agent;      /* remote agent path (shell word); NULL: whichever build is cached */
    const char *remote_dir; /* remote project directory (quoted shell word) */
    const char *id;
    const char *name; /* or NULL */
    int nproc;
    const char *gpus; /* "0,2", or NULL for CPU ranks (they then see no GPU) */
    int gpu_count;    /* > 0: the launcher reserves this many of `gpus`, which is then the order
                       * to choose in; 0: exactly `gpus` */
    int wait_gpus;    /* queue until the GPUs are free instead of failing */
    int max_restarts;
    long grace_ms; /* SIGTERM to SIGKILL when the run is stopped; 0: the agent's default */
    int argc;
    char *const *argv;     /* the command, exactly (each argument quoted for the remote shell) */
    const char *extra_env; /* "NAME=value" words for the remote shell, or NULL */
    /* Multi-node runs (nnodes 0 or 1: a single node, the launcher picks the port): */
    int nnodes, node_rank;
    const char *master_addr; /* NULL: 127.0.0.1 */
    int master_port;         /* 0: the launcher picks a free one (node 0 only) */
};

/* Appends the remote command that runs the agent's `sub` ("ps", "tail", "stop") in `remote_dir`
 * with `args` after its --root: through `agent` (a path), or with agent NULL whichever build is
 * cached there (gs_agent_cached_command: exit 127 and GS_AGENT_MISSING when none is). */
void gs_run_agent_command(const char *agent, const char *remote_dir, const char *sub,
                          const char *args, struct gs_buf *cmd);

/* Appends the remote launch command for `spec`; with `follow` (a ranks list) the launcher then
 * streams those ranks' logs (gs_run_stream parses them). */
void gs_run_launch_command(const struct gs_run_spec *spec, const char *follow, struct gs_buf *cmd);

/* Where a follow has got to: per rank, the next byte offset; then the run's end. */
struct gs_tail_state {
    uint64_t offset[GS_RUNS_MAX_RANKS];
    int finished;
    int exit_code; /* -1 when unknown (a lost run) */
    char state[GS_PROTO_RUN_STATE_MAX];
    char summary[16384]; /* how it ended: the X line's JSON object (proto/run.h), "" if none */
    /* Filled by gs_run_launch_follow once the run started: */
    int launched;
    long pid;
    int port;
    char agent[1024]; /* the agent that launched it, as a shell word for later commands */
    char gpus[GS_PROTO_RUN_GPUS_MAX];    /* the GPUs reserved for it ("1,3"), "" for none */
    char waiting[GS_PROTO_RUN_WAIT_MAX]; /* before it started: what the launch queues for */
};

/* Starts the run. Returns 0 with what the launcher said in *st (zeroed first): the supervisor
 * pid, the master port, the GPUs; or GS_E_REMOTE with the launcher's message. When the run's
 * command could not start, st->finished is set and st->exit_code is the code the run recorded
 * (127 not found, 126 not executable). */
int gs_run_launch_state(struct gs_ssh *ssh, const struct gs_run_spec *spec,
                        struct gs_tail_state *st, struct gs_error *err);

/* The arguments of `tail` for run `id` from the offsets in `st` (ranks NULL: all). */
void gs_run_tail_args(const char *id, const char *ranks, int follow, const struct gs_tail_state *st,
                      struct gs_buf *args);

/* Called with whole chunks of a rank's log, in order: `len` bytes from byte `off` of it. Chunks
 * of different ranks come in the order they were written (as far as the server recorded it). */
typedef void (*gs_tail_fn)(void *ctx, int rank, uint64_t off, const char *data, size_t len);

/* Called once when the run has started (st->launched 1), before any of its logs; and before
 * that, while the launcher queues for GPUs (launch --wait), each time st->waiting changes
 * (st->launched 0). */
typedef void (*gs_started_fn)(void *ctx, const struct gs_tail_state *st);

/* A parser for what `launch --follow` and `tail` print, for output that arrives some other way
 * than an SSH channel of ours (the watch daemon's relay). */
struct gs_run_stream {
    struct gs_buf in;
    struct gs_buf errout; /* the remote stderr, for a launch that failed */
    struct gs_tail_state *st;
    gs_tail_fn fn;
    gs_started_fn started;
    void *ctx;
};
/* Feeds output bytes. Returns 0, or -1 for garbage. */
int gs_run_stream_feed(struct gs_run_stream *p, const char *data, size_t len);
/* The error for a launch that ended with no "started" line (GS_E_NOTFOUND with GS_AGENT_MISSING
 * when no agent was cached there); frees nothing. */
int gs_run_stream_launch_failed(struct gs_run_stream *p, const char *target, struct gs_error *err);
void gs_run_stream_release(struct gs_run_stream *p);

/* Starts the run and follows its logs (`ranks`) on the same channel: one exec where launch and
 * tail took two, so the first line comes a round trip and a server shell start sooner. With
 * spec->agent NULL it tries the cached agent builds; GS_E_NOTFOUND (message containing
 * GS_AGENT_MISSING) then means none is there: install one and call again. Otherwise returns as
 * gs_run_tail, or GS_E_REMOTE with the launcher's message if the run did not start (with
 * st->finished and st->exit_code set as gs_run_launch_state does when its command could not). */
int gs_run_launch_follow(struct gs_ssh *ssh, const struct gs_run_spec *spec, const char *ranks,
                         struct gs_tail_state *st, gs_started_fn started, gs_tail_fn fn, void *ctx,
                         volatile sig_atomic_t *interrupted, struct gs_error *err);

/* Streams the logs of run `id` from the offsets in `st`, following until the run ends when
 * `follow`. Returns 0 (st->finished says whether the run ended), GS_E_INTERRUPTED when
 * *interrupted became non-zero, or a connection error (st keeps the offsets to resume from). */
int gs_run_tail(struct gs_ssh *ssh, const char *agent, const char *remote_dir, const char *id,
                const char *ranks, int follow, struct gs_tail_state *st, gs_tail_fn fn, void *ctx,
                volatile sig_atomic_t *interrupted, struct gs_error *err);

/* Receives a command's stdout as it arrives. Returns 0, or < 0 to stop the stream. */
typedef int (*gs_run_out_fn)(void *ctx, const char *data, size_t len);

/* Runs `cmd` and hands its stdout to `fn` as it arrives, its stderr (the first 4 KiB) to
 * `errout`, until it ends. Returns its exit status (>= 0, as gs_exec_run), GS_E_INTERRUPTED once
 * *interrupted is set, GS_E_PROTO when `fn` refused the output, or a connection error. After an
 * interrupt or a refusal the channel is closed without waiting for the command: a remote command
 * that writes or watches its stdout (the agent's tail and sample do) then ends by itself. */
int gs_run_stream_command(struct gs_ssh *ssh, const char *cmd, gs_run_out_fn fn, void *ctx,
                          struct gs_buf *errout, volatile sig_atomic_t *interrupted,
                          struct gs_error *err);

/* Stops run `id` (TERM, then KILL) and confirms no process of it remains. Appends the agent's
 * report to `out`. Returns 0, or GS_E_REMOTE when something survived or the run is unknown. */
int gs_run_stop(struct gs_ssh *ssh, const char *agent, const char *remote_dir, const char *id,
                struct gs_buf *out, struct gs_error *err);

#endif
