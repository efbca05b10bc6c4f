/* proto/sync.h: the sync protocol, the one definition shared by the agent (agent/) and the
 * client (remote/). Pure encode/decode, no I/O, no globals, so the client can run it over a
 * libssh2 channel and the tests over pipes. C99.
 *
 * FRAMES. Every message is one frame, all integers big-endian:
 *
 *     u32 length | u8 type | u32 id | payload
 *
 * `length` counts the bytes that FOLLOW the length field: 1 (type) + 4 (id) + payload bytes.
 * So a frame occupies 4 + length bytes on the wire, and 5 <= length <= GS_PROTO_MAX_FRAME.
 * A length outside that range is a fatal protocol error (the agent replies ERROR EMSGSIZE with
 * the frame's id and exits with status 2: the stream cannot be resynchronised).
 *
 * FIELD ENCODINGS used in the payload layouts below:
 *   u8/u32/u64   unsigned, big-endian          i32/i64   two's complement, big-endian
 *   str          u32 byte count, then the bytes (no NUL terminator; any byte allowed by the codec,
 *                the agent refuses NUL in paths)
 *   hash         16 bytes: XXH3-128 of the content in canonical (big-endian) form, as written
 *                by XXH128_canonicalFromHash. For a symlink, the hash of its target string.
 *   expect       u8 kind (GS_EXPECT_*), then 16 hash bytes only when kind == GS_EXPECT_HASH
 *                (v3: a first sync of small files no longer carries 16 zero bytes per file)
 *   meta         u32 mode (permission bits, & 07777) | i64 mtime_sec | u32 mtime_nsec
 *                (the agent applies a requested mode without setuid and setgid: they are never
 *                mirrored, since an agent running as root would create root set-id programs)
 * A payload must be consumed exactly: trailing bytes make the frame malformed (ERROR EBADMSG).
 *
 * SESSION. The client sends HELLO first; the agent answers HELLO_OK (or ERROR and exits, e.g.
 * EPROTONOSUPPORT on a version mismatch). Then requests are pipelined: the client need not wait
 * for replies; the agent executes requests in arrival order and answers each with frames that
 * carry the request's id. The client must read replies while it writes requests (the agent
 * blocks writing replies when the pipe is full). End the session by closing the agent's stdin.
 *
 * ONE WRITER (v4). Before it answers HELLO, a `serve` agent takes an exclusive POSIX record lock
 * on <root>/.gpusync/writer.lock. If an earlier session still holds it (its link stalled, its
 * process stopped), the new agent checks in /proc that the holder is a `gpusync-agent ... serve`
 * process, kills it (SIGKILL) and waits (at most 10 s) until the kernel releases the lock, which
 * happens only after that process has exited: nothing the old session still held (requests in
 * its buffers, in the pipe from sshd, in TCP) can reach the tree afterwards. A holder that cannot
 * be verified (not an agent, another host, another user) is never killed: the answer is ERROR
 * EBUSY naming the pid and root, and the agent exits with status 2. So a client of version 4
 * knows that a session that answered HELLO_OK is the only writer of its root until it ends
 * (unless no lock can exist there at all: a symlink as .gpusync, a read-only root, a file system
 * without locks; then the agent serves unfenced, as before v4, and says so on stderr). The
 * `launch`, `tail`, `ps` and `stop` commands take no lock. Clients on one machine must not run
 * two sessions on one root at once, or they fence each other out (gpusync serialises its own
 * sessions with a local lock, syncd/session.h).
 *
 * PATHS are relative to the agent's root: no leading '/', no empty, "." or ".." components, no
 * NUL, components <= 255 bytes, whole path <= GS_PROTO_MAX_PATH. A path that fails these rules,
 * or whose parent components are not real directories (a symlink is never followed), is refused
 * with ERROR EPERM (escape), ENAMETOOLONG or ELOOP. Only LIST accepts the empty path (the root).
 * The final component is never followed either: ops on a symlink act on the link itself.
 *
 * EXPECTATIONS (put, put-begin, delete, rename's destination, symlink): the client states what it
 * believes is at the target. If something else is there, the agent first renames it to
 * `NAME.gpusync-conflict-YYYYmmdd-HHMMSS` (`-N` added if taken; NAME shortened if the result
 * would exceed 255 bytes) in the same directory and reports that path in DONE.kept. A put or
 * symlink whose new content equals what is already there is never a conflict (idempotent resume).
 * A target that is missing while the client expected a hash is not a conflict (nothing to keep).
 * GS_EXPECT_DIR (v5) says a directory should be there: anything else (a file or symlink that
 * replaced the directory on the server) is kept as a conflict copy, never removed.
 *
 * WRITES. PUT, streamed puts and SYMLINK write `.gpusync-tmp-<pid>-<n>` in the target's
 * directory (missing parents are created), set mode and mtime (ns), optionally fsync, then
 * rename(2) over the target. On any failure (ENOSPC included) the temporary file is removed and
 * the target is left as it was; the session goes on. The writer lock file holds the writing
 * agent's pid and is emptied when a session ends at end of input, so a non-empty file at
 * acquisition means the previous writer died (killed, crashed, fenced out): then, before
 * answering HELLO, the new agent removes every `.gpusync-tmp-<digits>-<digits>` under the root
 * (except in .gpusync/runs) whose pid is not its own. That is safe because every agent that
 * writes temporaries holds the lock. Other names (the SFTP fallback's `.gpusync-tmp-<pid>`) are
 * left alone.
 *
 * ERRORS (ERROR.errno). Fatal, the agent exits with status 2 after replying: EPROTO (first
 * frame not a HELLO), EPROTONOSUPPORT (version mismatch), EMSGSIZE (length out of range).
 * Per request, the session goes on: EPERM (path refused, or the file system's own EPERM, whose
 * text is strerror's), ELOOP (symlink in the path or as the target of GET/CHMOD), ENAMETOOLONG,
 * ENOSYS (unknown type), EBADMSG (malformed payload, or a PUT_END hash mismatch), EBADF
 * (PUT_DATA/PUT_END with no open stream), EBUSY (stream id in use), EMFILE (more than
 * GS_PROTO_MAX_STREAMS streams), and any errno of the file operation itself (ENOSPC, EACCES,
 * ENOTEMPTY, EISDIR, ...), and EAGAIN (GET: the file changed while it was read). Truncated input
 * at EOF: exit status 2.
 * A root removed under a session (its folder has no link left), or moved (its path now names
 * another folder, or none), is not what the client means to write: the agent then replies ERROR
 * ENOENT with id 0, saying so, and exits with status 3; the client connects again, which makes
 * the root anew or opens the folder now at its path.
 *
 * COMPRESSION (v6). A client that can read zstd says so in HELLO (GS_HELLO_ZSTD); an agent built
 * with libzstd answers with the same flag in HELLO_OK and from then on may send ZFRAMES_R, and
 * accepts ZFRAMES. A ZFRAMES frame carries other frames, whole and in order, compressed as the
 * next flushed blocks of the sender's one zstd stream for the session: the receiver decompresses
 * every ZFRAMES in order with one stream context, and handles what each holds exactly as if those
 * frames had arrived one by one (a ZFRAMES inside one is malformed; one that does not decompress
 * to exactly raw_size bytes ends the session). A sender compresses what it has
 * queued when that is worth it and sends the frames plain when not, frame by frame, so
 * incompressible data (checkpoints, archives) costs only the try (proto/zframes.h). An agent
 * without libzstd never sets the flag, and both sides then speak exactly v5's frames.
 *
 * DELTA (v7). A client that keeps librsync signatures says so in HELLO (GS_HELLO_DELTA); an agent
 * built with librsync answers with the same flag, and then accepts PUT_DELTA: a file rebuilt on
 * the server from the copy it holds (the basis, named by the expect hash) and an rdiff delta. The
 * agent checks the basis's hash before it reads a byte of the delta; if the server holds anything
 * else (edited there, missing, not a file) it changes nothing and answers ERROR ESTALE, and the
 * client then sends the whole file as a PUT with the same expect, whose conflict check keeps the
 * server's copy (so a conflict costs one extra round trip, and the common case none). The result
 * is written to a temporary file, its hash checked against the one the request carries (EBADMSG
 * and the target untouched when it differs), and renamed into place like every other write. One
 * frame carries the whole delta: the client sends a full put instead when the delta would pass
 * GS_PROTO_DELTA_MAX (such a change is a large part of the file; then the delta saves little).
 *
 * RESIDENT LISTENER (v8). Starting `serve` through an exec costs the server's login shell and its
 * rc files (conda or pyenv init: 0.1-0.3 s) on every session. A client that sets
 * GS_HELLO_RESIDENT asks the agent to keep `gpusync-agent listen` running for it: a detached
 * process of the same build, listening on the UNIX socket ~/.gpusync/run/HOST-<agent name>.sock
 * (the directory 0700, so only this user, or root, can connect, or could have made the socket). The
 * agent starts one if none runs and answers with the socket's absolute path in HELLO_OK ("" when
 * it cannot). A later session of the same client opens a "direct-streamlocal@openssh.com"
 * channel to that path and sends OPEN, naming the root, then HELLO as usual: the listener forks
 * and execs `serve --root ROOT` on the connection, with no shell. A listener that gets no OPEN
 * within 10 s, or a malformed one, closes the connection; one nobody used for 12 h exits, as does
 * one whose socket was removed or replaced. The client falls back to the exec whenever the channel
 * is refused (no listener, forwarding disabled on the server) or the connection ends before
 * HELLO_OK. HELLO_OK's GS_HELLO_RESIDENT says the listener was running before that session (not
 * started by it): a client whose channel to it was just refused learns that the server forbids
 * such channels, and stops asking for a while.
 *
 * CHECK (v9). gpusync records what it wrote; files deleted or edited on the server by anyone else
 * must not stay "up to date". CHECK carries what the client believes the server holds at many
 * paths (kind, size, mtime, mode, symlink target: rsync's quick check) and the agent answers with
 * only the paths where it holds something else, so checking a tree of 20,000 files costs one frame
 * each way instead of a STAT each. With GS_CHECK_KEEP the agent keeps the entries for the rest of
 * the session, and a later CHECK need carry only the entries that changed since (kind NONE: the
 * path is no longer the client's): a session that checks often (the watch daemon, before each
 * answer it gives) sends its list once. And since every push is a session of its own, a session
 * that kept a set saves it when it ends (<root>/GS_PROTO_CHECK_SAVED, replacing the last one;
 * the digest of the set names it), and the next session may start from it (GS_CHECK_SAVED)
 * instead of sending it again: a push of a tree of 20,000 files sends a few changes, not 1 MB.
 *
 * MTIMES (v10). Every write (PUT, streamed puts, PUT_DELTA) gives the file the client's mtime,
 * to the nanosecond where the server's file system keeps it. A file whose content is unchanged
 * but whose mtime is not (a `touch`, which `make` on the server must see) costs one CHMOD that
 * carries the mtime and the content hash, never the bytes (CHMOD below).
 *
 * BATCHING. The agent flushes its replies whenever no more input is ready (and, during a
 * continuous burst, at least every 5 ms and whenever 1 MiB is buffered), so a lone request is
 * answered at once and a burst is answered in few writes.
 */
