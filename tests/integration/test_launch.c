/* Integration tests for the run supervisor: the real built agent
 * ($GS_BUILD_DIR/agent/gpusync-agent, or $GS_AGENT) runs `launch`, `tail`, `ps` and
 * `stop` locally against a temporary project; assertions are on status.json and meta.json (read
 * with jansson, not with the agent's own reader), rank logs, tail frames, exit codes and the
 * process table. Waiting is on inotify events in the run directory, never on fixed sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/sched.h>

#define WAIT_MS 20000 /* upper bound for anything a test awaits */

struct fx {
    char root[64]; /* temporary project directory */
};

/* The output of one agent invocation. */
struct out {
    int status; /* exit status, or 128+signal */
    char *text; /* stdout, NUL-terminated (may hold NULs inside: see len) */
    size_t len;
    char err[4096]; /* stderr, truncated */
};

/* ---- process helpers --------------------------------------------------------------------- */

static const char *agent_bin(void)
{
    static char path[PATH_MAX];
    const char *a = getenv("GS_AGENT"), *dir = getenv("GS_BUILD_DIR");
    if (a)
        return a;
    if (!dir)
        return NULL;
    snprintf(path, sizeof(path), "%s/agent/gpusync-agent", dir);
    return path;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts the agent with args (NULL-terminated, without argv[0]); its stdout and stderr come
 * back through *outfd and *errfd. env: extra "K=V" strings or NULL. Returns the pid. */
static pid_t agent_spawn(const char *const *args, const char *const *env, int *outfd, int *errfd)
{
    int o[2], e[2];
    assert_int_equal(pipe(o), 0);
    assert_int_equal(pipe(e), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const char *argv[64] = {agent_bin()};
        for (int i = 0; args[i]; i++)
            argv[i + 1] = args[i];
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        dup2(o[1], 1);
        dup2(e[1], 2);
        close(o[0]), close(o[1]), close(e[0]), close(e[1]);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    close(o[1]);
    close(e[1]);
    *outfd = o[0];
    *errfd = e[0];
    return pid;
}

/* Reads fd to EOF into a growing buffer. */
static void read_to_eof(int fd, char **buf, size_t *len)
{
    size_t cap = 4096;
    *buf = malloc(cap);
    *len = 0;
    for (;;) {
        if (*len + 1 >= cap)
            *buf = realloc(*buf, cap *= 2);
        ssize_t r = read(fd, *buf + *len, cap - 1 - *len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        *len += (size_t)r;
    }
    (*buf)[*len] = 0;
}

/* Waits for pid and returns its exit status (128+signal when killed). */
static int wait_status(pid_t pid)
{
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        assert_int_equal(errno, EINTR);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* Runs the agent to completion. stderr must stay small (it is read after stdout). */
static struct out agent_run_env(const char *const *args, const char *const *env)
{
    struct out r;
    int ofd, efd;
    memset(&r, 0, sizeof(r));
    pid_t pid = agent_spawn(args, env, &ofd, &efd);
    read_to_eof(ofd, &r.text, &r.len);
    ssize_t n = read(efd, r.err, sizeof(r.err) - 1);
    r.err[n > 0 ? n : 0] = 0;
    close(ofd);
    close(efd);
    r.status = wait_status(pid);
    return r;
}

static struct out agent_run(const char *const *args)
{
    return agent_run_env(args, NULL);
}

/* ---- run directory helpers --------------------------------------------------------------- */

static void run_dir(const struct fx *f, const char *id, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/.gpusync/runs/%s", f->root, id);
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *buf;
    size_t len;
    read_to_eof(fileno(fp), &buf, &len);
    fclose(fp);
    return buf;
}

static char *rank_log(const struct fx *f, const char *id, int rank)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/.gpusync/runs/%s/rank%d.log", f->root, id, rank);
    char *s = slurp(path);
    assert_non_null(s);
    return s;
}

static json_t *load_json(const struct fx *f, const char *id, const char *name)
{
    char path[PATH_MAX];
    json_error_t je;
    snprintf(path, sizeof(path), "%s/.gpusync/runs/%s/%s", f->root, id, name);
    return json_load_file(path, 0, &je);
}

/* Returns 1 once status.json says the run has ended. */
static int run_ended(const struct fx *f, const char *id)
{
    json_t *st = load_json(f, id, "status.json");
    const char *state = st ? json_string_value(json_object_get(st, "state")) : NULL;
    int ended = state && strcmp(state, "running") != 0;
    json_decref(st);
    return ended;
}

/* Returns 1 once the rank's log contains text. */
static int log_has(const struct fx *f, const char *id, int rank, const char *text)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/.gpusync/runs/%s/rank%d.log", f->root, id, rank);
    char *s = slurp(path);
    int has = s && strstr(s, text);
    free(s);
    return has;
}

/* Waits (inotify on the run directory) until the run ends or, with text, until rank's log
 * holds text. Fails the test after WAIT_MS. */
static void await_run(const struct fx *f, const char *id, int rank, const char *text)
{
    char dir[PATH_MAX];
    run_dir(f, id, dir, sizeof(dir));
    int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(ifd >= 0);
    assert_true(inotify_add_watch(ifd, dir, IN_MODIFY | IN_MOVED_TO | IN_CREATE) >= 0);
    long long end = now_ms() + WAIT_MS;
    while (text ? !log_has(f, id, rank, text) : !run_ended(f, id)) {
        long long left = end - now_ms();
        if (left <= 0)
            fail_msg("run %s: timed out waiting for %s", id, text ? text : "its end");
        struct pollfd p = {ifd, POLLIN, 0};
        poll(&p, 1, (int)left);
        char ev[4096];
        while (read(ifd, ev, sizeof(ev)) > 0)
            ;
    }
    close(ifd);
}

/* Waits for the run's end and returns its status.json (caller decrefs). */
static json_t *await_end(const struct fx *f, const char *id)
{
    await_run(f, id, 0, NULL);
    json_t *st = load_json(f, id, "status.json");
    assert_non_null(st);
    return st;
}

static json_int_t jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    assert_non_null(s);
    return s;
}

static json_t *jrank(json_t *st, size_t i)
{
    json_t *r = json_array_get(json_object_get(st, "ranks"), i);
    assert_non_null(r);
    return r;
}

/* True if no process of the group exists any more. */
static int group_gone(long pgid)
{
    return pgid > 1 && kill((pid_t)-pgid, 0) < 0 && errno == ESRCH;
}

/* True if pid is gone or a zombie (its parent, init, may not have reaped it yet). */
static int pid_gone(long pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] == 'Z';
}

static void assert_no_process_left(json_t *st)
{
    json_t *ranks = json_object_get(st, "ranks");
    size_t i;
    json_t *r;
    assert_true(json_array_size(ranks) > 0);
    json_array_foreach(ranks, i, r)
    {
        long pgid = (long)jint(r, "pgid");
        if (!group_gone(pgid))
            fail_msg("process group %ld of rank %zu survived", pgid, i);
    }
}

/* Value of KEY in an `env` dump, copied to a static buffer; NULL if absent. */
static const char *env_get(const char *dump, const char *key)
{
    static char val[512];
    size_t k = strlen(key);
    for (const char *p = dump; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, key, k) && p[k] == '=') {
            size_t n = strcspn(p + k + 1, "\n");
            snprintf(val, sizeof(val), "%.*s", (int)n, p + k + 1);
            return val;
        }
    }
    return NULL;
}

