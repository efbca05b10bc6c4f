/* tests/e2e/test_gpus.c: GPU accounting of `gpusync run` (issue 16) through the built CLI,
 * against the sandbox sshd with a fake 4-GPU nvidia-smi first on the server's PATH (this machine
 * has no GPU) and its own GPU lock directory: concurrent runs get disjoint GPUs, a run that
 * cannot get them is refused naming the holders or queues with --wait (and Ctrl-C gives up
 * cleanly), a supervisor killed -9 frees its GPUs, --cpu ranks see no GPU and get NODE_RANK, and
 * ps shows each run's GPUs. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define ARGS     GS_TEST_ARGS
#define LIMIT_MS 60000
#define ALL_FOUR 0xf
/* A rank that holds its GPUs until the test creates the gate file named by its argument (or the
 * sandbox is gone, after a failed test). */
#define HOLD                                                                                       \
    "echo CVD=$CUDA_VISIBLE_DEVICES; while [ ! -e \"$0\" ] && [ -d \"$PWD\" ]; do sleep 0.05; "    \
    "done"

/* What gpusync's query (index,memory.used) gets: 4 GPUs, GPU 2 the least busy, then 1, 0, 3. */
static const char fake_nvidia_smi[] = "#!/bin/sh\n"
                                      "case \"$*\" in *--query-gpu=index,memory.used*) ;; "
                                      "*) exit 9 ;; esac\n"
                                      "printf '0, 300\\n1, 20\\n2, 10\\n3, 400\\n'\n";

static struct gs_test_sshd srv;
static char project[600]; /* a local project initialised against srv */
static char remote[700];  /* its remote directory (the server is this machine) */

/* ---- a gpusync that runs while the test goes on ---- */

struct bg {
    pid_t pid;
    int out, err;
    struct gs_test_result r;
};

static void bg_start(struct bg *b, const char *const *args)
{
    int out[2], err[2];
    memset(b, 0, sizeof(*b));
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    b->pid = fork();
    assert_true(b->pid >= 0);
    if (b->pid == 0) {
        setsid(); /* no terminal; the test's SIGINT reaches this process only */
        if (chdir(project) != 0)
            _exit(126);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        gs_test_exec_gpusync(args);
    }
    close(out[1]);
    close(err[1]);
    b->out = out[0];
    b->err = err[0];
}

/* Reads both pipes until stderr holds `needle`; fails the test after LIMIT_MS or at EOF. */
static void bg_await_stderr(struct bg *b, const char *needle)
{
    int64_t end = gs_clock_mono_ms() + LIMIT_MS;
    while (!(b->r.err.data && strstr(b->r.err.data, needle))) {
        struct pollfd p[2] = {{b->out, POLLIN, 0}, {b->err, POLLIN, 0}};
        int64_t left = end - gs_clock_mono_ms();
        if (left <= 0 || poll(p, 2, (int)left) <= 0)
            fail_msg("'%s' not on stderr: %s", needle, b->r.err.data ? b->r.err.data : "");
        for (int i = 0; i < 2; i++) {
            char chunk[4096];
            ssize_t n = p[i].revents ? read(p[i].fd, chunk, sizeof(chunk)) : -1;
            if (n > 0)
                gs_buf_add(i ? &b->r.err : &b->r.out, chunk, (size_t)n);
            else if (n == 0)
                fail_msg("gpusync ended before '%s': %s", needle, b->r.err.data);
        }
    }
}

/* Reads to the end, reaps the process and returns its exit status. */
static int bg_finish(struct bg *b)
{
    int st;
    gs_test_drain(b->pid, b->out, b->err, &b->r, LIMIT_MS);
    assert_int_equal(waitpid(b->pid, &st, 0), b->pid);
    b->r.status = gs_test_exit_status(st);
    return b->r.status;
}

/* ---- the runs on the server ---- */

/* Starts a detached run with `gpus` GPUs that holds them until gate file `gate` exists; returns
 * its `run --json` line (a new reference). */
static json_t *start_holder(const char *gpus, const char *gate)
{
    return gs_test_gpusync_json(project,
                                ARGS("run", "--json", "--detach", "--no-sync", "--gpus", gpus, "--",
                                     "sh", "-c", HOLD, gate),
                                0, "a detached run holding GPUs");
}

