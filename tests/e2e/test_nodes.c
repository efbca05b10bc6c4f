/* tests/e2e/test_nodes.c: a multi-node run followed and stopped as one (issue 16), through the
 * built CLI against two sandbox sshd servers on this machine (so both nodes' run directories and
 * processes can be inspected directly): one `stop` ends the run on both nodes, `ps` lists it
 * once with both nodes, `logs` shows both nodes' ranks, MASTER_ADDR comes from the config or is
 * detected, and `doctor` checks that node 1 reaches it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define ARGS   GS_TEST_ARGS
#define CMD_MS 60000

static struct gs_test_sshd a, b; /* node 0 (the project's [remote]) and node 1 */
static char project[600];        /* the local project */
static char ra[700], rb[700];    /* its remote directories on a and b (this machine) */
static char hosts[1600];         /* "root@127.0.0.1:A/ra,root@127.0.0.1:B/rb" */

/* ---- helpers ---- */

/* Trusts b's host key under `name` (as `[name]:port`) in the tests' known_hosts. */
static int trust_b(const char *name)
{
    return gs_test_sh("printf '[%s]:%d %%s\\n' \"$(cat '%s/host_ed25519.pub')\" >> '%s/.ssh/"
                      "known_hosts'",
                      name, b.port, b.dir, a.home);
}

/* Drops [remote] master_addr from the project's config, then adds `line` under [remote] (NULL:
 * nothing). */
static void set_remote_extra(const char *line)
{
    assert_int_equal(gs_test_sh("sed -i '/^\tmaster_addr = /d' '%s/.gpusync/config'", project), 0);
    if (line)
        assert_int_equal(gs_test_sh("sed -i 's|^\\[remote\\]$|[remote]\\n\\t%s|' "
                                    "'%s/.gpusync/config'",
                                    line, project),
                         0);
}

/* Starts a detached two-node run of `script` (one CPU rank per node). Returns its id (static). */
static const char *start_detached(const char *script)
{
    static char id[128];
    json_t *j = gs_test_gpusync_json(
        project, ARGS("run", "--json", "--detach", "--cpu", "1", "--", "sh", "-c", script), 0,
        "run --detach on two nodes");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(j, "id")));
    assert_int_equal(json_integer_value(json_object_get(j, "nodes")), 2);
    json_decref(j);
    return id;
}

/* How many processes of run `id` exist on this machine (both nodes are this machine). */
static int run_processes(const char *id)
{
    char entry[200];
    snprintf(entry, sizeof(entry), "GPUSYNC_RUN_ID=%s", id);
    return gs_test_count_env(entry);
}

/* Waits (polling /proc with a deadline: there is no event for a process's end here) until no
 * process of run `id` remains. Returns 1 once none does. */
static int run_processes_gone(const char *id, int ms)
{
    int64_t end = gs_clock_mono_ms() + ms;
    while (run_processes(id) > 0) {
        if (gs_clock_mono_ms() > end)
            return 0;
        usleep(20000);
    }
    return 1;
}

/* The JSON check called `name` from `doctor --json`, or NULL. */
static json_t *doctor_check(json_t *doc, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "checks"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "name")), name))
            return c;
    }
    return NULL;
}

static const char *str_at(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* ---- group ---- */

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&a) != 0 || gs_test_sshd_start(&b, NULL) != 0)
        return -1;
    snprintf(project, sizeof(project), "%s/work/proj", a.dir);
    snprintf(ra, sizeof(ra), "%s/node-a", a.dir);
    snprintf(rb, sizeof(rb), "%s/node-b", b.dir);
    snprintf(hosts, sizeof(hosts), "root@127.0.0.1:%d%s,root@127.0.0.1:%d%s", a.port, ra, b.port,
             rb);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", a.port);
    if (gs_test_sh("mkdir -p '%s' && cat '%s/.ssh/id_ed25519.pub' >> '%s/authorized_keys'", project,
                   a.home, b.dir) != 0 ||
        trust_b("127.0.0.1") != 0)
        return -1;
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("init", target, "--path", ra), CMD_MS);
    int ok = r.status == 0 &&
             gs_test_sh("cd '%s' && sed -i 's|^\\[remote\\]$|[remote]\\n\\thosts = %s|' "
                        ".gpusync/config",
                        project, hosts) == 0;
    if (!ok)
        fprintf(stderr, "init failed (%d): %s%s\n", r.status, r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&b);
    gs_test_sshd_destroy(&a);
    return 0;
}

