/* remote/runs.c: launching and following remote runs (see runs.h). */
#include "remote/runs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/agent_install.h"
#include "remote/exec.h"

/* Appends `body`, which names the agent as `agent` (GS_AGENT_CACHED when NULL), as it must run:
 * as it is, or inside the loop over the cached builds. */
static void add_agent_command(const char *agent, const struct gs_buf *body, struct gs_buf *cmd)
{
    if (agent)
        gs_buf_add(cmd, body->data, body->len);
    else
        gs_agent_cached_command(body->data, cmd);
}

void gs_run_agent_command(const char *agent, const char *remote_dir, const char *sub,
                          const char *args, struct gs_buf *cmd)
{
    struct gs_buf body = GS_BUF_INIT;
    gs_buf_addf(&body, "mkdir -p -- %s && cd -- %s && exec %s %s --root . %s", remote_dir,
                remote_dir, agent ? agent : GS_AGENT_CACHED, sub, args ? args : "");
    add_agent_command(agent, &body, cmd);
    gs_buf_release(&body);
}

/* Appends the launch command for `spec`; with `follow`, the launcher then streams those ranks'
 * logs. Without spec->agent it runs whichever agent build is cached there. */
void gs_run_launch_command(const struct gs_run_spec *spec, const char *follow, struct gs_buf *cmd)
{
    struct gs_buf body = GS_BUF_INIT;
    gs_buf_addf(&body,
                "mkdir -p -- %s && cd -- %s && %s%sexec %s " GS_PROTO_RUN_LAUNCH " --root . --id ",
                spec->remote_dir, spec->remote_dir, spec->extra_env ? spec->extra_env : "",
                spec->extra_env ? " " : "", spec->agent ? spec->agent : GS_AGENT_CACHED);
    gs_shell_quote(&body, spec->id);
    gs_buf_addf(&body, " --nproc %d --max-restarts %d", spec->nproc, spec->max_restarts);
    if (spec->grace_ms > 0)
        gs_buf_addf(&body, " --grace-ms %ld", spec->grace_ms);
    if (spec->gpus) {
        gs_buf_adds(&body, " --gpus ");
        gs_shell_quote(&body, spec->gpus);
        if (spec->gpu_count > 0)
            gs_buf_addf(&body, " --ngpus %d", spec->gpu_count);
        if (spec->wait_gpus)
            gs_buf_adds(&body, " --wait");
    }
    if (spec->name) {
        gs_buf_adds(&body, " --name ");
        gs_shell_quote(&body, spec->name);
    }
    if (spec->nnodes > 1)
        gs_buf_addf(&body, " --nnodes %d --node-rank %d", spec->nnodes, spec->node_rank);
    if (spec->master_addr) {
        gs_buf_adds(&body, " --master-addr ");
        gs_shell_quote(&body, spec->master_addr);
    }
    if (spec->master_port > 0)
        gs_buf_addf(&body, " --master-port %d", spec->master_port);
    if (follow) {
        gs_buf_adds(&body, " --follow ");
        gs_shell_quote(&body, follow);
    }
    gs_buf_adds(&body, " -- ");
    gs_shell_quote_argv(&body, spec->argc, spec->argv);
    add_agent_command(spec->agent, &body, cmd);
    gs_buf_release(&body);
}

/* The error for a launcher that printed no "started" line. */
static int launch_failed(const char *target, const struct gs_buf *out, const struct gs_buf *errout,
                         struct gs_error *err)
{
    const char *why = errout->len ? errout->data : out->len ? out->data : "no answer";
    return gs_error_set(err, gs_agent_reported_missing(errout) ? GS_E_NOTFOUND : GS_E_REMOTE,
                        "the run did not start on %s: %s", target, why);
}

