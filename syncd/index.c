/* syncd/index.c: the SQLite index (see index.h). Statements are prepared once at open and reused;
 * subtrees are ranges of the primary key ("a" and ("a/", "a0"), since '0' follows '/'), so a
 * subtree delete or rename touches only its own rows. */
#include "syncd/index.h"

#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "common/buf.h"
#include "common/wrapper.h"

#define INDEX_SCHEMA_VERSION "1"
#define INDEX_BUSY_MS        5000

enum stmt {
    ST_GET,
    ST_PUT,
    ST_SET_LOCAL,
    ST_DELETE,
    ST_DELETE_SUB,
    ST_RENAME_SUB,
    ST_ALL,
    ST_SUB,
    ST_COUNT,
    ST_INTENT_ADD,
    ST_INTENT_DROP,
    ST_INTENT_ALL,
    ST_INTENT_COUNT,
    ST_DATA_VERSION,
    ST_FILE_INOS,
    ST__COUNT
};

#define ENTRY_COLS                                                                                 \
    "path, kind, mode, size, mtime_ns, hash, link, local_size, local_mtime_ns, local_ino, "        \
    "local_ctime_ns"
/* the entries' columns: ENTRY_COLS, then whether `pull` wrote it (index.h, `pulled`) */
#define INDEX_COLS ENTRY_COLS ", pulled"
/* ?1 path, ?2 path || '/', ?3 path || '0' */
#define SUBTREE_WHERE " WHERE path = ?1 OR (path > ?2 AND path < ?3)"

static const char *const stmt_sql[ST__COUNT] = {
    [ST_GET] = "SELECT " INDEX_COLS " FROM entries WHERE path = ?1",
    [ST_PUT] = "INSERT OR REPLACE INTO entries (" INDEX_COLS
               ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [ST_SET_LOCAL] = "UPDATE entries SET local_size = ?2, local_mtime_ns = ?3, local_ino = ?4,"
                     " local_ctime_ns = ?5 WHERE path = ?1",
    [ST_DELETE] = "DELETE FROM entries WHERE path = ?1",
    [ST_DELETE_SUB] = "DELETE FROM entries" SUBTREE_WHERE,
    [ST_RENAME_SUB] =
        "UPDATE entries SET path = CAST(?4 || substr(path, ?5) AS BLOB)" SUBTREE_WHERE,
    [ST_ALL] = "SELECT " INDEX_COLS " FROM entries ORDER BY path",
    [ST_SUB] = "SELECT " INDEX_COLS " FROM entries" SUBTREE_WHERE " ORDER BY path",
    [ST_COUNT] = "SELECT count(*) FROM entries",
    [ST_INTENT_ADD] = "INSERT INTO intents (op, subtree, from_path, " ENTRY_COLS
                      ") VALUES (?12, ?13, ?14, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [ST_INTENT_DROP] = "DELETE FROM intents WHERE id = ?1",
    [ST_INTENT_ALL] = "SELECT " ENTRY_COLS ", id, op, subtree, from_path FROM intents ORDER BY id",
    [ST_INTENT_COUNT] = "SELECT count(*) FROM intents",
    [ST_DATA_VERSION] = "PRAGMA data_version",
    [ST_FILE_INOS] = "SELECT path, local_ino FROM entries WHERE kind = 1 AND local_ino IS NOT NULL",
};

