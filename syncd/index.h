/* syncd/index.h: .gpusync/index.db, the record of what the server holds because gpusync put it
 * there.
 *
 * One SQLite database in WAL mode (synchronous=NORMAL: a power cut may lose the last commits but
 * never corrupts; a killed process loses nothing committed). Per path it keeps what the server
 * holds (kind, mode, size, server mtime, content hash, symlink target) and the LOCAL stat (size,
 * mtime, inode) that produced the hash, so an unchanged file is never hashed again and a touched
 * file with unchanged content is never sent again. Only paths gpusync wrote are ever in the index,
 * which is what lets a plan delete nothing else.
 *
 * The index belongs to one remote identity ("user@host:port:path"): opening it for another remote
 * empties it, since it says nothing true about that server.
 *
 * The executor records each completed remote operation as its reply arrives (put/delete/rename per
 * reply). Every statement is prepared once; a caller with many replies in flight may wrap them in
 * gs_index_begin/gs_index_commit and commit every few tens of milliseconds. Paths and link targets
 * are stored as BLOBs: any bytes but NUL, compared with memcmp (the same order as strcmp).
 *
 * All functions return 0 on success or a negative GS_E_* code with a message in `err`. One
 * gs_index per thread; several processes may open the same file (SQLite locks; a busy database is
 * waited on for up to 5 seconds). */
#ifndef GS_SYNCD_INDEX_H
#define GS_SYNCD_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "syncd/hash.h"
#include "syncd/types.h"

#define GS_INDEX_FILE ".gpusync/index.db"

struct gs_index;

/* One path as the server holds it. */
struct gs_index_entry {
    char *path; /* relative to the project root */
    enum gs_kind kind;
    unsigned mode;    /* permission bits on the server */
    uint64_t size;    /* bytes (files), target length (symlinks), 0 (directories) */
    int64_t mtime_ns; /* mtime gpusync set on the server */
    int has_hash;     /* files: 1, and `hash` is the content's XXH3-128 */
    struct gs_hash hash;
    char *link; /* symlinks: the target; NULL otherwise */
    /* The local stat the hash was computed from; has_local 0 means "unknown, hash again". */
    int has_local;
    uint64_t local_size;
    int64_t local_mtime_ns;
    uint64_t local_ino;
    int64_t local_ctime_ns; /* no one sets it: a rewrite that puts size and mtime back shows here */
    /* 1: `pull` wrote the local copy from the server's, which gpusync did not write: the server's
     * file (a job's output) is left to whoever writes it there. While the local copy is unchanged
     * nothing is sent and the server is not checked against it; a local edit is sent and makes it
     * gpusync's (0); a local delete forgets it. Kept only in the entries, never in intents. */
    int pulled;
};

/* Frees the strings `e` owns and zeroes it. */
void gs_index_entry_release(struct gs_index_entry *e);
/* Deep copy into `dst` (which it overwrites without releasing). */
void gs_index_entry_copy(struct gs_index_entry *dst, const struct gs_index_entry *src);

/* Opens (creating if needed) the database `path` for the remote `remote_id`. If the file was made
 * for another remote, its entries are deleted and it now belongs to `remote_id`. The directory
 * holding `path` must exist. On success *out owns the handle (gs_index_close); on error *out is
 * NULL and GS_E_IO names the file. */
int gs_index_open(struct gs_index **out, const char *path, const char *remote_id,
                  struct gs_error *err);

/* Closes the handle, rolling back an open transaction. NULL is fine. */
void gs_index_close(struct gs_index *idx);

/* The remote identity the index belongs to; lives as long as `idx`. */
const char *gs_index_remote(const struct gs_index *idx);

/* Looks `path` up. Returns 1 and fills `out` (the caller releases it) when present, 0 when absent
 * (`out` zeroed), or an error. */
int gs_index_get(struct gs_index *idx, const char *path, struct gs_index_entry *out,
                 struct gs_error *err);

/* Inserts or replaces the entry for e->path (with its `pulled` mark). */
int gs_index_put(struct gs_index *idx, const struct gs_index_entry *e, struct gs_error *err);

/* Refreshes only the local stat cache of `path` (a touched file whose content did not change);
 * the rest, `pulled` included, stays. Absent path: no change, returns 0. */
int gs_index_set_local(struct gs_index *idx, const char *path, uint64_t size, int64_t mtime_ns,
                       uint64_t ino, int64_t ctime_ns, struct gs_error *err);

/* Removes `path` alone (absent: no change, returns 0). */
int gs_index_delete(struct gs_index *idx, const char *path, struct gs_error *err);

/* Removes `path` and every path below it ("a" removes "a", "a/x", "a/b/y", not "a.txt").
 * GS_E_USAGE for "" (the root). */
int gs_index_delete_subtree(struct gs_index *idx, const char *path, struct gs_error *err);

/* Renames `from` and everything below it to `to`, as rename(2) does on the server: whatever the
 * index held at or below `to` is dropped first. All or nothing. GS_E_USAGE when one path lies
 * inside the other, or one is "". */
int gs_index_rename(struct gs_index *idx, const char *from, const char *to, struct gs_error *err);

