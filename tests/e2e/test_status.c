/* tests/e2e/test_status.c: what `status`, `flush` and the event stream tell about a running watch
 * daemon when things go wrong around it (issue 13): .gpusync/ removed under it (the index kept,
 * or the daemon stopping and saying why), conflict copies listed across restarts until
 * acknowledged, the server named as a connection resolves it, and a control socket that answers
 * while a login hangs. Each case has its own project against the sandbox sshd (some through the
 * WAN simulator). GS_TEST_FILTER='*name*' runs a subset. */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/events.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "wansim_harness.h"

#define TIMEOUT_MS 120000
#define ARGS       GS_TEST_ARGS

static struct gs_test_sshd server;
static struct wansim_proc wan;
static char base[64], project[128], remote[128];

/* ---- running gpusync in the project ---- */

static struct gs_test_result gpusync(const char *const *args)
{
    return gs_test_run_gpusync(project, NULL, NULL, args, TIMEOUT_MS);
}

/* `status --json` as the daemon answers it, or NULL when the answer came without a daemon. */
static json_t *daemon_status(void)
{
    json_t *o = gs_test_gpusync_json(project, ARGS("status", "--json"), 0, "status --json");
    if (json_is_true(json_object_get(o, "daemon")))
        return o;
    json_decref(o);
    return NULL;
}

/* Waits (10 s at most) for the daemon to answer `status` again; the daemon looks at its state
 * folder once a second, so this polls a condition with a deadline. */
static json_t *await_daemon_status(void)
{
    json_t *st = NULL;
    for (int64_t end = gs_clock_mono_ms() + 10000; !st && gs_clock_mono_ms() < end;)
        if (!(st = daemon_status()))
            usleep(100000);
    if (!st)
        fail_msg("the daemon did not answer status again within 10 s");
    return st;
}

/* One request on the daemon's control socket, as a client other than the CLI sends it; returns
 * the reply (a new reference). */
static json_t *control_request(const char *cmd)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%.64s/.gpusync/daemon.sock", project);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    char line[128];
    int len = snprintf(line, sizeof(line), "{\"v\":1,\"cmd\":\"%s\"}\n", cmd);
    assert_int_equal(write(fd, line, (size_t)len), len);
    FILE *in = fdopen(fd, "r");
    char reply[65536];
    assert_non_null(fgets(reply, sizeof(reply), in));
    fclose(in);
    json_t *o = json_loads(reply, 0, NULL);
    if (!o)
        fail_msg("%s: the reply is not JSON: %s", cmd, reply);
    return o;
}

/* The conflicts a status --json lists (borrowed from `st`), after checking it came from a daemon
 * (`daemon` 1) or not (0). */
static json_t *listed_conflicts(json_t *st, int daemon)
{
    if (json_is_true(json_object_get(st, "daemon")) != daemon)
        fail_msg("want a status %s a daemon: %s", daemon ? "from" : "without",
                 json_dumps(st, JSON_COMPACT));
    json_t *list = json_object_get(st, "conflicts");
    if (!json_is_array(list))
        fail_msg("status has no conflicts list: %s", json_dumps(st, JSON_COMPACT));
    return list;
}

static void expect_one_conflict(json_t *list, const char *path)
{
    if (json_array_size(list) != 1)
        fail_msg("want 1 conflict listed, got %s", json_dumps(list, JSON_COMPACT));
    json_t *c = json_array_get(list, 0);
    assert_string_equal(json_string_value(json_object_get(c, "path")), path);
    assert_non_null(strstr(json_string_value(json_object_get(c, "kept")), ".gpusync-conflict-"));
}

/* ---- one project per case ---- */

static void project_init(int port)
{
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", port);
    gs_test_gpusync_ok(project, ARGS("init", target, "--path", remote, "--accept-new-host-key"),
                       "init");
}

static int case_setup(void **state)
{
    (void)state;
    snprintf(base, sizeof(base), "/tmp/gs-test-status.XXXXXX");
    if (!mkdtemp(base))
        return -1;
    snprintf(project, sizeof(project), "%s/proj", base);
    snprintf(remote, sizeof(remote), "%s/remote", base);
    return mkdir(project, 0755);
}

static int case_teardown(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(ARGS("watch", "--stop"));
    gs_test_result_release(&r);
    pid_t pid = gs_test_daemon_lock_pid(project);
    if (pid > 0 && kill(pid, 0) == 0) /* --stop could not reach it: leave no daemon behind */
        kill(pid, SIGKILL);
    if (wan.pid)
        wansim_stop(&wan);
    gs_test_sh("rm -rf '%s' '%s/.ssh/config'", base, server.home); /* the config: an alias case */
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return gs_test_sshd_start_for_cli(&server);
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&server);
    return 0;
}

