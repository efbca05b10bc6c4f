/* syncd/session.h: everything one sync needs, opened in one place for the CLI and the daemon:
 * the ignore rules, the index (.gpusync/index.db) and, once connected, the transport: the agent
 * when it can run on the server, else the SFTP fallback (design decisions 2-4). */
#ifndef GS_SYNCD_SESSION_H
#define GS_SYNCD_SESSION_H

#include "common/config.h"
#include "common/error.h"
#include "remote/agent_client.h"
#include "remote/fileops.h"
#include "remote/ssh.h"
#include "syncd/ignore.h"
#include "syncd/index.h"
#include "syncd/verify.h"

struct gs_session {
    char *root; /* local project root (absolute) */
    const struct gs_config *cfg;
    struct gs_ignore *ig;
    struct gs_index *idx;
    struct gs_fileops *ops; /* NULL until connected */
    struct gs_agent *agent; /* the agent behind ops, or NULL (SFTP) */
    char transport[256];    /* "agent (uploaded)", "sftp (fallback: ...)" */
    struct gs_ssh *ssh;     /* borrowed, from gs_session_start */
    char *remote_dir;       /* quoted shell word, for the agent */
    char *remote_path;      /* raw, for SFTP */
    int index_reset;      /* gs_session_ready found another server's tree: the index was cleared */
    int reset_quiet;      /* ready does not warn of that reset (that it sends everything again):
                           * the caller says what it means for it (pull, which sends nothing) */
    int early;            /* ops went out before the agent answered (gs_session_go_early) */
    size_t early_entries; /* the index's entries when they did (0: a first sync) */
    char **early_written; /* paths the early requests wrote to the index (owned) */
    size_t n_early_written, cap_early_written;
    int early_lost;    /* gs_session_ready had to install the agent: the early ops were lost */
    int settled;       /* ready has reconciled the intents for this connection */
    size_t reconciled; /* operations an interrupted sync left in doubt, settled by ready */
    struct gs_verify_result verified; /* ready's check of the server against the index */
    struct gs_verify *checking; /* that check, prepared before start (gs_session_check_early) */
    int no_server_check;        /* ready does not check it: pull, which takes what the server holds
                                 * and tells a local edit by the index's record of the last sync */
    char resident_key[33];      /* this session's key in .gpusync/resident (syncd/resident.h) */
    int resident_wanted;        /* the agent is asked to keep a listener: not resident = off, and
                                 * the server did not refuse the channel to one lately */
    int resident_refused;       /* the channel to the remembered listener was refused just now */
    int locked;                 /* lock_fd holds .gpusync/sync.lock (gs_session_lock) */
    int lock_fd;
};

#define GS_SESSION_LOCK ".gpusync/sync.lock" /* relative to the project root */
#define GS_SESSION_SIGS ".gpusync/sigs"      /* signatures of large files sent (remote/delta.h) */
/* The paths the agent kept for its last check of the server, as it saved them (check_set.h). */
#define GS_SESSION_CHECKED ".gpusync/check-kept"
/* The link's rate as the last session measured it (remote/agent_client.h): with compress = auto,
 * a session starts at the slow-link level when it says the link is slow. */
#define GS_SESSION_LINK ".gpusync/link"

/* Opens the local half (ignore rules and index) for the project at `root` with `cfg` (borrowed:
 * it must outlive the session). Returns 0 or a negative code; on failure nothing stays open. */
int gs_session_open(struct gs_session *s, const char *root, const struct gs_config *cfg,
                    struct gs_error *err);

/* The two halves of gs_session_open, for a caller that opens the ignore rules on another thread:
 * starting libgit2 reads the system's CA bundle, 8 ms that need not come before connecting. */
int gs_session_open_index(struct gs_session *s, const char *root, const struct gs_config *cfg,
                          struct gs_error *err);
int gs_session_open_ignore(struct gs_session *s, struct gs_error *err);

/* Opens the transport over `ssh` (borrowed) for the remote directory `remote_dir` (a quoted shell
 * word, for the agent) / `remote_path` (raw, for SFTP). Installs the agent if needed; falls back to
 * SFTP when the config says so or no agent can run, recording why in s->transport. */
int gs_session_connect(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                       const char *remote_path, struct gs_error *err);

