/* syncd/session.c: opening and closing what a sync needs (see session.h). */
#include "syncd/session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "remote/agent_install.h"
#include "remote/delta.h"
#include "remote/exec.h"
#include "remote/sftp_ops.h"
#include "syncd/reconcile.h"
#include "syncd/resident.h"

char *gs_session_remote_id(const struct gs_config *cfg)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_addf(&b, "%s@%s:%d:%s", cfg->user ? cfg->user : "", cfg->host,
                cfg->port ? cfg->port : 22, cfg->remote_path ? cfg->remote_path : "");
    return gs_buf_detach(&b, NULL);
}

int gs_session_open_index(struct gs_session *s, const char *root, const struct gs_config *cfg,
                          struct gs_error *err)
{
    memset(s, 0, sizeof(*s));
    s->root = gs_xstrdup(root);
    s->cfg = cfg;
    struct gs_buf db = GS_BUF_INIT;
    gs_path_join(&db, root, GS_INDEX_FILE);
    char *remote_id = gs_session_remote_id(cfg);
    int rc = gs_path_state_dir(root, err);
    if (rc == 0)
        rc = gs_index_open(&s->idx, db.data, remote_id, err);
    free(remote_id);
    gs_buf_release(&db);
    if (rc < 0)
        gs_session_close(s);
    return rc;
}

int gs_session_open_ignore(struct gs_session *s, struct gs_error *err)
{
    return s->ig ? 0
                 : gs_ignore_open(&s->ig, s->root, (const char *const *)s->cfg->excludes,
                                  s->cfg->n_excludes, err);
}

int gs_session_open(struct gs_session *s, const char *root, const struct gs_config *cfg,
                    struct gs_error *err)
{
    int rc = gs_session_open_index(s, root, cfg, err);
    if (rc == 0 && (rc = gs_session_open_ignore(s, err)) < 0)
        gs_session_close(s);
    return rc;
}

static int open_sftp(struct gs_session *s, struct gs_ssh *ssh, const char *remote_path,
                     const char *why, struct gs_error *err)
{
    const char *path = remote_path && *remote_path ? remote_path : ".";
    if (path[0] == '~' && path[1] == '/')
        path += 2;
    int rc = gs_sftp_ops_open(&s->ops, ssh, path, err);
    if (rc == 0)
        snprintf(s->transport, sizeof(s->transport), "sftp (%s)", why);
    return rc;
}

/* Notes a path an early request wrote to the index (gs_index_on_write, while s->early). */
static void note_early_write(void *ctx, const char *path, int subtree)
{
    struct gs_session *s = ctx;
    if (subtree) /* a folder's removal drops what lay below it: nothing to keep there */
        return;
    GS_ALLOC_GROW(s->early_written, s->n_early_written + 1, s->cap_early_written);
    s->early_written[s->n_early_written++] = gs_xstrdup(path);
}

