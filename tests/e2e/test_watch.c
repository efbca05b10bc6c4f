/* tests/e2e/test_watch.c: `gpusync watch -d` driven as a user would, against the sandbox sshd
 * (issue 4): each case changes the project, then `gpusync flush`, then compares the remote tree
 * with the local one (kind, mode, size, bytes, symlink target). Cases: real nvim, vim and emacs
 * saves and the JetBrains, VS Code and sed -i syscall sequences; a 1,000-file directory rename seen
 * as one "renamed" event; a 500-file git checkout; a 3,000-file burst; kind changes; an inotify
 * overflow; a refused change; a batch that cannot be planned (a file under a write lease); a stuck
 * event reader; a file written without pause; the WAN simulator cut for 30 s and stalled; a put
 * in flight when the link stalled; a file saved again while it is sent; sshd restarted; a changed
 * host key; the daemon SIGKILLed mid-batch; seeded random operations; a second watch refused;
 * status --json, watch --stop, a foreground watch, bad control requests, a long project path.
 * Environment: GS_TEST_FILTER='*name*' runs a subset; GS_TEST_SEED replays a random seed;
 * GS_TEST_OPLOG=FILE logs the random operations; GS_TEST_KEEP=1 keeps the project folders. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <linux/sockios.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/events.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"
#include "wansim_harness.h"

#define RUN_TIMEOUT_MS 180000
#define ARGS(...)      ((const char *const[]){__VA_ARGS__, NULL})

static struct gs_test_sshd sshd;

/* The project of the running test; the teardown stops its daemon and removes it. */
struct proj {
    char base[64];    /* /tmp/gs-e2e-watch.XXXXXX */
    char local[512];  /* base/proj (or a longer name) */
    char remote[128]; /* base/remote (the server is this machine) */
};
static struct proj cur;
static struct wansim_proc wan;
static char saved_queued[32]; /* fs.inotify.max_queued_events to restore, or "" */
static char immutable[2048];  /* a remote directory made immutable (chattr +i), or "" */

/* ---- running programs ---- */

/* Runs `argv` (argv[0] a path) in `cwd` without a terminal; stdin is /dev/null. */
static struct gs_test_result run_prog(const char *cwd, const char *const *argv)
{
    return gs_test_run_prog(cwd, argv, RUN_TIMEOUT_MS);
}

static struct gs_test_result gpusync(const char *cwd, const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = gs_test_gpusync();
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return run_prog(cwd, argv);
}

static void expect_status(const struct gs_test_result *r, int want, const char *what)
{
    if (r->status != want)
        fail_msg("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r->status, want, r->out.data,
                 r->err.data);
}

/* Runs gpusync in the current project and expects exit 0. */
static void gs_ok(const char *const *args, const char *what)
{
    struct gs_test_result r = gpusync(cur.local, args);
    expect_status(&r, 0, what);
    gs_test_result_release(&r);
}

/* ---- files ---- */

static void path_in(char *out, size_t size, const char *root, const char *rel)
{
    snprintf(out, size, "%s/%s", root, rel);
}

static void write_at(const char *abs, const char *data, size_t len, int flags)
{
    int fd = open(abs, O_WRONLY | O_CREAT | flags, 0644);
    if (fd < 0)
        fail_msg("open %s: %s", abs, strerror(errno));
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

/* Writes `data` to `rel` in the project (creating or truncating). */
static void put(const char *rel, const char *data)
{
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, rel);
    write_at(abs, data, strlen(data), O_TRUNC);
}

static void mkdir_in(const char *rel)
{
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, rel);
    if (mkdir(abs, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", abs, strerror(errno));
}

/* Creates `n` files dir/f<i> holding `size` bytes each (distinct content). */
static void make_files(const char *dir, int n, size_t size)
{
    mkdir_in(dir);
    char *data = malloc(size + 1);
    for (int i = 0; i < n; i++) {
        char rel[256], abs[2048];
        snprintf(rel, sizeof(rel), "%s/f%d.bin", dir, i);
        path_in(abs, sizeof(abs), cur.local, rel);
        /* incompressible, so that a rate-limited link limits the batch as the test means it to */
        uint32_t x = 2654435761u * (uint32_t)(i + 1);
        for (size_t k = 0; k < size; k++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            data[k] = (char)x;
        }
        write_at(abs, data, size, O_TRUNC);
    }
    free(data);
}

static void rename_in(const char *from, const char *to)
{
    char a[2048], b[2048];
    path_in(a, sizeof(a), cur.local, from);
    path_in(b, sizeof(b), cur.local, to);
    if (rename(a, b) != 0)
        fail_msg("rename %s -> %s: %s", a, b, strerror(errno));
}

static void expect_remote(const char *rel, const char *want)
{
    char abs[2048];
    struct gs_buf b = GS_BUF_INIT;
    path_in(abs, sizeof(abs), cur.remote, rel);
    if (gs_test_slurp(abs, &b) != 0)
        fail_msg("remote %s: %s", rel, strerror(errno));
    if (b.len != strlen(want) || memcmp(b.data, want, b.len) != 0)
        fail_msg("remote %s holds\n%s\nwant\n%s", rel, b.data, want);
    gs_buf_release(&b);
}

/* ---- comparing trees ---- */

static void expect_remote_absent(const char *rel)
{
    char abs[2048];
    struct stat st;
    path_in(abs, sizeof(abs), cur.remote, rel);
    if (lstat(abs, &st) == 0)
        fail_msg("%s is on the server, but should not be synced", rel);
}

static void expect_local_present(const char *rel)
{
    char abs[2048];
    struct stat st;
    path_in(abs, sizeof(abs), cur.local, rel);
    if (lstat(abs, &st) != 0)
        fail_msg("%s is missing locally: %s", rel, strerror(errno));
}

/* Fails the test unless the remote tree equals the local one (ignored names aside), compared as
 * gs_test_tree_diff's `flags` say. */
static void expect_trees_equal_as(const char *when, int flags)
{
    struct gs_buf msg = GS_BUF_INIT;
    char text[2048] = "";
    int differ = gs_test_tree_diff(cur.local, cur.remote, flags, &msg) != 0;
    if (differ)
        snprintf(text, sizeof(text), "%s", msg.data);
    gs_buf_release(&msg); /* before fail_msg, which does not return */
    if (differ) {
        /* the daemon's view, to tell a missed event from a failed push */
        struct gs_test_result r = gpusync(cur.local, ARGS("status", "--json"));
        print_message("status at the failure: %s", r.out.data);
        gs_test_result_release(&r);
        fail_msg("%s: trees differ: %s", when, text);
    }
}

static void expect_trees_equal(const char *when)
{
    expect_trees_equal_as(when, 0);
}

/* ---- the project and its daemon ---- */

/* A fresh project in base/`name`, initialised against 127.0.0.1:`port` (the sshd, or the WAN
 * simulator). */
static void proj_init_named(int port, const char *name)
{
    snprintf(cur.base, sizeof(cur.base), "/tmp/gs-e2e-watch.XXXXXX");
    assert_non_null(mkdtemp(cur.base));
    snprintf(cur.local, sizeof(cur.local), "%s/%s", cur.base, name);
    snprintf(cur.remote, sizeof(cur.remote), "%s/remote", cur.base);
    assert_int_equal(mkdir(cur.local, 0755), 0);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", port);
    gs_ok(ARGS("init", target, "--path", cur.remote, "--accept-new-host-key"), "gpusync init");
}

static void proj_init(int port)
{
    proj_init_named(port, "proj");
}

static void watch_start(void)
{
    gs_ok(ARGS("watch", "-d"), "gpusync watch -d");
}

static void flush(const char *what)
{
    gs_ok(ARGS("flush", "--timeout", "150"), what);
}

/* `gpusync status --json` of the current project (a new reference). */
static json_t *status_json(void)
{
    struct gs_test_result r = gpusync(cur.local, ARGS("status", "--json"));
    expect_status(&r, 0, "gpusync status --json");
    json_error_t jerr;
    json_t *st = json_loads(r.out.data, 0, &jerr);
    if (!st)
        fail_msg("status --json is not JSON (%s): %s", jerr.text, r.out.data);
    gs_test_result_release(&r);
    return st;
}

/* status --json as answered by the running daemon; a fallback to the local answer (the daemon did
 * not reply in time) fails the test. */
static json_t *daemon_status_json(void)
{
    json_t *st = status_json();
    if (!json_is_true(json_object_get(st, "daemon"))) {
        char *text = json_dumps(st, JSON_COMPACT);
        fail_msg("status --json did not come from the daemon: %s", text);
    }
    return st;
}

/* Polls the daemon's status until a batch with `ops_total` operations runs (0: one still reading
 * the changed files); returns that status (a new reference), or fails naming `what`. */
static json_t *await_batch(long long ops_total, const char *what)
{
    int64_t end = gs_clock_mono_ms() + 10000;
    for (;;) {
        json_t *st = daemon_status_json();
        json_t *batch = json_object_get(st, "batch");
        if (batch && json_integer_value(json_object_get(batch, "ops_total")) == ops_total)
            return st;
        if (gs_clock_mono_ms() > end) {
            char *text = json_dumps(st, 0);
            fail_msg("no status showed %s: %s", what, text);
        }
        json_decref(st);
        usleep(20000); /* polling an observable condition, with a deadline */
    }
}

static pid_t daemon_pid(void)
{
    json_t *st = daemon_status_json();
    pid_t pid = (pid_t)json_integer_value(json_object_get(st, "pid"));
    json_decref(st);
    assert_true(pid > 0);
    return pid;
}

/* Polls status --json until "connected" equals `want`; returns the ms it took, or fails. */
static int64_t await_connected(int want, int limit_ms)
{
    int64_t start = gs_clock_mono_ms();
    for (;;) {
        json_t *st = daemon_status_json();
        int connected = json_is_true(json_object_get(st, "connected"));
        json_decref(st);
        if (connected == want)
            return gs_clock_mono_ms() - start;
        if (gs_clock_mono_ms() - start > limit_ms)
            fail_msg("daemon still %sconnected after %d ms", want ? "dis" : "", limit_ms);
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

static pid_t lock_pid(void)
{
    return gs_test_daemon_lock_pid(cur.local);
}

static void restore_queued_events(void)
{
    if (!saved_queued[0])
        return;
    FILE *fp = fopen("/proc/sys/fs/inotify/max_queued_events", "w");
    if (fp) {
        fputs(saved_queued, fp);
        fclose(fp);
    }
    saved_queued[0] = '\0';
}

static int test_setup(void **state)
{
    (void)state;
    memset(&cur, 0, sizeof(cur));
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    restore_queued_events();
    if (immutable[0])
        gs_test_sh("chattr -i '%s'", immutable);
    immutable[0] = '\0';
    if (cur.local[0]) {
        struct gs_test_result r = gpusync(cur.local, ARGS("watch", "--stop"));
        gs_test_result_release(&r);
        pid_t pid = lock_pid();
        if (pid > 0 && kill(pid, 0) == 0) /* --stop failed: do not leave a daemon behind */
            kill(pid, SIGKILL);
    }
    if (wan.pid)
        wansim_stop(&wan);
    if (cur.base[0] && getenv("GS_TEST_KEEP") == NULL)
        gs_test_sh("rm -rf '%s'", cur.base);
    memset(&cur, 0, sizeof(cur));
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&sshd) != 0)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&sshd);
    return 0;
}

/* ---- the event stream ---- */

/* Writes `name` and waits for its "synced" event: everything before it has been reported. The
 * first marker also proves the stream is subscribed, which `gpusync events` does not announce:
 * rewrite it until an event shows up. */
static void events_mark(struct gs_test_events *ev, const char *name)
{
    for (int i = 0; i < 50; i++) {
        char body[64];
        snprintf(body, sizeof(body), "%s %d\n", name, i);
        put(name, body);
        flush("flush after a marker");
        if (gs_test_events_wait(ev, "synced", name, 200 + 100 * i))
            return;
    }
    fail_msg("no \"synced\" event for marker %s", name);
}

/* ---- daemon basics ---- */

static void test_watch__status_reports_a_connected_daemon_and_stop_ends_it(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.py", "print(1)\n");
    watch_start();
    flush("first flush");
    expect_trees_equal("after the first push");
    json_t *st = status_json();
    assert_true(json_is_true(json_object_get(st, "daemon")));
    assert_true(json_is_true(json_object_get(st, "connected")));
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    assert_int_equal(json_integer_value(json_object_get(st, "pending")), 0);
    pid_t pid = (pid_t)json_integer_value(json_object_get(st, "pid"));
    json_decref(st);
    assert_true(pid > 0 && kill(pid, 0) == 0);

    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker");
    gs_ok(ARGS("watch", "--stop"), "gpusync watch --stop");
    gs_test_await_gone(pid);
    int status;
    assert_int_equal(waitpid(ev.pid, &status, 0), ev.pid); /* the stream ends with the daemon */
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ev.pid = -1;
    gs_test_events_stop(&ev);
    char sock[2048];
    path_in(sock, sizeof(sock), cur.local, ".gpusync/daemon.sock");
    assert_int_not_equal(access(sock, F_OK), 0);
    st = status_json();
    assert_false(json_is_true(json_object_get(st, "daemon")));
    json_decref(st);
    struct gs_test_result r = gpusync(cur.local, ARGS("watch", "--stop"));
    expect_status(&r, 0, "a second watch --stop");
    assert_non_null(strstr(r.out.data, "no gpusync watch is running"));
    gs_test_result_release(&r);
    r = gpusync(cur.local, ARGS("events", "--json"));
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.err.data, "no gpusync watch is running"));
    gs_test_result_release(&r);
    put("a.py", "print(2)\n"); /* without a daemon, flush pushes by itself */
    flush("flush without a daemon");
    expect_remote("a.py", "print(2)\n");
    for (int i = 0; i < 3; i++) { /* a restart right after a stop is not refused */
        watch_start();
        gs_ok(ARGS("watch", "--stop"), "gpusync watch --stop");
    }
}