/* The run's GPUs, as a bit set; fails the test when `arr` is not an array of GPU numbers. */
static int gpu_set(json_t *arr)
{
    size_t i;
    json_t *g;
    int set = 0;
    if (!json_is_array(arr))
        fail_msg("gpus is not an array");
    json_array_foreach(arr, i, g)
    {
        assert_true(json_is_integer(g) && json_integer_value(g) >= 0 && json_integer_value(g) < 4);
        set |= 1 << json_integer_value(g);
    }
    return set;
}

static const char *id_of(json_t *line)
{
    const char *id = json_string_value(json_object_get(line, "id"));
    assert_non_null(id);
    return id;
}

/* Opens the gate of a holder, and waits (`stop`, which returns once no process of the run is
 * left) until it has let its GPUs go. */
static void end_holder(json_t *line, const char *gate)
{
    assert_int_equal(gs_test_sh("touch '%s/%s'", remote, gate), 0);
    gs_test_gpusync_ok(project, ARGS("stop", id_of(line)), "stop a holder");
}

/* The `ps --json` run object of `id`, or NULL (borrowed from *ps, which the caller frees). */
static json_t *ps_entry(json_t **ps, const char *id)
{
    size_t i;
    json_t *r;
    *ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps --json");
    json_array_foreach(json_object_get(*ps, "runs"), i, r)
    {
        if (!strcmp(json_string_value(json_object_get(r, "id")), id))
            return r;
    }
    return NULL;
}

/* A failed run: the exit status and both streams. */
static struct gs_test_result run_refused(const char *const *args)
{
    struct gs_test_result r = gs_test_run_gpusync(project, NULL, NULL, args, LIMIT_MS);
    if (r.status == 0)
        fail_msg("started although its GPUs are held: %s", r.err.data);
    return r;
}

/* Waits (polling /proc: there is no event for a process that is not our child) until `pid` has
 * exited; a zombie counts, as it holds no lock and runs nothing. Returns 1, or 0 after 10 s. */
static int exited(long pid)
{
    int64_t end = gs_clock_mono_ms() + 10000;
    for (;;) {
        char path[64], buf[512] = "";
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        FILE *fp = fopen(path, "r");
        size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
        if (fp)
            fclose(fp);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        if (!fp || (paren && paren[1] == ' ' && paren[2] == 'Z'))
            return 1;
        if (gs_clock_mono_ms() > end)
            return 0;
        usleep(20000);
    }
}

/* The pid of the `gpusync-agent launch` of run `id` on this machine, or 0. */
static long launcher_of(const char *id)
{
    char cmd[300], out[64] = "";
    snprintf(cmd, sizeof(cmd), "pgrep -f -- 'gpusync-agent.* launch .*--id %s ' | head -1", id);
    FILE *fp = popen(cmd, "r");
    if (fp && !fgets(out, sizeof(out), fp))
        out[0] = '\0';
    if (fp)
        pclose(fp);
    return atol(out);
}

/* ---- tests ---- */

/* The bug of issue 16: two --gpus 2 runs were both given GPUs 1 and 3. */
static void test_gpus__two_concurrent_runs_get_disjoint_gpus_and_ps_shows_them(void **state)
{
    (void)state;
    json_t *a = start_holder("2", "gate-a1"), *b = start_holder("2", "gate-b1");
    int sa = gpu_set(json_object_get(a, "gpus")), sb = gpu_set(json_object_get(b, "gpus"));
    assert_int_equal(__builtin_popcount(sa), 2);
    assert_int_equal(__builtin_popcount(sb), 2);
    assert_int_equal(sa & sb, 0);
    /* the least busy first (the fake nvidia-smi: GPU 2, then 1, then 0, then 3) */
    assert_int_equal(sa, 1 << 1 | 1 << 2);
    json_t *meta = gs_test_run_json(remote, id_of(b), "meta.json"), *ps;
    assert_int_equal(gpu_set(json_object_get(meta, "gpus")), sb);
    json_t *entry = ps_entry(&ps, id_of(a));
    assert_non_null(entry);
    assert_int_equal(gpu_set(json_object_get(entry, "gpus")), sa);
    json_decref(ps);
    /* the table's GPUS column: RUN NAME STATE NODES RANKS GPUS ... */
    struct gs_test_result t = gs_test_run_gpusync(project, NULL, NULL, ARGS("ps"), LIMIT_MS);
    gs_test_expect_status(&t, 0, "ps");
    const char *row = strstr(t.out.data, id_of(a));
    char gpus[32] = "";
    assert_non_null(row);
    assert_int_equal(sscanf(row, "%*s %*s %*s %*d %*d %31s", gpus), 1);
    assert_string_equal(gpus, "1,2");
    gs_test_result_release(&t);
    end_holder(a, "gate-a1");
    end_holder(b, "gate-b1");
    json_decref(meta);
    json_decref(a);
    json_decref(b);
}

