/* cli/run_util.c: shared pieces of the run commands (see run_util.h). */
#include "cli/run_util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/progress.h"
#include "cli/run_end.h"
#include "cli/run_local.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/agent_install.h"
#include "remote/exec.h"
#include "remote/target.h"
#include "syncd/control.h"
#include "syncd/push.h"
#include "syncd/index.h"
#include "syncd/session.h"

void gs_run_ctx_init(struct gs_cli *cli, struct gs_run_ctx *rc)
{
    gs_buf_init(&rc->agent);
    gs_buf_init(&rc->dir);
    gs_cli_remote_dir(cli, &rc->dir);
    rc->resolved = NULL;
}

int gs_run_ctx_agent(struct gs_cli *cli, struct gs_run_ctx *rc)
{
    const char *how;
    if (rc->agent.len)
        return 0;
    int r = gs_cli_ensure_connected(cli);
    return r < 0 ? r : gs_agent_install(cli->ssh, &rc->agent, &how, &cli->err);
}

int gs_cli_ensure_connected(struct gs_cli *cli)
{
    return cli->ssh ? 0 : gs_cli_connect(cli);
}

/* The server as the watch daemon's connection names it (gs_ssh_target's form), learnt by
 * gs_cli_daemon_ready; "" until then. */
static char daemon_target[512];

const char *gs_cli_server_name(struct gs_cli *cli)
{
    static char name[512];
    struct gs_target t;
    struct gs_error ignored = {0};
    if (cli->ssh)
        return gs_ssh_target(cli->ssh);
    if (daemon_target[0])
        return daemon_target;
    /* Not connected: the name a connection would print, user@hostname:port as ssh -G resolves
     * them, so that messages name the server one way with or without the daemon. */
    if (cli->cfg.host &&
        gs_target_resolve(&t, cli->cfg.host, cli->cfg.port, cli->cfg.user, &ignored) == 0) {
        snprintf(name, sizeof(name), "%s@%s:%d", t.user, t.hostname, t.port);
        gs_target_release(&t);
        return name;
    }
    return cli->cfg.host ? cli->cfg.host : "the server";
}

int gs_cli_daemon_ready(struct gs_cli *cli)
{
    json_t *reply = NULL;
    int ready = gs_control_request(cli->root.data, "status", 2000, &reply, NULL) == 0 &&
                json_is_true(json_object_get(reply, "connected"));
    const char *target = json_string_value(json_object_get(reply, "target"));
    if (ready && target)
        snprintf(daemon_target, sizeof(daemon_target), "%s", target);
    json_decref(reply);
    return ready;
}

/* A wait on the daemon: the notice until the first progress, then the bar. */
struct daemon_wait {
    struct gs_progress bar;
    struct gs_notice notice;
    int notice_on;
    uint64_t last_bytes, last_total;
    int seen;
};

static uint64_t count_of(const json_t *ev, const char *key)
{
    json_int_t v = json_integer_value(json_object_get(ev, key));
    return v > 0 ? (uint64_t)v : 0;
}

static void show_batch(void *ctx, const json_t *ev)
{
    struct daemon_wait *w = ctx;
    if (w->notice_on) { /* its line, if due, comes before the bar's, not into it */
        gs_notice_end(&w->notice);
        w->notice_on = 0;
    }
    uint64_t done = count_of(ev, "ops_done"), total = count_of(ev, "ops_total");
    uint64_t bytes = count_of(ev, "bytes"), bytes_total = count_of(ev, "bytes_total");
    if (!w->seen || bytes < w->last_bytes || total != w->last_total) /* another batch */
        gs_progress_restart(&w->bar, bytes);
    w->seen = 1;
    w->last_bytes = bytes;
    w->last_total = total;
    gs_progress_update(&w->bar, done, total, bytes, bytes_total);
}

