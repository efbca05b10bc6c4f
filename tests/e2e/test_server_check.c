/* tests/e2e/test_server_check.c: the server is checked, not only gpusync's record of it
 * (syncd/verify.h). Files gpusync wrote are deleted, edited, chmod'ed and retargeted on the sandbox
 * server behind its back; then `push`, a `flush` through the watch daemon, and an idle daemon
 * ([sync] check_every) each put the local tree back, keeping every edited server copy as a
 * conflict copy, and a second push finds nothing to do (no file of a tree gpusync just wrote is
 * taken for changed). Without the check, each of these says "up to date" while the server lacks
 * the files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"

#define ARGS(...)     ((const char *const[]){__VA_ARGS__, NULL})
#define IDLE_CHECK_MS 15000 /* check_every = 1 in the daemon test: well inside this */

static struct gs_test_sshd sshd;

struct proj {
    char dir[64];
    char local[128];
    char remote[128];
};

static struct proj cur;

static void proj_new(struct proj *p, const char *config)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->dir, sizeof(p->dir), "/tmp/gs-e2e-check.XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->local, sizeof(p->local), "%s/local", p->dir);
    snprintf(p->remote, sizeof(p->remote), "%s/remote", p->dir);
    assert_int_equal(mkdir(p->local, 0755), 0);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", sshd.port);
    gs_test_gpusync_ok(p->local, ARGS("init", target, "--path", p->remote, "--accept-new-host-key"),
                       "gpusync init");
    if (config)
        assert_int_equal(gs_test_sh("printf '%s' >> '%s/.gpusync/config'", config, p->local), 0);
    assert_int_equal(gs_test_sh("cd '%s' && mkdir -p src/pkg/cache && "
                                "ln -s pkg/model.py src/current.py",
                                p->local),
                     0);
    gs_test_write_file(p->local, "train.py", "print('train')\n");
    gs_test_write_file(p->local, "src/pkg/model.py", "class Model: pass\n");
    gs_test_write_file(p->local, "src/pkg/cache/a.bin", "aaaa\n");
    gs_test_write_file(p->local, "src/pkg/cache/b.bin", "bbbb\n");
    gs_test_write_file(p->local, "run.sh", "#!/bin/sh\necho run\n");
    /* set-id bits are never set on the server: that is no change there */
    char run_sh[256];
    snprintf(run_sh, sizeof(run_sh), "%s/run.sh", p->local);
    assert_int_equal(chmod(run_sh, 04755), 0);
}

static void proj_free(struct proj *p)
{
    if (p->dir[0])
        gs_test_sh("rm -rf '%s'", p->dir);
    p->dir[0] = '\0';
}

/* Compares the trees, run.sh's set-id bit aside (the server never keeps it): the bit is dropped
 * for the comparison only, which leaves the file's mtime, and so gpusync's view of it, alone. */
static void expect_trees_equal(const struct proj *p, const char *when)
{
    struct gs_buf why = GS_BUF_INIT;
    assert_int_equal(gs_test_sh("chmod u-s '%s/run.sh'", p->local), 0);
    int differ = gs_test_tree_diff(p->local, p->remote, 0, &why);
    assert_int_equal(gs_test_sh("chmod u+s '%s/run.sh'", p->local), 0);
    if (differ)
        fail_msg("%s: the server's tree differs: %s", when, why.data);
    gs_buf_release(&why);
}

static json_int_t int_field(json_t *o, const char *key, const char *when)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("%s: no integer \"%s\" in the push's JSON", when, key);
    return json_integer_value(v);
}

/* The remote paths of the conflict copies kept of `name` (relative to the remote root). */
static int conflict_copies(const struct proj *p, const char *name)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls -d '%s/%s'.gpusync-conflict-* 2>/dev/null | wc -l", p->remote,
             name);
    FILE *fp = popen(cmd, "r");
    int n = -1;
    if (fp && fscanf(fp, "%d", &n) != 1)
        n = -1;
    if (fp)
        pclose(fp);
    return n;
}

/* What a user (or a job) does on the server behind gpusync's back; 4 gone (train.py, the cache
 * folder and its two files), 3 changed (model.py's content, run.sh's mode, the link's target). */
