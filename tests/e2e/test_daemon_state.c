/* tests/e2e/test_daemon_state.c: what the watch daemon keeps in .gpusync/ and who may talk to it
 * (issues 12 and 13): nothing there for git to stage, a removed .gpusync/ put back, conflict
 * copies listed until acknowledged, an outage named with its start and what waits, the server
 * named as a connection resolves it, and the control socket closed to other users, to endless
 * request lines and to floods of remote commands; and, after changes made while no daemon ran,
 * no false error for an operation that waits on a held one, a file removed on the server sent
 * again, and no flush answered "done" over a change the server refused. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/events.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define TIMEOUT_MS 60000

static struct gs_test_sshd server;
static char base[64], project[128], remote[128], client_py[128];

/* A control-socket client for the cases the CLI never produces: argv[1] socket, argv[2] mode. */
static const char client_source[] =
    "import json, socket, sys\n"
    "path, mode = sys.argv[1], sys.argv[2]\n"
    "def conn():\n"
    "    s = socket.socket(socket.AF_UNIX); s.connect(path); return s\n"
    "if mode == 'stop':\n"
    "    try:\n"
    "        s = conn(); s.sendall(b'{\"v\":1,\"cmd\":\"stop\"}\\n'); print(s.recv(100))\n"
    "    except OSError as e:\n"
    "        print('refused', e)\n"
    "elif mode == 'endless':\n"
    "    s = conn(); s.settimeout(10); data = b''\n"
    "    try:\n"
    "        s.sendall(b'x' * 100000)\n"
    "        while True:\n"
    "            chunk = s.recv(4096)\n"
    "            if not chunk: break\n"
    "            data += chunk\n"
    "    except (BrokenPipeError, ConnectionResetError):\n"
    "        pass\n"
    "    print('closed', data[:80])\n"
    "elif mode == 'flood':\n"
    "    socks = [conn() for _ in range(20)]\n"
    "    for s in socks:\n"
    "        s.sendall(b'{\"v\":1,\"cmd\":\"exec\",\"command\":\"sleep 3\"}\\n')\n"
    "    refused = 0\n"
    "    for s in socks:\n"
    "        s.settimeout(30); line = s.makefile('rb').readline()\n"
    "        refused += not json.loads(line).get('ok')\n"
    "    print('refused', refused)\n";

static struct gs_test_result gpusync(const char *const *args)
{
    return gs_test_run_gpusync(project, NULL, NULL, args, TIMEOUT_MS);
}

/* The daemon's status, or NULL when no daemon answers. */
static json_t *daemon_status(void)
{
    json_t *o = gs_test_gpusync_json(project, GS_TEST_ARGS("status", "--json"), 0, "status");
    if (json_is_true(json_object_get(o, "daemon")))
        return o;
    json_decref(o);
    return NULL;
}

/* Runs the socket client as nobody (`other`) or as us, and returns its one line of output. */
static void socket_client(int other, const char *mode, char *out, size_t size)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s python3 '%s' '%s/.gpusync/daemon.sock' %s 2>&1",
             other ? "runuser -u nobody --" : "", client_py, project, mode);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = '\0';
    if (!fgets(out, (int)size, p))
        out[0] = '\0';
    pclose(p);
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&server) != 0)
        return -1;
    snprintf(base, sizeof(base), "/tmp/gs-test-dstate.XXXXXX");
    if (!mkdtemp(base))
        return -1;
    chmod(base, 0755); /* nobody must reach the project's folder, to be stopped at .gpusync/ */
    snprintf(project, sizeof(project), "%s/proj", base);
    snprintf(remote, sizeof(remote), "%s/remote", base);
    snprintf(client_py, sizeof(client_py), "%s/client.py", base);
    mkdir(project, 0755);
    gs_test_write_file(base, "client.py", client_source);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", server.port);
    struct gs_test_result r =
        gpusync(GS_TEST_ARGS("init", target, "--path", remote, "--accept-new-host-key"));
    int rc = r.status == 0 ? 0 : -1;
    if (rc)
        fprintf(stderr, "init: %s%s\n", r.out.data, r.err.data);
    gs_test_result_release(&r);
    return rc;
}

