/* tests/e2e/test_resident.c: the resident agent (proto/sync.h, RESIDENT LISTENER), as `gpusync
 * push` uses it against the sandbox sshd. A session started through the login shell leaves a
 * listener on ~/.gpusync/run/<agent>.sock; the next one reaches `serve` through it (transport
 * "agent (resident)"), with no shell. Every way it can fail must cost no data and fall back to
 * the shell: the listener killed, a remembered root the listener cannot serve, garbage sent to the
 * socket, a server that forbids the channel (AllowStreamLocalForwarding no, remembered so that
 * sessions stop asking), another agent build, and `[sync] resident = off`. After every push the
 * remote tree is compared with the local one. The server is this machine, as root: listeners of
 * other tests share ~/.gpusync/run, and a test kills only the listener process itself (its
 * connections' serve processes live on, as they would). */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"

#define RUN_TIMEOUT_MS 90000
#define ARGS(...)      ((const char *const[]){__VA_ARGS__, NULL})
#define WAIT_MS        10000 /* for a listener to come up or go away */

static struct gs_test_sshd sshd;

/* ---- a project ---- */

struct proj {
    char dir[64];     /* holds both trees */
    char local[128];  /* the local project */
    char remote[128]; /* its remote directory on the (same) machine */
    int edits;
};

static struct proj cur;

static void proj_new(struct proj *p, const char *config)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->dir, sizeof(p->dir), "/tmp/gs-e2e-resident.XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->local, sizeof(p->local), "%s/local", p->dir);
    snprintf(p->remote, sizeof(p->remote), "%s/remote", p->dir);
    assert_int_equal(mkdir(p->local, 0755), 0);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", sshd.port);
    gs_test_gpusync_ok(p->local, ARGS("init", target, "--path", p->remote, "--accept-new-host-key"),
                       "gpusync init");
    if (config) {
        char cfg[256];
        snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", p->local);
        FILE *fp = fopen(cfg, "a");
        assert_non_null(fp);
        fputs(config, fp);
        fclose(fp);
    }
    char data[160];
    snprintf(data, sizeof(data), "%s/data", p->local);
    assert_int_equal(mkdir(data, 0755), 0);
    gs_test_write_file(p->local, "train.py", "print('hello')\n");
    gs_test_write_file(p->local, "data/a.txt", "a\n");
}

static void proj_free(struct proj *p)
{
    if (p->dir[0])
        gs_test_sh("rm -rf '%s'", p->dir);
    p->dir[0] = '\0';
}

/* Changes the tree a little: a new version of train.py, a new file, a deleted one. */
static void edit(struct proj *p)
{
    char text[64], name[64];
    p->edits++;
    snprintf(text, sizeof(text), "print('version %d')\n", p->edits);
    gs_test_write_file(p->local, "train.py", text);
    snprintf(name, sizeof(name), "data/new-%d.txt", p->edits);
    gs_test_write_file(p->local, name, text);
    if (p->edits > 1) {
        char old[256];
        snprintf(old, sizeof(old), "%s/data/new-%d.txt", p->local, p->edits - 1);
        assert_int_equal(unlink(old), 0);
    }
}

static void expect_trees_equal(const struct proj *p, const char *when)
{
    struct gs_buf why = GS_BUF_INIT;
    if (gs_test_tree_diff(p->local, p->remote, 0, &why) != 0)
        fail_msg("%s: the server's tree differs: %s", when, why.data);
    gs_buf_release(&why);
}

/* Pushes, checks the exit status and the tree, and returns the transport the summary names. */
static const char *push(struct proj *p, const char *when)
{
    static char transport[128];
    json_t *o = gs_test_gpusync_json(p->local, ARGS("push", "--json"), 0, when);
    const char *t = json_string_value(json_object_get(o, "transport"));
    snprintf(transport, sizeof(transport), "%s", t ? t : "(none)");
    json_decref(o);
    expect_trees_equal(p, when);
    return transport;
}

static void expect_transport(const char *got, const char *want, const char *when)
{
    if (strcmp(got, want) != 0)
        fail_msg("%s: transport \"%s\", want \"%s\"", when, got, want);
}