static void assert_env(const char *dump, const char *key, const char *want)
{
    const char *got = env_get(dump, key);
    if (!got || strcmp(got, want))
        fail_msg("%s: want '%s', got '%s'", key, want, got ? got : "(unset)");
}

/* Launches a run: args up to "--" and the command after it; returns the supervisor pid and
 * the master port from the `started` line. */
static void launch_env(const struct fx *f, const char *id, const char *const *opts,
                       const char *const *env, long *sup, long *port)
{
    const char *args[64] = {"launch", "--root", f->root, "--id", id};
    int n = 5;
    for (int i = 0; opts[i]; i++)
        args[n++] = opts[i];
    args[n] = NULL;
    struct out r = agent_run_env(args, env);
    if (r.status != 0)
        fail_msg("launch %s failed (%d): %s", id, r.status, r.err);
    char want[PATH_MAX + 256], got_id[128], exe[PATH_MAX];
    long s = 0, p = 0;
    /* a run with GPUs says which it reserved first (proto/run.h) */
    const char *line = strncmp(r.text, "gpus ", 5) ? r.text : strchr(r.text, '\n') + 1;
    assert_int_equal(sscanf(line, "started %127s %ld %ld", got_id, &s, &p), 3);
    /* the agent's own path comes last, for clients that ran whichever build was cached */
    assert_non_null(realpath(agent_bin(), exe));
    snprintf(want, sizeof(want), "started %s %ld %ld %s\n", id, s, p, exe);
    assert_string_equal(line, want);
    assert_true(s > 1 && p > 0 && p < 65536);
    if (sup)
        *sup = s;
    if (port)
        *port = p;
    free(r.text);
}

static void launch(const struct fx *f, const char *id, const char *const *opts)
{
    launch_env(f, id, opts, NULL, NULL, NULL);
}

/* ---- fixture ----------------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    if (!agent_bin() || access(agent_bin(), X_OK) != 0) {
        fprintf(stderr, "gpusync-agent not found: set GS_BUILD_DIR or GS_AGENT\n");
        return -1;
    }
    struct fx *f = calloc(1, sizeof(*f));
    snprintf(f->root, sizeof(f->root), "/tmp/gs-launch-XXXXXX");
    if (!mkdtemp(f->root))
        return -1;
    /* This test's GPU reservations (gpus.h), apart from any other suite's running meanwhile. */
    char locks[sizeof(f->root) + 16];
    snprintf(locks, sizeof(locks), "%s/gpu-locks", f->root);
    setenv("GPUSYNC_GPU_LOCK_DIR", locks, 1);
    alarm(120); /* a hung test fails instead of hanging ctest */
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    const char *ps[] = {"ps", "--root", f->root, "--json", NULL};
    struct out r = agent_run(ps);
    json_t *runs = json_loads(r.text, 0, NULL);
    size_t i;
    json_t *run;
    json_array_foreach(runs, i, run)
    {
        const char *stop[] = {"stop", "--root", f->root, "--id", jstr(run, "id"), NULL};
        struct out s = agent_run(stop);
        free(s.text);
    }
    json_decref(runs);
    free(r.text);
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); /* a failed pid-reuse test may have left it on */
    nftw(f->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    alarm(0);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_launch__env_contract_rank_by_rank(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc",
                          "2",
                          "--gpus",
                          "0,2",
                          "--nnodes",
                          "2",
                          "--node-rank",
                          "1",
                          "--master-addr",
                          "10.9.8.7",
                          "--master-port",
                          "23456",
                          "--",
                          "env",
                          NULL};
    launch(f, "env1", opts);
    json_t *st = await_end(f, "env1");
    assert_string_equal(jstr(st, "state"), "succeeded");
    for (int local = 0; local < 2; local++) {
        char rank[8], lr[8];
        snprintf(rank, sizeof(rank), "%d", 2 + local);
        snprintf(lr, sizeof(lr), "%d", local);
        char *dump = rank_log(f, "env1", 2 + local);
        assert_env(dump, "RANK", rank);
        assert_env(dump, "LOCAL_RANK", lr);
        assert_env(dump, "WORLD_SIZE", "4");
        assert_env(dump, "LOCAL_WORLD_SIZE", "2");
        assert_env(dump, "GROUP_RANK", "1");
        assert_env(dump, "NODE_RANK", "1");
        assert_env(dump, "ROLE_RANK", rank);
        assert_env(dump, "MASTER_ADDR", "10.9.8.7");
        assert_env(dump, "MASTER_PORT", "23456");
        assert_env(dump, "TORCHELASTIC_RESTART_COUNT", "0");
        assert_env(dump, "TORCHELASTIC_MAX_RESTARTS", "0");
        assert_env(dump, "OMP_NUM_THREADS", "1");
        assert_env(dump, "GPUSYNC_RUN_ID", "env1");
        assert_env(dump, "CUDA_VISIBLE_DEVICES", "0,2");
        assert_null(env_get(dump, "TORCHELASTIC_USE_AGENT_STORE"));
        free(dump);
        assert_int_equal(jint(jrank(st, (size_t)local), "rank"), 2 + local);
    }
    json_decref(st);
}

/* As torchrun: one rank on the node is left its libraries' thread defaults (a CPU run of the
 * bundled trainer then uses every core), where several get OMP_NUM_THREADS=1 (above). */
static void test_launch__a_single_rank_keeps_the_openmp_default(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1", "--", "env", NULL};
    unsetenv("OMP_NUM_THREADS");
    launch(f, "env3", opts);
    json_decref(await_end(f, "env3"));
    char *dump = rank_log(f, "env3", 0);
    assert_env(dump, "LOCAL_WORLD_SIZE", "1");
    assert_null(env_get(dump, "OMP_NUM_THREADS"));
    free(dump);
}

static void test_launch__env_defaults_keep_caller_settings(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1", "--", "env", NULL};
    const char *env[] = {"OMP_NUM_THREADS=4", "CUDA_VISIBLE_DEVICES=7", NULL};
    long port;
    launch_env(f, "env2", opts, env, NULL, &port);
    json_t *st = await_end(f, "env2");
    char *dump = rank_log(f, "env2", 0);
    char want[16];
    snprintf(want, sizeof(want), "%ld", port);
    assert_env(dump, "MASTER_ADDR", "127.0.0.1");
    assert_env(dump, "MASTER_PORT", want);
    assert_int_equal(jint(st, "master_port"), port);
    assert_env(dump, "WORLD_SIZE", "1");
    assert_env(dump, "OMP_NUM_THREADS", "4");
    /* not the caller's: a run without --gpus has CPU ranks, which must see no GPU (issue 16) */
    assert_env(dump, "CUDA_VISIBLE_DEVICES", "");
    free(dump);
    json_decref(st);
}

static void test_launch__exit_code_is_the_failing_ranks(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "2",  "--",
                          "sh",      "-c", "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 1000",
                          NULL};
    launch(f, "exit3", opts);
    json_t *st = await_end(f, "exit3");
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "exit_code"), 3);
    assert_int_equal(jint(jrank(st, 1), "exit_code"), 3);
    assert_int_equal(jint(jrank(st, 0), "signal"), SIGTERM);
    assert_true(json_is_string(json_object_get(st, "end")));
    assert_no_process_left(st);
    json_decref(st);
}

