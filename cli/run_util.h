/* cli/run_util.h: what the run commands (run, logs, ps, stop) share: the agent on the server,
 * syncing before a launch, naming runs, and printing rank logs with prefixes.
 *
 * Names: gs_run_ctx_* act on a run on the server through a gs_run_ctx (the daemon's connection
 * or our own); gs_cli_* are about the command's context; remote/runs.h's gs_run_* (launch,
 * tail, stop) are the single operations over one SSH connection underneath. */
#ifndef GS_RUN_UTIL_H
#define GS_RUN_UTIL_H

#include <pthread.h>
#include <signal.h>

#include "cli/cli.h"
#include "remote/runs.h"

/* The connected server's agent path and the remote project directory (shell words), and the run
 * gs_run_ctx_resolve found last: its `ps --json` entry (owned; NULL before), freed by
 * gs_run_ctx_release. */
struct gs_run_ctx {
    struct gs_buf agent;
    struct gs_buf dir;
    json_t *resolved;
};

/* Installs the agent if needed (needs cli->ssh). Returns 0 or a negative code in cli->err. */
int gs_run_ctx_open(struct gs_cli *cli, struct gs_run_ctx *rc);
/* As gs_run_ctx_open without asking the server anything: rc->agent stays empty until a command
 * learns it (gs_run_ctx_launch_follow) or needs it (gs_run_ctx_agent installs then). */
void gs_run_ctx_init(struct gs_cli *cli, struct gs_run_ctx *rc);
int gs_run_ctx_agent(struct gs_cli *cli, struct gs_run_ctx *rc);
void gs_run_ctx_release(struct gs_run_ctx *rc);

/* Connects cli->ssh unless connected: the run commands go through the watch daemon's spare
 * connection when one runs (gs_cli_capture, gs_run_ctx_launch_follow) and connect only when
 * they must. Returns 0 or a negative code in cli->err. */
int gs_cli_ensure_connected(struct gs_cli *cli);

/* The server for messages: as connected, or (through the daemon) as configured. Valid until the
 * next call. */
const char *gs_cli_server_name(struct gs_cli *cli);

/* 1 when a watch daemon runs for this project and is connected: its relay can run commands. */
int gs_cli_daemon_ready(struct gs_cli *cli);

/* Asks the watch daemon for `cmd` ("flush" or "push") and waits up to `timeout_ms` for its
 * answer (gs_control_request's return and *reply). Meanwhile a terminal shows the progress of
 * the batches it waits on, and `notice` is printed if the wait lasts past GS_NOTICE_MS first. */
int gs_cli_daemon_sync(struct gs_cli *cli, const char *cmd, int timeout_ms, const char *notice,
                       json_t **reply);

/* Whether the watch daemon's answer to a flush or push (`rc` and `reply` of gs_control_request)
 * says it stopped before it had synced: told to stop meanwhile, or gone without a word. The
 * caller then syncs by itself, now that no daemon does; syncing again is harmless. */
int gs_cli_daemon_stopped(int rc, json_t *reply);

/* Runs `command` on the server and appends its stdout to `out`: through the daemon's spare
 * connection when cli->ssh is not connected and a daemon runs, else over cli->ssh (connecting
 * first). Returns its exit status (>= 0) or a negative code in cli->err. */
int gs_cli_capture(struct gs_cli *cli, const char *command, struct gs_buf *out);

/* Runs the agent's `sub` with `args` in the remote project (gs_run_agent_command): through the
 * daemon with whichever build is cached there when cli->ssh is not connected, else (or when none
 * is cached) over cli->ssh with the installed agent. stdout goes to `out`, stderr to `errout`.
 * Returns the exit status (>= 0) or a negative code in cli->err. */
int gs_run_ctx_capture(struct gs_cli *cli, struct gs_run_ctx *rc, const char *sub, const char *args,
                       struct gs_buf *out, struct gs_buf *errout);

