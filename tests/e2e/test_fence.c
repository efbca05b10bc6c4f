/* tests/e2e/test_fence.c: one writer per remote root (issue 11), through the real CLI and the
 * sandbox sshd: a session whose link hung is fenced out once the daemon reconnects (its stale write
 * never lands after a newer one); the partial temporary of an agent killed mid-upload is swept by
 * the next session; and `gpusync push` while `gpusync watch` runs goes through the daemon, whose
 * agent stays (design 12). GS_TEST_KEEP=1 keeps the project folders. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define RUN_TIMEOUT_MS 180000
#define BIG_MB         256
#define ARGS(...)      ((const char *const[]){__VA_ARGS__, NULL})

static struct gs_test_sshd sshd;

/* The project of the running test; the teardown stops its daemon and removes it. */
static struct {
    char base[64];    /* /tmp/gs-e2e-fence.XXXXXX */
    char local[512];  /* base/proj */
    char remote[128]; /* base/remote (the server is this machine) */
    pid_t stopped[2]; /* processes this test SIGSTOPped: continued in the teardown */
} cur;

/* ---- running programs ---- */

/* Starts gpusync `args` in the project without a terminal; stdout and stderr go to `out`/`err`
 * pipes the caller drains (gs_test_drain). */
static pid_t spawn_gpusync(const char *const *args, int *out, int *err)
{
    const char *argv[32];
    int n = 0, po[2], pe[2];
    argv[n++] = gs_test_gpusync();
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    assert_int_equal(pipe2(po, O_CLOEXEC), 0);
    assert_int_equal(pipe2(pe, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setsid();
        if (chdir(cur.local) != 0)
            _exit(126);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    *out = po[0];
    *err = pe[0];
    return pid;
}

static struct gs_test_result gpusync(const char *const *args)
{
    int out, err;
    pid_t pid = spawn_gpusync(args, &out, &err);
    return gs_test_finish(pid, out, err, RUN_TIMEOUT_MS);
}

static void gs_ok(const char *const *args, const char *what)
{
    struct gs_test_result r = gpusync(args);
    gs_test_expect_status(&r, 0, what);
    gs_test_result_release(&r);
}

/* ---- files ---- */

static void put(const char *rel, const char *data)
{
    char abs[1024];
    snprintf(abs, sizeof(abs), "%s/%s", cur.local, rel);
    int fd = open(abs, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, strlen(data)), (ssize_t)strlen(data));
    assert_int_equal(close(fd), 0);
}

/* Writes `mb` MiB of incompressible bytes to rel (a fast PRNG: no time spent on real entropy). */
static void put_big(const char *rel, int mb)
{
    char abs[1024];
    snprintf(abs, sizeof(abs), "%s/%s", cur.local, rel);
    int fd = open(abs, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint64_t *chunk = malloc(1 << 20), x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < mb; i++) {
        for (size_t k = 0; k < (1u << 20) / 8; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            chunk[k] = x;
        }
        assert_int_equal(write(fd, chunk, 1 << 20), 1 << 20);
    }
    free(chunk);
    assert_int_equal(close(fd), 0);
}

static void expect_remote(const char *rel, const char *want)
{
    char abs[1024], got[256] = "";
    snprintf(abs, sizeof(abs), "%s/%s", cur.remote, rel);
    int fd = open(abs, O_RDONLY);
    if (fd < 0)
        fail_msg("remote %s: %s", rel, strerror(errno));
    ssize_t n = read(fd, got, sizeof(got) - 1);
    close(fd);
    got[n > 0 ? n : 0] = '\0';
    if (strcmp(got, want) != 0)
        fail_msg("remote %s holds '%s', want '%s'", rel, got, want);
}

/* Fails unless the local and remote copies of rel have the same bytes. */
static void expect_remote_same(const char *rel)
{
    if (gs_test_sh("cmp -s '%s/%s' '%s/%s'", cur.local, rel, cur.remote, rel) != 0)
        fail_msg("remote %s differs from the local file", rel);
}

/* Entries under dir (recursively, .gpusync included) whose name contains `part`. */
static int count_named(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char sub[2048];
        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
        struct stat st;
        if (strstr(de->d_name, part))
            n++;
        else if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
            n += count_named(sub, part);
    }
    if (d)
        closedir(d);
    return n;
}

/* ---- server processes ---- */

/* argv of pid as one string with spaces for NULs ("" if gone), in `out`. */
static void cmdline(pid_t pid, char *out, size_t cap)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d/cmdline", (int)pid);
    out[0] = '\0';
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    n = n < 0 ? 0 : n;
    out[n] = '\0';
    for (ssize_t i = 0; i < n; i++)
        out[i] = out[i] ? out[i] : ' ';
}

/* The gpusync-agent serve processes of the test's remote root (at most max), as pgrep -f would
 * find them. Returns how many. */