static int daemon_listening(const char *root)
{
    int fd = gs_control_connect(root, NULL);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

int gs_cli_daemon_sync(struct gs_cli *cli, const char *cmd, int timeout_ms, const char *notice,
                       json_t **reply)
{
    /* The daemon logs in as it was started. --accept-new-host-key, which its error asks for when
     * the server was recreated, is this command's: a login of its own checks and records the new
     * key (or fails as it should), and the daemon's next attempt, which a request starts at once,
     * finds it known. */
    if (cli->accept_new_host_key && !cli->ssh && daemon_listening(cli->root.data)) {
        int rc = gs_cli_connect(cli);
        if (rc < 0)
            return rc;
    }
    struct daemon_wait w = {.notice_on = 1};
    gs_progress_init(&w.bar);
    gs_notice_begin(&w.notice, GS_NOTICE_MS, "%s", notice);
    /* no terminal, no bar: then the event stream is not worth a second connection */
    int rc = gs_control_request_progress(cli->root.data, cmd, timeout_ms,
                                         w.bar.enabled ? show_batch : NULL, &w, reply, &cli->err);
    if (w.notice_on)
        gs_notice_end(&w.notice);
    gs_progress_end(&w.bar);
    return rc;
}

int gs_cli_daemon_stopped(int rc, json_t *reply)
{
    return rc == GS_E_DISCONNECTED || (rc == 0 && json_is_true(json_object_get(reply, "stopped")));
}

int gs_run_check_ranks(struct gs_cli *cli, const char *option, const char *ranks, int nranks,
                       const char *what)
{
    if (!ranks || !strcmp(ranks, "all") || nranks <= 0)
        return 0;
    for (const char *p = ranks; *p; p += strcspn(p, ","), p += *p == ',') {
        long rank = strtol(p, NULL, 10);
        if (rank < nranks)
            continue;
        if (nranks == 1)
            return gs_error_set(&cli->err, GS_E_USAGE, "%s %ld: %s has rank 0 only", option, rank,
                                what);
        return gs_error_set(&cli->err, GS_E_USAGE, "%s %ld: %s has ranks 0-%d", option, rank, what,
                            nranks - 1);
    }
    return 0;
}

const char *gs_run_state_text(json_t *run, char *buf, size_t cap)
{
    const char *state = json_string_value(json_object_get(run, "state"));
    json_t *ranks = json_object_get(run, "ranks"), *r;
    size_t i, paused = 0, running = 0;
    json_array_foreach(ranks, i, r)
    {
        paused += json_is_true(json_object_get(r, "paused"));
        running += json_is_null(json_object_get(r, "exit_code"));
    }
    /* only a running run's ranks can be paused: the agent asks /proc for no other */
    if (!state || strcmp(state, "running") != 0 || paused == 0)
        return state ? state : "-";
    if (paused >= running)
        snprintf(buf, cap, "paused");
    else
        snprintf(buf, cap, "paused:%zu/%zu", paused, json_array_size(ranks));
    return buf;
}

/* ---- commands through the watch daemon's relay (syncd/relay.h) ---- */

typedef int (*relay_out_fn)(void *ctx, const char *data, size_t len);

/* Reads an exec stream from the daemon until it ends, stdout to `out_fn`, stderr to `errout`.
 * Returns the command's exit status (-1 unknown), GS_E_INTERRUPTED, GS_E_DISCONNECTED when the
 * daemon went away before the end, or GS_E_PROTO. */
static int relay_read(int fd, struct gs_buf *buf, relay_out_fn out_fn, void *ctx,
                      struct gs_buf *errout, volatile sig_atomic_t *interrupted)
{
    struct gs_buf data = GS_BUF_INIT;
    int rc = GS_E_DISCONNECTED;
    for (;;) {
        char kind;
        int status = -1, popped;
        while ((popped = gs_control_frame_pop(buf, &kind, &data, &status)) == 1 && kind != 'x') {
            if (kind == 'e') {
                gs_buf_add(errout, data.data, data.len);
            } else if (out_fn(ctx, data.data, data.len) < 0) {
                popped = -1;
                break;
            }
        }
        if (popped == 1 || popped < 0) {
            rc = popped < 0 ? GS_E_PROTO : status;
            break;
        }
        if (interrupted && *interrupted) {
            rc = GS_E_INTERRUPTED;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char chunk[32768];
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n <= 0 && !(n < 0 && errno == EINTR))
            break;
        if (n > 0)
            gs_buf_add(buf, chunk, (size_t)n);
    }
    gs_buf_release(&data);
    return rc;
}

static int append_out(void *ctx, const char *data, size_t len)
{
    gs_buf_add(ctx, data, len);
    return 0;
}

/* Runs `cmd` through the watch daemon's relay, stdout to `out_fn`, stderr to `errout`. Returns 0
 * with the command's exit status in *status (-1 when unknown), 1 when no daemon could run it
 * (nothing ran), or a negative code with cli->err set (the daemon went away mid-way, or garbled
 * the stream). The status travels apart from the result: an exit status of 1 is not "no daemon". */
static int via_daemon(struct gs_cli *cli, const char *cmd, relay_out_fn out_fn, void *ctx,
                      struct gs_buf *errout, volatile sig_atomic_t *interrupted, int *status)
{
    struct gs_buf buf = GS_BUF_INIT;
    int fd = gs_control_exec(cli->root.data, cmd, &buf, NULL);
    int rc = 1;
    if (fd >= 0) {
        rc = relay_read(fd, &buf, out_fn, ctx, errout, interrupted);
        close(fd);
        if (rc >= -1) {
            *status = rc;
            rc = 0;
        } else if (rc == GS_E_PROTO) {
            gs_error_set(&cli->err, rc, "garbled output from the daemon");
        } else if (rc == GS_E_DISCONNECTED) {
            gs_error_set(&cli->err, rc, "the watch daemon went away");
        }
    }
    gs_buf_release(&buf);
    return rc;
}

int gs_cli_capture(struct gs_cli *cli, const char *command, struct gs_buf *out)
{
    struct gs_buf errout = GS_BUF_INIT;
    int status,
        rc = cli->ssh ? 1 : via_daemon(cli, command, append_out, out, &errout, NULL, &status);
    gs_buf_release(&errout);
    if (rc == 0)
        return status;
    gs_buf_reset(out); /* no daemon, or it could not: over our own connection */
    rc = gs_cli_ensure_connected(cli);
    return rc < 0 ? rc : gs_exec_capture(cli->ssh, command, out, NULL, &cli->err);
}

int gs_run_ctx_open(struct gs_cli *cli, struct gs_run_ctx *rc)
{
    gs_run_ctx_init(cli, rc);
    return gs_run_ctx_agent(cli, rc);
}

void gs_run_ctx_release(struct gs_run_ctx *rc)
{
    gs_buf_release(&rc->agent);
    gs_buf_release(&rc->dir);
    json_decref(rc->resolved);
    rc->resolved = NULL;
}

static int flush_through_daemon(struct gs_cli *cli)
{
    json_t *reply;
    int rc = gs_cli_daemon_sync(cli, "flush", 300000, "syncing through the watch daemon", &reply);
    if (rc == GS_E_NOTFOUND || gs_cli_daemon_stopped(rc, reply)) {
        json_decref(reply);
        return 1; /* no daemon (any more): sync over our own connection */
    }
    if (rc == 0 && !json_is_true(json_object_get(reply, "ok")))
        rc = gs_error_set(&cli->err, GS_E_REMOTE, "sync failed: %s",
                          json_string_value(json_object_get(reply, "error")));
    if (rc == 0)
        fprintf(stderr, "gpusync: synced through the watch daemon\n");
    json_decref(reply);
    return rc;
}

int gs_run_ctx_capture(struct gs_cli *cli, struct gs_run_ctx *rc, const char *sub, const char *args,
                       struct gs_buf *out, struct gs_buf *errout)
{
    struct gs_buf cmd = GS_BUF_INIT;
    int status = 0, r = 1;
    if (!cli->ssh) {
        gs_run_agent_command(rc->agent.len ? rc->agent.data : NULL, rc->dir.data, sub, args, &cmd);
        r = via_daemon(cli, cmd.data, append_out, out, errout, NULL, &status);
        if (r == 0 && status == 127 && gs_agent_reported_missing(errout))
            r = 1; /* no agent cached there: install it over our own connection */
    }
    if (r != 0) {
        gs_buf_reset(out);
        gs_buf_reset(errout);
        gs_buf_reset(&cmd);
        r = gs_run_ctx_agent(cli, rc);
        if (r == 0) {
            gs_run_agent_command(rc->agent.data, rc->dir.data, sub, args, &cmd);
            status = gs_exec_capture(cli->ssh, cmd.data, out, errout, &cli->err);
        }
    }
    gs_buf_release(&cmd);
    return r < 0 ? r : status;
}

int gs_run_ctx_stream(struct gs_cli *cli, struct gs_run_ctx *rc, const char *sub, const char *args,
                      gs_run_out_fn fn, void *ctx, struct gs_buf *errout,
                      volatile sig_atomic_t *interrupted)
{
    struct gs_buf cmd = GS_BUF_INIT;
    int status = 0, r = 1;
    if (!cli->ssh) {
        gs_run_agent_command(rc->agent.len ? rc->agent.data : NULL, rc->dir.data, sub, args, &cmd);
        r = via_daemon(cli, cmd.data, fn, ctx, errout, interrupted, &status);
        if (r == 0 && status == 127 && gs_agent_reported_missing(errout))
            r = 1; /* no agent cached there (nothing was streamed): install it ourselves */
        if (r == GS_E_INTERRUPTED)
            gs_error_set(&cli->err, r, "interrupted");
    }
    if (r == 1) {
        gs_buf_reset(errout);
        gs_buf_reset(&cmd);
        r = gs_run_ctx_agent(cli, rc);
        if (r == 0) {
            gs_run_agent_command(rc->agent.data, rc->dir.data, sub, args, &cmd);
            status =
                gs_run_stream_command(cli->ssh, cmd.data, fn, ctx, errout, interrupted, &cli->err);
            r = status < 0 ? status : 0;
        }
    }
    gs_buf_release(&cmd);
    return r < 0 ? r : status;
}

/* The notice's thread: prints the line unless the wait ends first. */
static void *notice_main(void *arg)
{
    struct gs_notice *n = arg;
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += n->after_ms / 1000;
    at.tv_nsec += (long)(n->after_ms % 1000) * 1000000L;
    at.tv_sec += at.tv_nsec / 1000000000L;
    at.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&n->lock);
    int rc = 0;
    while (!n->over && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&n->cond, &n->lock, &at);
    if (!n->over)
        fprintf(stderr, "gpusync: %s\n", n->text);
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

void gs_notice_begin(struct gs_notice *n, int after_ms, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->text, sizeof(n->text), fmt, ap);
    va_end(ap);
    n->over = 0;
    n->after_ms = after_ms;
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->cond, NULL);
    /* SIGINT stays with the main thread, which handles it. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    n->running = pthread_create(&n->thread, NULL, notice_main, n) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void gs_notice_end(struct gs_notice *n)
{
    pthread_mutex_lock(&n->lock);
    n->over = 1;
    pthread_cond_signal(&n->cond);
    pthread_mutex_unlock(&n->lock);
    if (n->running)
        pthread_join(n->thread, NULL);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->lock);
}

int gs_run_ctx_stop(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, long grace_ms,
                    struct gs_buf *out)
{
    struct gs_buf args = GS_BUF_INIT, errout = GS_BUF_INIT;
    struct gs_notice notice;
    char grace[64] = "the run's grace period (10 s unless run --grace said otherwise)";
    gs_buf_adds(&args, "--id ");
    gs_shell_quote(&args, id);
    if (grace_ms >= 0) {
        gs_buf_addf(&args, " --grace-ms %ld", grace_ms);
        snprintf(grace, sizeof(grace), "%.1f s", (double)grace_ms / 1000.0);
    }
    gs_notice_begin(&notice, GS_NOTICE_MS,
                    "stopping run %s: waiting for its processes to exit after SIGTERM; any still "
                    "running after %s get SIGKILL",
                    id, grace);
    int r = gs_run_ctx_capture(cli, rc, GS_PROTO_RUN_STOP, args.data, out, &errout);
    gs_notice_end(&notice);
    if (r > 0)
        r = gs_error_set(&cli->err, GS_E_REMOTE, "stopping run %s: %s", id,
                         errout.len ? errout.data
                         : out->len ? out->data
                                    : "failed");
    gs_buf_release(&args);
    gs_buf_release(&errout);
    return r;
}

int gs_cli_connect_unless_daemon(struct gs_cli *cli)
{
    return gs_cli_daemon_ready(cli) ? 0 : gs_cli_ensure_connected(cli);
}

/* Pushes over an opened session `s` (closed here) to cli->ssh and prints one line. */
static int push_session(struct gs_cli *cli, struct gs_session *s)
{
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    int rc = gs_session_lock(s, 1, &cli->err); /* one agent session per project (session.h) */
    if (rc == 0)
        rc = gs_session_connect(s, cli->ssh, dir.data, cli->cfg.remote_path, &cli->err);
    struct gs_push_stats st;
    struct gs_push_opts o = {0};
    if (rc == 0)
        rc = gs_push_run(cli->root.data, s->ig, s->idx, s->ops, &o, &st, &cli->err);
    if (rc == 0) {
        char b[32];
        fprintf(stderr, "gpusync: synced %zu change%s (%s) to %s in %.2f s\n", st.ops_total,
                st.ops_total == 1 ? "" : "s", gs_format_bytes(st.bytes_sent, b),
                gs_ssh_target(cli->ssh), st.elapsed_ms / 1000.0);
    }
    gs_session_close(s);
    gs_buf_release(&dir);
    return rc;
}

