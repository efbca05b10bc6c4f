/* tests/e2e/test_runs.c: `gpusync run`, `logs`, `ps` and `stop` (issue 6) through the built CLI,
 * against the sandbox sshd (the server is this machine, so the remote run directories and the
 * processes of a run can be inspected directly): the bundled trainer on CPU ranks, exit codes,
 * fail-fast, restarts, the torchrun environment, detach / re-attach / stop, a connection cut by
 * the WAN simulator while following, concurrent runs, argument quoting, and a two-node run over
 * two sshd servers. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "tools/wansim_harness.h"

#define RUN_TIMEOUT_MS 150000

static struct gs_test_sshd srv; /* the server every test but the two-node one uses */
static char project[600];       /* a local project initialised against srv */
static char remote[700];        /* its remote directory (same machine) */

/* ---- driving the CLI ---- */

/* A gpusync process with both output pipes, read into buffers as it runs. */
struct child {
    pid_t pid;
    int fd[2]; /* stdout, stderr; -1 once closed */
    struct gs_buf out, err;
    int status; /* exit code, or 128+N for signal N, once reaped */
};

/* Starts gpusync in `cwd` with `args` (NULL-terminated), stdin at /dev/null and no terminal. */
static void child_start(struct child *c, const char *cwd, const char *const *args)
{
    int out[2], err[2];
    memset(c, 0, sizeof(*c));
    /* Close-on-exec: a daemon the child starts (watch -d) must not keep our pipes open. */
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        setsid();
        if (chdir(cwd) != 0)
            _exit(126);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        gs_test_exec_gpusync(args);
    }
    close(out[1]);
    close(err[1]);
    c->fd[0] = out[0];
    c->fd[1] = err[0];
}

/* Reads what is available within `ms`. Returns 0 when both pipes are closed. */
static int child_pump(struct child *c, int ms)
{
    struct pollfd p[2] = {{.fd = c->fd[0], .events = POLLIN}, {.fd = c->fd[1], .events = POLLIN}};
    if (c->fd[0] < 0 && c->fd[1] < 0)
        return 0;
    if (poll(p, 2, ms) < 0 && errno != EINTR)
        fail_msg("poll: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
        if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        char chunk[8192];
        ssize_t n = read(p[i].fd, chunk, sizeof(chunk));
        if (n > 0) {
            gs_buf_add(i ? &c->err : &c->out, chunk, (size_t)n);
        } else if (n == 0 || errno != EINTR) {
            close(p[i].fd);
            c->fd[i] = -1;
        }
    }
    return c->fd[0] >= 0 || c->fd[1] >= 0;
}

/* Waits until stdout (or stderr, with `err`) holds `needle` within `ms`; fails the test if not. */
static void child_wait_in(struct child *c, int err, const char *needle, int ms)
{
    int64_t end = gs_clock_mono_ms() + ms;
    const struct gs_buf *b = err ? &c->err : &c->out;
    while (!(b->data && strstr(b->data, needle))) {
        if (gs_clock_mono_ms() > end || !child_pump(c, 100))
            fail_msg("'%s' did not appear within %d ms\nstdout: %s\nstderr: %s", needle, ms,
                     c->out.data ? c->out.data : "", c->err.data ? c->err.data : "");
    }
}

static void child_wait_for(struct child *c, const char *needle, int ms)
{
    child_wait_in(c, 0, needle, ms);
}

/* Reads to EOF and reaps the child (killing it after the deadline). Returns its status. */
static int child_finish(struct child *c)
{
    int64_t end = gs_clock_mono_ms() + RUN_TIMEOUT_MS;
    while (child_pump(c, 200))
        if (gs_clock_mono_ms() > end) {
            kill(c->pid, SIGKILL);
            fail_msg("gpusync did not finish within %d ms\nstderr: %s", RUN_TIMEOUT_MS,
                     c->err.data ? c->err.data : "");
        }
    int st;
    assert_int_equal(waitpid(c->pid, &st, 0), c->pid);
    c->status = gs_test_exit_status(st);
    if (!c->out.data)
        gs_buf_grow(&c->out, 0);
    if (!c->err.data)
        gs_buf_grow(&c->err, 0);
    return c->status;
}

static void child_release(struct child *c)
{
    gs_buf_release(&c->out);
    gs_buf_release(&c->err);
}

/* Runs gpusync to completion. */
static struct child run_in(const char *cwd, const char *const *args)
{
    struct child c;
    child_start(&c, cwd, args);
    child_finish(&c);
    return c;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_status(const struct child *c, int want, const char *what)
{
    if (c->status == want)
        return;
    /* the whole output, which fail_msg would truncate */
    fprintf(stderr, "%s: exit %d, want %d\nstdout: %s\nstderr: %s\n", what, c->status, want,
            c->out.data, c->err.data);
    fail_msg("%s: exit %d, want %d", what, c->status, want);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The run id from "gpusync: run ID started" on stderr, into a static buffer. */
static const char *run_id_of(const struct child *c)
{
    static char id[128];
    const char *p = c->err.data ? strstr(c->err.data, "gpusync: run ") : NULL;
    if (!p || sscanf(p, "gpusync: run %127s started", id) != 1)
        fail_msg("no run id on stderr: %s", c->err.data ? c->err.data : "");
    return id;
}

static long long int_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("'%s' is not an integer", key);
    return (long long)json_integer_value(v);
}

static const char *str_at(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* 1 while any process of group `pgid` exists (the server is this machine). */
static int group_exists(long long pgid)
{
    return pgid > 1 && !(kill((pid_t)-pgid, 0) < 0 && errno == ESRCH);
}

/* Waits up to `ms` for process `pid` to end (a zombie left to a non-reaping init counts as
 * ended: it runs nothing and holds no GPU). Returns 1 once it has. */
static int process_gone(long long pid, int ms)
{
    int64_t end = gs_clock_mono_ms() + ms;
    for (;;) {
        char path[64], buf[512] = "";
        snprintf(path, sizeof(path), "/proc/%lld/stat", pid);
        FILE *fp = fopen(path, "r");
        size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
        if (fp)
            fclose(fp);
        buf[n] = 0;
        const char *paren = strrchr(buf, ')');
        if (!fp || (paren && paren[1] == ' ' && paren[2] == 'Z'))
            return 1;
        if (gs_clock_mono_ms() > end)
            return 0;
        usleep(20000); /* polling a condition with a deadline: no event to wait on here */
    }
}

/* Waits (inotify on the remote run directory) until rank's remote log holds `text`. */
static void await_remote_log(const char *id, int rank, const char *text)
{
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s/.gpusync/runs/%s", remote, id);
    int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(ifd >= 0);
    assert_true(inotify_add_watch(ifd, dir, IN_MODIFY | IN_CREATE) >= 0);
    int64_t end = gs_clock_mono_ms() + 60000;
    for (;;) {
        char *log = gs_test_rank_log(remote, id, rank);
        int has = strstr(log, text) != NULL;
        free(log);
        if (has)
            break;
        int64_t left = end - gs_clock_mono_ms();
        if (left <= 0)
            fail_msg("rank %d of run %s never printed '%s'", rank, id, text);
        struct pollfd p = {ifd, POLLIN, 0};
        poll(&p, 1, (int)left);
        char ev[4096];
        while (read(ifd, ev, sizeof(ev)) > 0)
            ;
    }
    close(ifd);
}

/* Initialises a project in `dir` against `d` with remote path `rpath`. */
static void init_project(const char *dir, const struct gs_test_sshd *d, int port, const char *rpath)
{
    char target[128];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", port ? port : d->port);
    assert_int_equal(sh("mkdir -p '%s' '%s'", dir, rpath), 0);
    struct child c = run_in(dir, ARGS("init", "--accept-new-host-key", target, "--path", rpath));
    expect_status(&c, 0, "init");
    child_release(&c);
}

/* ---- group ---- */

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&srv) != 0)
        return -1;
    snprintf(project, sizeof(project), "%s/work/proj", srv.dir);
    snprintf(remote, sizeof(remote), "%s/remote proj", srv.dir);
    if (sh("mkdir -p '%s' && echo 'print(1)' > '%s/train.py'", project, project) != 0)
        return -1;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", srv.port);
    struct child c = run_in(project, ARGS("init", target, "--path", remote));
    int ok = c.status == 0;
    if (!ok)
        fprintf(stderr, "init failed (%d): %s%s\n", c.status, c.out.data, c.err.data);
    child_release(&c);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&srv);
    return 0;
}

static int use_home(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&srv, 1);
    return 0;
}

/* Stops a watch daemon a test started, also when the test failed half-way (a daemon left
 * behind would carry the next tests' runs). */
static int stop_watch(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("watch", "--stop"));
    child_release(&c);
    return 0;
}

/* ---- the bundled trainer ---- */

static void test_run__trainer_on_two_cpu_ranks_succeeds_with_logs_and_status(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "2", "train", "--", "--epochs", "1",
                                          "--limit-train", "4000"));
    expect_status(&c, 0, "run --cpu 2 train");
    const char *id = run_id_of(&c);
    /* rank 0 only by default for the trainer: no prefixes, and rank 1 prints nothing anyway */
    assert_null(strstr(c.out.data, "[rank 1]"));
    assert_non_null(strstr(c.out.data, "2 rank(s)"));
    const char *epoch = strstr(c.out.data, "epoch   1/1 |");
    double acc = 0;
    if (!epoch || !strstr(epoch, "| test acc ") ||
        sscanf(strstr(epoch, "| test acc ") + 11, "%lf", &acc) != 1)
        fail_msg("no epoch summary with a test accuracy: %s", c.out.data);
    assert_true(acc > 0.3); /* well above chance (0.1) after one epoch on 4000 images */
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "succeeded");
    assert_int_equal(int_at(st, "exit_code"), 0);
    assert_int_equal(int_at(st, "restarts"), 0);
    assert_true(str_at(st, "end")[0] != '\0');
    json_t *ranks = json_object_get(st, "ranks");
    assert_int_equal(json_array_size(ranks), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(ranks, i);
        assert_int_equal(int_at(r, "rank"), (long long)i);
        assert_int_equal(int_at(r, "exit_code"), 0);
        assert_false(group_exists(int_at(r, "pgid")));
    }
    json_t *meta = gs_test_run_json(remote, id, "meta.json");
    assert_int_equal(int_at(meta, "nproc"), 2);
    assert_true(json_is_null(json_object_get(meta, "gpus")));
    /* what was printed is rank 0's log, and the local copy is the same bytes */
    char *log0 = gs_test_rank_log(remote, id, 0), *local0 = gs_test_rank_log(project, id, 0);
    assert_true(strlen(log0) > 0);
    assert_string_equal(log0, c.out.data);
    assert_string_equal(local0, log0);
    free(log0);
    free(local0);
    json_decref(meta);
    json_decref(st);
    /* ps --json lists it as it ended */
    struct child ps = run_in(project, ARGS("ps", "--json"));
    expect_status(&ps, 0, "ps --json");
    json_t *j = json_loads(ps.out.data, 0, NULL);
    assert_non_null(j);
    json_t *runs = json_object_get(j, "runs"), *e;
    size_t i;
    int found = 0;
    json_array_foreach(runs, i, e)
    {
        if (strcmp(str_at(e, "id"), id) != 0)
            continue;
        found = 1;
        assert_string_equal(str_at(e, "state"), "succeeded");
        assert_int_equal(int_at(e, "exit_code"), 0);
    }
    assert_true(found);
    json_decref(j);
    child_release(&ps);
    child_release(&c);
}

/* ---- exit codes, fail-fast, restarts ---- */

static void test_run__command_exit_code_is_the_runs(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "1", "--", "sh", "-c", "exit 3"));
    expect_status(&c, 3, "a command that exits 3");
    json_t *st = gs_test_run_json(remote, run_id_of(&c), "status.json");
    assert_string_equal(str_at(st, "state"), "failed");
    assert_int_equal(int_at(st, "exit_code"), 3);
    json_decref(st);
    child_release(&c);
}

/* A command that cannot start ends the run with the shell's code (127 not found, 126 not
 * executable), which `run` exits with, followed or detached, as `exec` would and as ps records,
 * rather than with the generic remote error (5). */
static void test_run__a_command_that_cannot_start_exits_as_the_run_records(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "1", "--", "no-such-command-xyz"));
    expect_status(&c, 127, "a command that does not exist");
    child_release(&c);
    c = run_in(project, ARGS("run", "--cpu", "1", "--detach", "--", "/etc/passwd"));
    expect_status(&c, 126, "a detached run of a file that is not executable");
    child_release(&c);
    c = run_in(project, ARGS("ps", "--json"));
    json_t *ps = json_loads(c.out.data ? c.out.data : "", 0, NULL);
    json_t *runs = json_object_get(ps, "runs");
    assert_string_equal(str_at(json_array_get(runs, 0), "state"), "failed");
    assert_int_equal(int_at(json_array_get(runs, 0), "exit_code"), 126);
    assert_int_equal(int_at(json_array_get(runs, 1), "exit_code"), 127);
    json_decref(ps);
    child_release(&c);
}