static void change_the_server_behind_its_back(const struct proj *p)
{
    assert_int_equal(gs_test_sh("cd '%s' && rm train.py && rm -r src/pkg/cache && "
                                "echo '# edited on the server' >> src/pkg/model.py && "
                                "chmod 700 run.sh && ln -sfn ../train.py src/current.py",
                                p->remote),
                     0);
}

static void expect_conflict_copies_then_drop_them(const struct proj *p)
{
    assert_int_equal(conflict_copies(p, "src/pkg/model.py"), 1);
    assert_int_equal(conflict_copies(p, "src/current.py"), 1);
    assert_int_equal(gs_test_sh("grep -q 'edited on the server' '%s'/src/pkg/model.py.gpusync-"
                                "conflict-*",
                                p->remote),
                     0);
    assert_int_equal(gs_test_sh("rm -f '%s'/src/pkg/*.gpusync-conflict-* "
                                "'%s'/src/*.gpusync-conflict-*",
                                p->remote, p->remote),
                     0);
}

static int group_setup(void **state)
{
    (void)state;
    return gs_test_sshd_start_for_cli(&sshd);
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&sshd);
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    if (cur.dir[0]) {
        struct gs_test_result r =
            gs_test_run_gpusync(cur.local, NULL, NULL, ARGS("watch", "--stop"), 30000);
        gs_test_result_release(&r);
    }
    proj_free(&cur);
    return 0;
}

/* A new project with `config` added and its watch daemon started, everything sent once. */
static void watching(const char *config)
{
    proj_new(&cur, config);
    gs_test_gpusync_ok(cur.local, ARGS("watch", "-d"), "watch -d");
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "the first flush");
}

/* model.py edited on the server and, differently, here. */
static void edit_model_on_both_sides(void)
{
    assert_int_equal(
        gs_test_sh("echo '# edited on the server' >> '%s/src/pkg/model.py'", cur.remote), 0);
    gs_test_write_file(cur.local, "src/pkg/model.py", "class Model: edited here\n");
}

/* `push` with no local change puts back what the server lost or changed, says how much, and keeps
 * every edited copy; then it finds nothing (the set-id bits the server never keeps included). */
static void test_check__push_puts_back_what_was_changed_on_the_server(void **state)
{
    (void)state;
    proj_new(&cur, NULL);
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "first push");
    json_decref(o);
    expect_trees_equal(&cur, "after the first push");
    change_the_server_behind_its_back(&cur);

    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push after the server changed");
    assert_int_equal(int_field(o, "server_gone", "push"), 4);
    assert_int_equal(int_field(o, "server_changed", "push"), 3);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 2);
    json_decref(o);
    expect_conflict_copies_then_drop_them(&cur);
    expect_trees_equal(&cur, "after the push that checked the server");

    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push with nothing changed");
    assert_int_equal(int_field(o, "server_gone", "push"), 0);
    assert_int_equal(int_field(o, "server_changed", "push"), 0);
    assert_int_equal(int_field(o, "sent", "push"), 0);
    json_decref(o);
}

/* With `watch` running, `flush` (what `run` does before it starts the ranks) asks the server too.
 */
static void test_check__a_flush_through_the_daemon_puts_it_back(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    expect_trees_equal(&cur, "after the first flush");
    change_the_server_behind_its_back(&cur);

    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after the server changed");
    /* (before the trees are compared: that touches run.sh's mode, a change of its own) */
    json_t *st = gs_test_gpusync_json(cur.local, ARGS("status", "--json"), 0, "status");
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
    expect_conflict_copies_then_drop_them(&cur);
    expect_trees_equal(&cur, "after the flush");
}

/* An idle daemon compares the server with its record every check_every seconds, unasked. */
static void test_check__an_idle_daemon_notices_a_file_deleted_on_the_server(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = 1\n");
    char gone[256];
    snprintf(gone, sizeof(gone), "%s/train.py", cur.remote);
    assert_int_equal(unlink(gone), 0);
    int64_t deadline = gs_clock_mono_ms() + IDLE_CHECK_MS;
    while (access(gone, F_OK) != 0 && gs_clock_mono_ms() < deadline)
        usleep(50 * 1000); /* nothing to await but the file itself: no client asks the daemon */
    if (access(gone, F_OK) != 0)
        fail_msg("train.py, deleted on the server, was not put back within %d ms", IDLE_CHECK_MS);
    expect_trees_equal(&cur, "after the idle check");
}