int gs_cli_sync(struct gs_cli *cli)
{
    int rc = flush_through_daemon(cli);
    if (rc != 1)
        return rc;
    struct gs_session s;
    if ((rc = gs_cli_ensure_connected(cli)) < 0)
        return rc;
    rc = gs_session_open(&s, cli->root.data, &cli->cfg, &cli->err);
    return rc < 0 ? rc : push_session(cli, &s);
}

char *gs_cli_node_key(const struct gs_config *cfg)
{
    struct gs_target t;
    if (gs_target_resolve(&t, cfg->host, cfg->port, cfg->user, NULL) < 0)
        return gs_session_remote_id(cfg);
    char *id = gs_target_id(&t);
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_addf(&b, "%s:%s", id, cfg->remote_path ? cfg->remote_path : "");
    free(id);
    gs_target_release(&t);
    return gs_buf_detach(&b, NULL);
}

/* The node's private index file: .gpusync/index.<node key with odd characters as '_'>.db. */
static void node_index_path(const char *root, const char *key, struct gs_buf *path)
{
    gs_buf_addf(path, "%s/%s/index.", root, GS_DIR);
    for (const char *p = key; *p; p++)
        gs_buf_addc(path, isalnum((unsigned char)*p) || *p == '.' || *p == '-' ? *p : '_');
    gs_buf_adds(path, ".db");
}

