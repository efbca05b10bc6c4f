/* tests/unit/test_watcher.c: syncd/watch's saves in progress, with real inotify on a temporary
 * tree: a file being written is held until its writer closes it, and from a batch that began
 * reading it before it was closed; a file renamed to an editor's scratch name is held until its
 * new version is written; ordinary renames and deletes are not held; a file gone or empty with no
 * event yet to explain it settles first; every hold ends after its limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/path.h"
#include "syncd/ignore.h"
#include "syncd/watch.h"

static char tmpdir[64];
static struct gs_ignore *ig;
static struct gs_watch *w;

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-watcher-XXXXXX");
    if (!mkdtemp(tmpdir) || gs_ignore_open(&ig, tmpdir, NULL, 0, NULL) < 0)
        return -1;
    return gs_watch_open(&w, tmpdir, ig, NULL);
}

static int teardown(void **state)
{
    (void)state;
    gs_watch_free(w);
    gs_ignore_free(ig);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *abs_path(const char *rel)
{
    static char buf[4][256];
    static int next;
    char *out = buf[next++ % 4];
    snprintf(out, sizeof(buf[0]), "%s/%s", tmpdir, rel);
    return out;
}

static void count_path(void *ctx, const char *path)
{
    (void)path;
    (*(int *)ctx)++;
}

/* Reads every event queued so far (inotify queues them as the calls return). */
static void read_events(void)
{
    int n = 0;
    assert_true(gs_watch_read(w, count_path, &n, NULL) >= 0);
}

/* What a batch that began reading after `planned_at` events finds at `rel` now. */
static struct gs_watch_found found(const char *rel, uint64_t planned_at)
{
    struct stat st;
    struct gs_watch_found f = {.planned_at = planned_at};
    f.gone = lstat(abs_path(rel), &st) != 0;
    f.empty = !f.gone && S_ISREG(st.st_mode) && st.st_size == 0;
    f.mtime_ns = f.gone ? 0 : st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    return f;
}

static int hold_at(const char *rel, uint64_t planned_at, int64_t now, int64_t *until)
{
    struct gs_watch_found f = found(rel, planned_at);
    return gs_watch_hold(w, rel, &f, now, until);
}

/* Whether a batch planned now would hold `rel`. */
static int held(const char *rel)
{
    int64_t until = 0;
    read_events();
    return hold_at(rel, gs_watch_events_read(w), gs_clock_mono_ms(), &until);
}

