/* cli/cmd_push.c: `gpusync push`: one sync of the project (or some paths) to the server, with a
 * progress bar, a summary, conflicts reported, and --dry-run listing the plan. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/progress.h"
#include "cli/run_util.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "common/quote.h"
#include "common/wrapper.h"
#include "syncd/control.h"
#include "syncd/push.h"
#include "syncd/session.h"

enum { OPT_DRY_RUN = 2000 };

static const struct option push_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"dry-run", no_argument, NULL, OPT_DRY_RUN},
    {NULL, 0, NULL, 0},
};

struct push_ui {
    struct gs_cli *cli;
    struct gs_progress bar;
    atomic_int show_reading; /* the planner may draw: nothing else writes to the terminal now */
    json_t *conflicts, *failures, *planned;
    char **failed_paths; /* failures' paths as they were (raw bytes, not JSON's U+FFFD), in order */
    json_t *lost;        /* paths the server no longer had where the index said: pushed again */
    size_t withdrawable; /* failures[0..this) may be withdrawn: a later pass did them after all */
    size_t withdrawn;
    int unstarted; /* connecting or starting the agent failed: no operation's outcome stands */
};

/* Forgets failures[i] and its raw path. */
static void forget_failure(struct push_ui *ui, size_t i)
{
    size_t n = json_array_size(ui->failures);
    free(ui->failed_paths[i]);
    memmove(&ui->failed_paths[i], &ui->failed_paths[i + 1], (n - i - 1) * sizeof(char *));
    json_array_remove(ui->failures, i);
}

static void forget_failures(struct push_ui *ui)
{
    while (json_array_size(ui->failures))
        forget_failure(ui, json_array_size(ui->failures) - 1);
}

/* Appends `msg` for the terminal: the failures' names in it quoted (common/quote.h). */
static void add_failure_message(struct push_ui *ui, struct gs_buf *out, const char *msg)
{
    size_t n = json_array_size(ui->failures);
    const char **names = gs_xcalloc(n + 1, sizeof(*names));
    memcpy(names, ui->failed_paths, n * sizeof(*names));
    gs_quote_message(out, msg, names, GS_QUOTE_KEEP_LINES);
    free(names);
}

static void report_conflict(struct push_ui *ui, const char *path, const char *kept)
{
    json_array_append_new(ui->conflicts, json_pack("{s:o,s:o}", "path", gs_json_text(path), "kept",
                                                   gs_json_text(kept)));
    if (!ui->cli->json) {
        gs_progress_end(&ui->bar);
        /* "changed there" would be a guess: after .gpusync was lost (git clean -x) the copy may
         * be gpusync's own, written before the record it has now */
        struct gs_buf name = GS_BUF_INIT, copy = GS_BUF_INIT;
        fprintf(stderr,
                "conflict: %s on the server is not what gpusync knows it wrote there; the "
                "server's copy is kept as %s\n",
                gs_quote_str(&name, path), gs_quote_str(&copy, kept));
        gs_buf_release(&name);
        gs_buf_release(&copy);
    }
}

static void report_failure(struct push_ui *ui, const char *op, const char *path,
                           const char *message)
{
    message = message ? message : "";
    json_array_append_new(ui->failures,
                          json_pack("{s:s,s:o,s:o}", "op", op, "path", gs_json_text(path), "error",
                                    gs_json_text(message)));
    size_t n = json_array_size(ui->failures);
    ui->failed_paths = gs_xrealloc(ui->failed_paths, n * sizeof(char *));
    ui->failed_paths[n - 1] = gs_xstrdup(path);
    if (ui->cli->json)
        return;
    gs_progress_end(&ui->bar);
    struct gs_buf line = GS_BUF_INIT;
    const char *names[] = {path, NULL};
    if (!strstr(message, path)) { /* else it names op and path itself */
        gs_buf_addf(&line, "%s ", op);
        gs_quote_path(&line, path);
        gs_buf_adds(&line, ": ");
    }
    gs_quote_message(&line, message, names, 0);
    fprintf(stderr, "failed: %s\n", line.data);
    gs_buf_release(&line);
}

