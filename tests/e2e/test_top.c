/* tests/e2e/test_top.c: `gpusync top` against the sandbox sshd: a fake two-GPU nvidia-smi on the
 * server's PATH (CI has no GPU) reaches --json with every field, a run's ranks and the trainer's
 * samples/s show, a real disk write load shows as write MB/s on the disk that takes it, and
 * Ctrl-C exits 0 and leaves no sampler on the server, with or without the watch daemon. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define TIMEOUT_MS 60000
/* The load below writes at hundreds of MB/s or more on any real disk; an idle CI disk stays
 * far below this, so only the load can pass it. */
#define WRITE_LOAD_MIN_MB_S 50.0

/* What the fake nvidia-smi answers to gpusync's query (csv,noheader,nounits), as a real one
 * does, "[N/A]" included; GPU 1's name holds escape sequences (dash's echo makes the bytes), which
 * must never reach the user's terminal as such. */
static const char fake_nvidia_smi[] =
    "#!/bin/sh\n"
    "case \"$*\" in *--query-gpu=index,name,utilization.gpu,memory.used,memory.total,"
    "power.draw,temperature.gpu*) ;; *) exit 9 ;; esac\n"
    "echo '0, NVIDIA H100 80GB HBM3, 87, 31948, 81559, 250.12, 64'\n"
    "echo '1, Evil \\033]0;pwned\\007\\033[31mGPU, 3, 1024, 81559, [N/A], 41'\n";

static struct gs_test_sshd server;
static char base[64], project[128], remote[128];

static struct gs_test_result gpusync(const char *const *args)
{
    return gs_test_run_gpusync(project, NULL, NULL, args, TIMEOUT_MS);
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&server) != 0)
        return -1;
    snprintf(base, sizeof(base), "/tmp/gs-test-top.XXXXXX");
    if (!mkdtemp(base))
        return -1;
    snprintf(project, sizeof(project), "%s/proj", base);
    snprintf(remote, sizeof(remote), "%s/remote", base);
    mkdir(project, 0755);
    if (gs_test_sshd_fake_program(&server, "nvidia-smi", fake_nvidia_smi, NULL) != 0)
        return -1;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", server.port);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("init", target, "--path", remote));
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

/* ---- reading samples ----------------------------------------------------------------------- */

/* The lines of a `top --json` run, each checked to be a contract object. New reference. */
static json_t *samples_of(const struct gs_test_result *r, size_t want)
{
    json_t *all = json_array();
    for (const char *p = r->out.data, *nl; p && (nl = strchr(p, '\n')); p = nl + 1) {
        json_error_t e;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &e);
        if (!o)
            fail_msg("top --json printed a line that is not JSON (%s): %.*s", e.text, (int)(nl - p),
                     p);
        assert_int_equal(json_integer_value(json_object_get(o, "v")), 1);
        assert_true(json_is_true(json_object_get(o, "ok")));
        json_array_append_new(all, o);
    }
    if (json_array_size(all) != want)
        fail_msg("top --json printed %zu samples, not %zu\nstdout: %s\nstderr: %s",
                 json_array_size(all), want, r->out.data, r->err.data);
    return all;
}

static double num_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("\"%s\" is not a number in %s", key, json_dumps(o, JSON_COMPACT));
    return json_number_value(v);
}

static json_t *run_top_json(const char *count, const char *interval)
{
    struct gs_test_result r =
        gpusync(GS_TEST_ARGS("top", "--json", "--count", count, "--interval", interval));
    gs_test_expect_status(&r, 0, "top --json");
    json_t *samples = samples_of(&r, (size_t)atoi(count));
    gs_test_result_release(&r);
    return samples;
}

/* ---- GPUs and the run ------------------------------------------------------------------- */

