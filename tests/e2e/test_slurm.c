/* tests/e2e/test_slurm.c: gpusync on a Slurm cluster (issue 18), through the built CLI against a
 * real single-host Slurm (tests/fixtures/slurm-cluster.sh: munged, slurmctld and slurmd from
 * Debian's packages, private config, 4 CPUs and 2 fake GPUs) whose login node is the sandbox sshd
 * on this machine, so the job's files and processes can be inspected directly. Exits 77 with the
 * reason when Slurm cannot start here (ctest label `slurm`). */
#include <dirent.h>
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

static struct gs_test_sshd d; /* the login node */
static char slurm_dir[512];   /* the cluster's private folder (slurm.conf, state, logs) */
static char project[600];     /* the local project */
static char remote[700];      /* its directory on the "shared filesystem" (this machine) */

/* ---- helpers ---- */

/* A file of run `id` on the server, whole (malloc'd; "" when missing). */
static char *run_file(const char *id, const char *name)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/.gpusync/runs/%s/%s", remote, id, name);
    struct gs_buf buf = GS_BUF_INIT;
    FILE *fp = fopen(path, "r");
    char chunk[4096];
    size_t n;
    while (fp && (n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        gs_buf_add(&buf, chunk, n);
    if (fp)
        fclose(fp);
    gs_buf_grow(&buf, 0);
    return gs_buf_detach(&buf, NULL);
}

/* How many times `needle` occurs in `hay`. */
static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Starts a detached run of `script` as `tasks` CPU tasks; returns its run id (static). */
static const char *start_detached(const char *tasks, const char *script)
{
    static char id[128];
    json_t *j = gs_test_gpusync_json(
        project, ARGS("run", "--json", "--detach", "--cpu", tasks, "--", "sh", "-c", script), 0,
        "run --detach on Slurm");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(j, "id")));
    assert_non_null(json_string_value(json_object_get(j, "slurm_job_id")));
    json_decref(j);
    return id;
}

/* Run `id`'s row of `gpusync ps --json` (a new reference), or NULL. */
static json_t *ps_row(const char *id)
{
    json_t *ps = gs_test_gpusync_json(project, ARGS("ps", "--json"), 0, "ps"), *row, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(ps, "runs"), i, row)
    {
        if (!found && !strcmp(json_string_value(json_object_get(row, "id")), id))
            found = json_incref(row);
    }
    json_decref(ps);
    return found;
}

/* How many processes of Slurm job `job` exist (the cluster is this machine). */
static int job_processes(const char *job)
{
    char entry[100];
    snprintf(entry, sizeof(entry), "SLURM_JOB_ID=%s", job);
    return gs_test_count_env(entry);
}

/* Waits (polling with a deadline: a file on the shared filesystem raises no event here) until
 * `name` of run `id` contains `text`. */
static void await_in_file(const char *id, const char *name, const char *text)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    for (;;) {
        char *s = run_file(id, name);
        int found = strstr(s, text) != NULL;
        free(s);
        if (found)
            return;
        if (gs_clock_mono_ms() > end)
            fail_msg("%s of run %s never showed '%s'", name, id, text);
        usleep(50000);
    }
}

/* ---- setup ---- */

static int group_setup(void **state)
{
    (void)state;
    char env[700], target[64];
    snprintf(env, sizeof(env), "SLURM_CONF=%s/slurm.conf", slurm_dir);
    /* the login node's sessions find the cluster through SLURM_CONF, as a site's /etc would */
    if (gs_test_sshd_start_for_cli(&d) != 0 ||
        gs_test_sshd_fake_program(&d, "gpusync-test-slurm", "#!/bin/sh\n", env) != 0)
        return -1;
    snprintf(project, sizeof(project), "%s/work/proj", d.dir);
    snprintf(remote, sizeof(remote), "%s/shared/proj", d.dir);
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", d.port);
    if (gs_test_sh("mkdir -p '%s'", project) != 0)
        return -1;
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("init", target, "--path", remote), CMD_MS);
    int ok = r.status == 0 && gs_test_sh("cd '%s' && sed -i 's|^\\[remote\\]$|[remote]\\n"
                                         "\\tscheduler = slurm\\n\\tpartition = debug|' "
                                         ".gpusync/config",
                                         project) == 0;
    if (!ok)
        fprintf(stderr, "init failed (%d): %s%s\n", r.status, r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&d);
    return 0;
}

/* ---- tests ---- */