/* Waits until the foreground daemon `pid` of the current project serves its control socket. */
static void await_serving(pid_t pid)
{
    char sock[2048];
    path_in(sock, sizeof(sock), cur.local, ".gpusync/daemon.sock");
    int64_t end = gs_clock_mono_ms() + 20000;
    while (access(sock, F_OK) != 0) { /* bounded wait for an observable condition */
        if (gs_clock_mono_ms() > end || waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("foreground gpusync watch did not start serving");
        usleep(20000);
    }
}

static void test_watch__foreground_watch_syncs_and_stops_on_sigint(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.py", "a\n");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (chdir(cur.local) != 0)
            _exit(126);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execl(gs_test_gpusync(), gs_test_gpusync(), "watch", (char *)NULL);
        _exit(127);
    }
    char sock[2048];
    path_in(sock, sizeof(sock), cur.local, ".gpusync/daemon.sock");
    await_serving(pid);
    assert_int_equal(daemon_pid(), pid);
    flush("flush with a foreground daemon");
    put("b.py", "b\n");
    flush("flush after an edit");
    expect_trees_equal("with a foreground daemon");
    assert_int_equal(kill(pid, SIGINT), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("gpusync watch ended with status 0x%x after SIGINT, want exit 0", status);
    assert_int_not_equal(access(sock, F_OK), 0);
}

static void test_watch__second_watch_refuses_with_a_clear_message(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    pid_t pid = daemon_pid();
    char pid_text[32];
    snprintf(pid_text, sizeof(pid_text), "%d", (int)pid);
    const char *const *variants[] = {ARGS("watch", "-d"), ARGS("watch")};
    for (size_t i = 0; i < 2; i++) {
        struct gs_test_result r = gpusync(cur.local, variants[i]);
        if (r.status == 0)
            fail_msg("a second 'gpusync %s' succeeded: %s", variants[i][1] ? "watch -d" : "watch",
                     r.out.data);
        assert_non_null(strstr(r.err.data, "already running"));
        assert_non_null(strstr(r.err.data, pid_text));
        gs_test_result_release(&r);
    }
    assert_int_equal(daemon_pid(), pid); /* the first one is untouched */
}

static void test_watch__ignored_directories_get_no_watches(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put(".gitignore", "node_modules/\ndata/\n");
    assert_int_equal(
        gs_test_sh("cd '%s' && mkdir -p src/a/b node_modules/x/y/z data/d1 data/d2 .git/objects/ab",
                   cur.local),
        0);
    watch_start();
    flush("first flush");
    json_t *st = daemon_status_json();
    /* root, src, src/a, src/a/b */
    assert_int_equal(json_integer_value(json_object_get(st, "watches")), 4);
    json_decref(st);
    mkdir_in("node_modules/new");
    mkdir_in("data/d3");
    mkdir_in("src/c");
    put("src/c/m.py", "x = 1\n");
    flush("flush after new directories");
    st = daemon_status_json();
    assert_int_equal(json_integer_value(json_object_get(st, "watches")), 5);
    json_decref(st);
    expect_trees_equal("after new directories");
    assert_int_equal(gs_test_sh("rm -r '%s/src/c'", cur.local), 0);
    flush("flush after removing a directory");
    st = daemon_status_json();
    assert_int_equal(json_integer_value(json_object_get(st, "watches")), 4);
    json_decref(st);
}

/* Rules changed while the daemon runs take effect at the next flush, not at its next start: a
 * .gitignore rule dropped sends what it hid (its folder watched from then on), one added takes
 * what it hides off the server, and an exclude glob added to .gpusync/config (outside the watched
 * tree) keeps a file off the server until it is dropped again. */
static void test_watch__changed_ignore_rules_take_effect_at_the_next_flush(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put(".gitignore", "logs/\n");
    mkdir_in("logs");
    put("logs/a.txt", "a\n");
    put("model.dat", "m\n");
    put("secret.key", "k\n");
    watch_start();
    flush("first flush");
    expect_remote_absent("logs/a.txt");
    expect_remote("model.dat", "m\n");

    put(".gitignore", "model.dat\n");
    flush("flush after .gitignore changed");
    expect_remote("logs/a.txt", "a\n");
    expect_remote_absent("model.dat");
    put("logs/b.txt", "b\n");
    flush("flush after a save in the folder no longer ignored");
    expect_remote("logs/b.txt", "b\n");

    char config[PATH_MAX];
    path_in(config, sizeof(config), cur.local, ".gpusync/config");
    assert_int_equal(gs_test_sh("cp '%s' '%s.orig' && printf '[sync]\\nexclude = *.key\\n' >> '%s'",
                                config, config, config),
                     0);
    flush("flush after an exclude was added");
    expect_remote_absent("secret.key");
    put("secret.key", "k2\n");
    flush("flush after the excluded file changed");
    expect_remote_absent("secret.key");
    assert_int_equal(gs_test_sh("mv '%s.orig' '%s'", config, config), 0);
    flush("flush after the exclude was dropped");
    expect_remote("secret.key", "k2\n");
    json_t *st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
}

/* The user's excludes file (core.excludesFile) edited, or the git config pointed at another one,
 * while the daemon runs: as for a .gitignore, what it now excludes leaves the server and what it
 * no longer excludes goes there at the next flush. The daemon kept the rules it started with and
 * said up to date (only a push, or a restart, applied them). */
static void test_watch__the_users_excludes_file_is_followed_too(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    put("b.log", "b\n");
    put("c.tmp", "c\n");
    char excl[600], excl2[600];
    snprintf(excl, sizeof(excl), "%s/excludes", cur.base); /* outside the project */
    snprintf(excl2, sizeof(excl2), "%s/excludes2", cur.base);
    assert_int_equal(
        gs_test_sh("printf '*.log\\n' > '%s' && printf 'a.txt\\n' > '%s' && cd '%s' && "
                   "git init -q . && git config core.excludesFile '%s'",
                   excl, excl2, cur.local, excl),
        0);
    watch_start();
    flush("first flush");
    expect_remote_absent("b.log");
    expect_remote("c.tmp", "c\n");
    assert_int_equal(gs_test_sh("printf '*.tmp\\n' > '%s'", excl), 0);
    flush("flush after the excludes file changed");
    expect_remote_absent("c.tmp");
    expect_remote("b.log", "b\n");
    assert_int_equal(gs_test_sh("cd '%s' && git config core.excludesFile '%s'", cur.local, excl2),
                     0);
    flush("flush after core.excludesFile named another file");
    expect_remote_absent("a.txt");
    expect_remote("c.tmp", "c\n");
    json_t *st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
}

/* Runs gpusync without the capabilities that let root read any file (the tests run as root), so
 * that a mode 000 file cannot be read here, as for a user a file created by a container's root. */
/* The audit's case: the user pulls a job's output folder while watch runs, the job then writes a
 * newer checkpoint. The pulled copy is not sent back, and the flush leaves the job's file where it
 * wrote it (no conflict copy, nothing put back) and says up to date. */
static void test_watch__a_pulled_output_stays_the_jobs_when_it_writes_a_newer_one(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.py", "print(1)\n");
    watch_start();
    flush("first flush");
    char abs[2048];
    path_in(abs, sizeof(abs), cur.remote, "out");
    assert_int_equal(mkdir(abs, 0755), 0);
    path_in(abs, sizeof(abs), cur.remote, "out/model.pt");
    write_at(abs, "epoch 1 weights", 15, O_TRUNC); /* the job, on the server */
    gs_ok(ARGS("pull", "out"), "gpusync pull out");
    flush("flush after the pull");
    write_at(abs, "epoch 2 weights (better)", 24, O_TRUNC); /* the job goes on */
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--json", "--timeout", "150"));
    expect_status(&r, 0, "flush after the job's new checkpoint");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_true(json_object_get(o, "ok")));
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    gs_test_result_release(&r);
    expect_remote("out/model.pt", "epoch 2 weights (better)");
    assert_int_equal(gs_test_sh("ls -A '%s/out' | grep -qv '^model.pt$'", cur.remote), 1);
    char here[2048];
    path_in(here, sizeof(here), cur.local, "out/model.pt");
    struct gs_buf b = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(here, &b), 0);
    assert_string_equal(b.data, "epoch 1 weights");
    gs_buf_release(&b);
    json_t *st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
}

static struct gs_test_result gpusync_without_dac_override(const char *const *args)
{
    const char *argv[32] = {"/usr/bin/setpriv", "--bounding-set=-dac_override,-dac_read_search",
                            gs_test_gpusync()};
    int n = 3;
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return run_prog(cur.local, argv);
}

static const char *error_of(const struct gs_test_result *r)
{
    static char kind[256];
    json_error_t jerr;
    json_t *o = json_loads(r->out.data ? r->out.data : "", 0, &jerr);
    snprintf(kind, sizeof(kind), "%s",
             o ? json_string_value(json_object_get(o, "error")) : jerr.text);
    json_decref(o);
    return kind;
}

/* A file that cannot be read here is reported as failed, a local error (exit 1, "input/output
 * error"), and holds nothing else back: the daemon and a push send the rest, and the server keeps
 * its copy of that file until it can be read again. */
static void test_watch__a_file_unreadable_here_holds_back_nothing_else(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a1\n");
    put("secret.txt", "s1\n");
    struct gs_test_result r = gpusync_without_dac_override(ARGS("watch", "-d"));
    expect_status(&r, 0, "watch -d");
    gs_test_result_release(&r);
    flush("first flush");
    char secret[PATH_MAX];
    path_in(secret, sizeof(secret), cur.local, "secret.txt");
    put("secret.txt", "s2\n");
    assert_int_equal(chmod(secret, 0), 0);
    put("a.txt", "a2\n");
    r = gpusync(cur.local, ARGS("flush", "--json"));
    expect_status(&r, 1, "flush with an unreadable file");
    assert_string_equal(error_of(&r), "input/output error");
    gs_test_result_release(&r);
    expect_remote("a.txt", "a2\n");
    expect_remote("secret.txt", "s1\n");
    assert_int_equal(chmod(secret, 0644), 0);
    flush("flush once it can be read");
    expect_remote("secret.txt", "s2\n");
    gs_ok(ARGS("watch", "--stop"), "watch --stop");

    put("secret.txt", "s3\n");
    assert_int_equal(chmod(secret, 0), 0);
    put("a.txt", "a3\n");
    r = gpusync_without_dac_override(ARGS("push", "--json"));
    expect_status(&r, 1, "push with an unreadable file");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    json_t *failures = json_object_get(o, "failures");
    assert_int_equal(json_array_size(failures), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(failures, 0), "path")),
                        "secret.txt");
    json_decref(o);
    gs_test_result_release(&r);
    expect_remote("a.txt", "a3\n");
    expect_remote("secret.txt", "s2\n");
    assert_int_equal(chmod(secret, 0644), 0);
}

/* `init` run again for another remote path while the daemon runs: the daemon, which syncs to the
 * old one, stops instead of answering flushes for a server the project no longer names; the next
 * flush (no daemon now) pushes to the new path. */
static void test_watch__init_for_another_path_stops_the_daemon(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    assert_true(pid > 0);
    char target[64], other[PATH_MAX];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", sshd.port);
    snprintf(other, sizeof(other), "%s/remote-new", cur.base);
    gs_ok(ARGS("init", target, "--path", other), "init for another path");
    put("b.txt", "b\n");
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "150"));
    gs_test_result_release(&r); /* answered by the stopping daemon or by a push: either way... */
    r = gpusync(cur.local, ARGS("flush", "--timeout", "150"));
    expect_status(&r, 0, "flush after init");
    gs_test_result_release(&r);
    gs_test_await_gone(pid); /* ...the daemon is gone */
    char b[PATH_MAX + 8];
    snprintf(b, sizeof(b), "%s/b.txt", other);
    assert_int_equal(access(b, F_OK), 0);
}

/* The project folder renamed under a running daemon: the control socket moved with it, so
 * `status` from the new place reached the old daemon, which said running and up to date while it
 * read and wrote every path under the old name. It now stops at the first question, saying where
 * the folder went: status answers from the folder itself, and the next flush pushes. */
