/* tests/unit/test_index.c: syncd/index: round trips (hostile paths included), subtree delete and
 * rename, remote-identity change, transactions, and consistency after a writer is killed with
 * SIGKILL mid-write. Real SQLite files in a temporary directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/buf.h"
#include "syncd/index.h"

#define REMOTE "root@gpu.example:2222:/root/proj"

static char tmpdir[64];
static char dbpath[128];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-index-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    snprintf(dbpath, sizeof(dbpath), "%s/index.db", tmpdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct gs_index *open_idx(const char *remote)
{
    struct gs_index *idx = NULL;
    struct gs_error err = {0};
    if (gs_index_open(&idx, dbpath, remote, &err) != 0)
        fail_msg("open: %s", err.msg);
    return idx;
}

static void put_file(struct gs_index *idx, const char *path, unsigned char seed)
{
    struct gs_index_entry e = {.path = (char *)path,
                               .kind = GS_KIND_FILE,
                               .mode = 0644,
                               .size = seed,
                               .mtime_ns = 1000 + seed,
                               .has_hash = 1};
    memset(e.hash.b, seed, GS_HASH_LEN);
    struct gs_error err = {0};
    if (gs_index_put(idx, &e, &err) != 0)
        fail_msg("put %s: %s", path, err.msg);
}

static void put_dir(struct gs_index *idx, const char *path)
{
    struct gs_index_entry e = {.path = (char *)path, .kind = GS_KIND_DIR, .mode = 0755};
    assert_int_equal(gs_index_put(idx, &e, NULL), 0);
}

static int has(struct gs_index *idx, const char *path)
{
    struct gs_index_entry e;
    int rc = gs_index_get(idx, path, &e, NULL);
    assert_true(rc >= 0);
    gs_index_entry_release(&e);
    return rc;
}

/* Collects paths in iteration order, newline-separated. */
static int collect(const struct gs_index_entry *e, void *ctx)
{
    gs_buf_adds(ctx, e->path);
    gs_buf_addc(ctx, '|');
    return 0;
}

static char *list(struct gs_index *idx, const char *prefix)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, "");
    assert_int_equal(gs_index_foreach(idx, prefix, collect, &b, NULL), 0);
    return gs_buf_detach(&b, NULL);
}

static void test_index__round_trip_keeps_every_field(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    const char *path = "d i r/\xff\xfe\nname";
    struct gs_index_entry e = {.path = (char *)path,
                               .kind = GS_KIND_FILE,
                               .mode = 0755,
                               .size = 1ULL << 40,
                               .mtime_ns = 1700000000123456789LL,
                               .has_hash = 1,
                               .has_local = 1,
                               .local_size = 1ULL << 40,
                               .local_mtime_ns = 1700000000999999999LL,
                               .local_ino = 1ULL << 60};
    gs_hash_bytes("content", 7, &e.hash);
    assert_int_equal(gs_index_put(idx, &e, NULL), 0);
    struct gs_index_entry l = {
        .path = "lnk", .kind = GS_KIND_SYMLINK, .mode = 0777, .link = "../\xc3(outside\n"};
    assert_int_equal(gs_index_put(idx, &l, NULL), 0);
    gs_index_close(idx);

    idx = open_idx(REMOTE);
    struct gs_index_entry got;
    assert_int_equal(gs_index_get(idx, path, &got, NULL), 1);
    assert_string_equal(got.path, path);
    assert_int_equal(got.kind, GS_KIND_FILE);
    assert_int_equal(got.mode, 0755);
    assert_int_equal(got.size, 1ULL << 40);
    assert_int_equal(got.mtime_ns, e.mtime_ns);
    assert_true(got.has_hash && gs_hash_equal(&got.hash, &e.hash));
    assert_true(got.has_local);
    assert_int_equal(got.local_size, e.local_size);
    assert_int_equal(got.local_mtime_ns, e.local_mtime_ns);
    assert_int_equal(got.local_ino, e.local_ino);
    assert_null(got.link);
    gs_index_entry_release(&got);
    assert_int_equal(gs_index_get(idx, "lnk", &got, NULL), 1);
    assert_string_equal(got.link, "../\xc3(outside\n");
    assert_false(got.has_hash);
    assert_false(got.has_local);
    gs_index_entry_release(&got);
    assert_int_equal(gs_index_get(idx, "absent", &got, NULL), 0);
    gs_index_close(idx);
}