int gs_run_launch_state(struct gs_ssh *ssh, const struct gs_run_spec *spec,
                        struct gs_tail_state *st, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT, errout = GS_BUF_INIT;
    struct gs_run_stream p = {.st = st};
    memset(st, 0, sizeof(*st));
    gs_run_launch_command(spec, NULL, &cmd);
    int rc = gs_exec_capture(ssh, cmd.data, &out, &errout, err);
    /* The same parser as a followed launch: waiting and gpus lines may come first. Also on a
     * failed launch: one whose command could not start says how the run ended (an X line). */
    int fed = rc >= 0 && out.data ? gs_run_stream_feed(&p, out.data, out.len) : -1;
    if (rc == 0 && (fed < 0 || !st->launched))
        rc = 1;
    if (rc > 0)
        rc = launch_failed(gs_ssh_target(ssh), &out, &errout, err);
    gs_run_stream_release(&p);
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    gs_buf_release(&errout);
    return rc;
}

/* ---- following ---- */

/* The launcher's started line (proto/run.h), which names the agent when it also follows. */
static int parse_started(struct gs_run_stream *p, size_t head)
{
    int path_at;
    struct gs_tail_state *st = p->st;
    p->in.data[head - 1] = '\0';
    if (gs_proto_run_started_parse(p->in.data, &st->pid, &st->port, &path_at) < 0)
        return -1;
    struct gs_buf word = GS_BUF_INIT;
    if (path_at)
        gs_shell_quote(&word, p->in.data + path_at);
    snprintf(st->agent, sizeof(st->agent), "%s", word.len ? word.data : "");
    gs_buf_release(&word);
    st->launched = 1;
    if (p->started)
        p->started(p->ctx, st);
    gs_buf_consume(&p->in, head);
    return 0;
}

/* Consumes complete frames from the parser's buffer. Returns 0, or -1 on garbage. */
static int parse_frames(struct gs_run_stream *p)
{
    for (;;) {
        char *nl = p->in.len ? memchr(p->in.data, '\n', p->in.len) : NULL;
        if (!nl)
            return 0;
        size_t head = (size_t)(nl - p->in.data) + 1;
        int rank, code, summary_at;
        unsigned long long off, len;
        char state[GS_PROTO_RUN_STATE_MAX];
        if (gs_proto_run_log_parse(p->in.data, &rank, &off, &len) == 0) {
            if (rank < 0 || rank >= GS_RUNS_MAX_RANKS || len > GS_PROTO_RUN_MAX_CHUNK ||
                off > UINT64_MAX - len)
                return -1; /* a length that would wrap head + len is garbage, not a frame */
            if (p->in.len < head + len)
                return 0;                            /* the data has not all arrived */
            if (off == p->st->offset[rank] && p->fn) /* never deliver a byte twice */
                p->fn(p->ctx, rank, off, p->in.data + head, (size_t)len);
            if (off + len > p->st->offset[rank])
                p->st->offset[rank] = off + len;
            gs_buf_consume(&p->in, head + (size_t)len);
        } else if (!p->st->launched && gs_proto_run_is_started(p->in.data)) {
            if (parse_started(p, head) < 0)
                return -1;
        } else if (!p->st->launched && gs_proto_run_gpus_parse(p->in.data, p->st->gpus) == 0) {
            gs_buf_consume(&p->in, head);
        } else if (!p->st->launched &&
                   gs_proto_run_waiting_parse(p->in.data, p->st->waiting) == 0) {
            if (p->started)
                p->started(p->ctx, p->st);
            gs_buf_consume(&p->in, head);
        } else if (gs_proto_run_exit_parse(p->in.data, &code, state, &summary_at) == 0) {
            p->st->finished = 1;
            p->st->exit_code = code;
            snprintf(p->st->state, sizeof(p->st->state), "%s", state);
            p->in.data[head - 1] = '\0';
            snprintf(p->st->summary, sizeof(p->st->summary), "%s",
                     summary_at ? p->in.data + summary_at : "");
            gs_buf_consume(&p->in, head);
        } else {
            return -1;
        }
    }
}

int gs_run_stream_feed(struct gs_run_stream *p, const char *data, size_t len)
{
    gs_buf_add(&p->in, data, len);
    return parse_frames(p);
}

int gs_run_stream_launch_failed(struct gs_run_stream *p, const char *target, struct gs_error *err)
{
    return launch_failed(target, &p->in, &p->errout, err);
}