static void test_launch__crash_stops_the_others_with_no_process_left(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "2",
                          "--",      "sh",
                          "-c",      "if [ $RANK = 0 ]; then kill -SEGV $$; fi; sleep 1000 & wait",
                          NULL};
    long long t0 = now_ms();
    launch(f, "crash", opts);
    json_t *st = await_end(f, "crash");
    assert_true(now_ms() - t0 < 5000); /* well inside the 10 s grace: TERM did it */
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "exit_code"), 139);
    assert_int_equal(jint(jrank(st, 0), "signal"), SIGSEGV);
    assert_int_equal(jint(jrank(st, 1), "signal"), SIGTERM);
    assert_no_process_left(st);
    json_decref(st);
}

static void test_launch__max_restarts_restarts_twice_then_fails(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc",
                          "1",
                          "--max-restarts",
                          "2",
                          "--",
                          "sh",
                          "-c",
                          "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 5",
                          NULL};
    launch(f, "rs", opts);
    json_t *st = await_end(f, "rs");
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "exit_code"), 5);
    assert_int_equal(jint(st, "restarts"), 2);
    char *log = rank_log(f, "rs", 0);
    assert_string_equal(log, "attempt 0\n=== restart 1 ===\nattempt 1\n"
                             "=== restart 2 ===\nattempt 2\n");
    free(log);
    json_decref(st);
}

static void test_launch__concurrent_runs_get_distinct_usable_ports(void **state)
{
    struct fx *f = *state;
    if (access("/usr/bin/python3", X_OK) != 0)
        skip();
    /* Rank 0 listens on MASTER_PORT and exits after one connection: both runs must hold their
     * ports at the same time. */
    const char *py = "import os,socket\n"
                     "s=socket.socket(); s.bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\n"
                     "s.listen(1); print('listening', flush=True); s.accept()\n";
    const char *opts[] = {"--nproc", "1", "--", "python3", "-c", py, NULL};
    long port[2];
    launch_env(f, "pa", opts, NULL, NULL, &port[0]);
    launch_env(f, "pb", opts, NULL, NULL, &port[1]);
    assert_int_not_equal(port[0], port[1]);
    assert_int_not_equal(port[0], 29500);
    const char *ids[] = {"pa", "pb"};
    for (int i = 0; i < 2; i++)
        await_run(f, ids[i], 0, "listening");
    for (int i = 0; i < 2; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port[i])};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
        close(s);
    }
    for (int i = 0; i < 2; i++) {
        json_t *st = await_end(f, ids[i]);
        assert_string_equal(jstr(st, "state"), "succeeded");
        assert_int_equal(jint(st, "master_port"), port[i]);
        json_decref(st);
    }
}

static void test_launch__arguments_reach_the_command_unchanged(void **state)
{
    struct fx *f = *state;
    const char *odd[] = {"a b", "q\"u'o", "$HOME", "x;y", "l1\nl2", "", "\\n*"};
    const char *opts[] = {"--nproc", "1",    "--",
                          "sh",      "-c",   "for a in \"$@\"; do printf '<%s>\\n' \"$a\"; done",
                          "argv0",   odd[0], odd[1],
                          odd[2],    odd[3], odd[4],
                          odd[5],    odd[6], NULL};
    launch(f, "args", opts);
    json_t *st = await_end(f, "args");
    assert_string_equal(jstr(st, "state"), "succeeded");
    char *log = rank_log(f, "args", 0);
    assert_string_equal(log, "<a b>\n<q\"u'o>\n<$HOME>\n<x;y>\n<l1\nl2>\n<>\n<\\n*>\n");
    free(log);
    json_t *meta = load_json(f, "args", "meta.json");
    json_t *cmd = json_object_get(meta, "command");
    assert_int_equal(json_array_size(cmd), 11);
    for (size_t i = 0; i < 7; i++)
        assert_string_equal(json_string_value(json_array_get(cmd, 4 + i)), odd[i]);
    json_decref(meta);
    json_decref(st);
}

/* A run's directory holds its command line and output: private to its user whatever the umask
 * the agent was started with (it was 0755/0644, readable by every user of a shared server). */
static void test_launch__a_runs_files_are_private_to_its_user(void **state)
{
    struct fx *f = *state;
    mode_t old = umask(0);
    const char *opts[] = {"--nproc", "1", "--", "sh", "-c", "echo secret-output", NULL};
    launch(f, "private", opts);
    umask(old);
    json_t *st = await_end(f, "private");
    json_decref(st);
    char dir[PATH_MAX], path[PATH_MAX + 32];
    run_dir(f, "private", dir, sizeof(dir));
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    const char *files[] = {"meta.json", "status.json", "rank0.log"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        assert_int_equal(stat(path, &sb), 0);
        if ((sb.st_mode & 0077) != 0)
            fail_msg("%s has mode %o", files[i], (unsigned)(sb.st_mode & 0777));
    }
}

static void test_launch__stop_kills_every_process_even_those_ignoring_term(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {
        "--nproc", "2",  "--grace-ms", "300",
        "--",      "sh", "-c",         "trap '' TERM; sleep 1000 & sleep 1000 & echo up; wait",
        NULL};
    long sup;
    launch_env(f, "st", opts, NULL, &sup, NULL);
    await_run(f, "st", 1, "up");
    json_t *running = load_json(f, "st", "status.json");
    const char *stop[] = {"stop", "--root", f->root, "--id", "st", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    assert_true(strncmp(r.text, "stopped st: ", 12) == 0);
    free(r.text);
    assert_no_process_left(running);
    assert_true(pid_gone(sup));
    json_t *st = load_json(f, "st", "status.json");
    assert_string_equal(jstr(st, "state"), "stopped");
    assert_int_equal(jint(st, "exit_code"), 128 + SIGTERM);
    assert_int_equal(jint(jrank(st, 0), "signal"), SIGKILL);
    /* both rank shells and their four sleeps ignored SIGTERM: all six were killed, by name */
    assert_int_equal(jint(st, "killed_count"), 6);
    assert_int_equal(json_array_size(json_object_get(st, "killed")), 6);
    r = agent_run(stop);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.text, "not running st\n");
    free(r.text);
    json_decref(st);
    json_decref(running);
}