#ifndef GS_PROTO_SYNC_H
#define GS_PROTO_SYNC_H

#include <stddef.h>
#include <stdint.h>

#define GS_PROTO_VERSION                                                                           \
    10 /* v10: CHMOD with mtime and hash; v9: CHECK; v8: the resident listener (OPEN,              \
        * GS_HELLO_RESIDENT); v7: PUT_DELTA; v6: zstd ZFRAMES; v5: GS_EXPECT_DIR, LIST_SKIPPED;    \
        * v4: writer lock */
#define GS_PROTO_MAGIC        0x4753594eu /* "GSYN" */
#define GS_PROTO_HDR          9           /* u32 length + u8 type + u32 id */
#define GS_PROTO_MAX_FRAME    (4u << 20)  /* maximum value of the length field */
#define GS_PROTO_MAX_PAYLOAD  (GS_PROTO_MAX_FRAME - 5u)
#define GS_PROTO_MAX_PATH     4096u
#define GS_PROTO_LIST_DEPTH   256u       /* LIST walks directories down to this depth */
#define GS_PROTO_CHUNK        (1u << 20) /* data bytes per PUT_DATA / GET_DATA frame (advice) */
#define GS_PROTO_PUT_INLINE   (1u << 20) /* files up to this size fit a single PUT (advice) */
#define GS_PROTO_MAX_STREAMS  16         /* put streams (PUT_BEGIN..PUT_END) open at once */
#define GS_PROTO_ZRAW_MAX     (8u << 20) /* the most frame bytes one ZFRAMES may carry */
#define GS_PROTO_HASH_LEN     16
#define GS_PROTO_DELTA_MAX    (3u << 20)      /* the largest delta a PUT_DELTA carries (advice) */
#define GS_PROTO_SIZE_UNKNOWN UINT64_MAX      /* PUT_BEGIN size when not known in advance */
#define GS_PROTO_TMP_PREFIX   ".gpusync-tmp-" /* scanners must ignore these names */
#define GS_PROTO_CONFLICT_TAG ".gpusync-conflict-" /* NAME + tag + YYYYmmdd-HHMMSS[-N] */
#define GS_PROTO_CHECK_KEEP_MAX                                                                    \
    (256u << 10) /* entries an agent keeps for CHECK (GS_CHECK_KEEP)                               \
                  */