void gs_run_stream_release(struct gs_run_stream *p)
{
    gs_buf_release(&p->in);
    gs_buf_release(&p->errout);
}

static void offsets_arg(const struct gs_tail_state *st, struct gs_buf *cmd)
{
    int first = 1;
    for (int r = 0; r < GS_RUNS_MAX_RANKS; r++) {
        if (!st->offset[r])
            continue;
        gs_buf_addf(cmd, "%s%d:%llu", first ? " --offsets " : ",", r,
                    (unsigned long long)st->offset[r]);
        first = 0;
    }
}

/* Reads a channel until EOF, an interrupt or an error: stdout to `fn` (which fails the stream,
 * as garbled `what`, by returning < 0), stderr to `errout` (its first 4 KiB). */
static int pump_output(struct gs_ssh *ssh, LIBSSH2_CHANNEL *ch, gs_run_out_fn fn, void *ctx,
                       struct gs_buf *errout, volatile sig_atomic_t *interrupted, const char *what,
                       struct gs_error *err)
{
    char buf[32768];
    struct gs_exec_gate gate;
    gs_exec_gate_init(&gate, ssh);
    for (;;) {
        if (interrupted && *interrupted)
            return GS_E_INTERRUPTED;
        char ebuf[1024];
        ssize_t e;
        while ((e = gs_exec_read(ch, &gate, 1, ebuf, sizeof(ebuf))) > 0)
            if (errout->len < 4096)
                gs_buf_add(errout, ebuf, (size_t)e);
        ssize_t n = gs_exec_read(ch, &gate, 0, buf, sizeof(buf));
        if (n > 0) {
            if (fn(ctx, buf, (size_t)n) < 0)
                return gs_error_set(err, GS_E_PROTO, "garbled %s from %s", what,
                                    gs_ssh_target(ssh));
            continue;
        }
        if (n == 0 && libssh2_channel_eof(ch))
            return 0;
        if (n < 0 && n != LIBSSH2_ERROR_EAGAIN)
            return gs_ssh_error(ssh, (int)n, what, err);
        /* Wake up at least every 100 ms to notice Ctrl-C. */
        int rc = gs_ssh_wait(ssh, gs_clock_mono_ms() + 100, err);
        if (rc < 0 && rc != GS_E_TIMEOUT)
            return rc;
    }
}

static int feed_run_stream(void *ctx, const char *data, size_t len)
{
    return gs_run_stream_feed(ctx, data, len);
}

/* Reads the tail channel until EOF, an interrupt or an error. */
static int pump_tail(struct gs_ssh *ssh, LIBSSH2_CHANNEL *ch, struct gs_run_stream *p,
                     volatile sig_atomic_t *interrupted, struct gs_error *err)
{
    return pump_output(ssh, ch, feed_run_stream, p, &p->errout, interrupted, "log stream", err);
}

/* Frees a channel we stop reading, waiting (briefly) for the close exchange. A single
 * non-blocking libssh2_channel_free answers EAGAIN and frees nothing, which left the channel
 * half-closed and later made the session's own free time out and leak (seen under ASan after
 * Ctrl-C in `logs -f`). */
static void abandon_channel(struct gs_ssh *ssh, LIBSSH2_CHANNEL *ch)
{
    struct gs_error ignored = {0};
    int64_t deadline = gs_clock_mono_ms() + 2000;
    while (libssh2_channel_free(ch) == LIBSSH2_ERROR_EAGAIN)
        if (gs_ssh_wait(ssh, deadline, &ignored) < 0)
            return; /* gs_ssh_free tries once more */
}

/* Runs `cmd` and feeds its output to `p` until EOF, an interrupt or an error. Returns 0 with the
 * command's exit status in *status (-1 if unknown), or a negative code. */
static int follow_command(struct gs_ssh *ssh, const char *cmd, struct gs_run_stream *p,
                          volatile sig_atomic_t *interrupted, int *status, struct gs_error *err)
{
    *status = -1;
    LIBSSH2_CHANNEL *ch = gs_exec_open(ssh, cmd, err);
    int rc = ch ? pump_tail(ssh, ch, p, interrupted, err) : (err ? err->code : GS_E_REMOTE);
    if (ch && rc == GS_E_INTERRUPTED)
        abandon_channel(ssh, ch); /* the remote tail ends when its stdout closes */
    else if (ch)
        *status = gs_exec_close(ssh, ch, err);
    return rc;
}

