/* tests/e2e/test_json_contract.c: the JSON contract of docs/json-contract.md, checked against the
 * real gpusync binary and the sandbox sshd. Each test runs one --json command, requires stdout to
 * be JSON objects one per line with "v": 1, and checks every documented field and its type. A key
 * the page does not document fails the test too: adding one is a contract change, which bumps
 * the version and updates the page and the specs below together. */
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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define CONTRACT_VERSION 1
#define RUN_TIMEOUT_MS   60000
#define EVENT_TIMEOUT_MS 30000

/* ---- the documented shapes ---- */

enum { T_STR = 1, T_INT = 2, T_REAL = 4, T_BOOL = 8, T_NULL = 16, T_ARR = 32, T_OBJ = 64 };
#define T_NUM (T_INT | T_REAL)
enum { F_OPTIONAL = 1 };

/* One documented key: its allowed types and, for arrays of objects or objects, their shape. */
struct field {
    const char *key;
    unsigned types;
    unsigned flags;
    const struct field *items;
};
#define END                                                                                        \
    {                                                                                              \
        NULL, 0, 0, NULL                                                                           \
    }

static const struct field init_spec[] = {
    {"target", T_STR, 0, NULL},
    {"remote_path", T_STR, 0, NULL},
    {"auth", T_STR, 0, NULL},
    {"host_key", T_STR, 0, NULL},
    END,
};
static const struct field conflict_item[] = {
    {"path", T_STR, 0, NULL}, {"kept", T_STR, 0, NULL}, END};
static const struct field failure_item[] = {
    {"op", T_STR, 0, NULL}, {"path", T_STR, 0, NULL}, {"error", T_STR, 0, NULL}, END};
static const struct field plan_item[] = {
    {"op", T_STR, 0, NULL}, {"path", T_STR, 0, NULL}, {"bytes", T_INT, 0, NULL}, END};
static const struct field push_spec[] = {
    {"dry_run", T_BOOL, 0, NULL},
    {"sent", T_INT, 0, NULL},
    {"bytes", T_INT, 0, NULL},
    {"link_bytes", T_INT, 0, NULL},
    {"compress_level", T_INT, 0, NULL},
    {"server_gone", T_INT, F_OPTIONAL, NULL},
    {"server_changed", T_INT, F_OPTIONAL, NULL},
    {"deleted", T_INT, 0, NULL},
    {"renamed", T_INT, 0, NULL},
    {"mkdirs", T_INT, 0, NULL},
    {"symlinks", T_INT, 0, NULL},
    {"chmods", T_INT, 0, NULL},
    {"unchanged", T_INT, 0, NULL},
    {"failed_count", T_INT, 0, NULL},
    {"seconds", T_NUM, 0, NULL},
    {"conflicts", T_ARR, 0, conflict_item},
    {"failures", T_ARR, 0, failure_item},
    {"transport", T_STR, 0, NULL},
    {"ops", T_ARR, F_OPTIONAL, plan_item},
    END,
};
static const struct field pulled_item[] = {
    {"remote", T_STR, 0, NULL}, {"local", T_STR, 0, NULL}, END};
static const struct field kept_item[] = {{"local", T_STR, 0, NULL}, {"kept", T_STR, 0, NULL}, END};
static const struct field link_item[] = {
    {"remote", T_STR, 0, NULL}, {"local", T_STR, 0, NULL}, {"target", T_STR, 0, NULL}, END};
static const struct field skipped_item[] = {
    {"path", T_STR, 0, NULL}, {"kind", T_STR, 0, NULL}, END};
static const struct field pull_failure_item[] = {
    {"path", T_STR, 0, NULL}, {"error", T_STR, 0, NULL}, END};
static const struct field held_item[] = {{"path", T_STR, 0, NULL}, {"writer", T_STR, 0, NULL}, END};
static const struct field pull_spec[] = {{"files", T_ARR, 0, pulled_item},
                                         {"symlinks", T_ARR, 0, link_item},
                                         {"skipped", T_ARR, 0, skipped_item},
                                         {"bytes", T_INT, 0, NULL},
                                         {"kept", T_ARR, 0, kept_item},
                                         {"failures", T_ARR, 0, pull_failure_item},
                                         {"open_for_writing", T_ARR, 0, held_item},
                                         {"error", T_STR, F_OPTIONAL, NULL},
                                         {"message", T_STR, F_OPTIONAL, NULL},
                                         END};
static const struct field watch_detach_spec[] = {{"pid", T_INT, 0, NULL}, END};
static const struct field watch_stop_spec[] = {{"was_running", T_BOOL, 0, NULL},
                                               {"unsent", T_INT, F_OPTIONAL, NULL},
                                               {"unchecked", T_BOOL, F_OPTIONAL, NULL},
                                               END};
static const struct field status_daemon_spec[] = {
    {"daemon", T_BOOL, 0, NULL},
    {"state", T_STR, 0, NULL},
    {"connected", T_BOOL, 0, NULL},
    {"pending", T_INT, 0, NULL},
    {"last_error", T_STR | T_NULL, 0, NULL},
    {"last_latency_ms", T_INT | T_NULL, 0, NULL},
    {"target", T_STR, 0, NULL},
    {"transport", T_STR, 0, NULL},
    {"pid", T_INT, 0, NULL},
    {"watches", T_INT, 0, NULL},
    {"polling", T_BOOL, 0, NULL},
    {"spare_ready", T_BOOL, 0, NULL},
    {"relayed", T_INT, 0, NULL},
    {"unreachable_since", T_STR | T_NULL, 0, NULL},
    {"conflicts", T_ARR, 0, conflict_item},
    END,
};
static const struct field op_item[] = {
    {"op", T_STR, 0, NULL}, {"path", T_STR, 0, NULL}, {"error", T_STR, F_OPTIONAL, NULL}, END};
static const struct field status_local_spec[] = {
    {"daemon", T_BOOL, 0, NULL},
    {"daemon_silent", T_BOOL, 0, NULL},
    {"state", T_STR, 0, NULL},
    {"target", T_STR, 0, NULL},
    {"pending", T_INT, 0, NULL},
    {"bytes_pending", T_INT, 0, NULL},
    {"unconfirmed", T_INT, 0, NULL},
    {"ops", T_ARR, 0, op_item},
    {"conflicts", T_ARR, 0, conflict_item},
    END,
};
static const struct field flush_daemon_spec[] = {{"daemon", T_BOOL, 0, NULL},
                                                 {"ms", T_INT, 0, NULL},
                                                 {"conflicts", T_ARR, 0, conflict_item},
                                                 END};