/* A file of the project hard-linked from outside it (a dataset linked in, `cp -al`) and its
 * outside name. A write through that name makes no inotify event in the project. Returns the
 * outside name's path (static). */
static const char *linked_from_outside(void)
{
    static char outside[256];
    char inside[256];
    snprintf(outside, sizeof(outside), "%s/outside.txt", cur.dir);
    snprintf(inside, sizeof(inside), "%s/linked.txt", cur.local);
    gs_test_write_file(cur.dir, "outside.txt", "v1\n");
    assert_int_equal(link(outside, inside), 0);
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush of the new link");
    return outside;
}

static void append_to(const char *path, const char *text)
{
    FILE *fp = fopen(path, "a");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static int remote_holds(const char *rel, const char *want)
{
    char path[512], got[64] = "";
    snprintf(path, sizeof(path), "%s/%s", cur.remote, rel);
    FILE *fp = fopen(path, "r");
    size_t n = fp ? fread(got, 1, sizeof(got) - 1, fp) : 0;
    if (fp)
        fclose(fp);
    got[n] = '\0';
    return strcmp(got, want) == 0;
}

/* ...and flush, which said up to date with the server's old bytes, sends it. */
static void test_check__a_flush_sends_a_file_edited_through_a_link_outside(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    const char *outside = linked_from_outside();
    assert_true(remote_holds("linked.txt", "v1\n"));
    append_to(outside, "v2\n");
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after a write through the outside link");
    if (!remote_holds("linked.txt", "v1\nv2\n"))
        fail_msg("the server holds linked.txt as it was before the write through the other link");
    expect_trees_equal(&cur, "after the flush");
}

/* ...and a file linked from outside only after the daemon started: a link changes no name here
 * either, so no event said the file has another name now. The flush lists the tree for such
 * files and sends it (it said up to date, the server holding the old bytes). */
static void test_check__a_flush_sends_a_file_linked_from_outside_after_the_start(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    char inside[256], outside[256];
    snprintf(inside, sizeof(inside), "%s/train.py", cur.local);
    snprintf(outside, sizeof(outside), "%s/outside.py", cur.dir);
    assert_int_equal(link(inside, outside), 0);
    append_to(outside, "# v2\n");
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after a write through a new outside link");
    if (!remote_holds("train.py", "print('train')\n# v2\n"))
        fail_msg("the server holds train.py as it was before the write through the new link");
}

/* ...and an idle daemon sends it unasked, as it does a save (the check of the server is off). */
static void test_check__an_idle_daemon_sends_a_file_edited_through_a_link_outside(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    const char *outside = linked_from_outside();
    append_to(outside, "v2\n");
    int64_t deadline = gs_clock_mono_ms() + IDLE_CHECK_MS;
    while (!remote_holds("linked.txt", "v1\nv2\n") && gs_clock_mono_ms() < deadline)
        usleep(50 * 1000); /* nothing to await but the file itself: no client asks the daemon */
    if (!remote_holds("linked.txt", "v1\nv2\n"))
        fail_msg("linked.txt, written through its outside link, was not sent within %d ms",
                 IDLE_CHECK_MS);
}

/* A file changed both here and on the server: the push sends it expecting what the index
 * recorded, and the agent keeps the server's copy aside once. The check of the server, answered
 * before that request was carried out, found the file changed too; the push must not act on that
 * answer about a file it has rewritten since (it would send the file a second time). */
static void test_check__a_file_changed_on_both_sides_is_sent_once_and_kept_once(void **state)
{
    (void)state;
    proj_new(&cur, NULL);
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "first push");
    json_decref(o);
    edit_model_on_both_sides();

    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push, edited on both sides");
    assert_int_equal(int_field(o, "sent", "push"), 1);
    assert_int_equal(int_field(o, "server_changed", "push"), 0);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 1);
    json_decref(o);
    assert_int_equal(conflict_copies(&cur, "src/pkg/model.py"), 1);
    assert_int_equal(gs_test_sh("grep -q 'edited on the server' '%s'/src/pkg/model.py.gpusync-"
                                "conflict-* && rm '%s'/src/pkg/model.py.gpusync-conflict-*",
                                cur.remote, cur.remote),
                     0);
    expect_trees_equal(&cur, "after the push");
}