/* `run` launches through whichever agent build is cached, without a probe first. On a server
 * without this build (a new binary here, no source to build from) the launch finds none,
 * installs it and launches once: one run, with its logs and exit code. */
static void test_run__a_server_without_the_agent_gets_it_and_runs_once(void **state)
{
    (void)state;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/..", project);
    assert_int_equal(gs_test_fresh_agent_begin(dir), 0);
    struct child c = run_in(
        project, ARGS("run", "--no-sync", "--cpu", "1", "--", "sh", "-c", "echo ran once; exit 4"));
    gs_test_fresh_agent_end(dir);
    expect_status(&c, 4, "a run through a freshly installed agent");
    assert_string_equal(c.out.data, "ran once\n");
    json_t *st = gs_test_run_json(remote, run_id_of(&c), "status.json");
    assert_int_equal(int_at(st, "exit_code"), 4);
    json_decref(st);
    child_release(&c);
}

/* status --json of the project's watch daemon. */
static json_t *daemon_status(void)
{
    struct child c = run_in(project, ARGS("status", "--json"));
    expect_status(&c, 0, "status --json");
    json_t *st = json_loads(c.out.data, 0, NULL);
    child_release(&c);
    assert_non_null(st);
    return st;
}

/* Starts `watch -d` in the project and waits until its spare connection is ready. Returns the
 * daemon's count of relayed commands. */
static long watch_with_spare(void)
{
    struct child w = run_in(project, ARGS("watch", "-d"));
    expect_status(&w, 0, "watch -d");
    child_release(&w);
    int64_t end = gs_clock_mono_ms() + 30000;
    json_t *st = daemon_status();
    while (!json_is_true(json_object_get(st, "spare_ready"))) {
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon's spare connection never became ready");
        json_decref(st);
        usleep(100000); /* polling an observable condition, with a deadline */
        st = daemon_status();
    }
    long relayed = (long)json_integer_value(json_object_get(st, "relayed"));
    json_decref(st);
    return relayed;
}

/* With `gpusync watch` running, a run goes through the daemon's spare connection (relay.h):
 * the same logs, the same exit code, and the daemon counts the command it relayed. */
static void test_run__with_watch_running_goes_through_the_daemon(void **state)
{
    (void)state;
    long before = watch_with_spare();
    /* Rank 0 fails only after rank 1 has printed: a failing rank stops the others at once. */
    struct child c =
        run_in(project,
               ARGS("run", "--no-sync", "--cpu", "2", "--", "sh", "-c",
                    "echo \"rank $RANK of $WORLD_SIZE\"; if [ $RANK = 1 ]; then touch r1; exit 0; "
                    "fi; while [ ! -e r1 ]; do sleep 0.01; done; rm r1; exit 5"));
    expect_status(&c, 5, "a run through the watch daemon");
    assert_non_null(strstr(c.out.data, "[rank 0] rank 0 of 2\n"));
    assert_non_null(strstr(c.out.data, "[rank 1] rank 1 of 2\n"));
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    json_t *run = gs_test_run_json(remote, id, "status.json");
    assert_int_equal(int_at(run, "exit_code"), 5);
    json_decref(run);
    child_release(&c);
    /* logs, ps and stop go through the daemon too */
    struct child l = run_in(project, ARGS("logs", id, "--rank", "1"));
    expect_status(&l, 0, "logs through the watch daemon");
    assert_string_equal(l.out.data, "rank 1 of 2\n");
    child_release(&l);
    struct child p = run_in(project, ARGS("ps", "--json"));
    expect_status(&p, 0, "ps through the watch daemon");
    assert_non_null(strstr(p.out.data, id));
    child_release(&p);
    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop of a finished run through the watch daemon");
    child_release(&s);
    json_t *st = daemon_status();
    long after = (long)json_integer_value(json_object_get(st, "relayed"));
    json_decref(st);
    struct child stop = run_in(project, ARGS("watch", "--stop"));
    child_release(&stop);
    if (after < before + 5) /* launch; logs: ps and tail; ps; stop: ps and stop */
        fail_msg("not everything went through the daemon (relayed %ld -> %ld)", before, after);
}

/* The spare connection died with the server (sshd restarted, its connections killed): the run
 * still starts, once, over a new connection, and the daemon carries on. */
static void test_run__through_the_daemon_after_the_server_restarted(void **state)
{
    (void)state;
    long before = watch_with_spare();
    assert_int_equal(gs_test_sshd_restart(&srv, 0), 0);
    /* The daemon notices its own connection died and reconnects; its spare stays dead until a
     * request finds it so. */
    int64_t end = gs_clock_mono_ms() + 60000;
    for (;;) {
        json_t *st = daemon_status();
        int back = json_is_true(json_object_get(st, "connected")) &&
                   json_integer_value(json_object_get(st, "pending")) == 0 &&
                   strcmp(json_string_value(json_object_get(st, "state")), "up_to_date") == 0;
        json_decref(st);
        if (back)
            break;
        if (gs_clock_mono_ms() > end)
            fail_msg("the daemon did not reconnect after the restart");
        usleep(100000); /* polling an observable condition, with a deadline */
    }
    struct child c = run_in(project, ARGS("run", "--no-sync", "--cpu", "1", "--", "sh", "-c",
                                          "echo after the restart; exit 6"));
    expect_status(&c, 6, "a run after the spare connection died");
    assert_string_equal(c.out.data, "after the restart\n");
    child_release(&c);
    json_t *st = daemon_status();
    long after = (long)json_integer_value(json_object_get(st, "relayed"));
    json_decref(st);
    if (after < before + 1)
        fail_msg("the run did not go through the daemon (relayed %ld -> %ld)", before, after);
    struct child stop = run_in(project, ARGS("watch", "--stop"));
    expect_status(&stop, 0, "watch --stop");
    child_release(&stop);
}

static void test_run__one_rank_crashing_stops_the_others(void **state)
{
    (void)state;
    int64_t t0 = gs_clock_mono_ms();
    struct child c = run_in(project, ARGS("run", "--cpu", "3", "--", "sh", "-c",
                                          "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 7; fi; "
                                          "exec sleep 120"));
    int64_t took = gs_clock_mono_ms() - t0;
    expect_status(&c, 7, "one rank exits 7");
    assert_true(took < 60000); /* the others did not run their 120 s */
    json_t *st = gs_test_run_json(remote, run_id_of(&c), "status.json");
    assert_string_equal(str_at(st, "state"), "failed");
    assert_int_equal(int_at(st, "exit_code"), 7);
    json_t *ranks = json_object_get(st, "ranks");
    assert_int_equal(json_array_size(ranks), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *r = json_array_get(ranks, i);
        if (i == 1)
            assert_int_equal(int_at(r, "exit_code"), 7);
        else
            assert_int_equal(int_at(r, "signal"), SIGTERM);
        assert_false(group_exists(int_at(r, "pgid")));
    }
    json_decref(st);
    child_release(&c);
}

/* The last line of a --json run's stdout, as JSON (the "ended" object after the plain log). */
static json_t *ended_json(const struct child *c)
{
    const char *out = c->out.data ? c->out.data : "";
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '\n')
        n--;
    const char *line = out + n;
    while (line > out && line[-1] != '\n')
        line--;
    json_t *j = json_loadb(line, (size_t)(out + n - line), 0, NULL);
    if (!json_is_object(j) || strcmp(str_at(j, "event"), "ended") != 0)
        fail_msg("no ended object at the end of stdout: %s", out);
    return j;
}

/* How a run ended is said once at its end: which rank failed and how, its last lines, the ranks
 * stopped because of it, restarts and duration (and the same as an "ended" object with --json). */
static void test_run__a_failure_is_summed_up_naming_the_rank(void **state)
{
    (void)state;
    struct child c =
        run_in(project, ARGS("run", "--json", "--cpu", "3", "--ranks", "0", "--", "sh", "-c",
                             "if [ \"$RANK\" = 1 ]; then echo loading shard 1; "
                             "printf 'epoch 1\\repoch 2\\n\\377bad\\n'; "
                             "echo about to die; kill -9 $$; fi; exec sleep 120"));
    expect_status(&c, 128 + SIGKILL, "a rank killed by SIGKILL");
    json_t *e = ended_json(&c);
    assert_string_equal(str_at(e, "state"), "failed");
    assert_int_equal(int_at(e, "exit_code"), 128 + SIGKILL);
    json_t *failed = json_object_get(e, "failed");
    assert_int_equal(int_at(failed, "rank"), 1);
    assert_int_equal(int_at(failed, "signal"), SIGKILL);
    assert_false(json_is_true(json_object_get(failed, "oom")));
    /* rank 1's lines were not followed (--ranks 0): the summary brings its last ones, as a
     * terminal shows them (a progress line's last state), and readable as JSON (a byte that is
     * not UTF-8 becomes '?') */
    json_t *lines = json_object_get(failed, "last_lines");
    assert_int_equal(json_array_size(lines), 4);
    assert_string_equal(json_string_value(json_array_get(lines, 1)), "epoch 2");
    assert_string_equal(json_string_value(json_array_get(lines, 2)), "?bad");
    assert_string_equal(json_string_value(json_array_get(lines, 3)), "about to die");
    json_t *stopped = json_object_get(e, "stopped_ranks");
    assert_int_equal(json_array_size(stopped), 2);
    assert_int_equal(json_integer_value(json_array_get(stopped, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(stopped, 1)), 2);
    assert_int_equal(int_at(e, "restarts"), 0);
    assert_true(int_at(e, "duration_ms") >= 0);
    json_decref(e);
    child_release(&c);

    c = run_in(project, ARGS("run", "--json", "--cpu", "1", "--", "true"));
    expect_status(&c, 0, "a run that succeeds");
    e = ended_json(&c);
    assert_string_equal(str_at(e, "state"), "succeeded");
    assert_true(json_is_null(json_object_get(e, "failed")));
    assert_int_equal(json_array_size(json_object_get(e, "stopped_ranks")), 0);
    json_decref(e);
    child_release(&c);
}

static void test_run__max_restarts_two_restarts_twice_then_fails(void **state)
{
    (void)state;
    struct child c =
        run_in(project, ARGS("run", "--cpu", "1", "--max-restarts", "2", "--", "sh", "-c",
                             "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 5"));
    expect_status(&c, 5, "a command that always fails, 2 restarts");
    const char *id = run_id_of(&c);
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "failed");
    assert_int_equal(int_at(st, "restarts"), 2);
    char *log = gs_test_rank_log(remote, id, 0);
    assert_int_equal(count(log, "attempt "), 3);
    assert_non_null(strstr(log, "attempt 0\n=== restart 1 ===\nattempt 1\n=== restart 2 ===\n"
                                "attempt 2\n"));
    assert_int_equal(count(c.out.data, "attempt "), 3);
    free(log);
    json_decref(st);
    child_release(&c);
}

/* ---- the environment contract ---- */

static void check_env_line(const char *log, int rank, int local, int world, int local_world,
                           int group, const char *addr, int *port)
{
    const char *p = strstr(log, "ENV ");
    if (!p)
        fail_msg("rank %d printed no environment: %s", rank, log);
    int r, lr, ws, lws, gr, mp, omp;
    char ma[64], cvd[64];
    if (sscanf(p,
               "ENV RANK=%d LOCAL_RANK=%d WORLD_SIZE=%d LOCAL_WORLD_SIZE=%d GROUP_RANK=%d "
               "MASTER_ADDR=%63s MASTER_PORT=%d OMP=%d CVD=%63s",
               &r, &lr, &ws, &lws, &gr, ma, &mp, &omp, cvd) != 9)
        fail_msg("rank %d: cannot parse '%s'", rank, p);
    assert_int_equal(r, rank);
    assert_int_equal(lr, local);
    assert_int_equal(ws, world);
    assert_int_equal(lws, local_world);
    assert_int_equal(gr, group);
    assert_string_equal(ma, addr);
    assert_int_equal(omp, 1);
    assert_string_equal(cvd, "[]"); /* CPU ranks see no GPU: set, and empty */
    assert_true(mp > 0 && mp < 65536);
    if (*port == 0)
        *port = mp;
    assert_int_equal(mp, *port); /* every rank sees the same MASTER_PORT */
}

#define ENV_SCRIPT                                                                                 \
    "echo \"ENV RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "                         \
    "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR "          \
    "MASTER_PORT=$MASTER_PORT OMP=$OMP_NUM_THREADS CVD=[${CUDA_VISIBLE_DEVICES-unset}]\""

static void test_run__environment_contract_rank_by_rank(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "3", "--", "sh", "-c", ENV_SCRIPT));
    expect_status(&c, 0, "env run");
    const char *id = run_id_of(&c);
    json_t *st = gs_test_run_json(remote, id, "status.json");
    int port = (int)int_at(st, "master_port");
    for (int rank = 0; rank < 3; rank++) {
        char *log = gs_test_rank_log(remote, id, rank), prefix[32];
        check_env_line(log, rank, rank, 3, 3, 0, "127.0.0.1", &port);
        /* all ranks' logs are shown by default for a command, each line prefixed */
        snprintf(prefix, sizeof(prefix), "[rank %d] ENV RANK=%d ", rank, rank);
        assert_non_null(strstr(c.out.data, prefix));
        free(log);
    }
    json_decref(st);
    child_release(&c);
}