static void test_watch__a_project_moved_under_the_daemon_is_never_up_to_date(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    char moved[sizeof(cur.local)];
    snprintf(moved, sizeof(moved), "%s/proj-moved", cur.base);
    assert_int_equal(rename(cur.local, moved), 0);
    snprintf(cur.local, sizeof(cur.local), "%s", moved);
    json_t *st = status_json(); /* the folder's own answer: not the daemon's, not an error */
    if (json_is_true(json_object_get(st, "daemon")) || !json_is_true(json_object_get(st, "ok")) ||
        !json_is_integer(json_object_get(st, "pending"))) {
        char *text = json_dumps(st, JSON_COMPACT);
        fail_msg("status of the moved project did not come from the folder itself: %s", text);
    }
    json_decref(st);
    gs_test_await_gone(pid);
    put("b.txt", "b\n");
    st = status_json();
    assert_int_equal(json_integer_value(json_object_get(st, "pending")), 1);
    json_decref(st);
    flush("flush from the new place, no daemon");
    expect_remote("b.txt", "b\n");
}

/* Two hard links to one file: a save through one name changes the other's content too, though
 * the watcher reports only the name written. Both reach the server. */
static void test_watch__a_save_through_one_hard_link_sends_the_other_name_too(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.cfg", "v1\n");
    char a[PATH_MAX], b[PATH_MAX];
    path_in(a, sizeof(a), cur.local, "a.cfg");
    path_in(b, sizeof(b), cur.local, "b.cfg");
    assert_int_equal(link(a, b), 0);
    watch_start();
    flush("first flush");
    expect_remote("b.cfg", "v1\n");
    put("a.cfg", "v2, written through a.cfg\n");
    flush("flush after the save");
    expect_remote("a.cfg", "v2, written through a.cfg\n");
    expect_remote("b.cfg", "v2, written through a.cfg\n");
}

/* ---- editor save patterns ---- */

static ino_t inode_of(const char *rel)
{
    char abs[2048];
    struct stat st;
    path_in(abs, sizeof(abs), cur.local, rel);
    assert_int_equal(lstat(abs, &st), 0);
    return st.st_ino;
}

/* Appends `line` to `file` with nvim. The project lies in /tmp, which 'backupskip' exempts from
 * backups by default: clear it, so that the save goes the way it goes in a home directory. */
static void nvim_append(const char *file, const char *backupcopy, const char *line)
{
    char opts[128], edit[256], normal[256];
    snprintf(opts, sizeof(opts), "set backupskip= backupcopy=%s", backupcopy);
    snprintf(edit, sizeof(edit), "edit %s", file);
    snprintf(normal, sizeof(normal), "normal! Go%s", line);
    struct gs_test_result r = run_prog(cur.local, ARGS("nvim", "--headless", "-i", "NONE", "-c",
                                                       opts, "-c", edit, "-c", normal, "-c", "wq"));
    expect_status(&r, 0, "nvim");
    gs_test_result_release(&r);
}

static void test_watch__nvim_saves_arrive(void **state)
{
    (void)state;
    if (access("/usr/bin/nvim", X_OK) != 0)
        skip();
    proj_init(sshd.port);
    put("default.py", "a = 1\n");
    put("copy.py", "b = 2\n");
    watch_start();
    flush("first flush");
    ino_t before = inode_of("default.py");
    nvim_append("default.py", "auto", "a = 2");
    assert_true(inode_of("default.py") != before); /* it did save by backup + rename */
    flush("flush after an nvim save (backupcopy=auto)");
    expect_remote("default.py", "a = 1\na = 2\n");
    before = inode_of("copy.py");
    nvim_append("copy.py", "yes", "b = 3");
    assert_true(inode_of("copy.py") == before); /* it did save in place */
    flush("flush after an nvim save (backupcopy=yes)");
    expect_remote("copy.py", "b = 2\nb = 3\n");
    for (int i = 0; i < 3; i++) /* repeated saves, as a user does */
        nvim_append("default.py", "auto", "c = 1");
    flush("flush after repeated saves");
    expect_remote("default.py", "a = 1\na = 2\nc = 1\nc = 1\nc = 1\n");
    expect_trees_equal("after nvim saves");
}

/* vim proper, in Ex mode: with `backup` it renames the original to FILE~ and keeps it. */
static void test_watch__vim_saves_arrive(void **state)
{
    (void)state;
    if (access("/usr/bin/vim", X_OK) != 0)
        skip();
    proj_init(sshd.port);
    put("v.py", "x = 1\n");
    put("w.py", "y = 1\n");
    watch_start();
    flush("first flush");
    ino_t v_before = inode_of("v.py"), w_before = inode_of("w.py");
    struct gs_test_result r =
        run_prog(cur.local, ARGS("vim", "-u", "NONE", "-i", "NONE", "-N", "-n", "-es", "-c",
                                 "set backupskip= backup backupcopy=no", "-c", "$put ='x = 2'",
                                 "-c", "wq", "v.py"));
    expect_status(&r, 0, "vim -es (backupcopy=no)");
    gs_test_result_release(&r);
    r = run_prog(cur.local,
                 ARGS("vim", "-u", "NONE", "-i", "NONE", "-N", "-n", "-es", "-c",
                      "set backupskip= backupcopy=yes", "-c", "$put ='y = 2'", "-c", "wq", "w.py"));
    expect_status(&r, 0, "vim -es (backupcopy=yes)");
    gs_test_result_release(&r);
    assert_true(inode_of("v.py") != v_before); /* backup by rename, new file */
    assert_true(inode_of("w.py") == w_before); /* in place */
    flush("flush after vim saves");
    expect_remote("v.py", "x = 1\nx = 2\n");
    expect_local_present("v.py~");
    expect_remote_absent("v.py~"); /* editor backups are not synced */
    expect_remote("w.py", "y = 1\ny = 2\n");
    expect_trees_equal("after vim saves");
}

static void test_watch__emacs_rename_save_arrives(void **state)
{
    (void)state;
    if (access("/usr/bin/emacs", X_OK) != 0)
        skip();
    proj_init(sshd.port);
    put("notes.txt", "first\n");
    watch_start();
    flush("first flush");
    struct gs_test_result r =
        run_prog(cur.local, ARGS("emacs", "--batch", "--eval",
                                 "(progn (setq backup-enable-predicate (lambda (_name) t))"
                                 " (find-file \"notes.txt\") (goto-char (point-max))"
                                 " (insert \"second\\n\") (save-buffer))"));
    expect_status(&r, 0, "emacs --batch");
    gs_test_result_release(&r);
    flush("flush after an emacs save");
    expect_remote("notes.txt", "first\nsecond\n");
    /* Emacs renamed the original to its backup (the project is in /tmp, which its default
     * backup-enable-predicate exempts: the test lifts that) and wrote a new file. The backup is
     * an editor scratch file: never synced. */
    expect_local_present("notes.txt~");
    expect_remote_absent("notes.txt~");
    expect_trees_equal("after an emacs save");
}

/* vim without backupcopy: 4913 probe, original renamed to the backup, new file written. */
static void save_like_vim(const char *rel, const char *content)
{
    char abs[2048], bak[2100], probe[2048];
    path_in(abs, sizeof(abs), cur.local, rel);
    snprintf(bak, sizeof(bak), "%s~", abs);
    path_in(probe, sizeof(probe), cur.local, "4913");
    write_at(probe, "", 0, O_EXCL);
    assert_int_equal(unlink(probe), 0);
    assert_int_equal(rename(abs, bak), 0);
    write_at(abs, content, strlen(content), O_TRUNC);
    assert_int_equal(chmod(abs, 0644), 0);
    assert_int_equal(unlink(bak), 0);
}

/* JetBrains "safe write": temp file, original moved aside, temp renamed in, original deleted. */
static void save_like_jetbrains(const char *rel, const char *content)
{
    char abs[2048], tmp[2100], old[2100];
    path_in(abs, sizeof(abs), cur.local, rel);
    snprintf(tmp, sizeof(tmp), "%s___jb_tmp___", abs);
    snprintf(old, sizeof(old), "%s___jb_old___", abs);
    write_at(tmp, content, strlen(content), O_TRUNC);
    assert_int_equal(rename(abs, old), 0);
    assert_int_equal(rename(tmp, abs), 0);
    assert_int_equal(unlink(old), 0);
}

/* VS Code: truncate in place, then write (two inotify modifications of the same inode). */
static void save_like_vscode(const char *rel, const char *content)
{
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, rel);
    int fd = open(abs, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    size_t half = strlen(content) / 2;
    assert_int_equal(write(fd, content, half), (ssize_t)half);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(write(fd, content + half, strlen(content) - half),
                     (ssize_t)(strlen(content) - half));
    assert_int_equal(close(fd), 0);
}

static void test_watch__editor_syscall_sequences_arrive(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("vim.c", "int a;\n");
    put("jb.kt", "val a = 1\n");
    put("code.ts", "let a = 1;\n");
    put("sed.cfg", "lr = 0.1\n");
    watch_start();
    flush("first flush");
    for (int round = 0; round < 3; round++) {
        char v[64], j[64], c[64];
        snprintf(v, sizeof(v), "int a;\nint b%d;\n", round);
        snprintf(j, sizeof(j), "val a = %d\n", round + 2);
        snprintf(c, sizeof(c), "let a = %d; // a longer line %d\n", round, round);
        save_like_vim("vim.c", v);
        save_like_jetbrains("jb.kt", j);
        save_like_vscode("code.ts", c);
        assert_int_equal(
            gs_test_sh("cd '%s' && sed -i 's/lr = .*/lr = 0.0%d/' sed.cfg", cur.local, round), 0);
        flush("flush after editor saves");
        expect_remote("vim.c", v);
        expect_remote("jb.kt", j);
        expect_remote("code.ts", c);
        char s[32];
        snprintf(s, sizeof(s), "lr = 0.0%d\n", round);
        expect_remote("sed.cfg", s);
        expect_trees_equal("after editor saves");
    }
}

/* ---- bulk changes ---- */

static void test_watch__directory_rename_is_one_remote_rename(void **state)
{
    (void)state;
    proj_init(sshd.port);
    assert_int_equal(
        gs_test_sh("cd '%s' && mkdir -p big/sub && for i in $(seq 1 990); do echo \"file $i\" "
                   "> big/f$i.txt; done && for i in $(seq 1 10); do echo \"sub $i\" > "
                   "big/sub/s$i.txt; done",
                   cur.local),
        0);
    watch_start();
    flush("first flush");
    expect_trees_equal("before the rename");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker1"); /* the stream is subscribed */
    rename_in("big", "moved");
    flush("flush after the directory rename");
    events_mark(&ev, "marker2");
    int renamed_dir = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev.all, i, e)
    {
        const char *k = json_string_value(json_object_get(e, "event"));
        const char *p = json_string_value(json_object_get(e, "path"));
        const char *from = json_string_value(json_object_get(e, "from"));
        renamed_dir +=
            k && p && from && !strcmp(k, "renamed") && !strcmp(p, "moved") && !strcmp(from, "big");
    }
    int renamed = gs_test_events_count(&ev, "renamed", ""),
        synced = gs_test_events_count(&ev, "synced", "moved"),
        deleted = gs_test_events_count(&ev, "deleted", "");
    gs_test_events_stop(&ev);
    if (renamed_dir != 1 || renamed != 1 || synced != 0 || deleted != 0)
        fail_msg("directory rename: %d rename(s) of big -> moved, %d renamed events in all, %d "
                 "files synced under moved/, %d deleted (want 1, 1, 0, 0)",
                 renamed_dir, renamed, synced, deleted);
    expect_trees_equal("after the directory rename");

    /* The moved directory's watches now report paths under its new name. */
    put("moved/f5.txt", "edited after the move\n");
    put("moved/sub/s3.txt", "edited too\n");
    flush("flush after edits in the moved directory");
    expect_remote("moved/f5.txt", "edited after the move\n");
    expect_remote("moved/sub/s3.txt", "edited too\n");

    /* Moved out of the tree: a delete; edits outside are not ours; moved back: a create. */
    char outside[128], inside[2048];
    snprintf(outside, sizeof(outside), "%s/outside", cur.base);
    path_in(inside, sizeof(inside), cur.local, "moved");
    assert_int_equal(rename(inside, outside), 0);
    flush("flush after moving the directory out");
    expect_trees_equal("after moving the directory out");
    assert_int_equal(gs_test_sh("echo outside > '%s/f7.txt'", outside), 0);
    assert_int_equal(rename(outside, inside), 0);
    flush("flush after moving the directory back");
    expect_trees_equal("after moving the directory back");
    put("moved/sub/s4.txt", "watched again\n");
    flush("flush after an edit in the returned directory");
    expect_remote("moved/sub/s4.txt", "watched again\n");
}

/* A change the server refuses: flush must not claim the server matches, and once the server
 * accepts writes again a flush retries it. */