/* ---- stop ---- */

static void test_nodes__one_stop_ends_a_detached_run_on_both_nodes(void **state)
{
    (void)state;
    const char *id = start_detached("echo up $RANK; exec sleep 120");
    assert_int_equal(run_processes(id), 2); /* one rank on each node, both running */
    struct gs_test_result r = gs_test_run_gpusync(project, NULL, NULL, ARGS("stop", id), CMD_MS);
    gs_test_expect_status(&r, 0, "stop of a two-node run");
    assert_true(run_processes_gone(id, 5000));
    const char *dirs[2] = {ra, rb};
    for (int i = 0; i < 2; i++) {
        json_t *st = gs_test_run_json(dirs[i], id, "status.json");
        assert_string_equal(str_at(st, "state"), "stopped");
        json_decref(st);
    }
    gs_test_result_release(&r);
}

static void test_nodes__stop_names_a_node_it_cannot_reach_and_a_retry_finishes(void **state)
{
    (void)state;
    const char *id = start_detached("exec sleep 120");
    gs_test_sshd_stop(&b);
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("stop", "--json", id), CMD_MS);
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.err.data, "node 1 ("));
    assert_int_equal(run_processes(id), 1); /* node 0's rank is gone, node 1's still runs */
    /* --json says the same: not ok, and which node was stopped and which was not (its error
     * object used to say "see above" and leave the nodes out). */
    json_t *j = json_loads(r.out.data ? r.out.data : "", 0, NULL);
    assert_non_null(j);
    assert_true(json_is_false(json_object_get(j, "ok")));
    assert_non_null(strstr(str_at(j, "message"), "node 1 ("));
    json_t *nodes = json_object_get(j, "nodes");
    assert_int_equal(json_array_size(nodes), 2);
    assert_true(json_is_true(json_object_get(json_array_get(nodes, 0), "ok")));
    assert_true(json_is_false(json_object_get(json_array_get(nodes, 1), "ok")));
    json_decref(j);
    gs_test_result_release(&r);
    assert_int_equal(gs_test_sshd_restart(&b, 0), 0);
    r = gs_test_run_gpusync(project, NULL, NULL, ARGS("stop", id), CMD_MS);
    gs_test_expect_status(&r, 0, "stop again once node 1 is back");
    assert_true(run_processes_gone(id, 5000));
    gs_test_result_release(&r);
}

/* ---- ps and logs ---- */

static void test_nodes__ps_lists_the_run_once_with_both_nodes(void **state)
{
    (void)state;
    const char *id = start_detached("exec sleep 120");
    json_t *ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps --json");
    size_t i, seen = 0;
    json_t *run, *mine = NULL;
    json_array_foreach(json_object_get(ps, "runs"), i, run)
    {
        if (!strcmp(str_at(run, "id"), id))
            seen++, mine = run;
    }
    assert_int_equal(seen, 1);
    assert_string_equal(str_at(mine, "state"), "running");
    assert_int_equal(json_array_size(json_object_get(mine, "ranks")), 2);
    json_t *nodes = json_object_get(mine, "nodes");
    assert_int_equal(json_array_size(nodes), 2);
    for (i = 0; i < 2; i++)
        assert_string_equal(str_at(json_array_get(nodes, i), "state"), "running");
    json_decref(ps);
    gs_test_gpusync_ok(project, ARGS("stop", id), "stop");
    /* once ended on every node, ps keeps showing it so without asking node 1 again */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            gs_test_sshd_stop(&b);
        ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps --json after stop");
        seen = 0;
        json_array_foreach(json_object_get(ps, "runs"), i, run)
        {
            if (!strcmp(str_at(run, "id"), id))
                seen++, assert_string_equal(str_at(run, "state"), "stopped");
        }
        assert_int_equal(seen, 1);
        json_decref(ps);
    }
    assert_int_equal(gs_test_sshd_restart(&b, 0), 0);
}