/* Runs the agent's `sub` with `args` as gs_run_ctx_capture does (through the daemon's spare
 * connection when cli->ssh is not connected and a daemon runs, else over cli->ssh), handing its
 * stdout to `fn` as it arrives and its stderr to `errout`. Returns the exit status (>= 0),
 * GS_E_INTERRUPTED once *interrupted is set (the remote command's stdout is then closed under
 * it), or a negative code in cli->err. */
int gs_run_ctx_stream(struct gs_cli *cli, struct gs_run_ctx *rc, const char *sub, const char *args,
                      gs_run_out_fn fn, void *ctx, struct gs_buf *errout,
                      volatile sig_atomic_t *interrupted);

/* A line for a wait that may be long: printed on stderr ("gpusync: TEXT") only if the wait
 * lasts more than `after_ms`, so a quick answer stays quiet and a slow one says what it waits
 * for. Uses a thread; gs_notice_end must follow every gs_notice_begin. */
struct gs_notice {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int over, running, after_ms;
    char text[512];
};
#define GS_NOTICE_MS 2000
void gs_notice_begin(struct gs_notice *n, int after_ms, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gs_notice_end(struct gs_notice *n);

/* Stops run `id` (the agent's stop, as gs_run_ctx_capture runs it): SIGTERM to every process of
 * it, SIGKILL to what is left after grace_ms (< 0: the run's own grace period, 10 s unless `run
 * --grace`); the agent's report of what it killed goes to `out`. Says what it waits for when that
 * takes more than GS_NOTICE_MS. Returns 0, or GS_E_REMOTE when something survived or the run is
 * unknown. */
int gs_run_ctx_stop(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, long grace_ms,
                    struct gs_buf *out);

/* Connects cli->ssh unless a connected watch daemon can carry the commands. */
int gs_cli_connect_unless_daemon(struct gs_cli *cli);

/* The remote runs as the agent's `ps --json` prints them (a JSON array) in `out`. */
int gs_run_ctx_list(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_buf *out);

/* Makes the server match the local tree before a launch: the daemon's flush when one runs,
 * otherwise a push over the existing connection. Prints one line on stderr. */
int gs_cli_sync(struct gs_cli *cli);

/* As gs_cli_sync, for an extra node of a multi-node run (cli->cfg names that node): always a
 * push over cli->ssh, recorded in the node's own index (.gpusync/index.<node key>.db), so the
 * project's index, which the watch daemon may be using for the configured server, is left
 * alone. Returns 0 or a negative code in cli->err. */
int gs_cli_sync_node(struct gs_cli *cli);

/* "user@host:port:path" for the server directory `cfg` names, with user, host and port resolved
 * as OpenSSH would (remote/target.h): an ~/.ssh/config alias and its HostName, a port written or
 * left to its default, are one node, with one index. malloc'd. */
char *gs_cli_node_key(const struct gs_config *cfg);

/* Refuses a rank list (`--rank` of logs, `--ranks` of run: "0,2"; NULL or "all" pass) naming a
 * rank that a run of `nranks` ranks (0: not known yet, which passes) does not have: its logs would
 * show nothing, as if that rank were silent. `what` names the run in the message. Returns 0, or
 * GS_E_USAGE in cli->err. */
int gs_run_check_ranks(struct gs_cli *cli, const char *option, const char *ranks, int nranks,
                       const char *what);

/* A run's state for people, from its ps or top JSON object: its "state", except that a running
 * run with ranks paused by a signal (rank "paused": true) reads "paused" when every rank still
 * running is, else "paused:K/N" (K of its N ranks). One word: tables are split on spaces. In buf
 * or a string of `run`; "-" when it has none. */
const char *gs_run_state_text(json_t *run, char *buf, size_t cap);

/* Resolves RUN (an id, a --name, or NULL for the newest run) to an id, by asking the server.
 * A name picks the newest run of that name; with `live`, the newest one still running (or lost,
 * which stop can still end) when there is one: several runs may share a name. Appends the id to
 * `id` and keeps the run's ps entry in rc->resolved. Returns 0, or GS_E_NOTFOUND (rc->resolved
 * then NULL). */
int gs_run_ctx_resolve(struct gs_cli *cli, struct gs_run_ctx *rc, const char *run, int live,
                       struct gs_buf *id);

/* Prints rank logs as whole lines with "[rank N] " prefixes (when `prefix`), keeping a local copy
 * in .gpusync/runs/<id>/ (run_local.h). */
struct gs_log_printer {
    struct gs_cli *cli;
    const char *id;
    const char *name; /* the run's --name or NULL, kept with the local copy (logs NAME finds it) */
    int name_kept;
    int prefix;
    int from_local_copy; /* printing the local copy itself: nothing to keep */
    int tail_lines;      /* >0: print only the last N lines (logs --tail) when done */
    struct gs_buf partial[GS_RUNS_MAX_RANKS];
    struct gs_buf kept;    /* for --tail: everything, trimmed at the end */
    pthread_mutex_t *lock; /* held around each chunk when several threads print; or NULL */
    int open_line;         /* unprefixed bytes went out as they came, the last not a newline */
};
void gs_log_printer_init(struct gs_log_printer *p, struct gs_cli *cli, const char *id, int prefix);
void gs_log_printer_chunk(void *ctx, int rank, uint64_t off, const char *data, size_t len);
/* Prints any unterminated last lines and frees the buffers. */
void gs_log_printer_finish(struct gs_log_printer *p);
/* Ends the first part of `logs -f --tail N`: prints the last N whole lines, and leaves a line still
 * being written (no newline yet) unprinted, moving its rank's offset in `st` back to the line's
 * start, so that the follow prints it whole. Frees the buffers as gs_log_printer_finish. */
void gs_log_printer_end_tail(struct gs_log_printer *p, struct gs_tail_state *st);

/* Streams run `id`'s logs from st's offsets as gs_run_tail does, through the daemon when cli->ssh
 * is not connected and no agent path is known yet. */
int gs_run_ctx_tail(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, const char *ranks,
                    int follow, struct gs_tail_state *st, struct gs_log_printer *printer,
                    volatile sig_atomic_t *interrupted);

/* Follows run `id` until it ends, reconnecting after a dropped connection and resuming where it
 * stopped. Returns 0 with *exit_code, GS_E_INTERRUPTED on Ctrl-C, or an error. */
int gs_run_ctx_follow(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, const char *ranks,
                      struct gs_log_printer *printer, volatile sig_atomic_t *interrupted,
                      int *exit_code);
/* As gs_run_ctx_follow, but from the offsets in *st (zeroed by the caller for the whole logs;
 * kept across calls, a follow that was interrupted resumes where it stopped) and saying nothing
 * of how the run ended: on 0 that is left in *st (state, exit_code, summary) for a caller that
 * says it once for several nodes. */
int gs_run_ctx_follow_end(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                          const char *ranks, struct gs_log_printer *printer,
                          volatile sig_atomic_t *interrupted, int *exit_code,
                          struct gs_tail_state *st);
/* The same from where an earlier gs_run_ctx_tail left `st` (logs -f --tail N: the last lines,
 * then what comes). */
int gs_run_ctx_follow_from(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                           const char *ranks, struct gs_log_printer *printer,
                           volatile sig_atomic_t *interrupted, int *exit_code,
                           struct gs_tail_state *st);

/* Starts `spec` and follows it as gs_run_ctx_follow does, launch and first stream in one exec (see
 * gs_run_launch_follow). `view` starts with the printer; `started` gets it once the run is up.
 * Without a known agent, the cached builds are tried first and one is installed only if none is
 * there. A run that never started returns its error; when that was because its command could not
 * start, *exit_code is the code the run recorded (127, 126), else it is left alone. */
int gs_run_ctx_launch_follow(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_run_spec *spec,
                             const char *ranks, gs_started_fn started, struct gs_log_printer *view,
                             volatile sig_atomic_t *interrupted, int *exit_code);

#endif