/* An operation a later pass did after all: its earlier failure is no longer this push's answer
 * (a put refused under a folder the server had replaced by a symlink, sent again once the check
 * found that folder and the plan made it again). */
static void withdraw_failure(struct push_ui *ui, const char *path)
{
    /* raw with raw: the JSON's path has U+FFFD for a byte that is not UTF-8 */
    for (size_t i = 0; i < ui->withdrawable; i++) {
        if (strcmp(ui->failed_paths[i], path) == 0) {
            if (!ui->cli->json) { /* the line that said it failed was printed already */
                struct gs_buf name = GS_BUF_INIT;
                gs_progress_end(&ui->bar);
                fprintf(stderr, "done after all: %s\n", gs_quote_str(&name, path));
                gs_buf_release(&name);
            }
            forget_failure(ui, i);
            ui->withdrawable--;
            ui->withdrawn++;
            return;
        }
    }
}

static void on_op(void *ctx, const struct gs_plan_op *op, const struct gs_fop_result *r)
{
    struct push_ui *ui = ctx;
    struct gs_buf line = GS_BUF_INIT;
    if (!r) { /* dry run */
        gs_plan_op_format(op, &line);
        if (ui->cli->json)
            json_array_append_new(
                ui->planned, json_pack("{s:s,s:o,s:I}", "op", gs_plan_op_name(op->type), "path",
                                       gs_json_text(op->path), "bytes",
                                       (json_int_t)(op->type == GS_OP_PUT ? op->record.size : 0)));
        else
            printf("%s\n", line.data);
    } else if (gs_push_lost(op, r)) {
        json_array_append_new(ui->lost, json_string(op->path));
        if (op->from)
            json_array_append_new(ui->lost, json_string(op->from));
        if (r->moved_aside && r->kept) /* the source was edited there: kept, not moved */
            report_conflict(ui, op->from, r->kept);
    } else if (r->kept) {
        report_conflict(ui, op->path, r->kept);
    } else if (!r->ok) {
        report_failure(ui, gs_plan_op_name(op->type), op->path, r->message);
    } else if (ui->withdrawable) {
        withdraw_failure(ui, op->path);
    }
    gs_buf_release(&line);
}

static void on_progress(void *ctx, const struct gs_push_stats *st)
{
    struct push_ui *ui = ctx;
    /* bytes handed to the transport, not only confirmed: one large file shows it is moving */
    uint64_t bytes = st->bytes_out > st->bytes_sent ? st->bytes_out : st->bytes_sent;
    if (!ui->cli->json)
        gs_progress_update(&ui->bar, st->ops_done, st->ops_total, bytes, st->bytes_total);
}

/* The plan reading (hashing) the changed files: a large one takes a while before anything is
 * sent. Drawn from the planning thread, only once the main one is past the login, whose prompts
 * (password, host key) share the terminal. */
static int on_reading(void *ctx, const struct gs_plan_reading *r)
{
    struct push_ui *ui = ctx;
    if (!ui->cli->json && atomic_load(&ui->show_reading))
        gs_progress_update(&ui->bar, r->files_done, r->files_total, r->bytes_done, r->bytes_total);
    return 0;
}

