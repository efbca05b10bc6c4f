/* tests/unit/test_plan.c: syncd/plan against a real tree, a real scan and a real SQLite index.
 * An ideal executor (every op succeeds; gs_plan_record applied in order) stands in for the agent,
 * so "sync, change the tree, plan again" shows exactly what a push would send. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "syncd/ignore.h"
#include "syncd/plan.h"
#include "syncd/push.h"

static char tmpdir[64];
static struct gs_index *idx;

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-plan-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, tmpdir, ".gpusync");
    mkdir(p.data, 0755);
    gs_buf_reset(&p);
    gs_path_join(&p, tmpdir, GS_INDEX_FILE);
    int rc = gs_index_open(&idx, p.data, "root@h:22:/root/p", NULL);
    gs_buf_release(&p);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    gs_index_close(idx);
    idx = NULL;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- the tree ---- */

static char *abs_path(const char *rel)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, tmpdir, rel);
    return gs_buf_detach(&p, NULL);
}

/* Writes a file in place (same inode when it exists) and returns its path. */
static char *write_rel(const char *rel, const char *text)
{
    char *p = abs_path(rel);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return p;
}

/* Each write gets its own mtime, seconds apart and long past, as edits by a person have: recent
 * mtimes are deliberately not cached by the plan (see test_plan__racy_edit_is_not_missed). */
static long fake_clock = 1600000000;

static void put(const char *rel, const char *text)
{
    char *p = write_rel(rel, text);
    struct timespec ts[2] = {{fake_clock, 0}, {fake_clock, 0}};
    fake_clock += 10;
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    free(p);
}

static void mkdir_rel(const char *rel)
{
    char *p = abs_path(rel);
    assert_int_equal(mkdir(p, 0755), 0);
    free(p);
}

static void mv(const char *from, const char *to)
{
    char *a = abs_path(from), *b = abs_path(to);
    assert_int_equal(rename(a, b), 0);
    free(a);
    free(b);
}

static void rm_rel(const char *rel)
{
    char *p = abs_path(rel);
    assert_int_equal(remove(p), 0);
    free(p);
}

static void chmod_rel(const char *rel, mode_t mode)
{
    char *p = abs_path(rel);
    assert_int_equal(chmod(p, mode), 0);
    free(p);
}

static void symlink_rel(const char *target, const char *rel)
{
    char *p = abs_path(rel);
    assert_int_equal(symlink(target, p), 0);
    free(p);
}

/* The permission bits of rel. */
static unsigned mode_rel(const char *rel)
{
    struct stat st;
    char *p = abs_path(rel);
    assert_int_equal(lstat(p, &st), 0);
    free(p);
    return st.st_mode & 07777;
}

/* Moves the mtime on: a "touch" that keeps the content. */
static void touch_rel(const char *rel)
{
    char *p = abs_path(rel);
    struct timespec ts[2] = {{fake_clock, 0}, {fake_clock, 500}};
    fake_clock += 10;
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    free(p);
}

/* ---- planning ---- */

static void plan_with(struct gs_plan *pl, struct gs_plan_opts *opts, struct gs_ignore *ig)
{
    struct gs_scan scan = GS_SCAN_INIT;
    struct gs_error err = {0};
    if (gs_scan_tree(&scan, tmpdir, ig, &err) != 0)
        fail_msg("scan: %s", err.msg);
    if (gs_plan_build(pl, tmpdir, &scan, idx, opts, &err) != 0)
        fail_msg("plan: %s", err.msg);
    gs_scan_release(&scan);
}

static void plan(struct gs_plan *pl)
{
    plan_with(pl, NULL, NULL);
}

/* The ideal executor: every op succeeds and is recorded as its reply would be. */
static void apply(const struct gs_plan *pl)
{
    for (size_t i = 0; i < pl->n_ops; i++) {
        struct gs_error err = {0};
        if (gs_plan_record(idx, &pl->ops[i], &err) != 0)
            fail_msg("record: %s", err.msg);
    }
}

static void sync_all(void)
{
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl); /* converged: nothing left to do */
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
}

static const struct gs_plan_op *find_op(const struct gs_plan *pl, enum gs_op_type t,
                                        const char *path)
{
    for (size_t i = 0; i < pl->n_ops; i++)
        if (pl->ops[i].type == t && !strcmp(pl->ops[i].path, path))
            return &pl->ops[i];
    return NULL;
}

static size_t op_index(const struct gs_plan *pl, enum gs_op_type t, const char *path)
{
    const struct gs_plan_op *op = find_op(pl, t, path);
    if (!op)
        fail_msg("no %s %s in the plan", gs_plan_op_name(t), path);
    return (size_t)(op - pl->ops);
}

static size_t count_ops(const struct gs_plan *pl, enum gs_op_type t)
{
    size_t n = 0;
    for (size_t i = 0; i < pl->n_ops; i++)
        n += pl->ops[i].type == t;
    return n;
}

static void dump(const struct gs_plan *pl)
{
    struct gs_buf b = GS_BUF_INIT;
    for (size_t i = 0; i < pl->n_ops; i++) {
        gs_plan_op_format(&pl->ops[i], &b);
        gs_buf_addc(&b, '\n');
    }
    print_message("%s", b.len ? b.data : "(no ops)\n");
    gs_buf_release(&b);
}

static struct gs_hash content_hash(const char *text)
{
    struct gs_hash h;
    gs_hash_bytes(text, strlen(text), &h);
    return h;
}

/* ---- tests ---- */

static void test_plan__first_sync_creates_parents_before_children(void **state)
{
    (void)state;
    mkdir_rel("a");
    mkdir_rel("a/b");
    put("a/b/c.py", "print(1)\n");
    put("top.txt", "top");
    mkdir_rel("empty");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 5);
    assert_true(op_index(&pl, GS_OP_MKDIR, "a") < op_index(&pl, GS_OP_MKDIR, "a/b"));
    assert_true(op_index(&pl, GS_OP_MKDIR, "a/b") < op_index(&pl, GS_OP_PUT, "a/b/c.py"));
    const struct gs_plan_op *put_op = find_op(&pl, GS_OP_PUT, "a/b/c.py");
    assert_int_equal(put_op->expect.kind, GS_EXPECT_ABSENT); /* must not exist on the server */
    struct gs_hash h = content_hash("print(1)\n");
    assert_true(put_op->record.has_hash && gs_hash_equal(&put_op->record.hash, &h));
    assert_int_equal(put_op->record.size, 9);
    assert_non_null(find_op(&pl, GS_OP_MKDIR, "empty")); /* empty directories are mirrored */
    assert_int_equal(pl.bytes_to_send, 12);
    assert_null(find_op(&pl, GS_OP_MKDIR, ".gpusync"));
    gs_plan_release(&pl);
}