/* Not enough free GPUs: refused, naming who holds them, and nothing started; with --wait the run
 * queues, says so, and starts on the GPUs of the run that ends. */
static void test_gpus__a_run_without_free_gpus_is_refused_or_waits_with_wait(void **state)
{
    (void)state;
    json_t *a = start_holder("2", "gate-a2"), *b = start_holder("2", "gate-b2"), *ps;
    struct gs_test_result r = run_refused(ARGS("run", "--no-sync", "--gpus", "1", "--", "true"));
    assert_non_null(strstr(r.err.data, id_of(a)));
    assert_non_null(strstr(r.err.data, id_of(b)));
    assert_non_null(strstr(r.err.data, remote));
    gs_test_result_release(&r);
    /* explicit GPUs: only their holder is named (b holds 0 and 3) */
    r = run_refused(ARGS("run", "--no-sync", "--gpus", "0,3", "--", "true"));
    assert_non_null(strstr(r.err.data, id_of(b)));
    if (strstr(r.err.data, id_of(a)))
        fail_msg("names %s: %s", id_of(a), r.err.data);
    gs_test_result_release(&r);
    ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps --json");
    size_t runs = json_array_size(json_object_get(ps, "runs"));
    json_decref(ps);

    struct bg w;
    bg_start(&w, ARGS("run", "--no-sync", "--wait", "--gpus", "2", "--", "sh", "-c",
                      "echo CVD=$CUDA_VISIBLE_DEVICES"));
    bg_await_stderr(&w, " waiting for 2 free GPUs");
    ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps --json");
    assert_int_equal(json_array_size(json_object_get(ps, "runs")), runs); /* not started */
    json_decref(ps);
    end_holder(a, "gate-a2");
    if (bg_finish(&w) != 0)
        fail_msg("the queued run: exit %d\n%s", w.r.status, w.r.err.data);
    assert_non_null(strstr(w.r.out.data, "[rank 0] CVD=1,2\n"));
    assert_non_null(strstr(w.r.out.data, "[rank 1] CVD=1,2\n"));
    /* it started after a ended */
    char id[128];
    assert_int_equal(sscanf(strstr(w.r.err.data, "gpusync: run "), "gpusync: run %127s", id), 1);
    json_t *ws = gs_test_run_json(remote, id, "status.json"),
           *as = gs_test_run_json(remote, id_of(a), "status.json");
    assert_true(strcmp(json_string_value(json_object_get(ws, "start")),
                       json_string_value(json_object_get(as, "end"))) >= 0);
    end_holder(b, "gate-b2");
    json_decref(ws);
    json_decref(as);
    gs_test_result_release(&w.r);
    json_decref(a);
    json_decref(b);
}

/* Ctrl-C while queued gives up: the launcher on the server ends, and the run never starts. */
static void test_gpus__ctrl_c_while_waiting_starts_nothing(void **state)
{
    (void)state;
    json_t *a = start_holder("4", "gate-c");
    struct bg w;
    bg_start(&w, ARGS("run", "--no-sync", "--wait", "--gpus", "1", "--", "true"));
    bg_await_stderr(&w, " waiting for 1 free GPU");
    char id[128];
    assert_int_equal(sscanf(strstr(w.r.err.data, "gpusync: run "), "gpusync: run %127s", id), 1);
    long launcher = launcher_of(id);
    assert_true(launcher > 0);
    kill(w.pid, SIGINT);
    assert_int_equal(bg_finish(&w), 130);
    assert_true(exited(launcher));
    end_holder(a, "gate-c"); /* its GPUs are free now: a launcher still waiting would start */
    char dir[1200];
    snprintf(dir, sizeof(dir), "%s/.gpusync/runs/%s", remote, id);
    assert_int_not_equal(access(dir, F_OK), 0);
    gs_test_result_release(&w.r);
    json_decref(a);
}