static void test_run__a_jobs_gpus_from_the_config_are_used(void **state)
{
    (void)state;
    /* a GPU list is taken as given (no nvidia-smi needed), so this runs on a GPU-less server */
    assert_int_equal(sh("cd '%s' && cp .gpusync/config config.saved && printf '\\n[job "
                        "\"envjob\"]\\ncommand = %s\\ngpus = 0,2\\n' >> .gpusync/config",
                        project, "echo CVD=$CUDA_VISIBLE_DEVICES WS=$WORLD_SIZE"),
                     0);
    struct child c = run_in(project, ARGS("run", "envjob"));
    sh("cd '%s' && mv config.saved .gpusync/config", project);
    expect_status(&c, 0, "run of a [job] with gpus = 0,2");
    assert_int_equal(count(c.out.data, "CVD=0,2 WS=2\n"), 2);
    json_t *meta = gs_test_run_json(remote, run_id_of(&c), "meta.json");
    assert_int_equal(int_at(meta, "nproc"), 2);
    json_decref(meta);
    child_release(&c);
}

/* ---- checked before the sync (issue 13, point 9) ---- */

/* Appends `text` to the project's config, keeping a copy to put back with restore_config. */
static void add_to_config(const char *text)
{
    assert_int_equal(sh("cd '%s' && cp .gpusync/config config.saved && printf '%%s' '%s' >> "
                        ".gpusync/config",
                        project, text),
                     0);
}

static void restore_config(void)
{
    sh("cd '%s' && mv config.saved .gpusync/config", project);
}

/* 1 when the remote project holds `name` (the server is this machine). */
static int remote_has(const char *name)
{
    char path[1200];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", remote, name);
    return stat(path, &sb) == 0;
}

/* A run the server cannot do, or a config that cannot say what to run, is refused before a byte
 * is synced: the new local file never reaches the server. */
static void test_run__a_request_that_cannot_run_is_refused_before_the_sync(void **state)
{
    (void)state;
    assert_int_equal(sh("cd '%s' && echo unsent > unsent.txt", project), 0);
    /* no GPUs at all: refused on the command line, without connecting */
    struct child c = run_in(project, ARGS("run", "--gpus", "0", "--", "true"));
    expect_status(&c, 2, "run --gpus 0");
    child_release(&c);
    c = run_in(project, ARGS("run", "--gpus", "cpu=3", "--", "true"));
    expect_status(&c, 2, "run --gpus cpu=3");
    child_release(&c);
    /* more GPUs than the server has (none here, or fewer than 1000): it asks the server first */
    c = run_in(project, ARGS("run", "--gpus", "1000", "--", "true"));
    expect_status(&c, 2, "run --gpus 1000");
    child_release(&c);
    /* logs of a rank the run will not have: shown nothing, as if that rank were silent */
    c = run_in(project, ARGS("run", "--cpu", "2", "--ranks", "3", "--", "true"));
    expect_status(&c, 2, "run --cpu 2 --ranks 3");
    child_release(&c);
    /* a job's gpus written as the editors' cpu=3 */
    add_to_config("\n[job \"cpujob\"]\ncommand = true\ngpus = cpu=3\n");
    c = run_in(project, ARGS("run", "cpujob"));
    restore_config();
    expect_status(&c, 3, "a job with gpus = cpu=3");
    child_release(&c);
    /* an empty command, which ran sh -c '' and succeeded */
    add_to_config("\n[job \"empty\"]\ncommand =\n");
    c = run_in(project, ARGS("run", "empty"));
    restore_config();
    expect_status(&c, 3, "a job with an empty command");
    child_release(&c);
    /* a job with only settings (only [job "train"] may leave the command to the trainer) */
    add_to_config("\n[job \"nocmd\"]\ncpu = 2\n");
    c = run_in(project, ARGS("run", "nocmd"));
    restore_config();
    expect_status(&c, 3, "a job without a command");
    child_release(&c);
    assert_false(remote_has("unsent.txt"));
    assert_int_equal(sh("rm -f '%s/unsent.txt'", project), 0);
}

/* One limit on ranks per node, on both sides: 300 ranks run and report their exit (the client
 * once allowed 256 and exited 5 on a run that succeeded); more than the limit is refused before
 * anything is launched. */
static void test_run__hundreds_of_cpu_ranks_run_and_too_many_are_refused_first(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "300", "--", "sh", "-c",
                                          "[ \"$WORLD_SIZE\" = 300 ] && echo rank-$RANK"));
    expect_status(&c, 0, "run --cpu 300");
    assert_non_null(strstr(c.out.data, "rank-299"));
    child_release(&c);
    c = run_in(project, ARGS("run", "--cpu", "4097", "--", "true"));
    expect_status(&c, 2, "run --cpu 4097");
    child_release(&c);
}

/* [job] cpu = N runs N CPU ranks (it was an unknown key). */
static void test_run__a_job_can_ask_for_cpu_ranks(void **state)
{
    (void)state;
    add_to_config("\n[job \"cpuranks\"]\ncommand = echo WS=$WORLD_SIZE "
                  "CVD=[${CUDA_VISIBLE_DEVICES-unset}]\ncpu = 3\n");
    struct child c = run_in(project, ARGS("run", "cpuranks"));
    restore_config();
    expect_status(&c, 0, "run of a [job] with cpu = 3");
    assert_int_equal(count(c.out.data, "WS=3 CVD=[]\n"), 3);
    json_t *meta = gs_test_run_json(remote, run_id_of(&c), "meta.json");
    assert_int_equal(int_at(meta, "nproc"), 3);
    assert_true(json_is_null(json_object_get(meta, "gpus")));
    json_decref(meta);
    child_release(&c);
}

/* ---- waits that say what they wait for (point 13) ---- */

/* 1 while the child runs (it has not exited yet). */
static int child_running(const struct child *c)
{
    int st;
    return waitpid(c->pid, &st, WNOHANG) == 0;
}

/* A progress bar redrawn with \r and no newline (what tqdm draws) shows as it is drawn: `run`
 * printed a line only once its newline came, so the whole bar arrived at the end of an epoch. */
static void test_run__a_progress_bar_without_newlines_shows_as_drawn(void **state)
{
    (void)state;
    struct child c;
    child_start(&c, project,
                ARGS("run", "--cpu", "1", "--", "sh", "-c",
                     "printf 'epoch 1\\n\\r10%%|#'; sleep 30; printf '\\r100%%\\n'"));
    child_wait_in(&c, 0, "\r10%|#", 15000); /* fails the test if it does not come */
    assert_true(child_running(&c));         /* shown while the rank still draws */
    kill(c.pid, SIGINT);                    /* detaches; the rank is stopped below */
    child_finish(&c);
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    struct child s;
    child_start(&s, project, ARGS("stop", id));
    child_finish(&s);
    child_release(&s);
}

/* A Python rank's print() reaches the log as it prints, not when 8 KB piled up or the process
 * ended: a rank's stdout is a file, and the launcher sets PYTHONUNBUFFERED unless the user did. */
static void test_run__a_python_ranks_prints_stream_as_they_come(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "1", "--", "python3", "-c",
                                          "import time\nprint('epoch 1 done')\ntime.sleep(300)\n"));
    expect_status(&c, 0, "run --detach of a Python rank that prints once, then works");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "epoch 1 done\n");
    struct child s;
    child_start(&s, project, ARGS("stop", id));
    child_finish(&s);
    expect_status(&s, 0, "stop of the Python rank");
    child_release(&s);
}

/* 1 when process `pid` is a zombie (exited, not yet reaped). */
static int is_zombie(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

/* Two ranks that fail at the same moment each exited with their own status: neither is one that
 * the stop after the first failure stopped. The supervisor is held (SIGSTOP) while both exit, so
 * that it finds two dead ranks at once; it marked the second "stopped" (stopped: true, "rank 0
 * was stopped") though it exited 70 by itself before any signal. */
static void test_run__ranks_failing_together_are_not_reported_stopped(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "2", "--", "sh", "-c",
                                          "echo up; while [ ! -e go ]; do sleep 0.05; done; "
                                          "exit $((70 + RANK))"));
    expect_status(&c, 0, "run --detach of two ranks that fail together");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    await_remote_log(id, 1, "up\n");
    json_t *st = gs_test_run_json(remote, id, "status.json");
    long sup = (long)int_at(st, "supervisor_pid");
    long pids[2];
    for (int i = 0; i < 2; i++)
        pids[i] = (long)int_at(json_array_get(json_object_get(st, "ranks"), (size_t)i), "pid");
    json_decref(st);
    assert_true(sup > 1);
    assert_int_equal(kill((pid_t)sup, SIGSTOP), 0);
    assert_int_equal(sh("touch '%s/go'", remote), 0);
    int64_t end = gs_clock_mono_ms() + 20000;
    while (!(is_zombie(pids[0]) && is_zombie(pids[1]))) {
        if (gs_clock_mono_ms() > end) {
            kill((pid_t)sup, SIGCONT);
            fail_msg("the ranks did not both exit within 20 s");
        }
        usleep(20000); /* polling an observable state, with a deadline */
    }
    assert_int_equal(kill((pid_t)sup, SIGCONT), 0);
    struct child w;
    child_start(&w, project, ARGS("logs", "-f", id));
    child_finish(&w);
    child_release(&w);
    sh("rm -f '%s/go'", remote);
    st = gs_test_run_json(remote, id, "status.json");
    for (int i = 0; i < 2; i++) {
        json_t *r = json_array_get(json_object_get(st, "ranks"), (size_t)i);
        assert_int_equal(int_at(r, "exit_code"), 70 + i);
        if (json_is_true(json_object_get(r, "stopped")))
            fail_msg("rank %d exited %d by itself, and is reported stopped", i, 70 + i);
    }
    json_decref(st);
}

/* The state `ps --json` gives run ID (malloc'd), or NULL when ps does not list it. */
static char *ps_state_of(const char *id)
{
    struct child p;
    child_start(&p, project, ARGS("ps", "--json"));
    child_finish(&p);
    json_t *j = json_loads(p.out.data ? p.out.data : "", 0, NULL), *e;
    size_t i;
    char *state = NULL;
    json_array_foreach(json_object_get(j, "runs"), i, e)
    {
        const char *eid = json_string_value(json_object_get(e, "id"));
        if (eid && !strcmp(eid, id) && !state)
            state = strdup(str_at(e, "state"));
    }
    json_decref(j);
    child_release(&p);
    return state;
}

/* Starts a detached one-rank run that prints "up" and sleeps; puts its id in id and returns its
 * rank's pid once it is up. */
static long start_sleeper(char *id, size_t cap)
{
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "1", "--", "sh", "-c",
                                          "echo up; exec sleep 300"));
    expect_status(&c, 0, "run --detach");
    snprintf(id, cap, "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    json_t *st = gs_test_run_json(remote, id, "status.json");
    long rank_pid = (long)int_at(json_array_get(json_object_get(st, "ranks"), 0), "pid");
    json_decref(st);
    return rank_pid;
}

/* Polls ps until it lists run ID as `state` (any state when NULL), failing after 15 s. */
static void await_ps_state(const char *id, const char *state, const char *after)
{
    int64_t end = gs_clock_mono_ms() + 15000;
    char *got;
    while (!(got = ps_state_of(id)) || (state && strcmp(got, state) != 0)) {
        if (gs_clock_mono_ms() > end)
            fail_msg("ps said %s for run %s 15 s after %s", got ? got : "nothing", id, after);
        free(got);
        usleep(200000); /* polling an observable result, with a deadline */
    }
    free(got);
}

/* A running run's folder removed on the server (.gpusync/runs/ID, as an `rm -rf` of old runs or of
 * the project does): its ranks ran on, holding their GPUs, while `ps` said "no runs" and `stop ID`
 * "no run". The supervisor makes the folder again: ps lists the run, and stop ends it. */
static void test_run__a_run_whose_folder_was_removed_can_still_be_seen_and_stopped(void **state)
{
    (void)state;
    char id[128];
    long rank_pid = start_sleeper(id, sizeof(id));
    assert_int_equal(sh("rm -rf '%s/.gpusync/runs/%s'", remote, id), 0);
    await_ps_state(id, NULL, "its folder's removal");
    struct child s;
    child_start(&s, project, ARGS("stop", id));
    child_finish(&s);
    expect_status(&s, 0, "stop of the run whose folder was removed");
    child_release(&s);
    gs_test_await_gone((pid_t)rank_pid);
}

/* A running run's status.json damaged on the server (a hand edit, a full disk's truncation, a
 * sync tool): ps left the run out and stop could not read it while its rank held on. The
 * supervisor writes it again, so ps lists it running and stop ends it; once the run has ended,
 * a damaged status.json is listed as "damaged", not left out. */