/* `verified`: what the check of the server at connection found (syncd/verify.h), or NULL. */
static void print_summary(struct push_ui *ui, const struct gs_push_stats *st, int dry_run,
                          const char *transport, uint64_t link_bytes, int level,
                          const struct gs_verify_result *verified)
{
    char bytes[32];
    size_t gone = verified ? verified->gone : 0, changed = verified ? verified->changed : 0;
    if (ui->cli->json) {
        json_t *o = json_pack("{s:i,s:b,s:b,s:i,s:I,s:i,s:i,s:i,s:i,s:i,s:f,s:o,s:o,s:s}", "v", 1,
                              "ok", st->failed == 0, "dry_run", dry_run, "sent", (int)st->sent,
                              "bytes", (json_int_t)st->bytes_sent, "deleted", (int)st->deleted,
                              "renamed", (int)st->renamed, "mkdirs", (int)st->mkdirs, "unchanged",
                              (int)st->unchanged, "failed_count", (int)st->failed, "seconds",
                              st->elapsed_ms / 1000.0, "conflicts", json_incref(ui->conflicts),
                              "failures", json_incref(ui->failures), "transport", transport);
        /* symlinks made or changed, and modes set, which "sent" (file contents) does not count */
        json_object_set_new(o, "symlinks", json_integer((json_int_t)st->symlinks));
        json_object_set_new(o, "chmods", json_integer((json_int_t)st->chmods));
        /* what crossed for the files: a delta counts as its own size (before compression) */
        json_object_set_new(o, "link_bytes", json_integer((json_int_t)link_bytes));
        /* compress = auto: 9 once the link was found slow, in this push or the last */
        json_object_set_new(o, "compress_level", json_integer(level));
        /* paths gpusync wrote that the server no longer held as written: sent again (a push
         * through the daemon does not say: its log does) */
        if (verified) {
            json_object_set_new(o, "server_gone", json_integer((json_int_t)gone));
            json_object_set_new(o, "server_changed", json_integer((json_int_t)changed));
        }
        if (dry_run)
            json_object_set(o, "ops", ui->planned);
        gs_cli_json_print(o);
        return;
    }
    if (dry_run) {
        printf("%zu operation%s planned, %s to send\n", st->ops_total,
               st->ops_total == 1 ? "" : "s", gs_format_bytes(st->bytes_total, bytes));
        return;
    }
    if (gone + changed)
        printf("the server no longer held %zu of the %zu paths gpusync wrote there (%zu gone, %zu "
               "changed there): sent again\n",
               gone + changed, verified->checked, gone, changed);
    printf("sent %zu (%s), deleted %zu, renamed %zu, ", st->sent,
           gs_format_bytes(st->bytes_sent, bytes), st->deleted, st->renamed);
    /* a push of only links, modes or mtimes (a touch) did something; named as in --json */
    if (st->mkdirs + st->symlinks + st->chmods)
        printf("mkdirs %zu, symlinks %zu, chmods %zu, ", st->mkdirs, st->symlinks, st->chmods);
    printf("conflicts %zu, unchanged %zu, failed %zu in %.2f s\n", st->conflicts, st->unchanged,
           st->failed, st->elapsed_ms / 1000.0);
}

/* Converts PATH arguments to project-relative paths (in `rel`, pointers in `paths`). */
static int relative_paths(struct gs_cli *cli, int argc, char **argv, struct gs_buf *rel,
                          const char **paths)
{
    for (int i = 0; i < argc; i++) {
        gs_buf_init(&rel[i]);
        if (gs_path_project_relative(cli->root.data, argv[i], &rel[i], &cli->err) < 0)
            return GS_E_USAGE;
        paths[i] = rel[i].data ? rel[i].data : "";
    }
    return 0;
}

/* Notes that `rc`, from connecting or starting the session, failed the push as a whole: the
 * error is its answer (exit 5 for a remote error), not a summary of operations that failed. */
static int unstarted(struct push_ui *ui, int rc)
{
    if (rc < 0)
        ui->unstarted = 1;
    return rc;
}

static int stop_at_first(const struct gs_index_entry *e, void *ctx)
{
    (void)e, (void)ctx;
    return 1;
}

/* Requires each PATH to exist locally or in the index (a file deleted since its sync, or a folder
 * with one below it: the push sends the deletion). Anything else is a typo that would push
 * nothing and succeed: GS_E_NOTFOUND naming the PATH as given. */