static void test_index__database_is_in_wal_mode(void **state)
{
    (void)state;
    gs_index_close(open_idx(REMOTE));
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* An index written before the stat cache kept the ctime opens: its rows are kept, and their stat
 * cache counts as unknown (hashed once more), not as matching any ctime. */
static void test_index__an_index_without_ctimes_opens_and_hashes_again(void **state)
{
    (void)state;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    const char *old =
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('remote', '" REMOTE "');"
        "CREATE TABLE entries (path BLOB PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT "
        "NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB, local_size "
        "INTEGER, local_mtime_ns INTEGER, local_ino INTEGER) WITHOUT ROWID;"
        "CREATE TABLE intents (id INTEGER PRIMARY KEY, op INTEGER NOT NULL, subtree INTEGER NOT "
        "NULL, from_path BLOB, path BLOB NOT NULL, kind INTEGER NOT NULL, mode INTEGER NOT NULL, "
        "size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB, local_size "
        "INTEGER, local_mtime_ns INTEGER, local_ino INTEGER);"
        "INSERT INTO entries VALUES (CAST('f' AS BLOB), 1, 420, 3, 5, NULL, NULL, 3, 7, 9);";
    assert_int_equal(sqlite3_exec(db, old, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    struct gs_index *idx = open_idx(REMOTE);
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "f", &e, NULL), 1);
    assert_int_equal(e.size, 3);
    assert_int_equal(e.local_ino, 9);
    assert_false(e.has_local);
    gs_index_entry_release(&e);
    gs_index_close(idx);
}

/* Whether the entry at `path` is marked as written by pull. */
static int is_pulled(struct gs_index *idx, const char *path)
{
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, path, &e, NULL), 1);
    int pulled = e.pulled;
    gs_index_entry_release(&e);
    return pulled;
}

/* The pull mark is kept through a refreshed stat cache, a walk and a rename, and cleared by a put
 * that does not carry it (what a push records once it sent a local edit). */
static void test_index__pulled_mark_lasts_until_a_put_without_it(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    struct gs_index_entry e = {
        .path = (char *)"out/m.pt", .kind = GS_KIND_FILE, .mode = 0644, .pulled = 1};
    assert_int_equal(gs_index_put(idx, &e, NULL), 0);
    put_file(idx, "src.py", 3);
    assert_true(is_pulled(idx, "out/m.pt"));
    assert_false(is_pulled(idx, "src.py"));
    assert_int_equal(gs_index_set_local(idx, "out/m.pt", 1, 2, 3, 4, NULL), 0);
    assert_true(is_pulled(idx, "out/m.pt"));
    char *all = list(idx, NULL);
    assert_string_equal(all, "out/m.pt|src.py|");
    free(all);
    assert_int_equal(gs_index_rename(idx, "out", "res", NULL), 0);
    assert_true(is_pulled(idx, "res/m.pt"));
    put_file(idx, "res/m.pt", 9);
    assert_false(is_pulled(idx, "res/m.pt"));
    gs_index_close(idx);
}

/* pulled, read through a walk (what verify and plan read) */
static int note_pulled(const struct gs_index_entry *e, void *ctx)
{
    if (e->pulled)
        gs_buf_addf(ctx, "%s|", e->path);
    return 0;
}

/* An index written before pull recorded its files opens: its rows count as gpusync's, and a pulled
 * entry can be recorded in it and read back, by a get and by a walk. */