/* ---- .gpusync/ removed under a running daemon ---- */

/* `rm -rf .gpusync` with the config put back (a user cleaning up, a git operation): the daemon
 * puts its state back, and the index with it, so nothing already on the server counts as pending
 * and nothing is sent again once the daemon is gone. */
static void test_status__a_removed_state_folder_keeps_the_index(void **state)
{
    (void)state;
    project_init(server.port);
    gs_test_write_file(project, "a.py", "a\n");
    gs_test_write_file(project, "b.py", "b\n");
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d");
    gs_test_gpusync_ok(project, ARGS("flush"), "first flush");
    assert_int_equal(gs_test_sh("cd '%s' && cp .gpusync/config config.saved && rm -rf .gpusync "
                                "&& mkdir .gpusync && mv config.saved .gpusync/config",
                                project),
                     0);
    json_decref(await_daemon_status());
    gs_test_write_file(project, "c.py", "c\n");
    gs_test_gpusync_ok(project, ARGS("flush"), "flush after the folder came back");
    gs_test_gpusync_ok(project, ARGS("watch", "--stop"), "watch --stop");
    json_t *st =
        gs_test_gpusync_json(project, ARGS("status", "--json"), 0, "status without the daemon");
    if (json_integer_value(json_object_get(st, "pending")) != 0)
        fail_msg("the index was lost with the folder: %s", json_dumps(st, JSON_COMPACT));
    json_decref(st);
    char path[256];
    snprintf(path, sizeof(path), "%s/.gpusync/.gitignore", project);
    assert_int_equal(access(path, F_OK), 0);
}

/* The whole .gpusync/ removed, config included (the project is no longer a gpusync project): the
 * daemon stops, and since its log went with the folder, it says why on the event stream first. */
static void test_status__a_daemon_whose_config_was_removed_stops_and_says_why(void **state)
{
    (void)state;
    project_init(server.port);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d");
    json_t *st = await_daemon_status();
    pid_t pid = (pid_t)json_integer_value(json_object_get(st, "pid"));
    json_decref(st);
    struct gs_test_events ev;
    gs_test_events_start(&ev, project);
    gs_test_write_file(project, "marker.txt",
                       "subscribed\n"); /* its event proves the stream is subscribed */
    gs_test_gpusync_ok(project, ARGS("flush"), "flush the marker");
    gs_test_events_until(&ev, "synced", "marker.txt", 10000);
    assert_int_equal(gs_test_sh("rm -rf '%s/.gpusync'", project), 0);
    int ended = gs_test_events_read_to_end(&ev, 10000), said = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev.all, i, e)
    {
        const char *kind = json_string_value(json_object_get(e, "event"));
        said |= kind && !strcmp(kind, "error") && json_is_null(json_object_get(e, "path")) &&
                json_is_string(json_object_get(e, "message"));
    }
    gs_test_events_stop(&ev);
    if (!ended)
        fail_msg("the event stream did not end within 10 s of the removal");
    gs_test_await_gone(pid);
    if (!said)
        fail_msg("the daemon stopped without an error event saying why");
}

/* Makes the daemon keep a conflict copy of `rel`: synced, then changed on the server and here. */
static void make_conflict(const char *rel)
{
    gs_test_write_file(project, rel, "first\n");
    gs_test_gpusync_ok(project, ARGS("flush"), "flush the first version");
    gs_test_write_file(remote, rel, "edited on the server\n");
    gs_test_write_file(project, rel, "edited here\n");
    json_t *o =
        gs_test_gpusync_json(project, ARGS("flush", "--json"), 0, "flush over a server edit");
    expect_one_conflict(json_object_get(o, "conflicts"), rel);
    json_decref(o);
}

/* A conflict the daemon found stays listed until `status --ack`: by status without a daemon once
 * it stopped, and by a daemon started again; acknowledged through either. */