static void forget_early_writes(struct gs_session *s)
{
    for (size_t i = 0; i < s->n_early_written; i++)
        free(s->early_written[i]);
    free(s->early_written);
    s->early_written = NULL;
    s->n_early_written = s->cap_early_written = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries clear_but_early drops: those no early request wrote. */
struct dropping {
    const struct gs_session *s; /* its early_written sorted */
    char **v;
    size_t n, cap;
};

static int collect_unless_early(const struct gs_index_entry *e, void *ctx)
{
    struct dropping *d = ctx;
    char *path = e->path;
    if (bsearch(&path, d->s->early_written, d->s->n_early_written, sizeof(char *), cmp_str))
        return 0;
    GS_ALLOC_GROW(d->v, d->n + 1, d->cap);
    d->v[d->n++] = gs_xstrdup(e->path);
    return 0;
}

/* After a reset found while early requests went out: those requests went to this server, and the
 * entries they wrote are true of it (a new file sent early stays sent, rather than crossing the
 * link twice, and on a disk with room for one copy failing as "no space"); every other entry is
 * dropped, as gs_index_clear drops all. */
static int clear_but_early(struct gs_session *s, struct gs_error *err)
{
    size_t intents = 0;
    if (!s->n_early_written || gs_index_intent_count(s->idx, &intents, err) < 0 || intents)
        return gs_index_clear(s->idx, err);
    qsort(s->early_written, s->n_early_written, sizeof(char *), cmp_str);
    struct dropping drop = {.s = s};
    int rc = gs_index_foreach(s->idx, "", collect_unless_early, &drop, err);
    for (size_t i = 0; i < drop.n; i++) {
        if (rc == 0)
            rc = gs_index_delete(s->idx, drop.v[i], err);
        free(drop.v[i]);
    }
    free(drop.v);
    return rc;
}

/* Compares the server's sync id (which the agent's handshake brought, creating one on a first
 * sync) with the one the index recorded; see session.h. */
static int verify_server(struct gs_session *s, struct gs_error *err)
{
    const char *remote = gs_agent_sync_id(s->agent);
    char *local = NULL;
    size_t entries = 0;
    int rc = gs_index_get_meta(s->idx, "server_token", &local, err);
    if (rc == 0)
        rc = gs_index_count(s->idx, &entries, err);
    int same = local && remote[0] && strcmp(local, remote) == 0;
    if (s->early) /* what the requests that went out early added is true; the rest may not be */
        entries = s->early_entries;
    if (rc == 0 && !same && local && entries) {
        if (!s->reset_quiet)
            gs_warn("the server no longer holds the tree gpusync last synced there (wiped or "
                    "recreated?): sending everything again");
        rc = s->early ? clear_but_early(s, err) : gs_index_clear(s->idx, err);
        s->index_reset = 1;
    }
    if (rc == 0 && !same && remote[0])
        rc = gs_index_set_meta(s->idx, "server_token", remote, err);
    free(local);
    return rc;
}

/* The link's rate (wire bytes a second) the last session measured, or 0 when none did. */
static double remembered_rate(const struct gs_session *s)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, s->root, GS_SESSION_LINK);
    FILE *fp = fopen(path.data, "r");
    double rate = 0;
    if (fp && fscanf(fp, "wire_bytes_per_second %lf", &rate) != 1)
        rate = 0;
    if (fp)
        fclose(fp);
    gs_buf_release(&path);
    return rate > 0 ? rate : 0;
}

/* Keeps what this session measured of the link for the next one (nothing if it measured
 * nothing: a small sync cannot tell). Best effort: without it, the next session starts at level
 * 1 and measures again. */
static void remember_rate(const struct gs_session *s)
{
    double rate = s->agent ? gs_agent_link_rate(s->agent) : 0;
    if (rate <= 0 || !s->root)
        return;
    struct gs_buf path = GS_BUF_INIT, text = GS_BUF_INIT;
    gs_path_join(&path, s->root, GS_SESSION_LINK);
    gs_buf_addf(&text, "wire_bytes_per_second %.0f\n", rate);
    (void)gs_path_write_atomic(path.data, text.data, text.len);
    gs_buf_release(&path);
    gs_buf_release(&text);
}

/* The zstd level the session offers the agent ([sync] compress; proto/zframes.h). auto: level 1
 * (about 400 MB/s a core) on a fast link, where level 9 (about 55 MB/s) would slow the push, and
 * GS_AGENT_SLOW_LEVEL on a slow one (remote/agent_client.h has the figures). Which it is: what the
 * last session measured, else the SSH handshake's length (about three round trips): a long one is a
 * wide-area link, which is seldom fast; a short one starts at level 1, raised by the agent client
 * once its answers show a slow link. zstd: 9 always. off: 0. */
/* 3 round trips of about 17 ms; measured 11-19 ms on loopback, 96 ms at 30 ms RTT. */
#define WAN_HANDSHAKE_MS 60

static int compress_level(const struct gs_session *s, const struct gs_ssh *ssh)
{
    const struct gs_config *cfg = s->cfg;
    if (cfg->compress == GS_COMPRESS_OFF)
        return 0;
    if (cfg->compress == GS_COMPRESS_ZSTD)
        return GS_AGENT_SLOW_LEVEL;
    double rate = remembered_rate(s);
    if (rate > 0)
        return rate < GS_AGENT_SLOW_LINK_BPS ? GS_AGENT_SLOW_LEVEL : 1;
    int64_t ms = gs_ssh_handshake_ms(ssh);
    gs_debug("no link rate known yet; the SSH handshake took %lld ms", (long long)ms);
    return ms >= WAN_HANDSHAKE_MS ? GS_AGENT_SLOW_LEVEL : 1;
}

