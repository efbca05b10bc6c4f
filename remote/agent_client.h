/* remote/agent_client.h: the client side of `gpusync-agent serve` (protocol: proto/sync.h).
 *
 * One exec channel carries framed, numbered requests that are pipelined: the client never waits
 * for a reply before sending the next request, so a bulk sync is bound by bandwidth and a single
 * save costs about one round trip. Replies arrive in request order. The agent is also the
 * transport behind `gpusync pull` (GET) and remote listings (LIST). */
#ifndef GS_AGENT_CLIENT_H
#define GS_AGENT_CLIENT_H

#include <stdint.h>

#include "common/buf.h"
#include "common/error.h"
#include "remote/fileops.h"
#include "remote/ssh.h"

struct gs_agent;

/* Runs `command` (a remote shell command that starts `gpusync-agent serve --root DIR`) and sends
 * the versioned handshake without waiting for its answer (see gs_agent_wait_ready; a version
 * mismatch or an agent that did not start surfaces there or on the first reply). With
 * compress_level > 0 (zstd's level) the handshake offers compression, and once the agent agrees
 * both directions are compressed where it pays (proto/zframes.h); 0 never compresses. Returns 0
 * and a new agent in *out, or a connection error. The agent borrows `ssh`, which must outlive
 * it. */
int gs_agent_open(struct gs_agent **out, struct gs_ssh *ssh, const char *command,
                  int compress_level, struct gs_error *err);

/* How gs_agent_start reaches `serve`: through `command`, as gs_agent_open does, or, with `socket`
 * set, through the resident listener there (proto/sync.h, RESIDENT LISTENER), serving `root` (an
 * absolute path a HELLO_OK named). With want_resident the handshake asks the agent to keep a
 * listener (gs_agent_resident then names its socket). */
struct gs_agent_how {
    const char *command;
    const char *socket, *root;
    int compress_level;
    int want_resident;
};

/* gs_agent_open as `how` says. Through a socket, the channel's open waits one round trip, as an
 * exec channel's does; a refused one (no listener there, forwarding off) is GS_E_REMOTE. */
int gs_agent_start(struct gs_agent **out, struct gs_ssh *ssh, const struct gs_agent_how *how,
                   struct gs_error *err);

/* Whether the session runs through the resident listener; and, once gs_agent_wait_ready
 * succeeded, the listener's socket path that HELLO_OK named ("" when none). */
int gs_agent_is_resident(const struct gs_agent *a);
const char *gs_agent_resident(const struct gs_agent *a);
/* Whether that listener was running before this session: a channel to it that the server just
 * refused was refused by the server's rules, not for want of a listener. */
int gs_agent_resident_ran(const struct gs_agent *a);
/* The root's absolute path, as HELLO_OK named it ("" before). */
const char *gs_agent_root(const struct gs_agent *a);
#define GS_AGENT_RESIDENT_MAX 128

/* The level for a slow link, and what counts as one: level 9 makes 23% fewer bytes than level 1
 * of source code at about 55 MB/s a core, which pays while the link is slower than that much
 * compressed output. A first push of Python's stdlib (11.2 MB) through 50 ms RTT took, level 1
 * against 9: 2.58 / 2.35 s at 10 Mbit/s, 0.99 / 0.92 s at 50, 0.79 / 0.78 s at 100, and
 * 0.71 / 0.79 s at 250 Mbit/s. The rate measured on a 100 Mbit/s link is about 8 MB/s. */
#define GS_AGENT_SLOW_LEVEL    9
#define GS_AGENT_SLOW_LINK_BPS (7.5 * 1024 * 1024) /* wire bytes a second: about 60 Mbit/s */

/* The zstd level of what goes to the agent now: the session's, or, with a level below
 * GS_AGENT_SLOW_LEVEL (compress = auto), that level once the agent's answers showed a link
 * slower than GS_AGENT_SLOW_LINK_BPS; 0 when nothing is compressed. */
int gs_agent_compress_level(const struct gs_agent *a);

/* The link's rate as the agent's answers showed it while it was kept busy, in wire bytes a
 * second, or 0 when too little went to tell (a caller keeps it for the next session). */
double gs_agent_link_rate(const struct gs_agent *a);

/* How much of the stream of requests (bytes before compression) was packed and not yet answered
 * when compress = auto raised the level, or 0 when it did not: what went at level 1 for nothing. */
uint64_t gs_agent_level_raised_ahead(const struct gs_agent *a);

/* After the handshake: 1 if the stream is compressed, and the bytes of frames sent and the bytes
 * that went on the wire for them (equal when nothing was compressed). */
int gs_agent_compression(const struct gs_agent *a, unsigned long long *frames,
                         unsigned long long *wire);

/* Waits for the handshake's answer (gs_agent_open does not, so that its round trip overlaps the
 * caller's work). Returns 0, or the error that ended the session: an agent that did not start
 * says why on its stderr, which the message includes. Requests may be submitted before this. */
int gs_agent_wait_ready(struct gs_agent *a, struct gs_error *err);

/* The root's sync id, which the handshake asks for (the agent creates one if there is none; see
 * agent/sync_id.h): valid once gs_agent_wait_ready succeeded; "" if it could not be made. */
const char *gs_agent_sync_id(struct gs_agent *a);