static int group_teardown(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(GS_TEST_ARGS("watch", "--stop"));
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", base);
    gs_test_sshd_destroy(&server);
    return 0;
}

static int start_daemon(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(GS_TEST_ARGS("watch", "-d"));
    int rc = r.status == 0 || r.status == 6 ? 0 : -1; /* 6: still running from the last case */
    gs_test_result_release(&r);
    return rc;
}

static void git_stages_nothing_of_gpusync(void **state)
{
    (void)state;
    gs_test_write_file(project, "train.py", "print(1)\n");
    assert_int_equal(gs_test_sh("cd '%s' && git init -q . && git add -A", project), 0);
    char line[256] = "";
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cd '%s' && git status --porcelain | grep -c gpusync", project);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (!fgets(line, sizeof(line), p))
        line[0] = '\0';
    pclose(p);
    assert_int_equal(atoi(line), 0);
    struct stat st;
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/.gpusync", project);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    snprintf(dir, sizeof(dir), "%s/.gpusync/daemon.sock", project);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
}

static void a_removed_state_folder_is_put_back(void **state)
{
    (void)state;
    assert_int_equal(gs_test_sh("cd '%s' && cp .gpusync/config config.saved && rm -rf .gpusync "
                                "&& mkdir .gpusync && mv config.saved .gpusync/config",
                                project),
                     0);
    json_t *st = NULL;
    for (int64_t end = gs_clock_mono_ms() + 10000; !st && gs_clock_mono_ms() < end;)
        if (!(st = daemon_status()))
            usleep(100000); /* polling a condition with a deadline: the daemon checks each 1 s */
    assert_non_null(st);
    json_decref(st);
    gs_test_write_file(project, "after.txt", "synced after the folder came back\n");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush after the folder came back");
    char path[256];
    snprintf(path, sizeof(path), "%s/after.txt", remote);
    assert_int_equal(access(path, F_OK), 0);
}

static void conflicts_are_listed_until_acknowledged(void **state)
{
    (void)state;
    gs_test_write_file(project, "c.txt", "first\n");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush c.txt");
    gs_test_write_file(remote, "c.txt", "edited on the server\n");
    gs_test_write_file(project, "c.txt", "edited here\n");
    json_t *o = gs_test_gpusync_json(project, GS_TEST_ARGS("flush", "--json"), 0,
                                     "flush over a server edit");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 1);
    json_decref(o);
    json_t *st = daemon_status();
    assert_non_null(st);
    json_t *c = json_array_get(json_object_get(st, "conflicts"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "path")), "c.txt");
    assert_non_null(strstr(json_string_value(json_object_get(c, "kept")), "gpusync-conflict"));
    json_decref(st);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("status", "--ack"), "status --ack");
    st = daemon_status();
    assert_int_equal(json_array_size(json_object_get(st, "conflicts")), 0);
    json_decref(st);
}

static void an_outage_says_since_when_and_what_waits(void **state)
{
    (void)state;
    gs_test_sshd_stop(&server);
    gs_test_write_file(project, "during.txt", "written during the outage\n");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("flush", "--json"));
    gs_test_expect_status(&r, 4, "flush while the server is down");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "error")), "cannot connect");
    json_decref(o);
    gs_test_result_release(&r);
    json_t *st = daemon_status();
    assert_non_null(st);
    assert_true(json_is_string(json_object_get(st, "unreachable_since")));
    assert_false(json_is_true(json_object_get(st, "spare_ready")));
    assert_true(json_integer_value(json_object_get(st, "pending")) >= 1);
    json_decref(st);
    assert_int_equal(gs_test_sshd_restart(&server, 0), 0);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush once the server is back");
    st = daemon_status();
    assert_true(json_is_null(json_object_get(st, "unreachable_since")));
    json_decref(st);
}