static void test_plan__unchanged_tree_reads_no_file(void **state)
{
    (void)state;
    put("a.py", "a");
    put("b.py", "b");
    sync_all();
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_hashed, 0); /* the stat cache vouched for both */
    gs_plan_release(&pl);
}

/* A touch (mtime moved, content not) must reach the server, where `make` compares mtimes: one
 * CHMOD that carries the mode and the new mtime and names the content the server should hold,
 * and no bytes. Recorded, the next plan sends nothing. A folder's mtime is not mirrored. */
static void test_plan__a_touch_is_one_chmod_with_the_mtime_and_no_bytes(void **state)
{
    (void)state;
    mkdir_rel("src");
    put("src/model.py", "import torch\n");
    sync_all();
    long when = fake_clock;
    touch_rel("src/model.py");
    touch_rel("src");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 1);
    const struct gs_plan_op *op = &pl.ops[0];
    assert_int_equal(op->type, GS_OP_CHMOD);
    assert_string_equal(op->path, "src/model.py");
    assert_true(op->stamp);
    assert_true(op->record.mtime_ns == (int64_t)when * 1000000000 + 500);
    assert_int_equal(op->record.mode, mode_rel("src/model.py"));
    struct gs_hash h = content_hash("import torch\n");
    assert_int_equal(op->expect.kind, GS_EXPECT_FILE);
    assert_true(gs_hash_equal(&op->expect.hash, &h));
    assert_true(pl.bytes_to_send == 0);
    assert_int_equal(pl.n_hashed, 1);
    assert_int_equal(pl.n_refreshed, 0); /* not "unchanged": a chmod sends it */
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl); /* the recorded mtime and stat cache: nothing to send, nothing to read */
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_hashed, 0);
    gs_plan_release(&pl);
}

/* A new ctime alone (a chmod to the same mode, a rewrite that put size and mtime back) has the file
 * read again, and with the same content, mode and mtime nothing is sent. */
static void test_plan__a_new_ctime_alone_sends_nothing(void **state)
{
    (void)state;
    put("model.py", "import torch\n");
    sync_all();
    chmod_rel("model.py", mode_rel("model.py")); /* the same mode: only the ctime moves */
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_hashed, 1);
    assert_int_equal(pl.n_refreshed, 1);
    gs_plan_release(&pl);
    plan(&pl); /* the refreshed cache means the next plan does not read it again */
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_hashed, 0);
    gs_plan_release(&pl);
}

static void test_plan__changed_content_is_put_expecting_old_hash(void **state)
{
    (void)state;
    put("train.py", "lr = 0.1\n");
    sync_all();
    put("train.py", "lr = 0.01\n");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 1);
    const struct gs_plan_op *op = &pl.ops[0];
    assert_int_equal(op->type, GS_OP_PUT);
    assert_int_equal(op->expect.kind, GS_EXPECT_FILE);
    struct gs_hash old = content_hash("lr = 0.1\n"), now = content_hash("lr = 0.01\n");
    assert_true(gs_hash_equal(&op->expect.hash, &old));
    assert_true(gs_hash_equal(&op->record.hash, &now));
    gs_plan_release(&pl);
}

static void test_plan__rename_becomes_one_op(void **state)
{
    (void)state;
    put("old_name.py", "def f(): pass\n");
    put("other.py", "x = 1\n");
    sync_all();
    mv("old_name.py", "new_name.py");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 1);
    const struct gs_plan_op *op = &pl.ops[0];
    assert_int_equal(op->type, GS_OP_RENAME);
    assert_string_equal(op->from, "old_name.py");
    assert_string_equal(op->path, "new_name.py");
    assert_false(op->subtree);
    struct gs_hash h = content_hash("def f(): pass\n");
    assert_int_equal(op->expect.kind, GS_EXPECT_FILE);
    assert_true(gs_hash_equal(&op->expect.hash, &h));
    assert_int_equal(pl.bytes_to_send, 0);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_hashed, 0); /* the rename kept the stat cache valid */
    gs_plan_release(&pl);
}

static void test_plan__directory_rename_is_one_op(void **state)
{
    (void)state;
    mkdir_rel("models");
    mkdir_rel("models/layers");
    put("models/net.py", "net");
    put("models/layers/conv.py", "conv");
    symlink_rel("net.py", "models/alias.py");
    mkdir_rel("models/empty");
    sync_all();
    mv("models", "nets");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 1);
    assert_int_equal(pl.ops[0].type, GS_OP_RENAME);
    assert_true(pl.ops[0].subtree);
    assert_string_equal(pl.ops[0].from, "models");
    assert_string_equal(pl.ops[0].path, "nets");
    assert_int_equal(pl.ops[0].expect.kind, GS_EXPECT_DIR);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "nets/layers/conv.py", &e, NULL), 1);
    gs_index_entry_release(&e);
    assert_int_equal(gs_index_get(idx, "models/layers/conv.py", &e, NULL), 0);
}

static void test_plan__moved_directory_with_an_edit_moves_files_not_bytes(void **state)
{
    (void)state;
    mkdir_rel("d");
    put("d/a", "aaaa");
    put("d/b", "bbbb");
    sync_all();
    mv("d", "e");
    put("e/b", "changed");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    /* not one directory rename (content differs), but no unchanged byte is sent again */
    assert_int_equal(count_ops(&pl, GS_OP_RENAME), 1);
    const struct gs_plan_op *r = find_op(&pl, GS_OP_RENAME, "e/a");
    assert_non_null(r);
    assert_string_equal(r->from, "d/a");
    assert_non_null(find_op(&pl, GS_OP_PUT, "e/b"));
    assert_int_equal(pl.bytes_to_send, 7);
    /* the new directory exists before the rename that needs it; the old one goes last */
    assert_true(op_index(&pl, GS_OP_MKDIR, "e") < op_index(&pl, GS_OP_RENAME, "e/a"));
    assert_true(op_index(&pl, GS_OP_DELETE, "d/b") < op_index(&pl, GS_OP_DELETE, "d"));
    assert_int_equal(pl.n_ops, 5);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
}