static void test_status__conflicts_outlive_the_daemon_until_acknowledged(void **state)
{
    (void)state;
    project_init(server.port);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d");
    make_conflict("c.txt");
    gs_test_gpusync_ok(project, ARGS("watch", "--stop"), "watch --stop");
    json_t *st =
        gs_test_gpusync_json(project, ARGS("status", "--json"), 0, "status without a daemon");
    expect_one_conflict(listed_conflicts(st, 0), "c.txt");
    json_decref(st);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d again");
    st = await_daemon_status();
    expect_one_conflict(listed_conflicts(st, 1), "c.txt");
    json_decref(st);
    st = gs_test_gpusync_json(project, ARGS("status", "--ack", "--json"), 0,
                              "status --ack"); /* shown once more */
    expect_one_conflict(listed_conflicts(st, 1), "c.txt");
    json_decref(st);
    gs_test_gpusync_ok(project, ARGS("watch", "--stop"), "watch --stop after the acknowledgement");
    st = gs_test_gpusync_json(project, ARGS("status", "--json"), 0,
                              "status after the acknowledgement");
    assert_int_equal(json_array_size(listed_conflicts(st, 0)), 0);
    json_decref(st);
    /* and acknowledged without a daemon */
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d for a second conflict");
    make_conflict("d.txt");
    gs_test_gpusync_ok(project, ARGS("watch", "--stop"), "watch --stop after the second conflict");
    st = gs_test_gpusync_json(project, ARGS("status", "--ack", "--json"), 0,
                              "status --ack without a daemon");
    expect_one_conflict(listed_conflicts(st, 0), "d.txt");
    json_decref(st);
    st = gs_test_gpusync_json(project, ARGS("status", "--json"), 0,
                              "status after that acknowledgement");
    assert_int_equal(json_array_size(listed_conflicts(st, 0)), 0);
    json_decref(st);
}

/* The acknowledgement answers with the list it acknowledged, in the same turn of the daemon: a
 * conflict found between a `status` and a separate acknowledgement would be dropped unseen. */
static void test_status__an_acknowledgement_answers_with_what_it_acknowledged(void **state)
{
    (void)state;
    project_init(server.port);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d");
    make_conflict("c.txt");
    json_t *acked = control_request("ack_conflicts");
    assert_true(json_is_true(json_object_get(acked, "ok")));
    expect_one_conflict(listed_conflicts(acked, 1), "c.txt");
    json_decref(acked);
    json_t *st = await_daemon_status();
    assert_int_equal(json_array_size(listed_conflicts(st, 1)), 0);
    json_decref(st);
}

/* A file whose name is not UTF-8: its events and its conflict reach the stream and status with
 * U+FFFD for the bad byte. Its event used to be NULL, and sending that hung up every subscriber,
 * which never heard of the files after it; a conflict on it vanished from the list. */
static void test_status__a_name_that_is_not_utf8_keeps_its_events_and_conflict(void **state)
{
    (void)state;
    const char *bad = "bad\xff.txt", *shown = "bad\xef\xbf\xbd.txt";
    project_init(server.port);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d");
    json_decref(await_daemon_status());
    struct gs_test_events ev;
    gs_test_events_start(&ev, project);
    gs_test_write_file(project, "marker.txt", "subscribed\n"); /* proves the subscription */
    gs_test_gpusync_ok(project, ARGS("flush"), "flush the marker");
    gs_test_events_until(&ev, "synced", "marker.txt", 10000);
    gs_test_write_file(project, bad, "first\n");
    gs_test_gpusync_ok(project, ARGS("flush"), "flush the non-UTF-8 name");
    gs_test_write_file(project, "after.txt", "after\n");
    gs_test_gpusync_ok(project, ARGS("flush"), "flush a file after it");
    gs_test_events_until(&ev, "synced", "after.txt", 10000); /* the stream is still there */
    assert_int_equal(gs_test_events_count(&ev, "synced", shown), 1);
    /* changed on both sides: the conflict is listed, and status still answers */
    gs_test_write_file(remote, bad, "edited on the server\n");
    gs_test_write_file(project, bad, "edited here\n");
    json_t *o =
        gs_test_gpusync_json(project, ARGS("flush", "--json"), 0, "flush over a server edit");
    expect_one_conflict(json_object_get(o, "conflicts"), shown);
    json_decref(o);
    gs_test_events_until(&ev, "conflict", shown, 10000);
    json_t *st = daemon_status();
    if (!st)
        fail_msg("status --json did not come from the daemon");
    expect_one_conflict(listed_conflicts(st, 1), shown);
    json_decref(st);
    gs_test_events_stop(&ev);
}

/* A host that is an ~/.ssh/config alias: status without a daemon names the server as a
 * connection resolves it (its real address and port), in text and in JSON. */