/* A session like gs_session_open's, but over the node's private index, which is named and owned
 * by the node key (gs_cli_node_key), not by how the node was written. */
static int open_node_session(struct gs_cli *cli, struct gs_session *s)
{
    struct gs_buf db = GS_BUF_INIT;
    char *key = gs_cli_node_key(&cli->cfg);
    memset(s, 0, sizeof(*s));
    s->root = gs_xstrdup(cli->root.data);
    s->cfg = &cli->cfg;
    node_index_path(cli->root.data, key, &db);
    int rc = gs_ignore_open(&s->ig, cli->root.data, (const char *const *)cli->cfg.excludes,
                            cli->cfg.n_excludes, &cli->err);
    if (rc == 0)
        rc = gs_index_open(&s->idx, db.data, key, &cli->err);
    if (rc < 0)
        gs_session_close(s);
    free(key);
    gs_buf_release(&db);
    return rc;
}

int gs_cli_sync_node(struct gs_cli *cli)
{
    struct gs_session s;
    int rc = open_node_session(cli, &s);
    return rc < 0 ? rc : push_session(cli, &s);
}

int gs_run_ctx_list(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_buf *out)
{
    struct gs_buf errout = GS_BUF_INIT;
    int r = gs_run_ctx_capture(cli, rc, GS_PROTO_RUN_PS, "--json", out, &errout);
    if (r > 0)
        r = gs_error_set(&cli->err, GS_E_REMOTE, "listing runs failed: %s",
                         errout.len ? errout.data : "no answer");
    gs_buf_release(&errout);
    return r;
}