/* Turns on deltas of large files (proto/sync.h, DELTA; remote/delta.h): signatures of what was
 * sent are kept in `dir` (copied; made when needed), and a put whose server copy has a kept
 * signature goes as a delta when the agent takes them. NULL turns them off (the default).
 * Returns 0. A delta the agent refuses for want of its basis is sent again whole: its completion
 * then comes after those of requests submitted later. */
int gs_agent_set_delta_dir(struct gs_agent *a, const char *dir);

/* A delta made before its session is ready: a push makes it while it connects (58 ms for a 20 MB
 * notebook, which would otherwise come after the channel opened), for a put whose server copy
 * has content `basis` and whose new content is `content`. */
struct gs_agent_delta {
    uint8_t basis[16], content[16];
    struct gs_buf data;  /* the new content, for the signature kept once it is sent */
    struct gs_buf delta; /* what turns basis into content */
};

/* Makes the delta for a put of `file` (`size` bytes, hashed as `content`) whose server copy is
 * `basis`, against the signature kept in sig_dir (gs_agent_set_delta_dir). Returns 0 with *out
 * filled, or -1 when no delta applies (no signature kept, a size that gets none, a delta over
 * half the file, the file changed since it was hashed): then the put goes as it would have. */
int gs_agent_prepare_delta(const char *sig_dir, const char *file, uint64_t size,
                           const uint8_t basis[16], const uint8_t content[16],
                           struct gs_agent_delta *out);
void gs_agent_delta_release(struct gs_agent_delta *d);
/* Releases n deltas and frees `list` (from malloc). */
void gs_agent_deltas_free(struct gs_agent_delta *list, size_t n);

/* Hands n prepared deltas to the agent, which owns them (and `list`, from malloc) from then on: a
 * put of the same basis and content sends its delta without reading the file again. */
void gs_agent_take_deltas(struct gs_agent *a, struct gs_agent_delta *list, size_t n);

/* The agent as a struct gs_fileops; ops->close frees the agent. Set ops->done before submitting. */
struct gs_fileops *gs_agent_fileops(struct gs_agent *a);

/* The file (the project's .gpusync/check-kept) that keeps, between sessions, the paths the agent
 * kept for its last check of the server (remote/check_set.h): read now, so that this session's
 * first check starts from what the agent saved, and written when the session ends. */
void gs_agent_set_check_file(struct gs_agent *a, const char *path);

/* Ends the session (closes the agent's stdin; it exits once it has answered what it got) and frees
 * `a` without waiting for that. */
void gs_agent_close(struct gs_agent *a);

/* Progress for downloads: bytes received of `total` (0 when unknown). */
typedef void (*gs_agent_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Downloads remote `path` to local `local`: written to a temporary file beside it, given the
 * remote mode less the setuid, setgid and sticky bits (a server must not plant set-id programs
 * here) and its mtime, then renamed into place, so a failed pull leaves `local` untouched.
 * Returns 0, GS_E_NOTFOUND, GS_E_REMOTE, GS_E_PROTO or GS_E_IO. `got` (if not NULL) says more:
 * changed is 1 when the agent refused the copy because the file changed on the server while it
 * was read (GS_E_REMOTE then: a job writing it; asking again once it is written can succeed), else
 * 0, as an agent older than that check always says (proto/sync.h, GET); writer, after a copy that
 * arrived, names the process that held the file open for writing as it was read ("pid N (name)":
 * the copy is the file as it was then, maybe a part of what is being written), else "". */
struct gs_agent_got {
    int changed;
    char writer[64];
};
int gs_agent_get(struct gs_agent *a, const char *path, const char *local,
                 gs_agent_progress_fn progress, void *ctx, struct gs_agent_got *got,
                 struct gs_error *err);

/* One entry of a remote listing. Strings are valid during the callback only. An entry the agent
 * left out has kind 0 and `skipped` set (only `path` is filled then): ENAMETOOLONG for a path too
 * long to be named in a request, ELOOP for a directory whose contents lie too deep to be walked,
 * or the errno of a directory that could not be opened. Such a path is for reporting only: it
 * may be longer than any request can name. */
struct gs_agent_entry {
    const char *path;
    int kind;    /* 1 file, 2 dir, 3 symlink, 4 other; 0 when skipped */
    int skipped; /* 0, or why the agent left this path out of the listing */
    uint32_t mode;
    int64_t mtime_ns;
    uint64_t size;
    int has_hash;
    uint8_t hash[16];
    const char *link; /* a symlink's target; for kind 4 its type ("fifo", "socket",
                       * "char-device", "block-device", "other"; "" from an older agent) */
};

typedef int (*gs_agent_list_fn)(void *ctx, const struct gs_agent_entry *e);

/* Lists the remote tree under `path` ("" for the root), with content hashes when `hashes`.
 * The callback returns 0 to go on. Returns 0 or a negative code. */
int gs_agent_list(struct gs_agent *a, const char *path, int hashes, gs_agent_list_fn fn, void *ctx,
                  struct gs_error *err);

/* The content hash (XXH3-128) of the remote file `path`. Returns 0, GS_E_NOTFOUND, or an error. */
int gs_agent_hash(struct gs_agent *a, const char *path, uint8_t hash[16], struct gs_error *err);

#endif