static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS entries ("
    " path BLOB PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,"
    " size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB,"
    " local_size INTEGER, local_mtime_ns INTEGER, local_ino INTEGER, local_ctime_ns INTEGER,"
    " pulled INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
    /* operations sent whose outcome is unknown (index.h, "intents"); the entry columns describe
     * what the server holds at `path` once the operation completed */
    "CREATE TABLE IF NOT EXISTS intents ("
    " id INTEGER PRIMARY KEY, op INTEGER NOT NULL, subtree INTEGER NOT NULL, from_path BLOB,"
    " path BLOB NOT NULL, kind INTEGER NOT NULL, mode INTEGER NOT NULL,"
    " size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB,"
    " local_size INTEGER, local_mtime_ns INTEGER, local_ino INTEGER, local_ctime_ns INTEGER);";

struct gs_index {
    sqlite3 *db;
    char *file;
    char *remote;
    int in_tx;
    sqlite3_stmt *st[ST__COUNT];
    struct gs_buf scratch; /* subtree bounds */
    struct gs_buf scratch2;
    gs_index_write_fn on_write; /* gs_index_on_write's, or NULL */
    void *on_write_ctx;
};

/* Tells the observer, if any, that `path` (and with subtree, what lies below; "" all) was written.
 */
static void wrote(struct gs_index *idx, const char *path, int subtree)
{
    if (idx->on_write)
        idx->on_write(idx->on_write_ctx, path, subtree);
}

static int db_error(struct gs_index *idx, struct gs_error *err, const char *what)
{
    return gs_error_set(err, GS_E_IO, "index %s: %s: %s", idx->file, what, sqlite3_errmsg(idx->db));
}

static int exec_sql(struct gs_index *idx, const char *sql, struct gs_error *err)
{
    char *msg = NULL;
    if (sqlite3_exec(idx->db, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    int rc = gs_error_set(err, GS_E_IO, "index %s: %s", idx->file, msg ? msg : "SQLite error");
    sqlite3_free(msg);
    return rc;
}

/* Runs a statement that returns no rows and resets it. */
static int step_done(struct gs_index *idx, sqlite3_stmt *st, struct gs_error *err, const char *what)
{
    int rc = sqlite3_step(st);
    int out = rc == SQLITE_DONE ? 0 : db_error(idx, err, what);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

static void bind_text_blob(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_blob(st, i, s, (int)strlen(s), SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* Binds ?1 = path, ?2 = path/, ?3 = path0: the row and the rows below it. */
static void bind_subtree(struct gs_index *idx, sqlite3_stmt *st, const char *path)
{
    size_t len = strlen(path);
    gs_buf_reset(&idx->scratch);
    gs_buf_add(&idx->scratch, path, len);
    gs_buf_addc(&idx->scratch, '/');
    gs_buf_reset(&idx->scratch2);
    gs_buf_add(&idx->scratch2, path, len);
    gs_buf_addc(&idx->scratch2, '0');
    bind_text_blob(st, 1, path);
    sqlite3_bind_blob(st, 2, idx->scratch.data, (int)idx->scratch.len, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, idx->scratch2.data, (int)idx->scratch2.len, SQLITE_STATIC);
}

/* A copy of a BLOB/TEXT column as a NUL-terminated string, or NULL for SQL NULL. */
static char *column_str(sqlite3_stmt *st, int col)
{
    if (sqlite3_column_type(st, col) == SQLITE_NULL)
        return NULL;
    const void *p = sqlite3_column_blob(st, col);
    size_t n = (size_t)sqlite3_column_bytes(st, col);
    char *s = gs_xmalloc(n + 1);
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static void row_to_entry(sqlite3_stmt *st, struct gs_index_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->path = column_str(st, 0);
    e->kind = (enum gs_kind)sqlite3_column_int(st, 1);
    e->mode = (unsigned)sqlite3_column_int(st, 2);
    e->size = (uint64_t)sqlite3_column_int64(st, 3);
    e->mtime_ns = sqlite3_column_int64(st, 4);
    if (sqlite3_column_bytes(st, 5) == GS_HASH_LEN) {
        e->has_hash = 1;
        memcpy(e->hash.b, sqlite3_column_blob(st, 5), GS_HASH_LEN);
    }
    e->link = column_str(st, 6);
    e->has_local = sqlite3_column_type(st, 7) != SQLITE_NULL;
    e->local_size = (uint64_t)sqlite3_column_int64(st, 7);
    e->local_mtime_ns = sqlite3_column_int64(st, 8);
    e->local_ino = (uint64_t)sqlite3_column_int64(st, 9);
    /* a row from before the ctime was kept vouches for nothing: hashed once more */
    e->has_local &= sqlite3_column_type(st, 10) != SQLITE_NULL;
    e->local_ctime_ns = sqlite3_column_int64(st, 10);
}

/* row_to_entry for a row of the entries table (INDEX_COLS), which also says whether pull wrote it.
 */
static void row_to_index_entry(sqlite3_stmt *st, struct gs_index_entry *e)
{
    row_to_entry(st, e);
    e->pulled = sqlite3_column_int(st, 11) != 0;
}

void gs_index_entry_release(struct gs_index_entry *e)
{
    free(e->path);
    free(e->link);
    memset(e, 0, sizeof(*e));
}

void gs_index_entry_copy(struct gs_index_entry *dst, const struct gs_index_entry *src)
{
    *dst = *src;
    dst->path = src->path ? gs_xstrdup(src->path) : NULL;
    dst->link = src->link ? gs_xstrdup(src->link) : NULL;
}

const char *gs_index_remote(const struct gs_index *idx)
{
    return idx->remote;
}

int gs_index_get(struct gs_index *idx, const char *path, struct gs_index_entry *out,
                 struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_GET];
    memset(out, 0, sizeof(*out));
    bind_text_blob(st, 1, path);
    int rc = sqlite3_step(st);
    int ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : db_error(idx, err, "reading an entry");
    if (rc == SQLITE_ROW)
        row_to_index_entry(st, out);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return ret;
}

/* Binds ?1..?10 to the entry columns of `e`. */
static void bind_entry(sqlite3_stmt *st, const struct gs_index_entry *e)
{
    bind_text_blob(st, 1, e->path);
    sqlite3_bind_int(st, 2, (int)e->kind);
    sqlite3_bind_int(st, 3, (int)e->mode);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)e->size);
    sqlite3_bind_int64(st, 5, e->mtime_ns);
    if (e->has_hash)
        sqlite3_bind_blob(st, 6, e->hash.b, GS_HASH_LEN, SQLITE_STATIC);
    bind_text_blob(st, 7, e->link);
    if (e->has_local) {
        sqlite3_bind_int64(st, 8, (sqlite3_int64)e->local_size);
        sqlite3_bind_int64(st, 9, e->local_mtime_ns);
        sqlite3_bind_int64(st, 11, e->local_ctime_ns);
    }
    /* the inode even without the rest (a stat too recent to vouch for the content): it still
     * names the file whose other hard links a change must reach (gs_index_files_with_inos) */
    if (e->has_local || e->local_ino)
        sqlite3_bind_int64(st, 10, (sqlite3_int64)e->local_ino);
}

int gs_index_put(struct gs_index *idx, const struct gs_index_entry *e, struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_PUT];
    bind_entry(st, e);
    sqlite3_bind_int(st, 12, e->pulled != 0);
    wrote(idx, e->path, 0);
    return step_done(idx, st, err, "recording an entry");
}

int gs_index_set_local(struct gs_index *idx, const char *path, uint64_t size, int64_t mtime_ns,
                       uint64_t ino, int64_t ctime_ns, struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_SET_LOCAL];
    bind_text_blob(st, 1, path);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)size);
    sqlite3_bind_int64(st, 3, mtime_ns);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)ino);
    sqlite3_bind_int64(st, 5, ctime_ns);
    wrote(idx, path, 0);
    return step_done(idx, st, err, "refreshing a stat cache");
}