/* The newest run whose id or name is `run` (any, when NULL). ps lists newest first. */
/* 1 while the ps entry's run may still have processes: running, or lost (stop ends those). */
static int entry_live(json_t *entry)
{
    const char *state = json_string_value(json_object_get(entry, "state"));
    return state && (!strcmp(state, "running") || !strcmp(state, "lost"));
}

/* The ps entry (newest first) that RUN names: an exact id, else the newest of that name, or
 * with `live` the newest of that name still live when one is; NULL when none. Borrowed. */
static json_t *pick_run(json_t *runs, const char *run, int live)
{
    size_t i;
    json_t *entry, *found = NULL;
    json_array_foreach(runs, i, entry)
    {
        const char *rid = json_string_value(json_object_get(entry, "id"));
        const char *name = json_string_value(json_object_get(entry, "name"));
        if (rid && (!run || strcmp(rid, run) == 0))
            return entry;
        if (rid && name && strcmp(name, run) == 0) {
            if (!live || entry_live(entry))
                return entry;
            found = found ? found : entry;
        }
    }
    return found;
}

int gs_run_ctx_resolve(struct gs_cli *cli, struct gs_run_ctx *rc, const char *run, int live,
                       struct gs_buf *id)
{
    struct gs_buf out = GS_BUF_INIT;
    int r = gs_run_ctx_list(cli, rc, &out);
    json_t *runs = r == 0 ? json_loads(out.data ? out.data : "[]", 0, NULL) : NULL;
    json_t *found = runs ? pick_run(runs, run, live) : NULL;
    json_decref(rc->resolved);
    rc->resolved = json_incref(found);
    if (found)
        gs_buf_adds(id, json_string_value(json_object_get(found, "id")));
    else if (r == 0)
        r = gs_error_set(&cli->err, GS_E_NOTFOUND,
                         run ? "no run '%s' on the server" : "no runs on the server yet%s",
                         run ? run : "");
    json_decref(runs);
    gs_buf_release(&out);
    return r;
}