static void test_watch__flush_reports_a_failed_change_and_retries_it(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("ok.txt", "ok\n");
    mkdir_in("locked");
    put("locked/old.txt", "old\n");
    watch_start();
    flush("first flush");
    path_in(immutable, sizeof(immutable), cur.remote, "locked");
    if (gs_test_sh("chattr +i '%s' 2>/dev/null", immutable) != 0) {
        immutable[0] = '\0';
        print_message("chattr +i is not supported here; skipped\n");
        skip();
    }
    put("locked/new.txt", "new\n");
    put("ok.txt", "ok 2\n");
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "60"));
    if (r.status == 0)
        fail_msg("flush succeeded although the server could not take locked/new.txt: %s",
                 r.out.data);
    assert_non_null(strstr(r.err.data, "locked/new.txt"));
    gs_test_result_release(&r);
    expect_remote("ok.txt", "ok 2\n"); /* the rest went through */
    json_t *st = daemon_status_json();
    assert_true(json_is_string(json_object_get(st, "last_error")));
    assert_string_not_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    assert_true(json_integer_value(json_object_get(st, "pending")) >= 1);
    json_decref(st);

    assert_int_equal(gs_test_sh("chattr -i '%s'", immutable), 0);
    immutable[0] = '\0';
    flush("flush once the server accepts writes again");
    expect_trees_equal("after the retry");
    st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    assert_true(json_is_null(json_object_get(st, "last_error")));
    json_decref(st);
}

/* A file the daemon cannot read (here under another process's write lease: its non-blocking open
 * is refused with EAGAIN) fails alone: the rest of its batch is sent, the flush fails naming it,
 * and the path is kept and tried again, so once it can be read a flush sends it. (Before, the
 * batch failed as a whole; earlier still it was dropped, and a later flush answered success over
 * a change never sent.) */
static void test_watch__a_file_that_cannot_be_read_is_sent_once_it_can(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("leased.txt", "v1\n");
    put("other.txt", "v1\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, "leased.txt");
    void (*old_sigio)(int) = signal(SIGIO, SIG_IGN); /* the lease-break notice */
    int fd = open(abs, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    if (fcntl(fd, F_SETLEASE, F_WRLCK) < 0) {
        close(fd);
        signal(SIGIO, old_sigio);
        print_message("no file leases here (%s); skipped\n", strerror(errno));
        skip();
    }
    assert_int_equal(kill(pid, SIGSTOP), 0); /* both changes are read, and planned, as one batch */
    assert_int_equal(pwrite(fd, "v2 leased\n", 10, 0), 10);
    put("other.txt", "v2 other\n");
    assert_int_equal(kill(pid, SIGCONT), 0);
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "60"));
    if (r.status == 0)
        fail_msg("flush succeeded although leased.txt could not be read: %s", r.out.data);
    assert_non_null(strstr(r.err.data, "leased.txt"));
    gs_test_result_release(&r);
    expect_remote("other.txt", "v2 other\n"); /* the rest of the batch went */
    expect_remote("leased.txt", "v1\n");

    /* Releasing the lease and closing the file: the failed path is tried again and sent. */
    assert_int_equal(fcntl(fd, F_SETLEASE, F_UNLCK), 0);
    assert_int_equal(close(fd), 0);
    signal(SIGIO, old_sigio);
    flush("flush once leased.txt can be read");
    expect_remote("leased.txt", "v2 leased\n");
    expect_trees_equal("after the retry");
}

/* Sends `line` on a new connection to the daemon's socket and returns the one-line answer. */
static json_t *control_exchange(const char *line)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/.gpusync/daemon.sock", cur.local);
    assert_true(n > 0 && (size_t)n < sizeof(addr.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    struct gs_buf in = GS_BUF_INIT;
    char *nl = NULL;
    int64_t end = gs_clock_mono_ms() + 5000;
    while (!(in.len && (nl = memchr(in.data, '\n', in.len)))) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - gs_clock_mono_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            fail_msg("no answer to %s", line);
        char chunk[4096];
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got <= 0)
            fail_msg("the daemon hung up on %s without an answer", line);
        gs_buf_add(&in, chunk, (size_t)got);
    }
    json_t *msg = json_loadb(in.data, (size_t)(nl - in.data), 0, NULL);
    gs_buf_release(&in);
    close(fd);
    assert_non_null(msg);
    return msg;
}

/* Connects to the daemon's control socket and sends `line`. */
static int control_send_line(const char *line)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/.gpusync/daemon.sock", cur.local);
    assert_true(n > 0 && (size_t)n < sizeof(addr.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    return fd;
}

/* Reads everything the daemon sends on `fd` until it closes (or 30 s pass). */
static void read_to_close(int fd, struct gs_buf *in)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - gs_clock_mono_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            fail_msg("the exec stream did not end: %.*s", (int)in->len, in->data);
        char chunk[4096];
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got <= 0)
            return;
        gs_buf_add(in, chunk, (size_t)got);
    }
}

/* Splits an exec stream (control.h: header line, then o/e/x frames) into its parts. */
static void parse_exec_stream(const struct gs_buf *in, struct gs_buf *out, struct gs_buf *err,
                              int *status)
{
    const char *p = memchr(in->data, '\n', in->len), *end = in->data + in->len;
    assert_non_null(p);
    json_t *head = json_loadb(in->data, (size_t)(p - in->data), 0, NULL);
    assert_true(json_is_true(json_object_get(head, "ok")));
    json_decref(head);
    *status = -99;
    for (p++; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        assert_non_null(nl);
        unsigned long len = 0;
        if (*p == 'x') {
            assert_int_equal(sscanf(p, "x %d", status), 1);
            assert_true(nl + 1 == end); /* the end is the end */
            return;
        }
        assert_true((*p == 'o' || *p == 'e') && sscanf(p + 1, " %lu", &len) == 1);
        assert_true(nl + 1 + len <= end);
        gs_buf_add(*p == 'o' ? out : err, nl + 1, len);
        p = nl + 1 + len;
    }
    fail_msg("the exec stream has no end frame");
}

/* The relay (syncd/relay.h): a command run through the daemon gives its stdout, its stderr and its
 * exit status, byte for byte, and status --json counts it. */
static void test_watch__exec_through_the_daemon_returns_output_and_status(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    await_connected(1, 20000);
    int fd = control_send_line("{\"v\":1,\"cmd\":\"exec\",\"command\":"
                               "\"printf 'out\\\\n\\\\0x'; echo err >&2; exit 3\"}\n");
    struct gs_buf in = GS_BUF_INIT, out = GS_BUF_INIT, err = GS_BUF_INIT;
    read_to_close(fd, &in);
    close(fd);
    int status;
    parse_exec_stream(&in, &out, &err, &status);
    assert_int_equal(status, 3);
    assert_int_equal(out.len, 6);
    assert_memory_equal(out.data, "out\n\0x", 6);
    assert_string_equal(err.data, "err\n");
    gs_buf_release(&in);
    gs_buf_release(&out);
    gs_buf_release(&err);
    json_t *st = daemon_status_json();
    assert_true(json_integer_value(json_object_get(st, "relayed")) >= 1);
    json_decref(st);
}

/* A client that leaves mid-command ends the command on the server, and the daemon goes on. */
static void test_watch__exec_client_leaving_ends_the_remote_command(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    await_connected(1, 20000);
    char marker[2048], line[4096];
    path_in(marker, sizeof(marker), cur.base, "relay-pid");
    snprintf(line, sizeof(line),
             "{\"v\":1,\"cmd\":\"exec\",\"command\":\"echo $$ > %s; "
             "while :; do echo tick; sleep 0.05; done\"}\n",
             marker);
    int fd = control_send_line(line);
    struct gs_buf in = GS_BUF_INIT;
    while (!strstr(in.data ? in.data : "", "tick")) { /* the command is running */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_true(poll(&p, 1, 20000) > 0);
        char chunk[512];
        ssize_t got = read(fd, chunk, sizeof(chunk) - 1);
        assert_true(got > 0);
        gs_buf_add(&in, chunk, (size_t)got);
    }
    gs_buf_release(&in);
    close(fd);
    struct gs_buf pid_text = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(marker, &pid_text), 0);
    pid_t pid = (pid_t)atoi(pid_text.data);
    gs_buf_release(&pid_text);
    assert_true(pid > 1);
    gs_test_await_gone(pid);
    flush("the daemon still syncs");
}

/* Wrong versions, garbage and unknown commands get an error answer; the daemon carries on. */
static void test_watch__control_socket_answers_bad_requests_with_errors(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    const char *bad[] = {"{\"v\":2,\"cmd\":\"status\"}\n", "not json\n",
                         "{\"v\":1,\"cmd\":\"frobnicate\"}\n", "{\"v\":1}\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *m = control_exchange(bad[i]);
        assert_false(json_is_true(json_object_get(m, "ok")));
        assert_true(json_is_string(json_object_get(m, "error")));
        assert_int_equal(json_integer_value(json_object_get(m, "v")), 1);
        json_decref(m);
    }
    json_t *m = control_exchange("{\"v\":1,\"cmd\":\"status\"}\n");
    assert_true(json_is_true(json_object_get(m, "ok")));
    assert_true(json_is_true(json_object_get(m, "daemon")));
    json_decref(m);
    flush("flush after bad requests");
}

/* The control socket's path would exceed sun_path's 108 bytes: it goes through /proc/self/fd. */
static void test_watch__long_project_path_with_spaces_works(void **state)
{
    (void)state;
    proj_init_named(sshd.port, "a project folder with spaces and a name long enough that "
                               "its control socket path cannot fit in sun_path");
    assert_true(strlen(cur.local) + strlen("/.gpusync/daemon.sock") > 108);
    put("a b.py", "x\n");
    watch_start();
    flush("first flush");
    put("a b.py", "y\n");
    flush("flush after an edit");
    expect_remote("a b.py", "y\n");
    json_t *st = daemon_status_json();
    assert_true(json_is_true(json_object_get(st, "connected")));
    json_decref(st);
    struct gs_test_result r = gpusync(cur.local, ARGS("watch", "-d"));
    assert_int_not_equal(r.status, 0);
    gs_test_result_release(&r);
    gs_ok(ARGS("watch", "--stop"), "gpusync watch --stop");
}

/* A file written without pause (a training log) is still sent while it grows: the debounce
 * window has a cap. */
static void test_watch__a_continuously_written_file_syncs_before_the_writes_stop(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    flush("first flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker");
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, "train.log");
    int seen_while_writing = 0;
    int64_t end = gs_clock_mono_ms() + 2000;
    for (int i = 0; gs_clock_mono_ms() < end; i++) {
        char line[64];
        int len = snprintf(line, sizeof(line), "step %d loss 0.%d\n", i, 1000 - i);
        write_at(abs, line, (size_t)len, O_APPEND);
        if (!seen_while_writing)
            seen_while_writing = gs_test_events_wait(&ev, "synced", "train.log", 0);
        usleep(5000); /* the writer's pace (shorter than the debounce), not synchronisation */
    }
    gs_test_events_stop(&ev);
    assert_true(seen_while_writing);
    flush("flush after the writer stopped");
    expect_trees_equal("after the writer stopped");
}

/* Saves in a steady stream never wait for the liveness check. It opens a channel (two round
 * trips, the loop blocked) every 5 s of a link without answers, and it used to run between saves
 * too: the next save waited for it. From the write to its "synced" event a save takes about one
 * round trip; one behind the check takes up to three. The bar is two round trips, at 200 ms
 * RTT so that it stands 200 ms clear of both: at 100 ms RTT a sanitized build once took 217 ms
 * (disk and scheduling, no check) against a bar of 200. */
static void test_watch__steady_saves_never_wait_for_the_liveness_check(void **state)
{
    (void)state;
    char err[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 100};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    watch_start();
    flush("first flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker");
    int64_t worst = 0;
    int saves = 0;
    for (int64_t end = gs_clock_mono_ms() + 7000; gs_clock_mono_ms() < end; saves++) {
        char body[64];
        snprintf(body, sizeof(body), "save %d\n", saves);
        /* timed from the write, by this clock: the daemon's own "ms" starts when it reads the
         * save's event, which is after a check that blocked its loop */
        int64_t t0 = gs_clock_mono_ms();
        put("edit.py", body);
        gs_test_events_until(&ev, "synced", "edit.py", 5000);
        int64_t ms = gs_clock_mono_ms() - t0;
        worst = ms > worst ? ms : worst;
        usleep(20000); /* a person's pace between saves, not synchronisation */
    }
    gs_test_events_stop(&ev);
    print_message("%d saves at 200 ms RTT; the slowest took %lld ms\n", saves, (long long)worst);
    if (worst >= 400)
        fail_msg("a save took %lld ms at 200 ms RTT: it waited for something", (long long)worst);
}

/* A project watched over a link of `rate_mbit` (5 ms each way), flushed once, with `ev`
 * subscribed; then `bytes` random bytes arrive as big.bin, written beside the project and renamed
 * in, so the daemon sees one whole file. */
static void large_file_over_a_slow_link(int rate_mbit, int bytes, struct gs_test_events *ev)
{
    char err[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5, .rate_mbit = rate_mbit};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    watch_start();
    flush("first flush");
    gs_test_events_start(ev, cur.local);
    events_mark(ev, "marker");
    assert_int_equal(gs_test_sh("head -c %d /dev/urandom > '%s/big.bin' && "
                                "mv '%s/big.bin' '%s/big.bin'",
                                bytes, cur.base, cur.base, cur.local),
                     0);
}

