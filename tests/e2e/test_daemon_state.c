/* tests/e2e/test_daemon_state.c: what the watch daemon keeps in .gpusync/ and who may talk to it
 * (issues 12 and 13): nothing there for git to stage, a removed .gpusync/ put back, conflict
 * copies listed until acknowledged, an outage named with its start and what waits, the server
 * named as a connection resolves it, and the control socket closed to other users, to endless
 * request lines and to floods of remote commands. */
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
        cmocka_unit_test(status_names_the_server_as_resolved),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