void gs_log_printer_init(struct gs_log_printer *p, struct gs_cli *cli, const char *id, int prefix)
{
    memset(p, 0, sizeof(*p));
    p->cli = cli;
    p->id = id;
    p->prefix = prefix;
}

static void emit_line(struct gs_log_printer *p, int rank, const char *line, size_t len)
{
    struct gs_buf *out = p->tail_lines > 0 ? &p->kept : NULL;
    char head[32] = "";
    if (p->prefix)
        snprintf(head, sizeof(head), "[rank %d] ", rank);
    if (out) {
        gs_buf_adds(out, head);
        gs_buf_add(out, line, len);
        gs_buf_addc(out, '\n');
        return;
    }
    fputs(head, stdout);
    fwrite(line, 1, len, stdout);
    fputc('\n', stdout);
}

void gs_log_printer_chunk(void *ctx, int rank, uint64_t off, const char *data, size_t len)
{
    struct gs_log_printer *p = ctx;
    if (p->lock)
        pthread_mutex_lock(p->lock);
    if (!p->from_local_copy) {
        gs_run_local_keep(p->cli->root.data, p->id, rank, off, data, len);
        if (p->name && !p->name_kept)
            gs_run_local_keep_name(p->cli->root.data, p->id, p->name);
        p->name_kept = 1;
    }
    if (!p->prefix && p->tail_lines <= 0) {
        /* one rank's bytes as they come, as a terminal over ssh shows them: a progress bar
         * redrawn with \r and no newline (tqdm) moves, instead of arriving whole at the end */
        fwrite(data, 1, len, stdout);
        if (len)
            p->open_line = data[len - 1] != '\n';
        fflush(stdout);
        if (p->lock)
            pthread_mutex_unlock(p->lock);
        return;
    }
    struct gs_buf *part = &p->partial[rank];
    gs_buf_add(part, data, len);
    size_t start = 0;
    for (size_t i = 0; i < part->len; i++) {
        if (part->data[i] != '\n')
            continue;
        emit_line(p, rank, part->data + start, i - start);
        start = i + 1;
    }
    gs_buf_consume(part, start);
    fflush(stdout);
    if (p->lock)
        pthread_mutex_unlock(p->lock);
}

/* Prints the last N lines of what --tail kept. */
static void print_tail(struct gs_log_printer *p)
{
    size_t lines = 0, i = p->kept.len;
    while (i > 0 && lines <= (size_t)p->tail_lines)
        if (p->kept.data[--i] == '\n')
            lines++;
    if (lines > (size_t)p->tail_lines)
        i++;
    if (p->kept.len)
        fwrite(p->kept.data + i, 1, p->kept.len - i, stdout);
}

void gs_log_printer_finish(struct gs_log_printer *p)
{
    if (p->open_line) /* as emit_line ends an unterminated last line */
        fputc('\n', stdout);
    p->open_line = 0;
    for (int r = 0; r < GS_RUNS_MAX_RANKS; r++) {
        if (p->partial[r].len)
            emit_line(p, r, p->partial[r].data, p->partial[r].len);
        gs_buf_release(&p->partial[r]);
    }
    if (p->tail_lines > 0)
        print_tail(p);
    gs_buf_release(&p->kept);
    fflush(stdout);
}

void gs_log_printer_end_tail(struct gs_log_printer *p, struct gs_tail_state *st)
{
    for (int r = 0; r < GS_RUNS_MAX_RANKS; r++) {
        size_t open = p->partial[r].len;
        if (open && st->offset[r] >= open)
            st->offset[r] -= open;
        gs_buf_release(&p->partial[r]);
    }
    gs_log_printer_finish(p);
}