static int serve_agents(pid_t *pids, int max)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    char want[256];
    snprintf(want, sizeof(want), " serve --root %s", cur.remote);
    while (d && (de = readdir(d)) != NULL && n < max) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char cmd[4096];
        if (pid <= 0)
            continue;
        cmdline(pid, cmd, sizeof(cmd));
        char *space = strchr(cmd, ' '), *base;
        if (space)
            *space = '\0';
        base = strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd;
        /* argv[0] itself: not the login shell that is about to exec it (its -c names both) */
        if (space && !strncmp(base, "gpusync-agent", 13) &&
            !strncmp(space + 1, want + 1, strlen(want + 1)))
            pids[n++] = pid;
    }
    closedir(d);
    return n;
}

/* The one serve agent of the remote root; fails if there is none or more than one. */
static pid_t the_agent(void)
{
    pid_t pids[8];
    int n = serve_agents(pids, 8);
    if (n != 1)
        fail_msg("%d gpusync-agent serve processes for %s, want 1", n, cur.remote);
    return pids[0];
}

/* Waits (10 s at most) until no agent serves the project: a push returns once its answers are in,
 * and its agent, at the end of its input, then saves the set it keeps for checks
 * (.gpusync/check-kept, through a temporary renamed into place), which a count made meanwhile
 * would take for a temporary left behind. */
static void await_no_serve_agent(void)
{
    pid_t pids[8];
    int64_t end = gs_clock_mono_ms() + 10000;
    while (serve_agents(pids, 8) > 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("an agent still serves %s 10 s after the push returned", cur.remote);
        usleep(10000); /* polling an observable condition, with a deadline */
    }
}

static pid_t parent_of(pid_t pid)
{
    return (pid_t)gs_test_proc_stat(pid, 4);
}

/* ---- the project and its daemon ---- */

static void proj_init(void)
{
    snprintf(cur.base, sizeof(cur.base), "/tmp/gs-e2e-fence.XXXXXX");
    assert_non_null(mkdtemp(cur.base));
    snprintf(cur.local, sizeof(cur.local), "%s/proj", cur.base);
    snprintf(cur.remote, sizeof(cur.remote), "%s/remote", cur.base);
    assert_int_equal(mkdir(cur.local, 0755), 0);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", sshd.port);
    gs_ok(ARGS("init", target, "--path", cur.remote, "--accept-new-host-key"), "gpusync init");
}

static void flush(const char *what)
{
    gs_ok(ARGS("flush", "--timeout", "120"), what);
}

/* status --json as the running daemon answers it (a local fallback fails the test). */
static json_t *daemon_status(void)
{
    struct gs_test_result r = gpusync(ARGS("status", "--json"));
    gs_test_expect_status(&r, 0, "gpusync status --json");
    json_t *st = json_loads(r.out.data, 0, NULL);
    if (!st || !json_is_true(json_object_get(st, "daemon")))
        fail_msg("status --json did not come from the daemon: %s", r.out.data);
    gs_test_result_release(&r);
    return st;
}

static int daemon_connected(void)
{
    json_t *st = daemon_status();
    int connected = json_is_true(json_object_get(st, "connected"));
    json_decref(st);
    return connected;
}

static void expect_up_to_date(void)
{
    json_t *st = daemon_status();
    const char *state = json_string_value(json_object_get(st, "state"));
    if (!state || strcmp(state, "up_to_date") != 0)
        fail_msg("daemon state %s, want up_to_date", state ? state : "(none)");
    json_decref(st);
}

/* Polls until the daemon runs a session through an agent other than `old` and says it is
 * connected: it gave up on the old session and reconnected. */