int gs_index_delete(struct gs_index *idx, const char *path, struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_DELETE];
    bind_text_blob(st, 1, path);
    wrote(idx, path, 0);
    return step_done(idx, st, err, "deleting an entry");
}

int gs_index_delete_subtree(struct gs_index *idx, const char *path, struct gs_error *err)
{
    if (!*path) /* the root's subtree is everything: too easy to do by accident */
        return gs_error_set(err, GS_E_USAGE, "index %s: refusing to delete the whole tree",
                            idx->file);
    sqlite3_stmt *st = idx->st[ST_DELETE_SUB];
    bind_subtree(idx, st, path);
    wrote(idx, path, 1);
    return step_done(idx, st, err, "deleting a subtree");
}

/* 1 when `inner` is `outer` or lies below it. */
static int path_within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    return strncmp(inner, outer, n) == 0 && (inner[n] == '\0' || inner[n] == '/');
}

int gs_index_rename(struct gs_index *idx, const char *from, const char *to, struct gs_error *err)
{
    if (!*from || !*to || path_within(to, from) || path_within(from, to))
        return gs_error_set(err, GS_E_USAGE, "cannot rename %s to %s: one lies inside the other",
                            from, to);
    wrote(idx, from, 1);
    int rc = exec_sql(idx, "SAVEPOINT gs_rename", err);
    if (rc == 0)
        rc = gs_index_delete_subtree(idx, to, err);
    if (rc == 0) {
        sqlite3_stmt *st = idx->st[ST_RENAME_SUB];
        bind_subtree(idx, st, from);
        bind_text_blob(st, 4, to);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)strlen(from) + 1);
        rc = step_done(idx, st, err, "renaming a subtree");
    }
    if (rc < 0) {
        exec_sql(idx, "ROLLBACK TO gs_rename; RELEASE gs_rename", NULL);
        return rc;
    }
    return exec_sql(idx, "RELEASE gs_rename", err);
}