static void test_launch__lost_supervisor_is_reported_and_stop_cleans_up(void **state)
{
    struct fx *f = *state;
    /* The rank leader dies with the supervisor (parent-death signal); its child must not
     * escape stop. */
    const char *opts[] = {"--nproc", "1", "--", "sh", "-c", "sleep 1000 & echo up; wait", NULL};
    long sup;
    launch_env(f, "lost", opts, NULL, &sup, NULL);
    await_run(f, "lost", 0, "up");
    /* A pidfd turns readable once the process has exited (its lock released with its files). */
    int pfd = (int)syscall(SYS_pidfd_open, (pid_t)sup, 0);
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    if (pfd >= 0) {
        struct pollfd p = {pfd, POLLIN, 0};
        assert_int_equal(poll(&p, 1, WAIT_MS), 1);
        close(pfd);
    }
    const char *ps[] = {"ps", "--root", f->root, "--json", NULL};
    json_t *runs = NULL;
    long long end = now_ms() + WAIT_MS;
    for (;;) { /* only loops without pidfd (Linux < 5.3) */
        struct out r = agent_run(ps);
        runs = json_loads(r.text, 0, NULL);
        free(r.text);
        assert_int_equal(json_array_size(runs), 1);
        if (!strcmp(jstr(json_array_get(runs, 0), "state"), "lost") || now_ms() > end)
            break;
        json_decref(runs);
    }
    assert_string_equal(jstr(json_array_get(runs, 0), "state"), "lost");
    /* nobody saw it end: its duration is unknown, not the time since it started */
    assert_int_equal(json_integer_value(json_object_get(json_array_get(runs, 0), "duration_ms")),
                     -1);
    json_decref(runs);
    json_t *st = load_json(f, "lost", "status.json");
    const char *stop[] = {"stop", "--root", f->root, "--id", "lost", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.text, "stopped lost: SIGTERM to 1 rank\n"); /* its group's sleep */
    free(r.text);
    assert_no_process_left(st);
    json_decref(st);
    st = load_json(f, "lost", "status.json");
    assert_string_equal(jstr(st, "state"), "stopped");
    json_decref(st);
}

/* stop of a lost run does the supervisor's part: SIGTERM to the rank's group and to the process
 * that left it, SIGKILL to both after the grace (they ignore SIGTERM), and it says so, in its
 * report and in status.json, as a stop through the supervisor would. It used to SIGKILL the group
 * unannounced and record nothing: killed_count 0 for a run whose every process it killed. */
static void test_launch__stop_of_a_lost_run_reports_and_records_what_it_ended(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1",
                          "--",      "sh",
                          "-c",      "trap '' TERM; sleep 1000 & setsid sleep 1001 & echo up; wait",
                          NULL};
    long sup;
    launch_env(f, "lost3", opts, NULL, &sup, NULL);
    await_run(f, "lost3", 0, "up");
    json_t *st = load_json(f, "lost3", "status.json");
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    while (!pid_gone(sup))
        usleep(1000); /* not our child: no event to wait on */
    const char *stop[] = {"stop", "--root", f->root, "--id", "lost3", "--grace-ms", "200", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.text, "stopped lost3: SIGTERM to 1 rank and 1 other process; "
                                   "2 processes outlived the 0.2 s grace period and got SIGKILL"));
    free(r.text);
    assert_no_process_left(st);
    json_decref(st);
    st = load_json(f, "lost3", "status.json");
    assert_string_equal(jstr(st, "state"), "stopped");
    assert_int_equal(jint(st, "others_termed"), 1);
    assert_int_equal(jint(st, "killed_count"), 2);
    assert_int_equal(json_array_size(json_object_get(st, "killed")), 2);
    assert_true(json_is_true(json_object_get(jrank(st, 0), "stopped")));
    json_decref(st);
}

/* ---- processes that left their rank's group -------------------------------------------- */

/* The pid a rank wrote into root/name, waiting for it to be there. */
static long pid_file(const struct fx *f, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", f->root, name);
    long long end = now_ms() + WAIT_MS;
    for (;;) { /* the rank writes it before it prints "up", which the caller awaited */
        char *s = slurp(path);
        long pid = s ? atol(s) : 0;
        free(s);
        if (pid > 0)
            return pid;
        if (now_ms() > end)
            fail_msg("no pid in %s", path);
    }
}

/* 1 if status.json's killed list names pid. */
static int killed_names(json_t *st, long pid)
{
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(st, "killed"), i, k) if (jint(k, "pid") == pid) return 1;
    return 0;
}

/* A rank's child that called setsid and ignores SIGTERM, and a daemon (double fork + setsid):
 * neither is in the rank's process group, and both were left alive by `stop` before the
 * supervisor looked beyond the groups. */
static void test_launch__stop_ends_setsid_children_and_daemons_too(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {
        "--nproc",
        "1",
        "--grace-ms",
        "300",
        "--",
        "sh",
        "-c",
        "setsid sh -c 'trap \"\" TERM; echo $$ > stubborn.pid; exec sleep 1000' & "
        "(setsid sh -c 'echo $$ > daemon.pid; exec sleep 1001' &); "
        "while [ ! -s stubborn.pid ] || [ ! -s daemon.pid ]; do sleep 0.01; done; echo up; wait",
        NULL};
    long sup;
    launch_env(f, "esc", opts, NULL, &sup, NULL);
    await_run(f, "esc", 0, "up");
    long stubborn = pid_file(f, "stubborn.pid"), daemon = pid_file(f, "daemon.pid");
    const char *stop[] = {"stop", "--root", f->root, "--id", "esc", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    free(r.text);
    assert_true(pid_gone(stubborn));
    assert_true(pid_gone(daemon));
    assert_true(pid_gone(sup));
    json_t *st = load_json(f, "esc", "status.json");
    assert_string_equal(jstr(st, "state"), "stopped");
    assert_int_equal(jint(st, "others_termed"), 2); /* the two, each with a SIGTERM of its own */
    assert_true(killed_names(st, stubborn));        /* it ignored SIGTERM: killed, and named */
    assert_false(killed_names(st, daemon));         /* it did not */
    json_decref(st);
}

/* A run whose ranks all succeeded is over only once what they left running is gone. */
static void test_launch__a_daemon_left_by_a_finished_run_does_not_outlive_it(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc",
                          "1",
                          "--",
                          "sh",
                          "-c",
                          "(setsid sh -c 'echo $$ > daemon.pid; exec sleep 1000' &); "
                          "while [ ! -s daemon.pid ]; do sleep 0.01; done; echo done",
                          NULL};
    launch_env(f, "fin", opts, NULL, NULL, NULL);
    json_t *st = await_end(f, "fin");
    assert_string_equal(jstr(st, "state"), "succeeded");
    assert_int_equal(jint(st, "exit_code"), 0);
    assert_int_equal(jint(st, "others_termed"), 1);
    assert_true(pid_gone(pid_file(f, "daemon.pid")));
    json_decref(st);
}

/* Once the supervisor is killed outright, a setsid child belongs to init: stop finds it by the
 * run's marks, its environment and (where the server gives one) its cgroup. The second child
 * clears GPUSYNC_RUN_DIR, so only the cgroup can find it. */