/* Message types. 0x01-0x7f travel client -> agent, 0x80-0xff agent -> client.
 *   0x01-0x0f handshake        0x10-0x3f file requests      0x40-0x5f reserved: launch/tail
 *   0x81-0x8f handshake/generic replies                     0x90-0x9f data replies */
enum gs_msg_type {
    /* HELLO: u32 magic | u32 version | u32 flags (GS_HELLO_*) */
    GS_MSG_HELLO = 0x01,
    /* OPEN (v8, only to the resident listener, before HELLO): str root (an absolute path, as a
     * HELLO_OK named it). Never answered: the listener starts `serve` on it, or closes. */
    GS_MSG_OPEN = 0x02,
    /* ZFRAMES (v6, only after HELLO_OK said GS_HELLO_ZSTD): u32 raw_size | the next blocks of
     * the sender's zstd stream, which decompress to exactly raw_size bytes (<= GS_PROTO_ZRAW_MAX)
     * of whole request frames (COMPRESSION above). Its own id is 0 and never answered. */
    GS_MSG_ZFRAMES = 0x0e,

    /* PUT: str path | meta | expect | str data. Whole file in one frame. Reply DONE. */
    GS_MSG_PUT = 0x10,
    /* PUT_BEGIN: str path | meta | expect | u64 size. Opens a stream keyed by id. Unless size
     * is GS_PROTO_SIZE_UNKNOWN, PUT_END fails with EBADMSG if another count of bytes arrived. */
    GS_MSG_PUT_BEGIN = 0x11,
    /* PUT_DATA: the payload is raw file bytes, appended to the stream with this id. */
    GS_MSG_PUT_DATA = 0x12,
    /* PUT_END: u8 flags (GS_PUTEND_VERIFY) | hash. Commits the stream (a VERIFY hash that
     * differs from the bytes received: ERROR EBADMSG, target untouched). Exactly one reply per
     * stream (DONE, or ERROR at the first failure; after a failure the stream's later DATA/END
     * frames are dropped silently). DATA/END for an id with no open stream: ERROR EBADF. */
    GS_MSG_PUT_END = 0x13,
    /* PUT_DELTA (v7, only after HELLO_OK said GS_HELLO_DELTA): str path | meta | expect (must
     * be GS_EXPECT_HASH: the basis) | hash (of the result) | str delta (librsync's format).
     * Reply DONE, or ERROR ESTALE (the basis is not there: nothing changed; send a PUT),
     * EBADMSG (a delta that does not apply, or a result with another hash: target untouched),
     * ENOSYS (an agent without librsync). See DELTA above. */
    GS_MSG_PUT_DELTA = 0x1d,
    /* MKDIR: str path | u32 mode. mkdir -p; mode applied to the last component. DONE
     * (flags NOOP if it already was a directory), ERROR ENOTDIR/EEXIST if a non-directory. */
    GS_MSG_MKDIR = 0x14,
    /* DELETE: str path | u32 flags (GS_DEL_*) | expect. Removes a file, symlink or empty dir
     * (GS_DEL_RECURSIVE: a whole directory tree; only for trees the client wrote). A missing
     * target is DONE with NOOP. A non-matching target is renamed to its conflict name instead
     * (DONE with KEPT). For directories send GS_EXPECT_DIR (a directory has no hash). */
    GS_MSG_DELETE = 0x15,
    /* RENAME: str from | str to | expect (about `to`). Missing `from`: ERROR ENOENT (after a
     * crash, STAT `to` to learn whether the rename already happened). */
    GS_MSG_RENAME = 0x16,
    /* SYMLINK: str path | str target | expect. The link is created atomically (temp + rename);
     * the target string is stored verbatim and never followed by the agent. */
    GS_MSG_SYMLINK = 0x17,
    /* CHMOD: str path | u32 mode. Refused (ELOOP) on a symlink.
     * v10, for a file whose content did not change but whose mtime or mode did (a `touch`):
     * str path | meta | hash, the v9 form with the mtime and the content hash the client
     * believes the server holds after the mode (has_hash set; both forms decode). The agent
     * opens the file, hashes it and, only if it holds that content, sets the mode and the mtime
     * through that descriptor: DONE. Other content, or no regular file there: ERROR ESTALE and
     * nothing changed (the client then sends the whole file, whose expect keeps the server's
     * copy as a conflict copy: stamping it would hide a server-side edit that kept the size
     * and the second). A file the agent cannot read (mode 0200, not root) gets the mode first,
     * then is hashed; still unreadable, its mtime is set unchecked, as a plain chmod would. */
    GS_MSG_CHMOD = 0x18,
    /* STAT: str path. Reply STAT (kind GS_KIND_NONE if missing). */
    GS_MSG_STAT = 0x19,
    /* HASH: str path. Reply HASH; a regular file or a symlink (hash of its target string). */
    GS_MSG_HASH = 0x1a,
    /* GET: str path. Replies GET_DATA* then GET_END, or ERROR (possibly after some GET_DATA:
     * then discard them). Regular files only. The agent reads as many bytes as the file's size
     * at open, then checks that they were one version of it: same inode, size, mtime and ctime
     * as at open (fstat) and still at its name; or, for a file that grew meanwhile (a log), the
     * same inode at its name whose first bytes, read again, hash as those sent. If not (a job
     * wrote, truncated or replaced it meanwhile: a checkpoint being saved), ERROR EAGAIN: ask
     * again once the writer is done. An agent of v9 built before this check answers GET_END over
     * whatever it read, so a client cannot tell such a copy from a good one; the frames are the
     * same, so no version change. */
    GS_MSG_GET = 0x1b,
    /* LIST: str path ("" = root) | u32 flags (GS_LIST_*). Replies LIST_ENTRIES* then LIST_END,
     * or ERROR (entries already sent are then void). Walks without following symlinks; the
     * starting path itself is not listed, unless it is a symlink (its folders real ones): then
     * it is the one entry; `.gpusync-tmp-*` names only with GS_LIST_TMP (a
     * killed agent can leave them: find them this way and DELETE them). An entry whose path
     * would pass GS_PROTO_MAX_PATH (no request could name it) is not listed, and the contents
     * of a directory GS_PROTO_LIST_DEPTH levels down are not walked: each such case is one
     * LIST_SKIPPED frame among the entries (v5), and the listing goes on. */
    GS_MSG_LIST = 0x1c,
    /* CHECK (v9): u32 flags (GS_CHECK_*) | hash (GS_CHECK_SAVED: of the saved set; else zeros) |
     * u32 count | count x entry (as in LIST_ENTRIES; has_hash 0; link "" unless a symlink), paths
     * strictly ascending as unsigned bytes. Each entry is what
     * the client believes the path holds. The agent examines each path (as STAT, never reading a
     * file) and replies LIST_ENTRIES* listing, as the server holds them, those that differ: kind;
     * for a file, size or mtime_sec; for a symlink, the target; otherwise the mode's bits 0777
     * and 01000 (set-id bits are never mirrored). A path that is missing, or whose parent is,
     * is listed with kind NONE; one that cannot be examined (a refused path, EACCES) is not
     * listed. Then LIST_END (u64: the paths examined). Entries out of order: ERROR EBADMSG.
     * GS_CHECK_KEEP: the entries update the set the agent keeps for the session (an entry of
     * kind NONE leaves it), and the whole kept set is examined; GS_CHECK_DEFER with it: only
     * update (for a set that takes several frames), reply LIST_END 0. A kept set that would
     * pass GS_PROTO_CHECK_KEEP_MAX entries: ERROR E2BIG. Any error drops the kept set.
     * GS_CHECK_SAVED with KEEP, in a session's first CHECK: the kept set starts as the one an
     * earlier session saved (CHECK above), if `hash` is its digest; if not (none saved, another
     * client's, a session killed before it saved): ERROR ESTALE, nothing kept, and the client
     * sends the whole set. The digest is the XXH3-128 (canonical bytes) of the set's entries
     * in path order, encoded as in LIST_ENTRIES with mtime_nsec 0, nothing else. */
    GS_MSG_CHECK = 0x1e,