/* The agent through the shell: cached there, or uploaded if an earlier test has not done so. */
static void expect_shell(const char *got, const char *when)
{
    if (strcmp(got, "agent (cached)") != 0 && strcmp(got, "agent (uploaded)") != 0)
        fail_msg("%s: transport \"%s\", want the agent through the shell", when, got);
}

/* ---- what the project remembers, and the listener ---- */

/* Reads line `n` (1-based) of .gpusync/resident into out; returns 0, or -1 when there is none. */
static int remembered(const struct proj *p, int n, char *out, size_t cap)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/.gpusync/resident", p->local);
    FILE *fp = fopen(path, "r");
    int rc = -1;
    for (int i = 1; fp && i <= n && fgets(out, (int)cap, fp); i++)
        rc = i == n ? 0 : -1;
    if (fp)
        fclose(fp);
    if (rc == 0)
        out[strcspn(out, "\n")] = '\0';
    return rc;
}

static void remembered_socket(const struct proj *p, char *out, size_t cap)
{
    if (remembered(p, 3, out, cap) != 0 || out[0] != '/')
        fail_msg("the project remembers no listener's socket after a push through the shell");
}

/* Replaces line `n` of .gpusync/resident with `text`, keeping the others. */
static void remember_instead(const struct proj *p, int n, const char *text)
{
    char lines[4][4200];
    for (int i = 0; i < 4; i++)
        assert_int_equal(remembered(p, i + 1, lines[i], sizeof(lines[i])), 0);
    snprintf(lines[n - 1], sizeof(lines[n - 1]), "%s", text);
    char path[256];
    snprintf(path, sizeof(path), "%s/.gpusync/resident", p->local);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    for (int i = 0; i < 4; i++)
        fprintf(fp, "%s\n", lines[i]);
    fclose(fp);
}

/* The pid of `gpusync-agent listen --socket SOCK`, or 0. */
static pid_t listener_pid(const char *sock)
{
    DIR *d = opendir("/proc");
    pid_t found = 0;
    struct dirent *e;
    while (d && !found && (e = readdir(d))) {
        char path[300], buf[1024];
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
        FILE *fp = fopen(path, "r");
        size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
        if (fp)
            fclose(fp);
        buf[n] = '\0';
        const char *argv[4] = {buf, NULL, NULL, NULL};
        size_t at = strlen(buf) + 1;
        for (int i = 1; i < 4 && at < n; i++, at += strlen(buf + at) + 1)
            argv[i] = buf + at;
        if (argv[3] && strcmp(argv[1], "listen") == 0 && strcmp(argv[3], sock) == 0)
            found = pid;
    }
    if (d)
        closedir(d);
    return found;
}

/* Connects to the socket; returns the descriptor or -1. */
static int connect_to(const char *sock)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(sock);
    assert_true(len < sizeof(addr.sun_path));
    memcpy(addr.sun_path, sock, len + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Whether something accepts connections on the socket. */
static int accepts(const char *sock)
{
    int fd = connect_to(sock);
    int ok = fd >= 0;
    if (fd >= 0)
        close(fd); /* the listener's child gets EOF instead of an OPEN, and exits */
    return ok;
}

/* Waits until the listener on sock accepts connections; returns its pid. */
static pid_t await_listener(const char *sock)
{
    int64_t deadline = gs_clock_mono_ms() + WAIT_MS;
    pid_t pid = 0;
    while (!((pid = listener_pid(sock)) && accepts(sock))) {
        if (gs_clock_mono_ms() > deadline)
            fail_msg("no listener accepts connections on %s", sock);
        struct timespec ts = {0, 20 * 1000000L}; /* polled: the listener tells nobody it is up */
        nanosleep(&ts, NULL);
    }
    return pid;
}

/* The detail of `gpusync doctor --json`'s "resident" check (copied into out), and its status. */
static const char *doctor_resident(const struct proj *p, char *out, size_t cap)
{
    static char status[16];
    struct gs_test_result r =
        gs_test_run_gpusync(p->local, NULL, NULL, ARGS("doctor", "--json"), RUN_TIMEOUT_MS);
    if (r.status != 0 && r.status != 1) /* 1: another check failed (no GPU here) */
        fail_msg("doctor --json exit %d: %s", r.status, r.err.data);
    json_t *o = json_loads(r.out.data, 0, NULL);
    if (!o)
        fail_msg("doctor --json: not JSON: %s", r.out.data);
    gs_test_result_release(&r);
    json_t *checks = json_object_get(o, "checks"), *c;
    size_t i;
    snprintf(out, cap, "(no resident check)");
    status[0] = '\0';
    json_array_foreach(checks, i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "name")), "resident") != 0)
            continue;
        snprintf(out, cap, "%s", json_string_value(json_object_get(c, "detail")));
        snprintf(status, sizeof(status), "%s", json_string_value(json_object_get(c, "status")));
    }
    json_decref(o);
    return status;
}