static void expect_fake_gpus(json_t *sample)
{
    json_t *gpus = json_object_get(sample, "gpus");
    assert_int_equal(json_array_size(gpus), 2);
    json_t *g0 = json_array_get(gpus, 0), *g1 = json_array_get(gpus, 1);
    assert_int_equal(num_at(g0, "index"), 0);
    assert_string_equal(json_string_value(json_object_get(g0, "name")), "NVIDIA H100 80GB HBM3");
    assert_int_equal(num_at(g0, "util_pct"), 87);
    assert_int_equal(num_at(g0, "mem_used_mib"), 31948);
    assert_int_equal(num_at(g0, "mem_total_mib"), 81559);
    assert_true(num_at(g0, "power_w") > 250.0 && num_at(g0, "power_w") < 250.2);
    assert_int_equal(num_at(g0, "temp_c"), 64);
    assert_int_equal(num_at(g1, "index"), 1);
    assert_int_equal(num_at(g1, "util_pct"), 3);
    assert_true(json_is_null(json_object_get(g1, "power_w"))); /* nvidia-smi said [N/A] */
    assert_true(json_is_null(json_object_get(sample, "gpu_error")));
    const char *summary = json_string_value(json_object_get(sample, "gpu_summary"));
    assert_non_null(summary);
    if (!strstr(summary, "GPU0 87% 31.2/79.6 GiB 250 W 64\xc2\xb0"
                         "C | GPU1 3% 1.0/79.6 GiB - W 41"))
        fail_msg("gpu_summary: %s", summary);
}

static void expect_host_fields(json_t *sample)
{
    json_t *cpu = json_object_get(sample, "cpu"), *mem = json_object_get(sample, "memory");
    assert_true(num_at(cpu, "cores") >= 1);
    assert_true(num_at(cpu, "util_pct") >= 0 && num_at(cpu, "util_pct") <= 100);
    assert_true(num_at(cpu, "load1") >= 0);
    assert_true(num_at(mem, "total_mib") > 0);
    assert_true(json_is_array(json_object_get(sample, "disks")));
    assert_true(json_is_array(json_object_get(sample, "net")));
}

/* A detached run whose rank 0 prints the bundled trainer's epoch line, then waits. Returns its
 * id (static). */
static const char *start_run_printing_samples_per_s(void)
{
    static char id[128];
    json_t *o = gs_test_gpusync_json(
        project,
        GS_TEST_ARGS("run", "--json", "--no-sync", "--detach", "--cpu", "2", "--", "sh", "-c",
                     "[ $RANK = 0 ] && echo 'epoch   1/3 | train loss 0.5012 | train acc 0.8200 | "
                     "test acc 0.8100 | 51234 samples/s | 1.17 s'; exec sleep 60"),
        0, "run --detach");
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(o, "id")));
    json_decref(o);
    return id;
}

static void expect_run(json_t *sample, const char *id)
{
    json_t *run = json_object_get(sample, "run");
    assert_true(json_is_object(run));
    assert_string_equal(json_string_value(json_object_get(run, "id")), id);
    assert_string_equal(json_string_value(json_object_get(run, "state")), "running");
    json_t *ranks = json_object_get(run, "ranks"), *rank;
    size_t i;
    assert_int_equal(json_array_size(ranks), 2);
    json_array_foreach(ranks, i, rank)
    {
        assert_string_equal(json_string_value(json_object_get(rank, "state")), "running");
        assert_int_equal(kill((pid_t)num_at(rank, "pid"), 0), 0); /* a live process */
    }
    assert_int_equal(num_at(run, "samples_per_s"), 51234);
}

static void top_json_reports_two_gpus_and_the_runs_samples_per_s(void **state)
{
    (void)state;
    json_t *samples = run_top_json("3", "0.2"), *sample;
    size_t i;
    json_array_foreach(samples, i, sample)
    {
        expect_fake_gpus(sample);
        expect_host_fields(sample);
        assert_true(json_is_null(json_object_get(sample, "run"))); /* none started yet */
    }
    json_decref(samples);

    const char *id = start_run_printing_samples_per_s();
    /* the line may land a moment after the ranks start: a few samples, the last must have it */
    samples = run_top_json("3", "0.3");
    expect_run(json_array_get(samples, 2), id);
    json_decref(samples);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("stop", id), "stop");
}

/* Waits (inotify on the remote run directory, the server being this machine) until rank 0's log
 * of run `id` holds `text`. */