    /* HELLO_OK: u32 magic | u32 version | str agent_version | str root (absolute path) |
     * str sync_id (with GS_HELLO_SYNC_ID: the root's .gpusync/sync-id, created if missing; "" if
     * it could not be; otherwise "") | u32 flags (v6: GS_HELLO_ZSTD when both sides compress) |
     * str resident (v8: with GS_HELLO_RESIDENT, the listener's socket path; otherwise "") */
    GS_MSG_HELLO_OK = 0x81,
    /* ZFRAMES_R: as ZFRAMES, carrying reply frames (only to a client that sent GS_HELLO_ZSTD). */
    GS_MSG_ZFRAMES_R = 0x8e,
    /* DONE: u32 flags (GS_DONE_*) | str kept (conflict copy, relative to root; "" if none) */
    GS_MSG_DONE = 0x82,
    /* ERROR: i32 errno (Linux numbering) | str message (names the op and path) */
    GS_MSG_ERROR = 0x83,
    /* STAT reply: u8 kind | meta | u64 size | str link_target ("" unless a symlink) */
    GS_MSG_STAT_R = 0x90,
    /* HASH reply: u64 size | hash */
    GS_MSG_HASH_R = 0x91,
    /* GET_DATA: raw bytes of the file, in order */
    GS_MSG_GET_DATA = 0x92,
    /* GET_END: u64 size | hash | meta (all describing the bytes sent) [| str writer: when a
     * process held the file open for writing, not appending, as it was read, "pid N (name)":
     * the bytes are the file as it was, maybe a part of what is being written] */
    GS_MSG_GET_END = 0x93,
    /* LIST_ENTRIES: u32 count | count x entry; entry = str path (relative to root) | u8 kind |
     * meta | u64 size | u8 has_hash | hash (only if has_hash) | str link_target. In a LIST's
     * entries, link_target of a GS_KIND_OTHER entry names its type: "fifo", "socket",
     * "char-device", "block-device" or "other" (an older agent sends "" there). */
    GS_MSG_LIST_ENTRIES = 0x94,
    /* LIST_END: u64 number of entries sent */
    GS_MSG_LIST_END = 0x95,
    /* LIST_SKIPPED: i32 errno | str path. What a LIST left out: ENAMETOOLONG, an entry whose
     * path (given whole, so it may pass GS_PROTO_MAX_PATH) is too long to be named in a request;
     * ELOOP, a directory (listed itself) whose contents lie too deep to be walked. */
    GS_MSG_LIST_SKIPPED = 0x96,
};