static void put(const char *rel, const char *text)
{
    int fd = open(abs_path(rel), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(close(fd), 0);
}

static void test_watcher__a_new_file_is_held_until_its_writer_closes_it(void **state)
{
    (void)state;
    int fd = open(abs_path("model.py"), O_WRONLY | O_CREAT | O_EXCL, 0644);
    assert_true(fd >= 0);
    assert_int_equal(held("model.py"), 1); /* created, still empty: not a saved version */
    assert_int_equal(write(fd, "x = 1\n", 6), 6);
    assert_int_equal(held("model.py"), 1);
    assert_int_equal(close(fd), 0);
    assert_int_equal(held("model.py"), 0);
}

static void test_watcher__an_in_place_save_is_held_from_truncation_to_close(void **state)
{
    (void)state;
    put("cfg.yaml", "lr: 0.1\n");
    assert_int_equal(held("cfg.yaml"), 0);
    int fd = open(abs_path("cfg.yaml"), O_WRONLY | O_TRUNC); /* what fs.writeFileSync does */
    assert_true(fd >= 0);
    assert_int_equal(held("cfg.yaml"), 1);
    assert_int_equal(write(fd, "lr: 0.2\n", 8), 8);
    assert_int_equal(held("cfg.yaml"), 1);
    assert_int_equal(close(fd), 0);
    assert_int_equal(held("cfg.yaml"), 0);
}

/* A batch that read a file while it was being saved again must not send what it read: an
 * in-place save passes through an empty file, even when it has ended by the time the batch asks. */
static void test_watcher__a_save_that_ends_while_a_batch_reads_is_held(void **state)
{
    (void)state;
    put("notes.md", "v1\n");
    read_events();
    uint64_t planned = gs_watch_events_read(w); /* a batch starts reading files here */
    put("notes.md", "v2\n");
    read_events();
    int64_t until = 0;
    assert_int_equal(hold_at("notes.md", planned, gs_clock_mono_ms(), &until), 1);
    /* the next batch, planned after the save ended, sends it */
    assert_int_equal(held("notes.md"), 0);
}

/* Emacs' rename save as a batch can meet it (the CI failure of 2026-11-26): the batch looks in the
 * moment between f -> f~ and the new f's creation and finds f gone; by the time it asks, the new f
 * is being written. The batch after it must not send the half-written f: what the first found
 * out (gone) is older than what the events say (a save in progress). */
static void test_watcher__a_file_found_gone_inside_a_rename_save_stays_held(void **state)
{
    (void)state;
    put("table.txt", "v1\n");
    read_events();
    uint64_t planned = gs_watch_events_read(w); /* a batch starts reading files here */
    assert_int_equal(rename(abs_path("table.txt"), abs_path("table.txt~")), 0);
    struct gs_watch_found gone = found("table.txt", planned); /* its scan finds f gone */
    int fd = open(abs_path("table.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "v2, the fir", 11), 11); /* the new f, half written */
    read_events();                                      /* what the batch reads before it asks */
    int64_t until = 0;
    assert_int_equal(gs_watch_hold(w, "table.txt", &gone, gs_clock_mono_ms(), &until), 1);
    assert_int_equal(held("table.txt"), 1); /* the next batch finds it half written */
    assert_int_equal(write(fd, "st half\n", 8), 8);
    assert_int_equal(close(fd), 0);
    assert_int_equal(held("table.txt"), 0);
}

/* A batch that read a file just before it was deleted or renamed away (an event after the batch
 * began) may have read it in the middle of a save: it is not sent from that batch. */
static void test_watcher__a_file_read_before_it_went_away_is_not_sent_from_that_read(void **state)
{
    (void)state;
    put("data.csv", "v1\n");
    read_events();
    uint64_t planned = gs_watch_events_read(w);
    int fd = open(abs_path("data.csv"), O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "v2, half", 8), 8);
    struct gs_watch_found half = found("data.csv", planned); /* read here, half written */
    assert_int_equal(close(fd), 0);
    assert_int_equal(rename(abs_path("data.csv"), abs_path("moved.csv")), 0);
    read_events();
    int64_t until = 0;
    assert_int_equal(gs_watch_hold(w, "data.csv", &half, gs_clock_mono_ms(), &until), 1);
    assert_int_equal(held("data.csv"), 0); /* the next batch finds it gone: the delete goes */
    /* a whole file renamed in over one a batch read before: not sent from that read either */
    put("cfg.yaml", "v1\n");
    put("cfg.yaml.new", "v2\n");
    read_events();
    planned = gs_watch_events_read(w);
    struct gs_watch_found old = found("cfg.yaml", planned);
    assert_int_equal(rename(abs_path("cfg.yaml.new"), abs_path("cfg.yaml")), 0);
    read_events();
    assert_int_equal(gs_watch_hold(w, "cfg.yaml", &old, gs_clock_mono_ms(), &until), 1);
    assert_int_equal(held("cfg.yaml"), 0);
}

/* vim's and Emacs' default save: f -> f~, a new f written, f~ removed. */
static void test_watcher__a_file_renamed_to_its_backup_is_held_until_rewritten(void **state)
{
    (void)state;
    put("train.py", "v1\n");
    assert_int_equal(rename(abs_path("train.py"), abs_path("train.py~")), 0);
    assert_int_equal(held("train.py"), 1); /* gone, but only for the length of the save */
    int fd = open(abs_path("train.py"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "v2\n", 3), 3);
    assert_int_equal(held("train.py"), 1);
    assert_int_equal(close(fd), 0);
    assert_int_equal(unlink(abs_path("train.py~")), 0);
    assert_int_equal(held("train.py"), 0);
}

/* JetBrains' safe write: f___jb_tmp___ written, f -> f___jb_old___, f___jb_tmp___ -> f. */
static void test_watcher__a_jetbrains_safe_write_is_held_until_the_new_file_is_in(void **state)
{
    (void)state;
    put("Main.kt", "v1\n");
    put("Main.kt___jb_tmp___", "v2\n");
    assert_int_equal(held("Main.kt"), 0);
    assert_int_equal(rename(abs_path("Main.kt"), abs_path("Main.kt___jb_old___")), 0);
    assert_int_equal(held("Main.kt"), 1);
    assert_int_equal(rename(abs_path("Main.kt___jb_tmp___"), abs_path("Main.kt")), 0);
    assert_int_equal(held("Main.kt"), 0);
}

static void test_watcher__ordinary_renames_and_deletes_are_not_held(void **state)
{
    (void)state;
    put("a.py", "a\n");
    put("b.py", "b\n");
    assert_int_equal(rename(abs_path("a.py"), abs_path("c.py")), 0);
    assert_int_equal(unlink(abs_path("b.py")), 0);
    assert_int_equal(held("a.py"), 0);
    assert_int_equal(held("b.py"), 0);
    assert_int_equal(held("c.py"), 0);
    assert_int_equal(symlink("c.py", abs_path("link.py")), 0); /* no writer to wait for */
    assert_int_equal(held("link.py"), 0);
}

static void test_watcher__holds_end_after_the_limit(void **state)
{
    (void)state;
    int fd = open(abs_path("log.txt"), O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "step 1\n", 7), 7);
    read_events();
    int64_t now = gs_clock_mono_ms(), until = 0;
    assert_int_equal(hold_at("log.txt", gs_watch_events_read(w), now, &until), 1);
    assert_true(until > now && until <= now + GS_WATCH_HOLD_MAX_MS);
    /* a writer that never closes: sent as it is after the limit, then held afresh */
    int64_t later = until;
    assert_int_equal(hold_at("log.txt", gs_watch_events_read(w), later, &until), 0);
    assert_int_equal(hold_at("log.txt", gs_watch_events_read(w), later, &until), 1);
    assert_int_equal(until, later + GS_WATCH_HOLD_MAX_MS);
    assert_int_equal(close(fd), 0);
    /* a backup that never comes back: deleted after the limit, for good */
    put("old.py", "x\n");
    assert_int_equal(rename(abs_path("old.py"), abs_path("old.py~")), 0);
    read_events();
    now = gs_clock_mono_ms();
    assert_int_equal(hold_at("old.py", gs_watch_events_read(w), now, &until), 1);
    assert_int_equal(hold_at("old.py", gs_watch_events_read(w), until, &until), 0);
}

/* The kernel makes a rename or a creation visible a moment before it queues its event: what a
 * batch finds then, with no event to explain it, waits GS_WATCH_SETTLE_MS. */
static void test_watcher__what_no_event_explains_yet_settles_first(void **state)
{
    (void)state;
    /* gone, as far as the batch can tell, but no event said so (here: it never existed) */
    read_events();
    int64_t now = gs_clock_mono_ms(), until = 0;
    assert_int_equal(hold_at("src/gone.py", gs_watch_events_read(w), now, &until), 1);
    assert_int_equal(until, now + GS_WATCH_SETTLE_MS);
    assert_int_equal(hold_at("src/gone.py", gs_watch_events_read(w), until, &until), 0);
    /* an empty file made just now may be inside open(O_TRUNC): it settles; an old one does not */
    put("__init__.py", "");
    assert_int_equal(held("__init__.py"), 1);
    struct timespec old[2] = {{.tv_sec = time(NULL) - 5}, {.tv_sec = time(NULL) - 5}};
    assert_int_equal(utimensat(AT_FDCWD, abs_path("__init__.py"), old, 0), 0);
    assert_int_equal(held("__init__.py"), 0);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_watcher__a_new_file_is_held_until_its_writer_closes_it),
        T(test_watcher__an_in_place_save_is_held_from_truncation_to_close),
        T(test_watcher__a_save_that_ends_while_a_batch_reads_is_held),
        T(test_watcher__a_file_found_gone_inside_a_rename_save_stays_held),
        T(test_watcher__a_file_read_before_it_went_away_is_not_sent_from_that_read),
        T(test_watcher__a_file_renamed_to_its_backup_is_held_until_rewritten),
        T(test_watcher__a_jetbrains_safe_write_is_held_until_the_new_file_is_in),
        T(test_watcher__ordinary_renames_and_deletes_are_not_held),
        T(test_watcher__holds_end_after_the_limit),
        T(test_watcher__what_no_event_explains_yet_settles_first),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