static void test_launch__stop_of_a_lost_run_finds_its_escaped_children(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {
        "--nproc",
        "1",
        "--",
        "sh",
        "-c",
        "setsid sh -c 'echo $$ > env.pid; exec sleep 1000' & "
        "env -u GPUSYNC_RUN_DIR setsid sh -c 'echo $$ > bare.pid; exec sleep 1001' & "
        "while [ ! -s env.pid ] || [ ! -s bare.pid ]; do sleep 0.01; done; echo up; wait",
        NULL};
    long sup;
    launch_env(f, "lost2", opts, NULL, &sup, NULL);
    await_run(f, "lost2", 0, "up");
    long marked = pid_file(f, "env.pid"), bare = pid_file(f, "bare.pid");
    json_t *st = load_json(f, "lost2", "status.json");
    int has_cgroup = json_is_string(json_object_get(st, "cgroup"));
    json_decref(st);
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    while (!pid_gone(sup))
        usleep(1000); /* not our child: no event to wait on */
    const char *stop[] = {"stop", "--root", f->root, "--id", "lost2", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    free(r.text);
    assert_true(pid_gone(marked));
    if (has_cgroup)
        assert_true(pid_gone(bare));
    else {
        kill((pid_t)bare, SIGKILL);
        print_message("no cgroup v2 here: the unmarked child was not expected to be found\n");
    }
}

/* Makes a memory cgroup (v1, or v2 with the memory controller) limited to `bytes` for the test
 * and writes the file a process joins it by into procs. Returns 0, or -1 where the kernel or
 * our privileges do not allow it. */
static int memory_cgroup(char *dir, size_t cap, char *procs, size_t pcap, long bytes)
{
    char limit[PATH_MAX + 32], value[32];
    snprintf(value, sizeof(value), "%ld", bytes);
    const char *v1 = "/sys/fs/cgroup/memory", *v2 = "/sys/fs/cgroup";
    struct stat sb;
    int is_v1 = stat(v1, &sb) == 0;
    snprintf(dir, cap, "%s/gpusync-test-oom-%ld", is_v1 ? v1 : v2, (long)getpid());
    if (mkdir(dir, 0755) < 0)
        return -1;
    snprintf(limit, sizeof(limit), "%s/%s", dir, is_v1 ? "memory.limit_in_bytes" : "memory.max");
    FILE *fp = fopen(limit, "w");
    int ok = fp && fputs(value, fp) >= 0;
    if (fp && fclose(fp) != 0)
        ok = 0;
    if (!ok) {
        rmdir(dir);
        return -1;
    }
    snprintf(procs, pcap, "%s/cgroup.procs", dir);
    return 0;
}

/* A rank that the kernel kills for using too much memory is told apart from one killed by
 * hand: status.json names the failing rank, says oom, and marks the rank stopped because of it. */
static void test_launch__a_rank_killed_for_memory_is_named_out_of_memory(void **state)
{
    struct fx *f = *state;
    char dir[PATH_MAX], procs[PATH_MAX + 16], cmd[2 * PATH_MAX];
    if (memory_cgroup(dir, sizeof(dir), procs, sizeof(procs), 64L << 20) < 0) {
        print_message("no memory cgroup can be made here: skipped\n");
        skip();
    }
    snprintf(
        cmd, sizeof(cmd),
        "if [ \"$RANK\" = 1 ]; then echo $$ > %s && exec python3 -c \"x = b'x' * (512 << 20)\";"
        " else exec sleep 1000; fi",
        procs);
    const char *opts[] = {"--nproc", "2", "--", "sh", "-c", cmd, NULL};
    launch_env(f, "oom", opts, NULL, NULL, NULL);
    json_t *st = await_end(f, "oom");
    rmdir(dir);
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "failed_rank"), 1);
    assert_int_equal(jint(jrank(st, 1), "signal"), SIGKILL);
    assert_true(json_is_true(json_object_get(jrank(st, 1), "oom")));
    assert_false(json_is_true(json_object_get(jrank(st, 1), "stopped")));
    assert_true(json_is_true(json_object_get(jrank(st, 0), "stopped")));
    assert_false(json_is_true(json_object_get(jrank(st, 0), "oom")));
    assert_non_null(json_string_value(json_object_get(st, "oom_scope")));
    json_decref(st);
}

/* The same SIGKILL sent by hand is not called out of memory. */
static void test_launch__a_rank_killed_by_hand_is_not_called_out_of_memory(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1", "--", "sh", "-c", "echo up; exec sleep 1000", NULL};
    launch_env(f, "kill9", opts, NULL, NULL, NULL);
    await_run(f, "kill9", 0, "up");
    json_t *running = load_json(f, "kill9", "status.json");
    assert_int_equal(kill((pid_t)jint(jrank(running, 0), "pid"), SIGKILL), 0);
    json_decref(running);
    json_t *st = await_end(f, "kill9");
    assert_int_equal(jint(st, "failed_rank"), 0);
    assert_int_equal(jint(jrank(st, 0), "signal"), SIGKILL);
    assert_false(json_is_true(json_object_get(jrank(st, 0), "oom")));
    json_decref(st);
}

/* ---- pid reuse ---------------------------------------------------------------------------- */

/* Starts a process with exactly pid `want` (clone3 with set_tid, root only) that leads its own
 * process group and waits to be killed: an unrelated group that took over a number a run once
 * used. Skips the test where the kernel or the privileges do not allow it. */
static pid_t spawn_with_pid(long want)
{
    pid_t tid = (pid_t)want;
    struct clone_args ca;
    memset(&ca, 0, sizeof(ca));
    ca.exit_signal = SIGCHLD;
    ca.set_tid = (uint64_t)(uintptr_t)&tid;
    ca.set_tid_size = 1;
    long pid = syscall(SYS_clone3, &ca, sizeof(ca));
    if (pid == 0) {
        setpgid(0, 0);
        for (;;)
            pause();
    }
    if (pid < 0 && (errno == EPERM || errno == ENOSYS || errno == EINVAL || errno == E2BIG))
        skip(); /* no clone3 with set_tid here (before Linux 5.5, or not privileged) */
    if (pid < 0)
        fail_msg("clone3 with pid %ld: %s", want, strerror(errno));
    setpgid((pid_t)pid, (pid_t)pid);
    return (pid_t)pid;
}

/* Returns once a process started now would get a later start time than `ticks` (pgroup.h tells
 * groups apart by their leader's start time, which has clock-tick resolution, CLOCK_BOOTTIME). */
static void await_tick_after(long long ticks)
{
    long hz = sysconf(_SC_CLK_TCK);
    for (;;) {
        struct timespec ts, tick = {0, 1000000000L / hz};
        clock_gettime(CLOCK_BOOTTIME, &ts);
        if ((long long)ts.tv_sec * hz + ts.tv_nsec / tick.tv_nsec > ticks)
            return;
        nanosleep(&tick, NULL); /* waiting for time itself to pass: no event to wait on */
    }
}

/* 1 while pid, our child, has not exited. */
static int child_alive(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == 0;
}