static const struct field run_spec[] = {{"id", T_STR, 0, NULL},
                                        {"ranks", T_INT, 0, NULL},
                                        {"master_port", T_INT, 0, NULL},
                                        {"gpus", T_ARR | T_NULL, 0, NULL},
                                        END};
static const struct field rank_item[] = {
    {"rank", T_INT, 0, NULL},
    {"local_rank", T_INT, 0, NULL},
    {"pid", T_INT, 0, NULL},
    {"pgid", T_INT, 0, NULL},
    {"pgid_start", T_INT, 0, NULL},
    {"group_gone", T_BOOL, 0, NULL},
    {"exit_code", T_INT | T_NULL, 0, NULL},
    {"signal", T_INT | T_NULL, 0, NULL},
    {"oom", T_BOOL, 0, NULL},
    {"stopped", T_BOOL, 0, NULL},
    {"paused", T_BOOL, 0, NULL},
    END,
};
static const struct field killed_item[] = {{"pid", T_INT, 0, NULL}, {"name", T_STR, 0, NULL}, END};
static const struct field run_item[] = {
    {"id", T_STR, 0, NULL},
    {"state", T_STR, 0, NULL},
    {"exit_code", T_INT | T_NULL, 0, NULL},
    {"restarts", T_INT, 0, NULL},
    {"start", T_STR, 0, NULL},
    {"end", T_STR | T_NULL, 0, NULL},
    {"supervisor_pid", T_INT, 0, NULL},
    {"master_port", T_INT, 0, NULL},
    {"ranks", T_ARR, 0, rank_item},
    {"name", T_STR | T_NULL, 0, NULL},
    {"command", T_ARR | T_NULL, 0, NULL},
    {"gpus", T_ARR | T_NULL, 0, NULL},
    {"duration_ms", T_INT, 0, NULL},
    {"max_restarts", T_INT, 0, NULL},
    {"grace_ms", T_INT, 0, NULL},
    {"failed_rank", T_INT | T_NULL, 0, NULL},
    {"oom_scope", T_STR | T_NULL, 0, NULL},
    {"cgroup", T_STR | T_NULL, 0, NULL},
    {"others_termed", T_INT, 0, NULL},
    {"killed_count", T_INT, 0, NULL},
    {"killed", T_ARR, 0, killed_item},
    END,
};
static const struct field ps_spec[] = {{"runs", T_ARR, 0, run_item}, END};
static const struct field stop_spec[] = {{"id", T_STR, 0, NULL}, {"report", T_STR, 0, NULL}, END};
static const struct field check_item[] = {
    {"name", T_STR, 0, NULL},
    {"status", T_STR, 0, NULL},
    {"detail", T_STR, 0, NULL},
    {"hint", T_STR | T_NULL, 0, NULL},
    END,
};
static const struct field gpu_item[] = {
    {"index", T_INT, 0, NULL},
    {"name", T_STR, 0, NULL},
    {"memory_total_mib", T_NUM, 0, NULL},
    {"memory_used_mib", T_NUM, 0, NULL},
    {"utilization_pct", T_NUM, 0, NULL},
    END,
};
static const struct field nccl_spec[] = {
    {"system", T_STR | T_NULL, 0, NULL}, {"python", T_STR | T_NULL, 0, NULL}, END};
static const struct field facts_spec[] = {
    {"auth", T_STR, 0, NULL},
    {"host_key", T_STR, 0, NULL},
    {"rtt_ms", T_NUM, F_OPTIONAL, NULL},
    {"os", T_STR | T_NULL, 0, NULL},
    {"arch", T_STR | T_NULL, 0, NULL},
    {"kernel", T_STR | T_NULL, 0, NULL},
    {"driver", T_STR | T_NULL, 0, NULL},
    {"cuda", T_STR | T_NULL, 0, NULL},
    {"python", T_STR | T_NULL, 0, NULL},
    {"torch", T_STR | T_NULL, 0, NULL},
    {"disk_free_bytes", T_INT | T_NULL, 0, NULL},
    {"gpus", T_ARR, 0, gpu_item},
    {"nccl", T_OBJ, 0, nccl_spec},
    {"shell_noise", T_STR | T_NULL, 0, NULL},
    {"shell_noise_files", T_STR | T_NULL, 0, NULL},
    END,
};
static const struct field doctor_spec[] = {
    {"checks", T_ARR, 0, check_item}, {"facts", T_OBJ, 0, facts_spec}, END};
static const struct field top_cpu[] = {
    {"cores", T_INT, 0, NULL},
    {"load1", T_NUM | T_NULL, 0, NULL},
    {"load5", T_NUM | T_NULL, 0, NULL},
    {"load15", T_NUM | T_NULL, 0, NULL},
    {"util_pct", T_NUM, 0, NULL},
    {"iowait_pct", T_NUM, 0, NULL},
    END,
};
static const struct field top_memory[] = {{"total_mib", T_NUM, 0, NULL},
                                          {"used_mib", T_NUM, 0, NULL},
                                          {"available_mib", T_NUM, 0, NULL},
                                          END};
static const struct field top_disk[] = {
    {"name", T_STR, 0, NULL}, {"read_mb_s", T_NUM, 0, NULL}, {"write_mb_s", T_NUM, 0, NULL}, END};
static const struct field top_net[] = {
    {"name", T_STR, 0, NULL}, {"rx_mb_s", T_NUM, 0, NULL}, {"tx_mb_s", T_NUM, 0, NULL}, END};
static const struct field top_gpu[] = {
    {"index", T_INT, 0, NULL},
    {"name", T_STR, 0, NULL},
    {"util_pct", T_NUM | T_NULL, 0, NULL},
    {"mem_used_mib", T_NUM | T_NULL, 0, NULL},
    {"mem_total_mib", T_NUM | T_NULL, 0, NULL},
    {"power_w", T_NUM | T_NULL, 0, NULL},
    {"temp_c", T_NUM | T_NULL, 0, NULL},
    END,
};
static const struct field top_rank[] = {
    {"rank", T_INT, 0, NULL},    {"pid", T_INT, 0, NULL},
    {"state", T_STR, 0, NULL},   {"exit_code", T_INT | T_NULL, 0, NULL},
    {"paused", T_BOOL, 0, NULL}, END};
static const struct field top_run[] = {{"id", T_STR, 0, NULL},
                                       {"state", T_STR, 0, NULL},
                                       {"ranks", T_ARR, 0, top_rank},
                                       {"samples_per_s", T_NUM | T_NULL, 0, NULL},
                                       END};