static void test_run__a_damaged_status_json_is_written_again_or_listed_damaged(void **state)
{
    (void)state;
    char id[128], *ps_state;
    long rank_pid = start_sleeper(id, sizeof(id));
    const char *damage = "printf '{\"id\": \"%s\", \"sta' > '%s/.gpusync/runs/%s/status.json'";
    assert_int_equal(sh(damage, id, remote, id), 0);
    await_ps_state(id, "running", "its status.json was damaged");
    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop of the run whose status.json was damaged");
    child_release(&s);
    gs_test_await_gone((pid_t)rank_pid);
    assert_int_equal(sh(damage, id, remote, id), 0);
    ps_state = ps_state_of(id);
    assert_non_null(ps_state);
    assert_string_equal(ps_state, "damaged");
    free(ps_state);
}

/* Column `col` of run ID in `ps`'s table (malloc'd), or NULL when it is not listed. */
static char *ps_column_of(const char *id, int col)
{
    struct child p = run_in(project, ARGS("ps"));
    char *value = NULL;
    for (char *line = p.out.data; line && *line && !value; line = strchr(line, '\n')) {
        line += *line == '\n';
        char cols[9][64];
        /* RUN NAME STATE NODES RANKS GPUS STARTED DURATION EXIT: none has a space */
        if (sscanf(line, "%63s %63s %63s %63s %63s %63s %63s %63s %63s", cols[0], cols[1], cols[2],
                   cols[3], cols[4], cols[5], cols[6], cols[7], cols[8]) == 9 &&
            !strcmp(cols[0], id))
            value = strdup(cols[col]);
    }
    child_release(&p);
    return value;
}

/* The DURATION column of run ID in `ps`'s table (malloc'd), or NULL when it is not listed. */
static char *ps_duration_of(const char *id)
{
    return ps_column_of(id, 7);
}

/* A run whose supervisor was killed (kill -9, an OOM kill) is "lost": it has no end, so no
 * duration; ps printed "-0s" for it (-1 ms). */
static void test_ps__a_lost_run_has_no_duration(void **state)
{
    (void)state;
    char id[128];
    long rank_pid = start_sleeper(id, sizeof(id));
    json_t *st = gs_test_run_json(remote, id, "status.json");
    long sup = (long)int_at(st, "supervisor_pid");
    json_decref(st);
    assert_true(sup > 1);
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    await_ps_state(id, "lost", "its supervisor was killed");
    char *dur = ps_duration_of(id);
    assert_non_null(dur);
    assert_string_equal(dur, "-");
    free(dur);
    kill((pid_t)rank_pid, SIGKILL); /* nobody else will: its supervisor is gone */
    gs_test_await_gone((pid_t)rank_pid);
}

/* 1 or 0 as `ps --json` gives "paused" for rank `rank` of run ID, -1 when it lists no such rank
 * or lacks the field; the run's JSON state goes to `state` (cap bytes). */
static int ps_rank_paused(const char *id, int rank, char *state, size_t cap)
{
    struct child p = run_in(project, ARGS("ps", "--json"));
    expect_status(&p, 0, "ps --json");
    json_t *j = json_loads(p.out.data, 0, NULL), *run, *r;
    size_t i, k;
    int paused = -1;
    snprintf(state, cap, "(not listed)");
    json_array_foreach(json_object_get(j, "runs"), i, run)
    {
        if (strcmp(str_at(run, "id"), id) != 0)
            continue;
        snprintf(state, cap, "%s", str_at(run, "state"));
        json_array_foreach(json_object_get(run, "ranks"), k, r)
        {
            json_t *v = json_object_get(r, "paused");
            if (int_at(r, "rank") == rank && json_is_boolean(v))
                paused = json_is_true(v);
        }
    }
    json_decref(j);
    child_release(&p);
    return paused;
}

/* Polls `ps --json` until rank `rank` of run ID reads paused (1) or not (0), failing after 15 s;
 * its state must stay "running" throughout (the contract's states are unchanged); then the
 * table's STATE must read `table_state`. */
static void await_rank_paused(const char *id, int rank, int paused, const char *table_state,
                              const char *after)
{
    int64_t end = gs_clock_mono_ms() + 15000;
    char state[64];
    int got;
    while ((got = ps_rank_paused(id, rank, state, sizeof(state))) != paused) {
        if (strcmp(state, "running") != 0)
            fail_msg("ps --json said %s for run %s after %s", state, id, after);
        if (gs_clock_mono_ms() > end) {
            char *shown = ps_column_of(id, 2);
            fail_msg("ps --json said paused %d (-1: no such field) for rank %d of run %s 15 s "
                     "after %s; the table's STATE: %s",
                     got, rank, id, after, shown ? shown : "(not listed)");
        }
        usleep(200000); /* polling an observable result, with a deadline */
    }
    assert_string_equal(state, "running");
    char *shown = ps_column_of(id, 2);
    assert_non_null(shown);
    if (strcmp(shown, table_state) != 0)
        fail_msg("ps's STATE for run %s is '%s' after %s, not '%s'", id, shown, after, table_state);
    free(shown);
}

/* A rank stopped by a signal (kill -STOP, a debugger) makes no progress, yet ps said its run was
 * running as ever. ps --json now marks the rank "paused" (state stays "running") and the table
 * says "paused"; once continued (SIGCONT) both read running again. */
/* start_sleeper, its rank then stopped (SIGSTOP) and seen paused by ps. */
static long start_paused_sleeper(char *id, size_t cap)
{
    long rank_pid = start_sleeper(id, cap);
    assert_int_equal(kill((pid_t)rank_pid, SIGSTOP), 0);
    await_rank_paused(id, 0, 1, "paused", "SIGSTOP to its rank");
    return rank_pid;
}

static void test_ps__a_rank_stopped_by_a_signal_reads_paused_until_continued(void **state)
{
    (void)state;
    char id[128];
    long rank_pid = start_paused_sleeper(id, sizeof(id));
    assert_int_equal(kill((pid_t)rank_pid, SIGCONT), 0);
    await_rank_paused(id, 0, 0, "running", "SIGCONT to its rank");
    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop of the continued run");
    child_release(&s);
    gs_test_await_gone((pid_t)rank_pid);
}

/* A paused rank is stopped by SIGTERM, not by the SIGKILL after the 10 s grace: a stopped process
 * keeps SIGTERM pending until continued, so stop used to wait out the grace period and kill it,
 * its handler never run. */
static void test_stop__a_paused_rank_gets_sigterm_not_sigkill(void **state)
{
    (void)state;
    char id[128];
    long rank_pid = start_paused_sleeper(id, sizeof(id));
    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop of the paused run");
    child_release(&s);
    gs_test_await_gone((pid_t)rank_pid);
    json_t *st = gs_test_run_json(remote, id, "status.json");
    json_t *rank = json_array_get(json_object_get(st, "ranks"), 0);
    assert_int_equal(int_at(rank, "signal"), SIGTERM);
    assert_int_equal(int_at(st, "killed_count"), 0);
    json_decref(st);
}

/* One rank of two stopped (SIGTSTP, as a terminal's Ctrl-Z sends) is told apart from the run:
 * that rank alone reads paused, the table "paused:1/2"; a run whose ranks are all stopped reads
 * "paused". */
static void test_ps__one_paused_rank_of_two_is_told_apart(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "2", "--", "sh", "-c",
                                          "echo up; exec sleep 300"));
    expect_status(&c, 0, "run --detach of two ranks");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    await_remote_log(id, 1, "up\n");
    json_t *st = gs_test_run_json(remote, id, "status.json");
    json_t *ranks = json_object_get(st, "ranks");
    long pid[2] = {(long)int_at(json_array_get(ranks, 0), "pid"),
                   (long)int_at(json_array_get(ranks, 1), "pid")};
    json_decref(st);
    assert_int_equal(kill((pid_t)pid[1], SIGTSTP), 0);
    await_rank_paused(id, 1, 1, "paused:1/2", "SIGTSTP to rank 1");
    assert_int_equal(ps_rank_paused(id, 0, (char[64]){0}, 64), 0);
    assert_int_equal(kill((pid_t)pid[0], SIGSTOP), 0);
    await_rank_paused(id, 0, 1, "paused", "SIGSTOP to rank 0 as well");
    assert_int_equal(kill((pid_t)pid[0], SIGCONT), 0);
    assert_int_equal(kill((pid_t)pid[1], SIGCONT), 0);
    await_rank_paused(id, 1, 0, "running", "SIGCONT to both ranks");
    assert_int_equal(ps_rank_paused(id, 0, (char[64]){0}, 64), 0);
    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop of the continued run");
    child_release(&s);
    gs_test_await_gone((pid_t)pid[0]);
    gs_test_await_gone((pid_t)pid[1]);
}

/* Stopping a rank that ignores SIGTERM takes the 10 s grace: after about 2 s, while it still
 * waits, stop says what for. */
static void test_stop__a_rank_ignoring_term_says_what_stop_waits_for(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "1", "--", "sh", "-c",
                                          "trap '' TERM; echo up; while :; do sleep 0.1; done"));
    expect_status(&c, 0, "run --detach of a rank ignoring SIGTERM");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    struct child s;
    int64_t t0 = gs_clock_mono_ms();
    child_start(&s, project, ARGS("stop", id));
    child_wait_in(&s, 1, "SIGKILL", 8000);
    int64_t said = gs_clock_mono_ms() - t0;
    assert_true(child_running(&s)); /* said while waiting, not at the end */
    assert_true(said >= 1000);      /* and not for a stop that is quick */
    child_finish(&s);
    expect_status(&s, 0, "stop of a rank ignoring SIGTERM");
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "stopped");
    assert_int_equal(int_at(json_array_get(json_object_get(st, "ranks"), 0), "signal"), SIGKILL);
    json_decref(st);
    child_release(&s);
}

/* A process that forks and exits again and again, half the time into a new session: each walk of
 * /proc meets it under a pid it no longer has, or not at all. It ignores SIGTERM and counts its
 * forks into `hb`. */
#define WALKER_PY                                                                                  \
    "import os, signal, sys\n"                                                                     \
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"                                              \
    "n = 0\n"                                                                                      \
    "while True:\n"                                                                                \
    "    if os.fork(): os._exit(0)\n"                                                              \
    "    if n % 2 == 0: os.setsid()\n"                                                             \
    "    n += 1\n"                                                                                 \
    "    if n % 200 == 0: open(sys.argv[1], 'w').write('%d\\n' % n)\n"

/* A process whose main thread ends (pthread_exit) while another thread runs on: state Z, alive
 * (a walk that takes Z for dead skips it). It leaves its session, ignores SIGTERM and its thread
 * counts into argv[1] every 10 ms. */
#define ZOMBIE_LEADER_C                                                                            \
    "#include <pthread.h>\n#include <signal.h>\n#include <stdio.h>\n#include <unistd.h>\n"         \
    "static const char *hb;\n"                                                                     \
    "static void *beat(void *a) { (void)a; for (long n = 1;; n++) { FILE *f = fopen(hb, \"w\");\n" \
    "  if (f) { fprintf(f, \"%ld\\n\", n); fclose(f); } usleep(10000); } return 0; }\n"            \
    "int main(int c, char **v) { (void)c; hb = v[1]; signal(SIGTERM, SIG_IGN); setsid();\n"        \
    "  pthread_t t; pthread_create(&t, 0, beat, 0); pthread_exit(0); }\n"

static long long read_number(const char *path)
{
    FILE *fp = fopen(path, "r");
    long long n = -1;
    if (fp && fscanf(fp, "%lld", &n) != 1)
        n = -1;
    if (fp)
        fclose(fp);
    return n;
}

/* stop ends what a walk of /proc misses: the run's cgroup lists them all (where there is one),
 * and a zombie whose threads live on is alive. (Both used to outlive a "stopped".) */
static void test_stop__ends_processes_a_proc_walk_misses(void **state)
{
    (void)state;
    gs_test_write_file(project, "walker.py", WALKER_PY);
    gs_test_write_file(project, "zl.c", ZOMBIE_LEADER_C);
    char hb[800], zhb[800];
    snprintf(hb, sizeof(hb), "%s/walker.hb", remote);
    snprintf(zhb, sizeof(zhb), "%s/zl.hb", remote);
    struct child c =
        run_in(project, ARGS("run", "--detach", "--cpu", "1", "--", "sh", "-c",
                             "cc -pthread -o zl zl.c && (python3 walker.py walker.hb &) && "
                             "(./zl zl.hb &) && echo up; sleep 1000"));
    expect_status(&c, 0, "run --detach of the escapers");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    int64_t end = gs_clock_mono_ms() + 10000;
    while ((read_number(hb) < 0 || read_number(zhb) < 0) && gs_clock_mono_ms() < end)
        usleep(20000); /* polling a condition with a deadline: no event to wait on here */
    struct child s = run_in(project, ARGS("stop", "--grace", "1", id));
    expect_status(&s, 0, "stop");
    child_release(&s);
    long long walked = read_number(hb), beaten = read_number(zhb);
    usleep(500 * 1000); /* a measure: each counts many times in 0.5 s while it lives */
    assert_int_equal(read_number(hb), walked);
    assert_int_equal(read_number(zhb), beaten);
}

/* Following a run that prints nothing waits on the server: its tail there uses next to no CPU
 * (it used a whole core: an empty read counted as a partial line held past its time, and every
 * wait then ended at once). */