static void the_socket_refuses_other_users_endless_lines_and_floods(void **state)
{
    (void)state;
    char out[256];
    /* even with the folder and socket opened to all, another uid is turned away */
    assert_int_equal(
        gs_test_sh("chmod 777 '%s/.gpusync' '%s/.gpusync/daemon.sock'", project, project), 0);
    socket_client(1, "stop", out, sizeof(out));
    gs_test_sh("chmod 700 '%s/.gpusync' && chmod 600 '%s/.gpusync/daemon.sock'", project, project);
    json_t *st = daemon_status();
    if (!st)
        fail_msg("another user stopped the daemon (client said: %s)", out);
    json_decref(st);
    socket_client(0, "endless", out, sizeof(out));
    assert_non_null(strstr(out, "closed"));
    st = daemon_status();
    assert_non_null(st);
    json_decref(st);
    socket_client(0, "flood", out, sizeof(out));
    if (strncmp(out, "refused 4", 9) != 0)
        fail_msg("20 concurrent remote commands: want 4 refused, the client said: %s", out);
}

/* Whether process `pid` has a socket open (the CLI's connection to the daemon). */
static int has_socket(pid_t pid)
{
    char dir[64], link[320], target[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        found = n > 0 && strncmp(target, "socket:", 7) == 0;
    }
    if (d)
        closedir(d);
    return found;
}

/* Waits until `pid` has connected to the daemon, then makes one request of our own: the daemon
 * answers requests in the order they arrive, and `pid` sent its own as it connected. */
static void await_request_of(pid_t pid)
{
    int64_t end = gs_clock_mono_ms() + TIMEOUT_MS;
    while (!has_socket(pid)) {
        if (gs_clock_mono_ms() > end)
            fail_msg("process %d never connected to the daemon", (int)pid);
        usleep(2000); /* polling /proc: no event says a process connected */
    }
    json_t *st = daemon_status();
    assert_non_null(st);
    json_decref(st);
}

/* Starts the daemon while the server does not answer (sshd stopped: connections wait in its
 * backlog), subscribes to its events and has a flush waiting before the first batch, then lets
 * the server go on. Returns the flush's result. */
static struct gs_test_result start_daemon_stalled_and_flush(struct gs_test_events *ev)
{
    assert_int_equal(kill(server.pid, SIGSTOP), 0);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "-d"), "watch -d");
    gs_test_events_start(ev, project);
    int out, err;
    pid_t flush =
        gs_test_start_gpusync(project, NULL, NULL, GS_TEST_ARGS("flush", "--json"), &out, &err);
    await_request_of(ev->pid);
    await_request_of(flush);
    assert_int_equal(kill(server.pid, SIGCONT), 0);
    return gs_test_finish(flush, out, err, TIMEOUT_MS);
}

/* Stops the daemon and counts the events of `kind` it sent since `ev` subscribed. */
static int events_after_stop(struct gs_test_events *ev, const char *kind)
{
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "--stop"), "watch --stop");
    assert_true(gs_test_events_read_to_end(ev, TIMEOUT_MS));
    int n = gs_test_events_count(ev, kind, "");
    gs_test_events_stop(ev);
    return n;
}

static int remote_mode(const char *rel)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", remote, rel);
    return lstat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* A rename made while no daemon ran has no event to explain its source's absence, so the first
 * batch holds it a moment (syncd/watch.h); the mode change of the renamed file waits with it,
 * instead of failing on a path the server does not have yet. */
static void a_rename_and_mode_change_made_while_stopped_arrive_without_error(void **state)
{
    (void)state;
    gs_test_write_file(project, "before.sh", "echo moved while no daemon ran\n");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "--stop"), "watch --stop");
    assert_int_equal(gs_test_sh("cd '%s' && mv before.sh after.sh && chmod 755 after.sh", project),
                     0);
    struct gs_test_events ev;
    struct gs_test_result r = start_daemon_stalled_and_flush(&ev);
    gs_test_expect_status(&r, 0, "flush");
    gs_test_result_release(&r);
    json_t *st = daemon_status();
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    json_decref(st);
    assert_int_equal(remote_mode("after.sh"), 0755);
    assert_int_equal(remote_mode("before.sh"), -1);
    int errors = events_after_stop(&ev, "error");
    assert_int_equal(errors, 0);
}

