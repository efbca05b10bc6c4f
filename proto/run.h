/* proto/run.h: the run protocol, everything the client (remote/runs.c, cli/) and the agent's
 * run commands (agent/launch.c, runlog.c, runs.c) exchange: the command lines the client sends,
 * the lines `launch` and `tail` print, the JSON `ps` prints, and the limits both sides check.
 * One header (and proto/run.c for the line formats) so the two sides cannot drift. C99, libc.
 *
 * COMMANDS, run by the client through the remote shell in the project directory (one exec each):
 *   launch --root DIR --id ID --nproc N --max-restarts K [--gpus LIST [--ngpus G] [--wait]]
 *          [--name NAME] [--nnodes M --node-rank R] [--master-addr HOST] [--master-port P]
 *          [--follow RANKS] -- CMD ARGS...
 *          --gpus alone reserves exactly those GPUs; with --ngpus the first G of LIST (the
 *          client's least-busy order) that no other run holds. Not free: exit
 *          GS_PROTO_RUN_EXIT_BUSY naming the holders, or with --wait queue for them. Without
 *          --gpus the ranks see no GPU (CUDA_VISIBLE_DEVICES is empty).
 *   tail   --root DIR --id ID --ranks all|R,R... [--offsets R:OFF,R:OFF...] [--follow]
 *   ps     --root DIR --json
 *   stop   --root DIR --id ID
 *   sample --root DIR [--interval-ms N] [--count N]   (gpusync top: JSON lines, agent/sample.h)
 *   net    src ADDR | listen [--timeout-ms MS] | connect ADDR PORT [--timeout-ms MS]
 *          (no --root: probes for multi-node runs, agent/net.h)
 * ID may be a run's --name where a run already exists (tail, stop). Exit status: 0 done, 1
 * failure (message on stderr), 2 bad usage. A launch whose command could not start (not found,
 * not executable) exits 1 after an X line instead of the started line: the run exists and
 * ended failed with 127 or 126, as a shell's would.
 *
 * LINES on stdout, each ending in '\n':
 *   "waiting TEXT"                     launch --wait: queued for GPUs; TEXT says for which and who
 *                                      holds them. Again whenever that changes; before "started".
 *   "gpus LIST"                        launch: the GPUs reserved for the run ("1,3"), just before
 *                                      the started line; none for a run without GPUs.
 *   "started ID PID PORT AGENT_PATH"   launch: the run started (supervisor pid, the rendezvous
 *                                      port); AGENT_PATH, the rest of the line, is the agent that
 *                                      ran, for the client's later commands. With --follow, the
 *                                      frames of `tail --follow` come next.
 *   "L RANK OFFSET LENGTH" + LENGTH bytes   tail: bytes OFFSET.. of rank RANK's log (global rank);
 *                                      LENGTH <= GS_PROTO_RUN_MAX_CHUNK.
 *   "X EXIT STATE [SUMMARY]"           tail: once, last, when the run has ended and every byte was
 *                                      sent (launch: in place of started, with no SUMMARY, when
 *                                      the command could not start). EXIT is the exit code or
 *                                      "null"; STATE is succeeded, failed, stopped, or lost when
 *                                      the supervisor vanished.
 *                                      SUMMARY, the rest of the line, is a JSON object saying how
 *                                      it ended (agent/runs.h ga_runs_summary_json: the failing
 *                                      rank, its last lines, OOM, restarts, duration).
 *   "stopped ID" / "not running ID"    stop: the report the client shows as it is.
 *   "ADDR"                             net src: this server's address on its route to ADDR.
 *   "port N", then "accepted FROM"     net listen: listening on N; then the one connection came.
 *   "connected"                        net connect: the TCP connection was made.
 *
 * JSON: `ps --json` prints one array of run objects; the client reads "id", "name", "state",
 * "exit_code", "start", "gpus", "ranks" (an array, one object per local rank) and "duration_ms".
 * docs/json-contract.md lists every field. */
#ifndef GS_PROTO_RUN_H
#define GS_PROTO_RUN_H

#include <stddef.h>

/* v1: the protocol as it stood when it got this header (not yet sent on the wire). */
#define GS_PROTO_RUN_VERSION 1

#define GS_PROTO_RUN_LAUNCH "launch"
#define GS_PROTO_RUN_TAIL   "tail"
#define GS_PROTO_RUN_PS     "ps"
#define GS_PROTO_RUN_STOP   "stop"
#define GS_PROTO_RUN_SAMPLE "sample"
#define GS_PROTO_RUN_NET    "net"

#define GS_PROTO_NET_SRC     "src"
#define GS_PROTO_NET_LISTEN  "listen"
#define GS_PROTO_NET_CONNECT "connect"

#define GS_PROTO_RUN_MAX_RANKS 4096        /* local ranks per node */
#define GS_PROTO_RUN_ID_MAX    64          /* run ids: [A-Za-z0-9._-], not starting with '.' */
#define GS_PROTO_RUN_MAX_CHUNK (16u << 20) /* the longest LENGTH an L line may announce */
#define GS_PROTO_RUN_STATE_MAX 32          /* buffer for an X line's STATE, NUL included */
#define GS_PROTO_RUN_GPUS_MAX  1024        /* buffer for a gpus line's LIST, NUL included */
#define GS_PROTO_RUN_WAIT_MAX  4096        /* buffer for a waiting line's TEXT, NUL included */

/* launch's exit status when the GPUs it was asked for are held by other runs (and no --wait). */
#define GS_PROTO_RUN_EXIT_BUSY 3

/* Each format function writes one line, '\n' included, into buf (cap bytes) and returns its
 * length, or -1 if it does not fit. Each parse function reads the line at the start of `line`
 * (NUL-terminated; it may go on past the line's '\n') and returns 0, or -1 if it is not such a
 * line, leaving the outputs unspecified. */

int gs_proto_run_started_format(char *buf, size_t cap, const char *id, long pid, long port,
                                const char *agent_path);
/* 1 if `line` is a started line (however malformed the rest), else 0. */
int gs_proto_run_is_started(const char *line);
/* *agent_at: the offset of AGENT_PATH in line, or 0 when the line has none. */
int gs_proto_run_started_parse(const char *line, long *pid, int *port, int *agent_at);

/* The text is cut at its first '\n'. */
int gs_proto_run_waiting_format(char *buf, size_t cap, const char *text);
int gs_proto_run_waiting_parse(const char *line, char text[GS_PROTO_RUN_WAIT_MAX]);

int gs_proto_run_gpus_format(char *buf, size_t cap, const char *list);
/* Accepts only digits and commas as LIST. */
int gs_proto_run_gpus_parse(const char *line, char list[GS_PROTO_RUN_GPUS_MAX]);

int gs_proto_run_log_format(char *buf, size_t cap, int rank, long long offset, size_t length);
/* Checks the syntax only: the caller bounds rank and length. */
int gs_proto_run_log_parse(const char *line, int *rank, unsigned long long *offset,
                           unsigned long long *length);

/* exit_code < 0 is written as null; summary (a one-line JSON object) may be NULL. */
int gs_proto_run_exit_format(char *buf, size_t cap, int exit_code, const char *state,
                             const char *summary);
/* *exit_code is -1 for null; *summary_at: the offset of SUMMARY in line, 0 when it has none (it
 * runs to the end of the line). */
int gs_proto_run_exit_parse(const char *line, int *exit_code, char state[GS_PROTO_RUN_STATE_MAX],
                            int *summary_at);

#endif