static const struct field top_spec[] = {
    {"time", T_STR, 0, NULL},
    {"interval_ms", T_INT, 0, NULL},
    {"cpu", T_OBJ, 0, top_cpu},
    {"memory", T_OBJ, 0, top_memory},
    {"disks", T_ARR, 0, top_disk},
    {"net", T_ARR, 0, top_net},
    {"gpus", T_ARR, 0, top_gpu},
    {"gpu_error", T_STR | T_NULL, 0, NULL},
    {"gpu_summary", T_STR, 0, NULL},
    {"run", T_OBJ | T_NULL, 0, top_run},
    END,
};
static const struct field error_spec[] = {
    {"error", T_STR, 0, NULL}, {"message", T_STR, 0, NULL}, END};

/* Events: "v" and "event", then these. */
static const struct field ev_synced[] = {{"path", T_STR, 0, NULL}, {"ms", T_INT, 0, NULL}, END};
static const struct field ev_deleted[] = {{"path", T_STR, 0, NULL}, END};
static const struct field ev_renamed[] = {{"path", T_STR, 0, NULL}, {"from", T_STR, 0, NULL}, END};
static const struct field ev_conflict[] = {{"path", T_STR, 0, NULL}, {"kept", T_STR, 0, NULL}, END};
static const struct field ev_error[] = {
    {"path", T_STR | T_NULL, 0, NULL}, {"message", T_STR, 0, NULL}, END};
static const struct field ev_connected[] = {{"target", T_STR, 0, NULL}, END};
static const struct field ev_disconnected[] = {{"message", T_STR, 0, NULL}, END};
static const struct field ev_idle[] = {END};
static const struct field ev_progress[] = {{"ops_done", T_INT, 0, NULL},
                                           {"ops_total", T_INT, 0, NULL},
                                           {"bytes", T_INT, 0, NULL},
                                           {"bytes_total", T_INT, 0, NULL},
                                           END};

static const struct {
    const char *name;
    const struct field *spec;
} event_specs[] = {
    {"synced", ev_synced},
    {"deleted", ev_deleted},
    {"renamed", ev_renamed},
    {"conflict", ev_conflict},
    {"error", ev_error},
    {"connected", ev_connected},
    {"disconnected", ev_disconnected},
    {"idle", ev_idle},
    {"progress", ev_progress},
};
#define N_EVENT_KINDS (sizeof(event_specs) / sizeof(event_specs[0]))

/* ---- checking a value against a shape ---- */

static unsigned type_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return T_STR;
    case JSON_INTEGER:
        return T_INT;
    case JSON_REAL:
        return T_REAL;
    case JSON_TRUE:
    case JSON_FALSE:
        return T_BOOL;
    case JSON_NULL:
        return T_NULL;
    case JSON_ARRAY:
        return T_ARR;
    default:
        return T_OBJ;
    }
}

static int documented(const char *key, const struct field *spec, const char *const *extra)
{
    for (const struct field *f = spec; f->key; f++)
        if (strcmp(f->key, key) == 0)
            return 1;
    for (size_t i = 0; extra && extra[i]; i++)
        if (strcmp(extra[i], key) == 0)
            return 1;
    return 0;
}

static void check_object(const json_t *o, const struct field *spec, const char *const *extra,
                         const char *where);

/* Checks one value of `f` (and, for arrays and objects with a shape, what they hold). */
static void check_value(const json_t *v, const struct field *f, const char *where)
{
    if (!(type_of(v) & f->types))
        fail_msg("%s: \"%s\" has the wrong type: %s", where, f->key,
                 json_dumps(v, JSON_ENCODE_ANY));
    if (!f->items)
        return;
    char inner[256];
    snprintf(inner, sizeof(inner), "%s.%s", where, f->key);
    if (json_is_object(v)) {
        check_object(v, f->items, NULL, inner);
        return;
    }
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item)
    {
        if (!json_is_object(item))
            fail_msg("%s[%zu]: not an object", inner, i);
        check_object(item, f->items, NULL, inner);
    }
}

/* Every documented key is there with its type; every key there is documented (`extra` lists the
 * keys of the envelope, such as "v" and "ok"). */
static void check_object(const json_t *o, const struct field *spec, const char *const *extra,
                         const char *where)
{
    for (const struct field *f = spec; f->key; f++) {
        json_t *v = json_object_get(o, f->key);
        if (!v && !(f->flags & F_OPTIONAL))
            fail_msg("%s: documented field \"%s\" is missing in %s", where, f->key,
                     json_dumps(o, JSON_COMPACT));
        if (v)
            check_value(v, f, where);
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        if (!documented(key, spec, extra))
            fail_msg("%s: \"%s\" is not in docs/json-contract.md (a new field bumps \"v\")", where,
                     key);
    }
}

static const char *const envelope_keys[] = {"v", "ok", NULL};
static const char *const event_keys[] = {"v", "event", NULL};

/* The reply's envelope ("v": 1, "ok" as wanted) and its fields. */
static void check_reply(const json_t *o, int want_ok, const struct field *spec, const char *where)
{
    json_t *v = json_object_get(o, "v"), *ok = json_object_get(o, "ok");
    if (!json_is_integer(v) || json_integer_value(v) != CONTRACT_VERSION)
        fail_msg("%s: \"v\" is not %d", where, CONTRACT_VERSION);
    if (!json_is_boolean(ok) || json_is_true(ok) != want_ok)
        fail_msg("%s: \"ok\" is not %s in %s", where, want_ok ? "true" : "false",
                 json_dumps(o, JSON_COMPACT));
    check_object(o, spec, envelope_keys, where);
}

static void expect_one_of(const char *where, const char *value, const char *const *allowed)
{
    for (size_t i = 0; allowed[i]; i++)
        if (value && strcmp(value, allowed[i]) == 0)
            return;
    fail_msg("%s: \"%s\" is not a documented value", where, value ? value : "(null)");
}

/* ---- running gpusync ---- */

struct proc {
    pid_t pid;
    int out_fd, err_fd;
};

struct result {
    int status; /* exit code, or 128+N for signal N */
    struct gs_buf out, err;
};

static struct gs_test_sshd server;
static char project[600]; /* initialised against `server` */
static char remote[600];  /* its remote directory (this same machine) */
static char scratch[600]; /* for pulls and other projects */