static void test_logs__following_a_quiet_run_does_not_spin_on_the_server(void **state)
{
    (void)state;
    struct child c = run_in(
        project, ARGS("run", "--detach", "--cpu", "1", "--", "sh", "-c", "echo up; sleep 30"));
    expect_status(&c, 0, "run --detach of a quiet rank");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    struct child f;
    child_start(&f, project, ARGS("logs", "-f", id));
    child_wait_for(&f, "up", 10000);
    /* CPU ticks of the agent's tail over a 2 s window of silence (a measure, not a wait) */
    int quiet = sh("pid=$(pgrep -f 'gpusync-agent.* tail .*%s' | head -1); [ -n \"$pid\" ] || "
                   "exit 3; t0=$(awk '{print $14+$15}' /proc/$pid/stat) && sleep 2 && "
                   "t1=$(awk '{print $14+$15}' /proc/$pid/stat) && [ $((t1 - t0)) -le 20 ]",
                   id);
    kill(f.pid, SIGTERM);
    child_finish(&f);
    child_release(&f);
    struct child s = run_in(project, ARGS("stop", id));
    child_release(&s);
    assert_int_equal(quiet, 0); /* 3: no tail found; 1: it used over 10% of a core */
}

/* The trainer's first build on a server takes seconds: each step is announced before the run
 * starts (it was one line, then silence). A copy of the sources with one more file is a version
 * the server has not built; its build is removed afterwards. */
static void test_run__the_trainers_first_build_says_each_step(void **state)
{
    (void)state;
    char src[700];
    snprintf(src, sizeof(src), "%s/work/trainer-src", srv.dir);
    assert_int_equal(sh("rm -rf '%s' && cp -r '%s' '%s' && rm -rf '%s'/build* && echo %d > "
                        "'%s/.test-build' && touch '%s/before-build'",
                        src, gs_test_source_path("trainer"), src, src, (int)getpid(), src, src),
                     0);
    setenv("GPUSYNC_TRAINER_SRC", src, 1);
    struct child c = run_in(project, ARGS("run", "--no-sync", "--cpu", "1", "train", "--",
                                          "--epochs", "1", "--limit-train", "500"));
    unsetenv("GPUSYNC_TRAINER_SRC");
    sh("find ~root/.gpusync -maxdepth 1 -name 'trainer-*' -newer '%s/before-build' -exec rm -rf "
       "{} + 2>/dev/null",
       src);
    expect_status(&c, 0, "run train with a trainer never built there");
    const char *building = strstr(c.err.data, "trainer build: compiling");
    const char *started = strstr(c.err.data, "gpusync: run ");
    assert_non_null(building);
    assert_non_null(started);
    assert_true(building < started);
    assert_non_null(strstr(c.out.data, "epoch   1/1 |"));
    child_release(&c);
}

/* ---- the server's name (point 14) ---- */

/* What "run ... started: N ranks on SERVER" names, into a static buffer. */
static const char *server_named(const struct child *c)
{
    static char name[256];
    const char *p = c->err.data ? strstr(c->err.data, " started: ") : NULL;
    p = p ? strstr(p, " on ") : NULL;
    if (!p || sscanf(p, " on %255s", name) != 1)
        fail_msg("no server named on stderr: %s", c->err.data ? c->err.data : "");
    return name;
}

/* `run` names the server the same way with and without the watch daemon, also when the config
 * leaves the user to the default (it said "127.0.0.1:PORT" through the daemon and
 * "root@127.0.0.1:PORT" without). */
static void test_run__names_the_server_alike_with_and_without_the_daemon(void **state)
{
    (void)state;
    assert_int_equal(sh("cd '%s' && cp .gpusync/config config.saved && sed -i '/^[[:space:]]*user "
                        "=/d' .gpusync/config",
                        project),
                     0);
    struct child alone = run_in(project, ARGS("run", "--no-sync", "--cpu", "1", "--", "true"));
    expect_status(&alone, 0, "run without the daemon");
    char without[256];
    snprintf(without, sizeof(without), "%s", server_named(&alone));
    child_release(&alone);
    watch_with_spare();
    struct child via = run_in(project, ARGS("run", "--no-sync", "--cpu", "1", "--", "true"));
    struct child stop = run_in(project, ARGS("watch", "--stop"));
    child_release(&stop);
    restore_config();
    expect_status(&via, 0, "run through the daemon");
    assert_string_equal(server_named(&via), without);
    child_release(&via);
}

/* ---- logs in time order, and from the local copy (points 10, 11) ---- */

/* Two ranks taking turns, 50 ms apart (the server records times every 10 ms): a1 b1 a2 b2 ...
 * a4 b4; then both wait for the file `go` before they exit. */
#define TURNS_SCRIPT                                                                               \
    "i=1; while [ $i -le 4 ]; do"                                                                  \
    "  if [ $RANK = 0 ]; then"                                                                     \
    "    [ $i = 1 ] || while [ ! -e b$((i-1)) ]; do sleep 0.01; done; sleep 0.05; echo a$i;"       \
    "    touch a$i;"                                                                               \
    "  else"                                                                                       \
    "    while [ ! -e a$i ]; do sleep 0.01; done; sleep 0.05; echo b$i; touch b$i;"                \
    "  fi; i=$((i+1)); done; while [ ! -e go ]; do sleep 0.02; done"

#define TURNS_SHOWN                                                                                \
    "[rank 0] a1\n[rank 1] b1\n[rank 0] a2\n[rank 1] b2\n[rank 0] a3\n[rank 1] b3\n[rank 0] a4\n"  \
    "[rank 1] b4\n"

/* `logs` and `logs -f` show two ranks' backlog in the order it was printed, and --tail N the
 * last N lines of all ranks (it showed rank 1 only). */
static void test_logs__ranks_interleave_in_the_order_they_printed(void **state)
{
    (void)state;
    assert_int_equal(sh("rm -f '%s'/a? '%s'/b? '%s/go'", remote, remote, remote), 0);
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "2", "--name", "turns", "--",
                                          "sh", "-c", TURNS_SCRIPT));
    expect_status(&c, 0, "run --detach of two ranks taking turns");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 1, "b4\n");
    struct child l = run_in(project, ARGS("logs", id));
    expect_status(&l, 0, "logs of a running run");
    assert_string_equal(l.out.data, TURNS_SHOWN);
    child_release(&l);
    l = run_in(project, ARGS("logs", "turns", "--tail", "4"));
    expect_status(&l, 0, "logs --tail 4");
    assert_string_equal(l.out.data, "[rank 0] a3\n[rank 1] b3\n[rank 0] a4\n[rank 1] b4\n");
    child_release(&l);
    /* -f --tail 2: the last two lines so far, not the whole backlog, then what comes */
    child_start(&l, project, ARGS("logs", "-f", "--tail", "2", id));
    child_wait_for(&l, "[rank 1] b4\n", 60000);
    assert_string_equal(l.out.data, "[rank 0] a4\n[rank 1] b4\n");
    kill(l.pid, SIGINT);
    child_finish(&l);
    child_release(&l);
    /* re-attach: the backlog in order, then the end */
    child_start(&l, project, ARGS("logs", "-f", id));
    child_wait_for(&l, "[rank 1] b4\n", 60000);
    assert_string_equal(l.out.data, TURNS_SHOWN);
    assert_int_equal(sh("touch '%s/go'", remote), 0);
    child_finish(&l);
    expect_status(&l, 0, "logs -f to the end");
    assert_string_equal(l.out.data, TURNS_SHOWN);
    child_release(&l);
    sh("rm -f '%s'/a? '%s'/b? '%s/go'", remote, remote, remote);
}

/* `logs -f --tail N` started while a rank is in the middle of a line ("head-" printed, no newline
 * yet): the tail leaves that line for the follow, which prints it whole once it ends. It printed
 * "head-" as a line of its own, then "tail" as another. */
static void test_logs__follow_with_tail_never_splits_a_line_being_written(void **state)
{
    (void)state;
    assert_int_equal(sh("rm -f '%s/go'", remote), 0);
    struct child c = run_in(project, ARGS("run", "--detach", "--cpu", "1", "--", "sh", "-c",
                                          "echo one; printf head-; "
                                          "while [ ! -e go ]; do sleep 0.05; done; echo tail"));
    expect_status(&c, 0, "run --detach of a rank pausing mid-line");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "head-");
    struct child l;
    child_start(&l, project, ARGS("logs", "-f", "--tail", "2", id));
    child_wait_for(&l, "one\n", 60000);
    assert_int_equal(sh("touch '%s/go'", remote), 0);
    child_finish(&l);
    expect_status(&l, 0, "logs -f --tail 2 to the end");
    if (!strstr(l.out.data, "head-tail\n") || count(l.out.data, "head-") != 1)
        fail_msg("the line written across the tail was split or doubled: '%s'", l.out.data);
    child_release(&l);
    sh("rm -f '%s/go'", remote);
}

/* After the server lost a run (recreated: its runs are gone), `logs RUN` (its id or its --name)
 * shows the local copy that following it left, in the order it was printed; -f cannot follow it
 * and exits 1. Showing the logs again does not double the copy. */
static void test_logs__a_run_the_server_lost_is_shown_from_the_local_copy(void **state)
{
    (void)state;
    assert_int_equal(sh("rm -f '%s'/a? '%s'/b? && touch '%s/go'", remote, remote, remote), 0);
    struct child c = run_in(
        project, ARGS("run", "--cpu", "2", "--name", "lost-turns", "--", "sh", "-c", TURNS_SCRIPT));
    expect_status(&c, 0, "run of two ranks taking turns");
    assert_string_equal(c.out.data, TURNS_SHOWN);
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    struct child l = run_in(project, ARGS("logs", id)); /* shown again: the copy stays as is */
    expect_status(&l, 0, "logs while the server has the run");
    child_release(&l);
    for (int rank = 0; rank < 2; rank++) {
        char *mine = gs_test_rank_log(project, id, rank),
             *theirs = gs_test_rank_log(remote, id, rank);
        assert_string_equal(mine, theirs);
        free(mine);
        free(theirs);
    }
    assert_int_equal(sh("rm -rf '%s/.gpusync/runs/%s' '%s'/a? '%s'/b? '%s/go'", remote, id, remote,
                        remote, remote),
                     0);
    l = run_in(project, ARGS("logs", id));
    expect_status(&l, 0, "logs of a run only the local copy has");
    assert_string_equal(l.out.data, TURNS_SHOWN);
    assert_non_null(strstr(l.err.data, "local copy"));
    child_release(&l);
    l = run_in(project, ARGS("logs", "lost-turns"));
    expect_status(&l, 0, "logs NAME of a run only the local copy has");
    assert_string_equal(l.out.data, TURNS_SHOWN);
    child_release(&l);
    l = run_in(project, ARGS("logs", id, "--tail", "2"));
    expect_status(&l, 0, "logs --tail 2 from the local copy");
    assert_string_equal(l.out.data, "[rank 0] a4\n[rank 1] b4\n");
    child_release(&l);
    l = run_in(project, ARGS("logs", "-f", id, "--rank", "1"));
    expect_status(&l, 1, "logs -f of a run only the local copy has");
    assert_string_equal(l.out.data, "b1\nb2\nb3\nb4\n");
    child_release(&l);
    /* a server with no runs at all (recreated): plain `logs` shows the newest local copy */
    assert_int_equal(sh("cd '%s/.gpusync' && mv runs runs.saved && mkdir runs", remote), 0);
    l = run_in(project, ARGS("logs"));
    sh("cd '%s/.gpusync' && rm -rf runs && mv runs.saved runs", remote);
    expect_status(&l, 0, "logs (the newest) when the server has no runs");
    assert_string_equal(l.out.data, TURNS_SHOWN);
    child_release(&l);
    l = run_in(project, ARGS("logs", "20000101-000000-0000")); /* neither has it */
    expect_status(&l, 1, "logs of an unknown run");
    assert_string_equal(l.out.data, "");
    child_release(&l);
}

/* logs prints text: --json is refused (it printed text anyway) and not offered by --help. */
static void test_logs__json_is_refused_and_not_offered(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("logs", "--json"));
    expect_status(&c, 2, "logs --json");
    assert_string_equal(c.out.data, "");
    child_release(&c);
    c = run_in(project, ARGS("logs", "--help"));
    expect_status(&c, 0, "logs --help");
    assert_null(strstr(c.out.data, "\n  --json")); /* not among the options */
    assert_non_null(strstr(c.out.data, "--tail"));
    child_release(&c);
}

/* The pid a rank wrote into the remote project's file `name` (it did before it printed "up"). */
static long remote_pid(const char *name)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", remote, name);
    FILE *fp = fopen(path, "r");
    long pid = 0;
    if (!fp || fscanf(fp, "%ld", &pid) != 1)
        fail_msg("no pid in %s", path);
    fclose(fp);
    return pid;
}

/* What training code starts outside its rank's process group, a setsid child that ignores
 * SIGTERM (Popen(start_new_session=True)) and a double-forked daemon, is gone after one `stop`,
 * which says what it had to kill. */
