/* syncd/daemon.c: the watch daemon's loop (see daemon.h). Single-threaded: one poll() over the
 * inotify descriptor, the control socket and its clients, and a signalfd; pushes run inline. */
#include "syncd/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "common/quote.h"
#include "common/wrapper.h"
#include "remote/target.h"
#include "syncd/conflicts.h"
#include "syncd/control.h"
#include "syncd/json_text.h"
#include "syncd/linked.h"
#include "syncd/push.h"
#include "syncd/relay.h"
#include "syncd/rules.h"
#include "syncd/session.h"
#include "syncd/watch.h"

#define MAX_CLIENTS         64
#define MAX_BATCH_PATHS     2000 /* more changed paths than this: one full push is cheaper */
#define LIVENESS_EVERY_MS   5000 /* an idle connection is checked this often */
#define POLL_FALLBACK_MS    2000 /* full pushes this often when inotify cannot watch */
#define BACKOFF_FIRST_MS    500
#define BACKOFF_MAX_MS      30000
#define SUSPEND_JUMP_MS     3000  /* wall clock ran this far ahead of the monotonic one: we slept */
#define RETRY_FAILED_MS     10000 /* operations the server refused are tried again this often */
#define LOCK_RETRY_MS       100  /* a push or pull of this project holds the sync lock: try again */
#define PROGRESS_EVERY_MS   250  /* a batch longer than this reports its progress this often */
#define SERVE_IN_BATCH_MS   100  /* during a batch, status requests are answered this often */
#define STOP_CHECK_MS       2000 /* the most the check of the server at a stop may take */
#define LINKED_POLL_MS      1000 /* files with other hard links are looked at this often... */
#define LINKED_POLL_MAX     2000 /* ...while there are no more of them (else at each flush only) */
#define LINK_SWEEP_MS       10000 /* the tree is listed for hard links made from outside... */
#define LINK_SWEEP_SHARE    100   /* ...this often, and at most 1/this of the time... */
#define LINK_SWEEP_FLUSH_MS 50    /* ...and at each flush while a listing takes less than this */
#define STOPPED_MID_WAIT    "the watch daemon was told to stop while it waited on the server"

struct client {
    int fd;
    struct gs_buf in;
    int events;         /* subscribed to the event stream */
    int dead;           /* a send failed (it stopped reading): dropped at the end of the turn */
    uint64_t flush_gen; /* waiting for this generation to be synced; 0: not waiting */
    int64_t flush_start_ms;
    struct push_ask *push; /* a flush asked by `gpusync push`: answered with what was done */
    int stopping;          /* asked the daemon to stop: answered once it has (answer_at_exit) */
};

/* What the batches did while a `gpusync push` waited for them (design 12: with the daemon running,
 * the daemon pushes; a push of its own would fence the daemon's agent out). */
struct push_ask {
    struct gs_push_stats st;
    uint64_t link_bytes;          /* what crossed for the files (a delta as its size) */
    json_t *conflicts, *failures; /* this push's, as `gpusync push --json` reports them */
};

struct daemon {
    const struct gs_daemon_opts *o;
    struct gs_session sess;
    struct gs_ssh *ssh;
    int connected;
    struct gs_relay *relay; /* commands run for clients on a spare connection */
    struct gs_watch *watch;
    int listen_fd, signal_fd;
    struct client clients[MAX_CLIENTS];
    int n_clients;
    char **dirty; /* changed paths not yet pushed */
    size_t n_dirty, cap_dirty;
    int full;   /* push the whole tree next */
    int verify; /* compare the server with the index before the next batch (push, flush) */
    struct gs_verify_copy *check_copy; /* the index's entries as the last check read them */
    struct gs_rules rules; /* the exclude rules outside the tree, noticed when they change */
    int64_t next_rules_check_ms;
    int64_t next_verify_ms; /* when an idle connection compares them next */
    int checked;   /* a batch has compared the whole tree with the server since the start */
    char **failed; /* paths whose operation the server refused in the last batch: tried again */
    size_t n_failed, cap_failed;
    int64_t next_retry_ms;
    char **held; /* paths a batch held back in the middle of a save (watch.h): in the next batch */
    size_t n_held, cap_held;
    int64_t held_until_ms;     /* the earliest end of their holds */
    uint64_t batch_planned_at; /* events read when this batch began reading files */
    int batch_drained;         /* this batch read the events that arrived while it was planned */
    int changed_while_sent;    /* puts of this batch refused as their file changed meanwhile */
    int flush_now;
    int64_t first_event_ms, last_event_ms;
    uint64_t event_gen, synced_gen;
    int64_t next_connect_ms;
    int backoff_ms;
    int64_t next_check_ms, next_poll_ms, last_wall_ms, last_mono_ms;
    int syncing, stop;
    int64_t wait_until_ms; /* a wait on the server past this is abandoned (the check at a stop) */
    size_t batch_paths; /* while syncing: the batch's paths, or 0 when it checks the whole tree */
    int lost_ops;       /* operations of this batch on paths gone from the server: sent again */
    char last_error[1024];
    int last_error_local; /* it happened here (a file that could not be read), not on the server */
    int local_failures;   /* the batch's operations that failed here */
    int64_t last_latency_ms;
    int64_t next_progress_ms;       /* while syncing: when the batch next reports its progress */
    int64_t next_serve_ms;          /* while syncing: when control requests are next looked at */
    struct gs_push_stats batch_st;  /* while syncing: the batch's progress so far */
    struct gs_plan_reading reading; /* while syncing: how far it has read the changed files */
    int64_t lock_retry_ms; /* the sync lock was busy: connect or batch again from then on */
    /* A connection attempt runs in a thread (a login can take seconds, a dead server a connect
     * timeout), so the control socket keeps answering meanwhile; the thread owns d->sess and
     * d->ssh until it signals connect_done. */
    int connecting;
    int64_t connect_started_ms; /* when the attempt in flight (or the last one) began */
    pthread_t connector;
    int abandon_connect; /* set (atomically) when the daemon stops: the attempt gives up */
    int connect_done;    /* eventfd: readable when the attempt has ended */
    int connect_rc;
    struct gs_error connect_err;
    time_t unreachable_since; /* wall clock of the first failed attempt of this outage, or 0 */
    char target[320];         /* user@host:port as resolved, for messages while disconnected */
    json_t *conflicts; /* [{path, kept}]: copies kept on the server, until the user acknowledges */
    int conflicts_unsaved;  /* changed since last recorded in the index (conflicts.h) */
    ino_t socket_ino;       /* the control socket's file, to notice .gpusync/ being removed */
    int root_fd;            /* the project folder (O_PATH), to notice it being moved (root_moved) */
    char stop_reason[1200]; /* why the daemon stopped on its own, told to whoever asks after */
    struct gs_linked linked; /* files with other hard links, checked by stat (linked.h) */
    int64_t next_linked_ms;
    int64_t next_sweep_ms, sweep_ms; /* the tree listed for new hard links (sweep_links) */
    int sweep_due;                   /* a flush asked for one */
    int64_t next_state_check_ms;
    int index_removed; /* .gpusync/ was put back, but the index still lives in the removed one */
    int64_t next_index_try_ms;
};

/* ---- events and status ---- */

/* Sends `event` to every subscriber, and drops the reference. A NULL event (a json_pack that
 * failed) is skipped: hanging up every subscriber over it would lose them all the events after. */
static void broadcast(struct daemon *d, json_t *event)
{
    if (!event) {
        gs_debug("an event could not be encoded: not sent");
        return;
    }
    for (int i = 0; i < d->n_clients; i++)
        if (d->clients[i].events && !d->clients[i].dead &&
            gs_control_send(d->clients[i].fd, event, NULL) < 0)
            d->clients[i].dead = 1; /* a half-sent line cannot be finished: hang up */
    json_decref(event);
}

static void reply(struct client *c, json_t *msg);

static const char *state_name(const struct daemon *d)
{
    if (!d->connected)
        return d->last_error[0] ? "disconnected" : "connecting"; /* retrying, or the first */
    if (d->syncing || d->n_dirty || d->full || d->n_failed || d->n_held) /* all sent later */
        return "syncing";
    return "up_to_date";
}

static void show_status(struct daemon *d)
{
    FILE *out = d->o->status_out;
    if (!out)
        return;
    if (d->connected)
        fprintf(out, "\r\033[K\xe2\x97\x8f %s", gs_ssh_target(d->ssh));
    else if (d->connecting)
        fprintf(out, "\r\033[K\xe2\x97\x8b connecting to %s", d->target);
    else
        fprintf(out, "\r\033[K\xe2\x97\x8b not connected");
    if (d->syncing && d->batch_paths) /* n_dirty is what arrived since the batch began */
        fprintf(out, " · syncing %zu path%s", d->batch_paths, d->batch_paths == 1 ? "" : "s");
    else if (d->syncing) /* a full batch: how many paths changed is known only after the scan */
        fprintf(out, " · checking every file");
    else if (d->connected && d->n_failed) /* retried every RETRY_FAILED_MS */
        fprintf(out, " · %zu change%s failed", d->n_failed, d->n_failed == 1 ? "" : "s");
    else if (d->connected && !strcmp(state_name(d), "up_to_date")) /* as status says it */
        fprintf(out, " · up to date");
    if (d->last_latency_ms >= 0 && d->connected)
        fprintf(out, " · last sync %lld ms", (long long)d->last_latency_ms);
    if (!d->connected && d->last_error[0]) { /* a server's words, or a file's name */
        struct gs_buf why = GS_BUF_INIT;
        gs_quote_message(&why, d->last_error, NULL, 0);
        fprintf(out, " · %s", why.data);
        gs_buf_release(&why);
    }
    fflush(out);
}