static void kill_child(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Waits (inotify) until status.json records an exit for rank i; returns the status. */
static json_t *await_rank_exit(const struct fx *f, const char *id, size_t i)
{
    char dir[PATH_MAX];
    run_dir(f, id, dir, sizeof(dir));
    int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(inotify_add_watch(ifd, dir, IN_MOVED_TO | IN_CREATE) >= 0);
    long long end = now_ms() + WAIT_MS;
    for (;;) {
        json_t *st = load_json(f, id, "status.json");
        json_t *r = st ? json_array_get(json_object_get(st, "ranks"), i) : NULL;
        if (r && json_is_integer(json_object_get(r, "exit_code"))) {
            close(ifd);
            return st;
        }
        json_decref(st);
        if (now_ms() > end)
            fail_msg("run %s: rank %zu never exited", id, i);
        struct pollfd p = {ifd, POLLIN, 0};
        poll(&p, 1, (int)(end - now_ms()));
        char ev[4096];
        while (read(ifd, ev, sizeof(ev)) > 0)
            ;
    }
}

/* Rank 0 ends first and its process group empties; when rank 1 then fails, the supervisor stops
 * the run's groups. Rank 0's number is by then free for anyone: a process that took it (here made
 * to, with clone3) must not be signalled. Before the fix the supervisor sent SIGTERM to every
 * recorded pgid, and this unrelated group died. */
static void test_launch__an_exited_ranks_pgid_reused_is_never_signalled(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {
        "--nproc", "2",  "--grace-ms", "200",
        "--",      "sh", "-c",         "if [ $RANK = 0 ]; then exit 0; fi; exec sleep 1000",
        NULL};
    launch(f, "reuse", opts);
    json_t *st = await_rank_exit(f, "reuse", 0);
    long pgid0 = (long)jint(jrank(st, 0), "pgid"), pid1 = (long)jint(jrank(st, 1), "pid");
    json_decref(st);
    pid_t other = spawn_with_pid(pgid0);
    assert_int_equal(kill((pid_t)pid1, SIGKILL), 0); /* rank 1 fails: the others are stopped */
    st = await_end(f, "reuse");
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "exit_code"), 128 + SIGKILL);
    int alive = child_alive(other);
    kill_child(other);
    assert_true(alive);
    assert_true(json_is_true(json_object_get(jrank(st, 0), "group_gone")));
    json_decref(st);
}

/* A lost run (supervisor and ranks killed, status.json still "running") is stopped later, when
 * its rank's pgid already belongs to an unrelated process group: stop must not touch that group
 * and still report the run stopped. Before the fix stop sent SIGKILL to every recorded pgid. */
static void test_launch__stop_of_a_lost_run_never_signals_a_reused_pgid(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1", "--", "sleep", "1000", NULL};
    long sup;
    /* as a subreaper, this test adopts the supervisor and then its rank, and learns of each
     * one's end by reaping it */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    launch_env(f, "lost2", opts, NULL, &sup, NULL);
    json_t *st = load_json(f, "lost2", "status.json");
    long pgid = (long)jint(jrank(st, 0), "pgid");
    long long start = json_integer_value(json_object_get(jrank(st, 0), "pgid_start"));
    json_decref(st);
    assert_int_equal(kill((pid_t)sup, SIGKILL), 0);
    assert_int_equal(waitpid((pid_t)sup, NULL, 0), (pid_t)sup);
    assert_int_equal(waitpid((pid_t)pgid, NULL, 0), (pid_t)pgid); /* died of its parent's death */
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    await_tick_after(start); /* real pid reuse takes a whole wrap of the pid space, not a tick */
    pid_t other = spawn_with_pid(pgid);
    const char *stop[] = {"stop", "--root", f->root, "--id", "lost2", "--grace-ms", "100", NULL};
    struct out r = agent_run(stop);
    int alive = child_alive(other);
    kill_child(other);
    assert_true(alive);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.text, "stopped lost2\n");
    free(r.text);
    st = load_json(f, "lost2", "status.json");
    assert_string_equal(jstr(st, "state"), "stopped");
    json_decref(st);
}

static void test_launch__missing_command_fails_launch_and_the_run(void **state)
{
    struct fx *f = *state;
    const char *args[] = {"launch",
                          "--root",
                          f->root,
                          "--id",
                          "nocmd",
                          "--nproc",
                          "2",
                          "--max-restarts",
                          "3",
                          "--",
                          "./no-such-program",
                          "x",
                          NULL};
    struct out r = agent_run(args);
    assert_int_equal(r.status, 1);
    /* No started line: the X line of the run as it ended, so the client exits 127 as ps says. */
    assert_string_equal(r.text, "X 127 failed\n");
    assert_non_null(strstr(r.err, "cannot run './no-such-program'"));
    free(r.text);
    json_t *st = await_end(f, "nocmd");
    assert_string_equal(jstr(st, "state"), "failed");
    assert_int_equal(jint(st, "exit_code"), 127);
    assert_int_equal(jint(st, "restarts"), 0); /* restarting cannot make it appear */
    json_decref(st);
}

/* Tail output parsed back: per-rank bytes with their start offsets, and the X line. */
struct frames {
    char *data[4];
    size_t len[4];
    long long start[4]; /* offset of the first frame, -1 if none */
    char x[64];
    int nframes;
    int cut[4];     /* the rank's last frame ended inside a line */
    char seq[4096]; /* every line in the order the frames carried them, as "RANK:LINE\n" */
};

/* Parses tail output; asserts that every rank's frames are contiguous and that the X line, if
 * any, comes last. */
static void parse_frames(const char *p, size_t n, struct frames *fr)
{
    const char *end = p + n;
    memset(fr, 0, sizeof(*fr));
    for (int i = 0; i < 4; i++)
        fr->start[i] = -1;
    while (p < end) {
        int rank, used;
        long long off;
        size_t len;
        if (*p == 'X') {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            assert_non_null(nl);
            assert_ptr_equal(nl + 1, end);
            /* "X CODE STATE", then the summary object (checked where it matters) */
            const char *brace = memchr(p, '{', (size_t)(nl - p));
            const char *x_end = brace ? brace - 1 : nl;
            snprintf(fr->x, sizeof(fr->x), "%.*s", (int)(x_end - p), p);
            if (brace) {
                json_t *summary = json_loadb(brace, (size_t)(nl - brace), 0, NULL);
                assert_true(json_is_object(summary));
                json_decref(summary);
            }
            return;
        }
        assert_int_equal(sscanf(p, "L %d %lld %zu\n%n", &rank, &off, &len, &used), 3);
        assert_true(rank >= 0 && rank < 4);
        p += used;
        assert_true(p + len <= end);
        if (fr->start[rank] < 0)
            fr->start[rank] = off;
        assert_int_equal(off, fr->start[rank] + (long long)fr->len[rank]);
        /* Whole lines, except in lines longer than 64 KiB and for the run's final partial
         * line, which no frame of that rank may follow. */
        assert_false(fr->cut[rank]);
        fr->cut[rank] = len != 65536 && p[len - 1] != '\n';
        for (size_t i = 0; i < len; i += strcspn(p + i, "\n") + 1) {
            size_t at = strlen(fr->seq), line = strcspn(p + i, "\n");
            snprintf(fr->seq + at, sizeof(fr->seq) - at, "%d:%.*s\n", rank,
                     (int)(i + line <= len ? line : len - i), p + i);
        }
        fr->data[rank] = realloc(fr->data[rank], fr->len[rank] + len + 1);
        memcpy(fr->data[rank] + fr->len[rank], p, len);
        fr->len[rank] += len;
        fr->data[rank][fr->len[rank]] = 0;
        fr->nframes++;
        p += len;
    }
}

static void frames_release(struct frames *fr)
{
    for (int i = 0; i < 4; i++)
        free(fr->data[i]);
}