static void test_index__an_index_without_the_pulled_mark_opens_and_takes_it(void **state)
{
    (void)state;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    const char *old =
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('remote', '" REMOTE "');"
        "CREATE TABLE entries (path BLOB PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT "
        "NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB, local_size "
        "INTEGER, local_mtime_ns INTEGER, local_ino INTEGER, local_ctime_ns INTEGER) WITHOUT ROWID;"
        "CREATE TABLE intents (id INTEGER PRIMARY KEY, op INTEGER NOT NULL, subtree INTEGER NOT "
        "NULL, from_path BLOB, path BLOB NOT NULL, kind INTEGER NOT NULL, mode INTEGER NOT NULL, "
        "size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, hash BLOB, link BLOB, local_size "
        "INTEGER, local_mtime_ns INTEGER, local_ino INTEGER, local_ctime_ns INTEGER);"
        "INSERT INTO entries VALUES (CAST('f' AS BLOB), 1, 420, 3, 5, NULL, NULL, 3, 7, 9, 11);";
    assert_int_equal(sqlite3_exec(db, old, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    struct gs_index *idx = open_idx(REMOTE);
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "f", &e, NULL), 1);
    assert_int_equal(e.size, 3);
    assert_true(e.has_local);
    assert_false(e.pulled);
    gs_index_entry_release(&e);
    struct gs_index_entry p = {
        .path = (char *)"g", .kind = GS_KIND_FILE, .mode = 0644, .pulled = 1};
    assert_int_equal(gs_index_put(idx, &p, NULL), 0);
    gs_index_close(idx);
    idx = open_idx(REMOTE); /* opened again: migrated once, not twice */
    struct gs_buf seen = GS_BUF_INIT;
    assert_int_equal(gs_index_foreach(idx, NULL, note_pulled, &seen, NULL), 0);
    assert_string_equal(seen.data, "g|");
    gs_buf_release(&seen);
    gs_index_close(idx);
}

static void test_index__iteration_is_in_path_order_and_prefix_bounded(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    const char *paths[] = {"b", "a/x", "a.txt", "a", "a0", "a/b/y", "ab"};
    for (size_t i = 0; i < 7; i++)
        put_file(idx, paths[i], (unsigned char)i);
    char *all = list(idx, NULL);
    assert_string_equal(all, "a|a.txt|a/b/y|a/x|a0|ab|b|");
    char *sub = list(idx, "a");
    assert_string_equal(sub, "a|a/b/y|a/x|");
    size_t n;
    assert_int_equal(gs_index_count(idx, &n, NULL), 0);
    assert_int_equal(n, 7);
    free(all);
    free(sub);
    gs_index_close(idx);
}

static void test_index__delete_subtree_spares_siblings_with_common_prefix(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_dir(idx, "a");
    put_file(idx, "a/x", 1);
    put_dir(idx, "a/b");
    put_file(idx, "a/b/y", 2);
    put_file(idx, "a.txt", 3);
    put_file(idx, "ab", 4);
    put_file(idx, "a0", 5);
    assert_int_equal(gs_index_delete_subtree(idx, "a", NULL), 0);
    char *all = list(idx, NULL);
    assert_string_equal(all, "a.txt|a0|ab|");
    assert_int_equal(gs_index_delete(idx, "ab", NULL), 0);
    assert_int_equal(gs_index_delete(idx, "never-there", NULL), 0);
    assert_int_equal(has(idx, "ab"), 0);
    free(all);
    gs_index_close(idx);
}

static void test_index__rename_subtree_rewrites_prefix_and_replaces_target(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_dir(idx, "src");
    put_file(idx, "src/m.py", 1);
    put_file(idx, "src/\xff odd", 2);
    put_file(idx, "src.txt", 3);
    put_dir(idx, "lib");
    put_file(idx, "lib/stale", 4);
    assert_int_equal(gs_index_rename(idx, "src", "lib", NULL), 0);
    char *all = list(idx, NULL);
    assert_string_equal(all, "lib|lib/m.py|lib/\xff odd|src.txt|");
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "lib/\xff odd", &e, NULL), 1);
    assert_int_equal(e.hash.b[0], 2); /* the entry moved with its data */
    gs_index_entry_release(&e);
    free(all);
    gs_index_close(idx);
}

static void test_index__rename_into_itself_is_refused(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_dir(idx, "a");
    put_file(idx, "a/f", 1);
    struct gs_error err = {0};
    assert_int_equal(gs_index_rename(idx, "a", "a/b", &err), GS_E_USAGE);
    assert_int_equal(has(idx, "a/f"), 1);
    gs_index_close(idx);
}

