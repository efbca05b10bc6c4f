/* remote/agent_install.h: putting gpusync-agent on a server (design decision 3).
 *
 * The agent is kept as ~/.gpusync/bin/gpusync-agent-<key>, where the key is a hash of the local
 * agent binary (or of its sources), and reused while it matches. An x86-64 Linux server gets the
 * static build through an exec channel (cat > tmp && chmod && mv: no SFTP needed); another
 * architecture gets the sources and builds them with cc; a server with neither gets no agent,
 * and the caller falls back to SFTP. */
#ifndef GS_AGENT_INSTALL_H
#define GS_AGENT_INSTALL_H

#include "common/buf.h"
#include "common/error.h"
#include "remote/ssh.h"

/* Makes sure the agent is on the server and appends its path there to `agent` (a shell word:
 * "~/.gpusync/bin/gpusync-agent-KEY", for the remote shell to expand). Sets *how to "cached",
 * "uploaded" or "built" (static strings). Returns 0; GS_E_NOTFOUND when no agent can run there
 * (the message says why: the caller should use SFTP); other codes for connection failures. */
int gs_agent_install(struct gs_ssh *ssh, struct gs_buf *agent, const char **how,
                     struct gs_error *err);

/* Appends a remote command that runs `body` with whichever agent build is cached on the server
 * (the static build's key or the source build's) as GS_AGENT_CACHED, without a separate probe: one
 * exec instead of two. When none is cached it prints GS_AGENT_MISSING on stderr and exits 127;
 * then install. */
void gs_agent_cached_command(const char *body, struct gs_buf *command);
#define GS_AGENT_CACHED  "\"$a\""
#define GS_AGENT_MISSING "gpusync-agent-missing"

/* 1 when a command's stderr says that no agent build was cached (gs_agent_cached_command). */
int gs_agent_reported_missing(const struct gs_buf *errout);

/* gs_agent_cached_command for an agent serving `remote_dir`. */
void gs_agent_cached_serve_command(const char *remote_dir, struct gs_buf *command);

/* Appends the remote command that runs `agent` serving `remote_dir` (a quoted shell word), made
 * first with mkdir -p. When it cannot be made (a file in its place, no permission) the command
 * prints mkdir's reason and then GS_AGENT_ROOT_UNUSABLE on stderr, and exits 3. */
#define GS_AGENT_ROOT_UNUSABLE "gpusync-root-unusable"
void gs_agent_serve_command(const char *agent, const char *remote_dir, struct gs_buf *command);

/* The local agent binary that would be uploaded, or NULL when none is found. Looks at
 * $GPUSYNC_AGENT, then beside the gpusync executable (build tree and installed layouts). */
const char *gs_agent_local_binary(void);

#endif
