/* syncd/plan.h: from a scan of the local tree and the index (what the server holds because gpusync
 * wrote it), the operations that make the server match the local tree.
 *
 * - A file whose local stat (size, mtime, inode) equals the one cached in the index is not read:
 *   its hash is the index's. A file whose stat changed is hashed; same content and same mtime as
 *   the index says gpusync set on the server means no operation, and the index's stat cache is
 *   refreshed so it is not hashed again. Same content with another mtime (a `touch`, which `make`
 *   on the server must see) or mode is one CHMOD with `stamp` set: mode and mtime, no bytes. A stat
 * whose mtime is less than GS_PLAN_RACY_NS old is never cached (a second write in the same
 * timestamp tick, same size, would be invisible to it): such a file is hashed again by the next
 * plan.
 * - New content that equals the content of a path that disappeared becomes one RENAME, not a
 *   delete and a put; a directory that disappeared and reappeared elsewhere with all its content
 *   (same relative paths, kinds, hashes and link targets) becomes one RENAME of the directory.
 * - Only paths in the index are ever deleted: gpusync never deletes a server path it did not write,
 *   nor (with opts->ignore) one that has become ignored since it was written.
 * - A file `pull` wrote here (index.h, `pulled`) is the server's: unchanged here (a touch
 *   included), nothing is sent;
 *   edited here, it is sent (expecting what was pulled) and becomes gpusync's; deleted here, the
 *   index forgets it and the server keeps its copy. It is never a rename's source.
 *   A directory is deleted only after its children, and the agent removes it only if empty.
 * - Every operation carries what the server must hold before it (`expect`: the agent keeps a
 *   conflict copy when the server differs) and the index entry to record when it succeeds.
 *
 * Order: (0) deletes that clear the way for a change of kind involving a directory (a file became
 * a directory or the reverse), children first; (1) mkdirs that a rename's destination needs,
 * parents first; (2) renames; (3) the other mkdirs, parents first; (4) puts; (5) symlinks;
 * (6) chmods; (7) deletes, children first. Phases 0 and 1 are empty in the common case; they exist
 * because a rename into a new directory, or a directory replacing a file, cannot happen before
 * them. Within a phase, paths are in byte order (reversed for deletes). Renames never chain: a
 * rename's source is a path that no longer exists locally and its destination one the index does
 * not hold. */
#ifndef GS_SYNCD_PLAN_H
#define GS_SYNCD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/error.h"
#include "syncd/index.h"
#include "syncd/scan.h"

/* How recent a local mtime is too recent to trust a stat cache with: covers coarse kernel clocks
 * (1-10 ms) and filesystems with 1-2 s timestamps. */
#define GS_PLAN_RACY_NS (2LL * 1000000000LL)

enum gs_op_type {
    GS_OP_RENAME,
    GS_OP_MKDIR,
    GS_OP_PUT,
    GS_OP_SYMLINK,
    GS_OP_CHMOD,
    GS_OP_DELETE, /* one path; a directory only after its children, as rmdir: the server may
                     hold files gpusync did not write there, and then the directory stays (the
                     executor reports it kept and drops it from the index) */
};

/* What the server must hold at a path before an operation may change it. */
enum gs_expect_kind {
    GS_EXPECT_ABSENT,  /* nothing: the path is new (the agent's "must not exist") */
    GS_EXPECT_FILE,    /* a regular file whose content hash is `hash` */
    GS_EXPECT_SYMLINK, /* a symlink whose target is `link` */
    GS_EXPECT_DIR,     /* a directory */
};

struct gs_plan_expect {
    enum gs_expect_kind kind;
    struct gs_hash hash; /* GS_EXPECT_FILE */
    char *link;          /* GS_EXPECT_SYMLINK; owned by the op */
};

struct gs_plan_op {
    enum gs_op_type type;
    char *path;  /* the path acted on; for RENAME the destination (which must not exist) */
    char *from;  /* RENAME: the source; NULL otherwise */
    int subtree; /* RENAME of a directory, with everything below it */
    /* What the server must hold at `path` (RENAME: at `from`). */
    struct gs_plan_expect expect;
    /* On success, the index entry for `path` (gs_plan_record applies it). For PUT it also says
     * what to send: the local file `path` under the root, record.size bytes, record.mode,
     * record.mtime_ns, whose content hash is record.hash; for SYMLINK, record.link. Unused for
     * DELETE. */
    struct gs_index_entry record;
    int phase; /* 0..7, see the order above */
    /* CHMOD of a file: also set record.mtime_ns, and only where the server holds the content
     * `expect` names (the agent answers ESTALE otherwise: then send the whole file). */
    int stamp;
};