static void test_nodes__logs_show_the_ranks_of_both_nodes(void **state)
{
    (void)state;
    const char *id = start_detached("echo hello from $RANK; sleep 1; echo bye $RANK; exit $RANK");
    /* -f follows both nodes to the end: the run's exit code is node 1's (rank 1 exits 1) */
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("logs", "-f", id), CMD_MS);
    gs_test_expect_status(&r, 1, "logs -f of a two-node run");
    assert_non_null(strstr(r.out.data, "[rank 0] hello from 0"));
    assert_non_null(strstr(r.out.data, "[rank 1] bye 1"));
    gs_test_result_release(&r);
    r = gs_test_run_gpusync(project, NULL, NULL, ARGS("logs", id), CMD_MS);
    gs_test_expect_status(&r, 0, "logs of a two-node run");
    assert_non_null(strstr(r.out.data, "[rank 0] bye 0"));
    assert_non_null(strstr(r.out.data, "[rank 1] hello from 1"));
    gs_test_result_release(&r);
}

/* Lines of `text` that contain `needle`. */
static int lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* The last line of `text` as JSON (a new reference; NULL if it is not JSON). */
static json_t *last_line_json(const char *text)
{
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        n--;
    const char *line = text + n;
    while (line > text && line[-1] != '\n')
        line--;
    return json_loadb(line, (size_t)(text + n - line), 0, NULL);
}

/* Node 1 fails and node 0 is stopped because of it: the run's end is said once, as the run
 * failed (as ps and the exit code say), with node 0's stopped rank; not once per node with the
 * stopped node's 143 last. The same for `logs -f` afterwards. */
static void test_nodes__a_failed_run_ends_with_one_ended_line_saying_failed(void **state)
{
    (void)state;
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL,
                            ARGS("run", "--json", "--cpu", "1", "--", "sh", "-c",
                                 "if [ $RANK = 1 ]; then sleep 1; exit 3; fi; exec sleep 120"),
                            CMD_MS);
    gs_test_expect_status(&r, 3, "two-node run where node 1 fails");
    assert_int_equal(lines_with(r.out.data, "\"event\":\"ended\""), 1);
    json_t *end = last_line_json(r.out.data);
    assert_non_null(end);
    assert_string_equal(str_at(end, "state"), "failed");
    assert_int_equal(json_integer_value(json_object_get(end, "exit_code")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(end, "failed"), "rank")),
                     1);
    json_t *stopped = json_object_get(end, "stopped_ranks");
    assert_int_equal(json_array_size(stopped), 1);
    assert_int_equal(json_integer_value(json_array_get(stopped, 0)), 0);
    char id[128];
    snprintf(id, sizeof(id), "%s", str_at(end, "id"));
    json_decref(end);
    gs_test_result_release(&r);
    r = gs_test_run_gpusync(project, NULL, NULL, ARGS("logs", "-f", id), CMD_MS);
    gs_test_expect_status(&r, 3, "logs -f of the failed two-node run");
    char said[200];
    snprintf(said, sizeof(said), "gpusync: run %s ", id);
    assert_int_equal(lines_with(r.err.data, said), 1);
    snprintf(said, sizeof(said), "gpusync: run %s failed ", id);
    assert_int_equal(lines_with(r.err.data, said), 1);
    gs_test_result_release(&r);
}

/* ---- logs -f with a node down ---- */

/* A gpusync command in the background, its output read as it comes. */
struct bg {
    pid_t pid;
    int out, err; /* -1 once read to the end */
    struct gs_test_result r;
};

static void bg_start(struct bg *b, const char *const *args)
{
    memset(b, 0, sizeof(*b));
    b->pid = gs_test_start_gpusync(project, NULL, NULL, args, &b->out, &b->err);
    assert_true(b->pid > 0);
}

/* Reads both pipes until stdout (stderr, with `on_err`) holds `needle`; fails the test after
 * CMD_MS, or when the command ended without it. */
static void bg_await(struct bg *b, int on_err, const char *needle)
{
    int64_t end = gs_clock_mono_ms() + CMD_MS;
    struct gs_buf *in = on_err ? &b->r.err : &b->r.out;
    while (!(in->data && strstr(in->data, needle)) && b->out >= 0) {
        struct pollfd p[2] = {{b->out, POLLIN, 0}, {b->err, POLLIN, 0}};
        int64_t left = end - gs_clock_mono_ms();
        if (left <= 0 || poll(p, 2, (int)left) <= 0)
            break;
        for (int i = 0; i < 2 && b->out >= 0; i++) {
            char chunk[4096];
            ssize_t n = p[i].revents ? read(p[i].fd, chunk, sizeof(chunk)) : -1;
            if (n > 0)
                gs_buf_add(i ? &b->r.err : &b->r.out, chunk, (size_t)n);
            if (n == 0) { /* it ended: the rest of what it printed, then */
                gs_test_drain_until(b->out, b->err, &b->r, end);
                b->out = b->err = -1;
            }
        }
    }
    if (!(in->data && strstr(in->data, needle)))
        fail_msg("'%s' did not come%s:\n%s%s", needle, b->out < 0 ? " (gpusync ended)" : "",
                 b->r.out.data ? b->r.out.data : "", b->r.err.data ? b->r.err.data : "");
}