static void test_plan__delete_only_what_gpusync_wrote(void **state)
{
    (void)state;
    put("keep.py", "k");
    put("doomed.py", "d");
    put("notes.log", "secret log");
    sync_all();
    rm_rel("doomed.py");
    /* a path the index never held (e.g. written by the job on the server) is never planned for
     * deletion: only index entries can become deletes */
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "outputs/ckpt.pt", &e, NULL), 0);
    /* a path synced earlier but ignored now stays on the server */
    put(".gitignore", "*.log\n");
    rm_rel("notes.log");
    struct gs_ignore *ig = NULL;
    assert_int_equal(gs_ignore_open(&ig, tmpdir, NULL, 0, NULL), 0);
    struct gs_plan_opts opts = {.ignore = ig};
    struct gs_plan pl = GS_PLAN_INIT;
    plan_with(&pl, &opts, ig);
    dump(&pl);
    assert_int_equal(count_ops(&pl, GS_OP_DELETE), 1);
    const struct gs_plan_op *d = find_op(&pl, GS_OP_DELETE, "doomed.py");
    assert_non_null(d);
    struct gs_hash h = content_hash("d");
    assert_int_equal(d->expect.kind, GS_EXPECT_FILE);
    assert_true(gs_hash_equal(&d->expect.hash, &h));
    assert_null(find_op(&pl, GS_OP_DELETE, "notes.log"));
    assert_non_null(find_op(&pl, GS_OP_PUT, ".gitignore"));
    assert_int_equal(pl.n_ops, 2);
    gs_plan_release(&pl);
    gs_ignore_free(ig);
}

static int index_has(const char *path);

/* Marks the index entry of `path` as written by pull (index.h, `pulled`). */
static void mark_pulled(const char *path)
{
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, path, &e, NULL), 1);
    e.pulled = 1;
    assert_int_equal(gs_index_put(idx, &e, NULL), 0);
    gs_index_entry_release(&e);
}

/* A pulled file is the server's: unchanged, nothing is planned; edited, it is put expecting what
 * was pulled and recorded as gpusync's; deleted, no delete is planned and the index forgets it
 * (not with no_refresh); moved, the move is a new file, not a rename of the server's. */
static void test_plan__a_pulled_file_is_sent_only_once_edited_here(void **state)
{
    (void)state;
    mkdir_rel("out");
    put("out/edited.pt", "epoch 1");
    put("out/deleted.pt", "epoch 1, deleted");
    put("out/moved.pt", "epoch 1, moved");
    sync_all();
    mark_pulled("out/edited.pt");
    mark_pulled("out/deleted.pt");
    mark_pulled("out/moved.pt");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);

    rm_rel("out/deleted.pt");
    struct gs_plan_opts ro = {.no_refresh = 1};
    plan_with(&pl, &ro, NULL);
    dump(&pl);
    assert_int_equal(pl.n_ops, 0);
    assert_true(index_has("out/deleted.pt")); /* a read-only plan writes nothing */
    gs_plan_release(&pl);

    put("out/edited.pt", "epoch 1, edited here");
    mv("out/moved.pt", "out/moved-here.pt");
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 2);
    const struct gs_plan_op *op = find_op(&pl, GS_OP_PUT, "out/edited.pt");
    assert_non_null(op);
    struct gs_hash h = content_hash("epoch 1");
    assert_int_equal(op->expect.kind, GS_EXPECT_FILE);
    assert_true(gs_hash_equal(&op->expect.hash, &h));
    assert_false(op->record.pulled);
    op = find_op(&pl, GS_OP_PUT, "out/moved-here.pt");
    assert_non_null(op);
    assert_int_equal(op->expect.kind, GS_EXPECT_ABSENT);
    assert_false(index_has("out/deleted.pt"));
    assert_false(index_has("out/moved.pt"));
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
    struct gs_index_entry e;
    assert_int_equal(gs_index_get(idx, "out/edited.pt", &e, NULL), 1);
    assert_false(e.pulled);
    gs_index_entry_release(&e);
}

/* A pulled file's mtime is its writer's (a job on the server): touched here, nothing is sent. */
static void test_plan__a_touched_pulled_file_sends_nothing(void **state)
{
    (void)state;
    mkdir_rel("out");
    put("out/ckpt.pt", "epoch 1");
    sync_all();
    mark_pulled("out/ckpt.pt");
    touch_rel("out/ckpt.pt");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 0);
    assert_int_equal(pl.n_refreshed, 1);
    gs_plan_release(&pl);
}

static void test_plan__chmod_only(void **state)
{
    (void)state;
    put("run.sh", "#!/bin/sh\necho hi\n");
    mkdir_rel("bin");
    sync_all();
    chmod_rel("run.sh", 0755);
    chmod_rel("bin", 0700);
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 2);
    const struct gs_plan_op *c = find_op(&pl, GS_OP_CHMOD, "run.sh");
    assert_non_null(c);
    assert_int_equal(c->record.mode, 0755);
    struct gs_hash h = content_hash("#!/bin/sh\necho hi\n");
    assert_true(c->record.has_hash && gs_hash_equal(&c->record.hash, &h));
    assert_int_equal(find_op(&pl, GS_OP_CHMOD, "bin")->record.mode, 0700);
    assert_int_equal(pl.bytes_to_send, 0);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
}

static void test_plan__symlink_created_retargeted_and_replacing_a_file(void **state)
{
    (void)state;
    put("data.bin", "x");
    put("cfg.yaml", "a: 1\n");
    symlink_rel("/datasets/imagenet", "imagenet");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    const struct gs_plan_op *s = find_op(&pl, GS_OP_SYMLINK, "imagenet");
    assert_non_null(s);
    assert_string_equal(s->record.link, "/datasets/imagenet");
    assert_int_equal(s->expect.kind, GS_EXPECT_ABSENT);
    apply(&pl);
    gs_plan_release(&pl);

    rm_rel("imagenet");
    symlink_rel("/mnt/imagenet", "imagenet");
    rm_rel("cfg.yaml");
    symlink_rel("configs/base.yaml", "cfg.yaml");
    plan(&pl);
    dump(&pl);
    assert_int_equal(pl.n_ops, 2);
    s = find_op(&pl, GS_OP_SYMLINK, "imagenet");
    assert_int_equal(s->expect.kind, GS_EXPECT_SYMLINK);
    assert_string_equal(s->expect.link, "/datasets/imagenet");
    assert_string_equal(s->record.link, "/mnt/imagenet");
    s = find_op(&pl, GS_OP_SYMLINK, "cfg.yaml");
    assert_int_equal(s->expect.kind, GS_EXPECT_FILE); /* replaces the file the index knows */
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
}