/* The watch daemon keeps one connection, and the agent keeps what it was told the server holds:
 * each flush sends only what changed in gpusync's record since the last one (a file added, one
 * removed) and still notices what changed on the server behind its back, a file the daemon
 * wrote a moment ago included. */
static void test_check__each_flush_of_a_connection_checks_the_whole_record(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");

    gs_test_write_file(cur.local, "new.txt", "written after the first flush\n");
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush of new.txt");
    assert_int_equal(gs_test_sh("rm '%s/new.txt'", cur.remote), 0);
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after new.txt went on the server");
    expect_trees_equal(&cur, "new.txt, deleted on the server");

    assert_int_equal(gs_test_sh("rm '%s/src/pkg/cache/a.bin'", cur.local), 0);
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush of a deletion");
    assert_int_equal(gs_test_sh("rm '%s/train.py'", cur.remote), 0);
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after train.py went on the server");
    expect_trees_equal(&cur, "train.py, deleted on the server");

    edit_model_on_both_sides();
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush, model.py edited on both sides");
    assert_int_equal(conflict_copies(&cur, "src/pkg/model.py"), 1);
    assert_int_equal(gs_test_sh("rm '%s'/src/pkg/model.py.gpusync-conflict-*", cur.remote), 0);
    expect_trees_equal(&cur, "model.py, edited on both sides");
}

/* `watch --stop` counts what the server lacks at the stop as unsent, a file deleted there behind
 * gpusync's back included: its "nothing unsent" must be true of the server, not only of this side
 * (the fault test's server-delete found a stop that said so while the server lacked a file). */
static void test_check__a_stop_counts_what_the_server_lost_as_unsent(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    assert_int_equal(gs_test_sh("rm '%s/train.py'", cur.remote), 0);
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("watch", "--stop", "--json"), 0, "stop");
    assert_int_equal(int_field(o, "unsent", "watch --stop"), 1);
    assert_false(json_is_true(json_object_get(o, "unchecked")));
    json_decref(o);
    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push after the stop");
    assert_int_equal(int_field(o, "sent", "push"), 1);
    json_decref(o);
    expect_trees_equal(&cur, "after the push");
}

/* A job on the server replaces a folder gpusync wrote by a symlink (`rm -r cache; ln -s /scratch
 * cache`). The symlink is kept as a conflict copy, and the folder is made again with everything
 * it held, not empty. */
static void replace_cache_by_a_symlink(const struct proj *p)
{
    assert_int_equal(gs_test_sh("mkdir -p '%s/scratch' && rm -r '%s/src/pkg/cache' && "
                                "ln -s '%s/scratch' '%s/src/pkg/cache'",
                                p->dir, p->remote, p->dir, p->remote),
                     0);
}

static void expect_cache_back_and_the_link_kept(const struct proj *p, const char *when)
{
    assert_int_equal(conflict_copies(p, "src/pkg/cache"), 1);
    assert_int_equal(gs_test_sh("test -L '%s'/src/pkg/cache.gpusync-conflict-* && "
                                "rm '%s'/src/pkg/cache.gpusync-conflict-*",
                                p->remote, p->remote),
                     0);
    expect_trees_equal(p, when);
}

/* By push, with a file in it edited here meanwhile: sent, and no failure reported for it (its
 * first put, before the check's answer, met the symlink; the pass after the answer did it). */
static void test_check__a_folder_replaced_by_a_symlink_there_is_made_again_whole(void **state)
{
    (void)state;
    proj_new(&cur, NULL);
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "first push");
    json_decref(o);
    replace_cache_by_a_symlink(&cur);
    gs_test_write_file(cur.local, "src/pkg/cache/a.bin", "edited here\n");

    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push after the swap");
    assert_int_equal(int_field(o, "failed_count", "push"), 0);
    assert_int_equal(json_array_size(json_object_get(o, "failures")), 0);
    assert_int_equal(int_field(o, "server_changed", "push"), 1);
    json_decref(o);
    expect_cache_back_and_the_link_kept(&cur, "after the push");
}

/* The same with a file whose name is not UTF-8: its failure is withdrawn too (it was compared with
 * the --json form of the name, where U+FFFD stands for the bad byte, and stayed: exit 1 although
 * everything had arrived). */