static void test_slurm__two_tasks_run_with_the_torchrun_environment(void **state)
{
    (void)state;
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL,
        ARGS("run", "--cpu", "2", "--", "sh", "-c",
             "echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE MA=$MASTER_ADDR "
             "MP=$MASTER_PORT."),
        CMD_MS);
    gs_test_expect_status(&r, 0, "a 2-task Slurm run");
    char host[256], want[400], id[128];
    gethostname(host, sizeof(host));
    host[strcspn(host, ".")] = 0;
    const char *p = strstr(r.err.data, "gpusync: run ");
    if (!p || sscanf(p, "gpusync: run %127s submitted", id) != 1)
        fail_msg("no run id on stderr: %s", r.err.data);
    for (int rank = 0; rank < 2; rank++) { /* each task's own log, written by srun --output */
        char name[32], *log;
        snprintf(name, sizeof(name), "rank%d.log", rank);
        snprintf(want, sizeof(want), "R=%d L=%d W=2 LW=2 MA=%s MP=", rank, rank, host);
        log = run_file(id, name);
        assert_non_null(strstr(log, want));
        assert_null(strstr(log, "MP=."));
        free(log);
        assert_int_equal(count(r.out.data, want), 1);
    }
    char *script = run_file(id, "job.sbatch"); /* kept for the user */
    assert_non_null(strstr(script, "#SBATCH --ntasks-per-node=2"));
    assert_non_null(strstr(script, "#SBATCH --partition=debug"));
    free(script);
    gs_test_result_release(&r);
}

static void test_slurm__gpu_tasks_one_per_gpu_see_the_nodes_gpus(void **state)
{
    (void)state;
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL,
        ARGS("run", "--gpus-per-node", "2", "--", "sh", "-c",
             "echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE CVD=$CUDA_VISIBLE_DEVICES."),
        CMD_MS);
    gs_test_expect_status(&r, 0, "a Slurm run with one task per GPU");
    /* every task sees the job's GPUs of its node, as under torchrun: LOCAL_RANK picks one */
    assert_int_equal(count(r.out.data, "R=0 L=0 W=2 CVD=0,1."), 1);
    assert_int_equal(count(r.out.data, "R=1 L=1 W=2 CVD=0,1."), 1);
    gs_test_result_release(&r);
}

static void test_slurm__a_failing_task_fails_the_job_and_run_exits_with_its_code(void **state)
{
    (void)state;
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL,
        ARGS("run", "--cpu", "2", "--", "sh", "-c", "if [ $RANK = 1 ]; then exit 7; fi; sleep 30"),
        CMD_MS);
    char id[128];
    const char *p = strstr(r.err.data, "gpusync: run ");
    if (!p || sscanf(p, "gpusync: run %127s submitted", id) != 1)
        fail_msg("no run id on stderr: %s", r.err.data);
    gs_test_expect_status(&r, 7, "a Slurm run whose task 1 exits 7");
    json_t *row = ps_row(id); /* the scheduler's own account of the job */
    assert_non_null(row);
    assert_string_equal(json_string_value(json_object_get(row, "state")), "FAILED");
    assert_int_equal(json_integer_value(json_object_get(row, "exit_code")), 7);
    json_decref(row);
    gs_test_result_release(&r);
}

static void test_slurm__stop_cancels_a_running_job_and_leaves_nothing(void **state)
{
    (void)state;
    const char *id = start_detached("2", "echo up; sleep 300");
    await_in_file(id, "rank1.log", "up");
    char *job = run_file(id, "slurm_job_id");
    job[strcspn(job, "\n")] = 0;
    assert_true(job_processes(job) > 0);
    json_t *j = gs_test_gpusync_json(project, ARGS("stop", "--json", id), 0, "stop");
    assert_string_equal(json_string_value(json_object_get(j, "state")), "CANCELLED");
    assert_string_equal(json_string_value(json_object_get(j, "slurm_job_id")), job);
    json_decref(j);
    assert_int_equal(job_processes(job), 0); /* the scheduler let it go: nothing of it is left */
    free(job);
}

/* Waits (polling the scheduler through ps, which has no event to wait for) until run `id` is
 * pending for a reason the scheduler gave ("None" until it first looked), which it returns
 * (static). */
static const char *await_pending_reason(const char *id)
{
    static char reason[64];
    int64_t end = gs_clock_mono_ms() + 30000;
    for (;;) {
        json_t *row = ps_row(id);
        assert_non_null(row);
        assert_string_equal(json_string_value(json_object_get(row, "state")), "PENDING");
        snprintf(reason, sizeof(reason), "%s", json_string_value(json_object_get(row, "reason")));
        json_decref(row);
        if (strcmp(reason, "None") != 0)
            return reason;
        if (gs_clock_mono_ms() > end)
            fail_msg("run %s stayed pending with no reason", id);
        usleep(200000);
    }
}