/* What the agent is told to keep beside the index: the signatures of large files (deltas,
 * remote/delta.h) and the paths its last check of the server kept (remote/check_set.h). */
static void keep_beside_index(struct gs_session *s)
{
    struct gs_buf dir = GS_BUF_INIT, checked = GS_BUF_INIT;
    gs_buf_addf(&dir, "%s/%s", s->root, GS_SESSION_SIGS);
    gs_delta_sweep_pending(dir.data); /* an earlier session's, which ended before its answers */
    gs_agent_set_delta_dir(s->agent, dir.data);
    gs_buf_addf(&checked, "%s/%s", s->root, GS_SESSION_CHECKED);
    gs_agent_set_check_file(s->agent, checked.data);
    gs_buf_release(&dir);
    gs_buf_release(&checked);
}

/* Starting `serve` through the login shell with `command`, asking for a resident listener when
 * the session wants one. */
static struct gs_agent_how agent_how(const struct gs_session *s, struct gs_ssh *ssh,
                                     const char *command)
{
    return (struct gs_agent_how){.command = command,
                                 .compress_level = compress_level(s, ssh),
                                 .want_resident = s->resident_wanted};
}

/* Starts whichever agent build is cached on the server through the login shell, without waiting
 * for its answer. */
static int start_through_shell(struct gs_session *s, struct gs_ssh *ssh, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT;
    gs_agent_cached_serve_command(s->remote_dir, &cmd);
    struct gs_agent_how how = agent_how(s, ssh, cmd.data);
    int rc = gs_agent_start(&s->agent, ssh, &how, err);
    gs_buf_release(&cmd);
    if (rc == 0)
        keep_beside_index(s);
    return rc;
}

/* Starts `serve` through the resident listener r names, without waiting for its answer. */
static int start_resident(struct gs_session *s, struct gs_ssh *ssh, const struct gs_resident *r,
                          struct gs_error *err)
{
    struct gs_agent_how how = agent_how(s, ssh, NULL);
    how.socket = r->socket;
    how.root = r->root;
    int rc = gs_agent_start(&s->agent, ssh, &how, err);
    if (rc == 0)
        keep_beside_index(s);
    return rc;
}

/* Starts the agent, without waiting for its answer: through the resident listener the project
 * remembers for this server, agent build and directory, else (or when the server refuses that
 * channel) through the login shell. */
static int start_cached(struct gs_session *s, struct gs_ssh *ssh, struct gs_error *err)
{
    gs_resident_key(gs_ssh_target(ssh), s->remote_dir, s->resident_key);
    struct gs_resident r;
    int known = s->cfg->no_resident ? -1 : gs_resident_recall(s->root, s->resident_key, &r);
    s->resident_wanted = !s->cfg->no_resident && known != 1;
    s->resident_refused = 0;
    if (known == 0) {
        int rc = start_resident(s, ssh, &r, err);
        if (rc != GS_E_REMOTE)
            return rc;
        /* Nothing listens there (any more), or the server forbids such channels: the agent's
         * answer tells which (note_resident). */
        gs_debug("no resident agent (%s); starting it through the shell", err->msg);
        s->resident_refused = 1;
        gs_error_clear(err);
    }
    return start_through_shell(s, ssh, err);
}

/* The resident agent failed before its handshake's answer (its listener could not start `serve`,
 * or `serve` refused): nothing it was sent was carried out. Starts the agent through the shell
 * instead and waits for its answer. */
static int restart_through_shell(struct gs_session *s, struct gs_error *err)
{
    gs_debug("the resident agent failed (%s); starting it through the shell", err->msg);
    gs_resident_forget(s->root);
    gs_agent_close(s->agent);
    s->agent = NULL;
    gs_verify_abandon(s->checking); /* it went with the requests; ready checks by itself */
    s->checking = NULL;
    s->early_lost = s->early; /* the requests sent early went to a session that never began */
    gs_error_clear(err);
    int rc = start_through_shell(s, s->ssh, err);
    return rc ? rc : gs_agent_wait_ready(s->agent, err);
}

/* Remembers the listener the agent named for the next session (or forgets one it no longer
 * names), and says which way this one came. */