/* Starts gpusync ARGS in `cwd` with stdout and stderr piped, stdin /dev/null, no terminal. */
static struct proc proc_start(const char *cwd, const char *const *args)
{
    int out[2], err[2];
    /* close-on-exec: a daemon that gpusync forks must not keep our pipes open */
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    struct proc p = {fork(), out[0], err[0]};
    assert_true(p.pid >= 0);
    if (p.pid == 0) {
        setsid();
        int null = open("/dev/null", O_RDONLY);
        if (chdir(cwd) != 0 || null < 0)
            _exit(126);
        dup2(null, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        const char *argv[32] = {gs_test_build_path("cli/gpusync")};
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    return p;
}

static int proc_wait(struct proc *p)
{
    int st;
    assert_int_equal(waitpid(p->pid, &st, 0), p->pid);
    return gs_test_exit_status(st);
}

/* Reads both pipes to EOF (killing the child after RUN_TIMEOUT_MS), then reaps it. */
static struct result proc_finish(struct proc *p)
{
    struct gs_test_result t = gs_test_finish(p->pid, p->out_fd, p->err_fd, RUN_TIMEOUT_MS);
    struct result r = {t.status, t.out, t.err};
    return r;
}

static struct result run_in(const char *cwd, const char *const *args)
{
    struct proc p = proc_start(cwd, args);
    return proc_finish(&p);
}

#define ARGS(...)          ((const char *const[]){__VA_ARGS__, NULL})
#define GPUSYNC(...)       run_in(project, ARGS(__VA_ARGS__))
#define GPUSYNC_IN(d, ...) run_in((d), ARGS(__VA_ARGS__))

static void result_release(struct result *r)
{
    gs_buf_release(&r->out);
    gs_buf_release(&r->err);
}

/* stdout must be exactly one line holding one JSON object; returns it (a new reference). */
static json_t *only_object(const struct result *r, const char *what)
{
    const char *out = r->out.data;
    size_t len = r->out.len;
    if (len == 0 || out[len - 1] != '\n' || memchr(out, '\n', len) != out + len - 1)
        fail_msg("%s: stdout is not exactly one line (exit %d)\nstdout: %s\nstderr: %s", what,
                 r->status, out, r->err.data);
    json_error_t err;
    json_t *o = json_loadb(out, len, 0, &err);
    if (!json_is_object(o))
        fail_msg("%s: stdout is not a JSON object: %s\n%s", what, err.text, out);
    return o;
}

/* Runs a command that must succeed and checks its reply against `spec`; returns the reply. */
static json_t *reply_of(struct result r, int want_status, const struct field *spec,
                        const char *what)
{
    if (r.status != want_status)
        fail_msg("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.status, want_status,
                 r.out.data, r.err.data);
    json_t *o = only_object(&r, what);
    check_reply(o, want_status == 0, spec, what);
    result_release(&r);
    return o;
}

static const char *str_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static long long int_of(const json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

/* ---- files ---- */

static void write_file(const char *dir, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void make_dir(const char *dir, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

/* ---- the daemon and its events ---- */

static long daemon_pid; /* the daemon start_daemon() started */

static void start_daemon(void)
{
    json_t *o = reply_of(GPUSYNC("watch", "--json", "-d"), 0, watch_detach_spec, "watch -d");
    daemon_pid = (long)int_of(o, "pid");
    json_decref(o);
}

/* Waits until process `pid` (not our child) has exited, through a pidfd. */
static void wait_gone(long pid)
{
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0) {
        assert_int_equal(errno, ESRCH); /* already gone */
        return;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, EVENT_TIMEOUT_MS);
    close(fd);
    if (n != 1)
        fail_msg("the daemon (pid %ld) was still running %d ms after watch --stop", pid,
                 EVENT_TIMEOUT_MS);
}

/* `watch --stop` answers when the daemon closes its socket, a moment before the process exits
 * and drops its lock (a `watch -d` in that moment fails with "conflict"): wait for the exit too. */
static void stop_daemon(void)
{
    json_t *o = reply_of(GPUSYNC("watch", "--json", "--stop"), 0, watch_stop_spec, "watch --stop");
    assert_true(json_is_true(json_object_get(o, "was_running")));
    json_decref(o);
    wait_gone(daemon_pid);
}

/* Reads the next line from `p`'s stdout within the event timeout; NULL at EOF. */
static char *next_line(struct proc *p, struct gs_buf *pending)
{
    int64_t end = gs_clock_mono_ms() + EVENT_TIMEOUT_MS;
    for (;;) {
        char *nl = pending->len ? memchr(pending->data, '\n', pending->len) : NULL;
        if (nl) {
            char *line = strndup(pending->data, (size_t)(nl - pending->data));
            gs_buf_consume(pending, (size_t)(nl - pending->data) + 1);
            return line;
        }
        struct pollfd fd = {.fd = p->out_fd, .events = POLLIN};
        int left = (int)(end - gs_clock_mono_ms());
        if (left <= 0)
            fail_msg("no event within %d ms", EVENT_TIMEOUT_MS);
        if (poll(&fd, 1, left) <= 0)
            continue;
        char chunk[4096];
        ssize_t n = read(p->out_fd, chunk, sizeof(chunk));
        if (n == 0)
            return NULL;
        if (n > 0)
            gs_buf_add(pending, chunk, (size_t)n);
    }
}

/* Checks one event line against its kind's shape; returns the kind's index. */
static size_t check_event(const char *line)
{
    json_error_t err;
    json_t *ev = json_loads(line, 0, &err);
    if (!json_is_object(ev))
        fail_msg("event line is not a JSON object: %s", line);
    if (int_of(ev, "v") != CONTRACT_VERSION || !json_is_integer(json_object_get(ev, "v")))
        fail_msg("event without \"v\": %d: %s", CONTRACT_VERSION, line);
    const char *kind = str_of(ev, "event");
    for (size_t i = 0; i < N_EVENT_KINDS; i++) {
        if (kind && strcmp(kind, event_specs[i].name) == 0) {
            check_object(ev, event_specs[i].spec, event_keys, kind);
            json_decref(ev);
            return i;
        }
    }
    fail_msg("undocumented event kind: %s", line);
    return 0;
}

static size_t kind_index(const char *name)
{
    for (size_t i = 0; i < N_EVENT_KINDS; i++)
        if (strcmp(event_specs[i].name, name) == 0)
            return i;
    fail_msg("no such event kind %s", name);
    return 0;
}

/* Reads events (checking each) until one of kind `want` arrives; counts kinds in `seen`. */
static void read_until(struct proc *p, struct gs_buf *pending, const char *want, int *seen)
{
    size_t target = kind_index(want);
    for (;;) {
        char *line = next_line(p, pending);
        if (!line)
            fail_msg("the event stream ended before a \"%s\" event", want);
        size_t k = check_event(line);
        free(line);
        seen[k]++;
        if (k == target)
            return;
    }
}

/* `events` subscribes after it starts, and says nothing when it has: make changes until the
 * first event shows the stream is live (each try is a synchronous flush, then a short look). */
static void wait_subscribed(struct proc *p, struct gs_buf *pending, int *seen)
{
    for (int i = 0; i < 100; i++) {
        char name[32];
        snprintf(name, sizeof(name), "probe-%d.txt", i);
        write_file(project, name, "probe");
        json_decref(reply_of(GPUSYNC("flush", "--json"), 0, flush_daemon_spec, "flush"));
        struct pollfd fd = {.fd = p->out_fd, .events = POLLIN};
        if (pending->len || poll(&fd, 1, 200) > 0) {
            read_until(p, pending, "idle", seen);
            return;
        }
    }
    fail_msg("gpusync events showed no event after 100 changes");
}

/* ---- group setup: one server, one project ---- */

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (gs_test_sshd_start(&server, NULL) != 0)
        return -1;
    gs_test_sshd_use_home(&server, 1);
    snprintf(project, sizeof(project), "/tmp/gs-contract-project.XXXXXX");
    snprintf(remote, sizeof(remote), "/tmp/gs-contract-remote.XXXXXX");
    snprintf(scratch, sizeof(scratch), "/tmp/gs-contract-scratch.XXXXXX");
    if (!mkdtemp(project) || !mkdtemp(remote) || !mkdtemp(scratch))
        return -1;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", server.port);
    struct result r = GPUSYNC("init", target, "--path", remote);
    int rc = r.status;
    if (rc != 0)
        fprintf(stderr, "init failed: %s\n", r.err.data);
    result_release(&r);
    return rc == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    struct result r = GPUSYNC("watch", "--stop");
    result_release(&r);
    gs_test_sshd_destroy(&server);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' '%s'", project, remote, scratch);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- one test per command ---- */

static void test_contract__init_reports_target_auth_and_host_key(void **state)
{
    (void)state;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", server.port);
    json_t *o = reply_of(GPUSYNC("init", "--json", target, "--path", remote), 0, init_spec, "init");
    assert_string_equal(str_of(o, "target"), target);
    assert_string_equal(str_of(o, "remote_path"), remote);
    assert_true(strncmp(str_of(o, "host_key"), "SHA256:", 7) == 0);
    json_decref(o);
}

static void test_contract__push_summary_counts_what_it_sent(void **state)
{
    (void)state;
    write_file(project, "pushed.txt", "twelve bytes");
    struct result r = GPUSYNC("push", "--json");
    /* "seconds" is whole milliseconds, printed short ("0.083", not "0.083000000000000004") */
    const char *sec = strstr(r.out.data ? r.out.data : "", "\"seconds\":");
    assert_non_null(sec);
    size_t digits = strspn(sec + 10, "0123456789.e-");
    if (digits > 8)
        fail_msg("seconds printed with %zu characters: %s", digits, r.out.data);
    json_t *o = reply_of(r, 0, push_spec, "push");
    assert_false(json_is_true(json_object_get(o, "dry_run")));
    assert_true(int_of(o, "sent") >= 1);
    assert_true(int_of(o, "bytes") >= 12);
    assert_null(json_object_get(o, "ops")); /* only on a dry run */
    assert_int_equal(int_of(o, "failed_count"), 0);
    json_decref(o);
}

static void test_contract__push_dry_run_lists_the_planned_ops(void **state)
{
    (void)state;
    write_file(project, "planned.txt", "1234567");
    json_t *o = reply_of(GPUSYNC("push", "--json", "--dry-run"), 0, push_spec, "push --dry-run");
    assert_true(json_is_true(json_object_get(o, "dry_run")));
    assert_string_equal(str_of(o, "transport"), "none");
    json_t *ops = json_object_get(o, "ops"), *op;
    size_t i;
    int found = 0;
    json_array_foreach(ops, i, op)
    {
        expect_one_of(
            "push ops[].op", str_of(op, "op"),
            (const char *const[]){"put", "mkdir", "delete", "rename", "symlink", "chmod", NULL});
        if (strcmp(str_of(op, "path"), "planned.txt") == 0) {
            found = 1;
            assert_string_equal(str_of(op, "op"), "put");
            assert_int_equal(int_of(op, "bytes"), 7);
        }
    }
    assert_true(found);
    json_decref(o);
}

static void test_contract__push_names_a_conflict_and_the_kept_copy(void **state)
{
    (void)state;
    write_file(project, "both.txt", "v1\n");
    json_decref(reply_of(GPUSYNC("push", "--json"), 0, push_spec, "push"));
    write_file(remote, "both.txt", "changed on the server\n");
    write_file(project, "both.txt", "v2\n");
    json_t *o = reply_of(GPUSYNC("push", "--json"), 0, push_spec, "push with a conflict");
    json_t *c = json_array_get(json_object_get(o, "conflicts"), 0);
    assert_non_null(c);
    assert_string_equal(str_of(c, "path"), "both.txt");
    assert_true(strncmp(str_of(c, "kept"), "both.txt.gpusync-conflict-", 26) == 0);
    json_decref(o);
}

/* Sets a file's mtime to `sec` (content untouched): a push then finds it unchanged. */
static void set_mtime(const char *dir, const char *rel, time_t sec)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    struct timespec t[2] = {{.tv_sec = sec}, {.tv_sec = sec}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* One push after the same kind of change each round: a file edited, one touched (a new mtime:
 * sent as a chmod), one whose mtime is set again to what it was (read again, unchanged), one
 * deleted. Every mtime is long past: a file modified within the last moments is hashed again on
 * each push (its stat is not trusted yet) and would count as unchanged in one round and not the
 * next. */
static struct result push_after_changes(int round, const char *json)
{
    char text[32], gone[32];
    snprintf(text, sizeof(text), "round %d\n", round);
    write_file(project, "edited.txt", text);
    set_mtime(project, "edited.txt", 1100000000 + round);
    set_mtime(project, "touched.txt", 1000000000 + round);
    set_mtime(project, "same.txt", 1000000000);
    snprintf(gone, sizeof(gone), "gone%d.txt", round);
    sh("rm '%s/%s'", project, gone);
    return json ? GPUSYNC("push", json) : GPUSYNC("push");
}

/* The text summary's count named `word`, as JSON names it: the key itself, `word`_count, or the
 * length of the array `word`. -1 when JSON has no such count. */
static long long json_count(const json_t *o, const char *word)
{
    char key[64];
    snprintf(key, sizeof(key), "%s_count", word);
    const json_t *v = json_object_get(o, word);
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_array(v))
        return (long long)json_array_size(v);
    v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* A plugin or a person reading both must not have to know that one word means another: each
 * count the text summary prints is named as in --json, and has the same value after the same
 * change ("skipped" was JSON's "unchanged"). */
static void test_contract__push_text_summary_names_counts_as_json_does(void **state)
{
    (void)state;
    write_file(project, "edited.txt", "start\n");
    write_file(project, "touched.txt", "same bytes\n");
    write_file(project, "same.txt", "same mtime\n");
    write_file(project, "gone1.txt", "1");
    write_file(project, "gone2.txt", "2");
    sh("find '%s' -path '%s/.gpusync' -prune -o -type f -exec touch -m -d @1000000000 {} +",
       project, project);
    json_decref(reply_of(GPUSYNC("push", "--json"), 0, push_spec, "push"));
    struct result text = push_after_changes(1, NULL);
    json_t *o = reply_of(push_after_changes(2, "--json"), 0, push_spec, "push");
    if (text.status != 0)
        fail_msg("push: exit %d\n%s", text.status, text.err.data);
    assert_int_equal(int_of(o, "unchanged"), 1); /* the case the words differed on */
    assert_int_equal(int_of(o, "chmods"), 1);    /* "modes" in words once; a touch shows it */
    int counts = 0;
    char *save = NULL;
    for (char *part = strtok_r(text.out.data, ",\n", &save); part;
         part = strtok_r(NULL, ",\n", &save)) {
        char word[32];
        long long n;
        if (sscanf(part, " %31[a-z_] %lld", word, &n) != 2)
            fail_msg("push summary: cannot read \"%s\"", part);
        if (json_count(o, word) != n)
            fail_msg("push summary says \"%s %lld\"; --json has %lld for it\n%s", word, n,
                     json_count(o, word), json_dumps(o, JSON_COMPACT));
        counts++;
    }
    assert_true(counts >= 6); /* sent, deleted, renamed, conflicts, unchanged, failed */
    result_release(&text);
    json_decref(o);
}

static void test_contract__pull_lists_each_file_written(void **state)
{
    (void)state;
    make_dir(project, "results");
    write_file(project, "results/metrics.csv", "epoch,loss\n");
    json_decref(reply_of(GPUSYNC("push", "--json"), 0, push_spec, "push"));
    char local[800];
    snprintf(local, sizeof(local), "%s/pulled", scratch);
    json_t *o = reply_of(GPUSYNC("pull", "--json", "results", local), 0, pull_spec, "pull");
    json_t *f = json_array_get(json_object_get(o, "files"), 0);
    assert_non_null(f);
    assert_string_equal(str_of(f, "remote"), "results/metrics.csv");
    assert_true(strstr(str_of(f, "local"), "/pulled/metrics.csv") != NULL);
    assert_int_equal(int_of(o, "bytes"), 11);
    json_decref(o);
}

static void test_contract__status_without_daemon_lists_pending_ops(void **state)
{
    (void)state;
    write_file(project, "waiting.txt", "x");
    json_t *o = reply_of(GPUSYNC("status", "--json"), 0, status_local_spec, "status (no daemon)");
    assert_false(json_is_true(json_object_get(o, "daemon")));
    assert_string_equal(str_of(o, "state"), "pending");
    assert_int_equal(int_of(o, "pending"), (long long)json_array_size(json_object_get(o, "ops")));
    json_decref(o);
    json_decref(reply_of(GPUSYNC("push", "--json"), 0, push_spec, "push"));
    o = reply_of(GPUSYNC("status", "--json"), 0, status_local_spec, "status (no daemon)");
    assert_string_equal(str_of(o, "state"), "up_to_date");
    json_decref(o);
}

static void test_contract__watch_reports_pid_then_was_running(void **state)
{
    (void)state;
    json_t *o = reply_of(GPUSYNC("watch", "--json", "-d"), 0, watch_detach_spec, "watch -d");
    assert_true(int_of(o, "pid") > 0);
    long pid = (long)int_of(o, "pid");
    json_decref(o);
    o = reply_of(GPUSYNC("watch", "--json", "-d"), 6, error_spec, "a second watch -d");
    assert_string_equal(str_of(o, "error"), "conflict");
    json_decref(o);
    o = reply_of(GPUSYNC("watch", "--json", "--stop"), 0, watch_stop_spec, "watch --stop");
    assert_true(json_is_true(json_object_get(o, "was_running")));
    assert_non_null(json_object_get(o, "unsent")); /* optional only when none was running */
    json_decref(o);
    wait_gone(pid);
    o = reply_of(GPUSYNC("watch", "--json", "--stop"), 0, watch_stop_spec, "watch --stop again");
    assert_false(json_is_true(json_object_get(o, "was_running")));
    json_decref(o);
}

static void test_contract__status_with_daemon_has_every_field(void **state)
{
    (void)state;
    start_daemon();
    json_decref(reply_of(GPUSYNC("flush", "--json"), 0, flush_daemon_spec, "flush"));
    json_t *o = reply_of(GPUSYNC("status", "--json"), 0, status_daemon_spec, "status (daemon)");
    assert_true(json_is_true(json_object_get(o, "daemon")));
    expect_one_of(
        "status.state", str_of(o, "state"),
        (const char *const[]){"up_to_date", "syncing", "connecting", "disconnected", NULL});
    assert_true(json_is_true(json_object_get(o, "connected")));
    json_decref(o);
    stop_daemon();
}

static void test_contract__flush_reports_ms_or_falls_back_to_push(void **state)
{
    (void)state;
    start_daemon();
    write_file(project, "flushed.txt", "f");
    json_t *o = reply_of(GPUSYNC("flush", "--json"), 0, flush_daemon_spec, "flush (daemon)");
    assert_true(json_is_true(json_object_get(o, "daemon")));
    assert_true(int_of(o, "ms") >= 0);
    json_decref(o);
    stop_daemon();
    write_file(project, "flushed2.txt", "g");
    o = reply_of(GPUSYNC("flush", "--json"), 0, push_spec, "flush (no daemon)");
    assert_true(int_of(o, "sent") >= 1);
    json_decref(o);
}

static void test_contract__events_stream_types_every_kind(void **state)
{
    (void)state;
    int seen[N_EVENT_KINDS] = {0};
    start_daemon();
    json_decref(reply_of(GPUSYNC("flush", "--json"), 0, flush_daemon_spec, "flush"));
    struct proc ev = proc_start(project, ARGS("events", "--json"));
    struct gs_buf pending = GS_BUF_INIT;
    wait_subscribed(&ev, &pending, seen);
    write_file(project, "ev.txt", "1");
    read_until(&ev, &pending, "idle", seen);
    write_file(remote, "ev.txt", "changed on the server");
    write_file(project, "ev.txt", "2");
    read_until(&ev, &pending, "conflict", seen);
    sh("mv '%s/ev.txt' '%s/ev2.txt'", project, project);
    read_until(&ev, &pending, "renamed", seen);
    sh("rm '%s/ev2.txt'", project);
    read_until(&ev, &pending, "deleted", seen);
    gs_test_sshd_stop(&server); /* the daemon notices within its liveness period */
    read_until(&ev, &pending, "disconnected", seen);
    assert_int_equal(gs_test_sshd_restart(&server, 0), 0);
    read_until(&ev, &pending, "connected", seen);
    stop_daemon();
    for (char *line; (line = next_line(&ev, &pending)) != NULL; free(line))
        seen[check_event(line)]++;
    assert_int_equal(proc_wait(&ev), 0); /* the stream ends with the daemon */
    close(ev.out_fd);
    close(ev.err_fd);
    gs_buf_release(&pending);
    assert_true(seen[kind_index("synced")] >= 1);
}

/* A loopback port nothing listens on: bound, read back, closed. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_contract__errors_carry_a_name_and_a_message(void **state)
{
    (void)state;
    json_t *o = reply_of(GPUSYNC("events", "--json"), 1, error_spec, "events without a daemon");
    assert_string_equal(str_of(o, "error"), "not found");
    json_decref(o);
    char target[64], unreachable[700];
    int port = closed_port();
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", port);
    o = reply_of(GPUSYNC_IN(scratch, "init", "--json", target), 4, error_spec,
                 "init to a closed port");
    assert_string_equal(str_of(o, "error"), "cannot connect");
    assert_true(strstr(str_of(o, "message"), "127.0.0.1") != NULL);
    json_decref(o);
    /* exec exits with the remote command's status: the same object, exit 255 */
    snprintf(unreachable, sizeof(unreachable), "%s/unreachable", scratch);
    sh("mkdir -p '%s/.gpusync' && printf '[remote]\\nhost = 127.0.0.1\\nport = %d\\n' > "
       "'%s/.gpusync/config'",
       unreachable, port, unreachable);
    o = reply_of(GPUSYNC_IN(unreachable, "exec", "--json", "true"), 255, error_spec,
                 "exec against a closed port");
    assert_string_equal(str_of(o, "error"), "cannot connect");
    json_decref(o);
    o = reply_of(GPUSYNC_IN(scratch, "status", "--json"), 1, error_spec,
                 "status outside a project");
    assert_string_equal(str_of(o, "error"), "not found");
    json_decref(o);
}

/* The remote project path holds a file: the connection is fine but nothing can be synced there.
 * push fails with the error object (exit 5, "remote error"), not a summary of no failed
 * operations (it said "ok":true and exited 1) nor "connection lost"; exec exits 255 with the
 * same error, not mkdir's 1 (which the command itself could return); doctor fails "disk". */
static void test_contract__a_file_at_the_remote_path_is_a_remote_error(void **state)
{
    (void)state;
    char dir[700], file[700];
    snprintf(dir, sizeof(dir), "%s/file-at-path", scratch);
    snprintf(file, sizeof(file), "%s/remote-is-a-file", scratch);
    sh("mkdir -p '%s/.gpusync' && echo x > '%s/a.txt' && echo not-a-folder > '%s' && printf "
       "'[remote]\\nhost = 127.0.0.1\\nport = %d\\nuser = root\\npath = %s\\n' > "
       "'%s/.gpusync/config'",
       dir, dir, file, server.port, file, dir);
    json_t *o = reply_of(GPUSYNC_IN(dir, "push", "--json"), 5, error_spec, "push to a file");
    assert_string_equal(str_of(o, "error"), "remote error");
    assert_non_null(strstr(str_of(o, "message"), file));
    json_decref(o);
    o = reply_of(GPUSYNC_IN(dir, "exec", "--json", "pwd"), 255, error_spec, "exec in a file");
    assert_string_equal(str_of(o, "error"), "remote error");
    json_decref(o);
    o = reply_of(GPUSYNC_IN(dir, "doctor", "--json"), 1, doctor_spec, "doctor, path a file");
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(o, "checks"), i, c) if (!strcmp(str_of(c, "name"), "disk"))
        assert_string_equal(str_of(c, "status"), "fail");
    json_decref(o);
    sh("rm -rf '%s' '%s'", dir, file);
}

/* A server where the agent cannot be installed (the user's HOME is not writable; here sshd's
 * SetEnv points HOME where nothing can be made): push fails with the error object, exit 5, and
 * a message. It printed a summary with "ok":true, failed_count 0 and transport "", exited 1,
 * and said nothing. */
static void test_contract__push_that_cannot_install_the_agent_is_an_error(void **state)
{
    (void)state;
    struct gs_test_sshd nohome;
    char dir[700];
    if (gs_test_sshd_start(&nohome, NULL) != 0)
        fail_msg("a second sandbox sshd did not start");
    assert_int_equal(
        gs_test_sshd_fake_program(&nohome, "gs-unused", "#!/bin/sh\n", "HOME=/proc/gs-no-home"), 0);
    snprintf(dir, sizeof(dir), "%s/no-home", scratch);
    sh("printf '[127.0.0.1]:%d %%s' \"$(cat '%s/host_ed25519.pub')\" >> '%s/.ssh/known_hosts'",
       nohome.port, nohome.dir, server.home);
    sh("mkdir -p '%s/.gpusync' && echo x > '%s/a.txt' && printf '[remote]\\nhost = "
       "127.0.0.1\\nport = %d\\nuser = root\\npath = %s/remote\\nidentity = "
       "%s/.ssh/id_ed25519\\n[sync]\\nresident = off\\n' > '%s/.gpusync/config'",
       dir, dir, nohome.port, dir, nohome.home, dir);
    json_t *o = reply_of(GPUSYNC_IN(dir, "push", "--json"), 5, error_spec, "push, no HOME");
    assert_string_equal(str_of(o, "error"), "remote error");
    assert_non_null(strstr(str_of(o, "message"), "/proc/gs-no-home"));
    json_decref(o);
    gs_test_sshd_destroy(&nohome);
    sh("rm -rf '%s'", dir);
}

/* Runs `args` in `dir` and requires the one error object with exit 3, "configuration error". */
static void expect_config_error(const char *dir, const char *const *args, const char *what)
{
    json_t *o = reply_of(run_in(dir, args), 3, error_spec, what);
    assert_string_equal(str_of(o, "error"), "configuration error");
    json_decref(o);
}

/* Bytes that are not UTF-8, in a config value or in the project's path (which error messages
 * quote), still give the one JSON object the contract promises: jansson refuses such strings, and
 * the commands printed nothing at all. */
static void test_contract__bytes_that_are_not_utf8_still_give_one_object(void **state)
{
    (void)state;
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/caf\xe9", scratch);
    sh("mkdir -p '%s/.gpusync' && printf '[remote]\\nhost = 127.0.0.1\\nport = %d\\nuser = "
       "r\\351oot\\n' > '%s/.gpusync/config'",
       dir, server.port, dir);
    expect_config_error(dir, ARGS("status", "--json"), "status, a user that is not UTF-8");
    expect_config_error(dir, ARGS("push", "--json"), "push, a user that is not UTF-8");
    sh("printf '[remote]\\nhost = 127.0.0.1\\nbogus = 1\\n' > '%s/.gpusync/config'", dir);
    expect_config_error(dir, ARGS("status", "--json"), "status, a path that is not UTF-8");
    sh("rm -rf '%s'", dir);
}

static void test_contract__doctor_has_checks_and_facts(void **state)
{
    (void)state;
    json_t *o = reply_of(GPUSYNC("doctor", "--json"), 0, doctor_spec, "doctor");
    json_t *checks = json_object_get(o, "checks"), *c;
    size_t i;
    int ssh_ok = 0;
    json_array_foreach(checks, i, c)
    {
        expect_one_of("doctor checks[].status", str_of(c, "status"),
                      (const char *const[]){"ok", "warn", "fail", NULL});
        ssh_ok |= strcmp(str_of(c, "name"), "ssh") == 0 && strcmp(str_of(c, "status"), "ok") == 0;
    }
    assert_true(ssh_ok);
    json_decref(o);
}

/* The run commands need the server-side launcher (gpusync-agent launch/ps/stop). */

static void test_contract__run_detach_reports_id_ranks_and_port(void **state)
{
    (void)state;
    json_t *o = reply_of(
        GPUSYNC("run", "--json", "--cpu", "2", "--detach", "--", "sh", "-c", "echo rank $RANK"), 0,
        run_spec, "run --detach");
    assert_int_equal(int_of(o, "ranks"), 2);
    assert_true(int_of(o, "master_port") > 0);
    struct result logs = GPUSYNC("logs", "-f", str_of(o, "id")); /* returns when the run ends */
    assert_int_equal(logs.status, 0);
    result_release(&logs);
    json_decref(o);
}

static void test_contract__ps_lists_runs_with_every_field(void **state)
{
    (void)state;
    json_t *run = reply_of(
        GPUSYNC("run", "--json", "--cpu", "1", "--detach", "--name", "contract", "--", "true"), 0,
        run_spec, "run --detach");
    struct result logs = GPUSYNC("logs", "-f", str_of(run, "id"));
    result_release(&logs);
    json_t *o = reply_of(GPUSYNC("ps", "--json"), 0, ps_spec, "ps");
    json_t *first = json_array_get(json_object_get(o, "runs"), 0); /* newest first */
    assert_non_null(first);
    assert_string_equal(str_of(first, "id"), str_of(run, "id"));
    assert_string_equal(str_of(first, "name"), "contract");
    expect_one_of("ps runs[].state", str_of(first, "state"),
                  (const char *const[]){"running", "succeeded", "failed", "stopped", "lost", NULL});
    assert_string_equal(str_of(first, "state"), "succeeded");
    assert_int_equal(int_of(first, "exit_code"), 0);
    json_decref(o);
    json_decref(run);
}

static void test_contract__stop_reports_the_run_id(void **state)
{
    (void)state;
    json_t *run = reply_of(GPUSYNC("run", "--json", "--cpu", "1", "--detach", "--", "sleep", "300"),
                           0, run_spec, "run --detach");
    json_t *o = reply_of(GPUSYNC("stop", "--json", str_of(run, "id")), 0, stop_spec, "stop");
    assert_string_equal(str_of(o, "id"), str_of(run, "id"));
    json_decref(o);
    json_decref(run);
}

static void test_contract__top_samples_the_server_and_the_running_run(void **state)
{
    (void)state;
    json_t *run = reply_of(GPUSYNC("run", "--json", "--cpu", "1", "--detach", "--", "sleep", "300"),
                           0, run_spec, "run --detach");
    json_t *o =
        reply_of(GPUSYNC("top", "--json", "--count", "1", "--interval", "0.2"), 0, top_spec, "top");
    json_t *top_run = json_object_get(o, "run");
    assert_true(json_is_object(top_run)); /* so its shape was checked too */
    assert_string_equal(str_of(top_run, "id"), str_of(run, "id"));
    json_decref(o);
    o = reply_of(GPUSYNC("stop", "--json", str_of(run, "id")), 0, stop_spec, "stop");
    json_decref(o);
    json_decref(run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract__init_reports_target_auth_and_host_key),
        cmocka_unit_test(test_contract__push_summary_counts_what_it_sent),
        cmocka_unit_test(test_contract__push_dry_run_lists_the_planned_ops),
        cmocka_unit_test(test_contract__push_names_a_conflict_and_the_kept_copy),
        cmocka_unit_test(test_contract__push_text_summary_names_counts_as_json_does),
        cmocka_unit_test(test_contract__pull_lists_each_file_written),
        cmocka_unit_test(test_contract__status_without_daemon_lists_pending_ops),
        cmocka_unit_test(test_contract__watch_reports_pid_then_was_running),
        cmocka_unit_test(test_contract__status_with_daemon_has_every_field),
        cmocka_unit_test(test_contract__flush_reports_ms_or_falls_back_to_push),
        cmocka_unit_test(test_contract__events_stream_types_every_kind),
        cmocka_unit_test(test_contract__errors_carry_a_name_and_a_message),
        cmocka_unit_test(test_contract__bytes_that_are_not_utf8_still_give_one_object),
        cmocka_unit_test(test_contract__a_file_at_the_remote_path_is_a_remote_error),
        cmocka_unit_test(test_contract__push_that_cannot_install_the_agent_is_an_error),
        cmocka_unit_test(test_contract__doctor_has_checks_and_facts),
        cmocka_unit_test(test_contract__run_detach_reports_id_ranks_and_port),
        cmocka_unit_test(test_contract__ps_lists_runs_with_every_field),
        cmocka_unit_test(test_contract__stop_reports_the_run_id),
        cmocka_unit_test(test_contract__top_samples_the_server_and_the_running_run),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