/* A reservation ends with its supervisor, however it ends. */
static void test_gpus__a_supervisor_killed_hard_frees_its_gpus(void **state)
{
    (void)state;
    json_t *a = start_holder("4", "gate-k");
    assert_int_equal(gpu_set(json_object_get(a, "gpus")), ALL_FOUR);
    struct gs_test_result r = run_refused(ARGS("run", "--no-sync", "--gpus", "1", "--", "true"));
    gs_test_result_release(&r);
    json_t *st = gs_test_run_json(remote, id_of(a), "status.json");
    long sup = (long)json_integer_value(json_object_get(st, "supervisor_pid"));
    assert_true(sup > 1);
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    assert_true(exited(sup));
    gs_test_gpusync_ok(project, ARGS("run", "--no-sync", "--gpus", "4", "--", "true"),
                       "a run of all four GPUs after the holder's supervisor was killed");
    gs_test_gpusync_ok(project, ARGS("stop", id_of(a)), "stop the lost run"); /* its ranks */
    json_decref(st);
    json_decref(a);
}

/* CPU ranks see no GPU (CUDA_VISIBLE_DEVICES set and empty), and NODE_RANK is the node's rank. */
static void test_gpus__cpu_ranks_see_no_gpu_and_get_node_rank(void **state)
{
    (void)state;
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL,
        ARGS("run", "--no-sync", "--cpu", "2", "--", "sh", "-c",
             "echo \"CVD=[${CUDA_VISIBLE_DEVICES-unset}] NODE_RANK=${NODE_RANK-unset}\""),
        LIMIT_MS);
    gs_test_expect_status(&r, 0, "run --cpu 2");
    assert_non_null(strstr(r.out.data, "[rank 0] CVD=[] NODE_RANK=0\n"));
    assert_non_null(strstr(r.out.data, "[rank 1] CVD=[] NODE_RANK=0\n"));
    gs_test_result_release(&r);
}

/* ---- group ---- */

/* The sandbox server, with a fake nvidia-smi (4 GPUs, GPU 2 the least busy, then 1, 0, 3) first
 * on its PATH and a GPU lock directory of its own (other suites may hold GPUs meanwhile). */
static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&srv) != 0)
        return -1;
    snprintf(project, sizeof(project), "%s/work/proj", srv.dir);
    snprintf(remote, sizeof(remote), "%s/remote proj", srv.dir);
    char locks[600];
    snprintf(locks, sizeof(locks), "GPUSYNC_GPU_LOCK_DIR=%s/gpu-locks", srv.dir);
    if (gs_test_sh("mkdir -p '%s'", project) != 0 ||
        gs_test_sshd_fake_program(&srv, "nvidia-smi", fake_nvidia_smi, locks) != 0)
        return -1;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", srv.port);
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("init", target, "--path", remote), LIMIT_MS);
    int ok = r.status == 0;
    if (!ok)
        fprintf(stderr, "init failed (%d): %s%s\n", r.status, r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

/* Stops whatever a failed test left running: its GPUs would fail the next tests too. */
static int stop_leftovers(void **state)
{
    (void)state;
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("ps", "--json"), LIMIT_MS);
    json_t *ps = json_loads(r.out.data, 0, NULL), *run;
    size_t i;
    json_array_foreach(json_object_get(ps, "runs"), i, run)
    {
        const char *id = json_string_value(json_object_get(run, "id"));
        if (id && strcmp(json_string_value(json_object_get(run, "state")), "running") == 0) {
            struct gs_test_result s =
                gs_test_run_gpusync(project, NULL, NULL, ARGS("stop", id), LIMIT_MS);
            gs_test_result_release(&s);
        }
    }
    json_decref(ps);
    gs_test_result_release(&r);
    return 0;
}

static int group_teardown(void **state)
{
    stop_leftovers(state);
    gs_test_sshd_destroy(&srv);
    return 0;
}

int main(void)
{
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*wait*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(
            test_gpus__two_concurrent_runs_get_disjoint_gpus_and_ps_shows_them, stop_leftovers),
        cmocka_unit_test_teardown(test_gpus__a_run_without_free_gpus_is_refused_or_waits_with_wait,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_gpus__ctrl_c_while_waiting_starts_nothing, stop_leftovers),
        cmocka_unit_test_teardown(test_gpus__a_supervisor_killed_hard_frees_its_gpus,
                                  stop_leftovers),
        cmocka_unit_test(test_gpus__cpu_ranks_see_no_gpu_and_get_node_rank),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