/* Waits for big.bin's "synced" event, ends the event stream, and checks the server has it all. */
static void large_file_arrives(struct gs_test_events *ev)
{
    gs_test_events_until(ev, "synced", "big.bin", 30000);
    gs_test_events_stop(ev);
    flush("flush after the large file");
    expect_trees_equal("after the large file");
}

/* A batch that carries one large file reports its progress in bytes while the file goes, not
 * only once it has arrived, so a plugin shows it moving (at 16 Mbit/s, 3 MB take 1.5 s). */
static void test_watch__a_large_file_reports_progress_in_bytes_while_it_goes(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(16, 3000000, &ev);
    gs_test_events_until(&ev, "synced", "big.bin", 30000);
    int moving = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev.all, i, e)
    {
        json_int_t bytes = json_integer_value(json_object_get(e, "bytes"));
        moving += strcmp(json_string_value(json_object_get(e, "event")), "progress") == 0 &&
                  json_integer_value(json_object_get(e, "ops_done")) == 0 && bytes > 0 &&
                  bytes < json_integer_value(json_object_get(e, "bytes_total"));
    }
    if (!moving) {
        char *all = json_dumps(ev.all, 0);
        fail_msg("no progress event showed big.bin's bytes moving: %s", all);
    }
    gs_test_events_stop(&ev);
    flush("flush after the large file");
    expect_trees_equal("after the large file");
}

/* While a batch sends a large file, `status` is answered by the daemon, which is busy with it:
 * "syncing", the file pending, and how far the batch has got. The daemon used to read no request
 * until the batch ended: status gave up on it after 5 s and then failed on the index the batch
 * holds ("database is locked"), or, had it got through, said that no daemon ran. */
static void test_watch__status_during_a_long_batch_says_syncing(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);     /* about 6 s in one batch */
    gs_test_events_until(&ev, "progress", "", 20000); /* the batch is under way */
    json_t *st = gs_test_gpusync_json(cur.local, ARGS("status", "--json"), 0,
                                      "status --json during the batch");
    json_t *batch = json_object_get(st, "batch");
    json_int_t sent = json_integer_value(json_object_get(batch, "bytes"));
    if (!json_is_true(json_object_get(st, "daemon")) ||
        strcmp(json_string_value(json_object_get(st, "state")) ?: "", "syncing") != 0 ||
        json_integer_value(json_object_get(st, "pending")) < 1 || !batch ||
        json_integer_value(json_object_get(batch, "bytes_total")) != 6000000 || sent >= 6000000) {
        char *text = json_dumps(st, 0);
        fail_msg("status during the batch: %s", text);
    }
    json_decref(st);
    large_file_arrives(&ev);
}

/* A project behind a stalled link (wansim), with a.py holding `text` and the daemon started: its
 * login hangs until the test resumes the link. */
static void watch_while_the_login_hangs(const char *text)
{
    char err[256], reply[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    put("a.py", text);
    assert_int_equal(wansim_command(&wan, "stall", reply, sizeof(reply)), 0);
    watch_start();
}

/* `watch --stop` while the daemon's login hangs on a stalled link stops it at once, and says that
 * it never compared the files with the server. The daemon used to wait out the login's timeout
 * (10 s for the handshake; its spare connection's too), longer than `watch --stop` waits (it
 * then said "still running"). */
static void test_watch__stop_while_the_login_hangs_is_prompt_and_says_unchecked(void **state)
{
    (void)state;
    char reply[256];
    watch_while_the_login_hangs("never sent\n");
    pid_t pid = daemon_pid();
    int64_t start = gs_clock_mono_ms();
    json_t *out = gs_test_gpusync_json(cur.local, ARGS("watch", "--stop", "--json"), 0,
                                       "stop while the login hangs");
    gs_test_await_gone(pid);
    int64_t ms = gs_clock_mono_ms() - start;
    if (!json_is_true(json_object_get(out, "unchecked")) || ms > 5000) {
        char *text = json_dumps(out, 0);
        fail_msg("watch --stop while the login hangs: %s, gone after %lld ms", text, (long long)ms);
    }
    json_decref(out);
    assert_int_equal(wansim_command(&wan, "resume", reply, sizeof(reply)), 0);
    watch_start();
    flush("flush once the link is back");
    expect_trees_equal("after the restart");
}

/* The CPU time (user and system) process `pid` has used, in milliseconds. */
static long cpu_ms(pid_t pid)
{
    long long ticks = gs_test_proc_stat(pid, 14) + gs_test_proc_stat(pid, 15);
    return (long)(ticks * 1000 / sysconf(_SC_CLK_TCK));
}

/* A flush asked while the daemon's login hangs waits for that attempt without spinning: the
 * daemon used to poll with a zero timeout until the attempt ended, a core at 100% for as long as
 * the login hung. */
static void test_watch__a_flush_while_the_login_hangs_does_not_spin(void **state)
{
    (void)state;
    char reply[256];
    watch_while_the_login_hangs("sent once the link is back\n");
    pid_t pid = daemon_pid();
    long cpu_before = cpu_ms(pid);
    int64_t start = gs_clock_mono_ms();
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "2"));
    long wall = (long)(gs_clock_mono_ms() - start), used = cpu_ms(pid) - cpu_before;
    assert_int_not_equal(r.status, 0); /* nothing could be sent */
    gs_test_result_release(&r);
    if (used > wall / 4)
        fail_msg("the daemon used %ld ms of CPU in the %ld ms a flush waited on its login", used,
                 wall);
    assert_int_equal(wansim_command(&wan, "resume", reply, sizeof(reply)), 0);
    flush("flush once the link is back");
    expect_trees_equal("after the link came back");
}

/* Reads a terminal until its program has exited and closed it (EIO on Linux), or `limit_ms`. */
static void read_terminal_to_end(int term, struct gs_buf *screen, int limit_ms)
{
    int64_t end = gs_clock_mono_ms() + limit_ms;
    for (;;) {
        struct pollfd p = {.fd = term, .events = POLLIN};
        int left = (int)(end - gs_clock_mono_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            fail_msg("the terminal did not close within %d ms: %.*s", limit_ms, (int)screen->len,
                     screen->data);
        char chunk[4096];
        ssize_t n = read(term, chunk, sizeof(chunk));
        if (n <= 0)
            return;
        gs_buf_add(screen, chunk, (size_t)n);
    }
}

/* Runs `gpusync push [option]` (option NULL: none) in a terminal in the current project; returns
 * its wait status, with what it drew in `screen`. */
static int push_in_a_terminal(const char *option, struct gs_buf *screen)
{
    int term;
    pid_t pid = forkpty(&term, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        if (chdir(cur.local) != 0)
            _exit(126);
        execl(gs_test_gpusync(), "gpusync", "push", option, (char *)NULL);
        _exit(127);
    }
    read_terminal_to_end(term, screen, 60000);
    close(term);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* `gpusync push` in a terminal while the daemon sends a large file shows that batch moving, as a
 * push of its own would, instead of nothing until the daemon answers (the same for flush and
 * run, which wait on the daemon the same way). */
static void test_watch__a_push_through_the_daemon_shows_the_batch_moving(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);
    gs_test_events_until(&ev, "progress", "", 20000);
    struct gs_buf screen = GS_BUF_INIT;
    int status = push_in_a_terminal(NULL, &screen);
    gs_test_events_stop(&ev);
    /* the bar, and a summary that counts the batch the push waited on (it said "sent 0") */
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !strstr(screen.data, "/6.0 MB") ||
        !strstr(screen.data, "ETA") || !strstr(screen.data, "sent 1 (6.0 MB)"))
        fail_msg("push through the daemon (status %d) showed: %s", status, screen.data);
    gs_buf_release(&screen);
    expect_trees_equal("after the push");
}

/* A push reading a large changed file before it can send anything says so in a terminal: it
 * used to show nothing until the upload began (52 s for a 40 GB file here). --dry-run reads the
 * same and sends nothing; 4 GB of holes take about 5 s to read here, the bar shows from 250 ms. */
static void test_watch__a_push_reading_a_large_file_shows_it(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.py", "a\n");
    gs_ok(ARGS("push"), "first push");
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, "big.bin");
    int fd = open(abs, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4LL << 30), 0);
    close(fd);
    struct gs_buf screen = GS_BUF_INIT;
    int status = push_in_a_terminal("--dry-run", &screen);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !strstr(screen.data, "reading [") ||
        !strstr(screen.data, "/4.3 GB"))
        fail_msg("push --dry-run of a 4 GB file (status %d) showed: %s", status, screen.data);
    gs_buf_release(&screen);
    assert_int_equal(unlink(abs), 0);
}

/* A foreground `watch` on a terminal draws a status line. With a file it cannot read here, it
 * said "up to date" (it looked at the changes waiting, not at those that failed): now it says how
 * many failed, as status does. */
static void test_watch__the_foreground_line_never_says_up_to_date_over_a_failure(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    put("secret.txt", "s\n");
    char secret[PATH_MAX];
    path_in(secret, sizeof(secret), cur.local, "secret.txt");
    assert_int_equal(chmod(secret, 0), 0);
    int term;
    pid_t pid = forkpty(&term, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) { /* without the capabilities that let root read a file of mode 0 */
        if (chdir(cur.local) != 0)
            _exit(126);
        execl("/usr/bin/setpriv", "setpriv", "--bounding-set=-dac_override,-dac_read_search",
              gs_test_gpusync(), "watch", (char *)NULL);
        _exit(127);
    }
    await_serving(pid);
    struct gs_test_result r = gpusync(cur.local, ARGS("flush"));
    expect_status(&r, 1, "flush with an unreadable file");
    gs_test_result_release(&r);
    assert_int_equal(kill(pid, SIGINT), 0);
    struct gs_buf screen = GS_BUF_INIT;
    read_terminal_to_end(term, &screen, 30000);
    close(term);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    if (strstr(screen.data, "up to date") || !strstr(screen.data, "1 change failed"))
        fail_msg("the status line with secret.txt unreadable: %s", screen.data);
    gs_buf_release(&screen);
    assert_int_equal(chmod(secret, 0644), 0);
}

/* A command relayed through the daemon (`gpusync ps` here; `logs`, `top`, `stop` alike) runs while
 * a batch sends a large file: the relay's spare connections are not the batch's. It used to wait
 * for the batch to end (past 30 s it gave up on the daemon and connected by itself). */
static void test_watch__ps_during_a_long_batch_is_relayed_at_once(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);
    gs_test_events_until(&ev, "progress", "", 20000);
    json_t *st = daemon_status_json();
    json_int_t before = json_integer_value(json_object_get(st, "relayed"));
    json_decref(st);
    json_t *runs = gs_test_gpusync_json(cur.local, ARGS("ps", "--json"), 0, "ps during the batch");
    json_decref(runs);
    st = daemon_status_json(); /* the batch still going, the command relayed */
    if (json_integer_value(json_object_get(st, "relayed")) != before + 1 ||
        !json_object_get(st, "batch")) {
        char *text = json_dumps(st, 0);
        fail_msg("after ps during the batch: %s", text);
    }
    json_decref(st);
    large_file_arrives(&ev);
}

/* `watch --stop` while a batch sends a large file stops the daemon there, says that the file was
 * not sent, and loses nothing: the next watch sends it. The daemon used to read the request only
 * once the batch was over: --stop gave up after 5 s ("no answer", exit 4), and the daemon, whose
 * client had hung up by then, dropped the request and ran on. */
static void
test_watch__stop_during_a_long_batch_stops_there_and_says_what_was_not_sent(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);     /* about 6 s in one batch */
    gs_test_events_until(&ev, "progress", "", 20000); /* the batch is under way */
    pid_t pid = daemon_pid();
    json_t *out =
        gs_test_gpusync_json(cur.local, ARGS("watch", "--stop", "--json"), 0, "stop mid-batch");
    gs_test_await_gone(pid);
    gs_test_events_stop(&ev);
    if (!json_is_true(json_object_get(out, "was_running")) ||
        json_integer_value(json_object_get(out, "unsent")) != 1) {
        char *text = json_dumps(out, 0);
        fail_msg("watch --stop during the batch: %s", text);
    }
    json_decref(out);
    expect_remote_absent("big.bin"); /* the batch ended with the stop, not with the file */
    watch_start();
    flush("flush after the restart");
    expect_trees_equal("after the restart"); /* and no temporary is left on the server */
}

/* The same without --json: the warning that changes were left unsent goes to stderr, so a tool
 * that shows its console only for errors (JetBrains' Stop Watching) shows it; "stopped" stays on
 * stdout. */