static void await_rank0_log(const char *id, const char *text)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/.gpusync/runs/%s", remote, id);
    int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(ifd >= 0);
    assert_true(inotify_add_watch(ifd, dir, IN_MODIFY | IN_CREATE) >= 0);
    int64_t end = gs_clock_mono_ms() + TIMEOUT_MS;
    for (;;) {
        char *log = gs_test_rank_log(remote, id, 0), ev[4096];
        int has = strstr(log, text) != NULL;
        free(log);
        if (has)
            break;
        int64_t left = end - gs_clock_mono_ms();
        if (left <= 0)
            fail_msg("rank 0 of run %s never printed '%s'", id, text);
        struct pollfd p = {ifd, POLLIN, 0};
        poll(&p, 1, (int)left);
        while (read(ifd, ev, sizeof(ev)) > 0)
            ;
    }
    close(ifd);
}

/* A slow run's samples/s is what its log says, 0.4, in --json and on the text view: it was
 * rounded to a whole number, so 0.4 read as 0 (and 123.5 as 124). */
static void top_keeps_a_fractional_samples_per_s(void **state)
{
    (void)state;
    json_t *o = gs_test_gpusync_json(
        project,
        GS_TEST_ARGS("run", "--json", "--no-sync", "--detach", "--cpu", "1", "--", "sh", "-c",
                     "echo 'epoch   1/3 | train loss 2.3012 | 0.4 samples/s | 160.00 s'; "
                     "exec sleep 60"),
        0, "run --detach");
    char id[128];
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(o, "id")));
    json_decref(o);
    await_rank0_log(id, "0.4 samples/s");
    json_t *samples = run_top_json("1", "0.2");
    json_t *run = json_object_get(json_array_get(samples, 0), "run");
    assert_string_equal(json_string_value(json_object_get(run, "id")), id);
    json_t *v = json_object_get(run, "samples_per_s");
    if (!json_is_real(v) || json_real_value(v) != 0.4)
        fail_msg("samples_per_s is not 0.4: %s", json_dumps(run, JSON_COMPACT));
    json_decref(samples);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("top", "--count", "1", "--interval", "0.2"));
    gs_test_expect_status(&r, 0, "top --count 1");
    if (!strstr(r.out.data, "samples/s 0.4\n"))
        fail_msg("the text view does not show samples/s 0.4:\n%s", r.out.data);
    gs_test_result_release(&r);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("stop", id), "stop");
}

/* ---- a paused rank --------------------------------------------------------------------------- */

/* The "paused" of rank `rank` in one `top --json` sample of run `id`: 1, 0, or -1 when the sample
 * has no such run, rank or field. Every rank's state must stay what the contract lists. */
static int top_rank_paused(const char *id, int rank)
{
    json_t *samples = run_top_json("1", "0.2");
    json_t *run = json_object_get(json_array_get(samples, 0), "run"), *r;
    size_t i;
    int paused = -1;
    const char *rid = json_string_value(json_object_get(run, "id"));
    json_array_foreach(rid && !strcmp(rid, id) ? json_object_get(run, "ranks") : NULL, i, r)
    {
        assert_string_equal(json_string_value(json_object_get(r, "state")), "running");
        json_t *v = json_object_get(r, "paused");
        if (num_at(r, "rank") == rank && json_is_boolean(v))
            paused = json_is_true(v);
    }
    json_decref(samples);
    return paused;
}

/* Polls `top --json` until rank `rank` of run `id` reads paused (1) or not (0), failing after
 * 15 s. */
static void await_top_paused(const char *id, int rank, int paused, const char *after)
{
    int64_t end = gs_clock_mono_ms() + 15000;
    int got;
    while ((got = top_rank_paused(id, rank)) != paused)
        if (gs_clock_mono_ms() > end)
            fail_msg("top --json said paused %d (-1: no such field) for rank %d of run %s 15 s "
                     "after %s",
                     got, rank, id, after);
}

/* A rank stopped by a signal showed as "running" in top, as if it trained on: --json marks it
 * "paused" (its state stays "running"), the text view says so on its line and on the run's;
 * once continued (SIGCONT) it is running again. */