enum gs_hello_flags {
    GS_HELLO_FSYNC = 1u,    /* fsync files and directories before replying */
    GS_HELLO_SYNC_ID = 2u,  /* answer with the root's sync id (agent/sync_id.h) */
    GS_HELLO_ZSTD = 4u,     /* v6: HELLO: I read ZFRAMES_R; HELLO_OK: so do I, ZFRAMES */
    GS_HELLO_DELTA = 8u,    /* v7: HELLO: I may send PUT_DELTA; HELLO_OK: I apply them */
    GS_HELLO_RESIDENT = 16u /* v8: HELLO: keep a resident listener for me (see above);
                             * HELLO_OK: one was running before this session */
};
/* The longest sync id HELLO_OK carries (without a newline); the client keeps no more. */
#define GS_SYNC_ID_MAX 64
enum gs_putend_flags { GS_PUTEND_VERIFY = 1u }; /* compare the written bytes' hash with `hash` */
enum gs_del_flags { GS_DEL_RECURSIVE = 1u };
enum gs_list_flags { GS_LIST_HASH = 1u, GS_LIST_TMP = 2u }; /* hash files; include temp files */
enum gs_check_flags { GS_CHECK_KEEP = 1u, GS_CHECK_DEFER = 2u, GS_CHECK_SAVED = 4u };
#define GS_PROTO_CHECK_SAVED                                                                       \
    ".gpusync/check-kept" /* the agent's saved set (CHECK), root-relative */