static int paths_exist(struct gs_cli *cli, char **argv, const char **paths, int argc)
{
    struct gs_buf local = GS_BUF_INIT;
    struct gs_session s;
    int opened = 0, rc = 0;
    for (int i = 0; rc == 0 && i < argc; i++) {
        struct stat st;
        gs_buf_reset(&local);
        gs_path_join(&local, cli->root.data, paths[i]);
        if (lstat(local.data, &st) == 0 || !paths[i][0])
            continue;
        /* only now: most pushes name what is here, and the watch daemon may be pushing */
        if (!opened && (rc = gs_session_open_index(&s, cli->root.data, &cli->cfg, &cli->err)) < 0)
            break;
        opened = 1;
        rc = gs_index_foreach(s.idx, paths[i], stop_at_first, NULL, &cli->err);
        if (rc == 0)
            rc = gs_error_set(&cli->err, GS_E_NOTFOUND,
                              "%s: no such file or directory, here or among the paths gpusync "
                              "synced",
                              argv[i]);
        rc = rc == 1 ? 0 : rc;
    }
    if (opened)
        gs_session_close(&s);
    gs_buf_release(&local);
    return rc;
}

/* Connects and starts the transport without waiting for the agent's answer. */
static int connect_start(struct gs_cli *cli, struct gs_session *s)
{
    int rc = gs_cli_connect(cli);
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    if (rc == 0)
        rc = gs_session_start(s, cli->ssh, dir.data, cli->cfg.remote_path, &cli->err);
    gs_buf_release(&dir);
    return rc;
}

/* Planning (scan, hash, index) runs on its own thread while the main one connects: the two take
 * similar time on a slow link, and neither needs the other until the first request goes out. */
struct planner {
    const char *root;
    struct gs_session *s;
    const struct gs_push_opts *o;
    struct gs_plan plan;
    struct gs_push_stats st;
    struct gs_error err;
    int rc;
    int prepare;                  /* make the deltas of the plan's puts too */
    struct gs_agent_delta *ready; /* those deltas, for the agent once it is started */
    size_t n_ready;
};

static void *plan_in_background(void *arg)
{
    struct planner *p = arg;
    p->rc = gs_session_open_ignore(p->s, &p->err);
    if (p->rc == 0)
        p->rc = gs_push_plan(p->root, p->s->ig, p->s->idx, p->o, &p->plan, &p->st, &p->err);
    if (p->rc == 0 && p->prepare) {
        struct gs_buf sigs = GS_BUF_INIT;
        gs_path_join(&sigs, p->root, GS_SESSION_SIGS);
        p->ready = gs_push_prepare_deltas(p->root, &p->plan, sigs.data, &p->n_ready);
        gs_buf_release(&sigs);
    }
    return NULL;
}

/* Hands the deltas made while connecting to the agent, if the session has one. */
static void hand_deltas(struct planner *p)
{
    if (p->s->agent)
        gs_agent_take_deltas(p->s->agent, p->ready, p->n_ready);
    else
        gs_agent_deltas_free(p->ready, p->n_ready);
    p->ready = NULL;
    p->n_ready = 0;
}

/* After lost operations (an earlier push was killed after the server renamed but before the index
 * recorded it; a file was removed on the server behind gpusync's back: gs_push_lost), plans and
 * executes once more over those renames' paths only, so this push still converges. The rest of the
 * tree had its answer in the first pass: planning it again would send each refused operation a
 * second time and report it twice. */