static void test_plan__file_replaced_by_directory_is_deleted_first(void **state)
{
    (void)state;
    put("x", "was a file");
    mkdir_rel("y");
    put("y/inner", "i");
    sync_all();
    rm_rel("x");
    mkdir_rel("x");
    put("x/f", "now a dir");
    rm_rel("y/inner");
    rm_rel("y");
    put("y", "now a file");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    size_t del_x = op_index(&pl, GS_OP_DELETE, "x");
    size_t del_y = op_index(&pl, GS_OP_DELETE, "y");
    size_t del_yi = op_index(&pl, GS_OP_DELETE, "y/inner");
    assert_true(del_x < op_index(&pl, GS_OP_MKDIR, "x"));
    assert_true(op_index(&pl, GS_OP_MKDIR, "x") < op_index(&pl, GS_OP_PUT, "x/f"));
    assert_true(del_yi < del_y && del_y < op_index(&pl, GS_OP_PUT, "y"));
    assert_int_equal(find_op(&pl, GS_OP_PUT, "y")->expect.kind, GS_EXPECT_ABSENT);
    apply(&pl);
    gs_plan_release(&pl);
    plan(&pl);
    assert_int_equal(pl.n_ops, 0);
    gs_plan_release(&pl);
}

/* One of everything: phases never go backwards, mkdirs parent-first, deletes children-first. */
static void test_plan__ops_follow_the_documented_order(void **state)
{
    (void)state;
    mkdir_rel("gone");
    mkdir_rel("gone/sub");
    put("gone/sub/f", "f");
    put("gone/g", "g");
    put("mv_src", "moved content");
    put("mode", "m");
    put("edit", "1");
    sync_all();
    rm_rel("gone/sub/f");
    rm_rel("gone/sub");
    rm_rel("gone/g");
    rm_rel("gone");
    mv("mv_src", "mv_dst");
    chmod_rel("mode", 0600);
    put("edit", "2");
    mkdir_rel("n");
    mkdir_rel("n/m");
    put("n/m/new", "new");
    symlink_rel("edit", "ln");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    dump(&pl);
    static const int rank[] = {[GS_OP_RENAME] = 0,  [GS_OP_MKDIR] = 1, [GS_OP_PUT] = 2,
                               [GS_OP_SYMLINK] = 3, [GS_OP_CHMOD] = 4, [GS_OP_DELETE] = 5};
    for (size_t i = 1; i < pl.n_ops; i++)
        assert_true(rank[pl.ops[i - 1].type] <= rank[pl.ops[i].type]);
    assert_int_equal(pl.ops[0].type, GS_OP_RENAME);
    assert_true(op_index(&pl, GS_OP_MKDIR, "n") < op_index(&pl, GS_OP_MKDIR, "n/m"));
    assert_true(op_index(&pl, GS_OP_DELETE, "gone/sub/f") <
                op_index(&pl, GS_OP_DELETE, "gone/sub"));
    assert_true(op_index(&pl, GS_OP_DELETE, "gone/sub") < op_index(&pl, GS_OP_DELETE, "gone"));
    assert_true(op_index(&pl, GS_OP_DELETE, "gone/g") < op_index(&pl, GS_OP_DELETE, "gone"));
    assert_int_equal(pl.n_ops, 11);
    gs_plan_release(&pl);
}

static void test_plan__restricted_to_paths(void **state)
{
    (void)state;
    mkdir_rel("a");
    put("a/x", "x");
    put("b", "b");
    sync_all();
    put("a/x", "x2");
    put("b", "b2");
    mkdir_rel("c");
    mkdir_rel("c/d");
    put("c/d/new.py", "n");
    put("c/other", "o");
    const char *paths[] = {"a", "c/d/new.py"};
    struct gs_plan_opts opts = {.paths = paths, .n_paths = 2};
    struct gs_plan pl = GS_PLAN_INIT;
    plan_with(&pl, &opts, NULL);
    dump(&pl);
    assert_non_null(find_op(&pl, GS_OP_PUT, "a/x"));
    assert_non_null(find_op(&pl, GS_OP_MKDIR, "c")); /* the parents it needs */
    assert_non_null(find_op(&pl, GS_OP_MKDIR, "c/d"));
    assert_non_null(find_op(&pl, GS_OP_PUT, "c/d/new.py"));
    assert_int_equal(pl.n_ops, 4); /* not b, not c/other */
    gs_plan_release(&pl);
}

static void test_plan__format_keeps_hostile_names_on_one_line(void **state)
{
    (void)state;
    put("two\nlines \"q\"", "1");
    put("caf\xc3\xa9.py", "2");
    put("bad\xff", "3");
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    struct gs_buf b = GS_BUF_INIT;
    for (size_t i = 0; i < pl.n_ops; i++) {
        gs_buf_reset(&b);
        gs_plan_op_format(&pl.ops[i], &b);
        assert_null(strchr(b.data, '\n'));
    }
    gs_buf_reset(&b);
    gs_plan_op_format(find_op(&pl, GS_OP_PUT, "two\nlines \"q\""), &b);
    assert_string_equal(b.data, "put      \"two\\nlines \\\"q\\\"\" (1 bytes, new)");
    gs_buf_reset(&b);
    gs_plan_quote_path(&b, "caf\xc3\xa9.py");
    assert_string_equal(b.data, "caf\xc3\xa9.py"); /* valid UTF-8 stays readable */
    gs_buf_reset(&b);
    gs_plan_quote_path(&b, "bad\xff");
    assert_string_equal(b.data, "\"bad\\xff\"");
    gs_buf_release(&b);
    gs_plan_release(&pl);
}

/* Written twice within one timestamp tick with the same size: the stat cannot tell the versions
 * apart, so a fresh file's stat is not cached and the second version is still sent. */
static void test_plan__racy_edit_is_not_missed(void **state)
{
    (void)state;
    char *p = write_rel("fast.txt", "v1");
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    sync_all();
    free(write_rel("fast.txt", "v2"));
    struct timespec ts[2] = {st.st_atim, st.st_mtim}; /* the same tick as v1 */
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 1);
    assert_int_equal(pl.ops[0].type, GS_OP_PUT);
    struct gs_hash h = content_hash("v2");
    assert_true(gs_hash_equal(&pl.ops[0].record.hash, &h));
    gs_plan_release(&pl);
    free(p);
}