/* nothing to do; conflict kept; a RENAME's source was kept aside instead of renamed */
enum gs_done_flags { GS_DONE_NOOP = 1u, GS_DONE_KEPT = 2u, GS_DONE_MOVED_ASIDE = 4u };

enum gs_expect_kind {
    GS_EXPECT_FORCE = 0,  /* replace whatever is there */
    GS_EXPECT_ABSENT = 1, /* nothing should be there */
    GS_EXPECT_HASH = 2,   /* a file (or symlink) with this hash should be there */
    GS_EXPECT_DIR = 3,    /* a directory should be there (v5) */
};

enum gs_kind {
    GS_KIND_NONE = 0,
    GS_KIND_FILE = 1,
    GS_KIND_DIR = 2,
    GS_KIND_SYMLINK = 3,
    GS_KIND_OTHER = 4,
};

/* A borrowed byte string: points into a frame or into caller memory; never NUL-terminated. */
struct gs_proto_str {
    const char *p;
    uint32_t len;
};

struct gs_proto_meta {
    uint32_t mode;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
};

struct gs_proto_expect {
    uint8_t kind;
    uint8_t hash[GS_PROTO_HASH_LEN];
};

/* One parsed frame; `payload` points into the caller's input buffer. */
struct gs_proto_frame {
    uint8_t type;
    uint32_t id;
    const uint8_t *payload;
    uint32_t len;
};