static int second_pass(struct gs_cli *cli, struct gs_session *s, struct push_ui *ui,
                       const struct gs_push_opts *o, struct gs_push_stats *st)
{
    size_t n = json_array_size(ui->lost);
    const char **paths = gs_xcalloc(n + 1, sizeof(*paths));
    for (size_t i = 0; i < n; i++)
        paths[i] = json_string_value(json_array_get(ui->lost, i));
    struct gs_push_opts lost = *o;
    lost.paths = paths;
    lost.n_paths = n;
    struct gs_push_stats again;
    int rc = gs_push_run(cli->root.data, s->ig, s->idx, s->ops, &lost, &again, &cli->err);
    gs_push_stats_add(st, &again);
    st->elapsed_ms = gs_clock_mono_ms() - st->start_ms;
    json_array_clear(ui->lost);
    free(paths);
    if ((rc == 0 || rc == GS_E_REMOTE) && st->failed) /* one message for both passes */
        rc = gs_error_set(&cli->err, GS_E_REMOTE, "%zu of %zu operations failed; first: %s",
                          st->failed, st->ops_total, st->first_error);
    return rc;
}

/* Executes the plan, then plans and executes once more after lost operations. */
static int execute_plan(struct gs_cli *cli, struct gs_session *s, struct push_ui *ui,
                        const struct gs_push_opts *o, struct planner *p)
{
    gs_progress_end(&ui->bar); /* the reading's */
    gs_progress_init(&ui->bar);
    int rc = gs_push_execute(cli->root.data, s->idx, s->ops, o, &p->plan, &p->st, &cli->err);
    if ((rc == 0 || rc == GS_E_REMOTE) && json_array_size(ui->lost))
        rc = second_pass(cli, s, ui, o, &p->st);
    gs_progress_end(&ui->bar);
    gs_debug("executed %zu operations", p->plan.n_ops);
    return rc;
}

/* Plans again, in the foreground, from what the index says now. */
static int plan_again(struct gs_cli *cli, struct planner *p)
{
    gs_plan_release(&p->plan);
    p->plan = (struct gs_plan)GS_PLAN_INIT;
    plan_in_background(p);
    return p->rc < 0 ? gs_error_set(&cli->err, p->rc, "%s", p->err.msg) : 0;
}

/* After an early pass whose requests the agent answered, ready found paths the server no longer
 * held as the index said (syncd/verify.h): they are planned and sent in a pass of their own, and
 * the summary counts both passes. `first_rc` is the early pass's result. */
static int resend_changed(struct gs_cli *cli, struct gs_session *s, struct push_ui *ui,
                          const struct gs_push_opts *o, struct planner *p, int first_rc)
{
    struct gs_push_stats first = p->st;
    ui->withdrawable = json_array_size(ui->failures);
    ui->withdrawn = 0;
    int rc = plan_again(cli, p);
    if (rc == 0)
        rc = execute_plan(cli, s, ui, o, p);
    ui->withdrawable = 0;
    first.failed -= ui->withdrawn;
    gs_push_stats_add(&p->st, &first);
    if (rc == 0 && first_rc != 0 && (first_rc != GS_E_REMOTE || first.failed))
        rc = first_rc;
    json_t *left = json_array_get(ui->failures, 0);
    if (rc == GS_E_REMOTE && left) /* one message for both passes */
        gs_error_set(&cli->err, GS_E_REMOTE, "%zu of %zu operations failed; first: %s",
                     p->st.failed, p->st.ops_total,
                     json_string_value(json_object_get(left, "error")));
    return rc;
}

/* A push sends while the agent starts (gs_session_go_early) and checks its answer after. If no
 * agent was cached there, the early requests died with its failed start and nothing was
 * recorded: once ready has installed one, everything is planned and sent again, and the first
 * pass's outcomes are dropped with it. If the server held another tree than the index said, the
 * index keeps only what the first pass wrote there and the rest is sent again: the first pass's
 * refusals that came from the wrong plan are withdrawn as the second pass redoes them, and the
 * conflict copies it kept are real, and stay reported. Otherwise the agent answered every
 * request, and a refusal (a full disk) is this push's answer for that operation, not a reason to
 * send it again. */