static void test_stop__leaves_no_setsid_child_or_daemon_of_the_run(void **state)
{
    (void)state;
    struct child c = run_in(
        project,
        ARGS("run", "--detach", "--cpu", "2", "--grace", "0.5", "--", "sh", "-c",
             "setsid sh -c 'trap \"\" TERM; echo $$ > stubborn.$RANK.pid; exec sleep 1000' & "
             "(setsid sh -c 'echo $$ > daemon.$RANK.pid; exec sleep 1001' &); "
             "while [ ! -s stubborn.$RANK.pid ] || [ ! -s daemon.$RANK.pid ]; do sleep 0.01; "
             "done; echo up; wait"));
    expect_status(&c, 0, "run --detach with escaping children");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    await_remote_log(id, 0, "up\n");
    await_remote_log(id, 1, "up\n");
    long pids[4] = {remote_pid("stubborn.0.pid"), remote_pid("daemon.0.pid"),
                    remote_pid("stubborn.1.pid"), remote_pid("daemon.1.pid")};
    struct child s = run_in(project, ARGS("stop", "--json", id));
    expect_status(&s, 0, "stop");
    for (int i = 0; i < 4; i++)
        if (!process_gone(pids[i], 0)) /* stop returned: gone by now, not later */
            fail_msg("pid %ld of run %s survived stop", pids[i], id);
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "stopped");
    assert_int_equal(int_at(st, "others_termed"), 4);
    assert_int_equal(int_at(st, "killed_count") >= 2, 1); /* the two stubborn ones, at least */
    json_decref(st);
    child_release(&s);
}

/* ---- detach, re-attach, stop ---- */

static void test_run__detach_reattach_and_stop_leaves_no_process(void **state)
{
    (void)state;
    struct child c;
    child_start(&c, project,
                ARGS("run", "--cpu", "2", "--name", "looper", "--", "sh", "-c",
                     "echo up $RANK; i=0; while :; do echo tick $RANK $i; i=$((i+1)); sleep 0.1; "
                     "done"));
    child_wait_for(&c, "up ", 60000);
    kill(c.pid, SIGINT);
    child_finish(&c);
    expect_status(&c, 130, "run after Ctrl-C (detached)");
    const char *id = run_id_of(&c);
    char reattach[200];
    snprintf(reattach, sizeof(reattach), "gpusync logs -f %s", id);
    assert_non_null(strstr(c.err.data, reattach));
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "running"); /* detaching did not stop it */
    json_decref(st);

    /* re-attach by name: new lines keep coming */
    struct child l;
    child_start(&l, project, ARGS("logs", "-f", "looper", "--rank", "1"));
    child_wait_for(&l, "tick 1 20", 60000);
    assert_null(strstr(l.out.data, "tick 0 ")); /* --rank 1 only */
    kill(l.pid, SIGINT);
    child_finish(&l);
    expect_status(&l, 130, "logs -f after Ctrl-C");

    struct child s = run_in(project, ARGS("stop", id));
    expect_status(&s, 0, "stop");
    st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "stopped");
    json_t *ranks = json_object_get(st, "ranks"), *r;
    size_t i;
    assert_int_equal(json_array_size(ranks), 2);
    json_array_foreach(ranks, i, r) assert_false(group_exists(int_at(r, "pgid")));
    assert_true(process_gone(int_at(st, "supervisor_pid"), 10000));
    json_decref(st);
    child_release(&s);
    child_release(&l);
    child_release(&c);
}

/* Two running runs share a --name: `stop NAME` stops the newest, and again stops the other one
 * (its report naming it), rather than answering "not running" about the newest while the older
 * one runs on. */
static void test_stop__a_shared_name_stops_the_newest_run_still_running(void **state)
{
    (void)state;
    char older[128], newer[128], want[200];
    struct child c = run_in(
        project, ARGS("run", "--cpu", "1", "--name", "dup", "--detach", "--", "sleep", "1091"));
    expect_status(&c, 0, "run --detach --name dup");
    snprintf(older, sizeof(older), "%s", run_id_of(&c));
    child_release(&c);
    c = run_in(project,
               ARGS("run", "--cpu", "1", "--name", "dup", "--detach", "--", "sleep", "1092"));
    expect_status(&c, 0, "a second run --detach --name dup");
    snprintf(newer, sizeof(newer), "%s", run_id_of(&c));
    child_release(&c);
    const char *order[] = {newer, older};
    for (int i = 0; i < 2; i++) {
        c = run_in(project, ARGS("stop", "dup"));
        expect_status(&c, 0, "stop dup");
        snprintf(want, sizeof(want), "stopped %s", order[i]);
        assert_true(c.out.data && !strncmp(c.out.data, want, strlen(want)));
        child_release(&c);
        json_t *st = gs_test_run_json(remote, order[i], "status.json");
        assert_string_equal(str_at(st, "state"), "stopped");
        json_decref(st);
    }
}

static void test_logs__tail_rank_and_the_newest_run_by_default(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "2", "--name", "five", "--", "sh", "-c",
                                          "for i in 1 2 3 4 5; do echo l$RANK.$i; done"));
    expect_status(&c, 0, "run printing five lines per rank");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    struct child t = run_in(project, ARGS("logs", "--rank", "1", "--tail", "2"));
    expect_status(&t, 0, "logs --rank 1 --tail 2 (newest run)");
    assert_string_equal(t.out.data, "l1.4\nl1.5\n");
    struct child a = run_in(project, ARGS("logs", "five"));
    expect_status(&a, 0, "logs NAME");
    for (int r = 0; r < 2; r++)
        for (int i = 1; i <= 5; i++) {
            char line[64];
            snprintf(line, sizeof(line), "[rank %d] l%d.%d\n", r, r, i);
            assert_int_equal(count(a.out.data, line), 1);
        }
    struct child p = run_in(project, ARGS("ps"));
    expect_status(&p, 0, "ps");
    const char *row = strstr(p.out.data, id);
    assert_non_null(row);
    assert_non_null(strstr(row, "succeeded"));
    /* stopping a run that has ended stops nothing and says so; nothing of it runs */
    struct child s = run_in(project, ARGS("stop", id));
    print_message("stop after the end: exit %d: %s%s", s.status, s.out.data, s.err.data);
    json_t *st = gs_test_run_json(remote, id, "status.json");
    assert_string_equal(str_at(st, "state"), "succeeded");
    json_decref(st);
    child_release(&s);
    child_release(&p);
    child_release(&a);
    child_release(&t);
    child_release(&c);
}

/* `logs --rank N` of a run without rank N is a usage error naming --rank: it printed nothing
 * and exited 0, as if rank N had been silent. The ranks it has still show. */
static void test_logs__a_rank_the_run_does_not_have_is_a_usage_error(void **state)
{
    (void)state;
    struct child c = run_in(project, ARGS("run", "--cpu", "2", "--", "sh", "-c", "echo l$RANK"));
    expect_status(&c, 0, "run of two ranks");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    struct child l = run_in(project, ARGS("logs", id, "--rank", "99"));
    expect_status(&l, 2, "logs --rank 99 of a two-rank run");
    assert_string_equal(l.out.data, "");
    assert_non_null(strstr(l.err.data, "--rank 99"));
    child_release(&l);
    l = run_in(project, ARGS("logs", "-f", id, "--rank", "1,2"));
    expect_status(&l, 2, "logs -f --rank 1,2 of a two-rank run");
    assert_string_equal(l.out.data, "");
    child_release(&l);
    l = run_in(project, ARGS("logs", id, "--rank", "1"));
    expect_status(&l, 0, "logs --rank 1 of a two-rank run");
    assert_string_equal(l.out.data, "l1\n");
    child_release(&l);
}

/* A one-rank run's lines come bare from `logs` and `logs -f`, as `run` printed them: "[rank 0] "
 * prefixes are for several ranks' lines. */
static void test_logs__a_one_rank_run_shows_bare_lines_as_run_does(void **state)
{
    (void)state;
    struct child c =
        run_in(project, ARGS("run", "--cpu", "1", "--", "sh", "-c", "echo one; echo two"));
    expect_status(&c, 0, "run of one rank");
    assert_string_equal(c.out.data, "one\ntwo\n");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    struct child l = run_in(project, ARGS("logs", id));
    expect_status(&l, 0, "logs of a one-rank run");
    assert_string_equal(l.out.data, "one\ntwo\n");
    child_release(&l);
    l = run_in(project, ARGS("logs", "-f", id));
    expect_status(&l, 0, "logs -f of a one-rank run");
    assert_string_equal(l.out.data, "one\ntwo\n");
    child_release(&l);
    l = run_in(project, ARGS("logs", "-f", "--tail", "1", id));
    expect_status(&l, 0, "logs -f --tail 1 of a one-rank run");
    assert_string_equal(l.out.data, "two\n");
    child_release(&l);
}

static void test_run__no_gpu_on_the_server_suggests_cpu_ranks(void **state)
{
    (void)state;
    if (sh("command -v nvidia-smi >/dev/null 2>&1") == 0)
        skip(); /* this server has GPUs: the case cannot happen here */
    struct child c = run_in(project, ARGS("run", "--no-sync", "--", "true"));
    assert_true(c.status != 0);
    assert_non_null(strstr(c.err.data, "--cpu N"));
    child_release(&c);
    c = run_in(project, ARGS("run", "--no-sync", "nosuchjob"));
    expect_status(&c, 2, "run of an unknown target");
    assert_non_null(strstr(c.err.data, "nosuchjob"));
    child_release(&c);
}

/* ---- a cut connection while following ---- */

#define NUMBERED_LINES 300