int gs_index_foreach(struct gs_index *idx, const char *prefix, gs_index_fn fn, void *ctx,
                     struct gs_error *err)
{
    if (prefix && !*prefix)
        prefix = NULL; /* "" is the root: everything */
    sqlite3_stmt *st = idx->st[prefix ? ST_SUB : ST_ALL];
    if (prefix)
        bind_subtree(idx, st, prefix);
    int rc, ret = 0;
    while (ret == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct gs_index_entry e;
        row_to_index_entry(st, &e);
        ret = fn(&e, ctx);
        gs_index_entry_release(&e);
    }
    if (ret == 0 && rc != SQLITE_DONE)
        ret = db_error(idx, err, "listing entries");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return ret;
}

/* Runs a count(*) statement into *out. */
static int count_rows(struct gs_index *idx, sqlite3_stmt *st, size_t *out, struct gs_error *err)
{
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW ? (size_t)sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? 0 : db_error(idx, err, "counting rows");
}

int gs_index_count(struct gs_index *idx, size_t *out, struct gs_error *err)
{
    return count_rows(idx, idx->st[ST_COUNT], out, err);
}

int gs_index_begin(struct gs_index *idx, struct gs_error *err)
{
    if (idx->in_tx)
        return gs_error_set(err, GS_E_USAGE, "index %s: a transaction is already open", idx->file);
    int rc = exec_sql(idx, "BEGIN IMMEDIATE", err);
    idx->in_tx = rc == 0;
    return rc;
}

int gs_index_commit(struct gs_index *idx, struct gs_error *err)
{
    int rc = exec_sql(idx, "COMMIT", err);
    if (rc == 0)
        idx->in_tx = 0;
    return rc;
}

int gs_index_rollback(struct gs_index *idx, struct gs_error *err)
{
    idx->in_tx = 0;
    return exec_sql(idx, "ROLLBACK", err);
}

int gs_index_check(struct gs_index *idx, struct gs_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(idx->db, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK)
        return db_error(idx, err, "checking integrity");
    int rc = sqlite3_step(st);
    const char *res = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
    int ret = res && !strcmp(res, "ok") ? 0
                                        : gs_error_set(err, GS_E_IO, "index %s is damaged: %s",
                                                       idx->file, res ? res : "no answer");
    sqlite3_finalize(st);
    return ret;
}

/* Reads meta.remote into *out (malloc'd, NULL when unset). */
static int meta_get(struct gs_index *idx, const char *key, char **out, struct gs_error *err)
{
    sqlite3_stmt *st = NULL;
    *out = NULL;
    if (sqlite3_prepare_v2(idx->db, "SELECT value FROM meta WHERE key = ?1", -1, &st, NULL))
        return db_error(idx, err, "reading metadata");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = column_str(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_error(idx, err, "reading metadata");
}

static int meta_set(struct gs_index *idx, const char *key, const char *value, struct gs_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(idx->db, "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", -1,
                           &st, NULL))
        return db_error(idx, err, "writing metadata");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_error(idx, err, "writing metadata");
}

/* Makes the index belong to `remote_id`, emptying it if it belonged to another, in one
 * transaction so a crash cannot leave old entries under the new identity. */
static int claim_remote(struct gs_index *idx, const char *remote_id, struct gs_error *err)
{
    char *old = NULL;
    int rc = exec_sql(idx, "BEGIN IMMEDIATE", err);
    if (rc == 0)
        rc = meta_get(idx, "remote", &old, err);
    if (rc == 0 && (!old || strcmp(old, remote_id) != 0)) {
        rc = exec_sql(idx, "DELETE FROM entries; DELETE FROM intents", err);
        if (rc == 0)
            rc = meta_set(idx, "remote", remote_id, err);
        if (rc == 0)
            rc = meta_set(idx, "schema", INDEX_SCHEMA_VERSION, err);
    }
    free(old);
    if (rc < 0) {
        exec_sql(idx, "ROLLBACK", NULL);
        return rc;
    }
    return exec_sql(idx, "COMMIT", err);
}