static int execute_early(struct gs_cli *cli, struct gs_session *s, struct push_ui *ui,
                         const struct gs_push_opts *o, struct planner *p)
{
    int rc = execute_plan(cli, s, ui, o, p);
    struct gs_error ready_err = {0};
    int ready = gs_session_ready(s, &ready_err);
    gs_debug("agent answered (%s)", ready == 0 ? s->transport : ready_err.msg);
    if (ready < 0) { /* the early requests died with it: nothing was recorded */
        cli->err = ready_err;
        return unstarted(ui, ready);
    }
    if (!gs_session_replan(s))
        return rc;
    /* the server had changed, or was another tree (the index kept what the early requests
     * wrote there: session.c): what was sent stands, and what the next pass redoes is withdrawn
     * from the first pass's failures */
    if (!s->early_lost)
        return resend_changed(cli, s, ui, o, p, rc);
    forget_failures(ui);
    json_array_clear(ui->conflicts);
    if ((rc = plan_again(cli, p)) == 0)
        rc = execute_plan(cli, s, ui, o, p);
    return rc;
}

/* Plans (overlapping the connection unless dry), then executes and reports. Returns 0, 1 when
 * some operations failed (reported already), or a negative code with cli->err set. */
static int plan_connect_execute(struct gs_cli *cli, struct gs_session *s, struct push_ui *ui,
                                const struct gs_push_opts *o)
{
    struct planner p = {.root = cli->root.data, .s = s, .o = o, .plan = GS_PLAN_INIT};
    int64_t start_ms = gs_clock_mono_ms(); /* the summary's time: connecting and the agent too */
    pthread_t thread;
    /* while it connects: a delta made then no longer follows the channel's opening */
    p.prepare = !o->dry_run && cli->cfg.transport == GS_TRANSPORT_AGENT;
    gs_progress_init(&ui->bar);
    ui->bar.label = "reading";
    ui->bar.quiet_ms = GS_PROGRESS_READING_QUIET_MS;
    if (!o->dry_run) /* before the planner reads the index on its thread */
        gs_session_check_early(s);
    int threaded = !o->dry_run && pthread_create(&thread, NULL, plan_in_background, &p) == 0;
    if (!threaded) {
        atomic_store(&ui->show_reading, 1);
        plan_in_background(&p);
    }
    int rc = o->dry_run ? 0 : unstarted(ui, connect_start(cli, s));
    atomic_store(&ui->show_reading, 1);
    if (threaded)
        pthread_join(thread, NULL);
    gs_progress_end(&ui->bar);
    p.prepare = 0; /* a later plan (plan_again) goes on at once */
    hand_deltas(&p);
    gs_debug("agent started; %zu operations planned", p.plan.n_ops);
    if (rc == 0 && p.rc < 0)
        rc = gs_error_set(&cli->err, p.rc, "%s", p.err.msg);
    if (rc == 0 && !o->dry_run && gs_session_go_early(s)) {
        rc = execute_early(cli, s, ui, o, &p);
    } else {
        if (rc == 0 && !o->dry_run)
            rc = unstarted(ui, gs_session_ready(s, &cli->err));
        /* the plan trusted an index that no longer holds, or that reconciling has changed */
        if (rc == 0 && gs_session_replan(s))
            rc = plan_again(cli, &p);
        if (rc == 0)
            rc = execute_plan(cli, s, ui, o, &p);
    }
    /* planning again (after the agent was installed, or the index reset) restarted p.st's clock;
     * a user timing the push counts the connection and the agent's start as well */
    p.st.start_ms = start_ms;
    p.st.elapsed_ms = gs_clock_mono_ms() - start_ms;
    if (ui->unstarted) { /* the error object, not a summary of nothing */
        gs_plan_release(&p.plan);
        return rc;
    }
    if (rc == 0 || rc == GS_E_REMOTE)
        print_summary(ui, &p.st, o->dry_run, o->dry_run ? "none" : s->transport,
                      s->ops ? s->ops->bytes_sent : 0,
                      s->agent && !o->dry_run ? gs_agent_compress_level(s->agent) : 0,
                      o->dry_run ? NULL : &s->verified);
    if (rc == GS_E_REMOTE && !cli->json) {
        struct gs_buf msg = GS_BUF_INIT;
        add_failure_message(ui, &msg, cli->err.msg);
        fprintf(stderr, "gpusync: %s\n", msg.data);
        gs_buf_release(&msg);
    }
    gs_plan_release(&p.plan);
    return rc == GS_E_REMOTE ? 1 : rc;
}