static void test_index__other_remote_starts_empty(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_file(idx, "f", 1);
    gs_index_close(idx);
    idx = open_idx(REMOTE);
    assert_int_equal(has(idx, "f"), 1);
    gs_index_close(idx);
    idx = open_idx("root@other-host:22:/root/proj");
    assert_int_equal(has(idx, "f"), 0);
    assert_string_equal(gs_index_remote(idx), "root@other-host:22:/root/proj");
    gs_index_close(idx);
    idx = open_idx(REMOTE); /* and back: still empty, nothing true is known about it */
    assert_int_equal(has(idx, "f"), 0);
    gs_index_close(idx);
}

static void test_index__set_local_changes_only_the_stat_cache(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_file(idx, "f", 7);
    assert_int_equal(gs_index_set_local(idx, "f", 70, 700, 7000, 70000, NULL), 0);
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "f", &e, NULL), 1);
    assert_true(e.has_local);
    assert_int_equal(e.local_size, 70);
    assert_int_equal(e.local_mtime_ns, 700);
    assert_int_equal(e.local_ino, 7000);
    assert_int_equal(e.local_ctime_ns, 70000);
    assert_int_equal(e.size, 7);
    assert_int_equal(e.hash.b[0], 7);
    gs_index_entry_release(&e);
    assert_int_equal(gs_index_set_local(idx, "absent", 1, 1, 1, 1, NULL), 0);
    assert_int_equal(has(idx, "absent"), 0);
    gs_index_close(idx);
}

static void test_index__rollback_discards_and_commit_keeps(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    assert_int_equal(gs_index_begin(idx, NULL), 0);
    assert_int_equal(gs_index_begin(idx, NULL), GS_E_USAGE);
    put_file(idx, "gone", 1);
    assert_int_equal(gs_index_rollback(idx, NULL), 0);
    assert_int_equal(gs_index_begin(idx, NULL), 0);
    put_file(idx, "kept", 2);
    assert_int_equal(gs_index_commit(idx, NULL), 0);
    gs_index_close(idx);
    idx = open_idx(REMOTE);
    assert_int_equal(has(idx, "gone"), 0);
    assert_int_equal(has(idx, "kept"), 1);
    gs_index_close(idx);
}

static void test_index__unreadable_database_names_the_file(void **state)
{
    (void)state;
    FILE *f = fopen(dbpath, "w");
    assert_non_null(f);
    fputs("this is not an SQLite database, but it is long enough to look like a header.....", f);
    fclose(f);
    struct gs_index *bad = NULL;
    struct gs_error err = {0};
    assert_int_equal(gs_index_open(&bad, dbpath, REMOTE, &err), GS_E_IO);
    assert_null(bad);
    assert_non_null(strstr(err.msg, dbpath));
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/no/such/dir/index.db", tmpdir);
    assert_int_equal(gs_index_open(&bad, missing, REMOTE, &err), GS_E_IO);
    assert_non_null(strstr(err.msg, missing));
}

#define BATCH 50

/* The child: batches of BATCH puts, one transaction each, then a subtree rename of the batch
 * (its own atomic step), reporting each completed batch on `fd`. Never returns. */
static void writer_child(int fd, int round)
{
    struct gs_index *idx = NULL;
    if (gs_index_open(&idx, dbpath, REMOTE, NULL) != 0)
        _exit(2);
    char path[64], from[32], to[32];
    for (unsigned batch = 0;; batch++) {
        if (gs_index_begin(idx, NULL) != 0)
            _exit(3);
        for (int i = 0; i < BATCH; i++) {
            snprintf(path, sizeof(path), "r%d/b%06u/f%02d", round, batch, i);
            put_file(idx, path, (unsigned char)i);
        }
        if (gs_index_commit(idx, NULL) != 0)
            _exit(4);
        snprintf(from, sizeof(from), "r%d/b%06u", round, batch);
        snprintf(to, sizeof(to), "r%d/c%06u", round, batch);
        if (gs_index_rename(idx, from, to, NULL) != 0)
            _exit(5);
        if (write(fd, &batch, sizeof(batch)) != sizeof(batch))
            _exit(6);
    }
}

/* Walks entries in path order: each directory (one batch, renamed or not) holds exactly BATCH
 * files with the hashes written. */
struct batch_check {
    char dir[32];
    unsigned in_dir;
    unsigned total;
    int bad;
};