/* An edit that puts the size and the mtime back (touch -d, cp -p, tar x of another version) on a
 * file whose stat the index caches: the ctime, which nobody can set, still moved, so the plan reads
 * the file and sends the new content. (Before, the stat cache vouched for the old content.) */
static void test_plan__an_edit_that_restores_size_and_mtime_is_read(void **state)
{
    (void)state;
    put("config.yaml", "lr: 0.1\n");
    sync_all();
    char *p = abs_path("config.yaml");
    struct stat cached, now;
    assert_int_equal(stat(p, &cached), 0);
    do { /* a rewrite within the ctime's clock tick (a few ms) would not move it: the next tick */
        usleep(5000);
        free(write_rel("config.yaml", "lr: 0.9\n"));
        struct timespec ts[2] = {cached.st_atim, cached.st_mtim};
        assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
        assert_int_equal(stat(p, &now), 0);
    } while (now.st_ctim.tv_sec == cached.st_ctim.tv_sec &&
             now.st_ctim.tv_nsec == cached.st_ctim.tv_nsec);
    assert_int_equal(now.st_size, cached.st_size);
    struct gs_plan pl = GS_PLAN_INIT;
    plan(&pl);
    assert_int_equal(pl.n_ops, 1);
    assert_int_equal(pl.ops[0].type, GS_OP_PUT);
    struct gs_hash h = content_hash("lr: 0.9\n");
    assert_true(gs_hash_equal(&pl.ops[0].record.hash, &h));
    gs_plan_release(&pl);
    free(p);
}

/* The reading callback records what it was told and stops the plan at the call given (0:
 * never). */
struct stop_at {
    int calls, stop_at;
    struct gs_plan_reading last;
    int monotonic; /* bytes_done never went back */
};

static int count_and_stop(void *ctx, const struct gs_plan_reading *r)
{
    struct stop_at *s = ctx;
    if (s->calls && r->bytes_done < s->last.bytes_done)
        s->monotonic = 0;
    s->last = *r;
    return ++s->calls == s->stop_at;
}

/* A watch daemon told to stop must not wait for the hash of a large file, and its status says
 * how far the reading has got: the plan tells its callback how many of the bytes it must read
 * it has read, every few files and about every GS_HASH_CHECK_BYTES inside one, and a nonzero
 * answer ends the plan with GS_E_INTERRUPTED, nothing planned and nothing recorded. */
static void test_plan__reading_is_reported_and_can_stop_the_plan_inside_a_large_file(void **state)
{
    (void)state;
    put("small", "s");
    sync_all();
    put("small", "s2"); /* changed: read again, with big.bin */
    char *big = abs_path("big.bin");
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    /* 5 check intervals, written (not sparse), so the reads are the file's bytes */
    char *chunk = calloc(1, GS_HASH_CHECK_BYTES);
    for (int i = 0; i < 5; i++) {
        chunk[0] = (char)i;
        assert_int_equal(write(fd, chunk, GS_HASH_CHECK_BYTES), GS_HASH_CHECK_BYTES);
    }
    close(fd);
    free(chunk);
    free(big);
    uint64_t total = 5ull * GS_HASH_CHECK_BYTES + 2;

    struct gs_scan scan = GS_SCAN_INIT;
    assert_int_equal(gs_scan_tree(&scan, tmpdir, NULL, NULL), 0);
    struct stop_at never = {.monotonic = 1};
    struct gs_plan_opts opts = {.reading = count_and_stop, .reading_ctx = &never};
    struct gs_plan pl = GS_PLAN_INIT;
    assert_int_equal(gs_plan_build(&pl, tmpdir, &scan, idx, &opts, NULL), 0);
    assert_int_equal(pl.n_ops, 2);
    /* told before the files, then once per 4 MB of big.bin: the hash itself tells */
    assert_true(never.calls >= 6);
    assert_true(never.monotonic);
    assert_int_equal(never.last.files_total, 2);
    assert_int_equal(never.last.bytes_total, total);
    assert_true(never.last.bytes_done >= 5ull * GS_HASH_CHECK_BYTES); /* the last 4 MB told */
    gs_plan_release(&pl);

    struct stop_at second = {.stop_at = 2}; /* the first call inside big.bin */
    opts.reading_ctx = &second;
    struct gs_error err = {0};
    assert_int_equal(gs_plan_build(&pl, tmpdir, &scan, idx, &opts, &err), GS_E_INTERRUPTED);
    assert_int_equal(second.calls, 2);
    assert_int_equal(second.last.bytes_done, GS_HASH_CHECK_BYTES);
    assert_int_equal(pl.n_ops, 0);
    assert_false(index_has("big.bin"));
    gs_plan_release(&pl);
    gs_scan_release(&scan);
}

static void test_plan__vanished_file_counts_as_deleted(void **state)
{
    (void)state;
    put("tmp.txt", "t");
    put("keep", "k");
    sync_all();
    put("tmp.txt", "changed"); /* stat differs: the plan must read it */
    struct gs_scan scan = GS_SCAN_INIT;
    assert_int_equal(gs_scan_tree(&scan, tmpdir, NULL, NULL), 0);
    rm_rel("tmp.txt"); /* gone between scan and plan */
    struct gs_plan pl = GS_PLAN_INIT;
    assert_int_equal(gs_plan_build(&pl, tmpdir, &scan, idx, NULL, NULL), 0);
    assert_int_equal(pl.n_ops, 1);
    assert_non_null(find_op(&pl, GS_OP_DELETE, "tmp.txt"));
    gs_plan_release(&pl);
    gs_scan_release(&scan);
}

/* A file replaced by a symlink or a directory between the scan and the hash is planned as removed,
 * as a vanished one is: the watcher reports the new kind, and failing the whole plan would hold
 * back every other change of the batch (a live-sync race under load). */
