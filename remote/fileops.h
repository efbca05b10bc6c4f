/* remote/fileops.h: remote file operations as the sync engine sees them, independent of transport.
 *
 * The engine submits operations and learns of each completion through a callback; the agent
 * transport (remote/agent_client.c) pipelines them over one exec channel, the SFTP fallback
 * (remote/sftp_ops.c) runs them one by one. Completion callbacks run from inside submit or drain,
 * in submission order. */
#ifndef GS_FILEOPS_H
#define GS_FILEOPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

enum gs_fop_type {
    GS_FOP_PUT,     /* path <- contents of local_file, mode, mtime */
    GS_FOP_MKDIR,   /* mkdir -p path, mode */
    GS_FOP_DELETE,  /* file, symlink or empty dir (recursive: a tree) */
    GS_FOP_RENAME,  /* path -> path2 */
    GS_FOP_SYMLINK, /* path -> target path2 */
    GS_FOP_CHMOD,   /* path, mode; with `stamp`, mtime too (see there) */
};

enum gs_fop_expect {
    GS_FOP_EXPECT_FORCE,  /* replace whatever is there */
    GS_FOP_EXPECT_ABSENT, /* nothing should be there */
    GS_FOP_EXPECT_HASH,   /* a file (or symlink) with `hash` should be there */
    GS_FOP_EXPECT_DIR,    /* a directory should be there: anything else is kept, not removed */
};

struct gs_fop_req {
    enum gs_fop_type type;
    const char *path;       /* relative to the remote project root */
    const char *path2;      /* RENAME destination, SYMLINK target */
    const char *local_file; /* PUT: absolute local path to read */
    uint64_t size;          /* PUT: bytes expected (the file may change; what is read is sent) */
    uint32_t mode;
    int64_t mtime_ns;
    int recursive;                  /* DELETE */
    enum gs_fop_expect expect;      /* about path (RENAME: about path2) */
    uint8_t hash[16];               /* GS_FOP_EXPECT_HASH: what the server should hold (XXH3-128) */
    enum gs_fop_expect from_expect; /* RENAME: what the server should hold at the source */
    uint8_t from_hash[16];
    uint8_t content_hash[16]; /* PUT: hash of the content to send; the server refuses to commit
                               * other bytes (the file changed after it was hashed) */
    int stamp; /* CHMOD of a file: set mode and mtime_ns only where the server holds `hash`
                * (size bytes, expect GS_FOP_EXPECT_HASH); else fail with ESTALE, nothing set */
    void *ctx; /* handed back in the completion */
};

struct gs_fop_result {
    int ok;
    int noop;            /* nothing needed doing */
    int err_no;          /* errno from the server when !ok (ENOSPC, EPERM, ...) */
    const char *message; /* when !ok; valid during the callback only */
    const char *kept;    /* a conflict copy the server kept, or NULL; valid during the callback */
    int moved_aside;     /* RENAME not done: its source was edited on the server and is kept as
                          * `kept`; the destination must be sent afresh */
    int local;           /* !ok here, not on the server: the file could not be read */
};

typedef void (*gs_fop_done_fn)(void *cb_ctx, void *req_ctx, const struct gs_fop_result *r);

/* What the server holds at one path, as probe reports it. */
enum gs_fop_kind {
    GS_FOP_KIND_UNKNOWN = -1, /* could not be told (refused path, permission): assume nothing */
    GS_FOP_KIND_NONE = 0,     /* nothing there */
    GS_FOP_KIND_FILE = 1,
    GS_FOP_KIND_DIR = 2,
    GS_FOP_KIND_SYMLINK = 3,
    GS_FOP_KIND_OTHER = 4,
};

struct gs_fop_stat {
    enum gs_fop_kind kind;
    uint32_t mode; /* permission bits */
    uint64_t size;
    int64_t mtime_ns; /* the server's mtime (agent transport) */
    int has_hash;     /* files: XXH3-128 of the content; symlinks: of the target string */
    uint8_t hash[16]; /* canonical bytes, as the index keeps them */
};

/* What the client believes the server holds at one path (the index's record), for check. */
struct gs_fop_belief {
    const char *path; /* in ascending order (as unsigned bytes), each once */
    enum gs_fop_kind kind;
    uint32_t mode;
    uint64_t size;
    int64_t mtime_ns;
    const char *link; /* a symlink's target; NULL otherwise */
};

struct gs_fileops {
    /* Queues one operation; may run completions of earlier ones. Returns 0, or a negative code
     * when the transport failed (then no further completions come). */
    int (*submit)(struct gs_fileops *ops, const struct gs_fop_req *req, struct gs_error *err);
    /* Waits until every submitted operation has completed. Returns 0 or a transport error. */
    int (*drain)(struct gs_fileops *ops, struct gs_error *err);
    /* Reports in out[i] what the server holds at paths[i] (content hashed), for the n paths.
     * Waits for earlier operations first. Returns 0 (a path that cannot be examined is
     * GS_FOP_KIND_UNKNOWN) or a transport error. */
    int (*probe)(struct gs_fileops *ops, const char *const *paths, size_t n,
                 struct gs_fop_stat *out, struct gs_error *err);
    /* Asks how what the server holds compares with what beliefs[0..n) say, without reading any
     * file (as rsync's quick check: kind; a file's size and mtime to the second; a symlink's
     * target; otherwise the mode): cheap enough for every path gpusync wrote, often
     * (syncd/verify.h). The server answers as it stands after the operations submitted before,
     * and before those submitted after, which go on meanwhile. check_wait waits for the answer
     * and fills out[0..n): what the server holds where it differs (a symlink's target hashed, as
     * probe does), GS_FOP_KIND_UNKNOWN where nothing differs or nothing could be told. One check
     * at a time (a check sent while another is under way drops the earlier answer). The agent
     * keeps the beliefs for the connection, so a later check sends only their changes. Both
     * return 0 or a transport error. NULL where the transport cannot (SFTP: a round trip a path).
     */
    int (*check_send)(struct gs_fileops *ops, const struct gs_fop_belief *beliefs, size_t n,
                      struct gs_error *err);
    int (*check_wait)(struct gs_fileops *ops, struct gs_fop_stat *out, struct gs_error *err);
    /* Ends the session and frees `ops`. */
    void (*close)(struct gs_fileops *ops);
    gs_fop_done_fn done;
    void *done_ctx;
    /* Progress: bytes of file content handed to the transport so far. */
    uint64_t bytes_sent;
    /* Of those, about how many still wait in the transport's buffers (megabytes on a slow link:
     * a whole file can be handed over long before it has gone). */
    uint64_t bytes_unsent;
    /* Called, when set, as a file's bytes are handed over and as they go out, so that a large
     * file shows progress long before its reply. */
    void (*progress)(void *progress_ctx);
    void *progress_ctx;
};

#endif