static void note_resident(struct gs_session *s, const char *how)
{
    const char *socket = gs_agent_resident(s->agent);
    /* A session whose channel was refused asks once more when the agent says the listener ran
     * all along: two refusals of a running listener are the server's rules, not a listener that
     * was starting or being replaced. */
    struct gs_error probe = {0};
    int refused = s->resident_refused && gs_agent_resident_ran(s->agent) &&
                  gs_exec_socket_opens(s->ssh, socket, &probe) == 0;
    if (gs_agent_is_resident(s->agent))
        how = "resident";
    else if (refused)
        gs_resident_refused(s->root, s->resident_key);
    else if (socket[0])
        gs_resident_remember(s->root, s->resident_key, socket, gs_agent_root(s->agent));
    else if (s->resident_wanted)
        gs_resident_forget(s->root);
    snprintf(s->transport, sizeof(s->transport), "agent (%s)", how);
}

/* Installs the agent (the cached one was missing or stale) and starts it, waiting for its answer.
 * Falls back to SFTP when no agent can run there. */
static int install_and_open(struct gs_session *s, struct gs_ssh *ssh, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, agent = GS_BUF_INIT;
    const char *how = "";
    int rc = gs_agent_install(ssh, &agent, &how, err);
    if (rc == GS_E_NOTFOUND) {
        char why[GS_ERROR_MSG_MAX + 32];
        snprintf(why, sizeof(why), "fallback: %s", err ? err->msg : "no agent");
        gs_warn("%s; using SFTP (no atomic replace)", err ? err->msg : "no agent");
        gs_error_clear(err);
        rc = open_sftp(s, ssh, s->remote_path, why, err);
    } else if (rc == 0) {
        gs_agent_serve_command(agent.data, s->remote_dir, &cmd);
        struct gs_agent_how exec = agent_how(s, ssh, cmd.data);
        rc = gs_agent_start(&s->agent, ssh, &exec, err);
        if (rc == 0)
            keep_beside_index(s);
        if (rc == 0)
            rc = gs_agent_wait_ready(s->agent, err);
        if (rc == 0)
            rc = verify_server(s, err);
        if (rc == 0) {
            s->ops = gs_agent_fileops(s->agent);
            note_resident(s, how);
        }
    }
    gs_buf_release(&cmd);
    gs_buf_release(&agent);
    return rc;
}

/* Settles what an interrupted sync left uncertain (reconcile.h), once the transport is ready and
 * before anything is sent, then checks the server against the index (verify.h): s->reconciled
 * and s->verified say what changed, so that a caller who planned meanwhile plans again. */
static int settle_intents(struct gs_session *s, struct gs_error *err)
{
    s->reconciled = 0;
    int rc = gs_reconcile(s->idx, s->ops, &s->reconciled, err);
    if (rc == 0 && s->reconciled)
        gs_info("checked %zu operation%s an interrupted sync left in flight", s->reconciled,
                s->reconciled == 1 ? "" : "s");
    if (rc == 0 && !s->no_server_check) {
        struct gs_verify *early = s->checking;
        s->checking = NULL;
        rc = early ? gs_verify_finish(early, s->ops, NULL, &s->verified, err)
                   : gs_verify_server(s->idx, s->ops, NULL, &s->verified, err);
    }
    s->settled = rc == 0;
    return rc;
}

int gs_session_replan(const struct gs_session *s)
{
    return s->index_reset || s->reconciled || s->verified.gone || s->verified.changed;
}

void gs_session_check_early(struct gs_session *s)
{
    gs_verify_abandon(s->checking);
    s->checking = NULL;
    if (!s->no_server_check && gs_verify_prepare(s->idx, NULL, &s->checking, NULL) < 0)
        s->checking = NULL; /* ready checks by itself */
}

/* Sends the check gs_session_check_early prepared as soon as the agent's channel is open: its
 * answer comes while the plan is made and the first requests go. */
static void send_early_check(struct gs_session *s)
{
    if (s->checking && s->agent &&
        gs_verify_send(s->checking, gs_agent_fileops(s->agent), NULL) < 0) {
        gs_verify_abandon(s->checking); /* the link failed: ready says so */
        s->checking = NULL;
    }
}

int gs_session_start(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                     const char *remote_path, struct gs_error *err)
{
    free(s->remote_dir);
    free(s->remote_path);
    s->remote_dir = gs_xstrdup(remote_dir);
    s->remote_path = gs_xstrdup(remote_path && *remote_path ? remote_path : ".");
    s->ssh = ssh;
    s->settled = 0;
    if (s->cfg->transport == GS_TRANSPORT_SFTP)
        return open_sftp(s, ssh, s->remote_path, "[sync] transport = sftp", err);
    int rc = start_cached(s, ssh, err);
    if (rc == 0)
        send_early_check(s);
    return rc;
}