static void test_run__follow_after_a_cut_connection_shows_every_line_once(void **state)
{
    (void)state;
    struct wansim_proc w;
    struct wansim_opts o = {.target_port = srv.port, .delay_ms = 5};
    char err[256], dir[700], rdir[700], reply[128];
    if (wansim_start(&w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    snprintf(dir, sizeof(dir), "%s/work/cut", srv.dir);
    snprintf(rdir, sizeof(rdir), "%s/remote-cut", srv.dir);
    init_project(dir, &srv, w.port, rdir);
    struct child c;
    child_start(&c, dir,
                ARGS("run", "--cpu", "1", "--", "sh", "-c",
                     "i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); sleep 0.02; done"));
    child_wait_for(&c, "line 20\n", 60000);
    assert_int_equal(wansim_command(&w, "cut", reply, sizeof(reply)), 0);
    usleep(1500 * 1000); /* the link stays down a while: lines pile up on the server */
    assert_int_equal(wansim_command(&w, "restore", reply, sizeof(reply)), 0);
    child_finish(&c);
    expect_status(&c, 0, "run followed across a cut");
    assert_non_null(strstr(c.err.data, "reconnect"));
    /* every line exactly once, in order */
    const char *p = c.out.data;
    for (int i = 0; i < NUMBERED_LINES; i++) {
        char want[32];
        int n = snprintf(want, sizeof(want), "line %d\n", i);
        if (strncmp(p, want, (size_t)n) != 0)
            fail_msg("expected '%s' at offset %zu, got: %.60s", want, (size_t)(p - c.out.data), p);
        p += n;
    }
    assert_string_equal(p, "");
    wansim_stop(&w);
    child_release(&c);
}

/* Waits (10 s at most, else fails) until `pid` has taken SIGINT in: it is pending no more, so that
 * the next one is a press of its own and not merged into it. */
static void await_sigint_taken(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    int64_t end = gs_clock_mono_ms() + 10000;
    for (;;) {
        FILE *fp = fopen(path, "r");
        assert_non_null(fp);
        unsigned long long pending = 0, mask;
        while (fgets(line, sizeof(line), fp))
            if (sscanf(line, "SigPnd: %llx", &mask) == 1 ||
                sscanf(line, "ShdPnd: %llx", &mask) == 1)
                pending |= mask;
        fclose(fp);
        if (!(pending & (1ULL << (SIGINT - 1))))
            return;
        if (gs_clock_mono_ms() > end)
            fail_msg("process %d left SIGINT pending for 10 s", (int)pid);
        usleep(1000); /* polling the kernel's pending set, with a deadline */
    }
}

/* A second Ctrl-C that comes right after the first, before the detach message, stops the run:
 * the link is stalled while both arrive, so that following ends slowly (as with a stalled node),
 * and the second one comes while it ends. */
static void test_run__a_second_ctrl_c_before_the_detach_message_stops_the_run(void **state)
{
    (void)state;
    struct wansim_proc w;
    struct wansim_opts o = {.target_port = srv.port};
    char err[256], dir[700], rdir[700], reply[128];
    if (wansim_start(&w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    snprintf(dir, sizeof(dir), "%s/work/int-twice", srv.dir);
    snprintf(rdir, sizeof(rdir), "%s/remote-int-twice", srv.dir);
    init_project(dir, &srv, w.port, rdir);
    struct child c;
    child_start(&c, dir,
                ARGS("run", "--cpu", "2", "--", "sh", "-c", "echo up $RANK; exec sleep 300"));
    child_wait_for(&c, "[rank 0] up 0", 60000);
    child_wait_for(&c, "[rank 1] up 1", 60000);
    assert_int_equal(wansim_command(&w, "stall", reply, sizeof(reply)), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kill(c.pid, SIGINT), 0);
        await_sigint_taken(c.pid);
    }
    assert_int_equal(wansim_command(&w, "resume", reply, sizeof(reply)), 0);
    child_finish(&c);
    expect_status(&c, 130, "run after two quick Ctrl-Cs");
    json_t *st = gs_test_run_json(rdir, run_id_of(&c), "status.json");
    char ended[32];
    snprintf(ended, sizeof(ended), "%s", str_at(st, "state"));
    if (strcmp(ended, "stopped") != 0) { /* not left running to the end of the tests */
        struct child s;
        child_start(&s, dir, ARGS("stop", run_id_of(&c)));
        child_finish(&s);
        child_release(&s);
    }
    assert_string_equal(ended, "stopped");
    for (int rank = 0; rank < 2; rank++)
        assert_false(
            group_exists(int_at(json_array_get(json_object_get(st, "ranks"), rank), "pgid")));
    json_decref(st);
    child_release(&c);
    wansim_stop(&w);
}

/* ---- concurrency and arguments ---- */

static void test_run__two_concurrent_runs_both_start_and_finish(void **state)
{
    (void)state;
    struct child a, b;
    const char *const args[] = {
        "run", "--cpu", "2", "--", "sh", "-c", "echo port $MASTER_PORT; sleep 2; echo done", NULL};
    child_start(&a, project, args);
    child_start(&b, project, args);
    child_finish(&a);
    child_finish(&b);
    expect_status(&a, 0, "first concurrent run");
    expect_status(&b, 0, "second concurrent run");
    char ida[128];
    snprintf(ida, sizeof(ida), "%s", run_id_of(&a));
    assert_string_not_equal(ida, run_id_of(&b));
    assert_int_equal(count(a.out.data, "done"), 2);
    assert_int_equal(count(b.out.data, "done"), 2);
    json_t *sa = gs_test_run_json(remote, ida, "status.json"),
           *sb = gs_test_run_json(remote, run_id_of(&b), "status.json");
    assert_string_equal(str_at(sa, "state"), "succeeded");
    assert_string_equal(str_at(sb, "state"), "succeeded");
    /* their time on the server overlapped: they really ran at once */
    assert_true(strcmp(str_at(sa, "start"), str_at(sb, "end")) <= 0 &&
                strcmp(str_at(sb, "start"), str_at(sa, "end")) <= 0);
    json_decref(sa);
    json_decref(sb);
    child_release(&a);
    child_release(&b);
}

static void test_run__arguments_reach_the_command_unchanged(void **state)
{
    (void)state;
    const char *words[] = {"two words", "it's", "say \"hi\"", "$HOME", "a;b",
                           "x\ny",      "",     "*",          "`id`",  "\\n"};
    size_t n = sizeof(words) / sizeof(words[0]);
    const char *args[32] = {"run",
                            "--cpu",
                            "1",
                            "--",
                            "python3",
                            "-c",
                            "import sys, json; print(json.dumps(sys.argv[1:]))"};
    for (size_t i = 0; i < n; i++)
        args[7 + i] = words[i];
    struct child c = run_in(project, args);
    expect_status(&c, 0, "run with awkward arguments");
    json_t *got = json_loads(c.out.data, JSON_DISABLE_EOF_CHECK, NULL);
    if (!json_is_array(got))
        fail_msg("not a JSON list: %s", c.out.data);
    assert_int_equal(json_array_size(got), n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(json_string_value(json_array_get(got, i)), words[i]);
    json_decref(got);
    child_release(&c);
}

/* ---- two nodes ---- */

/* Rank 0 listens on MASTER_PORT; every other rank connects to MASTER_ADDR:MASTER_PORT and sends
 * its rank; rank 0 prints the ranks it heard from. */
#define TCP_SCRIPT                                                                                 \
    "import os, socket, time\n"                                                                    \
    "r = int(os.environ['RANK']); w = int(os.environ['WORLD_SIZE'])\n"                             \
    "a = os.environ['MASTER_ADDR']; p = int(os.environ['MASTER_PORT'])\n"                          \
    "if r == 0:\n"                                                                                 \
    "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"           \
    "    s.bind(('', p)); s.listen(16); got = []\n"                                                \
    "    for _ in range(w - 1):\n"                                                                 \
    "        c, _ = s.accept(); got.append(int(c.recv(16))); c.close()\n"                          \
    "    print('got', sorted(got), flush=True)\n"                                                  \
    "else:\n"                                                                                      \
    "    for _ in range(200):\n"                                                                   \
    "        try:\n"                                                                               \
    "            c = socket.create_connection((a, p)); c.sendall(str(r).encode()); c.close(); "    \
    "break\n"                                                                                      \
    "        except OSError:\n"                                                                    \
    "            time.sleep(0.1)\n"                                                                \
    "    else:\n"                                                                                  \
    "        raise SystemExit('cannot reach the master')\n"                                        \
    "    print('sent', r, flush=True)\n"

/* Starts a second server that accepts srv's client key (the tests' HOME stays srv's). */
static void second_server(struct gs_test_sshd *b)
{
    assert_int_equal(gs_test_sshd_start(b, NULL), 0);
    gs_test_sshd_use_home(&srv, 1);
    assert_int_equal(sh("cat '%s/.ssh/id_ed25519.pub' >> '%s/authorized_keys'", srv.home, b->dir),
                     0);
}

/* A two-node set-up: a second sshd `b`, a project in work/NAME against the first, and its
 * remote directories node-aSUFFIX (first server) and node-bSUFFIX (b) joined in `hosts`. */
struct two_nodes {
    struct gs_test_sshd b;
    char dir[700], ra[700], rb[700], hosts[2200];
};

static void two_nodes_init(struct two_nodes *t, const char *name, const char *suffix)
{
    second_server(&t->b);
    snprintf(t->dir, sizeof(t->dir), "%s/work/%s", srv.dir, name);
    snprintf(t->ra, sizeof(t->ra), "%s/node-a%s", srv.dir, suffix);
    snprintf(t->rb, sizeof(t->rb), "%s/node-b%s", t->b.dir, suffix);
    init_project(t->dir, &srv, 0, t->ra);
    snprintf(t->hosts, sizeof(t->hosts), "root@127.0.0.1:%d%s,root@127.0.0.1:%d%s", srv.port, t->ra,
             t->b.port, t->rb);
}

static void test_run__two_nodes_share_the_master_and_connect_across(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two", "");
    /* [remote] hosts in the config: node 0 is the configured server, node 1 is b */
    assert_int_equal(sh("cd '%s' && sed -i 's|^\\[remote\\]$|[remote]\\n\\thosts = %s|' "
                        ".gpusync/config",
                        t.dir, t.hosts),
                     0);
    assert_int_equal(sh("cd '%s' && echo data > shared.txt", t.dir), 0);
    char script[2048];
    snprintf(script, sizeof(script), "%s; exec python3 -c \"$0\"", ENV_SCRIPT);
    struct child c = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--cpu", "2", "--ranks",
                                        "all", "--", "sh", "-c", script, TCP_SCRIPT));
    expect_status(&c, 0, "two-node run");
    const char *id = run_id_of(&c);
    /* both nodes were synced */
    assert_int_equal(sh("cmp -s '%s/shared.txt' '%s/shared.txt'", t.dir, t.ra), 0);
    assert_int_equal(sh("cmp -s '%s/shared.txt' '%s/shared.txt'", t.dir, t.rb), 0);
    int port = 0;
    for (int rank = 0; rank < 4; rank++) {
        const char *rdir = rank < 2 ? t.ra : t.rb;
        char *log = gs_test_rank_log(rdir, id, rank);
        check_env_line(log, rank, rank % 2, 4, 2, rank / 2, "127.0.0.1", &port);
        if (rank == 0)
            assert_non_null(strstr(log, "got [1, 2, 3]"));
        else
            assert_non_null(strstr(log, "sent"));
        free(log);
        char prefix[32];
        snprintf(prefix, sizeof(prefix), "[rank %d] ENV", rank);
        assert_non_null(strstr(c.out.data, prefix));
    }
    json_t *sa = gs_test_run_json(t.ra, id, "status.json"),
           *sb = gs_test_run_json(t.rb, id, "status.json");
    assert_int_equal(int_at(sa, "master_port"), port);
    assert_int_equal(int_at(sb, "master_port"), port);
    assert_string_equal(str_at(sb, "state"), "succeeded");
    json_decref(sa);
    json_decref(sb);
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

static void test_run__two_nodes_one_failing_stops_the_other(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-fail", "2");
    /* --ranks is checked against every node's ranks (2 here) before anything is sent or run */
    assert_int_equal(sh("cd '%s' && echo data > unsent.txt", t.dir), 0);
    struct child bad = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts,
                                          "--cpu", "1", "--ranks", "2", "--", "true"));
    expect_status(&bad, 2, "run --hosts (two nodes) --cpu 1 --ranks 2");
    child_release(&bad);
    /* each node would restart alone, its peers waiting on the failed ranks: refused */
    bad = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu", "1",
                             "--max-restarts", "1", "--", "true"));
    expect_status(&bad, 2, "run --hosts --max-restarts 1");
    child_release(&bad);
    assert_int_not_equal(sh("test -e '%s/unsent.txt'", t.ra), 0);
    /* a command that cannot start exits as the run records it (127), as on one server */
    bad = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu", "1", "--",
                             "/nonexistent/cmd"));
    expect_status(&bad, 127, "run --hosts of a command that does not exist");
    child_release(&bad);
    int64_t t0 = gs_clock_mono_ms();
    struct child c = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu",
                                        "1", "--", "sh", "-c",
                                        "if [ $GROUP_RANK = 1 ]; then sleep 1; exit 9; fi; "
                                        "exec sleep 120"));
    expect_status(&c, 9, "two-node run where node 1 fails");
    assert_true(gs_clock_mono_ms() - t0 < 60000);
    const char *id = run_id_of(&c);
    json_t *sa = gs_test_run_json(t.ra, id, "status.json"),
           *sb = gs_test_run_json(t.rb, id, "status.json");
    assert_string_equal(str_at(sb, "state"), "failed");
    assert_string_equal(str_at(sa, "state"), "stopped");
    json_t *r = json_array_get(json_object_get(sa, "ranks"), 0);
    assert_false(group_exists(int_at(r, "pgid")));
    json_decref(sa);
    json_decref(sb);
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

/* Rank 1 ticks 4 times then fails at its 5th; rank 0 ticks on until stopped. */
#define FAIL_AT_5                                                                                  \
    "i=1; while :; do echo rank $RANK tick $i; "                                                   \
    "if [ $RANK = 1 ] && [ $i = 5 ]; then echo rank 1 fails; exit 9; fi; "                         \
    "i=$((i+1)); sleep 0.2; done"

static void test_run__two_nodes_a_failure_shows_the_survivors_lines_once(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-once", "4");
    struct child c = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu",
                                        "1", "--", "sh", "-c", FAIL_AT_5));
    expect_status(&c, 9, "two-node run where rank 1 fails at its 5th tick");
    assert_int_equal(count(c.out.data, "[rank 1] rank 1 fails\n"), 1);
    /* every line of the surviving rank once: it was stopped, not shown again from the start */
    char *log = gs_test_rank_log(t.ra, run_id_of(&c), 0);
    int ticks = count(log, "tick ");
    assert_true(ticks >= 5);
    for (int i = 1; i <= ticks; i++) {
        char line[64];
        snprintf(line, sizeof(line), "[rank 0] rank 0 tick %d\n", i);
        if (count(c.out.data, line) != 1)
            fail_msg("'%s' shown %d times:\n%s", line, count(c.out.data, line), c.out.data);
    }
    free(log);
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