/* A file removed on the server behind gpusync's back cannot take a mode change: it is sent whole
 * again, with its new mode, and no error is reported. */
static void a_file_lost_on_the_server_comes_back_with_its_new_mode(void **state)
{
    (void)state;
    gs_test_write_file(project, "lost.sh", "echo lost on the server\n");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush");
    struct gs_test_events ev;
    gs_test_events_start(&ev, project);
    assert_int_equal(gs_test_sh("rm '%s/lost.sh' && chmod 755 '%s/lost.sh'", remote, project), 0);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush");
    assert_int_equal(remote_mode("lost.sh"), 0755);
    assert_int_equal(gs_test_sh("cmp -s '%s/lost.sh' '%s/lost.sh'", project, remote), 0);
    assert_int_equal(events_after_stop(&ev, "error"), 0);
}

/* A put the server refuses (its disk is full) in the same first batch as a rename held a moment:
 * the flush waiting for that batch must not answer success once the held rename is sent. */
static void a_flush_never_answers_success_over_a_refused_change(void **state)
{
    (void)state;
    assert_int_equal(gs_test_sh("mkdir -p '%s/full'", project), 0);
    gs_test_write_file(project, "old-name.txt", "renamed while no daemon ran\n");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush");
    if (gs_test_sh("mount -t tmpfs -o size=1m gs-e2e-full '%s/full' 2>/dev/null", remote) != 0)
        skip(); /* mounting a small file system needs root */
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "--stop"), "watch --stop");
    assert_int_equal(gs_test_sh("cd '%s' && head -c 2000000 /dev/urandom > full/big.bin && "
                                "mv old-name.txt new-name.txt",
                                project),
                     0);
    struct gs_test_events ev;
    struct gs_test_result r = start_daemon_stalled_and_flush(&ev);
    gs_test_events_stop(&ev);
    int said_done = r.status == 0;
    json_t *st = daemon_status();
    const char *now = json_string_value(json_object_get(st, "state"));
    int up_to_date = now && !strcmp(now, "up_to_date");
    json_decref(st);
    gs_test_sh("umount -l '%s/full'; rm -f '%s/full/big.bin'", remote, project);
    if (said_done || up_to_date)
        fail_msg("the server refused full/big.bin, yet %s said done: %s",
                 said_done ? "flush" : "status", r.out.data);
    gs_test_result_release(&r);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("flush"), "flush once the disk has room");
}

static void status_names_the_server_as_resolved(void **state)
{
    (void)state;
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "--stop"), "watch --stop");
    assert_int_equal(gs_test_sh("printf 'Host gsalias\\n  HostName 127.0.0.1\\n  Port %d\\n  User "
                                "root\\n' > '%s/.ssh/config' && sed -i 's/^\\(\\s*host = \\).*/\\1"
                                "gsalias/; /^\\s*port = /d' '%s/.gpusync/config'",
                                server.port, server.home, project),
                     0);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("status"));
    gs_test_expect_status(&r, 0, "status without a daemon");
    char want[64];
    snprintf(want, sizeof(want), "root@127.0.0.1:%d", server.port);
    if (!strstr(r.out.data, want))
        fail_msg("status does not name %s:\n%s", want, r.out.data);
    gs_test_result_release(&r);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(git_stages_nothing_of_gpusync, start_daemon),
        cmocka_unit_test_setup(a_removed_state_folder_is_put_back, start_daemon),
        cmocka_unit_test_setup(conflicts_are_listed_until_acknowledged, start_daemon),
        cmocka_unit_test_setup(an_outage_says_since_when_and_what_waits, start_daemon),
        cmocka_unit_test_setup(the_socket_refuses_other_users_endless_lines_and_floods,
                               start_daemon),
        cmocka_unit_test_setup(a_rename_and_mode_change_made_while_stopped_arrive_without_error,
                               start_daemon),
        cmocka_unit_test_setup(a_file_lost_on_the_server_comes_back_with_its_new_mode,
                               start_daemon),
        cmocka_unit_test_setup(a_flush_never_answers_success_over_a_refused_change, start_daemon),
        cmocka_unit_test(status_names_the_server_as_resolved),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