/* Every message, decoded or to encode. Which fields a type uses is listed in enum gs_msg_type;
 * the rest are ignored by the encoder and zeroed by the decoder. Strings are borrowed. */
struct gs_proto_msg {
    uint8_t type;
    uint32_t id;
    uint32_t magic, version, flags; /* HELLO, HELLO_OK; flags also PUT_END/DELETE/LIST/DONE */
    struct gs_proto_str path;       /* also RENAME.from, LIST_SKIPPED */
    struct gs_proto_str path2;      /* RENAME.to, SYMLINK target, STAT/LIST link target,
                                     * HELLO_OK root, DONE kept */
    struct gs_proto_str text;       /* HELLO_OK agent version, ERROR message, GET_END writer */
    struct gs_proto_str data;       /* PUT, PUT_DATA, GET_DATA bytes; ZFRAMES compressed bytes;
                                     * PUT_DELTA's delta; HELLO_OK resident socket; OPEN root */
    struct gs_proto_meta meta;
    struct gs_proto_expect expect;
    struct gs_proto_expect expect2; /* RENAME: about `from` */
    uint8_t kind;
    uint8_t has_hash; /* set by the decoder for PUT_END/PUT_DELTA/HASH_R/GET_END; LIST entries;
                       * CHMOD (v10): set to encode and when decoded with mtime and hash */
    uint8_t hash[GS_PROTO_HASH_LEN];
    uint64_t size;  /* PUT_BEGIN, STAT_R, HASH_R, GET_END; LIST_END count; ZFRAMES raw size */
    int32_t err;    /* ERROR, LIST_SKIPPED */
    uint32_t count; /* LIST_ENTRIES, CHECK: number of entries (decode with gs_proto_list_next) */
    struct gs_proto_str entries; /* LIST_ENTRIES, CHECK: the packed entries */
};

/* One LIST entry (encode with gs_proto_list_add, decode with gs_proto_list_next). */
struct gs_proto_entry {
    struct gs_proto_str path;
    uint8_t kind;
    struct gs_proto_meta meta;
    uint64_t size;
    uint8_t has_hash;
    uint8_t hash[GS_PROTO_HASH_LEN];
    struct gs_proto_str link;
};

#define GS_PROTO_NAME_MAX 255