static void test_watch__a_text_stop_warns_of_unsent_changes_on_stderr(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);     /* about 6 s in one batch */
    gs_test_events_until(&ev, "progress", "", 20000); /* the batch is under way */
    pid_t pid = daemon_pid();
    struct gs_test_result r =
        gs_test_run_gpusync(cur.local, NULL, NULL, GS_TEST_ARGS("watch", "--stop"), 60000);
    gs_test_await_gone(pid);
    gs_test_events_stop(&ev);
    gs_test_expect_status(&r, 0, "watch --stop mid-batch");
    if (!strstr(r.out.data, "stopped gpusync watch") ||
        !strstr(r.err.data, "1 change was not sent to the server"))
        fail_msg("watch --stop mid-batch\nstdout: %s\nstderr: %s", r.out.data, r.err.data);
    gs_test_result_release(&r);
}

/* A stop does not wait for the hash of a large file either: the batch asks while it reads local
 * files (syncd/plan.h's reading callback), and status says how far it has read. 16 GB of holes take
 * the daemon about 20 s to read here; the stop is answered at once (the CLI would give up after 5
 * s), the file counts as unsent, the status before it counted the batch's path as pending, and
 * nothing of the file reached the server. */
static void test_watch__stop_while_a_large_file_is_hashed_is_prompt(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.py", "a\n");
    watch_start();
    flush("first flush");
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, "huge.bin");
    int fd = open(abs, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 16LL << 30), 0); /* holes: no disk, but 16 GB to read */
    close(fd);
    json_t *st = await_batch(0, "a batch reading huge.bin");
    json_t *batch = json_object_get(st, "batch");
    assert_int_equal(json_integer_value(json_object_get(st, "pending")), 1);
    assert_int_equal(json_integer_value(json_object_get(batch, "read_bytes_total")), 16LL << 30);
    assert_true(json_integer_value(json_object_get(batch, "read_bytes")) < 16LL << 30);
    json_decref(st);
    pid_t pid = daemon_pid();
    json_t *out =
        gs_test_gpusync_json(cur.local, ARGS("watch", "--stop", "--json"), 0, "stop while hashing");
    gs_test_await_gone(pid);
    if (json_integer_value(json_object_get(out, "unsent")) != 1) {
        char *text = json_dumps(out, 0);
        fail_msg("watch --stop while hashing: %s", text);
    }
    json_decref(out);
    expect_remote_absent("huge.bin");
    assert_int_equal(unlink(abs), 0);
}

/* Waits until the daemon has read everything sent on `fd`: a Unix socket's sender is charged
 * for the bytes until the receiver reads them (SIOCOUTQ). */
static void await_read_by_daemon(int fd)
{
    int64_t end = gs_clock_mono_ms() + 10000;
    int queued;
    while (ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon did not read its control socket for 10 s");
        usleep(10000); /* polling an observable condition, with a deadline */
    }
}

/* A flush that waits on a batch when the daemon is told to stop (SIGTERM here, as from a service
 * manager or logout) gets an answer at once that the server may lack its changes: never "up to
 * date", and never a connection closed without a word. A `gpusync push` asked meanwhile pushes by
 * itself once the daemon is gone, whenever its request reached the daemon. */
static void test_watch__a_flush_waiting_when_the_daemon_stops_is_told_so(void **state)
{
    (void)state;
    struct gs_test_events ev;
    large_file_over_a_slow_link(8, 6000000, &ev);
    gs_test_events_until(&ev, "progress", "", 20000);
    pid_t pid = daemon_pid();
    int fd = control_send_line("{\"v\":1,\"cmd\":\"flush\"}\n");
    await_read_by_daemon(fd);
    int push_out, push_err;
    pid_t push =
        gs_test_start_gpusync(cur.local, NULL, NULL, ARGS("push", "--json"), &push_out, &push_err);
    assert_int_equal(kill(pid, SIGTERM), 0);
    struct gs_buf in = GS_BUF_INIT;
    read_to_close(fd, &in);
    close(fd);
    gs_test_await_gone(pid);
    gs_test_events_stop(&ev);
    json_t *reply = json_loadb(in.data, in.len, JSON_DISABLE_EOF_CHECK, NULL);
    if (!reply || json_is_true(json_object_get(reply, "ok")) ||
        !json_is_true(json_object_get(reply, "stopped")))
        fail_msg("the waiting flush was answered: %.*s", (int)in.len, in.data);
    json_decref(reply);
    gs_buf_release(&in);
    struct gs_test_result r = gs_test_finish(push, push_out, push_err, 60000);
    expect_status(&r, 0, "push while the daemon stopped");
    gs_test_result_release(&r);
    expect_trees_equal("after the push");
    watch_start();
    flush("flush after the restart");
    expect_trees_equal("after the restart");
}

/* An editor plugin that stops reading its event stream must not stall the daemon. */
static void test_watch__a_stuck_event_reader_does_not_stall_the_daemon(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    flush("first flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker");
    assert_int_equal(kill(ev.pid, SIGSTOP), 0);
    /* about 4,000 "synced" events of ~60 bytes: more than a socket buffer holds */
    make_files("many", 4000, 8);
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "60"));
    kill(ev.pid, SIGCONT);
    gs_test_events_stop(&ev);
    expect_status(&r, 0, "flush with a stuck event reader");
    gs_test_result_release(&r);
    expect_trees_equal("with a stuck event reader");
    put("after.txt", "after\n");
    flush("a later flush");
    expect_remote("after.txt", "after\n");
}

/* Paths that change kind between two batches (file -> directory, directory -> file): the daemon
 * is stopped meanwhile, so each change reaches it, and the plan, as one batch. */
static void test_watch__paths_that_change_kind_in_one_batch_converge(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("x", "a file\n");
    put("e", "a file that becomes an empty directory\n");
    mkdir_in("y");
    put("y/a", "in a directory\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    char abs[2048];
    path_in(abs, sizeof(abs), cur.local, "x");
    assert_int_equal(unlink(abs), 0);
    mkdir_in("x");
    put("x/inner", "inside\n");
    path_in(abs, sizeof(abs), cur.local, "e");
    assert_int_equal(unlink(abs), 0);
    mkdir_in("e");
    assert_int_equal(gs_test_sh("rm -r '%s/y'", cur.local), 0);
    put("y", "now a file\n");
    assert_int_equal(kill(pid, SIGCONT), 0);
    flush("flush after the kind changes");
    expect_trees_equal("after the kind changes");
}

/* A daemon that holds the project but does not answer (stopped by SIGSTOP, in a debugger): status
 * answers from the folder after 5 s, and says the daemon did not answer; it said no daemon ran. */
static void test_watch__status_of_a_daemon_that_does_not_answer_says_so(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    put("b.txt", "b\n");
    json_t *st = status_json();
    assert_int_equal(kill(pid, SIGCONT), 0);
    if (json_is_true(json_object_get(st, "daemon")) ||
        !json_is_true(json_object_get(st, "daemon_silent")) ||
        json_integer_value(json_object_get(st, "pending")) != 1) {
        char *text = json_dumps(st, JSON_COMPACT);
        fail_msg("status with the daemon stopped: %s", text);
    }
    json_decref(st);
    st = daemon_status_json(); /* answering again */
    json_decref(st);
}

/* More changed paths than one batch holds: the daemon falls back to a full push. */
static void test_watch__burst_of_3000_new_files_converges(void **state)
{
    (void)state;
    proj_init(sshd.port);
    watch_start();
    flush("first flush");
    make_files("b1", 1500, 64);
    make_files("b2", 1500, 64);
    flush("flush after the burst");
    expect_trees_equal("after the burst");
}

static void git(const char *args)
{
    if (gs_test_sh("cd '%s' && git -c user.name=t -c user.email=t@example.com %s >/dev/null 2>&1",
                   cur.local, args) != 0)
        fail_msg("git %s failed", args);
}

static void test_watch__git_checkout_of_500_files_converges(void **state)
{
    (void)state;
    proj_init(sshd.port);
    git("init -q -b main");
    assert_int_equal(
        gs_test_sh("cd '%s' && mkdir -p src/a src/b && for i in $(seq 1 250); do echo \"main "
                   "$i\" > src/a/m$i.py; echo \"main b $i\" > src/b/m$i.py; done && mkdir -p "
                   "only_main && echo x > only_main/x.py",
                   cur.local),
        0);
    git("add -A");
    git("commit -q -m main");
    git("checkout -q -b other");
    assert_int_equal(
        gs_test_sh("cd '%s' && for i in $(seq 1 250); do echo \"other $i\" > src/a/m$i.py; "
                   "echo \"other b $i $i\" > src/b/m$i.py; done && rm -r only_main && mkdir "
                   "only_other && echo y > only_other/y.py && chmod 755 src/a/m1.py",
                   cur.local),
        0);
    git("add -A");
    git("commit -q -m other");
    git("checkout -q main");
    watch_start();
    flush("first flush");
    expect_trees_equal("on main");
    git("checkout -q other");
    flush("flush after checkout other");
    expect_trees_equal("after checkout other");
    expect_remote("src/b/m7.py", "other b 7 7\n");
    git("checkout -q main");
    flush("flush after checkout main");
    expect_trees_equal("after checkout main");
}

static void test_watch__inotify_overflow_converges(void **state)
{
    (void)state;
    FILE *fp = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
    if (!fp || !fgets(saved_queued, sizeof(saved_queued), fp) ||
        access("/proc/sys/fs/inotify/max_queued_events", W_OK) != 0) {
        if (fp)
            fclose(fp);
        saved_queued[0] = '\0';
        print_message("cannot change fs.inotify.max_queued_events; skipped\n");
        skip();
    }
    fclose(fp);
    proj_init(sshd.port);
    make_files("keep", 20, 100);
    make_files("gone", 20, 100);
    /* The limit is read when an inotify instance is created: lower it for the daemon's only. */
    fp = fopen("/proc/sys/fs/inotify/max_queued_events", "w");
    assert_non_null(fp);
    fputs("16\n", fp);
    assert_int_equal(fclose(fp), 0);
    struct gs_test_result r = gpusync(cur.local, ARGS("watch", "-d"));
    restore_queued_events();
    expect_status(&r, 0, "gpusync watch -d");
    gs_test_result_release(&r);
    flush("first flush");
    expect_trees_equal("before the overflow");
    /* A stopped daemon reads nothing, so 16 queued events overflow for certain. */
    pid_t pid = daemon_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    make_files("new", 200, 50);
    make_files("keep", 20, 120);
    assert_int_equal(
        gs_test_sh(
            "cd '%s' && rm -r gone && mkdir -p deep/a/b && echo z > deep/a/b/z && mv keep kept",
            cur.local),
        0);
    assert_int_equal(kill(pid, SIGCONT), 0);
    flush("flush after the overflow");
    expect_trees_equal("after the overflow");
    /* still live after the rescan */
    put("deep/a/b/z", "after\n");
    put("kept/f3.bin", "renamed during the overflow\n");
    flush("flush after a later edit");
    expect_remote("deep/a/b/z", "after\n");
    expect_remote("kept/f3.bin", "renamed during the overflow\n");
    json_t *st = daemon_status_json(); /* root, new, kept, deep, deep/a, deep/a/b */
    assert_int_equal(json_integer_value(json_object_get(st, "watches")), 6);
    json_decref(st);
}

/* ---- faults ---- */

/* Cuts (or stalls) the link for `seconds` while files are edited, then restores it. With
 * `edit_at_once` 0 the edits start only once the daemon reports the link down, so that no request
 * is in flight when the link fails (that case has its own test). */
static void link_fault(const char *fault, const char *heal, int seconds, int edit_at_once)
{
    char err[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    make_files("src", 10, 200);
    watch_start();
    flush("first flush");
    char reply[256];
    assert_int_equal(wansim_command(&wan, fault, reply, sizeof(reply)), 0);
    int64_t start = gs_clock_mono_ms();
    if (!edit_at_once) {
        await_connected(0, 30000);
        print_message("%s: the daemon reported it within %lld ms\n", fault,
                      (long long)(gs_clock_mono_ms() - start));
    }
    for (int i = 0; gs_clock_mono_ms() - start < seconds * 1000; i++) {
        char rel[64], body[64];
        snprintf(rel, sizeof(rel), "src/edit%d.py", i % 7);
        snprintf(body, sizeof(body), "edit %d\n", i);
        put(rel, body);
        if (i == 3)
            rename_in("src/f1.bin", "src/renamed.bin");
        if (i == 5)
            assert_int_equal(unlink(strcat(strcpy(rel, cur.local), "/src/f2.bin")), 0);
        if (i == 8 && edit_at_once) {
            await_connected(0, 30000);
            print_message("%s: the daemon reported it within %lld ms\n", fault,
                          (long long)(gs_clock_mono_ms() - start));
        }
        usleep(500000); /* pacing the edits over the outage, not synchronisation */
    }
    /* A flush that cannot finish gives up when told, with a non-zero exit. */
    int64_t t0 = gs_clock_mono_ms();
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "2"));
    assert_int_not_equal(r.status, 0);
    assert_true(r.err.len > 0);
    assert_true(gs_clock_mono_ms() - t0 < 10000);
    gs_test_result_release(&r);
    json_t *st = daemon_status_json();
    assert_false(json_is_true(json_object_get(st, "connected")));
    assert_string_equal(json_string_value(json_object_get(st, "state")), "disconnected");
    json_decref(st);
    assert_int_equal(wansim_command(&wan, heal, reply, sizeof(reply)), 0);
    int64_t healed = gs_clock_mono_ms();
    flush("flush after the link came back");
    print_message("%s: converged %lld ms after '%s'\n", fault,
                  (long long)(gs_clock_mono_ms() - healed), heal);
    expect_trees_equal("after the link came back");
}