/* Calls fn for each entry in path order, or only for `prefix` and the paths below it when prefix
 * is neither NULL nor "". The entry lives until fn returns. A non-zero return from fn stops the
 * walk and is returned. The callback must not write to the index. */
typedef int (*gs_index_fn)(const struct gs_index_entry *e, void *ctx);
int gs_index_foreach(struct gs_index *idx, const char *prefix, gs_index_fn fn, void *ctx,
                     struct gs_error *err);

/* Number of entries. */
int gs_index_count(struct gs_index *idx, size_t *out, struct gs_error *err);

/* Transactions, for batching many small writes. Not nested: GS_E_USAGE on begin inside begin. */
int gs_index_begin(struct gs_index *idx, struct gs_error *err);
int gs_index_commit(struct gs_index *idx, struct gs_error *err);
int gs_index_rollback(struct gs_index *idx, struct gs_error *err);

/* Copies the whole database behind `idx` into the file `path` (created, or replaced through
 * SQLite's own locking and journal, never by renaming files over it) and makes `idx` use that file
 * from then on. For a handle whose file was removed (`rm -rf .gpusync` under the daemon): SQLite
 * still reads an unlinked file it has open, but refuses to write it. Returns 0; GS_E_USAGE inside
 * a transaction, GS_E_IO when the copy fails: `idx` then still uses its old file, and `path` may
 * hold a partial copy that a later gs_index_move replaces. */
int gs_index_move(struct gs_index *idx, const char *path, struct gs_error *err);

/* Runs SQLite's integrity check. Returns 0, or GS_E_IO with its first complaint. */
int gs_index_check(struct gs_index *idx, struct gs_error *err);

/* Small named values kept with the index (the server identity token, ...). get stores a malloc'd
 * copy in *value, or NULL when unset. */
int gs_index_get_meta(struct gs_index *idx, const char *key, char **value, struct gs_error *err);
int gs_index_set_meta(struct gs_index *idx, const char *key, const char *value,
                      struct gs_error *err);

/* ---- intents: operations sent whose outcome is not yet known ----
 *
 * Before a request leaves for the server, the executor records what the server will hold at that
 * path if the request completes, and commits it; when the reply comes, the intent is dropped in
 * the same transaction that records the result. An intent still present when a process starts
 * means an earlier one died (or lost its link) with that request in flight: it may or may not
 * have reached the server. syncd/reconcile.c asks the server and records what it finds, before
 * anything is planned. */
struct gs_index_intent {
    int64_t id;  /* set by gs_index_intent_add and by the walk */
    int op;      /* the executor's operation (enum gs_op_type); the index does not interpret it */
    int subtree; /* a RENAME of a directory with everything below it */
    char *from;  /* a RENAME's source, or NULL */
    /* What the server holds at after.path once the operation completed; kind GS_KIND_NONE for a
     * delete. The local-stat fields are recorded along with it. */
    struct gs_index_entry after;
};

/* Frees the strings `in` owns and zeroes it. */
void gs_index_intent_release(struct gs_index_intent *in);

/* Records `in` (its id is ignored) and stores the new intent's id in *id. Not committed by
 * itself: the caller commits before the request is sent. */
int gs_index_intent_add(struct gs_index *idx, const struct gs_index_intent *in, int64_t *id,
                        struct gs_error *err);

/* Drops intent `id` (absent: no change, returns 0). */
int gs_index_intent_drop(struct gs_index *idx, int64_t id, struct gs_error *err);

/* Drops every intent. */
int gs_index_intent_clear(struct gs_index *idx, struct gs_error *err);

/* Number of intents. */
int gs_index_intent_count(struct gs_index *idx, size_t *out, struct gs_error *err);

/* Calls fn for each intent, oldest first; the intent lives until fn returns, and fn must not
 * write to the index. A non-zero return from fn stops the walk and is returned. */
typedef int (*gs_index_intent_fn)(const struct gs_index_intent *in, void *ctx);
int gs_index_intent_foreach(struct gs_index *idx, gs_index_intent_fn fn, void *ctx,
                            struct gs_error *err);

/* Forgets every entry and intent (the server no longer holds what the index says), keeping the
 * identity. */
int gs_index_clear(struct gs_index *idx, struct gs_error *err);

/* Calls fn for each file whose recorded local inode (local_ino) is one of inos[0..n) (sorted here,
 * in place): the other names of a file with hard links. One pass over the entries. fn must not
 * write to the index; a non-zero return stops the walk and is returned. */
typedef int (*gs_index_path_fn)(void *ctx, const char *path);
int gs_index_files_with_inos(struct gs_index *idx, uint64_t *inos, size_t n, gs_index_path_fn fn,
                             void *ctx, struct gs_error *err);

/* For a caller that keeps a copy of the entries (syncd/verify.h): fn(ctx, path, subtree) is told
 * of each write through this handle, as it is made (a rolled-back one too), before its statement
 * runs: `path`, and with subtree what lies below it ("" with subtree: everything). NULL stops it.
 * Writes by other connections are not told: gs_index_data_version's number changes after them. */
typedef void (*gs_index_write_fn)(void *ctx, const char *path, int subtree);
void gs_index_on_write(struct gs_index *idx, gs_index_write_fn fn, void *ctx);
int gs_index_data_version(struct gs_index *idx, int64_t *out, struct gs_error *err);

#endif