int gs_run_stream_command(struct gs_ssh *ssh, const char *cmd, gs_run_out_fn fn, void *ctx,
                          struct gs_buf *errout, volatile sig_atomic_t *interrupted,
                          struct gs_error *err)
{
    LIBSSH2_CHANNEL *ch = gs_exec_open(ssh, cmd, err);
    if (!ch)
        return err && err->code ? err->code : GS_E_REMOTE;
    int rc = pump_output(ssh, ch, fn, ctx, errout, interrupted, "output", err);
    if (rc == GS_E_INTERRUPTED || rc == GS_E_PROTO)
        abandon_channel(ssh, ch); /* the remote command sees its stdout close */
    else if (rc == 0)
        return gs_exec_close(ssh, ch, err);
    return rc;
}

void gs_run_tail_args(const char *id, const char *ranks, int follow, const struct gs_tail_state *st,
                      struct gs_buf *args)
{
    gs_buf_adds(args, "--id ");
    gs_shell_quote(args, id);
    gs_buf_adds(args, " --ranks ");
    gs_shell_quote(args, ranks ? ranks : "all");
    offsets_arg(st, args);
    if (follow)
        gs_buf_adds(args, " --follow");
}

int gs_run_tail(struct gs_ssh *ssh, const char *agent, const char *remote_dir, const char *id,
                const char *ranks, int follow, struct gs_tail_state *st, gs_tail_fn fn, void *ctx,
                volatile sig_atomic_t *interrupted, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, args = GS_BUF_INIT;
    gs_run_tail_args(id, ranks, follow, st, &args);
    gs_run_agent_command(agent, remote_dir, GS_PROTO_RUN_TAIL, args.data, &cmd);
    struct gs_run_stream p = {.st = st, .fn = fn, .ctx = ctx};
    int status;
    int rc = follow_command(ssh, cmd.data, &p, interrupted, &status, err);
    if (rc == 0 && status > 0 && !st->finished)
        rc = gs_error_set(err, GS_E_NOTFOUND, "no run '%s' in the remote project", id);
    gs_run_stream_release(&p);
    gs_buf_release(&args);
    gs_buf_release(&cmd);
    return rc;
}

int gs_run_launch_follow(struct gs_ssh *ssh, const struct gs_run_spec *spec, const char *ranks,
                         struct gs_tail_state *st, gs_started_fn started, gs_tail_fn fn, void *ctx,
                         volatile sig_atomic_t *interrupted, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT;
    gs_run_launch_command(spec, ranks ? ranks : "all", &cmd);
    struct gs_run_stream p = {.st = st, .fn = fn, .started = started, .ctx = ctx};
    int status;
    int rc = follow_command(ssh, cmd.data, &p, interrupted, &status, err);
    if (rc == 0 && !st->launched)
        rc = gs_run_stream_launch_failed(&p, gs_ssh_target(ssh), err);
    gs_run_stream_release(&p);
    gs_buf_release(&cmd);
    return rc;
}

int gs_run_stop(struct gs_ssh *ssh, const char *agent, const char *remote_dir, const char *id,
                struct gs_buf *out, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, errout = GS_BUF_INIT, args = GS_BUF_INIT;
    gs_buf_adds(&args, "--id ");
    gs_shell_quote(&args, id);
    gs_run_agent_command(agent, remote_dir, GS_PROTO_RUN_STOP, args.data, &cmd);
    int rc = gs_exec_capture(ssh, cmd.data, out, &errout, err);
    if (rc > 0)
        rc = gs_error_set(err, GS_E_REMOTE, "stopping run %s: %s", id,
                          errout.len  ? errout.data
                          : out->data ? out->data
                                      : "failed");
    gs_buf_release(&cmd);
    gs_buf_release(&errout);
    gs_buf_release(&args);
    return rc;
}