/* Sleeps `ms`, or less once *interrupted is set (a follower thread, where SIGINT is blocked,
 * is told to end that way). */
static void nap(int ms, volatile sig_atomic_t *interrupted)
{
    for (int left = ms; left > 0 && !(interrupted && *interrupted); left -= 100)
        usleep((useconds_t)(left < 100 ? left : 100) * 1000);
}

static int reconnect(struct gs_cli *cli, volatile sig_atomic_t *interrupted)
{
    int delay = 500;
    for (int attempt = 0; attempt < 40 && !(interrupted && *interrupted); attempt++) {
        gs_ssh_free(cli->ssh);
        cli->ssh = NULL;
        if (gs_cli_connect(cli) == 0) {
            fprintf(stderr, "gpusync: reconnected; resuming the logs\n");
            return 0;
        }
        nap(delay, interrupted);
        delay = delay * 2 > 15000 ? 15000 : delay * 2;
    }
    return cli->err.code ? cli->err.code : GS_E_DISCONNECTED;
}

static int feed_stream(void *ctx, const char *data, size_t len)
{
    return gs_run_stream_feed(ctx, data, len);
}

/* The logs through the daemon: 0 when it could show them, 1 when it could not (no daemon, or no
 * agent cached there), or a negative code. */
static int tail_via_daemon(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                           const char *ranks, int follow, struct gs_tail_state *st,
                           struct gs_log_printer *printer, volatile sig_atomic_t *interrupted)
{
    struct gs_buf cmd = GS_BUF_INIT, args = GS_BUF_INIT;
    gs_run_tail_args(id, ranks, follow, st, &args);
    gs_run_agent_command(NULL, rc->dir.data, GS_PROTO_RUN_TAIL, args.data, &cmd);
    struct gs_run_stream p = {.st = st, .fn = gs_log_printer_chunk, .ctx = printer};
    int status, r = via_daemon(cli, cmd.data, feed_stream, &p, &p.errout, interrupted, &status);
    if (r == 0 && status == 127 && gs_agent_reported_missing(&p.errout))
        r = 1;
    else if (r == 0 && status > 0 && !st->finished)
        r = gs_error_set(&cli->err, GS_E_NOTFOUND, "no run '%s' in the remote project", id);
    gs_run_stream_release(&p);
    gs_buf_release(&cmd);
    gs_buf_release(&args);
    return r;
}

int gs_run_ctx_tail(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, const char *ranks,
                    int follow, struct gs_tail_state *st, struct gs_log_printer *printer,
                    volatile sig_atomic_t *interrupted)
{
    int r = cli->ssh || rc->agent.len
                ? 1
                : tail_via_daemon(cli, rc, id, ranks, follow, st, printer, interrupted);
    if (r != 1)
        return r;
    r = gs_run_ctx_agent(cli, rc);
    return r < 0 ? r
                 : gs_run_tail(cli->ssh, rc->agent.data, rc->dir.data, id, ranks, follow, st,
                               gs_log_printer_chunk, printer, interrupted, &cli->err);
}

/* Follows from `st` on; `first` is the result of a stream already made (1: none yet). Says how
 * the run ended unless `quiet` (st keeps it for a caller that says it once for several nodes). */
static int follow_from(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, const char *ranks,
                       struct gs_log_printer *printer, volatile sig_atomic_t *interrupted,
                       int *exit_code, struct gs_tail_state *st, int first, int quiet)
{
    for (;;) {
        int r =
            first == 1 ? gs_run_ctx_tail(cli, rc, id, ranks, 1, st, printer, interrupted) : first;
        first = 1;
        if (r == 0 && st->finished) {
            *exit_code = st->exit_code < 0 ? 1 : st->exit_code;
            fflush(stdout); /* the log before the summary, on a terminal */
            if (!quiet)
                gs_run_end_print(cli, id, st->state, st->exit_code, st->summary);
            return 0;
        }
        if (r == GS_E_INTERRUPTED || (r < 0 && r != GS_E_DISCONNECTED && r != GS_E_TIMEOUT))
            return r;
        fprintf(stderr, "\ngpusync: connection lost while following run %s; reconnecting\n", id);
        if ((r = reconnect(cli, interrupted)) < 0)
            return r;
    }
}