struct gs_plan_unreadable {
    char *path;
    char *why;     /* the error, naming the path */
    uint64_t size; /* as scanned */
    int err_no;    /* EACCES, EIO, ...; ENAMETOOLONG: a path too long to open (scan.h too_long) */
};

struct gs_plan {
    struct gs_plan_op *ops;
    size_t n_ops;
    size_t cap;
    size_t n_hashed;        /* files read to compute a hash */
    size_t n_refreshed;     /* stat changed, content, mode and mtime not: cache refreshed, no op */
    uint64_t bytes_to_send; /* sum of the sizes of PUT operations */
    /* Files that could not be read here (permission, an I/O error, a path too long to open): no
     * operation touches them (nor, for a path too long, anything below it), so the server keeps
     * what it holds, and the index too. A caller reports them as failed: one unreadable file does
     * not hold back the rest of the tree. */
    struct gs_plan_unreadable *unreadable;
    size_t n_unreadable;
};

/* How far a plan has read (hashed) the files it must read. */
struct gs_plan_reading {
    uint64_t files_done, files_total;
    uint64_t bytes_done, bytes_total;
};
typedef int (*gs_plan_reading_fn)(void *ctx, const struct gs_plan_reading *r);

struct gs_plan_opts {
    /* Restrict the plan to these paths and what lies below them (`gpusync push PATH...`):
     * relative to the root, normalised (no "./", no trailing '/'; "" is the whole tree). NULL/0:
     * the whole tree. Missing parent directories of these paths are created. The scan may then
     * cover only these subtrees and their parent directories. */
    const char *const *paths;
    size_t n_paths;
    /* Do not write the refreshed stat cache to the index (a read-only caller). */
    int no_refresh;
    /* When set, an index path that is now ignored (a user added it to .gitignore or [sync]
     * exclude after it was synced) is left alone: not deleted, not a rename source. The server
     * copy stays, and the index keeps its entry. NULL: every index path missing from the scan is
     * deleted. */
    struct gs_ignore *ignore;
    /* Told how far the plan has read the files it must hash (those whose stat differs from the
     * index's cache), every few files and about every 4 MB of a large one: nonzero ends the plan
     * with GS_E_INTERRUPTED. NULL: not told, and the plan always completes. */
    gs_plan_reading_fn reading;
    void *reading_ctx;
};

/* An empty value. (Unformatted: clang-format spreads a braced macro over four lines.) */
/* clang-format off */
#define GS_PLAN_INIT {0}
/* clang-format on */

/* Builds into `plan` (empty: GS_PLAN_INIT) the operations that take the server from what `idx`
 * records to what `scan` lists of the tree at `root`. Reads files whose stat differs from the
 * index's cache; writes to the index only stat-cache refreshes and the removal of pulled files
 * deleted here (neither with opts->no_refresh).
 * `opts` may be NULL. A file that vanished since the scan counts as deleted; one that cannot be
 * read is listed in plan->unreadable. Returns 0, or GS_E_IO (an index error) with `plan`
 * released. */
int gs_plan_build(struct gs_plan *plan, const char *root, const struct gs_scan *scan,
                  struct gs_index *idx, const struct gs_plan_opts *opts, struct gs_error *err);

/* Removes (and frees) the operations for which `drop` returns 1, keeping the others in order, and
 * updates bytes_to_send. Only for operations nothing else depends on: a put, a delete of a file, a
 * rename (whose paths the caller then plans again), never a mkdir a later operation needs. */
void gs_plan_remove_if(struct gs_plan *plan, int (*drop)(void *ctx, const struct gs_plan_op *op),
                       void *ctx);

/* Frees all operations; the plan is empty and reusable. */
void gs_plan_release(struct gs_plan *plan);

/* Records in the index that `op` completed on the server: RENAME moves the index subtree and puts
 * op->record, DELETE removes the entry, the others put op->record. The executor calls this as each
 * reply arrives. Returns 0 or an index error. */
int gs_plan_record(struct gs_index *idx, const struct gs_plan_op *op, struct gs_error *err);

/* Appends a one-line, human-readable form of `op` (no newline) to `out`, for --dry-run:
 * "put      src/a.py (1234 bytes, new)". Paths with control characters, quotes, backslashes or
 * invalid UTF-8 are quoted with C escapes, so each op stays on one line. */
void gs_plan_op_format(const struct gs_plan_op *op, struct gs_buf *out);

/* Static name of an operation type ("rename", "mkdir", ...). */
const char *gs_plan_op_name(enum gs_op_type type);

/* Appends `path` to `out` as gs_plan_op_format does: gs_quote_path's form (common/quote.h), and
 * quoted also when it is empty or holds a space. */
void gs_plan_quote_path(struct gs_buf *out, const char *path);

#endif
