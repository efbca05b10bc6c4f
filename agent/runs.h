/* runs: the run directory DIR/.gpusync/runs/<id>/ that `launch` creates and `tail`, `ps` and
 * `stop` read: meta.json (what was started), status.json (where it stands, rewritten atomically)
 * and supervisor.lock (held by the live supervisor, so liveness survives pid reuse). Also the
 * `ps` and `stop` commands. */
#ifndef GA_RUNS_H
#define GA_RUNS_H

#include <stddef.h>
#include <sys/types.h>

#include "jsonw.h"
#include "proto/run.h" /* GS_PROTO_RUN_ID_MAX, GS_PROTO_RUN_MAX_RANKS: limits both sides check */

#define GA_RUNS_NAME_MAX 128 /* --name values */

/* One local rank of the current attempt. exit_code -1 and signal 0 stand for JSON null (still
 * running); a rank killed by signal S has signal S and exit_code 128+S. */
struct ga_runs_rank {
    int rank, local_rank;
    long pid, pgid;
    int exit_code, signal;
    long long pgid_start; /* the group leader's start time (pgroup.h); 0 when unknown */
    int group_gone;       /* the group was seen empty or its number reused: never signal it */
    int oom;              /* killed by SIGKILL while the kernel counted an OOM kill */
    int stopped;          /* ended by the supervisor's signal (a stop, or another rank failed) */
    int paused; /* ps and top only, never in status.json: a process of its group is stopped */
};

/* A process that outlived SIGTERM by the grace period and got SIGKILL. */
struct ga_runs_killed {
    long pid;
    char name[17];
};
#define GA_RUNS_KILLED_MAX 16 /* how many status.json names; killed_count has them all */

/* The contents of status.json. */
struct ga_runs_status {
    char id[GS_PROTO_RUN_ID_MAX + 1];
    char state[16]; /* running, succeeded, failed, stopped ("lost" is only derived) */
    int exit_code;  /* -1 = null */
    int restarts;
    char start[40], end[40]; /* ISO-8601 UTC; end "" = null */
    long supervisor_pid;
    int master_port;
    int nranks;
    struct ga_runs_rank *ranks; /* nranks entries, owned */
    int max_restarts;
    long grace_ms;      /* SIGTERM to SIGKILL */
    int failed_rank;    /* global rank of the first failure; -1 = null */
    char oom_scope[16]; /* where an OOM kill was counted: "cgroup", "machine"; "" = none */
    char cgroup[4096];  /* the run's cgroup v2 directory (procs.h); "" = none */
    long others_termed; /* processes outside the ranks' groups that got SIGTERM */
    long killed_count;  /* processes that got SIGKILL after the grace period */
    int nkilled;        /* the first of them, named */
    struct ga_runs_killed killed[GA_RUNS_KILLED_MAX];
};

struct ga_proclist;
/* Sets paused on each rank of st, a run whose supervisor is alive, that still runs (exit_code
 * null, its group the run's) while a process of its group is in `stopped` (ga_procs_stopped): a
 * SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU, or a debugger, holds it until a SIGCONT. Read at the
 * moment, never recorded: a continued rank reads running again at once. */
void ga_runs_mark_paused(struct ga_runs_status *st, const struct ga_proclist *stopped);

/* Counts the processes of l, about to get SIGKILL after the grace period, in st->killed_count
 * and names the first GA_RUNS_KILLED_MAX in st->killed, each pid once however often it is
 * noted. Used by the supervisor and by stop for a run whose supervisor is gone. */
void ga_runs_note_killed(struct ga_runs_status *st, const struct ga_proclist *l);

/* Frees st->ranks; *st is then zeroed. */
void ga_runs_status_release(struct ga_runs_status *st);

/* Returns 1 if id is a valid run id (safe as one path component). */
int ga_runs_id_valid(const char *id);

/* Writes root/.gpusync/runs[/id] into buf (cap bytes). id may be NULL. Returns 0, or -1 if it
 * does not fit. */
int ga_runs_path(char *buf, size_t cap, const char *root, const char *id);

/* Writes dir/name into buf (cap bytes). Returns 0, or -1 if it does not fit. */
int ga_runs_join(char *buf, size_t cap, const char *dir, const char *name);

/* Writes the current UTC time as ISO-8601 with milliseconds ("2026-11-21T10:18:41.123Z"). */
void ga_runs_now_iso(char *buf, size_t cap);

/* Milliseconds since the epoch of an ISO time written by ga_runs_now_iso; -1 if unparsable. */
long long ga_runs_iso_ms(const char *iso);

/* Milliseconds of CLOCK_MONOTONIC. */
long long ga_runs_mono_ms(void);

/* Writes data to dir/name through dir/name.tmp.<pid> and rename(2), so a reader sees the old
 * or the new file, never half of one. Returns 0, or -1 with errno set (no file left behind). */
int ga_runs_write_atomic(const char *dir, const char *name, const char *data, size_t len);

/* Serialises st as status.json into dir. Returns 0 or -1 with errno set. */
int ga_runs_write_status(const char *dir, const struct ga_runs_status *st);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer the caller frees. Returns
 * NULL with errno set on failure. */
char *ga_runs_slurp(const char *path, size_t *len);

/* Reads dir/status.json into *st (which the caller releases). Returns 0, or -1 (missing or
 * malformed file; *st is then empty). */
int ga_runs_read_status(const char *dir, struct ga_runs_status *st);

/* Writes how the run in dir ended as one JSON object on one line (the summary of tail's X line,
 * proto/run.h): state, exit_code, duration_ms, restarts, max_restarts; the failing rank (or null)
 * with its exit_code, signal, oom and up to 5 last lines of its log; the ranks stopped because of
 * it; the other processes stopped and killed. */
void ga_runs_summary_json(const char *dir, const struct ga_runs_status *st, struct ga_jw *w);

/* Returns 1 while the supervisor of the run in dir holds supervisor.lock, 0 otherwise. */
int ga_runs_supervisor_alive(const char *dir);

/* Resolves a run id or a run --name (the newest run of that name wins) to an id under root.
 * Returns 0 with the id in out (cap bytes), or -1 with a message in err. */
int ga_runs_resolve(const char *root, const char *arg, char *out, size_t cap, char *err,
                    size_t errlen);

/* `gpusync-agent ps --root DIR [--json]`. Returns the exit status. */
int ga_ps_main(int argc, char **argv);

/* `gpusync-agent stop --root DIR --id ID [--grace-ms MS]`: SIGTERM to every process of the run,
 * SIGKILL to those still there after the grace period (the run's own, from launch, unless
 * --grace-ms), and a report of what it killed. Returns the exit status: 0 when no
 * process of the run remains, 1 if one survived or the run is unknown, 2 on bad usage. */
int ga_stop_main(int argc, char **argv);

#endif