static void test_plan__file_that_changed_kind_after_the_scan_counts_as_deleted(void **state)
{
    (void)state;
    put("link.txt", "l");
    put("dir.txt", "d");
    put("keep", "k");
    sync_all();
    put("link.txt", "changed"); /* stat differs: the plan must read them */
    put("dir.txt", "changed");
    put("keep", "kept too");
    struct gs_scan scan = GS_SCAN_INIT;
    assert_int_equal(gs_scan_tree(&scan, tmpdir, NULL, NULL), 0);
    rm_rel("link.txt"); /* both change kind between scan and plan */
    symlink_rel("keep", "link.txt");
    rm_rel("dir.txt");
    mkdir_rel("dir.txt");
    struct gs_plan pl = GS_PLAN_INIT;
    struct gs_error err = {0};
    if (gs_plan_build(&pl, tmpdir, &scan, idx, NULL, &err) != 0)
        fail_msg("plan: %s", err.msg);
    dump(&pl);
    assert_int_equal(pl.n_ops, 3);
    assert_non_null(find_op(&pl, GS_OP_DELETE, "link.txt"));
    assert_non_null(find_op(&pl, GS_OP_DELETE, "dir.txt"));
    assert_non_null(find_op(&pl, GS_OP_PUT, "keep"));
    gs_plan_release(&pl);
    gs_scan_release(&scan);
}

/* ---- a simulated server: a mirror directory that applies each op after checking its
 * expectation, the way the agent would refuse to clobber a server-side change ---- */

static char mirror[64];

static char *mirror_path(const char *rel)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, mirror, rel);
    return gs_buf_detach(&p, NULL);
}

static void check_expect(const char *rel, const struct gs_plan_expect *ex)
{
    char *p = mirror_path(rel);
    struct stat st;
    int there = lstat(p, &st) == 0;
    char link[4096];
    ssize_t n;
    struct gs_hash h;
    switch (ex->kind) {
    case GS_EXPECT_ABSENT:
        if (there)
            fail_msg("mirror: %s exists, the plan expected nothing there", rel);
        break;
    case GS_EXPECT_DIR:
        if (!there || !S_ISDIR(st.st_mode))
            fail_msg("mirror: %s is not the directory the plan expected", rel);
        break;
    case GS_EXPECT_SYMLINK:
        n = there && S_ISLNK(st.st_mode) ? readlink(p, link, sizeof(link) - 1) : -1;
        if (n < 0 || (link[n] = '\0', strcmp(link, ex->link)))
            fail_msg("mirror: %s is not the symlink the plan expected", rel);
        break;
    case GS_EXPECT_FILE:
        if (!there || !S_ISREG(st.st_mode) || gs_hash_file(p, &h, NULL) ||
            !gs_hash_equal(&h, &ex->hash))
            fail_msg("mirror: %s is not the file the plan expected", rel);
        break;
    }
    free(p);
}

static void mirror_copy(const char *rel, const char *dst, unsigned mode)
{
    char *src = abs_path(rel);
    char tmp[128], buf[4096];
    snprintf(tmp, sizeof(tmp), "%s/.tmp-put", mirror);
    int in = open(src, O_RDONLY), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(in >= 0 && out >= 0);
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    assert_int_equal(chmod(tmp, mode), 0);
    assert_int_equal(rename(tmp, dst), 0);
    free(src);
}

static void mirror_apply(const struct gs_plan_op *op)
{
    static const struct gs_plan_expect absent = {.kind = GS_EXPECT_ABSENT};
    char *dst = mirror_path(op->path);
    check_expect(op->type == GS_OP_RENAME ? op->from : op->path, &op->expect);
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s/.tmp-link", mirror);
    switch (op->type) {
    case GS_OP_RENAME: {
        check_expect(op->path, &absent);
        char *src = mirror_path(op->from);
        assert_int_equal(rename(src, dst), 0);
        free(src);
        break;
    }
    case GS_OP_MKDIR:
        assert_int_equal(mkdir(dst, 0700), 0);
        assert_int_equal(chmod(dst, op->record.mode), 0);
        break;
    case GS_OP_PUT:
        mirror_copy(op->path, dst, op->record.mode);
        break;
    case GS_OP_SYMLINK:
        assert_int_equal(symlink(op->record.link, tmp), 0);
        assert_int_equal(rename(tmp, dst), 0);
        break;
    case GS_OP_CHMOD:
        assert_int_equal(chmod(dst, op->record.mode), 0);
        break;
    case GS_OP_DELETE:
        assert_int_equal(op->expect.kind == GS_EXPECT_DIR ? rmdir(dst) : unlink(dst), 0);
        break;
    }
    assert_int_equal(gs_plan_record(idx, op, NULL), 0);
    free(dst);
}

static void scan_of(const char *root, struct gs_scan *s)
{
    assert_int_equal(gs_scan_tree(s, root, NULL, NULL), 0);
}

/* The mirror holds exactly the local tree: paths, kinds, modes, bytes, link targets. */
static void assert_mirror_matches(void)
{
    struct gs_scan l = GS_SCAN_INIT, m = GS_SCAN_INIT;
    scan_of(tmpdir, &l);
    scan_of(mirror, &m);
    for (size_t i = 0; i < l.n || i < m.n; i++) {
        const struct gs_scan_entry *a = i < l.n ? &l.entries[i] : NULL;
        const struct gs_scan_entry *b = i < m.n ? &m.entries[i] : NULL;
        if (!a || !b || strcmp(a->path, b->path))
            fail_msg("trees differ at local %s / mirror %s", a ? a->path : "(end)",
                     b ? b->path : "(end)");
        assert_int_equal(a->kind, b->kind);
        if (a->kind == GS_KIND_SYMLINK) {
            assert_string_equal(a->link, b->link);
            continue;
        }
        assert_int_equal(a->mode, b->mode);
        if (a->kind != GS_KIND_FILE)
            continue;
        char *pa = abs_path(a->path), *pb = mirror_path(b->path);
        struct gs_hash ha, hb;
        assert_int_equal(gs_hash_file(pa, &ha, NULL), 0);
        assert_int_equal(gs_hash_file(pb, &hb, NULL), 0);
        assert_true(gs_hash_equal(&ha, &hb));
        free(pa);
        free(pb);
    }
    gs_scan_release(&l);
    gs_scan_release(&m);
}

/* ---- random changes ---- */

static unsigned rng;

static unsigned rnd(unsigned n)
{
    rng = rng * 1103515245u + 12345u;
    return (rng >> 16) % n;
}

static const char *const pool[] = {"a", "b", "c d", "e\nf", "g.py", "h\xff"};

/* A name from a small pool under a random existing directory (or the root), so that paths collide
 * and contents repeat. */