int gs_run_ctx_follow(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id, const char *ranks,
                      struct gs_log_printer *printer, volatile sig_atomic_t *interrupted,
                      int *exit_code)
{
    struct gs_tail_state st;
    memset(&st, 0, sizeof(st));
    return follow_from(cli, rc, id, ranks, printer, interrupted, exit_code, &st, 1, 0);
}

int gs_run_ctx_follow_end(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                          const char *ranks, struct gs_log_printer *printer,
                          volatile sig_atomic_t *interrupted, int *exit_code,
                          struct gs_tail_state *st)
{
    st->finished = 0;
    return follow_from(cli, rc, id, ranks, printer, interrupted, exit_code, st, 1, 1);
}

int gs_run_ctx_follow_from(struct gs_cli *cli, struct gs_run_ctx *rc, const char *id,
                           const char *ranks, struct gs_log_printer *printer,
                           volatile sig_atomic_t *interrupted, int *exit_code,
                           struct gs_tail_state *st)
{
    return follow_from(cli, rc, id, ranks, printer, interrupted, exit_code, st, 1, 0);
}

/* Launches and follows through the watch daemon's spare connection: no SSH handshake before the
 * first log line. Returns as gs_run_launch_follow, or 1 when no daemon could do it (nothing was
 * started then). */
static int launch_follow_via_daemon(struct gs_cli *cli, struct gs_run_spec *spec, const char *ranks,
                                    struct gs_run_stream *p, volatile sig_atomic_t *interrupted)
{
    struct gs_buf cmd = GS_BUF_INIT;
    gs_run_launch_command(spec, ranks ? ranks : "all", &cmd);
    int status, rc = via_daemon(cli, cmd.data, feed_stream, p, &p->errout, interrupted, &status);
    gs_buf_release(&cmd);
    if (rc == 0 && !p->st->launched)
        rc = gs_run_stream_launch_failed(p, gs_cli_server_name(cli), &cli->err);
    if (rc == GS_E_NOTFOUND && !p->st->launched) /* no agent cached there: install here */
        rc = 1;
    return rc;
}

int gs_run_ctx_launch_follow(struct gs_cli *cli, struct gs_run_ctx *rc, struct gs_run_spec *spec,
                             const char *ranks, gs_started_fn started, struct gs_log_printer *view,
                             volatile sig_atomic_t *interrupted, int *exit_code)
{
    struct gs_tail_state st;
    memset(&st, 0, sizeof(st));
    spec->agent = rc->agent.len ? rc->agent.data : NULL;
    struct gs_run_stream p = {
        .st = &st, .fn = gs_log_printer_chunk, .started = started, .ctx = view};
    int r = cli->ssh ? 1 : launch_follow_via_daemon(cli, spec, ranks, &p, interrupted);
    gs_run_stream_release(&p);
    if (r == 1 && (r = gs_cli_ensure_connected(cli)) == 0)
        r = gs_run_launch_follow(cli->ssh, spec, ranks, &st, started, gs_log_printer_chunk, view,
                                 interrupted, &cli->err);
    if (r == GS_E_NOTFOUND && !spec->agent && strstr(cli->err.msg, GS_AGENT_MISSING)) {
        gs_error_clear(&cli->err); /* none cached there yet: install, then launch */
        if ((r = gs_run_ctx_agent(cli, rc)) == 0) {
            spec->agent = rc->agent.data;
            r = gs_run_launch_follow(cli->ssh, spec, ranks, &st, started, gs_log_printer_chunk,
                                     view, interrupted, &cli->err);
        }
    }
    if (st.launched && !rc->agent.len && st.agent[0])
        gs_buf_adds(&rc->agent, st.agent);
    if (!st.launched && (r == GS_E_DISCONNECTED || r == GS_E_TIMEOUT))
        return gs_error_set(&cli->err, r,
                            "%s while starting run %s; it may be running: see 'gpusync ps'",
                            cli->err.msg, spec->id);
    if (!st.launched && st.finished)
        *exit_code = st.exit_code; /* the launcher's X line: the command could not start */
    if (!st.launched && r != GS_E_INTERRUPTED)
        return r < 0 ? r : gs_error_set(&cli->err, GS_E_REMOTE, "run %s did not start", spec->id);
    return follow_from(cli, rc, spec->id, ranks, view, interrupted, exit_code, &st, r, 0);
}