/* A first push, through the shell, then one through the listener it left. Returns the socket. */
static void go_resident(struct proj *p, char *sock, size_t cap)
{
    expect_shell(push(p, "the first push"), "the first push");
    remembered_socket(p, sock, cap);
    await_listener(sock);
    edit(p);
    expect_transport(push(p, "the second push"), "agent (resident)", "the second push");
}

/* ---- the tests ---- */

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
    proj_free(&cur);
    return 0;
}

/* The second push skips the shell; what the project keeps of it is private; the listener's
 * directory on the server is the user's alone. */
static void test_resident__a_second_push_goes_through_the_listener(void **state)
{
    (void)state;
    char sock[256], path[300];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    edit(&cur);
    expect_transport(push(&cur, "a third push"), "agent (resident)", "a third push");
    char detail[512];
    assert_string_equal(doctor_resident(&cur, detail, sizeof(detail)), "ok");
    if (strncmp(detail, "listening at ", 13) != 0 || !strstr(detail, sock))
        fail_msg("doctor says \"%s\" of a running listener", detail);
    struct stat st;
    snprintf(path, sizeof(path), "%s/.gpusync/resident", cur.local);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    snprintf(path, sizeof(path), "%s", sock);
    *strrchr(path, '/') = '\0';
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
}

/* A listener killed with SIGKILL (its socket file left behind): the next push falls back to the
 * shell with nothing lost, and the one after goes through the listener that push started. */
static void test_resident__a_killed_listener_costs_one_push_through_the_shell(void **state)
{
    (void)state;
    char sock[256];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    pid_t pid = await_listener(sock);
    assert_int_equal(kill(pid, SIGKILL), 0);
    gs_test_await_gone(pid);
    edit(&cur);
    expect_transport(push(&cur, "the push after the kill"), "agent (cached)",
                     "the push after the kill");
    pid_t again = await_listener(sock);
    assert_true(again != pid);
    edit(&cur);
    expect_transport(push(&cur, "the push after that"), "agent (resident)", "the push after that");
}

/* A remembered root the listener cannot serve: its `serve` fails before the handshake, and the
 * push's requests, sent before that answer, are planned and sent again through the shell. */
static void test_resident__a_serve_that_fails_before_the_handshake_loses_nothing(void **state)
{
    (void)state;
    char sock[256], root[4200];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    assert_int_equal(remembered(&cur, 4, root, sizeof(root)), 0);
    remember_instead(&cur, 4, "/proc/gpusync-no-such-root/x");
    edit(&cur);
    expect_transport(push(&cur, "the push with a wrong root"), "agent (cached)",
                     "the push with a wrong root");
    char now[4200];
    assert_int_equal(remembered(&cur, 4, now, sizeof(now)), 0);
    assert_string_equal(now, root);
    edit(&cur);
    expect_transport(push(&cur, "the push after"), "agent (resident)", "the push after");
}

/* A connection that sends garbage, or nothing yet, is closed by the listener's child for that
 * connection; the listener goes on serving. */
static void test_resident__garbage_on_the_socket_leaves_the_listener_serving(void **state)
{
    (void)state;
    char sock[256];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    pid_t pid = await_listener(sock);
    int silent = connect_to(sock), noisy = connect_to(sock);
    assert_true(silent >= 0 && noisy >= 0);
    /* a HELLO where the OPEN should be, as a client that knows no listener would send */
    static const unsigned char hello[] = {0,   0,   0, 17, 1, 0, 0, 0, 1, 'G', 'S',
                                          'Y', 'N', 0, 0,  0, 8, 0, 0, 0, 0};
    assert_int_equal(write(noisy, hello, sizeof(hello)), (ssize_t)sizeof(hello));
    struct pollfd pfd = {.fd = noisy, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, WAIT_MS), 1); /* closed: EOF, and no frame back */
    char c;
    assert_int_equal(read(noisy, &c, 1), 0);
    close(noisy);
    edit(&cur);
    expect_transport(push(&cur, "a push beside a silent connection"), "agent (resident)",
                     "a push beside a silent connection");
    close(silent);
    assert_int_equal(listener_pid(sock), pid);
}