/* The two halves of gs_session_connect, so that a caller can overlap the connection's round trips
 * with local work (a push plans while the agent starts): start launches the cached agent (or opens
 * SFTP) without waiting; ready waits for the agent's answer and, if none was cached, installs one
 * (or falls back to SFTP). s->ops is set once ready succeeds.
 *
 * Ready also checks that the server still holds the tree the index describes: the first sync
 * leaves a random token in the remote .gpusync/sync-id, kept in the index too; a server that was
 * wiped or recreated lacks it (or has another), and then the index is cleared (s->index_reset) so
 * that everything is sent again instead of trusting a record of files that are gone.
 *
 * Ready then settles the intents an interrupted sync left (syncd/reconcile.h) before anything
 * is sent, setting s->reconciled to their number, and checks every indexed path on the server
 * (syncd/verify.h), setting s->verified: where either changed the index (s->reconciled, or
 * verified.gone or .changed, nonzero: gs_session_replan), a plan made before ready must be made
 * again. A transport error while settling fails ready (the intents stay for the next try). Only
 * ready touches the index, so a caller may plan on another thread until it calls ready. */
int gs_session_start(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                     const char *remote_path, struct gs_error *err);
int gs_session_ready(struct gs_session *s, struct gs_error *err);

/* 1 when ready changed the index (reconciled intents, or found the server changed): a plan made
 * before it must be made again. */
int gs_session_replan(const struct gs_session *s);

/* Unless an interrupted sync left intents to settle first, lets requests go out between start and
 * ready, so that they cross the link while the server's shell and agent start (and the handshake's
 * round trip overlaps them). A plan made from the index may be wrong about the server, but never
 * harmfully so: every request carries what it expects there (no file, or the hash the index
 * recorded), the agent enforces it, and a file it finds changed is kept as a conflict copy, as on
 * any other sync. Sets s->ops and returns 1, or returns 0 (intents, SFTP, or already ready).
 * gs_session_ready must still follow. If it had to install the agent (none was cached, so the
 * early requests were lost with the failed start, and nothing they asked for was done), it sets
 * s->early_lost; if the server turned out to hold another tree than the index's, it clears the
 * index and sets s->index_reset. Either way the caller plans and executes again. Otherwise every
 * early request was answered by the agent, refusals included, and must not be sent a second
 * time. */
int gs_session_go_early(struct gs_session *s);

/* Before gs_session_start, while nothing else reads the index: takes the index's entries for
 * ready's check of the server (syncd/verify.h), which gs_session_start then sends as soon as the
 * agent's channel is open, so that the server answers while the plan is made and the first
 * requests go, instead of in a round trip of its own after ready (20,000 files at 50 ms: 0.6 s
 * a push before, 0.5 s after). Without it (or where it cannot be sent) ready checks by itself. */
void gs_session_check_early(struct gs_session *s);

/* Serialises the syncs of one project on this machine. The agent fences out any earlier session on
 * its root (agent/fence.h), so two gpusync processes that opened sessions to one server at
 * once (a push while `watch` runs) would kill each other's agents. Every command that opens an
 * agent session (push, pull, the sync before a run, the daemon) holds this lock (flock(2) on
 * .gpusync/sync.lock, not inherited by children) from before it starts the agent until it is done
 * with it. With `wait` it blocks until the lock is free (for the daemon's current batch at most);
 * without, it returns 1 at once when another process holds it. Returns 0 once held (or already
 * held), 1 (busy, nothing held), or a negative code with err set when the lock file cannot be
 * opened or locked (nothing held then either). gs_session_close releases it too. */
int gs_session_lock(struct gs_session *s, int wait, struct gs_error *err);

/* Releases the lock taken by gs_session_lock; nothing happens if none is held. */
void gs_session_unlock(struct gs_session *s);

/* Closes the transport only (after a lost connection); the local half stays open. */
void gs_session_disconnect(struct gs_session *s);

/* Closes everything, the sync lock included. Safe on a zeroed session. */
void gs_session_close(struct gs_session *s);

/* The index's remote identity for `cfg`: "user@host:port:path" (malloc'd). */
char *gs_session_remote_id(const struct gs_config *cfg);

#endif
