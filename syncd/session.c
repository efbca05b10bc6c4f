/* syncd/session.c: opening and closing what a sync needs (see session.h). */
#include "syncd/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/path.h"
#include "remote/agent_install.h"
#include "remote/sftp_ops.h"

char *gs_session_remote_id(const struct gs_config *cfg)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_addf(&b, "%s@%s:%d:%s", cfg->user ? cfg->user : "", cfg->host,
                cfg->port ? cfg->port : 22, cfg->remote_path ? cfg->remote_path : "");
    return gs_buf_detach(&b, NULL);
}

int gs_session_open(struct gs_session *s, const char *root, const struct gs_config *cfg,
                    struct gs_error *err)
{
    memset(s, 0, sizeof(*s));
    s->root = strdup(root);
    s->cfg = cfg;
    struct gs_buf dir = GS_BUF_INIT, db = GS_BUF_INIT;
    gs_path_join(&dir, root, GS_DIR);
    gs_path_join(&db, root, GS_INDEX_FILE);
    char *remote_id = gs_session_remote_id(cfg);
    int rc = gs_path_mkdir_p(dir.data, 0755, err);
    if (rc == 0)
        rc = gs_ignore_open(&s->ig, root, (const char *const *)cfg->excludes, cfg->n_excludes, err);
    if (rc == 0)
        rc = gs_index_open(&s->idx, db.data, remote_id, err);
    free(remote_id);
    gs_buf_release(&dir);
    gs_buf_release(&db);
    if (rc < 0)
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

/* Starts an agent that is already on the server in one exec. Returns 0, 1 when none is cached
 * there (install it), or a connection error. */
static int open_cached_agent(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                             struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT;
    gs_agent_cached_serve_command(remote_dir, &cmd);
    int rc = gs_agent_open(&s->agent, ssh, cmd.data, err);
    gs_buf_release(&cmd);
    if (rc == 0) {
        s->ops = gs_agent_fileops(s->agent);
        snprintf(s->transport, sizeof(s->transport), "agent (cached)");
        return 0;
    }
    if (err && strstr(err->msg, GS_AGENT_MISSING)) {
        gs_error_clear(err);
        return 1;
    }
    return rc;
}

int gs_session_connect(struct gs_session *s, struct gs_ssh *ssh, const char *remote_dir,
                       const char *remote_path, struct gs_error *err)
{
    if (s->cfg->transport == GS_TRANSPORT_SFTP)
        return open_sftp(s, ssh, remote_path, "[sync] transport = sftp", err);
    int cached = open_cached_agent(s, ssh, remote_dir, err);
    if (cached <= 0)
        return cached;
    struct gs_buf cmd = GS_BUF_INIT, agent = GS_BUF_INIT;
    const char *how = "";
    int rc = gs_agent_install(ssh, &agent, &how, err);
    if (rc == GS_E_NOTFOUND) {
        char why[GS_ERROR_MSG_MAX + 32];
        snprintf(why, sizeof(why), "fallback: %s", err ? err->msg : "no agent");
        gs_warn("%s; using SFTP (no atomic replace)", err ? err->msg : "no agent");
        gs_buf_release(&cmd);
        gs_buf_release(&agent);
        gs_error_clear(err);
        return open_sftp(s, ssh, remote_path, why, err);
    }
    if (rc == 0) {
        gs_agent_serve_command(agent.data, remote_dir, &cmd);
        rc = gs_agent_open(&s->agent, ssh, cmd.data, err);
    }
    if (rc == 0) {
        s->ops = gs_agent_fileops(s->agent);
        snprintf(s->transport, sizeof(s->transport), "agent (%s)", how);
    }
    gs_buf_release(&cmd);
    gs_buf_release(&agent);
    return rc;
}

void gs_session_disconnect(struct gs_session *s)
{
    if (s->ops)
        s->ops->close(s->ops);
    s->ops = NULL;
    s->agent = NULL;
}

void gs_session_close(struct gs_session *s)
{
    gs_session_disconnect(s);
    gs_index_close(s->idx);
    gs_ignore_free(s->ig);
    free(s->root);
    memset(s, 0, sizeof(*s));
}