/* When the current outage began (ISO 8601, UTC), or null while the server is reachable. */
static json_t *unreachable_since(const struct daemon *d)
{
    char when[32];
    struct tm tm;
    if (!d->unreachable_since || !gmtime_r(&d->unreachable_since, &tm))
        return json_null();
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(when);
}

/* A conflict copy the server kept: listed by status and flush until acknowledged. */
static void note_conflict(struct daemon *d, const char *path, const char *kept)
{
    gs_conflicts_add(d->conflicts, path, kept);
    d->conflicts_unsaved = 1;
}

/* Records the list in the index, so that it outlives the daemon. Not while a connection attempt
 * runs (its thread uses the index), nor from on_op (inside the push's index transaction). */
static void save_conflicts(struct daemon *d)
{
    struct gs_error err = {0};
    if (!d->conflicts_unsaved || d->connecting || d->index_removed || !d->sess.idx)
        return;
    if (gs_conflicts_save(d->sess.idx, d->conflicts, &err) < 0)
        gs_warn("%s (the conflict list is kept in memory and recorded again later)", err.msg);
    else
        d->conflicts_unsaved = 0;
}

static json_t *status_json(struct daemon *d)
{
    int spare = 0;
    long relayed = 0;
    if (d->relay)
        gs_relay_stats(d->relay, &spare, &relayed);
    /* a batch in progress: its operations not done yet are pending too, and before they are
     * planned (the batch still reads the changed files), its paths (a check of the whole tree:
     * the files whose stat says they changed) */
    const struct gs_push_stats *b = &d->batch_st;
    size_t reading = d->batch_paths ? d->batch_paths : (size_t)d->reading.files_total;
    size_t sending = !d->syncing                  ? 0
                     : b->ops_total == 0          ? reading
                     : b->ops_total > b->ops_done ? b->ops_total - b->ops_done
                                                  : 0;
    json_t *o =
        json_pack("{s:b,s:b,s:s,s:b,s:i,s:o,s:o,s:s,s:s,s:i,s:i,s:b}", "ok", 1, "daemon", 1,
                  "state", state_name(d), "connected", d->connected, "pending",
                  (int)(d->n_dirty + d->n_failed + d->n_held + sending), "last_error",
                  d->last_error[0] ? gs_json_text(d->last_error) : json_null(), "last_latency_ms",
                  d->last_latency_ms >= 0 ? json_integer(d->last_latency_ms) : json_null(),
                  "target", d->connected ? gs_ssh_target(d->ssh) : d->target, "transport",
                  d->connected ? d->sess.transport : "", "pid", (int)getpid(), "watches",
                  d->watch ? (int)gs_watch_count(d->watch) : 0, "polling",
                  d->watch && gs_watch_polling(d->watch, NULL));
    /* a spare is a separate connection to the same server: while the daemon cannot reach it, the
     * relay is rechecking its spares (see disconnect), and none is known to be usable */
    json_object_set_new(o, "spare_ready", json_boolean(spare && d->connected));
    json_object_set_new(o, "relayed", json_integer(relayed));
    json_object_set_new(o, "unreachable_since", unreachable_since(d));
    json_object_set(o, "conflicts", d->conflicts);
    if (d->syncing) /* what the batch has sent so far (status answers during a batch) */
        json_object_set_new(
            o, "batch",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "ops_done", (json_int_t)b->ops_done, "ops_total",
                      (json_int_t)b->ops_total, "bytes",
                      (json_int_t)(b->bytes_out > b->bytes_sent ? b->bytes_out : b->bytes_sent),
                      "bytes_total", (json_int_t)b->bytes_total, "read_bytes",
                      (json_int_t)d->reading.bytes_done, "read_bytes_total",
                      (json_int_t)d->reading.bytes_total));
    return o;
}

/* When an idle connection compares the server with the index next ([sync] check_every); 0: never
 * (only at connection, push and flush). */
static int64_t next_verify_ms(const struct daemon *d)
{
    int s = d->o->cfg->check_every_s;
    if (s < 0)
        return 0;
    return gs_clock_mono_ms() + 1000LL * (s ? s : GS_CHECK_EVERY_DEFAULT_S);
}

/* ---- the set of changed paths ---- */

static void mark_dirty(void *ctx, const char *path)
{
    struct daemon *d = ctx;
    int64_t now = gs_clock_mono_ms();
    if (!d->n_dirty && !d->full)
        d->first_event_ms = now;
    d->last_event_ms = now;
    d->event_gen++;
    if (d->full)
        return;
    if (d->n_dirty >= MAX_BATCH_PATHS) {
        d->full = 1;
        return;
    }
    GS_ALLOC_GROW(d->dirty, d->n_dirty + 1, d->cap_dirty);
    d->dirty[d->n_dirty++] = gs_xstrdup(path);
}

/* A write through a hard link outside the project makes no event here: looks at those files. */
static void check_linked(struct daemon *d)
{
    if (d->root_fd >= 0)
        gs_linked_check(&d->linked, d->root_fd, mark_dirty, d);
}

static void on_scan(void *ctx, const struct gs_scan *scan, int whole)
{
    gs_linked_take_scan(&((struct daemon *)ctx)->linked, scan, whole, NULL, NULL);
}

/* A hard link made to a project file from outside while the daemon runs changes no name here:
 * no event, and no scan of a batch lists the file again. So the tree is listed again (a stat of
 * each entry, no file read) every LINK_SWEEP_MS while idle, at most 1/LINK_SWEEP_SHARE of the
 * time, and at each flush while a sweep takes under LINK_SWEEP_FLUSH_MS (trees to about 30,000
 * files). A file newly linked, or changed since its last look, is marked dirty: the plan then
 * compares it with the index, and sends it only if it changed. */
static void sweep_links(struct daemon *d)
{
    if (d->connecting || d->root_fd < 0) /* the connecting thread may use the rules */
        return;
    int64_t start = gs_clock_mono_ms();
    struct gs_scan scan = GS_SCAN_INIT;
    struct gs_error err = {0};
    if (gs_scan_tree(&scan, d->o->root, d->sess.ig, &err) == 0)
        gs_linked_take_scan(&d->linked, &scan, 1, mark_dirty, d);
    else
        gs_debug("sweep for hard links: %s", err.msg);
    gs_scan_release(&scan);
    int64_t now = gs_clock_mono_ms();
    d->sweep_ms = now - start;
    d->next_sweep_ms =
        now + (d->sweep_ms * LINK_SWEEP_SHARE > LINK_SWEEP_MS ? d->sweep_ms * LINK_SWEEP_SHARE
                                                              : LINK_SWEEP_MS);
}

/* Remembers a path whose operation failed, so that the next flush (or the retry timer) sends it
 * again: the index does not have it, but nothing would put it back in the dirty set. */
static void note_failed(struct daemon *d, const char *path)
{
    GS_ALLOC_GROW(d->failed, d->n_failed + 1, d->cap_failed);
    d->failed[d->n_failed++] = gs_xstrdup(path);
}

/* Keeps every path of a batch that failed as a whole (its plan could not be built: a local read
 * error, an unreadable directory; or the index could not be written). The watcher reported those
 * paths once and no operation of theirs reached on_op, so dropping them would lose the changes
 * for good: a later flush would answer success while the server still lacks them. They are tried
 * again as refused operations are (next flush, or the retry timer), not at once, so that a lasting
 * local error does not spin. A full batch is kept as "", the root. */
static void keep_failed_batch(struct daemon *d, char **paths, size_t n, int full)
{
    if (full) {
        note_failed(d, "");
        return;
    }
    for (size_t i = 0; i < n; i++)
        note_failed(d, paths[i]);
}

/* Makes the failed paths dirty again. */
static void retry_failed(struct daemon *d)
{
    for (size_t i = 0; i < d->n_failed; i++) {
        mark_dirty(d, d->failed[i]);
        free(d->failed[i]);
    }
    d->n_failed = 0;
}

/* Keeps `path` out of this batch until `until` at the latest: it is in the middle of a save. */
static void hold_path(struct daemon *d, const char *path, int64_t until)
{
    GS_ALLOC_GROW(d->held, d->n_held + 1, d->cap_held);
    d->held[d->n_held++] = gs_xstrdup(path);
    if (d->n_held == 1 || until < d->held_until_ms)
        d->held_until_ms = until;
}

/* Puts the held paths back in the batch about to go out: asked again, those whose save has
 * completed go, the others are held again. */
static void unhold(struct daemon *d)
{
    for (size_t i = 0; i < d->n_held; i++) {
        mark_dirty(d, d->held[i]);
        free(d->held[i]);
    }
    d->n_held = 0;
}