/* An index made before the stat cache kept the ctime gets the column (NULL in its rows). */
static int add_ctime_columns(struct gs_index *idx, struct gs_error *err)
{
    sqlite3_stmt *probe = NULL;
    int has = sqlite3_prepare_v2(idx->db, "SELECT local_ctime_ns FROM entries LIMIT 0", -1, &probe,
                                 NULL) == SQLITE_OK;
    sqlite3_finalize(probe);
    if (has)
        return 0;
    return exec_sql(idx,
                    "ALTER TABLE entries ADD COLUMN local_ctime_ns INTEGER;"
                    "ALTER TABLE intents ADD COLUMN local_ctime_ns INTEGER;",
                    err);
}

/* An index made before pull recorded what it wrote gets the column: its rows were all written by
 * gpusync (0). */
static int add_pulled_column(struct gs_index *idx, struct gs_error *err)
{
    sqlite3_stmt *probe = NULL;
    int has = sqlite3_prepare_v2(idx->db, "SELECT pulled FROM entries LIMIT 0", -1, &probe, NULL) ==
              SQLITE_OK;
    sqlite3_finalize(probe);
    if (has)
        return 0;
    return exec_sql(idx, "ALTER TABLE entries ADD COLUMN pulled INTEGER NOT NULL DEFAULT 0;", err);
}

static int prepare_all(struct gs_index *idx, struct gs_error *err)
{
    for (int i = 0; i < ST__COUNT; i++)
        if (sqlite3_prepare_v3(idx->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &idx->st[i],
                               NULL) != SQLITE_OK)
            return db_error(idx, err, "preparing statements");
    return 0;
}

static int index_setup(struct gs_index *idx, const char *remote_id, struct gs_error *err)
{
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(idx->file, &idx->db, flags, NULL) != SQLITE_OK)
        return idx->db ? db_error(idx, err, "cannot open")
                       : gs_error_set(err, GS_E_NOMEM, "index %s: no memory", idx->file);
    sqlite3_busy_timeout(idx->db, INDEX_BUSY_MS);
    int rc = exec_sql(idx, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", err);
    if (rc == 0)
        rc = exec_sql(idx, schema_sql, err);
    if (rc == 0)
        rc = add_ctime_columns(idx, err);
    if (rc == 0)
        rc = add_pulled_column(idx, err);
    if (rc == 0)
        rc = claim_remote(idx, remote_id, err);
    if (rc == 0)
        rc = prepare_all(idx, err);
    return rc;
}

int gs_index_open(struct gs_index **out, const char *path, const char *remote_id,
                  struct gs_error *err)
{
    *out = NULL;
    struct gs_index *idx = gs_xcalloc(1, sizeof(*idx));
    idx->file = gs_xstrdup(path);
    idx->remote = gs_xstrdup(remote_id);
    int rc = index_setup(idx, remote_id, err);
    if (rc < 0) {
        gs_index_close(idx);
        return rc;
    }
    *out = idx;
    return 0;
}

void gs_index_close(struct gs_index *idx)
{
    if (!idx)
        return;
    for (int i = 0; i < ST__COUNT; i++)
        sqlite3_finalize(idx->st[i]);
    if (idx->in_tx)
        sqlite3_exec(idx->db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(idx->db);
    gs_buf_release(&idx->scratch);
    gs_buf_release(&idx->scratch2);
    free(idx->file);
    free(idx->remote);
    free(idx);
}

/* Copies the database of `idx` into the file `path` with SQLite's backup API, which takes the
 * destination's locks and writes through its journal as any other writer would. */
static int copy_database(struct gs_index *idx, const char *path, struct gs_error *err)
{
    sqlite3 *dst = NULL;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    int rc = sqlite3_open_v2(path, &dst, flags, NULL);
    sqlite3_backup *b = NULL;
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout(dst, INDEX_BUSY_MS);
        b = sqlite3_backup_init(dst, "main", idx->db, "main");
    }
    if (b) {
        rc = sqlite3_backup_step(b, -1);
        rc = sqlite3_backup_finish(b) == SQLITE_OK && rc == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    } else if (rc == SQLITE_OK) {
        rc = SQLITE_ERROR;
    }
    int ret = rc == SQLITE_OK
                  ? 0
                  : gs_error_set(err, GS_E_IO, "index %s: cannot copy it to %s: %s", idx->file,
                                 path, dst ? sqlite3_errmsg(dst) : "no memory");
    sqlite3_close(dst);
    return ret;
}