#define DAEMON_PUSH_TIMEOUT_MS (3600 * 1000) /* the daemon answers once the tree is sent */

/* Reports the conflicts and failures a daemon's answer lists, as on_op would have. */
static void report_daemon_ops(struct push_ui *ui, json_t *reply)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(reply, "push_conflicts"), i, e)
        report_conflict(ui, json_string_value(json_object_get(e, "path")),
                        json_string_value(json_object_get(e, "kept")));
    json_array_foreach(json_object_get(reply, "push_failures"), i, e)
    {
        const char *op = json_string_value(json_object_get(e, "op"));
        const char *path = json_string_value(json_object_get(e, "path"));
        report_failure(ui, op ? op : "", path ? path : "",
                       json_string_value(json_object_get(e, "error")));
    }
}

static size_t count_field(json_t *reply, const char *key)
{
    return (size_t)json_integer_value(json_object_get(reply, key));
}

/* With `gpusync watch` running, the daemon pushes (design 12): it is connected already, and a push
 * of this process's own would fence the daemon's agent out and make it reconnect. The daemon
 * checks every file (not only the PATHs asked: it sends every change anyway) and answers once the
 * server holds them. Returns 0 with *handled 0 when no daemon answers; else 0, 1 after failed
 * operations (reported), or a negative code. */
static int push_through_daemon(struct gs_cli *cli, struct push_ui *ui, int *handled)
{
    json_t *reply = NULL;
    int rc = gs_cli_daemon_sync(cli, "push", DAEMON_PUSH_TIMEOUT_MS,
                                "pushing through the watch daemon", &reply);
    const char *error = json_string_value(json_object_get(reply, "error"));
    /* a daemon started by an older gpusync does not push: this process does */
    *handled = rc != GS_E_NOTFOUND && !(error && !strcmp(error, "unknown command"));
    if (gs_cli_daemon_stopped(rc, reply)) /* the sync lock waits for the daemon's last batch */
        *handled = 0;
    if (rc < 0 || !*handled) {
        json_decref(reply);
        return *handled ? rc : 0;
    }
    struct gs_push_stats st = {.sent = count_field(reply, "sent"),
                               .bytes_sent = count_field(reply, "bytes"),
                               .deleted = count_field(reply, "deleted"),
                               .renamed = count_field(reply, "renamed"),
                               .mkdirs = count_field(reply, "mkdirs"),
                               .symlinks = count_field(reply, "symlinks"),
                               .chmods = count_field(reply, "chmods"),
                               .unchanged = count_field(reply, "unchanged"),
                               .failed = count_field(reply, "failed_count"),
                               .elapsed_ms = (int64_t)count_field(reply, "ms")};
    report_daemon_ops(ui, reply);
    st.conflicts = json_array_size(ui->conflicts);
    const char *transport = json_string_value(json_object_get(reply, "transport"));
    char through[256];
    snprintf(through, sizeof(through), "watch daemon, %s", transport ? transport : "");
    int ok = json_is_true(json_object_get(reply, "ok"));
    if (!ok && !st.failed) { /* nothing refused: the server could not be reached */
        rc = gs_error_set(&cli->err, GS_E_DISCONNECTED, "%s", error ? error : "the push failed");
    } else {
        print_summary(ui, &st, 0, through, (uint64_t)count_field(reply, "link_bytes"),
                      (int)count_field(reply, "compress_level"), NULL);
        rc = ok ? 0 : 1;
        if (!ok && !cli->json) {
            struct gs_buf msg = GS_BUF_INIT;
            add_failure_message(ui, &msg, error ? error : "the push failed");
            fprintf(stderr, "gpusync: %s\n", msg.data);
            gs_buf_release(&msg);
        }
    }
    json_decref(reply);
    return rc;
}