static void random_path(char *out, size_t cap)
{
    struct gs_scan s = GS_SCAN_INIT;
    scan_of(tmpdir, &s);
    const char *dir = NULL;
    for (int tries = 0; tries < 4 && s.n && !dir; tries++) {
        const struct gs_scan_entry *e = &s.entries[rnd((unsigned)s.n)];
        if (e->kind == GS_KIND_DIR && rnd(3))
            dir = e->path;
    }
    snprintf(out, cap, "%s%s%s", dir ? dir : "", dir ? "/" : "", pool[rnd(6)]);
    gs_scan_release(&s);
}

/* 1 when rel's parent directory exists (as a real directory) and rel itself does not. */
static int free_slot(const char *rel)
{
    char *p = abs_path(rel);
    struct stat st;
    int ok = lstat(p, &st) < 0;
    char *slash = strrchr(p, '/');
    *slash = '\0';
    ok = ok && lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
    free(p);
    return ok;
}

/* A random existing entry (not the root), or NULL when the tree is empty. */
static char *random_entry(void)
{
    struct gs_scan s = GS_SCAN_INIT;
    scan_of(tmpdir, &s);
    char *pick = s.n ? strdup(s.entries[rnd((unsigned)s.n)].path) : NULL;
    gs_scan_release(&s);
    return pick;
}

static void remove_tree(const char *rel)
{
    struct gs_scan s = GS_SCAN_INIT;
    assert_int_equal(gs_scan_subtree(&s, tmpdir, rel, NULL, NULL), 0);
    for (size_t i = s.n; i-- > 0;) /* children sort after their parent */
        rm_rel(s.entries[i].path);
    gs_scan_release(&s);
}

static void random_content(const char *rel)
{
    char text[64];
    snprintf(text, sizeof(text), "content %u\n", rnd(5)); /* few contents: renames happen */
    free(write_rel(rel, text));
}

static void mutate_existing(unsigned what)
{
    char *e = random_entry(), to[64];
    if (!e)
        return;
    char *p = abs_path(e);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    if (what == 0) {
        remove_tree(e);
    } else if (what == 1) {
        random_path(to, sizeof(to));
        size_t n = strlen(e);
        if (free_slot(to) && !(strncmp(to, e, n) == 0 && to[n] == '/'))
            mv(e, to);
    } else if (what == 2 && !S_ISLNK(st.st_mode)) {
        chmod_rel(e, S_ISDIR(st.st_mode) ? ((st.st_mode & 0777) == 0755 ? 0700 : 0755)
                                         : ((st.st_mode & 0777) == 0644 ? 0755 : 0644));
    } else if (what == 3 && S_ISREG(st.st_mode)) {
        random_content(e);
    } else if (what == 4 && S_ISREG(st.st_mode)) {
        struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}}; /* touch */
        assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    } else if (what == 5) { /* a file becomes a directory, or the reverse */
        remove_tree(e);
        if (S_ISDIR(st.st_mode))
            random_content(e);
        else
            mkdir_rel(e);
    }
    free(p);
    free(e);
}

static void mutate(void)
{
    char rel[64];
    unsigned what = rnd(16);
    if (what < 6 || what == 15) {
        mutate_existing(what == 15 ? 1 : what); /* renames twice as often */
        return;
    }
    random_path(rel, sizeof(rel));
    if (!free_slot(rel))
        return;
    if (what < 11)
        random_content(rel);
    else if (what < 14)
        mkdir_rel(rel);
    else
        symlink_rel(rnd(2) ? "../a" : "/outside/target", rel);
}

/* Random edits, a push after each batch, and the mirror must equal the tree every time: the plan
 * converges, its order is executable, its expectations hold, and a second plan is empty. */
static void test_plan__random_changes_converge(void **state)
{
    (void)state;
    const char *env = getenv("GS_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    print_message("test_plan__random_changes_converge: GS_TEST_SEED=%u\n", seed);
    rng = seed;
    strcpy(mirror, "/tmp/gs-test-mirror-XXXXXX");
    assert_non_null(mkdtemp(mirror));
    size_t by_type[GS_OP_DELETE + 1] = {0}, subtree_renames = 0;
    for (int round = 0; round < 150; round++) {
        for (unsigned k = 0, n = 1 + rnd(6); k < n; k++)
            mutate();
        struct gs_plan pl = GS_PLAN_INIT;
        plan(&pl);
        for (size_t i = 0; i < pl.n_ops; i++) {
            mirror_apply(&pl.ops[i]);
            by_type[pl.ops[i].type]++;
            subtree_renames += pl.ops[i].subtree;
        }
        gs_plan_release(&pl);
        assert_mirror_matches();
        plan(&pl);
        if (pl.n_ops)
            dump(&pl);
        assert_int_equal(pl.n_ops, 0);
        gs_plan_release(&pl);
    }
    print_message("ops: %zu rename (%zu of directories), %zu mkdir, %zu put, %zu symlink, "
                  "%zu chmod, %zu delete\n",
                  by_type[GS_OP_RENAME], subtree_renames, by_type[GS_OP_MKDIR], by_type[GS_OP_PUT],
                  by_type[GS_OP_SYMLINK], by_type[GS_OP_CHMOD], by_type[GS_OP_DELETE]);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", mirror);
    assert_int_equal(system(cmd), 0);
}

/* A file truncated between the scan and its reading (an editor's save caught in the middle) is
 * planned as what was read: size 0 with the truncation's mtime, never the old size with the
 * empty content's hash, which the watch daemon could not tell from a finished save. */
static void test_plan__a_file_changed_after_the_scan_is_planned_as_read(void **state)
{
    (void)state;
    put("model.py", "weights = 1\n");
    sync_all();
    put("model.py", "weights = 2\n");
    struct gs_scan scan = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&scan, tmpdir, NULL, &err), 0);
    free(write_rel("model.py", "")); /* truncated after the scan, its mtime now */
    struct gs_plan pl = GS_PLAN_INIT;
    assert_int_equal(gs_plan_build(&pl, tmpdir, &scan, idx, NULL, &err), 0);
    gs_scan_release(&scan);
    const struct gs_plan_op *op = find_op(&pl, GS_OP_PUT, "model.py");
    assert_non_null(op);
    struct gs_hash empty = content_hash("");
    assert_true(gs_hash_equal(&op->record.hash, &empty));
    assert_int_equal(op->record.size, 0);
    assert_true(op->record.mtime_ns > (int64_t)fake_clock * 1000000000);
    gs_plan_release(&pl);
}

/* ---- holding operations back (syncd/push.h, the watch daemon's saves in progress) ---- */