/* A server that forbids the channel: the push falls back, the project remembers the refusal, and
 * the next pushes go through the shell without asking again. */
static void test_resident__a_server_that_forbids_the_channel_is_not_asked_again(void **state)
{
    (void)state;
    char sock[256], line[4200];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    assert_int_equal(
        gs_test_sh("echo 'AllowStreamLocalForwarding no' >> '%s/sshd_config'", sshd.dir), 0);
    assert_int_equal(gs_test_sshd_relaunch(&sshd), 0);
    edit(&cur);
    const char *t = push(&cur, "the first push the server refuses the channel to");
    int restored =
        gs_test_sh("sed -i '/^AllowStreamLocalForwarding no$/d' '%s/sshd_config'", sshd.dir) == 0 &&
        gs_test_sshd_relaunch(&sshd) == 0;
    /* checks after the server is back to normal for the other tests */
    assert_true(restored);
    expect_transport(t, "agent (cached)", "the first push the server refuses");
    assert_int_equal(remembered(&cur, 3, line, sizeof(line)), 0);
    assert_string_equal(line, "refused");
    edit(&cur);
    expect_transport(push(&cur, "the next push"), "agent (cached)", "the next push");
    assert_int_equal(remembered(&cur, 3, line, sizeof(line)), 0);
    assert_string_equal(line, "refused");
    assert_string_equal(doctor_resident(&cur, line, sizeof(line)), "warn");
}

/* Another agent build (an upgrade of gpusync) never uses the old build's listener. */
static void test_resident__another_agent_build_does_not_use_the_old_listener(void **state)
{
    (void)state;
    char sock[256], now[256];
    proj_new(&cur, NULL);
    go_resident(&cur, sock, sizeof(sock));
    assert_int_equal(gs_test_fresh_agent_begin(cur.dir), 0);
    edit(&cur);
    const char *t = push(&cur, "the push with another agent build");
    char transport[128];
    snprintf(transport, sizeof(transport), "%s", t);
    remembered_socket(&cur, now, sizeof(now));
    pid_t pid = await_listener(now);
    gs_test_fresh_agent_end(cur.dir);
    expect_transport(transport, "agent (uploaded)", "the push with another agent build");
    if (strcmp(now, sock) == 0)
        fail_msg("another agent build named the old build's socket %s", sock);
    gs_test_await_gone(pid); /* its build was removed from the server: the listener goes too */
}

/* resident = off: every push goes through the shell, and nothing is remembered. */
static void test_resident__resident_off_always_uses_the_shell(void **state)
{
    (void)state;
    char line[64];
    proj_new(&cur, "[sync]\n\tresident = off\n");
    expect_shell(push(&cur, "the first push"), "the first push");
    edit(&cur);
    expect_shell(push(&cur, "the second push"), "the second push");
    assert_int_equal(remembered(&cur, 1, line, sizeof(line)), -1);
    char detail[512];
    assert_string_equal(doctor_resident(&cur, detail, sizeof(detail)), "ok");
    if (strncmp(detail, "off ", 4) != 0)
        fail_msg("doctor says \"%s\" with resident = off", detail);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_teardown(fn, test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_resident__a_second_push_goes_through_the_listener),
        T(test_resident__a_killed_listener_costs_one_push_through_the_shell),
        T(test_resident__a_serve_that_fails_before_the_handshake_loses_nothing),
        T(test_resident__garbage_on_the_socket_leaves_the_listener_serving),
        T(test_resident__a_server_that_forbids_the_channel_is_not_asked_again),
        T(test_resident__another_agent_build_does_not_use_the_old_listener),
        T(test_resident__resident_off_always_uses_the_shell),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