static void test_run__two_nodes_one_unreachable_is_not_said_ended(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-cut", "5");
    struct wansim_proc w;
    struct wansim_opts o = {.target_port = t.b.port};
    char err[256], reply[128], hosts[2200], trigger[800], script[1200], node1[64];
    if (wansim_start(&w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    /* node 1 behind the simulated link; node 0's rank fails once told to */
    snprintf(hosts, sizeof(hosts), "root@127.0.0.1:%d%s,root@127.0.0.1:%d%s", srv.port, t.ra,
             w.port, t.rb);
    snprintf(trigger, sizeof(trigger), "%s/two-cut-fail-now", srv.dir);
    snprintf(script, sizeof(script),
             "echo up $RANK; if [ $RANK = 0 ]; then while [ ! -e '%s' ]; do sleep 0.1; done; "
             "exit 5; fi; exec sleep 120",
             trigger);
    struct child c;
    child_start(&c, t.dir,
                ARGS("run", "--accept-new-host-key", "--hosts", hosts, "--cpu", "1", "--ranks",
                     "all", "--", "sh", "-c", script));
    child_wait_for(&c, "[rank 1] up 1", 60000);
    child_wait_for(&c, "[rank 0] up 0", 60000);
    assert_int_equal(wansim_command(&w, "cut", reply, sizeof(reply)), 0);
    assert_int_equal(sh("touch '%s'", trigger), 0);
    child_finish(&c);
    /* node 1's end is not known: as a run whose connection failed, not as one that ended */
    expect_status(&c, 255, "two-node run with node 1 cut off when node 0 failed");
    snprintf(node1, sizeof(node1), "127.0.0.1:%d", w.port);
    assert_non_null(strstr(c.err.data, node1));
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    json_t *sb = gs_test_run_json(t.rb, id, "status.json");
    assert_string_equal(str_at(sb, "state"), "running");
    long long pgid = int_at(json_array_get(json_object_get(sb, "ranks"), 0), "pgid");
    assert_true(group_exists(pgid));
    json_decref(sb);
    /* once the node is back, stop ends its ranks, as the message says */
    assert_int_equal(wansim_command(&w, "restore", reply, sizeof(reply)), 0);
    struct child s = run_in(t.dir, ARGS("stop", id));
    expect_status(&s, 0, "stop once node 1 is back");
    sb = gs_test_run_json(t.rb, id, "status.json");
    assert_string_equal(str_at(sb, "state"), "stopped");
    assert_false(group_exists(pgid));
    json_decref(sb);
    child_release(&s);
    child_release(&c);
    wansim_stop(&w);
    gs_test_sshd_destroy(&t.b);
}

static void test_ps__a_launch_failing_on_node_1_shows_a_failed_run_on_its_nodes(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-half", "6");
    /* ./only-here exists on node 0 only (no sync): node 1 cannot start it */
    assert_int_equal(sh("mkdir -p '%s' && printf '#!/bin/sh\\nexec sleep 120\\n' > "
                        "'%s/only-here' && chmod +x '%s/only-here'",
                        t.rb, t.ra, t.ra),
                     0);
    struct child c = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts,
                                        "--no-sync", "--cpu", "1", "--", "./only-here"));
    expect_status(&c, 127, "two-node run of a command node 1 does not have");
    child_release(&c);
    c = run_in(t.dir, ARGS("ps", "--json"));
    expect_status(&c, 0, "ps --json");
    json_t *ps = json_loads(c.out.data, 0, NULL);
    json_t *run = json_array_get(json_object_get(ps, "runs"), 0);
    if (!json_is_object(run))
        fail_msg("no run in ps --json: %s", c.out.data);
    assert_string_equal(str_at(run, "state"), "failed");
    assert_int_equal(int_at(run, "exit_code"), 127);
    json_t *nodes = json_object_get(run, "nodes");
    assert_int_equal(json_array_size(nodes), 2);
    assert_string_equal(str_at(json_array_get(nodes, 0), "state"), "stopped");
    assert_string_equal(str_at(json_array_get(nodes, 1), "state"), "failed");
    /* node 0's rank was stopped: nothing of it is left */
    json_t *sa = gs_test_run_json(t.ra, str_at(run, "id"), "status.json");
    assert_false(group_exists(int_at(json_array_get(json_object_get(sa, "ranks"), 0), "pgid")));
    json_decref(sa);
    json_decref(ps);
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

static void test_logs__a_two_node_run_checks_rank_and_follows_from_the_tail(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-logs", "7");
    struct child c =
        run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu", "2", "--",
                           "sh", "-c", "echo a $RANK; echo b $RANK; echo c $RANK"));
    expect_status(&c, 0, "two-node run of 4 ranks");
    char id[128];
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    /* ranks 0-3 over the two nodes: 9 is a usage error, as on one server; 3 is not */
    c = run_in(t.dir, ARGS("logs", id, "--rank", "9"));
    expect_status(&c, 2, "logs --rank 9 of a 4-rank two-node run");
    assert_string_equal(c.out.data, "");
    child_release(&c);
    c = run_in(t.dir, ARGS("logs", id, "--rank", "3"));
    expect_status(&c, 0, "logs --rank 3 of a 4-rank two-node run");
    assert_string_equal(c.out.data, "a 3\nb 3\nc 3\n");
    child_release(&c);
    /* -f --tail 2 shows what logs --tail 2 does (then follows: the run has ended) */
    struct child tail = run_in(t.dir, ARGS("logs", id, "--tail", "2"));
    expect_status(&tail, 0, "logs --tail 2");
    assert_int_equal(count(tail.out.data, "\n"), 4); /* the last 2 lines of each node */
    c = run_in(t.dir, ARGS("logs", "-f", id, "--tail", "2"));
    expect_status(&c, 0, "logs -f --tail 2 of an ended two-node run");
    assert_string_equal(c.out.data, tail.out.data);
    child_release(&tail);
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

static void test_logs__a_two_node_run_with_a_node_cut_off_shows_what_it_can(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-logcut", "8");
    struct wansim_proc w;
    struct wansim_opts o = {.target_port = t.b.port};
    char err[256], reply[128], hosts[2200], id[128], node1[64];
    if (wansim_start(&w, &o, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    snprintf(hosts, sizeof(hosts), "root@127.0.0.1:%d%s,root@127.0.0.1:%d%s", srv.port, t.ra,
             w.port, t.rb);
    struct child c = run_in(t.dir, ARGS("run", "--accept-new-host-key", "--hosts", hosts, "--cpu",
                                        "1", "--", "sh", "-c", "echo hello $RANK"));
    expect_status(&c, 0, "two-node run, node 1 behind wansim");
    snprintf(id, sizeof(id), "%s", run_id_of(&c));
    child_release(&c);
    assert_int_equal(wansim_command(&w, "cut", reply, sizeof(reply)), 0);
    /* rank 0 lives on the reachable node: shown as if both were */
    c = run_in(t.dir, ARGS("logs", id, "--rank", "0"));
    expect_status(&c, 0, "logs --rank 0 with node 1 cut off");
    assert_string_equal(c.out.data, "hello 0\n");
    child_release(&c);
    /* every rank: node 0's from the server, node 1's from the local copy; node 1 named */
    c = run_in(t.dir, ARGS("logs", id));
    assert_int_equal(count(c.out.data, "[rank 0] hello 0\n"), 1);
    assert_int_equal(count(c.out.data, "[rank 1] hello 1\n"), 1);
    assert_int_not_equal(c.status, 0);
    snprintf(node1, sizeof(node1), "127.0.0.1:%d", w.port);
    assert_non_null(strstr(c.err.data, node1));
    child_release(&c);
    wansim_stop(&w);
    gs_test_sshd_destroy(&t.b);
}

static void test_run__two_nodes_second_ctrl_c_stops_every_node(void **state)
{
    (void)state;
    struct two_nodes t;
    two_nodes_init(&t, "two-int", "3");
    struct child c;
    child_start(&c, t.dir,
                ARGS("run", "--accept-new-host-key", "--hosts", t.hosts, "--cpu", "1", "--ranks",
                     "all", "--", "sh", "-c", "echo up $RANK; exec sleep 120"));
    child_wait_for(&c, "[rank 1] up 1", 60000);
    kill(c.pid, SIGINT);
    child_wait_in(&c, 1, "detached", 10000);
    kill(c.pid, SIGINT); /* the second Ctrl-C within 2 s stops the run everywhere */
    child_finish(&c);
    expect_status(&c, 130, "two-node run after two Ctrl-C");
    const char *id = run_id_of(&c);
    const char *dirs[2] = {t.ra, t.rb};
    for (int i = 0; i < 2; i++) {
        json_t *st = gs_test_run_json(dirs[i], id, "status.json");
        assert_string_equal(str_at(st, "state"), "stopped");
        assert_false(group_exists(int_at(json_array_get(json_object_get(st, "ranks"), 0), "pgid")));
        json_decref(st);
    }
    child_release(&c);
    gs_test_sshd_destroy(&t.b);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*daemon*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_run__trainer_on_two_cpu_ranks_succeeds_with_logs_and_status,
                               use_home),
        cmocka_unit_test_setup(test_run__command_exit_code_is_the_runs, use_home),
        cmocka_unit_test_setup(test_run__a_command_that_cannot_start_exits_as_the_run_records,
                               use_home),
        cmocka_unit_test_setup(test_run__a_server_without_the_agent_gets_it_and_runs_once,
                               use_home),
        cmocka_unit_test_setup_teardown(test_run__with_watch_running_goes_through_the_daemon,
                                        use_home, stop_watch),
        cmocka_unit_test_setup_teardown(test_run__through_the_daemon_after_the_server_restarted,
                                        use_home, stop_watch),
        cmocka_unit_test_setup(test_run__one_rank_crashing_stops_the_others, use_home),
        cmocka_unit_test_setup(test_run__a_failure_is_summed_up_naming_the_rank, use_home),
        cmocka_unit_test_setup(test_run__max_restarts_two_restarts_twice_then_fails, use_home),
        cmocka_unit_test_setup(test_run__environment_contract_rank_by_rank, use_home),
        cmocka_unit_test_setup(test_run__a_jobs_gpus_from_the_config_are_used, use_home),
        cmocka_unit_test_setup(test_run__a_request_that_cannot_run_is_refused_before_the_sync,
                               use_home),
        cmocka_unit_test_setup(test_run__a_job_can_ask_for_cpu_ranks, use_home),
        cmocka_unit_test_setup(test_run__hundreds_of_cpu_ranks_run_and_too_many_are_refused_first,
                               use_home),
        cmocka_unit_test_setup(test_logs__ranks_interleave_in_the_order_they_printed, use_home),
        cmocka_unit_test_setup(test_logs__follow_with_tail_never_splits_a_line_being_written,
                               use_home),
        cmocka_unit_test(test_ps__a_lost_run_has_no_duration),
        cmocka_unit_test(test_ps__a_rank_stopped_by_a_signal_reads_paused_until_continued),
        cmocka_unit_test(test_ps__one_paused_rank_of_two_is_told_apart),
        cmocka_unit_test(test_stop__a_paused_rank_gets_sigterm_not_sigkill),
        cmocka_unit_test_setup(test_logs__a_run_the_server_lost_is_shown_from_the_local_copy,
                               use_home),
        cmocka_unit_test_setup(test_logs__json_is_refused_and_not_offered, use_home),
        cmocka_unit_test_setup(test_run__a_python_ranks_prints_stream_as_they_come, use_home),
        cmocka_unit_test_setup(test_run__a_progress_bar_without_newlines_shows_as_drawn, use_home),
        cmocka_unit_test_setup(
            test_run__a_run_whose_folder_was_removed_can_still_be_seen_and_stopped, use_home),
        cmocka_unit_test_setup(test_run__a_damaged_status_json_is_written_again_or_listed_damaged,
                               use_home),
        cmocka_unit_test_setup(test_run__ranks_failing_together_are_not_reported_stopped, use_home),
        cmocka_unit_test_setup(test_stop__a_rank_ignoring_term_says_what_stop_waits_for, use_home),
        cmocka_unit_test_setup(test_logs__following_a_quiet_run_does_not_spin_on_the_server,
                               use_home),
        cmocka_unit_test_setup(test_stop__ends_processes_a_proc_walk_misses, use_home),
        cmocka_unit_test_setup(test_run__the_trainers_first_build_says_each_step, use_home),
        cmocka_unit_test_setup_teardown(
            test_run__names_the_server_alike_with_and_without_the_daemon, use_home, stop_watch),
        cmocka_unit_test_setup(test_run__detach_reattach_and_stop_leaves_no_process, use_home),
        cmocka_unit_test_setup(test_stop__leaves_no_setsid_child_or_daemon_of_the_run, use_home),
        cmocka_unit_test_setup(test_stop__a_shared_name_stops_the_newest_run_still_running,
                               use_home),
        cmocka_unit_test_setup(test_logs__tail_rank_and_the_newest_run_by_default, use_home),
        cmocka_unit_test_setup(test_logs__a_rank_the_run_does_not_have_is_a_usage_error, use_home),
        cmocka_unit_test_setup(test_logs__a_one_rank_run_shows_bare_lines_as_run_does, use_home),
        cmocka_unit_test_setup(test_run__no_gpu_on_the_server_suggests_cpu_ranks, use_home),
        cmocka_unit_test_setup(test_run__follow_after_a_cut_connection_shows_every_line_once,
                               use_home),
        cmocka_unit_test_setup(test_run__a_second_ctrl_c_before_the_detach_message_stops_the_run,
                               use_home),
        cmocka_unit_test_setup(test_run__two_concurrent_runs_both_start_and_finish, use_home),
        cmocka_unit_test_setup(test_run__arguments_reach_the_command_unchanged, use_home),
        cmocka_unit_test_setup(test_run__two_nodes_share_the_master_and_connect_across, use_home),
        cmocka_unit_test_setup(test_run__two_nodes_one_failing_stops_the_other, use_home),
        cmocka_unit_test_setup(test_run__two_nodes_a_failure_shows_the_survivors_lines_once,
                               use_home),
        cmocka_unit_test_setup(test_run__two_nodes_one_unreachable_is_not_said_ended, use_home),
        cmocka_unit_test_setup(test_ps__a_launch_failing_on_node_1_shows_a_failed_run_on_its_nodes,
                               use_home),
        cmocka_unit_test_setup(test_logs__a_two_node_run_checks_rank_and_follows_from_the_tail,
                               use_home),
        cmocka_unit_test_setup(test_logs__a_two_node_run_with_a_node_cut_off_shows_what_it_can,
                               use_home),
        cmocka_unit_test_setup(test_run__two_nodes_second_ctrl_c_stops_every_node, use_home),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