static void mark_full(struct daemon *d)
{
    mark_dirty(d, "");
    d->full = 1;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts the batch and drops duplicates. */
static void unique_paths(char **paths, size_t *n)
{
    if (*n < 2) /* nothing to sort (and qsort of a NULL array is undefined) */
        return;
    qsort(paths, *n, sizeof(char *), str_cmp);
    size_t out = 0;
    for (size_t i = 0; i < *n; i++) {
        if (out && strcmp(paths[out - 1], paths[i]) == 0)
            free(paths[i]);
        else
            paths[out++] = paths[i];
    }
    *n = out;
}

static void free_paths(char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
}

/* ---- the connection ---- */

static void disconnect(struct daemon *d, const char *why)
{
    if (d->connected)
        gs_warn("disconnected from %s: %s", gs_ssh_target(d->ssh), why);
    /* The link is dead or unusable: make the polite goodbyes below (channel EOF and close, SSH
     * disconnect) fail at once instead of each waiting seconds for a peer that will not answer,
     * which would leave the control socket unanswered that long. */
    if (d->ssh && gs_ssh_fd(d->ssh) >= 0)
        shutdown(gs_ssh_fd(d->ssh), SHUT_RDWR);
    gs_session_disconnect(&d->sess);
    gs_ssh_free(d->ssh);
    d->ssh = NULL;
    int was = d->connected;
    d->connected = 0;
    if (was && d->relay)
        gs_relay_recheck(d->relay); /* the spares may have died with this connection */
    snprintf(d->last_error, sizeof(d->last_error), "%s", why);
    int jitter = d->backoff_ms / 5;
    d->next_connect_ms = gs_clock_mono_ms() + d->backoff_ms + (jitter ? rand() % jitter : 0);
    d->backoff_ms = d->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d->backoff_ms * 2;
    if (was)
        broadcast(d, json_pack("{s:s,s:o}", "event", "disconnected", "message", gs_json_text(why)));
    show_status(d);
}

static void refuse_flushes(struct daemon *d);
static void read_changes(struct daemon *d);
static void read_rules(struct daemon *d);

/* The connection attempt, in its own thread: nothing else touches d->ssh or d->sess meanwhile.
 * The login gets the usual limits (a slow server's handshake and agent start are waited for);
 * the daemon's tight ones (o->ssh, for waits on its own thread) apply once connected. */
static int connect_abandoned(void *ctx)
{
    struct daemon *d = ctx;
    return __atomic_load_n(&d->abandon_connect, __ATOMIC_RELAXED);
}

static void *connector_main(void *arg)
{
    struct daemon *d = arg;
    struct gs_ssh_opts login = d->o->ssh;
    login.keepalive_ms = login.dead_after_ms = 0;
    login.waiting = connect_abandoned; /* a stop does not wait for a login's timeout */
    login.waiting_ctx = d;
    d->connect_rc = gs_ssh_connect(&d->ssh, &login, &d->connect_err);
    if (d->connect_rc == 0)
        d->connect_rc = gs_session_connect(&d->sess, d->ssh, d->o->remote_dir,
                                           d->o->cfg->remote_path, &d->connect_err);
    uint64_t one = 1;
    if (write(d->connect_done, &one, sizeof(one)) != sizeof(one))
        gs_warn("cannot signal the end of a connection attempt");
    return NULL;
}

/* Takes over from the connector thread once it has signalled. */
static void connected_or_not(struct daemon *d)
{
    uint64_t n;
    if (read(d->connect_done, &n, sizeof(n)) != sizeof(n) || !d->connecting)
        return;
    pthread_join(d->connector, NULL);
    d->connecting = 0;
    gs_session_unlock(&d->sess);
    if (d->connect_rc < 0) {
        if (!d->unreachable_since)
            d->unreachable_since = time(NULL);
        disconnect(d, d->connect_err.msg);
        refuse_flushes(d);
        return;
    }
    gs_ssh_set_liveness(d->ssh, d->o->ssh.keepalive_ms, d->o->ssh.dead_after_ms);
    gs_ssh_set_waiting(d->ssh, NULL, NULL); /* the loop's own, per wait (while_waiting) */
    d->unreachable_since = 0;
    d->connected = 1;
    d->backoff_ms = BACKOFF_FIRST_MS;
    d->next_connect_ms = 0;
    d->last_error[0] = '\0';
    d->next_check_ms = gs_clock_mono_ms() + LIVENESS_EVERY_MS;
    gs_info("connected to %s (%s)", gs_ssh_target(d->ssh), d->sess.transport);
    broadcast(d, json_pack("{s:s,s:s}", "event", "connected", "target", gs_ssh_target(d->ssh)));
    mark_full(d);  /* whatever changed while we were away */
    d->verify = 0; /* ready has just compared the server with the index */
    d->next_verify_ms = next_verify_ms(d);
    d->flush_now = 1;
    if (d->relay)
        gs_relay_recheck(d->relay); /* the server is back: make the spares now */
}

/* Takes the project's sync lock (session.h) without waiting. When a push or pull of this project
 * holds it, returns 0 and defers connecting and batching by LOCK_RETRY_MS: not a failure, so no
 * backoff. A lock that cannot be taken at all is logged, and the work goes on without it. */
static int take_sync_lock(struct daemon *d)
{
    struct gs_error err = {0};
    int rc = gs_session_lock(&d->sess, 0, &err);
    if (rc < 0)
        gs_warn("%s; syncing without it", err.msg);
    if (rc != 1)
        return 1;
    d->lock_retry_ms = gs_clock_mono_ms() + LOCK_RETRY_MS;
    return 0;
}

/* Starts a connection attempt under the sync lock (the agent it starts fences out any other
 * session), or later when a push of this project holds the lock. */
static void connect_when_free(struct daemon *d)
{
    if (d->connecting)
        return;
    if (!take_sync_lock(d)) {
        d->next_connect_ms = d->lock_retry_ms;
        return;
    }
    gs_error_clear(&d->connect_err);
    d->next_connect_ms = 0;
    d->connect_started_ms = gs_clock_mono_ms();
    d->connecting = pthread_create(&d->connector, NULL, connector_main, d) == 0;
    show_status(d); /* a first login can take seconds: say what is happening meanwhile */
    if (!d->connecting) {
        gs_session_unlock(&d->sess);
        disconnect(d, "cannot start a thread to connect");
    }
}

/* An idle link is checked with a real round trip; a dead one is noticed within seconds. Not while
 * changes wait for their batch: the ping blocks for two round trips, and a save made meanwhile
 * waited for it (measured: the 130-200 ms saves of latency.sh's p99 at 50 ms RTT); the batch
 * itself is the check then. */
static int while_waiting(void *ctx);
static int check_server(struct daemon *d, struct gs_error *err);
static int on_reading(void *ctx, const struct gs_plan_reading *r);

static void check_liveness(struct daemon *d)
{
    int64_t now = gs_clock_mono_ms(), wall = gs_clock_wall_ms();
    int suspended =
        d->last_wall_ms && (wall - d->last_wall_ms) - (now - d->last_mono_ms) > SUSPEND_JUMP_MS;
    d->last_wall_ms = wall;
    d->last_mono_ms = now;
    if (!d->connected) {
        if (suspended)
            d->next_connect_ms = now; /* woke up: try at once */
        return;
    }
    if (!suspended && (now < d->next_check_ms || d->n_dirty || d->full || d->n_held || d->verify))
        return;
    d->next_check_ms = now + LIVENESS_EVERY_MS;
    struct gs_error err = {0};
    int64_t rtt;
    int rc;
    if (d->next_verify_ms && now >= d->next_verify_ms) { /* a round trip too: a file deleted
                                                          * there is not up to date */
        rc = check_server(d, &err);
        if (rc > 0)
            d->flush_now = 1;
    } else {
        gs_ssh_set_waiting(d->ssh, while_waiting, d);
        rc = gs_ssh_ping(d->ssh, &rtt, &err);
        gs_ssh_set_waiting(d->ssh, NULL, NULL);
    }
    if (rc < 0)
        disconnect(d, rc == GS_E_INTERRUPTED ? STOPPED_MID_WAIT : err.msg);
}

/* ---- pushes asked by `gpusync push` ---- */

static void push_ask_free(struct client *c)
{
    if (!c->push)
        return;
    json_decref(c->push->conflicts);
    json_decref(c->push->failures);
    free(c->push);
    c->push = NULL;
}

/* Notes a conflict copy `kept` of `path`, or the failure of operation `failed` with `message`, for
 * every push waiting. */
static void tell_pushes(struct daemon *d, const char *path, const char *kept,
                        const struct gs_plan_op *failed, const char *message)
{
    for (int i = 0; i < d->n_clients; i++) {
        struct push_ask *p = d->clients[i].push;
        if (!p || !d->clients[i].flush_gen)
            continue;
        if (kept)
            json_array_append_new(p->conflicts, json_pack("{s:o,s:o}", "path", gs_json_text(path),
                                                          "kept", gs_json_text(kept)));
        else
            json_array_append_new(p->failures,
                                  json_pack("{s:s,s:o,s:o}", "op", gs_plan_op_name(failed->type),
                                            "path", gs_json_text(path), "error",
                                            gs_json_text(message ? message : "failed")));
    }
}

/* Adds a batch's counts to every push waiting; a batch over the whole tree says how many files
 * were unchanged. What goes again at once (changed while sent, lost) did not fail. */
static void count_for_pushes(struct daemon *d, const struct gs_push_stats *batch,
                             uint64_t link_bytes, int full)
{
    struct gs_push_stats st = *batch;
    size_t again = (size_t)d->changed_while_sent + d->lost_ops;
    st.failed = st.failed > again ? st.failed - again : 0;
    for (int i = 0; i < d->n_clients; i++) {
        struct push_ask *p = d->clients[i].push;
        if (!p || !d->clients[i].flush_gen)
            continue;
        gs_push_stats_add(&p->st, &st);
        p->link_bytes += link_bytes;
        if (full)
            p->st.unchanged = st.unchanged;
    }
}

/* Adds what the push waiting on `c` was done to its answer, and forgets the push. */
static json_t *push_answer(struct daemon *d, struct client *c, json_t *reply)
{
    struct push_ask *p = c->push;
    if (!p)
        return reply;
    json_t *done = json_pack(
        "{s:i,s:I,s:i,s:i,s:i,s:i,s:i,s:I,s:O,s:O,s:s,s:i}", "sent", (int)p->st.sent, "bytes",
        (json_int_t)p->st.bytes_sent, "deleted", (int)p->st.deleted, "renamed", (int)p->st.renamed,
        "mkdirs", (int)p->st.mkdirs, "unchanged", (int)p->st.unchanged, "failed_count",
        (int)p->st.failed, "link_bytes", (json_int_t)p->link_bytes, "push_conflicts", p->conflicts,
        "push_failures", p->failures, "transport", d->sess.transport, "compress_level",
        d->sess.agent ? gs_agent_compress_level(d->sess.agent) : 0);
    json_object_set_new(done, "symlinks", json_integer((json_int_t)p->st.symlinks));
    json_object_set_new(done, "chmods", json_integer((json_int_t)p->st.chmods));
    json_object_update(reply, done);
    json_decref(done);
    push_ask_free(c);
    return reply;
}

/* ---- pushing a batch ---- */

static void on_op(void *ctx, const struct gs_plan_op *op, const struct gs_fop_result *r)
{
    struct daemon *d = ctx;
    if (!r)
        return;
    int64_t ms = gs_clock_mono_ms() - d->first_event_ms;
    json_t *ev;
    if (gs_push_lost(op, r)) {
        mark_dirty(d, op->path);
        if (op->from)
            mark_dirty(d, op->from);
        d->lost_ops++;
        if (!r->kept)
            return;
        ev = json_pack("{s:s,s:o,s:o}", "event", "conflict", "path", gs_json_text(op->from), "kept",
                       gs_json_text(r->kept));
        note_conflict(d, op->from, r->kept);
        tell_pushes(d, op->from, r->kept, NULL, NULL);
    } else if (!r->ok && gs_push_changed_locally(d->o->root, op)) {
        mark_dirty(d, op->path); /* a save came in while it was sent: its new version goes next */
        d->changed_while_sent++;
        return;
    } else if (!r->ok) {
        d->local_failures += r->local;
        note_failed(d, op->path);
        if (op->type == GS_OP_RENAME)
            note_failed(d, op->from);
        ev = json_pack("{s:s,s:o,s:o}", "event", "error", "path", gs_json_text(op->path), "message",
                       gs_json_text(r->message ? r->message : "failed"));
        tell_pushes(d, op->path, NULL, op, r->message);
    } else if (r->kept) {
        ev = json_pack("{s:s,s:o,s:o}", "event", "conflict", "path", gs_json_text(op->path), "kept",
                       gs_json_text(r->kept));
        note_conflict(d, op->path, r->kept);
        tell_pushes(d, op->path, r->kept, NULL, NULL);
    } else if (op->type == GS_OP_DELETE)
        ev = json_pack("{s:s,s:o}", "event", "deleted", "path", gs_json_text(op->path));
    else if (op->type == GS_OP_RENAME)
        ev = json_pack("{s:s,s:o,s:o}", "event", "renamed", "path", gs_json_text(op->path), "from",
                       gs_json_text(op->from));
    else
        ev = json_pack("{s:s,s:o,s:I}", "event", "synced", "path", gs_json_text(op->path), "ms",
                       (json_int_t)ms);
    if (!r->ok || r->kept)
        gs_warn("%s %s: %s", r->ok ? "conflict" : "error", op->path,
                r->ok ? r->kept : (r->message ? r->message : "failed"));
    broadcast(d, ev);
}

/* Reports a long batch's progress, bytes as well as files, so that a plugin shows one large file
 * moving. A save's batch ends before the first report: it adds nothing to the stream. */
static void serve_during_batch(struct daemon *d);

static void on_batch_progress(void *ctx, const struct gs_push_stats *st)
{
    struct daemon *d = ctx;
    d->batch_st = *st;
    serve_during_batch(d);
    int64_t now = gs_clock_mono_ms();
    if (now < d->next_progress_ms)
        return;
    d->next_progress_ms = now + PROGRESS_EVERY_MS;
    uint64_t bytes = st->bytes_out > st->bytes_sent ? st->bytes_out : st->bytes_sent;
    broadcast(d, json_pack("{s:s,s:I,s:I,s:I,s:I}", "event", "progress", "ops_done",
                           (json_int_t)st->ops_done, "ops_total", (json_int_t)st->ops_total,
                           "bytes", (json_int_t)bytes, "bytes_total", (json_int_t)st->bytes_total));
}

/* Holds back an operation on a file in the middle of a save (syncd/watch.h). Asked once the batch
 * has been planned and hashed, after reading the events that arrived meanwhile: a save that began
 * while its file was hashed is then known, and the half-written bytes are not sent. */
static int hold_op(void *ctx, const struct gs_plan_op *op)
{
    struct daemon *d = ctx;
    if (!d->batch_drained)
        read_changes(d);
    d->batch_drained = 1;
    struct gs_watch_found at = {.planned_at = d->batch_planned_at,
                                .gone = op->type == GS_OP_DELETE,
                                .empty = op->type == GS_OP_PUT && op->record.size == 0,
                                .mtime_ns = op->record.mtime_ns};
    struct gs_watch_found from = {.planned_at = d->batch_planned_at, .gone = !op->subtree};
    int64_t now = gs_clock_mono_ms(), until = now, from_until = now;
    int held = gs_watch_hold(d->watch, op->path, &at, now, &until);
    if (op->from && gs_watch_hold(d->watch, op->from, &from, now, &from_until)) {
        until = held && until < from_until ? until : from_until;
        held = 1;
    }
    if (!held)
        return 0;
    hold_path(d, op->path, until);
    if (op->from)
        hold_path(d, op->from, until);
    return 1;
}

/* An operation that waits for a held one (syncd/push.h) is sent with it. */
static void held_along_op(void *ctx, const struct gs_plan_op *op)
{
    struct daemon *d = ctx;
    hold_path(d, op->path, d->held_until_ms);
    if (op->from)
        hold_path(d, op->from, d->held_until_ms);
}

/* Answers the waiting flushes with an error: a connection attempt failed, so the server cannot be
 * known to match (waiting for the next attempt would answer a user who asked now only after the
 * backoff, up to BACKOFF_MAX_MS). A flush asked after that attempt began gets an attempt of its
 * own first: the link may have come back meanwhile. */
static void refuse_flushes(struct daemon *d)
{
    char why[1400];
    size_t pending = d->n_dirty + d->n_failed + d->n_held;
    json_t *since = unreachable_since(d);
    snprintf(why, sizeof(why),
             "%s has been unreachable since %s (%lld s); %zu change%s wait%s%s and will be sent "
             "when it answers: %s",
             d->target, json_is_string(since) ? json_string_value(since) : "now",
             d->unreachable_since ? (long long)(time(NULL) - d->unreachable_since) : 0LL, pending,
             pending == 1 ? "" : "s", pending == 1 ? "s" : "",
             d->full ? " (and every file is checked: more may)" : "", d->last_error);
    for (int i = 0; i < d->n_clients; i++) {
        struct client *c = &d->clients[i];
        if (!c->flush_gen)
            continue;
        if (c->flush_start_ms > d->connect_started_ms) { /* asked after that attempt began */
            d->next_connect_ms = gs_clock_mono_ms();     /* the link may be back: try again */
            continue;
        }
        json_t *answer = json_pack("{s:b,s:o,s:O,s:I}", "ok", 0, "error", gs_json_text(why),
                                   "unreachable_since", since, "pending", (json_int_t)pending);
        reply(c, push_answer(d, c, answer));
        c->flush_gen = 0;
    }
    json_decref(since);
}

/* Whether client c waits for a flush that the batches so far have synced. */
static int flush_satisfied(const struct daemon *d, const struct client *c)
{
    return c->flush_gen && c->flush_gen <= d->synced_gen;
}

/* A change an earlier batch could not make (refused by the server, or a local read error) is not
 * on the server, so a flush this batch would satisfy cannot answer success yet: the change is tried
 * once more, and the flushes wait for that batch, which answers them either way. Returns 1 when
 * some flush waits again. */
static int retry_for_flushes(struct daemon *d)
{
    int waiting = 0;
    for (int i = 0; i < d->n_clients; i++)
        waiting |= flush_satisfied(d, &d->clients[i]);
    if (!waiting) /* no one asks: the retry timer sends them again, a lasting refusal never spins */
        return 0;
    retry_failed(d);
    for (int i = 0; i < d->n_clients; i++)
        if (flush_satisfied(d, &d->clients[i]))
            d->clients[i].flush_gen = d->event_gen;
    d->flush_now = 1;
    return 1;
}

/* Answers the flushes this batch satisfied; `error` (or NULL) says why the server does not match
 * after all: a flush must never report success over a refused change. */
static void answer_flushes(struct daemon *d, const char *error)
{
    if (!error && d->n_failed && retry_for_flushes(d))
        return;
    int64_t now = gs_clock_mono_ms();
    for (int i = 0; i < d->n_clients; i++) {
        struct client *c = &d->clients[i];
        if (!flush_satisfied(d, c))
            continue;
        json_t *answer =
            error ? json_pack("{s:b,s:o,s:b}", "ok", 0, "error", gs_json_text(error), "local",
                              d->last_error_local)
                  : json_pack("{s:b,s:I,s:O}", "ok", 1, "ms", (json_int_t)(now - c->flush_start_ms),
                              "conflicts", d->conflicts);
        reply(c, push_answer(d, c, answer));
        c->flush_gen = 0;
    }
}

static int is_transport_error(int rc)
{
    /* GS_E_INTERRUPTED: a stop abandoned a wait on the server, maybe with a request half sent */
    return rc == GS_E_DISCONNECTED || rc == GS_E_TIMEOUT || rc == GS_E_PROTO || rc == GS_E_NOMEM ||
           rc == GS_E_INTERRUPTED;
}

/* Puts a batch's paths back (after a lost connection) so nothing is forgotten. */
static void requeue(struct daemon *d, char **paths, size_t n, int full)
{
    for (size_t i = 0; i < n; i++)
        mark_dirty(d, paths[i]);
    if (full)
        d->full = 1;
}

static void found_changed(void *ctx, const char *path)
{
    mark_dirty(ctx, path);
}

/* Asks the server how it compares with the index (syncd/verify.h), for a push or flush that
 * asked (d->verify) or on an idle connection; what follows goes on while it answers
 * (check_finish). Returns 0 or a transport error. */
static int check_send(struct daemon *d, struct gs_verify **v, struct gs_error *err)
{
    d->verify = 0; /* a flush asked while it runs (while_waiting) sets it again: checked next */
    gs_ssh_set_waiting(d->ssh, while_waiting, d);
    int rc = gs_verify_prepare(d->sess.idx, d->check_copy, v, err);
    if (rc == 0)
        rc = gs_verify_send(*v, d->sess.ops, err);
    gs_ssh_set_waiting(d->ssh, NULL, NULL);
    if (rc < 0) {
        gs_verify_abandon(*v);
        *v = NULL;
        d->verify = 1;
    }
    return rc;
}

/* Waits for the answer: the paths the server no longer held as the index said become dirty, so
 * that a batch sends them again. Returns how many, or a transport error. */
static int check_finish(struct daemon *d, struct gs_verify *v, struct gs_error *err)
{
    struct gs_verify_result r;
    struct gs_verify_found found = {found_changed, d};
    gs_ssh_set_waiting(d->ssh, while_waiting, d);
    int rc = gs_verify_finish(v, d->sess.ops, &found, &r, err);
    gs_ssh_set_waiting(d->ssh, NULL, NULL);
    if (rc < 0) {
        d->verify = 1;
        return rc;
    }
    d->next_verify_ms = next_verify_ms(d);
    /* What the server lacked at a path that a sync meanwhile renamed (or rewrote) is not yet
     * known at its new path: checked again before a flush is told "up to date". */
    if (r.moved)
        d->verify = 1;
    size_t n = r.gone + r.changed + r.moved;
    return (int)(n > INT_MAX ? INT_MAX : n);
}

static int check_server(struct daemon *d, struct gs_error *err)
{
    struct gs_verify *v = NULL;
    int rc = check_send(d, &v, err);
    return rc < 0 ? rc : check_finish(d, v, err);
}

/* The answer of the check a batch sent before its requests, once they are done: what the server
 * no longer held becomes dirty (*changed_there set) for the next batch. Returns the batch's
 * result `rc`, or the check's transport error (in `err`). */
static int batch_check_answer(struct daemon *d, struct gs_verify *check, int *changed_there, int rc,
                              struct gs_error *err)
{
    if (!check)
        return rc;
    struct gs_error check_err = {0};
    int found = check_finish(d, check, &check_err);
    if (found < 0) {
        *err = check_err;
        return found;
    }
    *changed_there = found > 0;
    return rc;
}

static void sync_batch(struct daemon *d)
{
    read_changes(d); /* the saves that ended before the plan reads their files are not held */
    read_rules(d);
    d->syncing = 1;
    struct gs_error err = {0};
    struct gs_verify *check = NULL; /* answered while the batch goes (batch_check_answer) */
    int rc = d->verify ? check_send(d, &check, &err) : 0;
    if (rc < 0) {
        d->syncing = 0;
        disconnect(d, rc == GS_E_INTERRUPTED ? STOPPED_MID_WAIT : err.msg);
        show_status(d);
        return;
    }
    d->batch_planned_at = gs_watch_events_read(d->watch);
    unhold(d);
    char **paths = d->dirty;
    size_t n = d->n_dirty;
    int full = d->full;
    uint64_t gen = d->event_gen;
    d->dirty = NULL;
    d->n_dirty = d->cap_dirty = 0;
    d->full = d->flush_now = 0;
    unique_paths(paths, &n);
    d->batch_paths = full ? 0 : n;
    show_status(d);
    struct gs_push_opts o = {.paths = full ? NULL : (const char *const *)paths,
                             .n_paths = full ? 0 : n,
                             .on_op = on_op,
                             .on_progress = on_batch_progress,
                             .hold = hold_op,
                             .held_along = held_along_op,
                             .on_reading = on_reading,
                             .on_scan = on_scan,
                             .ctx = d};
    struct gs_push_stats st;
    d->lost_ops = d->changed_while_sent = d->batch_drained = d->local_failures = 0;
    d->next_progress_ms = gs_clock_mono_ms() + PROGRESS_EVERY_MS;
    memset(&d->batch_st, 0, sizeof(d->batch_st));
    memset(&d->reading, 0, sizeof(d->reading));
    uint64_t link_before = d->sess.ops ? d->sess.ops->bytes_sent : 0;
    memset(&st, 0, sizeof(st));
    gs_ssh_set_waiting(d->ssh, while_waiting, d);
    if (full || n) /* nothing changed here: a flush's answer needs no plan */
        rc = gs_push_run(d->o->root, d->sess.ig, d->sess.idx, d->sess.ops, &o, &st, &err);
    gs_ssh_set_waiting(d->ssh, NULL, NULL);
    int changed_there = 0;
    if (!is_transport_error(rc))
        rc = batch_check_answer(d, check, &changed_there, rc, &err);
    else
        gs_verify_abandon(check);
    d->syncing = 0;
    count_for_pushes(d, &st, d->sess.ops ? d->sess.ops->bytes_sent - link_before : 0, full);
    if (rc == GS_E_REMOTE && st.failed == (size_t)d->changed_while_sent)
        rc = 0; /* nothing failed: files changed while they were sent, and go again (on_op) */
    if (full && (rc == 0 || rc == GS_E_REMOTE)) /* what it refused is noted as failed */
        d->checked = 1;
    if (is_transport_error(rc)) {
        requeue(d, paths, n, full);
        disconnect(d, rc == GS_E_INTERRUPTED ? STOPPED_MID_WAIT : err.msg);
    } else {
        if (rc < 0)
            snprintf(d->last_error, sizeof(d->last_error), "%s", err.msg);
        else
            d->last_error[0] = '\0';
        /* a file that could not be read here, or the index: not the server's doing */
        d->last_error_local = rc != GS_E_REMOTE || st.failed == (size_t)d->local_failures;
        if (rc < 0 && rc != GS_E_REMOTE) /* GS_E_REMOTE: on_op noted each refused operation */
            keep_failed_batch(d, paths, n, full);
        if (d->lost_ops || d->changed_while_sent || changed_there) /* sent again at once */
            d->flush_now = 1;
        else if (!d->n_held) /* a flush waits for the saves in progress */
            d->synced_gen = gen;
        if (st.ops_total)
            d->last_latency_ms = gs_clock_mono_ms() - d->first_event_ms;
        if (rc == 0 && st.ops_total) /* the server answered: the link is not idle */
            d->next_check_ms = gs_clock_mono_ms() + LIVENESS_EVERY_MS;
        d->next_retry_ms = gs_clock_mono_ms() + RETRY_FAILED_MS;
        gs_debug("batch of %zu path%s%s: rc %d, %zu op%s, gen %llu of %llu synced; now %zu dirty, "
                 "%zu failed, %zu held",
                 n, n == 1 ? "" : "s", full ? " (full)" : "", rc, st.ops_total,
                 st.ops_total == 1 ? "" : "s", (unsigned long long)d->synced_gen,
                 (unsigned long long)d->event_gen, d->n_dirty, d->n_failed, d->n_held);
        answer_flushes(d, rc < 0 ? d->last_error : NULL);
        if (!d->n_dirty && !d->full && !d->n_failed && !d->n_held) /* the server matches */
            broadcast(d, json_pack("{s:s}", "event", "idle"));
    }
    free_paths(paths, n);
    show_status(d);
}

/* sync_batch under the sync lock, or in LOCK_RETRY_MS while a push or pull holds it. */
static void sync_batch_when_free(struct daemon *d)
{
    if (!take_sync_lock(d))
        return;
    sync_batch(d);
    gs_session_unlock(&d->sess);
}

/* A batch goes out after a short quiet spell, or when it has waited long enough, or at once for
 * a flush. */
static int batch_due(const struct daemon *d, int64_t now)
{
    if (!d->connected)
        return 0;
    if (d->n_held && now >= d->held_until_ms)
        return 1;
    if (!d->n_dirty && !d->full)
        return d->verify && d->flush_now;
    return d->flush_now || now - d->last_event_ms >= d->o->debounce_ms ||
           now - d->first_event_ms >= d->o->debounce_cap_ms;
}

/* ---- control clients ---- */

static void drop_client(struct daemon *d, int i)
{
    push_ask_free(&d->clients[i]);
    close(d->clients[i].fd);
    gs_buf_release(&d->clients[i].in);
    d->clients[i] = d->clients[--d->n_clients];
}

/* Sends `msg` to c, and drops the reference. A NULL msg (a json_pack that failed) is skipped, not
 * a reason to hang up. */
static void reply(struct client *c, json_t *msg)
{
    if (!msg) {
        gs_debug("a reply could not be encoded: not sent");
        return;
    }
    if (gs_control_send(c->fd, msg, NULL) < 0)
        c->dead = 1;
    json_decref(msg);
}

/* Drops the clients that stopped reading; backwards, as drop_client moves the last one down. */
static void drop_dead_clients(struct daemon *d)
{
    for (int i = d->n_clients - 1; i >= 0; i--)
        if (d->clients[i].dead)
            drop_client(d, i);
}

static void read_changes(struct daemon *d)
{
    struct gs_error err = {0};
    int rc = gs_watch_read(d->watch, mark_dirty, d, &err);
    if (rc == 1)
        mark_full(d);
}

/* Stops the daemon saying why, in its log and on the event stream (where a plugin learns it, and
 * the only place left when the log went with .gpusync/), and to each request after. */
static void stop_saying(struct daemon *d, const char *why)
{
    gs_warn("%s", why);
    broadcast(d,
              json_pack("{s:s,s:n,s:o}", "event", "error", "path", "message", gs_json_text(why)));
    snprintf(d->stop_reason, sizeof(d->stop_reason), "%s", why);
    d->stop = 1;
}

/* Whether the project folder was moved (or removed) since the daemon started: its path then names
 * another folder, or none. The daemon stops, saying where it went (/proc/self/fd follows the
 * folder): every path it reads and writes is under the old name, and a status from the new place
 * (the control socket moved with it) must not say up to date. Returns 1 when it stopped. */
static int root_moved(struct daemon *d)
{
    struct stat now, was;
    if (d->stop_reason[0])
        return 1;
    if (d->root_fd < 0 || fstat(d->root_fd, &was) < 0)
        return 0;
    if (stat(d->o->root, &now) == 0 && now.st_dev == was.st_dev && now.st_ino == was.st_ino)
        return 0;
    char link[64], where[PATH_MAX] = "";
    snprintf(link, sizeof(link), "/proc/self/fd/%d", d->root_fd);
    ssize_t n = readlink(link, where, sizeof(where) - 1);
    where[n > 0 ? n : 0] = '\0';
    struct gs_buf why = GS_BUF_INIT;
    gs_buf_addf(&why, "the project folder %s was ", d->o->root);
    if (n <= 0 || strstr(where, " (deleted)"))
        gs_buf_adds(&why, "removed");
    else
        gs_buf_addf(&why, "moved to %s", where);
    gs_buf_adds(&why, "; the watch daemon stopped: start it again there");
    stop_saying(d, why.data);
    gs_buf_release(&why);
    return 1;
}

/* Answers a request the daemon can no longer serve truthfully (root_moved) as a stopped daemon
 * does: the client then works without it. Returns 1 when it answered. */
static int refuse_when_stopped(struct daemon *d, struct client *c)
{
    if (!root_moved(d))
        return 0;
    reply(c,
          json_pack("{s:b,s:o,s:b}", "ok", 0, "error", gs_json_text(d->stop_reason), "stopped", 1));
    return 1;
}

/* Takes a change of the exclude rules outside the tree (rules.h) into account: the tree is
 * scanned again, so that what is excluded now leaves the server and what no longer is goes
 * there. Before each batch, and once a second. */
static void read_rules(struct daemon *d)
{
    if (d->connecting) /* its thread may use the rules */
        return;
    struct gs_error err = {0};
    struct gs_ignore *was = d->sess.ig;
    int rc = gs_rules_check(&d->rules, &d->sess.ig, &err);
    if (rc < 0) {
        gs_warn("%s; the exclude rules stay as they were", err.msg);
        return;
    }
    if (rc == 0)
        return;
    if (rc == GS_RULES_OTHER_SERVER) {
        const char *why = "the project's config names another server or path now (gpusync init); "
                          "the watch daemon stopped: start it again to sync there";
        stop_saying(d, why);
        return;
    }
    gs_info("the exclude rules changed: scanning the tree again");
    gs_watch_set_ignore(d->watch, d->sess.ig);
    if (was != d->sess.ig)
        gs_ignore_free(was);
    mark_full(d);
}

static void start_flush(struct daemon *d, struct client *c)
{
    /* Every write made before this request is already in the inotify queue: read it now, and look
     * at the files a write elsewhere changes unseen. A change the server refused earlier is not
     * synced either: send it again. */
    read_changes(d);
    check_linked(d);
    d->sweep_due = d->sweep_ms < LINK_SWEEP_FLUSH_MS; /* before the batch (never inside one) */
    retry_failed(d);
    /* And what the server holds: a file deleted there is not up to date. The check runs at the
     * start of a batch, which sends what it finds, so the flush waits for a batch that starts
     * after it (a batch under way, begun before the request, may not have checked): a generation
     * of its own, with nothing dirty. */
    d->verify = 1;
    c->flush_gen = ++d->event_gen;
    c->flush_start_ms = gs_clock_mono_ms();
    d->flush_now = 1;
    if (!d->connected) /* a user asks now: try at once, not when the backoff ends */
        d->next_connect_ms = c->flush_start_ms;
}

/* `gpusync push`: every file is checked (as a push of its own would), then answered as a flush is,
 * with what was sent meanwhile. */
static void start_push(struct daemon *d, struct client *c)
{
    push_ask_free(c);
    c->push = gs_xcalloc(1, sizeof(*c->push));
    c->push->conflicts = json_array();
    c->push->failures = json_array();
    mark_full(d);
    start_flush(d, c);
}

/* Hands client i's connection to the relay, which runs the command and closes it. Returns 1 when
 * handed over (the client is no longer in the list), 0 after an error reply. */
static int start_exec(struct daemon *d, int i, json_t *req)
{
    const char *command = json_string_value(json_object_get(req, "command"));
    if (!command) {
        reply(&d->clients[i], json_pack("{s:b,s:s}", "ok", 0, "error", "missing \"command\""));
        return 0;
    }
    int fd = d->clients[i].fd;
    gs_buf_release(&d->clients[i].in);
    d->clients[i] = d->clients[--d->n_clients];
    gs_relay_exec(d->relay, fd, command);
    return 1;
}

/* Answers one request. Returns 1 when client i was handed over (no longer in the list). */
static int handle_request(struct daemon *d, int i, json_t *req)
{
    struct client *c = &d->clients[i];
    const char *cmd = json_string_value(json_object_get(req, "cmd"));
    if (cmd && strcmp(cmd, "exec") == 0)
        return start_exec(d, i, req);
    if (!cmd)
        reply(c, json_pack("{s:b,s:s}", "ok", 0, "error", "missing \"cmd\""));
    else if ((!strcmp(cmd, "status") || !strcmp(cmd, "flush") || !strcmp(cmd, "push") ||
              !strcmp(cmd, "ack_conflicts")) &&
             refuse_when_stopped(d, c))
        return 0;
    else if (strcmp(cmd, "status") == 0)
        reply(c, status_json(d));
    else if (strcmp(cmd, "flush") == 0)
        start_flush(d, c);
    else if (strcmp(cmd, "push") == 0)
        start_push(d, c);
    else if (strcmp(cmd, "events") == 0) {
        c->events = 1;
        reply(c, json_pack("{s:b}", "ok", 1));
    } else if (strcmp(cmd, "ack_conflicts") == 0) {
        reply(c, status_json(d)); /* what is acknowledged is exactly what the user is shown */
        json_array_clear(d->conflicts);
        d->conflicts_unsaved = 1;
    } else if (strcmp(cmd, "stop") == 0) {
        c->stopping = 1; /* answered at the end, with what was left unsent */
        d->stop = 1;
    } else
        reply(c, json_pack("{s:b,s:s}", "ok", 0, "error", "unknown command"));
    return 0;
}

/* Reads from client i; returns 0 if it is still there, -1 if it was dropped. */
static int serve_client(struct daemon *d, int i)
{
    struct client *c = &d->clients[i];
    char chunk[4096];
    ssize_t n = read(c->fd, chunk, sizeof(chunk));
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
        drop_client(d, i);
        return -1;
    }
    if (n > 0)
        gs_buf_add(&c->in, chunk, (size_t)n);
    json_t *req;
    struct gs_error err = {0};
    while (gs_control_pop(&c->in, &req, &err) == 0 && req) {
        int handed = handle_request(d, i, req);
        json_decref(req);
        if (handed)
            return -1;
    }
    if (err.code) { /* garbage or a wrong version: say so and hang up */
        reply(c, json_pack("{s:b,s:o}", "ok", 0, "error", gs_json_text(err.msg)));
        drop_client(d, i);
        return -1;
    }
    return 0;
}