/* A hold callback that holds everything it is asked about and, on its first call, makes `remake`
 * again: the user recreates a directory between the batch's scan and its hold decisions. */
struct hold_all {
    const char *remake;
    size_t asked;
};

static int hold_everything(void *ctx, const struct gs_plan_op *op)
{
    struct hold_all *h = ctx;
    (void)op;
    if (h->asked++ == 0 && h->remake)
        mkdir_rel(h->remake);
    return 1;
}

/* A change inside a directory the plan deletes is never held back: the directory's delete would
 * be refused as not empty, and the server would keep it as a conflict nobody caused. Found by
 * test_watch's random operations: the directory was made again after the scan, so the local tree
 * showed it standing when the holds were decided. */
static void test_plan__a_change_inside_a_deleted_directory_is_never_held(void **state)
{
    (void)state;
    mkdir_rel("d");
    mkdir_rel("d/n0");
    put("d/n0/f", "f");
    put("d/n0/g", "g");
    put("a.txt", "a");
    sync_all();
    put("a.txt", "a, edited"); /* the first op asked about: its hold remakes d/n0 */
    mv("d/n0/g", "d/g");
    rm_rel("d/n0/f");
    rm_rel("d/n0");
    struct hold_all h = {.remake = "d/n0"};
    struct gs_push_opts o = {.hold = hold_everything, .ctx = &h};
    struct gs_plan pl = GS_PLAN_INIT;
    struct gs_push_stats st;
    struct gs_error err = {0};
    if (gs_push_plan(tmpdir, NULL, idx, &o, &pl, &st, &err) != 0)
        fail_msg("plan: %s", err.msg);
    dump(&pl);
    assert_true(h.asked >= 1);
    assert_null(find_op(&pl, GS_OP_PUT, "a.txt")); /* held, as asked */
    assert_true(op_index(&pl, GS_OP_RENAME, "d/g") < op_index(&pl, GS_OP_DELETE, "d/n0"));
    assert_true(op_index(&pl, GS_OP_DELETE, "d/n0/f") < op_index(&pl, GS_OP_DELETE, "d/n0"));
    gs_plan_release(&pl);
}

/* A stand-in for the server that answers each request at once: the delete of `refused` fails
 * (EIO) and so, as rmdir would then, does the delete of any directory. Only the executor's
 * reading of replies is under test here; the real agent's answers are tested in
 * tests/integration and tests/e2e. */
struct scripted_server {
    struct gs_fileops ops;
    const char *refused;
};

static int scripted_submit(struct gs_fileops *ops, const struct gs_fop_req *req,
                           struct gs_error *err)
{
    (void)err;
    struct scripted_server *s = (struct scripted_server *)ops;
    struct gs_fop_result r = {.ok = 1};
    if (req->type == GS_FOP_DELETE && !strcmp(req->path, s->refused))
        r = (struct gs_fop_result){.err_no = EIO, .message = "input/output error"};
    else if (req->type == GS_FOP_DELETE && req->expect == GS_FOP_EXPECT_DIR)
        r = (struct gs_fop_result){.err_no = ENOTEMPTY, .message = "directory not empty"};
    ops->done(ops->done_ctx, req->ctx, &r);
    return 0;
}

static int scripted_drain(struct gs_fileops *ops, struct gs_error *err)
{
    (void)ops, (void)err;
    return 0;
}

static int index_has(const char *path)
{
    struct gs_index_entry e;
    int rc = gs_index_get(idx, path, &e, NULL);
    if (rc == 1)
        gs_index_entry_release(&e);
    return rc == 1;
}

/* A directory the server refuses to remove while a file gpusync put there is still in it (its
 * delete failed) is a failure to retry, not a conflict copy: the directory stays in the index, so
 * the next push removes it once the file is gone. */
static void test_plan__a_directory_left_full_by_a_failed_delete_is_no_conflict(void **state)
{
    (void)state;
    mkdir_rel("d");
    put("d/f", "f");
    sync_all();
    rm_rel("d/f");
    rm_rel("d");
    struct scripted_server server = {.ops = {.submit = scripted_submit, .drain = scripted_drain},
                                     .refused = "d/f"};
    struct gs_push_opts o = {0};
    struct gs_plan pl = GS_PLAN_INIT;
    struct gs_push_stats st;
    struct gs_error err = {0};
    assert_int_equal(gs_push_plan(tmpdir, NULL, idx, &o, &pl, &st, &err), 0);
    assert_int_equal(gs_push_execute(tmpdir, idx, &server.ops, &o, &pl, &st, &err), GS_E_REMOTE);
    gs_plan_release(&pl);
    assert_int_equal(st.conflicts, 0);
    assert_int_equal(st.failed, 2);
    assert_true(index_has("d/f"));
    assert_true(index_has("d"));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_plan__first_sync_creates_parents_before_children),
        T(test_plan__unchanged_tree_reads_no_file),
        T(test_plan__a_touch_is_one_chmod_with_the_mtime_and_no_bytes),
        T(test_plan__a_new_ctime_alone_sends_nothing),
        T(test_plan__a_touched_pulled_file_sends_nothing),
        T(test_plan__changed_content_is_put_expecting_old_hash),
        T(test_plan__rename_becomes_one_op),
        T(test_plan__directory_rename_is_one_op),
        T(test_plan__moved_directory_with_an_edit_moves_files_not_bytes),
        T(test_plan__delete_only_what_gpusync_wrote),
        T(test_plan__a_pulled_file_is_sent_only_once_edited_here),
        T(test_plan__chmod_only),
        T(test_plan__symlink_created_retargeted_and_replacing_a_file),
        T(test_plan__file_replaced_by_directory_is_deleted_first),
        T(test_plan__ops_follow_the_documented_order),
        T(test_plan__restricted_to_paths),
        T(test_plan__format_keeps_hostile_names_on_one_line),
        T(test_plan__racy_edit_is_not_missed),
        T(test_plan__an_edit_that_restores_size_and_mtime_is_read),
        T(test_plan__reading_is_reported_and_can_stop_the_plan_inside_a_large_file),
        T(test_plan__vanished_file_counts_as_deleted),
        T(test_plan__file_that_changed_kind_after_the_scan_counts_as_deleted),
        T(test_plan__random_changes_converge),
        T(test_plan__a_file_changed_after_the_scan_is_planned_as_read),
        T(test_plan__a_change_inside_a_deleted_directory_is_never_held),
        T(test_plan__a_directory_left_full_by_a_failed_delete_is_no_conflict),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