static void top_shows_a_rank_stopped_by_a_signal_as_paused(void **state)
{
    (void)state;
    const char *id = start_run_printing_samples_per_s();
    await_rank0_log(id, "samples/s");
    json_t *st = gs_test_run_json(remote, id, "status.json");
    pid_t pid1 = (pid_t)num_at(json_array_get(json_object_get(st, "ranks"), 1), "pid");
    json_decref(st);
    assert_int_equal(kill(pid1, SIGSTOP), 0);
    await_top_paused(id, 1, 1, "SIGSTOP to rank 1");
    assert_int_equal(top_rank_paused(id, 0), 0);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("top", "--count", "1", "--interval", "0.2"));
    gs_test_expect_status(&r, 0, "top --count 1");
    char run_line[256], rank_line[128];
    snprintf(run_line, sizeof(run_line), "Run  %s paused:1/2  samples/s", id);
    snprintf(rank_line, sizeof(rank_line), "pid %-8ld paused (stopped by a signal)\n", (long)pid1);
    if (!strstr(r.out.data, run_line) || !strstr(r.out.data, rank_line))
        fail_msg("the text view does not show rank 1 paused:\n%s", r.out.data);
    gs_test_result_release(&r);
    assert_int_equal(kill(pid1, SIGCONT), 0);
    await_top_paused(id, 1, 0, "SIGCONT to rank 1");
    gs_test_gpusync_ok(project, GS_TEST_ARGS("stop", id), "stop");
}

/* ---- a disk write load --------------------------------------------------------------------- */

/* The whole disk under `path` as /proc/diskstats names it (a partition's parent), into name.
 * Returns 0, or -1 when no block device backs it (tmpfs, overlay). */