/* Starts gpusync with `args` in the project, in the background; its pipes in fds[0] (stdout),
 * fds[1] (stderr). */
static pid_t start_gpusync(const char *const *args, int fds[2])
{
    int out[2], err[2];
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(err), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (chdir(project) != 0)
            _exit(127);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        gs_test_exec_gpusync(args);
    }
    close(out[1]);
    close(err[1]);
    fds[0] = out[0];
    fds[1] = err[0];
    return pid;
}

/* Reads `fd` into `into` until it contains `text` (or a 30 s deadline passes: fails). */
static void await_output(int fd, struct gs_buf *into, const char *text)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    while (!into->data || !strstr(into->data, text)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char chunk[4096];
        if (gs_clock_mono_ms() > end || poll(&p, 1, 1000) < 0)
            fail_msg("never saw '%s' in: %s", text, into->data ? into->data : "");
        ssize_t n = p.revents ? read(fd, chunk, sizeof(chunk)) : 0;
        if (p.revents && n <= 0)
            fail_msg("output ended without '%s': %s", text, into->data ? into->data : "");
        gs_buf_add(into, chunk, n > 0 ? (size_t)n : 0);
        gs_buf_grow(into, 0);
    }
}

static void test_slurm__a_job_that_must_wait_shows_pending_with_its_reason_then_runs(void **state)
{
    (void)state;
    /* every CPU of the node, until the test lets it go */
    const char *busy = start_detached("4", "while [ ! -f release ]; do sleep 0.1; done");
    char hold[128], path[900];
    snprintf(hold, sizeof(hold), "%s", busy);
    await_in_file(hold, "status.json", "running");
    const char *id = start_detached("2", "echo ran $RANK");
    char reason[64];
    snprintf(reason, sizeof(reason), "%s", await_pending_reason(id));
    int fds[2];
    struct gs_buf err = GS_BUF_INIT;
    pid_t pid = start_gpusync(ARGS("logs", "-f", id), fds);
    char want[128];
    snprintf(want, sizeof(want), ") pending: %s\n", reason);
    await_output(fds[1], &err, want); /* what the scheduler said, as the user sees it */
    snprintf(path, sizeof(path), "%s/release", remote);
    assert_int_equal(gs_test_sh("touch '%s'", path), 0);
    struct gs_test_result r = gs_test_finish(pid, fds[0], fds[1], CMD_MS);
    gs_test_expect_status(&r, 0, "logs -f of a pending Slurm run");
    assert_int_equal(count(r.out.data, "ran 0"), 1);
    assert_int_equal(count(r.out.data, "ran 1"), 1);
    unlink(path);
    gs_buf_release(&err);
    gs_test_result_release(&r);
}

static void test_slurm__ctrl_c_detaches_and_the_job_keeps_running(void **state)
{
    (void)state;
    int fds[2];
    struct gs_buf out = GS_BUF_INIT;
    pid_t pid =
        start_gpusync(ARGS("run", "--cpu", "2", "--", "sh", "-c", "echo up $RANK; sleep 300"), fds);
    await_output(fds[0], &out, "up 1");
    kill(pid, SIGINT);
    struct gs_test_result r = gs_test_finish(pid, fds[0], fds[1], CMD_MS);
    gs_test_expect_status(&r, 130, "Ctrl-C during a Slurm run");
    char id[128];
    const char *p = strstr(r.err.data, "gpusync: run ");
    if (!p || sscanf(p, "gpusync: run %127s submitted", id) != 1)
        fail_msg("no run id on stderr: %s", r.err.data);
    json_t *row = ps_row(id); /* detached: the scheduler still runs it */
    assert_non_null(row);
    assert_string_equal(json_string_value(json_object_get(row, "state")), "RUNNING");
    json_decref(row);
    gs_test_gpusync_ok(project, ARGS("stop", id), "stop after the detach");
    gs_buf_release(&out);
    gs_test_result_release(&r);
}