/* Reads to the end and reaps the command. Returns its exit status (output NUL-terminated). */
static int bg_finish(struct bg *b)
{
    int st;
    if (b->out >= 0)
        gs_test_drain(b->pid, b->out, b->err, &b->r, CMD_MS);
    assert_int_equal(waitpid(b->pid, &st, 0), b->pid);
    gs_buf_grow(&b->r.out, 0);
    gs_buf_grow(&b->r.err, 0);
    return b->r.status = gs_test_exit_status(st);
}

/* Waits (polling the rank's log on its server, with a deadline: no event to wait on) until it
 * holds `text`. */
static void await_rank_log(const char *dir, const char *id, int rank, const char *text)
{
    int64_t end = gs_clock_mono_ms() + CMD_MS;
    for (;;) {
        char *log = gs_test_rank_log(dir, id, rank);
        int has = strstr(log, text) != NULL;
        free(log);
        if (has)
            return;
        if (gs_clock_mono_ms() > end)
            fail_msg("rank %d's log never held '%s'", rank, text);
        usleep(20000);
    }
}

/* Starts a two-node run whose ranks print "first R", then wait for the file `go` in their remote
 * folder (2 minutes at most) and print "last R"; once both first lines are on the servers,
 * `logs RUN` keeps them in the local copy, as following the run would have. Returns its id. */
static const char *start_waiting_run(const char *go)
{
    char script[300];
    snprintf(script, sizeof(script),
             "echo first $RANK; i=0; while [ ! -e %s ] && [ $i -lt 1200 ]; do sleep 0.1; "
             "i=$((i+1)); done; echo last $RANK",
             go);
    const char *id = start_detached(script);
    await_rank_log(ra, id, 0, "first 0\n");
    await_rank_log(rb, id, 1, "first 1\n");
    struct gs_test_result r = gs_test_run_gpusync(project, NULL, NULL, ARGS("logs", id), CMD_MS);
    gs_test_expect_status(&r, 0, "logs of the waiting run");
    gs_test_result_release(&r);
    return id;
}

/* A test setup: node 1's sshd runs (a test that failed with it stopped leaves it so). */
static int node_1_up(void **state)
{
    (void)state;
    return gs_test_sshd_descendants(&b) < 0 ? gs_test_sshd_restart(&b, 0) : 0;
}

/* Node 1's sshd is down when `logs -f` attaches: node 0 is followed and node 1's first line is
 * shown from the local copy, node 1 named once; once its sshd is back, node 1 is followed on
 * from where that copy ended (its first line not again), and the run's end is the exit. */
static void test_nodes__logs_follow_with_a_node_down_follows_the_others_then_it(void **state)
{
    (void)state;
    const char *id = start_waiting_run("go-back");
    char node1[100];
    snprintf(node1, sizeof(node1), "node 1 (root@127.0.0.1:%d)", b.port);
    gs_test_sshd_stop(&b);
    struct bg f;
    bg_start(&f, ARGS("logs", "-f", id));
    bg_await(&f, 0, "[rank 0] first 0\n");
    bg_await(&f, 0, "[rank 1] first 1\n");
    bg_await(&f, 1, "following the others");
    assert_non_null(strstr(f.r.err.data, node1));
    assert_int_equal(gs_test_sshd_restart(&b, 0), 0);
    bg_await(&f, 1, "reached");
    gs_test_write_file(ra, "go-back", "");
    gs_test_write_file(rb, "go-back", "");
    bg_finish(&f);
    gs_test_expect_status(&f.r, 0, "logs -f, node 1 back");
    assert_int_equal(lines_with(f.r.out.data, "[rank 0] first 0\n"), 1);
    assert_int_equal(lines_with(f.r.out.data, "[rank 1] first 1\n"), 1);
    assert_int_equal(lines_with(f.r.out.data, "[rank 0] last 0\n"), 1);
    assert_int_equal(lines_with(f.r.out.data, "[rank 1] last 1\n"), 1);
    assert_int_equal(lines_with(f.r.err.data, "cannot be reached"), 1);
    gs_test_result_release(&f.r);
    assert_true(run_processes_gone(id, 5000));
    assert_int_equal(gs_test_sh("rm -f '%s/go-back' '%s/go-back'", ra, rb), 0);
}