static int disk_of(const char *path, char *name, size_t cap)
{
    struct stat st;
    char link[64], real[PATH_MAX], probe[PATH_MAX + 16];
    if (stat(path, &st) != 0)
        return -1;
    snprintf(link, sizeof(link), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
    if (!realpath(link, real))
        return -1;
    snprintf(probe, sizeof(probe), "%s/partition", real);
    if (access(probe, F_OK) == 0)
        *strrchr(real, '/') = '\0';
    snprintf(name, cap, "%s", strrchr(real, '/') + 1);
    return 0;
}

/* The highest write_mb_s that `disk` shows in the samples. */
static double max_write_mb_s(json_t *samples, const char *disk)
{
    double best = -1;
    json_t *sample, *d;
    size_t i, j;
    json_array_foreach(samples, i, sample)
        json_array_foreach(json_object_get(sample, "disks"), j, d)
    {
        const char *name = json_string_value(json_object_get(d, "name"));
        if (name && !strcmp(name, disk) && num_at(d, "write_mb_s") > best)
            best = num_at(d, "write_mb_s");
    }
    return best;
}

/* Starts a process group that rewrites 64 MiB with O_DIRECT (past the page cache, so every
 * byte reaches the device while the samples are taken) until killed. */
static pid_t start_write_load(const char *dir)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        char script[512];
        snprintf(script, sizeof(script),
                 "while :; do dd if=/dev/zero of='%s/load' bs=1M count=64 oflag=direct "
                 "conv=notrunc status=none || exit 1; done",
                 dir);
        execl("/bin/sh", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

static void top_json_shows_a_disk_write_load(void **state)
{
    (void)state;
    char disk[64];
    /* the build folder: /tmp may be tmpfs, which no disk backs */
    const char *dir = gs_test_build_path("tests");
    if (disk_of(dir, disk, sizeof(disk)) != 0) {
        print_message("no block device backs %s: nothing to load\n", dir);
        skip();
    }
    pid_t load = start_write_load(dir);
    json_t *samples = run_top_json("3", "0.5");
    kill(-load, SIGKILL);
    int status;
    waitpid(load, &status, 0);
    gs_test_sh("rm -f '%s/load'", dir);
    double seen = max_write_mb_s(samples, disk);
    if (seen < WRITE_LOAD_MIN_MB_S)
        fail_msg("a write load on %s shows %.1f MB/s, less than %.0f\n%s", disk, seen,
                 WRITE_LOAD_MIN_MB_S, json_dumps(samples, JSON_COMPACT));
    json_decref(samples);
}

/* ---- Ctrl-C ------------------------------------------------------------------------------- */

/* The pid of a `gpusync-agent sample` running in the remote project, or 0. */
static pid_t find_sampler(void)
{
    char real_remote[PATH_MAX];
    if (!realpath(remote, real_remote))
        return 0;
    struct gs_test_result r = gs_test_run_prog(
        NULL,
        GS_TEST_ARGS("sh", "-c",
                     "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                     "grep -q '^[^ ]*gpusync-agent[^ ]* sample ' && "
                     "[ \"$(readlink $p/cwd)\" = \"$0\" ] && echo ${p#/proc/}; done; true",
                     real_remote),
        TIMEOUT_MS);
    pid_t pid = (pid_t)atol(r.out.data);
    gs_test_result_release(&r);
    return pid;
}

/* Starts `top --json`, waits for its first sample, finds the sampler on the server, sends
 * SIGINT to the CLI and checks it exits 0 and the sampler is gone. */
static void interrupt_top_and_expect_no_sampler(void)
{
    int out[2], err[2];
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setsid();
        if (chdir(project) != 0)
            _exit(126);
        dup2(out[1], 1);
        dup2(err[1], 2);
        gs_test_exec_gpusync(GS_TEST_ARGS("top", "--json", "--interval", "0.2"));
    }
    close(out[1]);
    close(err[1]);
    char first[8192];
    ssize_t n = 0;
    struct pollfd p = {.fd = out[0], .events = POLLIN};
    while (poll(&p, 1, TIMEOUT_MS) == 1 && (n = read(out[0], first, sizeof(first) - 1)) < 0 &&
           errno == EINTR)
        ;
    if (n <= 0)
        fail_msg("top --json printed no sample");
    pid_t sampler = find_sampler();
    assert_true(sampler > 0);
    kill(pid, SIGINT);
    struct gs_test_result r = gs_test_finish(pid, out[0], err[0], TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "top after Ctrl-C");
    gs_test_result_release(&r);
    gs_test_await_gone(sampler); /* fails the test if it outlives the channel by 10 s */
}

static void ctrl_c_exits_0_and_leaves_no_sampler(void **state)
{
    (void)state;
    interrupt_top_and_expect_no_sampler();
}

static void ctrl_c_through_the_watch_daemon_leaves_no_sampler(void **state)
{
    (void)state;
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "-d"), "watch -d");
    /* the relay carries commands once the daemon is connected */
    int64_t until = gs_clock_mono_ms() + TIMEOUT_MS;
    for (;;) {
        json_t *st = gs_test_gpusync_json(project, GS_TEST_ARGS("status", "--json"), 0, "status");
        int ready = json_is_true(json_object_get(st, "connected"));
        json_decref(st);
        if (ready)
            break;
        if (gs_clock_mono_ms() > until)
            fail_msg("the watch daemon did not connect");
        usleep(100000); /* polling a state the daemon has no event for */
    }
    interrupt_top_and_expect_no_sampler();
    json_t *st = gs_test_gpusync_json(project, GS_TEST_ARGS("status", "--json"), 0, "status");
    assert_true(json_integer_value(json_object_get(st, "relayed")) >= 1); /* it went that way */
    json_decref(st);
    gs_test_gpusync_ok(project, GS_TEST_ARGS("watch", "--stop"), "watch --stop");
}

/* The text view draws the server's strings with their control characters made harmless: GPU 1's
 * name would otherwise retitle the terminal (OSC), ring it (BEL) and turn the rest red. */
static void top_text_never_prints_the_servers_escape_sequences(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(GS_TEST_ARGS("top", "--count", "1", "--interval", "0.2"));
    gs_test_expect_status(&r, 0, "top --count 1");
    if (!strstr(r.out.data, "Evil ?]0;pwned??[31mGPU"))
        fail_msg("GPU 1's name is not shown made safe: %s", r.out.data);
    assert_null(strchr(r.out.data, '\a'));
    assert_null(strstr(r.out.data, "\033]"));
    gs_test_result_release(&r);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(top_json_reports_two_gpus_and_the_runs_samples_per_s),
        cmocka_unit_test(top_keeps_a_fractional_samples_per_s),
        cmocka_unit_test(top_shows_a_rank_stopped_by_a_signal_as_paused),
        cmocka_unit_test(top_json_shows_a_disk_write_load),
        cmocka_unit_test(top_text_never_prints_the_servers_escape_sequences),
        cmocka_unit_test(ctrl_c_exits_0_and_leaves_no_sampler),
        cmocka_unit_test(ctrl_c_through_the_watch_daemon_leaves_no_sampler),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