int gs_index_move(struct gs_index *idx, const char *path, struct gs_error *err)
{
    if (idx->in_tx)
        return gs_error_set(err, GS_E_USAGE, "index %s: cannot move it inside a transaction",
                            idx->file);
    struct gs_index *moved = NULL;
    int rc = copy_database(idx, path, err);
    if (rc == 0)
        rc = gs_index_open(&moved, path, idx->remote, err);
    if (rc < 0)
        return rc;
    struct gs_index old = *idx; /* swap, so that the caller's pointer stays valid */
    *idx = *moved;
    *moved = old;
    idx->on_write = old.on_write;
    idx->on_write_ctx = old.on_write_ctx;
    gs_index_close(moved);
    wrote(idx, "", 1); /* another connection: its data_version is another count */
    return 0;
}

int gs_index_get_meta(struct gs_index *idx, const char *key, char **value, struct gs_error *err)
{
    *value = NULL;
    return meta_get(idx, key, value, err);
}

int gs_index_set_meta(struct gs_index *idx, const char *key, const char *value,
                      struct gs_error *err)
{
    return meta_set(idx, key, value, err);
}

int gs_index_clear(struct gs_index *idx, struct gs_error *err)
{
    wrote(idx, "", 1);
    return exec_sql(idx, "DELETE FROM entries; DELETE FROM intents", err);
}

static int ino_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int gs_index_files_with_inos(struct gs_index *idx, uint64_t *inos, size_t n, gs_index_path_fn fn,
                             void *ctx, struct gs_error *err)
{
    if (n > 1)
        qsort(inos, n, sizeof(*inos), ino_cmp);
    sqlite3_stmt *st = idx->st[ST_FILE_INOS];
    int rc, ret = 0;
    while (ret == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        uint64_t ino = (uint64_t)sqlite3_column_int64(st, 1);
        if (!bsearch(&ino, inos, n, sizeof(*inos), ino_cmp))
            continue;
        char *path = column_str(st, 0);
        ret = fn(ctx, path);
        free(path);
    }
    if (ret == 0 && rc != SQLITE_DONE)
        ret = db_error(idx, err, "listing files by inode");
    sqlite3_reset(st);
    return ret;
}

void gs_index_on_write(struct gs_index *idx, gs_index_write_fn fn, void *ctx)
{
    idx->on_write = fn;
    idx->on_write_ctx = ctx;
}

int gs_index_data_version(struct gs_index *idx, int64_t *out, struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_DATA_VERSION];
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? 0 : db_error(idx, err, "reading its data version");
}

/* ---- intents ---- */

void gs_index_intent_release(struct gs_index_intent *in)
{
    free(in->from);
    gs_index_entry_release(&in->after);
    memset(in, 0, sizeof(*in));
}

int gs_index_intent_add(struct gs_index *idx, const struct gs_index_intent *in, int64_t *id,
                        struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_INTENT_ADD];
    bind_entry(st, &in->after);
    sqlite3_bind_int(st, 12, in->op);
    sqlite3_bind_int(st, 13, in->subtree);
    bind_text_blob(st, 14, in->from);
    int rc = step_done(idx, st, err, "recording an intent");
    *id = rc == 0 ? (int64_t)sqlite3_last_insert_rowid(idx->db) : 0;
    return rc;
}

int gs_index_intent_drop(struct gs_index *idx, int64_t id, struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_INTENT_DROP];
    sqlite3_bind_int64(st, 1, id);
    return step_done(idx, st, err, "dropping an intent");
}

int gs_index_intent_clear(struct gs_index *idx, struct gs_error *err)
{
    return exec_sql(idx, "DELETE FROM intents", err);
}

int gs_index_intent_count(struct gs_index *idx, size_t *out, struct gs_error *err)
{
    return count_rows(idx, idx->st[ST_INTENT_COUNT], out, err);
}

int gs_index_intent_foreach(struct gs_index *idx, gs_index_intent_fn fn, void *ctx,
                            struct gs_error *err)
{
    sqlite3_stmt *st = idx->st[ST_INTENT_ALL];
    int rc, ret = 0;
    while (ret == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct gs_index_intent in = {0};
        row_to_entry(st, &in.after);
        in.id = sqlite3_column_int64(st, 11);
        in.op = sqlite3_column_int(st, 12);
        in.subtree = sqlite3_column_int(st, 13);
        in.from = column_str(st, 14);
        ret = fn(&in, ctx);
        gs_index_intent_release(&in);
    }
    if (ret == 0 && rc != SQLITE_DONE)
        ret = db_error(idx, err, "listing intents");
    sqlite3_reset(st);
    return ret;
}