static void test_launch__tail_from_offsets_resumes_exactly(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {
        "--nproc",
        "2",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 3000 ]; do echo \"r$RANK line $i\"; i=$((i+1)); done;"
        " head -c 100000 /dev/zero | tr '\\0' x; echo; printf tail-without-newline",
        NULL};
    launch(f, "tl", opts);
    json_t *st = await_end(f, "tl");
    json_decref(st);
    char *logs[2] = {rank_log(f, "tl", 0), rank_log(f, "tl", 1)};
    const char *all[] = {"tail", "--root", f->root, "--id", "tl", NULL};
    struct out r = agent_run(all);
    assert_int_equal(r.status, 0);
    struct frames fr;
    parse_frames(r.text, r.len, &fr);
    assert_string_equal(fr.x, "X 0 succeeded");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fr.start[i], 0);
        assert_string_equal(fr.data[i], logs[i]);
    }
    frames_release(&fr);
    free(r.text);
    /* Resume rank 0 at a line boundary and rank 1 in the middle of a line. */
    long long off0 = (long long)(strstr(logs[0], "r0 line 1500\n") - logs[0]), off1 = 12345;
    char offs[64];
    snprintf(offs, sizeof(offs), "0:%lld,1:%lld", off0, off1);
    const char *resume[] = {"tail", "--root", f->root, "--id", "tl", "--offsets", offs, NULL};
    r = agent_run(resume);
    parse_frames(r.text, r.len, &fr);
    assert_int_equal(fr.start[0], off0);
    assert_int_equal(fr.start[1], off1);
    assert_string_equal(fr.data[0], logs[0] + off0);
    assert_string_equal(fr.data[1], logs[1] + off1);
    assert_string_equal(fr.x, "X 0 succeeded");
    frames_release(&fr);
    free(r.text);
    /* One rank only. */
    const char *one[] = {"tail", "--root", f->root, "--id", "tl", "--ranks", "1", NULL};
    r = agent_run(one);
    parse_frames(r.text, r.len, &fr);
    assert_int_equal(fr.start[0], -1);
    assert_string_equal(fr.data[1], logs[1]);
    frames_release(&fr);
    free(r.text);
    free(logs[0]);
    free(logs[1]);
}

/* Two ranks taking turns, each line 30 ms (three time records) after the other rank's: rank 0
 * prints a1..a4, rank 1 b1..b4, a1 b1 a2 b2 ... as written. */
static const char *const turns[] = {
    "--nproc",
    "2",
    "--",
    "sh",
    "-c",
    "i=1; while [ $i -le 4 ]; do"
    "  if [ $RANK = 0 ]; then"
    "    [ $i = 1 ] || while [ ! -e b$((i-1)) ]; do sleep 0.01; done; sleep 0.03; echo a$i; touch "
    "a$i;"
    "  else"
    "    while [ ! -e a$i ]; do sleep 0.01; done; sleep 0.03; echo b$i; touch b$i;"
    "  fi; i=$((i+1)); done",
    NULL};

#define TURNS_IN_TIME_ORDER "0:a1\n1:b1\n0:a2\n1:b2\n0:a3\n1:b3\n0:a4\n1:b4\n"
#define TURNS_RANK_BY_RANK  "0:a1\n0:a2\n0:a3\n0:a4\n1:b1\n1:b2\n1:b3\n1:b4\n"

/* tail of run `id` (all ranks), as the lines its frames carried. */
static void tail_seq(const struct fx *f, const char *id, struct frames *fr)
{
    const char *args[] = {"tail", "--root", f->root, "--id", id, NULL};
    struct out r = agent_run(args);
    assert_int_equal(r.status, 0);
    parse_frames(r.text, r.len, fr);
    free(r.text);
}

/* Several ranks' backlog goes out in the order it was written (log-times), not rank by rank;
 * a run without log-times (an older agent's), or with a version this agent does not know, is
 * still read whole, rank by rank. */