/* Whether the process at the other end of `fd` runs as our user: the socket's mode keeps others
 * out, and this holds even where a directory's or socket's permissions were loosened. */
static int peer_is_us(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

static void accept_clients(struct daemon *d)
{
    int fd;
    while ((fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        if (d->n_clients == MAX_CLIENTS || !peer_is_us(fd)) {
            if (d->n_clients < MAX_CLIENTS)
                gs_warn("refused a control connection from another user");
            close(fd);
            continue;
        }
        d->clients[d->n_clients++] = (struct client){.fd = fd, .in = GS_BUF_INIT};
    }
}

/* Requests a batch in progress can take at once: they read the daemon's state, or change only
 * what the batch no longer uses (the dirty set it took its paths from, the flags for the next
 * batch). A flush or push starts waiting now, so its time counts from the request and the batch
 * under way counts for it (it is answered after a batch that began later, as always); a stop
 * ends the batch where it waits on the server (while_waiting); an exec goes to the relay, whose
 * spare connections the batch does not use (`gpusync ps` during an upload used to wait for it,
 * or 30 s, then connect by itself), except once the daemon is stopping. */
static int answers_during_batch(const struct daemon *d, json_t *req)
{
    static const char *const now[] = {"status", "events", "stop", "flush", "push", "exec"};
    const char *cmd = json_string_value(json_object_get(req, "cmd"));
    if (cmd && d->stop && strcmp(cmd, "exec") == 0)
        return 0;
    for (size_t i = 0; cmd && i < sizeof(now) / sizeof(now[0]); i++)
        if (strcmp(cmd, now[i]) == 0)
            return 1;
    return 0;
}

/* Answers the requests at the head of client i's buffer that answers_during_batch allows; the
 * first other one, and all after it, stay buffered in order for the loop (has_request). */
static void answer_head_requests(struct daemon *d, int i)
{
    struct client *c = &d->clients[i];
    for (;;) {
        char *nl = c->in.len ? memchr(c->in.data, '\n', c->in.len) : NULL;
        if (!nl)
            return;
        struct gs_buf line = GS_BUF_INIT;
        gs_buf_add(&line, c->in.data, (size_t)(nl - c->in.data) + 1);
        json_t *req = NULL;
        struct gs_error err = {0};
        int ok = gs_control_pop(&line, &req, &err) == 0 && req && answers_during_batch(d, req);
        gs_buf_release(&line);
        int handed = 0;
        if (ok) {
            gs_buf_consume(&c->in, (size_t)(nl - c->in.data) + 1);
            handed = handle_request(d, i, req);
        }
        json_decref(req);
        if (!ok || handed) /* handed: slot i holds another client now, served next time */
            return;
    }
}

static void read_signal(struct daemon *d)
{
    struct signalfd_siginfo si;
    if (read(d->signal_fd, &si, sizeof(si)) > 0)
        d->stop = 1;
}

/* Called from a batch's progress and while the batch or a liveness check waits on the server
 * (pushes run inline): takes new control connections and the requests answers_during_batch
 * allows, so that while a large file goes, or the link stalls, `gpusync status` says "syncing"
 * instead of timing out on a silent daemon and then on the index it holds, an editor that starts
 * meanwhile sees the progress, and `watch --stop` (or SIGTERM) stops the daemon instead of
 * waiting for the batch. Other requests wait for the batch's end. */
static void serve_during_batch(struct daemon *d)
{
    int64_t now = gs_clock_mono_ms();
    if (now < d->next_serve_ms)
        return;
    d->next_serve_ms = now + SERVE_IN_BATCH_MS;
    read_signal(d);
    accept_clients(d);
    for (int i = 0; i < d->n_clients; i++) {
        char chunk[4096];
        ssize_t n = d->clients[i].dead ? 0 : read(d->clients[i].fd, chunk, sizeof(chunk));
        if (n > 0) /* at EOF (n == 0) the loop drops the client once the batch is over */
            gs_buf_add(&d->clients[i].in, chunk, (size_t)n);
        answer_head_requests(d, i);
    }
}

/* gs_ssh's waiting callback: serves clients while a batch or a liveness check waits on the
 * server, and abandons the wait once the daemon is to stop. */
static int while_waiting(void *ctx)
{
    struct daemon *d = ctx;
    serve_during_batch(d);
    return d->stop || (d->wait_until_ms && gs_clock_mono_ms() > d->wait_until_ms);
}

/* gs_push's reading callback: a batch reading (hashing) the changed files serves clients as a
 * wait on the server does, and is abandoned once the daemon is to stop. */
static int on_reading(void *ctx, const struct gs_plan_reading *r)
{
    struct daemon *d = ctx;
    d->reading = *r;
    return while_waiting(d);
}

/* Whether c holds a complete request, read during a batch and not answered yet. */
static int has_request(const struct client *c)
{
    return c->in.len && memchr(c->in.data, '\n', c->in.len);
}

/* ---- the loop ---- */

static int next_timeout(const struct daemon *d, int64_t now)
{
    int64_t t = now + 1000;
    if (d->n_dirty || d->full) {
        int64_t due = d->last_event_ms + d->o->debounce_ms;
        int64_t cap = d->first_event_ms + d->o->debounce_cap_ms;
        t = due < t ? due : t;
        t = cap < t ? cap : t;
    }
    if (d->n_held && d->held_until_ms < t)
        t = d->held_until_ms;
    if (!d->connected && !d->connecting && d->next_connect_ms && d->next_connect_ms < t)
        t = d->next_connect_ms; /* (while connecting, a flush's "try at once" waits for it) */
    /* disconnected, a flush waits for the connection; with only held paths, for their saves */
    if (d->flush_now && d->connected && (d->n_dirty || d->full || d->verify))
        t = now;
    if (t < d->lock_retry_ms) /* connecting and batching wait for the sync lock */
        t = d->lock_retry_ms;
    return t <= now ? 0 : (int)(t - now);
}

/* `polled` clients had entries in p[4..]; serving runs backwards because a dropped client is
 * replaced by the last one, which has been served already. New clients are accepted last. */
static void handle_polls(struct daemon *d, struct pollfd *p, int polled)
{
    if (p[0].revents & POLLIN)
        read_changes(d);
    if (p[2].revents & POLLIN)
        read_signal(d);
    if (p[3].revents & POLLIN)
        connected_or_not(d);
    for (int i = polled - 1; i >= 0; i--)
        if ((p[4 + i].revents & (POLLIN | POLLHUP)) || has_request(&d->clients[i]))
            serve_client(d, i);
    if (p[1].revents & POLLIN)
        accept_clients(d);
}

/* The inode of the control socket's file, or 0 when there is none. */
static ino_t socket_file_ino(const char *root)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, root, GS_CONTROL_SOCKET);
    struct stat st;
    ino_t ino = lstat(path.data, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
    gs_buf_release(&path);
    return ino;
}

/* Puts the state back after .gpusync/ vanished under a running daemon (`rm -rf`, a git
 * operation): its lock, log and socket, so `flush` and `status` reach it again. Returns 0, or -1
 * when another daemon has taken the project meanwhile. */
static int restore_state(struct daemon *d)
{
    struct gs_error err = {0};
    struct gs_buf log = GS_BUF_INIT;
    int lock = gs_path_state_dir(d->o->root, &err) == 0 ? gs_daemon_lock(d->o->root, &err) : -1;
    gs_path_join(&log, d->o->root, GS_CONTROL_LOG);
    int fd = lock >= 0 && d->o->ready_fd >= 0
                 ? gs_path_open_private(log.data, O_WRONLY | O_CREAT | O_APPEND)
                 : -1;
    if (fd >= 0) { /* a background daemon's log went with the folder: write to the new one */
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    gs_buf_release(&log);
    if (lock < 0) {
        gs_warn("%s", err.msg);
        return -1;
    }
    close(d->listen_fd);
    d->listen_fd = gs_control_listen(d->o->root, &err);
    d->socket_ino = socket_file_ino(d->o->root);
    d->index_removed = 1;
    return d->listen_fd < 0 ? -1 : 0; /* the lock descriptor stays open: it is the lock */
}

/* Whether the index file at `path` records anything for our server: one made meanwhile by a push
 * that synced while the daemon had no socket is newer than ours; an empty one (a `status` run in
 * that moment creates one) is not. */
static int index_file_has_records(struct daemon *d, const char *path)
{
    struct gs_index *disk = NULL;
    size_t entries = 0, intents = 0;
    if (access(path, F_OK) != 0 ||
        gs_index_open(&disk, path, gs_index_remote(d->sess.idx), NULL) < 0)
        return 0;
    int has = (gs_index_count(disk, &entries, NULL) == 0 && entries) ||
              (gs_index_intent_count(disk, &intents, NULL) == 0 && intents);
    gs_index_close(disk);
    return has;
}

/* Puts the index back after .gpusync/ was removed: the daemon's handle still reads the removed
 * file (SQLite no longer writes it), so its records are copied to .gpusync/index.db and used from
 * there; without them every file would count as never sent. Waits while a connection attempt
 * runs, since that thread uses the index. */
static void restore_index(struct daemon *d, int64_t now)
{
    if (!d->index_removed || d->connecting || now < d->next_index_try_ms)
        return;
    d->index_removed = 0;
    struct gs_error err = {0};
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, d->o->root, GS_INDEX_FILE);
    struct gs_index *disk = NULL;
    if (index_file_has_records(d, path.data) &&
        gs_index_open(&disk, path.data, gs_index_remote(d->sess.idx), &err) == 0) {
        gs_verify_copy_reset(d->check_copy); /* it notes the writes of the one closed here */
        gs_index_close(d->sess.idx);
        d->sess.idx = disk;
        gs_warn("%s was made again meanwhile; using it", path.data);
    } else if (gs_index_move(d->sess.idx, path.data, &err) == 0) {
        gs_info("%s is back, with every record it held", path.data);
    } else {
        gs_warn("%s; trying again in a second", err.msg);
        d->index_removed = 1;
        d->next_index_try_ms = now + 1000;
    }
    gs_buf_release(&path);
    d->conflicts_unsaved = 1;
    mark_full(d); /* a batch in the meantime could not record its results: check everything */
}

/* Once a second: is .gpusync/ still ours? A project whose config is gone is no longer a gpusync
 * project, and its daemon stops; otherwise the state is put back. */
static void check_state_dir(struct daemon *d, int64_t now)
{
    if (now < d->next_state_check_ms)
        return;
    d->next_state_check_ms = now + 1000;
    if (socket_file_ino(d->o->root) == d->socket_ino)
        return;
    struct gs_buf config = GS_BUF_INIT;
    gs_path_join(&config, d->o->root, GS_CONFIG_FILE);
    int gone = access(config.data, F_OK) != 0;
    gs_buf_release(&config);
    if (gone || restore_state(d) < 0) {
        char why[1200];
        snprintf(why, sizeof(why), "%s/.gpusync was removed%s; the watch daemon stopped",
                 d->o->root, gone ? " with its config" : " and another daemon took the project");
        stop_saying(d, why);
        return;
    }
    gs_warn("%s/.gpusync was removed under the running daemon; its socket, lock and log are back",
            d->o->root);
}

static void run_timers(struct daemon *d)
{
    int64_t now = gs_clock_mono_ms();
    if (now >= d->next_state_check_ms && root_moved(d))
        return;
    check_state_dir(d, now);
    if (now >= d->next_rules_check_ms) {
        d->next_rules_check_ms = now + 1000;
        read_rules(d);
    }
    if (now >= d->next_linked_ms && d->linked.n <= LINKED_POLL_MAX) {
        d->next_linked_ms = now + LINKED_POLL_MS;
        check_linked(d);
    }
    if (d->sweep_due || (now >= d->next_sweep_ms && d->connected && !d->n_dirty && !d->full)) {
        d->sweep_due = 0;
        sweep_links(d);
    }
    restore_index(d, now);
    /* a connection deferred for the local sync lock is no failed attempt: flushes wait on */
    if (!d->connected && !d->connecting && d->next_connect_ms && now >= d->next_connect_ms)
        connect_when_free(d);
    if (d->n_failed && d->connected && now >= d->next_retry_ms)
        retry_failed(d);
    if (gs_watch_polling(d->watch, NULL) && now >= d->next_poll_ms) {
        d->next_poll_ms = now + POLL_FALLBACK_MS;
        mark_full(d);
    }
    if (batch_due(d, now) && now >= d->lock_retry_ms)
        sync_batch_when_free(d);
    else
        check_liveness(d);
    save_conflicts(d);
}

static void loop(struct daemon *d)
{
    while (!d->stop) {
        struct pollfd p[4 + MAX_CLIENTS];
        p[0] = (struct pollfd){.fd = gs_watch_fd(d->watch), .events = POLLIN};
        p[1] = (struct pollfd){.fd = d->listen_fd, .events = POLLIN};
        p[2] = (struct pollfd){.fd = d->signal_fd, .events = POLLIN};
        p[3] = (struct pollfd){.fd = d->connect_done, .events = POLLIN};
        int n_clients = d->n_clients;
        for (int i = 0; i < n_clients; i++)
            p[4 + i] = (struct pollfd){.fd = d->clients[i].fd, .events = POLLIN};
        int buffered = 0; /* requests read during a batch are answered without waiting */
        for (int i = 0; i < n_clients; i++)
            buffered |= has_request(&d->clients[i]);
        int ready =
            poll(p, (nfds_t)(4 + n_clients), buffered ? 0 : next_timeout(d, gs_clock_mono_ms()));
        if (ready > 0 || buffered)
            handle_polls(d, p, n_clients);
        run_timers(d);
        drop_dead_clients(d);
    }
}

/* The requests still buffered at exit (those a batch does not take, and any behind them) get an
 * answer that says the daemon stopped, so that no client finds its connection closed without a
 * word; an exec then runs over the client's own connection (gs_control_exec), a push by itself. */
static void refuse_buffered_at_exit(struct client *c)
{
    json_t *req;
    struct gs_error err = {0};
    while (gs_control_pop(&c->in, &req, &err) == 0 && req) {
        reply(c, json_pack("{s:b,s:s,s:b}", "ok", 0, "error",
                           "the watch daemon stopped before it answered", "stopped", 1));
        json_decref(req);
    }
}

/* At a stop, asks the server once more whether it holds what the index says: "nothing unsent"
 * must be true of the server now (a file deleted there since the last check would be missing),
 * not only of this side. What it lacks becomes dirty, so counts as unsent. Only while connected
 * and idle (a stop in the middle of a batch abandons the batch and its connection), for at most
 * STOP_CHECK_MS (the stop's client waits 5 s for the answer), and a second stop cuts it short.
 * Returns 1 when the server answered. */
static int check_at_stop(struct daemon *d)
{
    if (!d->connected || !d->sess.ops || !take_sync_lock(d)) /* a push or pull: theirs now */
        return 0;
    d->stop = 0; /* set again by a second stop, read as the check waits (while_waiting) */
    d->wait_until_ms = gs_clock_mono_ms() + STOP_CHECK_MS;
    struct gs_error err = {0};
    int rc = check_server(d, &err);
    d->wait_until_ms = 0;
    d->stop = 1;
    gs_session_unlock(&d->sess);
    if (rc < 0)
        gs_info("the server was not checked before the stop: %s", err.msg);
    return rc >= 0;
}

/* The daemon is stopping. Tells whoever asked it to what it leaves unsent, and each flush still
 * waiting that the server may lack its changes: a stop in the middle of a batch abandons it, and
 * the batch's paths are pending again. The next `watch`, or a `push`, checks and sends them. */
static void answer_at_exit(struct daemon *d)
{
    read_changes(d); /* every write made before the stop was asked is in the queue, as for flush */
    int checked_now = check_at_stop(d);
    size_t unsent = d->n_dirty + d->n_failed + d->n_held;
    /* e.g. stopped before it ever reached the server, or while it could not answer */
    int unchecked = d->full || !d->checked || !checked_now;
    char why[512];
    snprintf(why, sizeof(why),
             "the watch daemon stopped before the server had every change (%zu not sent%s); "
             "'gpusync push' sends them, as does the next 'gpusync watch'",
             unsent, unchecked ? ", and it could not check every file" : "");
    if (unsent) /* a foreground watch shows it on the terminal; -d in its log */
        gs_warn("stopping with %zu change%s not sent to the server%s: 'gpusync push' sends %s",
                unsent, unsent == 1 ? "" : "s", unchecked ? " (not every file checked)" : "",
                unsent == 1 ? "it" : "them");
    else if (unchecked)
        gs_warn("stopping without checking every file against the server: 'gpusync push' "
                "checks them");
    d->next_serve_ms = 0;
    serve_during_batch(d); /* what arrived meanwhile: read as it was in the batch, to answer it */
    for (int i = 0; i < d->n_clients; i++) {
        struct client *c = &d->clients[i];
        refuse_buffered_at_exit(c);
        if (c->stopping)
            reply(c, json_pack("{s:b,s:I,s:b}", "ok", 1, "unsent", (json_int_t)unsent, "unchecked",
                               unchecked));
        else if (c->flush_gen)
            reply(c, push_answer(d, c,
                                 json_pack("{s:b,s:o,s:b}", "ok", 0, "error", gs_json_text(why),
                                           "stopped", 1)));
    }
}

/* ---- start and stop ---- */

int gs_daemon_lock(const char *root, struct gs_error *err)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, root, GS_CONTROL_LOCK);
    int fd = gs_path_open_private(path.data, O_RDWR | O_CREAT);
    int rc = fd;
    if (fd < 0) {
        rc = gs_error_errno(err, GS_E_IO, "%s", path.data);
    } else if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        rc = gs_error_set(err, GS_E_CONFLICT,
                          "gpusync watch is already running for %s (pid %s); stop it with "
                          "'gpusync watch --stop'",
                          root, pid[0] ? pid : "?");
        close(fd);
    } else {
        char pid[32];
        int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
        if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)len, 0) != len)
            gs_warn("cannot record the daemon pid in %s", path.data);
    }
    gs_buf_release(&path);
    return rc;
}