/* Checks a path against the PATHS rules above: relative, no empty/"."/".." components, no NUL,
 * components <= GS_PROTO_NAME_MAX bytes, at most GS_PROTO_MAX_PATH bytes; "" only if
 * allow_empty. Both sides apply it: the agent to every request, the client to every path a
 * listing names (a hostile server must not steer a pull outside its target). Returns 0, -EPERM
 * (escape or bad form) or -ENAMETOOLONG. */
int gs_proto_check_path(const char *p, size_t len, int allow_empty);

/* A growable output buffer. gs_proto_buf_init zeroes it; gs_proto_buf_release frees the bytes.
 * Encoders append whole frames; on failure (ENOMEM, or a frame over GS_PROTO_MAX_FRAME) they
 * return -1 and leave `len` as it was before the call. The buffer owns `data`. */
struct gs_proto_buf {
    uint8_t *data;
    size_t len, cap;
};

void gs_proto_buf_init(struct gs_proto_buf *b);
void gs_proto_buf_release(struct gs_proto_buf *b);
/* Drops the first n bytes (after they were written out). */
void gs_proto_buf_consume(struct gs_proto_buf *b, size_t n);
/* Makes room for n more bytes; returns 0, or -1 on ENOMEM. */
int gs_proto_buf_reserve(struct gs_proto_buf *b, size_t n);

/* Appends one frame for `m` (type and id taken from m). Returns 0 or -1 (unknown type, frame
 * too large, ENOMEM); on failure nothing is appended. */
int gs_proto_encode(struct gs_proto_buf *b, const struct gs_proto_msg *m);

/* Appends the 9-byte header of a frame whose payload of `payload_len` bytes the caller appends
 * itself (for data frames written straight from a file). Returns 0 or -1. */
int gs_proto_encode_header(struct gs_proto_buf *b, uint8_t type, uint32_t id, uint32_t payload_len);

/* LIST_ENTRIES (or CHECK) building: gs_proto_list_begin appends a frame header and count 0 (for
 * CHECK, `flags` before it) and returns its offset in *mark; gs_proto_list_add appends one entry
 * and bumps the count, returning -1 (nothing appended) if the frame would pass `limit` payload
 * bytes (<= GS_PROTO_MAX_PAYLOAD); gs_proto_list_end patches the frame length. */
int gs_proto_list_begin(struct gs_proto_buf *b, uint8_t type, uint32_t id, uint32_t flags,
                        size_t *mark);
int gs_proto_list_add(struct gs_proto_buf *b, size_t mark, size_t limit,
                      const struct gs_proto_entry *e);
void gs_proto_list_end(struct gs_proto_buf *b, size_t mark);

/* Appends one entry's bytes, as a LIST_ENTRIES frame holds them, with no frame around them (for a
 * file of entries; read it back with gs_proto_list_next over a message whose `entries` are those
 * bytes). Returns 0, or -1 (ENOMEM; nothing appended). */
int gs_proto_entry_append(struct gs_proto_buf *b, const struct gs_proto_entry *e);

/* Finds one frame at the start of p[0..n). Returns the frame's total size (> 0) and fills *f,
 * 0 if more bytes are needed, or -1 if the length field is out of range (fatal: the stream
 * cannot be resynchronised). On -1, f->type and f->id are still filled when the 9 header bytes
 * are present, so the caller can address its error reply. */
long gs_proto_parse_frame(const uint8_t *p, size_t n, struct gs_proto_frame *f);

/* Decodes a frame's payload by its type into *m (strings borrowed from the frame). Returns 0,
 * -1 if the payload is malformed (short, trailing bytes, bad enum value), or -2 if the type is
 * unknown. *m is zeroed first in every case. */
int gs_proto_decode(const struct gs_proto_frame *f, struct gs_proto_msg *m);

/* Iterates LIST_ENTRIES: *pos starts at 0. Returns 1 with *e filled, 0 at the end, -1 if
 * malformed. */
int gs_proto_list_next(const struct gs_proto_msg *m, size_t *pos, struct gs_proto_entry *e);

/* Returns a static name for a message type ("PUT", ...) or "UNKNOWN". */
const char *gs_proto_type_name(uint8_t type);

/* Convenience: a str from a C string (borrowed). */
struct gs_proto_str gs_proto_cstr(const char *s);

#endif