static void close_dir(struct batch_check *c)
{
    if (c->dir[0] && c->in_dir != BATCH)
        c->bad = 1;
    c->in_dir = 0;
}

static int check_batch(const struct gs_index_entry *e, void *ctx)
{
    struct batch_check *c = ctx;
    const char *slash = strrchr(e->path, '/');
    size_t dlen = (size_t)(slash - e->path);
    if (dlen >= sizeof(c->dir) || strncmp(c->dir, e->path, dlen) || c->dir[dlen]) {
        close_dir(c);
        memcpy(c->dir, e->path, dlen);
        c->dir[dlen] = '\0';
    }
    int i = atoi(slash + 2);
    if (!e->has_hash || e->hash.b[0] != (unsigned char)i || e->kind != GS_KIND_FILE)
        c->bad = 1;
    c->in_dir++;
    c->total++;
    return 0;
}

static void test_index__sigkill_mid_write_leaves_consistent_index(void **state)
{
    (void)state;
    gs_index_close(open_idx(REMOTE));
    size_t before = 0;
    for (int round = 0; round < 3; round++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            writer_child(fds[1], round);
        }
        close(fds[1]);
        unsigned last = 0;
        for (int seen = 0; seen < 5 + round * 7; seen++) /* wait for progress, not for time */
            assert_int_equal(read(fds[0], &last, sizeof(last)), sizeof(last));
        kill(pid, SIGKILL); /* the child is inside its next batch or rename right now */
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        close(fds[0]);

        struct gs_index *idx = open_idx(REMOTE);
        struct gs_error err = {0};
        assert_int_equal(gs_index_check(idx, &err), 0);
        struct batch_check c = {0};
        assert_int_equal(gs_index_foreach(idx, NULL, check_batch, &c, NULL), 0);
        close_dir(&c);
        assert_false(c.bad); /* no half batch, no half-renamed batch */
        size_t n;
        assert_int_equal(gs_index_count(idx, &n, NULL), 0);
        assert_int_equal(c.total, n);
        /* nothing reported as done is lost */
        assert_true(n - before >= (size_t)(last + 1) * BATCH);
        before = n;
        gs_index_close(idx);
    }
}

/* ---- intents ---- */

struct seen_intents {
    int n;
    int64_t ids[8];
    int ops[8];
    char paths[8][64];
    char from[8][64];
    int has_hash[8];
};

static int note_intent(const struct gs_index_intent *in, void *ctx)
{
    struct seen_intents *s = ctx;
    s->ids[s->n] = in->id;
    s->ops[s->n] = in->op;
    s->has_hash[s->n] = in->after.has_hash;
    snprintf(s->paths[s->n], sizeof(s->paths[0]), "%s", in->after.path);
    snprintf(s->from[s->n], sizeof(s->from[0]), "%s", in->from ? in->from : "-");
    s->n++;
    return 0;
}

static int64_t add_intent(struct gs_index *idx, int op, const char *path, const char *from)
{
    struct gs_index_intent in = {
        .op = op, .from = (char *)from, .after = {.path = (char *)path, .kind = GS_KIND_FILE}};
    if (op == 2) {
        in.after.has_hash = 1;
        memset(in.after.hash.b, 0xab, GS_HASH_LEN);
    }
    int64_t id = 0;
    assert_int_equal(gs_index_intent_add(idx, &in, &id, NULL), 0);
    assert_true(id > 0);
    return id;
}

/* An intent committed before its request left survives the process (here: the handle closing
 * without a drop), in order, with its fields; dropping one removes only that one. */
static void test_index__intents_persist_in_order_until_dropped(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    int64_t a = add_intent(idx, 2, "b/put.py", NULL);
    int64_t b = add_intent(idx, 0, "new/name", "old/name");
    add_intent(idx, 5, "gone.txt", NULL);
    gs_index_close(idx);
    idx = open_idx(REMOTE);
    struct seen_intents s = {0};
    assert_int_equal(gs_index_intent_foreach(idx, note_intent, &s, NULL), 0);
    assert_int_equal(s.n, 3);
    assert_true(s.ids[0] == a && s.ids[1] == b);
    assert_string_equal(s.paths[0], "b/put.py");
    assert_int_equal(s.has_hash[0], 1);
    assert_string_equal(s.from[1], "old/name");
    assert_int_equal(s.ops[2], 5);
    assert_int_equal(gs_index_intent_drop(idx, b, NULL), 0);
    size_t n = 0;
    assert_int_equal(gs_index_intent_count(idx, &n, NULL), 0);
    assert_int_equal(n, 2);
    gs_index_close(idx);
}