static int run_push(struct gs_cli *cli, int dry_run, int argc, char **argv)
{
    struct gs_buf *rel = gs_xcalloc((size_t)argc + 1, sizeof(*rel));
    const char **paths = gs_xcalloc((size_t)argc + 1, sizeof(*paths));
    struct gs_session s;
    struct push_ui ui = {.cli = cli,
                         .conflicts = json_array(),
                         .failures = json_array(),
                         .planned = json_array(),
                         .lost = json_array()};
    struct gs_push_opts o = {.paths = paths,
                             .n_paths = (size_t)argc,
                             .dry_run = dry_run,
                             .on_op = on_op,
                             .on_progress = on_progress,
                             .on_reading = on_reading,
                             .ctx = &ui};
    int opened = 0;
    int rc = relative_paths(cli, argc, argv, rel, paths);
    int delegated = 0;
    if (rc == 0) /* before the daemon too: it pushes every change, and named nothing wrong */
        rc = paths_exist(cli, argv, paths, argc);
    /* a password given to this push is for a login the daemon cannot make (it has none) */
    if (rc == 0 && !dry_run && !cli->password)
        rc = push_through_daemon(cli, &ui, &delegated);
    if (rc == 0 && !delegated)
        opened = (rc = gs_session_open_index(&s, cli->root.data, &cli->cfg, &cli->err)) == 0;
    if (!delegated && rc == 0 && !dry_run) /* one agent session per project (session.h) */
        rc = gs_session_lock(&s, 1, &cli->err);
    if (!delegated && rc == 0)
        rc = plan_connect_execute(cli, &s, &ui, &o);
    if (opened)
        gs_session_close(&s);
    for (int i = 0; i < argc; i++)
        gs_buf_release(&rel[i]);
    free(rel);
    free(paths);
    json_decref(ui.conflicts);
    forget_failures(&ui);
    free(ui.failed_paths);
    json_decref(ui.failures);
    json_decref(ui.planned);
    json_decref(ui.lost);
    return rc < 0 ? gs_cli_fail(cli, rc) : rc;
}

static int dry_run; /* -n, --dry-run */

static int push_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli, (void)arg;
    if (opt != OPT_DRY_RUN && opt != 'n')
        return gs_cli_usage_error(&gs_cmd_push, "unexpected option");
    dry_run = 1;
    return 0;
}

static int push_parse(struct gs_cli *cli, int argc, char **argv)
{
    return gs_cli_parse_options(cli, &gs_cmd_push, argc, argv, "hn", push_options, push_option);
}

/* Connects itself (not GS_CMD_NEED_CONNECTION): after taking the project's session lock, and
 * while the local tree is scanned. */
static int push_exec(struct gs_cli *cli)
{
    return run_push(cli, dry_run, cli->argc, cli->argv);
}

const struct gs_cmd gs_cmd_push = {
    .name = "push",
    .usage = "push [--dry-run] [--json] [PATH...]",
    .summary = "Make the server's copy of the project match this one (once)",
    .help = "  -n, --dry-run          list what would be done, change nothing\n"
            "  PATH...                only these files or directories (one that exists\n"
            "                         neither here nor among the synced paths: exit 1)\n"
            "  Files changed on the server since gpusync wrote them are kept there as\n"
            "  NAME.gpusync-conflict-YYYYmmdd-HHMMSS. Exit status 1 if an operation failed.\n"
            "  On a terminal a progress bar counts bytes as they go (one large file moves it);\n"
            "  the summary's time counts connecting and starting the agent.\n"
            "  While `gpusync watch` runs, the daemon pushes over its connection (every\n"
            "  change, whatever PATHs are given) and this command reports what it sent.\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = push_parse,
    .exec = push_exec,
};