static void
test_check__a_non_utf8_name_under_a_folder_replaced_by_a_symlink_is_not_failed(void **state)
{
    (void)state;
    proj_new(&cur, NULL);
    gs_test_write_file(cur.local, "src/pkg/cache/b\xff.bin", "first\n");
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "first push");
    json_decref(o);
    replace_cache_by_a_symlink(&cur);
    gs_test_write_file(cur.local, "src/pkg/cache/b\xff.bin", "edited here\n");

    o = gs_test_gpusync_json(cur.local, ARGS("push", "--json"), 0, "push after the swap");
    assert_int_equal(int_field(o, "failed_count", "push"), 0);
    assert_int_equal(json_array_size(json_object_get(o, "failures")), 0);
    json_decref(o);
    expect_cache_back_and_the_link_kept(&cur, "after the push");
}

/* The same through the daemon's flush, and the daemon's state says so only once it is true. */
static void test_check__a_flush_makes_a_folder_replaced_by_a_symlink_again_whole(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    replace_cache_by_a_symlink(&cur);
    gs_test_gpusync_ok(cur.local, ARGS("flush"), "flush after the swap");
    expect_cache_back_and_the_link_kept(&cur, "after the flush");
}

/* The whole project folder removed on the server while the daemon is connected (`rm -rf` of the
 * project, a cleanup job): the agent's session cannot write into a folder that no longer exists, so
 * it ends the session; the daemon connects again, which makes the folder anew, and the next flush
 * puts the whole tree back instead of failing on every path until the daemon is restarted. */
static void test_check__a_flush_puts_back_a_project_folder_removed_on_the_server(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    assert_int_equal(gs_test_sh("rm -rf '%s'", cur.remote), 0);
    gs_test_write_file(cur.local, "train.py", "print('train again')\n");
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("flush", "--json"), 0,
                                     "flush after the project folder went");
    assert_true(json_is_true(json_object_get(o, "ok")));
    json_decref(o);
    expect_trees_equal(&cur, "after the flush");
}

/* The project folder moved away on the server and a new empty one made in its place (`mv proj
 * proj.old; mkdir proj`) while the daemon is connected: the session's folder still exists, so it
 * wrote every save into proj.old and said up to date while runs started in the empty folder. The
 * agent now ends a session whose root path names another folder; the flush puts the whole tree in
 * the folder the path names, and leaves the moved one alone. */
static void test_check__a_flush_follows_a_project_folder_moved_and_replaced(void **state)
{
    (void)state;
    watching("[sync]\n\tcheck_every = off\n");
    assert_int_equal(
        gs_test_sh("mv '%s' '%s.old' && mkdir '%s'", cur.remote, cur.remote, cur.remote), 0);
    gs_test_write_file(cur.local, "train.py", "print('train in the new folder')\n");
    json_t *o = gs_test_gpusync_json(cur.local, ARGS("flush", "--json"), 0,
                                     "flush after the project folder was moved and replaced");
    assert_true(json_is_true(json_object_get(o, "ok")));
    json_decref(o);
    expect_trees_equal(&cur, "after the flush");
    gs_test_sh("rm -rf '%s.old'", cur.remote);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_teardown(fn, test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_check__push_puts_back_what_was_changed_on_the_server),
        T(test_check__a_flush_through_the_daemon_puts_it_back),
        T(test_check__an_idle_daemon_notices_a_file_deleted_on_the_server),
        T(test_check__a_file_changed_on_both_sides_is_sent_once_and_kept_once),
        T(test_check__each_flush_of_a_connection_checks_the_whole_record),
        T(test_check__a_stop_counts_what_the_server_lost_as_unsent),
        T(test_check__a_folder_replaced_by_a_symlink_there_is_made_again_whole),
        T(test_check__a_non_utf8_name_under_a_folder_replaced_by_a_symlink_is_not_failed),
        T(test_check__a_flush_makes_a_folder_replaced_by_a_symlink_again_whole),
        T(test_check__a_flush_puts_back_a_project_folder_removed_on_the_server),
        T(test_check__a_flush_follows_a_project_folder_moved_and_replaced),
        T(test_check__a_flush_sends_a_file_edited_through_a_link_outside),
        T(test_check__a_flush_sends_a_file_linked_from_outside_after_the_start),
        T(test_check__an_idle_daemon_sends_a_file_edited_through_a_link_outside),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