static int open_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

static int setup(struct daemon *d, const struct gs_daemon_opts *o, struct gs_error *err)
{
    memset(d, 0, sizeof(*d));
    d->o = o;
    d->listen_fd = d->signal_fd = -1;
    d->root_fd = open(o->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    d->connect_done = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    gs_target_name(o->cfg->host, o->cfg->port, o->cfg->user, d->target, sizeof(d->target));
    d->backoff_ms = BACKOFF_FIRST_MS;
    d->last_latency_ms = -1;
    d->check_copy = gs_verify_copy_new();
    srand((unsigned)getpid());
    int rc = gs_session_open(&d->sess, o->root, o->cfg, err);
    if (rc == 0)
        rc = gs_conflicts_load(d->sess.idx, &d->conflicts, err);
    if (rc == 0)
        rc = gs_watch_open(&d->watch, o->root, d->sess.ig, err);
    char *remote_id = gs_session_remote_id(o->cfg);
    gs_rules_init(&d->rules, o->root, remote_id, o->cfg->excludes, o->cfg->n_excludes);
    free(remote_id);
    if (rc == 0 && (d->listen_fd = gs_control_listen(o->root, err)) < 0)
        rc = d->listen_fd;
    d->socket_ino = socket_file_ino(o->root);
    if (rc == 0 && d->connect_done < 0)
        rc = gs_error_errno(err, GS_E_IO, "eventfd");
    if (rc == 0 && (d->signal_fd = open_signals()) < 0)
        rc = gs_error_errno(err, GS_E_IO, "signalfd");
    if (rc == 0)
        rc = gs_relay_start(&d->relay, &o->ssh, err);
    const char *why;
    if (rc == 0 && gs_watch_polling(d->watch, &why))
        gs_warn("%s", why);
    return rc;
}

static void teardown(struct daemon *d)
{
    if (d->connecting) { /* it owns the session: it gives up within a wait, and ends */
        __atomic_store_n(&d->abandon_connect, 1, __ATOMIC_RELAXED);
        pthread_join(d->connector, NULL);
    }
    d->connecting = 0;
    save_conflicts(d); /* an acknowledgement in the last turn */
    if (d->connect_done >= 0)
        close(d->connect_done);
    while (d->n_clients)
        drop_client(d, d->n_clients - 1);
    if (d->listen_fd >= 0) {
        close(d->listen_fd);
        /* through the folder, wherever it is now: a folder made since at the old path is not ours
         */
        if (d->root_fd >= 0)
            unlinkat(d->root_fd, GS_CONTROL_SOCKET, 0);
    }
    if (d->root_fd >= 0)
        close(d->root_fd);
    if (d->signal_fd >= 0)
        close(d->signal_fd);
    gs_relay_stop(d->relay);
    gs_watch_free(d->watch);
    gs_verify_copy_free(d->check_copy);
    gs_rules_release(&d->rules);
    gs_linked_release(&d->linked);
    gs_session_close(&d->sess);
    gs_ssh_free(d->ssh);
    free_paths(d->dirty, d->n_dirty);
    free_paths(d->failed, d->n_failed);
    free_paths(d->held, d->n_held);
    json_decref(d->conflicts);
    if (d->o->status_out) {
        fputs("\n", d->o->status_out);
        fflush(d->o->status_out);
    }
}

int gs_daemon_run(const struct gs_daemon_opts *o, struct gs_error *err)
{
    struct daemon d;
    int rc = setup(&d, o, err);
    if (rc == 0) {
        if (o->ready_fd >= 0) {
            if (write(o->ready_fd, "R", 1) != 1)
                gs_warn("cannot signal readiness");
            close(o->ready_fd);
        }
        connect_when_free(&d);
        loop(&d);
        answer_at_exit(&d);
    }
    teardown(&d);
    return rc;
}