/* An intent added inside a transaction that is rolled back never existed; clearing the index (a
 * wiped server) or opening it for another remote forgets intents too: they describe requests to
 * a tree that is gone. */
static void test_index__intents_follow_transactions_and_clears(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    size_t n = 9;
    assert_int_equal(gs_index_begin(idx, NULL), 0);
    add_intent(idx, 2, "x", NULL);
    assert_int_equal(gs_index_rollback(idx, NULL), 0);
    assert_int_equal(gs_index_intent_count(idx, &n, NULL), 0);
    assert_int_equal(n, 0);
    add_intent(idx, 2, "y", NULL);
    assert_int_equal(gs_index_clear(idx, NULL), 0);
    assert_int_equal(gs_index_intent_count(idx, &n, NULL), 0);
    assert_int_equal(n, 0);
    add_intent(idx, 2, "z", NULL);
    gs_index_close(idx);
    idx = open_idx("root@other.example:22:/p");
    assert_int_equal(gs_index_intent_count(idx, &n, NULL), 0);
    assert_int_equal(n, 0);
    gs_index_close(idx);
}

/* The daemon's case: its index file was removed with .gpusync/ while open. Moved to a new file,
 * it keeps every entry and intent, and takes writes again (SQLite refuses to write an unlinked
 * file). */
static void test_index__move_rescues_a_removed_file(void **state)
{
    (void)state;
    struct gs_index *idx = open_idx(REMOTE);
    put_file(idx, "kept", 1);
    struct gs_index_intent in = {.op = 1, .after = {.path = "doubt", .kind = GS_KIND_FILE}};
    int64_t id;
    assert_int_equal(gs_index_intent_add(idx, &in, &id, NULL), 0);
    char cmd[512], moved[128];
    snprintf(cmd, sizeof(cmd), "rm -f '%s' '%s-wal' '%s-shm'", dbpath, dbpath, dbpath);
    assert_int_equal(system(cmd), 0);
    snprintf(moved, sizeof(moved), "%.64s/moved.db", tmpdir);
    struct gs_error err = {0};
    if (gs_index_move(idx, moved, &err) != 0)
        fail_msg("move: %s", err.msg);
    put_file(idx, "after", 2);
    gs_index_close(idx);
    memcpy(dbpath, moved, sizeof(dbpath)); /* open_idx opens dbpath */
    idx = open_idx(REMOTE);
    assert_int_equal(has(idx, "kept"), 1);
    assert_int_equal(has(idx, "after"), 1);
    size_t intents = 0;
    assert_int_equal(gs_index_intent_count(idx, &intents, NULL), 0);
    assert_int_equal(intents, 1);
    gs_index_close(idx);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_index__round_trip_keeps_every_field),
        T(test_index__database_is_in_wal_mode),
        T(test_index__iteration_is_in_path_order_and_prefix_bounded),
        T(test_index__delete_subtree_spares_siblings_with_common_prefix),
        T(test_index__rename_subtree_rewrites_prefix_and_replaces_target),
        T(test_index__rename_into_itself_is_refused),
        T(test_index__other_remote_starts_empty),
        T(test_index__set_local_changes_only_the_stat_cache),
        T(test_index__an_index_without_ctimes_opens_and_hashes_again),
        T(test_index__pulled_mark_lasts_until_a_put_without_it),
        T(test_index__an_index_without_the_pulled_mark_opens_and_takes_it),
        T(test_index__rollback_discards_and_commit_keeps),
        T(test_index__unreadable_database_names_the_file),
        T(test_index__sigkill_mid_write_leaves_consistent_index),
        T(test_index__intents_persist_in_order_until_dropped),
        T(test_index__intents_follow_transactions_and_clears),
        T(test_index__move_rescues_a_removed_file),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