static void await_reconnected(pid_t old, int limit_ms)
{
    int64_t end = gs_clock_mono_ms() + limit_ms;
    for (;;) {
        pid_t pids[8];
        int n = serve_agents(pids, 8), fresh = 0;
        for (int i = 0; i < n; i++)
            fresh |= pids[i] != old;
        if (fresh && daemon_connected())
            return;
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon did not reconnect within %d ms", limit_ms);
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

static void await_connected(int limit_ms)
{
    int64_t end = gs_clock_mono_ms() + limit_ms;
    while (!daemon_connected()) {
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon is not connected after %d ms", limit_ms);
        usleep(100000); /* polling an observable condition, with a deadline */
    }
}

static void stop_process(int slot, pid_t pid)
{
    assert_int_equal(kill(pid, SIGSTOP), 0);
    cur.stopped[slot] = pid;
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
    for (int i = 0; i < 2; i++)
        if (cur.stopped[i] > 0)
            kill(cur.stopped[i], SIGCONT);
    if (cur.local[0]) {
        struct gs_test_result r = gpusync(ARGS("watch", "--stop"));
        gs_test_result_release(&r);
    }
    if (cur.base[0] && getenv("GS_TEST_KEEP") == NULL)
        gs_test_sh("rm -rf '%s'", cur.base);
    memset(&cur, 0, sizeof(cur));
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return gs_test_sshd_start_for_cli(&sshd) != 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&sshd);
    return 0;
}

/* ---- the cases ---- */

/* Issue 11, point 1: the link of the daemon's session hangs (its sshd session process and agent
 * stopped) while a save is in flight; the daemon reconnects, a newer save is flushed, then the old
 * processes run again. The old write must not land over the newer one, nor leave a conflict copy
 * behind a status that says up to date. */
static void test_fence__a_stalled_session_never_writes_after_the_new_one(void **state)
{
    (void)state;
    proj_init();
    put("f.txt", "v0\n");
    gs_ok(ARGS("watch", "-d"), "gpusync watch -d");
    flush("first flush");
    expect_remote("f.txt", "v0\n");
    pid_t agent = the_agent(), session = parent_of(agent);
    stop_process(0, session);
    stop_process(1, agent);
    put("f.txt", "A\n"); /* sent at once, held by the stopped processes */
    await_reconnected(agent, 60000);
    put("f.txt", "B\n");
    flush("flush after the reconnect");
    kill(session, SIGCONT);
    kill(agent, SIGCONT);
    cur.stopped[0] = cur.stopped[1] = 0;
    gs_test_await_gone(agent); /* whatever it still held has landed by now, or never will */
    expect_remote("f.txt", "B\n");
    assert_int_equal(count_named(cur.remote, ".gpusync-conflict-"), 0);
    flush("flush after the old session ended");
    expect_remote("f.txt", "B\n");
    expect_up_to_date();
}

/* Issue 11, point 3: the agent is killed while it writes a large file; the next push leaves no
 * partial temporary anywhere on the server, and the file arrives whole. */
static void test_fence__a_killed_upload_leaves_no_temporary_after_the_next_push(void **state)
{
    (void)state;
    proj_init();
    put_big("big.bin", BIG_MB);
    int out, err;
    pid_t push = spawn_gpusync(ARGS("push"), &out, &err);
    int64_t end = gs_clock_mono_ms() + 60000;
    while (count_named(cur.remote, ".gpusync-tmp-") == 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("no temporary file appeared on the server within 60 s");
        usleep(2000); /* polling an observable condition, with a deadline */
    }
    pid_t agent = the_agent();
    assert_int_equal(kill(agent, SIGKILL), 0);
    struct gs_test_result r = gs_test_finish(push, out, err, RUN_TIMEOUT_MS);
    assert_int_not_equal(r.status, 0);
    gs_test_result_release(&r);
    gs_test_await_gone(agent);
    assert_true(count_named(cur.remote, ".gpusync-tmp-") > 0); /* what the kill left */

    gs_ok(ARGS("push"), "push after the killed one");
    await_no_serve_agent();
    assert_int_equal(count_named(cur.remote, ".gpusync-tmp-"), 0);
    expect_remote_same("big.bin");
    gs_ok(ARGS("push"), "one more push");
    await_no_serve_agent();
    assert_int_equal(count_named(cur.remote, ".gpusync-tmp-"), 0);
}

/* `gpusync push` while `gpusync watch` runs, with a save during the push: the push asks the daemon,
 * whose agent stays (one of the push's own would fence it out and make the daemon reconnect). It
 * says so, the server converges without a conflict copy, and the daemon stays connected. */
static void test_fence__push_while_watch_runs_and_a_save_lands_during_it(void **state)
{
    (void)state;
    proj_init();
    put("edit.py", "v0\n");
    gs_ok(ARGS("watch", "-d"), "gpusync watch -d");
    flush("first flush");
    pid_t agent = the_agent();
    put_big("big.bin", BIG_MB / 2);
    int out, err;
    pid_t push = spawn_gpusync(ARGS("push", "--json"), &out, &err);
    int64_t end = gs_clock_mono_ms() + 60000;
    while (count_named(cur.remote, ".gpusync-tmp-") == 0) { /* someone is uploading big.bin */
        if (gs_clock_mono_ms() > end)
            fail_msg("no upload of big.bin seen on the server within 60 s");
        usleep(2000); /* polling an observable condition, with a deadline */
    }
    put("edit.py", "v1\n");
    struct gs_test_result r = gs_test_finish(push, out, err, RUN_TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "gpusync push while watch runs");
    json_t *summary = json_loads(r.out.data ? r.out.data : "", 0, NULL);
    const char *transport = json_string_value(json_object_get(summary, "transport"));
    if (!transport || strncmp(transport, "watch daemon, agent", 19) != 0)
        fail_msg("push --json while watch runs said transport %s, not the daemon's", r.out.data);
    assert_true(json_is_true(json_object_get(summary, "ok")));
    json_decref(summary);
    gs_test_result_release(&r);
    expect_remote_same("big.bin"); /* the push's answer came once the server had it */
    assert_int_equal(the_agent(), agent);
    flush("flush after the push");
    await_connected(30000);
    flush("flush once connected");
    expect_remote("edit.py", "v1\n");
    expect_remote_same("big.bin");
    assert_int_equal(count_named(cur.remote, ".gpusync-conflict-"), 0);
    assert_int_equal(count_named(cur.remote, ".gpusync-tmp-"), 0);
    expect_up_to_date();
}

int main(void)
{
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*stalled*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_setup_teardown(fn, test_setup, test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_fence__a_stalled_session_never_writes_after_the_new_one),
        T(test_fence__a_killed_upload_leaves_no_temporary_after_the_next_push),
        T(test_fence__push_while_watch_runs_and_a_save_lands_during_it),
    };
#undef T
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