static void test_slurm__logs_f_after_a_detach_shows_every_line_once(void **state)
{
    (void)state;
    const char *id = start_detached(
        "2", "i=0; while [ $i -lt 30 ]; do echo line $RANK.$i.; i=$((i + 1)); sleep 0.05; done");
    await_in_file(id, "rank0.log", "line 0.3.");
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, ARGS("logs", "-f", id), CMD_MS);
    gs_test_expect_status(&r, 0, "logs -f of a detached Slurm run");
    for (int rank = 0; rank < 2; rank++)
        for (int i = 0; i < 30; i++) {
            char line[64];
            snprintf(line, sizeof(line), "line %d.%d.", rank, i);
            if (count(r.out.data, line) != 1)
                fail_msg("'%s' appears %d times in:\n%s", line, count(r.out.data, line),
                         r.out.data);
        }
    gs_test_result_release(&r);
}

static void test_slurm__the_bundled_trainer_runs_unchanged_on_two_tasks(void **state)
{
    (void)state;
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL,
        ARGS("run", "--cpu", "2", "train", "--", "--epochs", "1", "--limit-train", "2000"),
        CMD_MS * 3);
    gs_test_expect_status(&r, 0, "the trainer on 2 Slurm tasks");
    assert_non_null(strstr(r.out.data, "2 rank(s)")); /* WORLD_SIZE from SLURM_NTASKS */
    assert_non_null(strstr(r.out.data, "epoch   1/1 |"));
    gs_test_result_release(&r);
}

/* `doctor`'s check named `name` (borrowed from `doc`), or NULL. */
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

static void test_slurm__doctor_checks_sinfo_and_the_partition_and_counts_idle_cpus(void **state)
{
    (void)state;
    json_t *doc = gs_test_gpusync_json(project, ARGS("doctor", "--json"), 0, "doctor");
    json_t *c = doctor_check(doc, "slurm");
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "status")), "ok");
    const char *detail = json_string_value(json_object_get(c, "detail"));
    assert_non_null(strstr(detail, "partition debug: up"));
    assert_non_null(strstr(detail, "of 4 CPUs idle"));
    json_decref(doc);
    assert_int_equal(gs_test_sh("sed -i 's/partition = debug/partition = nosuch/' "
                                "'%s/.gpusync/config'",
                                project),
                     0);
    doc = gs_test_gpusync_json(project, ARGS("doctor", "--json"), 1, "doctor, no such partition");
    c = doctor_check(doc, "slurm");
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "status")), "fail");
    assert_non_null(strstr(json_string_value(json_object_get(c, "detail")), "nosuch: not found"));
    json_decref(doc);
    assert_int_equal(gs_test_sh("sed -i 's/partition = nosuch/partition = debug/' "
                                "'%s/.gpusync/config'",
                                project),
                     0);
}

/* Starts the cluster; exits 77 with Slurm's reason when it cannot start here. */
static void start_cluster(void)
{
    char cmd[1200];
    snprintf(slurm_dir, sizeof(slurm_dir), "/tmp/gs-slurm-XXXXXX");
    if (!mkdtemp(slurm_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(cmd, sizeof(cmd), "'%s' start '%s' 4",
             gs_test_source_path("tests/fixtures/slurm-cluster.sh"), slurm_dir);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (rc != 0) {
        fprintf(stderr, "test_slurm: %s (Slurm could not start: %d)\n",
                rc == 77 ? "skipped" : "failed", rc);
        gs_test_sh("'%s' stop '%s'; rm -rf '%s'",
                   gs_test_source_path("tests/fixtures/slurm-cluster.sh"), slurm_dir, slurm_dir);
        exit(rc == 77 ? 77 : 1);
    }
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    start_cluster();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slurm__two_tasks_run_with_the_torchrun_environment),
        cmocka_unit_test(test_slurm__gpu_tasks_one_per_gpu_see_the_nodes_gpus),
        cmocka_unit_test(test_slurm__a_failing_task_fails_the_job_and_run_exits_with_its_code),
        cmocka_unit_test(test_slurm__stop_cancels_a_running_job_and_leaves_nothing),
        cmocka_unit_test(test_slurm__a_job_that_must_wait_shows_pending_with_its_reason_then_runs),
        cmocka_unit_test(test_slurm__ctrl_c_detaches_and_the_job_keeps_running),
        cmocka_unit_test(test_slurm__logs_f_after_a_detach_shows_every_line_once),
        cmocka_unit_test(test_slurm__the_bundled_trainer_runs_unchanged_on_two_tasks),
        cmocka_unit_test(test_slurm__doctor_checks_sinfo_and_the_partition_and_counts_idle_cpus),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    gs_test_sh("'%s' stop '%s'; rm -rf '%s'",
               gs_test_source_path("tests/fixtures/slurm-cluster.sh"), slurm_dir, slurm_dir);
    return failed;
}