static void test_status__status_without_a_daemon_names_the_resolved_server(void **state)
{
    (void)state;
    project_init(server.port);
    assert_int_equal(gs_test_sh("printf 'Host gsstatus\\n  HostName 127.0.0.1\\n  Port %d\\n  User "
                                "root\\n' > '%s/.ssh/config' && sed -i 's/^\\(\\s*host = \\).*/\\1"
                                "gsstatus/; /^\\s*port = /d' '%s/.gpusync/config'",
                                server.port, server.home, project),
                     0);
    char want[64];
    snprintf(want, sizeof(want), "root@127.0.0.1:%d", server.port);
    json_t *st = gs_test_gpusync_json(project, ARGS("status", "--json"), 0,
                                      "status --json through an alias");
    const char *target = json_string_value(json_object_get(st, "target"));
    if (!target || strcmp(target, want) != 0)
        fail_msg("status --json names %s, want %s", target ? target : "no target", want);
    json_decref(st);
    struct gs_test_result r = gpusync(ARGS("status"));
    gs_test_expect_status(&r, 0, "status through an alias");
    if (!strstr(r.out.data, want))
        fail_msg("status does not name %s:\n%s", want, r.out.data);
    gs_test_result_release(&r);
}

/* A login that hangs (the link stalls before the server's banner): the daemon connects on a
 * thread of its own, so `status` is answered meanwhile, saying it is connecting and to whom, a
 * `flush` that gives up says the server has not answered, not that the daemon did not, and the
 * login is not cut short. Once the link moves again, the flush succeeds. */
static void test_status__the_daemon_answers_while_its_login_hangs(void **state)
{
    (void)state;
    char err[256], reply[256];
    struct wansim_opts o = {.target_port = server.port, .delay_ms = 1};
    if (wansim_start(&wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    project_init(wan.port);
    gs_test_write_file(project, "a.py", "a\n");
    assert_int_equal(wansim_command(&wan, "stall", reply, sizeof(reply)), 0);
    gs_test_gpusync_ok(project, ARGS("watch", "-d"), "watch -d with the link stalled");
    int64_t t0 = gs_clock_mono_ms();
    json_t *st = daemon_status();
    if (!st)
        fail_msg("status got no answer from the daemon while its login hung");
    assert_true(gs_clock_mono_ms() - t0 < 4000); /* status gives up on a daemon after 5 s */
    assert_string_equal(json_string_value(json_object_get(st, "state")), "connecting");
    char want[64];
    snprintf(want, sizeof(want), "root@127.0.0.1:%d", wan.port);
    assert_string_equal(json_string_value(json_object_get(st, "target")), want);
    json_decref(st);
    json_t *f = gs_test_gpusync_json(project, ARGS("flush", "--timeout", "1", "--json"), 4,
                                     "flush while the login hangs");
    assert_string_equal(json_string_value(json_object_get(f, "error")), "timed out");
    const char *msg = json_string_value(json_object_get(f, "message"));
    print_message("flush said: %s\n", msg);
    if (!strstr(msg, want) || strstr(msg, "no answer from the gpusync daemon"))
        fail_msg("the flush should name the server that does not answer, not the daemon: %s", msg);
    json_decref(f);
    /* a slow login is waited for (the connect timeout, 10 s), not cut short to keep the socket
     * answering: 6 s into the stall, the first attempt still runs and nothing has failed */
    while (gs_clock_mono_ms() < t0 + 6000)
        usleep(100000); /* time passing is the point: there is no event to await */
    st = daemon_status();
    assert_non_null(st);
    if (strcmp(json_string_value(json_object_get(st, "state")), "connecting") != 0 ||
        !json_is_null(json_object_get(st, "last_error")))
        fail_msg("the login was given up within 6 s: %s", json_dumps(st, JSON_COMPACT));
    json_decref(st);
    assert_int_equal(wansim_command(&wan, "resume", reply, sizeof(reply)), 0);
    gs_test_gpusync_ok(project, ARGS("flush"), "flush once the link moves");
    char path[256];
    snprintf(path, sizeof(path), "%s/a.py", remote);
    assert_int_equal(access(path, F_OK), 0);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_status__a_removed_state_folder_keeps_the_index,
                                        case_setup, case_teardown),
        cmocka_unit_test_setup_teardown(
            test_status__a_daemon_whose_config_was_removed_stops_and_says_why, case_setup,
            case_teardown),
        cmocka_unit_test_setup_teardown(
            test_status__conflicts_outlive_the_daemon_until_acknowledged, case_setup,
            case_teardown),
        cmocka_unit_test_setup_teardown(
            test_status__an_acknowledgement_answers_with_what_it_acknowledged, case_setup,
            case_teardown),
        cmocka_unit_test_setup_teardown(
            test_status__status_without_a_daemon_names_the_resolved_server, case_setup,
            case_teardown),
        cmocka_unit_test_setup_teardown(test_status__the_daemon_answers_while_its_login_hangs,
                                        case_setup, case_teardown),
        cmocka_unit_test_setup_teardown(
            test_status__a_name_that_is_not_utf8_keeps_its_events_and_conflict, case_setup,
            case_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