static void test_watch__link_cut_for_30s_converges_with_nothing_lost(void **state)
{
    (void)state;
    link_fault("cut", "restore", 30, 1);
}

/* Starts the WAN simulator in front of the sandbox sshd, a project behind it and its daemon, with
 * "a.py" synced. */
static void wan_project_start(void)
{
    char err[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    put("a.py", "v1\n");
    watch_start();
    flush("first flush");
}

static void wan_ok(const char *cmd)
{
    char reply[256];
    if (wansim_command(&wan, cmd, reply, sizeof(reply)) != 0)
        fail_msg("wansim %s: %s", cmd, reply);
}

/* Polls status --json until the daemon reports the link down; returns when the last answer that
 * still said connected was asked for: the daemon disconnected after that instant. */
static int64_t await_disconnected_since(int limit_ms)
{
    int64_t start = gs_clock_mono_ms(), asked = start;
    for (;;) {
        int64_t now = gs_clock_mono_ms();
        json_t *st = daemon_status_json();
        int connected = json_is_true(json_object_get(st, "connected"));
        json_decref(st);
        if (!connected)
            return asked;
        asked = now;
        if (now - start > limit_ms)
            fail_msg("daemon still connected after %d ms", limit_ms);
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

/* A flush while the daemon is disconnected is a user asking now: the daemon tries to connect at
 * once, not when its reconnect backoff (grown over the outage) ends, and answers once the change
 * is on the server.
 *
 * The daemon's next attempt is not in status --json (a new field would bump the JSON contract),
 * so it is bounded from its schedule (syncd/daemon.c): attempts 0.5, 1, 2 and 4 s apart (each
 * plus up to 20 % jitter) after the disconnect, so by 9 s after it the next attempt is at least
 * 8 s away, at the earliest 15.5 s after the disconnect. The link is restored past that 9 s, and
 * the flush must end before that next attempt was due, and within 4 s. A flush before that, while
 * the link is still cut, fails at once instead of waiting. */
static void test_watch__flush_after_an_outage_connects_at_once(void **state)
{
    (void)state;
    wan_project_start();
    wan_ok("cut");
    int64_t down_after = await_disconnected_since(30000), seen_down = gs_clock_mono_ms();
    put("a.py", "v2\n");
    while (gs_clock_mono_ms() < seen_down + 9000 + 500) {
        json_t *st = daemon_status_json();
        if (json_is_true(json_object_get(st, "connected")))
            fail_msg("the daemon reconnected through a cut link");
        json_decref(st);
        usleep(200000); /* the outage lasts while the backoff grows: pacing, no event to await */
    }
    /* while the server cannot be reached, a flush fails at once with the reason (the daemon's
     * refusal, exit 4 as for any connection failure: not the client giving up after --timeout) */
    int64_t f0 = gs_clock_mono_ms();
    struct gs_test_result r = gpusync(cur.local, ARGS("flush", "--timeout", "60"));
    print_message("flush while cut: exit %d in %lld ms: %s", r.status,
                  (long long)(gs_clock_mono_ms() - f0), r.err.data);
    expect_status(&r, 4, "gpusync flush while the link is cut");
    assert_true(gs_clock_mono_ms() - f0 < 10000);
    gs_test_result_release(&r);
    int64_t due = down_after + 15500; /* that attempt put the next one 16 s later still */
    wan_ok("restore");
    int64_t t0 = gs_clock_mono_ms();
    flush("flush after the link came back");
    int64_t t1 = gs_clock_mono_ms();
    print_message("flush took %lld ms; the daemon's own next attempt was at least %lld ms away\n",
                  (long long)(t1 - t0), (long long)(due - t0));
    if (t1 - t0 > 4000 || t1 >= due)
        fail_msg("flush took %lld ms: it waited for the backoff (next attempt >= %lld ms away)",
                 (long long)(t1 - t0), (long long)(due - t0));
    expect_remote("a.py", "v2\n");
}

/* Polls status --json until spare_ready is `want`; fails after `limit_ms`. */
static void await_spare_ready(int want, int limit_ms)
{
    int64_t start = gs_clock_mono_ms();
    for (;;) {
        json_t *st = daemon_status_json();
        int ready = json_is_true(json_object_get(st, "spare_ready"));
        json_decref(st);
        if (ready == want)
            return;
        if (gs_clock_mono_ms() - start > limit_ms)
            fail_msg("spare_ready still %s after %d ms", ready ? "true" : "false", limit_ms);
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

/* Connections open through the WAN simulator now (its "stats" answer). */
static int wan_open_connections(void)
{
    char reply[256];
    if (wansim_command(&wan, "stats", reply, sizeof(reply)) != 0)
        fail_msg("wansim stats: %s", reply);
    const char *open = strstr(reply, " open=");
    if (!open)
        fail_msg("wansim stats: no open= in '%s'", reply);
    return atoi(open + 6);
}

/* spare_ready says a spare connection is usable now: never while the server cannot be reached,
 * and once it is back, only when a spare (a connection of its own besides the daemon's) is open
 * again: the spares the outage killed are not offered. */
static void test_watch__spare_is_not_ready_while_disconnected(void **state)
{
    (void)state;
    wan_project_start();
    await_spare_ready(1, 30000);
    assert_true(wan_open_connections() >= 2); /* the daemon's and a spare */
    wan_ok("cut");
    await_connected(0, 30000);
    json_t *st = daemon_status_json();
    if (json_is_true(json_object_get(st, "spare_ready")))
        fail_msg("spare_ready while disconnected: %s", json_dumps(st, JSON_COMPACT));
    json_decref(st);
    wan_ok("restore");
    flush("flush after the link came back");
    await_spare_ready(1, 30000);
    int open = wan_open_connections();
    if (open < 2)
        fail_msg("spare_ready, but only %d connection open (the daemon's): the spare is dead",
                 open);
}

static void test_watch__link_stall_converges(void **state)
{
    (void)state;
    link_fault("stall", "resume", 12, 0);
}

/* A synced edit.py ("v0"), the link stalled, then edit.py saved as "v1": its batch sends it at
 * once, and the stalled link holds it. */
static void save_into_a_stalled_link(void)
{
    char err[256], reply[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    put("edit.py", "v0\n");
    watch_start();
    flush("first flush");
    assert_int_equal(wansim_command(&wan, "stall", reply, sizeof(reply)), 0);
    put("edit.py", "v1\n");
}

/* A save whose upload was in flight when the link stalled: the old connection's bytes reach the
 * server when the link recovers, after the daemon gave up on them. That write is gpusync's own,
 * so the next push must not keep it as a conflict copy. */
static void test_watch__a_put_in_flight_when_the_link_stalled_is_no_conflict(void **state)
{
    (void)state;
    char reply[256];
    save_into_a_stalled_link();
    await_connected(0, 30000);
    put("edit.py", "v2\n");
    assert_int_equal(wansim_command(&wan, "resume", reply, sizeof(reply)), 0);
    flush("flush after the link came back");
    expect_remote("edit.py", "v2\n");
    expect_trees_equal("after the link came back (no conflict copy expected)");
}

/* While a batch waits on a stalled link, the daemon still answers `status`: connected, "syncing",
 * the save pending in the batch. It used to answer nothing until it declared the link dead (4 s
 * of silence), and then only "disconnected": the batch in between was never seen. */
static void test_watch__status_while_a_batch_waits_on_a_stalled_link(void **state)
{
    (void)state;
    char reply[256];
    save_into_a_stalled_link();
    json_t *st = await_batch(1, "the batch waiting on the stalled link");
    int connected = json_is_true(json_object_get(st, "connected"));
    const char *state_now = json_string_value(json_object_get(st, "state"));
    if (!connected || strcmp(state_now ? state_now : "", "syncing") != 0 ||
        json_integer_value(json_object_get(st, "pending")) < 1) {
        char *text = json_dumps(st, 0);
        fail_msg("status while the batch waits: %s", text);
    }
    json_decref(st);
    assert_int_equal(wansim_command(&wan, "resume", reply, sizeof(reply)), 0);
    flush("flush after the link came back");
    expect_remote("edit.py", "v1\n");
    expect_trees_equal("after the stall");
}

/* Waits for the agent to begin writing a temporary file in the remote root (an upload under
 * way), with inotify on the server's directory (the sandbox server is this machine). */
static void await_remote_upload(int limit_ms)
{
    int in = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(in >= 0);
    assert_true(inotify_add_watch(in, cur.remote, IN_CREATE) >= 0);
    int64_t end = gs_clock_mono_ms() + limit_ms;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        struct pollfd p = {.fd = in, .events = POLLIN};
        int left = (int)(end - gs_clock_mono_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            fail_msg("no upload began on the server within %d ms", limit_ms);
        ssize_t n = read(in, buf, sizeof(buf));
        for (char *q = buf; n > 0 && q < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)q;
            if (e->len && strncmp(e->name, ".gpusync-tmp-", 13) == 0) {
                close(in);
                return;
            }
            q += sizeof(*e) + e->len;
        }
    }
}

/* A file saved again while it is being sent no longer matches what was planned, and the agent
 * refuses the stream. That is no error (issue 19): an editor showed a warning on every save of
 * a large file. The new version goes next, and flush waits for it. */
static void test_watch__a_file_saved_while_it_is_sent_goes_again_without_an_error(void **state)
{
    (void)state;
    char err[256], abs[2048];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 5, .rate_mbit = 100};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    watch_start();
    flush("first flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker");
    size_t size = 16u << 20; /* 1.3 s at 100 Mbit/s: the second save lands mid-stream */
    char *v1 = malloc(size + 1), *v2 = malloc(size + 1);
    assert_non_null(v1);
    assert_non_null(v2);
    memset(v1, 'a', size);
    memset(v2, 'b', size);
    v1[size] = v2[size] = '\0';
    path_in(abs, sizeof(abs), cur.local, "model.ckpt");
    write_at(abs, v1, size, O_TRUNC);
    await_remote_upload(30000);
    write_at(abs, v2, size, O_TRUNC); /* in place, as VS Code saves */
    flush("flush after a save during the upload");
    expect_remote("model.ckpt", v2);
    events_mark(&ev, "marker");
    assert_int_equal(gs_test_events_count(&ev, "error", ""), 0);
    gs_test_events_stop(&ev);
    free(v1);
    free(v2);
}

static void test_watch__sshd_restart_converges(void **state)
{
    (void)state;
    proj_init(sshd.port);
    make_files("src", 10, 200);
    watch_start();
    flush("first flush");
    gs_test_sshd_stop(&sshd);
    put("src/while_down.py", "down\n");
    rename_in("src/f3.bin", "src/f3-renamed.bin");
    await_connected(0, 20000);
    put("src/while_down2.py", "down 2\n");
    assert_int_equal(gs_test_sshd_restart(&sshd, 0), 0);
    flush("flush after sshd came back");
    expect_trees_equal("after sshd came back");
    put("src/after.py", "after\n");
    flush("flush after a later edit");
    expect_remote("src/after.py", "after\n");

    /* A daemon started while the server is down starts anyway, and syncs once it is back. */
    gs_ok(ARGS("watch", "--stop"), "gpusync watch --stop");
    gs_test_sshd_stop(&sshd);
    put("src/before_start.py", "queued\n");
    watch_start();
    await_connected(0, 1000);
    assert_int_equal(gs_test_sshd_restart(&sshd, 0), 0);
    flush("flush after sshd came back (daemon started while it was down)");
    expect_trees_equal("after a start while sshd was down");
}

/* A directory renamed while the server is unreachable is still one rename once it is back (the
 * daemon then pushes the whole tree, so the plan, not the watcher, must pair the paths). */
/* A rename the server already has (an earlier session's reply was lost, or someone renamed it
 * there too) finds no source: the daemon then sends the destination afresh in the same flush,
 * rather than answering the flush while the server lacks the file and retrying 10 s later. */
static void test_watch__a_rename_whose_source_is_gone_still_syncs_before_flush_returns(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("keep.txt", "k\n");
    put("old.txt", "renamed content\n");
    watch_start();
    flush("first flush");
    char a[2048], b[2048];
    path_in(a, sizeof(a), cur.remote, "old.txt");
    path_in(b, sizeof(b), cur.remote, "elsewhere.txt");
    assert_int_equal(rename(a, b), 0); /* the server's copy is no longer where the index says */
    rename_in("old.txt", "new.txt");
    flush("flush after the rename");
    expect_remote("new.txt", "renamed content\n");
    json_t *st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
    assert_int_equal(unlink(b), 0); /* not gpusync's: the comparison is about its own writes */
    expect_trees_equal("after the flush");
}

static void test_watch__directory_renamed_while_disconnected_is_one_rename(void **state)
{
    (void)state;
    proj_init(sshd.port);
    assert_int_equal(
        gs_test_sh("cd '%s' && mkdir -p big && for i in $(seq 1 300); do echo \"file $i\" > "
                   "big/f$i.txt; done",
                   cur.local),
        0);
    watch_start();
    flush("first flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker1");
    gs_test_sshd_stop(&sshd);
    await_connected(0, 20000);
    rename_in("big", "moved");
    assert_int_equal(gs_test_sshd_restart(&sshd, 0), 0);
    flush("flush after sshd came back");
    events_mark(&ev, "marker2");
    int synced = gs_test_events_count(&ev, "synced", "moved/"),
        renamed = gs_test_events_count(&ev, "renamed", "");
    gs_test_events_stop(&ev);
    expect_trees_equal("after the rename while disconnected");
    if (synced != 0 || renamed < 1)
        fail_msg("a directory renamed while disconnected: %d files uploaded again under moved/, "
                 "%d renamed events (want 0 and at least 1)",
                 synced, renamed);
}

/* Every reconnection verifies the host key: a changed one is refused and said so. */
/* Waits (30 s at most) until the daemon reports that the server's host key changed. */
static void await_host_key_refused(void)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    for (;;) {
        json_t *st = daemon_status_json();
        const char *e = json_string_value(json_object_get(st, "last_error"));
        int refused =
            !json_is_true(json_object_get(st, "connected")) && e && strstr(e, "host key") != NULL;
        json_decref(st);
        if (refused)
            return;
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon did not report a changed host key within 30 s");
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

/* A daemon that synced a.py ("a"), then the server reinstalled with a new host key, a.py saved
 * as "b", and the daemon's refusal awaited. */
static void daemon_refusing_a_new_host_key(void)
{
    proj_init(sshd.port);
    put("a.py", "a\n");
    watch_start();
    flush("first flush");
    assert_int_equal(gs_test_sshd_restart(&sshd, 1), 0); /* "the server was reinstalled" */
    put("a.py", "b\n");
    await_host_key_refused();
}

static void test_watch__reconnect_refuses_a_changed_host_key(void **state)
{
    (void)state;
    daemon_refusing_a_new_host_key();
    expect_remote("a.py", "a\n");    /* nothing went to the impostor */
    gs_test_sshd_use_home(&sshd, 1); /* the user accepts the new key */
    flush("flush after the new host key was recorded");
    expect_remote("a.py", "b\n");
}

/* The server recreated with a new host key while watch runs: the user removes the old key and
 * runs what the error says, `push --accept-new-host-key`. It went through the daemon, which logs
 * in as it was started, so the flag did nothing (the same error, exit 4) until watch --stop. The
 * command now checks and records the new key itself before it asks the daemon. */
static void test_watch__push_accept_new_host_key_through_the_daemon(void **state)
{
    (void)state;
    daemon_refusing_a_new_host_key();
    assert_int_equal(gs_test_sh("ssh-keygen -q -R '[127.0.0.1]:%d' -f \"$HOME/.ssh/known_hosts\" "
                                ">/dev/null 2>&1",
                                sshd.port),
                     0);
    struct gs_test_result r = gs_test_run_gpusync(
        cur.local, NULL, NULL, GS_TEST_ARGS("push", "--json", "--accept-new-host-key"), 60000);
    gs_test_expect_status(&r, 0, "push --accept-new-host-key while watch runs");
    assert_non_null(strstr(r.out.data, "watch daemon")); /* it went through the daemon */
    gs_test_result_release(&r);
    expect_remote("a.py", "b\n");
}

static void test_watch__daemon_killed_mid_batch_converges_after_restart(void **state)
{
    (void)state;
    proj_init(sshd.port);
    put("a.txt", "a\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    struct gs_test_events ev;
    gs_test_events_start(&ev, cur.local);
    events_mark(&ev, "marker1");
    make_files("bulk", 400, 64 * 1024);
    gs_test_events_until(&ev, "synced", "bulk/", 30000); /* the batch is under way */
    assert_int_equal(kill(pid, SIGKILL), 0);
    int synced = gs_test_events_count(&ev, "synced", "bulk/");
    gs_test_events_stop(&ev);
    print_message("killed after %d of 400 files were reported synced\n", synced);
    gs_test_await_gone(pid);
    put("a.txt", "changed while no daemon ran\n");
    watch_start();
    flush("flush after the restart");
    expect_trees_equal("after the restart");
}

/* Waits (bounded) until no agent serves the project's remote root: whatever a killed daemon had
 * in flight has landed on the server, or died with the agent, by then. */
static void await_no_agent(void)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    while (gs_test_sh("pgrep -f 'gpusync-agent.* serve --root %s$' >/dev/null", cur.remote) == 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("an agent still serves %s 30 s after its daemon died", cur.remote);
        usleep(20000);
    }
}

/* Issue 11, point 2: the daemon is SIGKILLed with requests in flight; then files it had placed on
 * the server are deleted, renamed and edited before it is started again. Each request's intent
 * was committed before it left, so the new daemon first asks the server what landed: the deleted
 * and renamed files go (the renamed one is not left twice) and the edited ones are replaced
 * without a conflict copy nobody caused. */
static void test_watch__daemon_killed_with_requests_in_flight_then_changes_converge(void **state)
{
    (void)state;
    enum { N = 400 };
    char err[256];
    struct wansim_opts o = {.target_port = sshd.port, .delay_ms = 25, .rate_mbit = 8};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    proj_init(wan.port);
    put("a.txt", "a\n");
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    make_files("bulk", N, 16 * 1024); /* about 7 s at 8 Mbit/s */
    char remote_dir[2048], there[N];
    snprintf(remote_dir, sizeof(remote_dir), "%s/bulk", cur.remote);
    int64_t end = gs_clock_mono_ms() + 60000;
    while (gs_test_sh("[ $(ls '%s' 2>/dev/null | wc -l) -ge 40 ]", remote_dir) != 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("fewer than 40 files reached the server in 60 s");
        usleep(10000);
    }
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* What the simulator still holds for the agent is dropped, as a router's queue is when a
     * link dies: whether the killed daemon's socket closed with a FIN (the queue drains and every
     * file lands) or an RST (it is dropped) otherwise depends on whether a reply was unread. */
    wan_ok("cut");
    gs_test_await_gone(pid);
    await_no_agent();
    wan_ok("restore");
    int placed = 0;
    for (int i = 0; i < N; i++) {
        char rel[64], abs[2048];
        snprintf(rel, sizeof(rel), "bulk/f%d.bin", i);
        path_in(abs, sizeof(abs), cur.remote, rel);
        there[i] = (char)(access(abs, F_OK) == 0);
        placed += there[i];
        if (!there[i])
            continue;
        char to[64];
        snprintf(to, sizeof(to), "bulk/renamed%d.bin", i);
        path_in(abs, sizeof(abs), cur.local, rel);
        if (i % 3 == 0)
            assert_int_equal(unlink(abs), 0);
        else if (i % 3 == 1)
            rename_in(rel, to);
        else
            put(rel, "edited while no daemon ran\n");
    }
    print_message("daemon killed with %d of %d files on the server\n", placed, N);
    assert_true(placed >= 40 && placed < N);
    char reply[256];
    assert_int_equal(wansim_command(&wan, "rate 0", reply, sizeof(reply)), 0);
    watch_start();
    flush("flush after the restart");
    expect_trees_equal("after the restart (no conflict copy expected)");
    json_t *st = daemon_status_json();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
}

/* ---- random operations ---- */

/* Four rounds of 250 random operations, each followed by a flush and a comparison. With
 * `one_batch` the daemon is stopped during each round, so that it reads the whole round at once
 * and pushes it as one batch (what a slow daemon, or one under ASan, does anyway). */
static void random_rounds(int one_batch)
{
    const char *env = getenv("GS_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    print_message("random operations: seed %u (rerun with GS_TEST_SEED=%u)\n", seed, seed);
    proj_init(sshd.port);
    assert_int_equal(gs_test_sh("cd '%s' && mkdir -p d0/s0 d1/s1 d2", cur.local), 0);
    watch_start();
    flush("first flush");
    pid_t pid = daemon_pid();
    for (int round = 0; round < 4; round++) {
        if (one_batch)
            assert_int_equal(kill(pid, SIGSTOP), 0);
        for (int i = 0; i < 250; i++)
            gs_test_random_op(cur.local, &seed, round * 250 + i);
        if (one_batch)
            assert_int_equal(kill(pid, SIGCONT), 0);
        flush("flush after random operations");
        char when[64];
        snprintf(when, sizeof(when), "after round %d (seed above)", round);
        expect_trees_equal_as(when, GS_TEST_TREE_MTIME);
    }
}

static void test_watch__random_operations_converge(void **state)
{
    (void)state;
    random_rounds(0);
}

static void test_watch__random_operations_in_one_batch_converge(void **state)
{
    (void)state;
    random_rounds(1);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*rename*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_setup_teardown(fn, test_setup, test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_watch__status_reports_a_connected_daemon_and_stop_ends_it),
        T(test_watch__second_watch_refuses_with_a_clear_message),
        T(test_watch__foreground_watch_syncs_and_stops_on_sigint),
        T(test_watch__long_project_path_with_spaces_works),
        T(test_watch__control_socket_answers_bad_requests_with_errors),
        T(test_watch__exec_through_the_daemon_returns_output_and_status),
        T(test_watch__exec_client_leaving_ends_the_remote_command),
        T(test_watch__ignored_directories_get_no_watches),
        T(test_watch__changed_ignore_rules_take_effect_at_the_next_flush),
        T(test_watch__the_users_excludes_file_is_followed_too),
        T(test_watch__a_pulled_output_stays_the_jobs_when_it_writes_a_newer_one),
        T(test_watch__a_file_unreadable_here_holds_back_nothing_else),
        T(test_watch__the_foreground_line_never_says_up_to_date_over_a_failure),
        T(test_watch__init_for_another_path_stops_the_daemon),
        T(test_watch__a_project_moved_under_the_daemon_is_never_up_to_date),
        T(test_watch__a_save_through_one_hard_link_sends_the_other_name_too),
        T(test_watch__nvim_saves_arrive),
        T(test_watch__vim_saves_arrive),
        T(test_watch__emacs_rename_save_arrives),
        T(test_watch__editor_syscall_sequences_arrive),
        T(test_watch__directory_rename_is_one_remote_rename),
        T(test_watch__status_of_a_daemon_that_does_not_answer_says_so),
        T(test_watch__burst_of_3000_new_files_converges),
        T(test_watch__paths_that_change_kind_in_one_batch_converge),
        T(test_watch__a_stuck_event_reader_does_not_stall_the_daemon),
        T(test_watch__a_continuously_written_file_syncs_before_the_writes_stop),
        T(test_watch__a_large_file_reports_progress_in_bytes_while_it_goes),
        T(test_watch__status_during_a_long_batch_says_syncing),
        T(test_watch__stop_during_a_long_batch_stops_there_and_says_what_was_not_sent),
        T(test_watch__a_text_stop_warns_of_unsent_changes_on_stderr),
        T(test_watch__stop_while_a_large_file_is_hashed_is_prompt),
        T(test_watch__ps_during_a_long_batch_is_relayed_at_once),
        T(test_watch__stop_while_the_login_hangs_is_prompt_and_says_unchecked),
        T(test_watch__a_flush_while_the_login_hangs_does_not_spin),
        T(test_watch__a_push_through_the_daemon_shows_the_batch_moving),
        T(test_watch__a_push_reading_a_large_file_shows_it),
        T(test_watch__a_flush_waiting_when_the_daemon_stops_is_told_so),
        T(test_watch__steady_saves_never_wait_for_the_liveness_check),
        T(test_watch__flush_reports_a_failed_change_and_retries_it),
        T(test_watch__a_file_that_cannot_be_read_is_sent_once_it_can),
        T(test_watch__git_checkout_of_500_files_converges),
        T(test_watch__inotify_overflow_converges),
        T(test_watch__sshd_restart_converges),
        T(test_watch__reconnect_refuses_a_changed_host_key),
        T(test_watch__push_accept_new_host_key_through_the_daemon),
        T(test_watch__directory_renamed_while_disconnected_is_one_rename),
        T(test_watch__a_rename_whose_source_is_gone_still_syncs_before_flush_returns),
        T(test_watch__daemon_killed_mid_batch_converges_after_restart),
        T(test_watch__daemon_killed_with_requests_in_flight_then_changes_converge),
        T(test_watch__random_operations_converge),
        T(test_watch__random_operations_in_one_batch_converge),
        T(test_watch__link_stall_converges),
        T(test_watch__a_put_in_flight_when_the_link_stalled_is_no_conflict),
        T(test_watch__status_while_a_batch_waits_on_a_stalled_link),
        T(test_watch__a_file_saved_while_it_is_sent_goes_again_without_an_error),
        T(test_watch__link_cut_for_30s_converges_with_nothing_lost),
        T(test_watch__flush_after_an_outage_connects_at_once),
        T(test_watch__spare_is_not_ready_while_disconnected),
    };
#undef T
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