/* The same with node 1 still down when node 0's part ends: `logs -f` ends then, with node 0's
 * lines and node 1's local copy shown, and exits 4 (as plain `logs`), naming node 1. */
static void test_nodes__logs_follow_with_a_node_down_to_the_end_exits_4_naming_it(void **state)
{
    (void)state;
    const char *id = start_waiting_run("go-down");
    char node1[100];
    snprintf(node1, sizeof(node1), "node 1 (root@127.0.0.1:%d)", b.port);
    gs_test_sshd_stop(&b);
    struct bg f;
    bg_start(&f, ARGS("logs", "-f", id));
    bg_await(&f, 0, "[rank 0] first 0\n");
    bg_await(&f, 1, "following the others");
    gs_test_write_file(ra, "go-down", "");
    bg_finish(&f);
    gs_test_expect_status(&f.r, 4, "logs -f, node 1 down to the end");
    assert_int_equal(lines_with(f.r.out.data, "[rank 0] first 0\n"), 1);
    assert_int_equal(lines_with(f.r.out.data, "[rank 0] last 0\n"), 1);
    assert_int_equal(lines_with(f.r.out.data, "[rank 1] first 1\n"), 1); /* the local copy */
    assert_null(strstr(f.r.out.data, "last 1"));
    /* named when attaching, and at the end as the node whose part is not known */
    assert_int_equal(lines_with(f.r.err.data, node1), 2);
    assert_non_null(strstr(f.r.err.data, "could not be confirmed ended on node 1 ("));
    gs_test_result_release(&f.r);
    assert_int_equal(gs_test_sshd_restart(&b, 0), 0);
    gs_test_write_file(rb, "go-down", "");
    assert_true(run_processes_gone(id, 10000));
    assert_int_equal(gs_test_sh("rm -f '%s/go-down' '%s/go-down'", ra, rb), 0);
}

/* ---- MASTER_ADDR ---- */

/* Runs a two-node run printing MASTER_ADDR and returns node 1's rank log (malloc'd). */
static char *master_addr_seen(const char *const *extra_args)
{
    const char *args[16] = {"run", "--cpu", "1"};
    int n = 3;
    for (; extra_args && *extra_args; extra_args++)
        args[n++] = *extra_args;
    args[n++] = "--";
    args[n++] = "sh";
    args[n++] = "-c";
    args[n++] = "echo MA=$MASTER_ADDR.";
    args[n] = NULL;
    struct gs_test_result r = gs_test_run_gpusync(project, NULL, NULL, args, CMD_MS);
    gs_test_expect_status(&r, 0, "two-node run printing MASTER_ADDR");
    char id[128];
    const char *p = strstr(r.err.data, "gpusync: run ");
    if (!p || sscanf(p, "gpusync: run %127s started", id) != 1)
        fail_msg("no run id on stderr: %s", r.err.data);
    gs_test_result_release(&r);
    return gs_test_rank_log(rb, id, 1);
}

static void
test_nodes__master_addr_from_the_config_or_the_command_line_reaches_the_ranks(void **state)
{
    (void)state;
    set_remote_extra("master_addr = localhost");
    char *log = master_addr_seen(NULL);
    assert_non_null(strstr(log, "MA=localhost."));
    free(log);
    log = master_addr_seen(ARGS("--master-addr", "127.0.0.1"));
    assert_non_null(strstr(log, "MA=127.0.0.1."));
    free(log);
    set_remote_extra(NULL);
}

static void test_nodes__master_addr_is_detected_not_the_name_the_laptop_uses(void **state)
{
    (void)state;
    char by_name[1600];
    snprintf(by_name, sizeof(by_name), "root@localhost:%d%s,root@localhost:%d%s", a.port, ra,
             b.port, rb);
    char *log = master_addr_seen(ARGS("--accept-new-host-key", "--hosts", by_name));
    /* node 0's address on its route to node 1, not "localhost" as the hosts list names it */
    assert_non_null(strstr(log, "MA=127.0.0.1."));
    free(log);
}