static void test_launch__tail_sends_ranks_in_the_order_they_wrote(void **state)
{
    struct fx *f = *state;
    launch(f, "turns", turns);
    json_decref(await_end(f, "turns"));
    struct frames fr;
    tail_seq(f, "turns", &fr);
    assert_string_equal(fr.seq, TURNS_IN_TIME_ORDER);
    assert_string_equal(fr.x, "X 0 succeeded");
    frames_release(&fr);
    /* the file: its version first, then records that end at each log's size */
    char dir[PATH_MAX], path[PATH_MAX + 32];
    run_dir(f, "turns", dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/log-times", dir);
    char *times = slurp(path);
    assert_non_null(times);
    assert_int_equal(strncmp(times, "gpusync-log-times 1\n", 20), 0);
    for (int rank = 0; rank < 2; rank++) {
        char *log = rank_log(f, "turns", rank), last[64] = "";
        long long size = -1, ms;
        int got;
        for (char *p = strchr(times, '\n'); p && p[1]; p = strchr(p + 1, '\n'))
            if (sscanf(p + 1, "%d %lld %lld", &got, &size, &ms) == 3 && got == rank)
                snprintf(last, sizeof(last), "%lld", size);
        char want[64];
        snprintf(want, sizeof(want), "%zu", strlen(log));
        assert_string_equal(last, want);
        free(log);
    }
    /* a version this agent does not know: ignored */
    times[18] = '9';
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(times, fp);
    fclose(fp);
    free(times);
    tail_seq(f, "turns", &fr);
    assert_string_equal(fr.seq, TURNS_RANK_BY_RANK);
    frames_release(&fr);
    /* no file at all */
    assert_int_equal(unlink(path), 0);
    tail_seq(f, "turns", &fr);
    assert_string_equal(fr.seq, TURNS_RANK_BY_RANK);
    assert_string_equal(fr.x, "X 0 succeeded");
    frames_release(&fr);
}

/* Reads from fd until the accumulated text contains want or WAIT_MS passes. */
static void read_until(int fd, char **buf, size_t *len, const char *want)
{
    long long end = now_ms() + WAIT_MS;
    while (!memmem(*buf, *len, want, strlen(want))) {
        struct pollfd p = {fd, POLLIN, 0};
        long long left = end - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            fail_msg("tail: '%s' did not arrive", want);
        *buf = realloc(*buf, *len + 65536 + 1);
        ssize_t r = read(fd, *buf + *len, 65536);
        if (r <= 0)
            fail_msg("tail ended before '%s'", want);
        *len += (size_t)r;
        (*buf)[*len] = 0;
    }
}

/* launch --follow: the started line, then the same frames `tail --follow` gives, until the run
 * ends; the exit status is the follow's. */
static void test_launch__follow_streams_the_logs_after_the_started_line(void **state)
{
    struct fx *f = *state;
    const char *args[] = {"launch",
                          "--root",
                          f->root,
                          "--id",
                          "lf",
                          "--nproc",
                          "2",
                          "--follow",
                          "all",
                          "--",
                          "sh",
                          "-c",
                          "echo \"hello from $RANK\"",
                          NULL};
    struct out r = agent_run(args);
    assert_int_equal(r.status, 0);
    char *nl = memchr(r.text, '\n', r.len);
    assert_non_null(nl);
    assert_int_equal(strncmp(r.text, "started lf ", 11), 0);
    struct frames fr;
    size_t head = (size_t)(nl - r.text) + 1;
    parse_frames(r.text + head, r.len - head, &fr);
    assert_string_equal(fr.x, "X 0 succeeded");
    assert_string_equal(fr.data[0], "hello from 0\n");
    assert_string_equal(fr.data[1], "hello from 1\n");
    frames_release(&fr);
    free(r.text);
}

static void test_launch__tail_follow_sees_a_line_within_bounded_time(void **state)
{
    struct fx *f = *state;
    char fifo[PATH_MAX];
    snprintf(fifo, sizeof(fifo), "%s/ping.fifo", f->root);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *opts[] = {
        "--nproc", "1", "--", "sh", "-c", "echo ready; cat ping.fifo; exec sleep 1000", NULL};
    launch(f, "fol", opts);
    const char *args[] = {"tail", "--root", f->root, "--id", "fol", "--follow", NULL};
    int ofd, efd;
    pid_t tail = agent_spawn(args, NULL, &ofd, &efd);
    char *buf = calloc(1, 1);
    size_t len = 0;
    read_until(ofd, &buf, &len, "ready\n");
    int w = open(fifo, O_WRONLY); /* returns once cat has opened it */
    assert_true(w >= 0);
    long long t0 = now_ms();
    assert_int_equal(write(w, "ping\n", 5), 5);
    close(w);
    read_until(ofd, &buf, &len, "ping\n");
    long long ms = now_ms() - t0;
    print_message("tail --follow: write to frame in %lld ms\n", ms);
    assert_true(ms < 500);
    const char *stop[] = {"stop", "--root", f->root, "--id", "fol", NULL};
    struct out r = agent_run(stop);
    assert_int_equal(r.status, 0);
    free(r.text);
    read_until(ofd, &buf, &len, "X ");
    assert_int_equal(wait_status(tail), 0);
    struct frames fr;
    parse_frames(buf, len, &fr);
    assert_string_equal(fr.data[0], "ready\nping\n");
    assert_string_equal(fr.x, "X 143 stopped");
    frames_release(&fr);
    free(buf);
    close(ofd);
    close(efd);
}

static void test_launch__run_survives_the_launching_process_exiting(void **state)
{
    struct fx *f = *state;
    char fifo[PATH_MAX], script[PATH_MAX * 2];
    snprintf(fifo, sizeof(fifo), "%s/go.fifo", f->root);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    /* The caller is a shell in its own session, like sshd's child; it is killed with its whole
     * process group (and hung up) right after launch returns. */
    snprintf(
        script, sizeof(script),
        "'%s' launch --root '%s' --id surv --nproc 1 -- sh -c 'cat go.fifo' && exec sleep 1000",
        agent_bin(), f->root);
    int o[2];
    assert_int_equal(pipe(o), 0);
    pid_t caller = fork();
    if (caller == 0) {
        setsid();
        dup2(o[1], 1);
        close(o[0]);
        execl("/bin/sh", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    close(o[1]);
    char *buf = calloc(1, 1);
    size_t len = 0;
    read_until(o[0], &buf, &len, "\n");
    assert_int_equal(strncmp(buf, "started surv ", 13), 0);
    kill(-caller, SIGHUP);
    kill(-caller, SIGKILL);
    wait_status(caller);
    close(o[0]);
    free(buf);
    int w = open(fifo, O_WRONLY);
    assert_true(w >= 0);
    assert_int_equal(write(w, "survived\n", 9), 9);
    close(w);
    json_t *st = await_end(f, "surv");
    assert_string_equal(jstr(st, "state"), "succeeded");
    char *log = rank_log(f, "surv", 0);
    assert_string_equal(log, "survived\n");
    free(log);
    json_decref(st);
}

static void test_launch__ps_lists_newest_first_and_names_resolve(void **state)
{
    struct fx *f = *state;
    const char *one[] = {"--nproc", "1", "--name", "exp", "--", "sh", "-c", "echo first", NULL};
    const char *two[] = {"--nproc", "1", "--name", "exp", "--", "sh", "-c", "echo second", NULL};
    launch(f, "n1", one);
    json_decref(await_end(f, "n1"));
    launch(f, "n2", two);
    json_decref(await_end(f, "n2"));
    const char *ps[] = {"ps", "--root", f->root, "--json", NULL};
    struct out r = agent_run(ps);
    assert_int_equal(r.status, 0);
    json_t *runs = json_loads(r.text, 0, NULL);
    assert_int_equal(json_array_size(runs), 2);
    json_t *newest = json_array_get(runs, 0);
    assert_string_equal(jstr(newest, "id"), "n2");
    assert_string_equal(jstr(newest, "name"), "exp");
    assert_string_equal(jstr(newest, "state"), "succeeded");
    assert_int_equal(jint(newest, "exit_code"), 0);
    assert_string_equal(json_string_value(json_array_get(json_object_get(newest, "command"), 2)),
                        "echo second");
    json_decref(runs);
    free(r.text);
    const char *tail[] = {"tail", "--root", f->root, "--id", "exp", NULL};
    r = agent_run(tail);
    struct frames fr;
    parse_frames(r.text, r.len, &fr);
    assert_string_equal(fr.data[0], "second\n");
    frames_release(&fr);
    free(r.text);
}

static void test_launch__refuses_a_duplicate_id_and_bad_usage(void **state)
{
    struct fx *f = *state;
    const char *opts[] = {"--nproc", "1", "--", "true", NULL};
    launch(f, "dup", opts);
    json_decref(await_end(f, "dup"));
    const char *again[] = {"launch",  "--root", f->root, "--id", "dup",
                           "--nproc", "1",      "--",    "true", NULL};
    struct out r = agent_run(again);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "dup"));
    assert_int_equal(r.len, 0);
    free(r.text);
    const char *bad[] = {"launch",  "--root", f->root, "--id", "../x",
                         "--nproc", "1",      "--",    "true", NULL};
    r = agent_run(bad);
    assert_int_equal(r.status, 2);
    free(r.text);
    const char *nocmd[] = {"launch", "--root", f->root, "--id", "x", "--nproc", "1", NULL};
    r = agent_run(nocmd);
    assert_int_equal(r.status, 2);
    free(r.text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_launch__env_contract_rank_by_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__a_single_rank_keeps_the_openmp_default, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__env_defaults_keep_caller_settings, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__exit_code_is_the_failing_ranks, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__crash_stops_the_others_with_no_process_left,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__max_restarts_restarts_twice_then_fails, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__concurrent_runs_get_distinct_usable_ports,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__arguments_reach_the_command_unchanged, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__a_runs_files_are_private_to_its_user, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_launch__stop_kills_every_process_even_those_ignoring_term, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__lost_supervisor_is_reported_and_stop_cleans_up,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__stop_ends_setsid_children_and_daemons_too,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_launch__a_daemon_left_by_a_finished_run_does_not_outlive_it, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_launch__stop_of_a_lost_run_reports_and_records_what_it_ended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__stop_of_a_lost_run_finds_its_escaped_children,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_launch__a_rank_killed_for_memory_is_named_out_of_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_launch__a_rank_killed_by_hand_is_not_called_out_of_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__an_exited_ranks_pgid_reused_is_never_signalled,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__stop_of_a_lost_run_never_signals_a_reused_pgid,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__missing_command_fails_launch_and_the_run,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__tail_from_offsets_resumes_exactly, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__tail_sends_ranks_in_the_order_they_wrote,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__follow_streams_the_logs_after_the_started_line,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__tail_follow_sees_a_line_within_bounded_time,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__run_survives_the_launching_process_exiting,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_launch__ps_lists_newest_first_and_names_resolve, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_launch__refuses_a_duplicate_id_and_bad_usage, setup,
                                        teardown),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