int gs_session_go_early(struct gs_session *s)
{
    size_t entries = 0, intents = 1;
    if (s->ops || !s->agent || gs_index_count(s->idx, &entries, NULL) < 0 ||
        gs_index_intent_count(s->idx, &intents, NULL) < 0 || intents)
        return 0;
    s->early = 1;
    s->early_entries = entries;
    forget_early_writes(s);
    gs_index_on_write(s->idx, note_early_write, s);
    s->ops = gs_agent_fileops(s->agent);
    return 1;
}

int gs_session_ready(struct gs_session *s, struct gs_error *err)
{
    if (s->ops && !s->early) /* SFTP, opened by start */
        return s->settled ? 0 : settle_intents(s, err);
    if (!s->agent)
        return gs_error_set(err, GS_E_ERR, "gs_session_ready before gs_session_start");
    int rc = gs_agent_wait_ready(s->agent, err);
    if (rc < 0 && rc != GS_E_DISCONNECTED && gs_agent_is_resident(s->agent))
        rc = restart_through_shell(s, err);
    if (s->early) /* every early request was answered (wait_ready) or lost with the agent */
        gs_index_on_write(s->idx, NULL, NULL);
    if (rc == 0)
        rc = verify_server(s, err);
    forget_early_writes(s);
    int early = s->early;
    s->early = 0;
    if (rc == 0) {
        s->ops = gs_agent_fileops(s->agent);
        note_resident(s, "cached");
        return settle_intents(s, err);
    }
    s->ops = NULL;
    if (!err || !strstr(err->msg, GS_AGENT_MISSING))
        return rc;
    gs_agent_close(s->agent);
    s->agent = NULL;
    gs_verify_abandon(s->checking); /* it went with them */
    s->checking = NULL;
    s->early_lost = early; /* the requests sent early went to a shell that found no agent */
    gs_error_clear(err);
    rc = install_and_open(s, s->ssh, err);
    return rc ? rc : settle_intents(s, err);
}

int gs_session_connect(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                       const char *remote_path, struct gs_error *err)
{
    int rc = gs_session_start(s, ssh, remote_dir, remote_path, err);
    return rc ? rc : gs_session_ready(s, err);
}

int gs_session_lock(struct gs_session *s, int wait, struct gs_error *err)
{
    if (s->locked)
        return 0;
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, s->root, GS_SESSION_LOCK);
    int rc = 0, fd = gs_path_open_private(path.data, O_RDWR | O_CREAT);
    if (fd < 0)
        rc = gs_error_errno(err, GS_E_IO, "cannot open %s (check the permissions of .gpusync)",
                            path.data);
    while (rc == 0 && flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) < 0) {
        if (errno == EWOULDBLOCK && !wait)
            rc = 1;
        else if (errno != EINTR)
            rc = gs_error_errno(err, GS_E_IO, "cannot lock %s", path.data);
    }
    if (rc == 0) {
        s->lock_fd = fd;
        s->locked = 1;
    } else if (fd >= 0) {
        close(fd);
    }
    gs_buf_release(&path);
    return rc;
}

void gs_session_unlock(struct gs_session *s)
{
    if (!s->locked)
        return;
    close(s->lock_fd); /* drops the flock */
    s->locked = 0;
    s->lock_fd = -1;
}

void gs_session_disconnect(struct gs_session *s)
{
    remember_rate(s);
    gs_verify_abandon(s->checking);
    s->checking = NULL;
    if (s->ops)
        s->ops->close(s->ops); /* for the agent transport this frees the agent too */
    else if (s->agent)
        gs_agent_close(s->agent);
    s->ops = NULL;
    s->agent = NULL;
}

void gs_session_close(struct gs_session *s)
{
    gs_session_disconnect(s);
    gs_session_unlock(s); /* after the agent's channel is gone */
    gs_index_close(s->idx);
    forget_early_writes(s);
    gs_ignore_free(s->ig);
    free(s->root);
    free(s->remote_dir);
    free(s->remote_path);
    memset(s, 0, sizeof(*s));
}