/* ---- top ---- */

/* The first rank `top --json --count 1 [--node N]` shows of the run, with which node it says it
 * shows (node, nodes); fails unless the run is the one shown. */
static void top_sees(const char *id, const char *node, int want_node, int want_rank)
{
    json_t *j =
        node ? gs_test_gpusync_json(project, ARGS("top", "--json", "--count", "1", "--node", node),
                                    0, "top --node")
             : gs_test_gpusync_json(project, ARGS("top", "--json", "--count", "1"), 0, "top");
    assert_int_equal(json_integer_value(json_object_get(j, "node")), want_node);
    assert_int_equal(json_integer_value(json_object_get(j, "nodes")), 2);
    json_t *run = json_object_get(j, "run");
    assert_string_equal(str_at(run, "id"), id);
    json_t *rank = json_array_get(json_object_get(run, "ranks"), 0);
    assert_int_equal(json_integer_value(json_object_get(rank, "rank")), want_rank);
    json_decref(j);
}

/* top of a project with several nodes showed node 0's machine and ranks as "the server", with
 * nothing saying the run had other nodes; --node N shows another, and each view names its
 * node. */
static void test_nodes__top_shows_the_node_it_is_asked_for_and_says_which(void **state)
{
    (void)state;
    const char *id = start_detached("exec sleep 120");
    top_sees(id, NULL, 0, 0);
    top_sees(id, "1", 1, 1);
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL, ARGS("top", "--count", "1", "--node", "1"), CMD_MS);
    gs_test_expect_status(&r, 0, "top --node 1");
    assert_non_null(strstr(r.out.data, "node 1 of 2"));
    gs_test_result_release(&r);
    r = gs_test_run_gpusync(project, NULL, NULL, ARGS("top", "--count", "1", "--node", "2"),
                            CMD_MS);
    gs_test_expect_status(&r, 2, "top --node 2 of a two-node project");
    gs_test_result_release(&r);
    gs_test_gpusync_ok(project, ARGS("stop", id), "stop");
}

/* ---- doctor ---- */

static void test_nodes__doctor_checks_that_node_1_reaches_master_addr(void **state)
{
    (void)state;
    json_t *doc = gs_test_gpusync_json(project, ARGS("doctor", "--json"), 0, "doctor");
    json_t *c = doctor_check(doc, "nodes");
    assert_non_null(c);
    assert_string_equal(str_at(c, "status"), "ok");
    json_decref(doc);
    set_remote_extra("master_addr = 198.51.100.1"); /* TEST-NET-2: no node there */
    doc = gs_test_gpusync_json(project, ARGS("doctor", "--json"), 1, "doctor, wrong address");
    c = doctor_check(doc, "nodes");
    assert_non_null(c);
    assert_string_equal(str_at(c, "status"), "fail");
    assert_non_null(strstr(str_at(c, "detail"), "198.51.100.1"));
    assert_non_null(strstr(str_at(c, "hint"), "master_addr"));
    json_decref(doc);
    set_remote_extra(NULL);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes__one_stop_ends_a_detached_run_on_both_nodes),
        cmocka_unit_test(test_nodes__stop_names_a_node_it_cannot_reach_and_a_retry_finishes),
        cmocka_unit_test(test_nodes__ps_lists_the_run_once_with_both_nodes),
        cmocka_unit_test(test_nodes__logs_show_the_ranks_of_both_nodes),
        cmocka_unit_test(test_nodes__a_failed_run_ends_with_one_ended_line_saying_failed),
        cmocka_unit_test_setup(test_nodes__logs_follow_with_a_node_down_follows_the_others_then_it,
                               node_1_up),
        cmocka_unit_test_setup(
            test_nodes__logs_follow_with_a_node_down_to_the_end_exits_4_naming_it, node_1_up),
        cmocka_unit_test(
            test_nodes__master_addr_from_the_config_or_the_command_line_reaches_the_ranks),
        cmocka_unit_test(test_nodes__master_addr_is_detected_not_the_name_the_laptop_uses),
        cmocka_unit_test(test_nodes__doctor_checks_that_node_1_reaches_master_addr),
        cmocka_unit_test(test_nodes__top_shows_the_node_it_is_asked_for_and_says_which),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
