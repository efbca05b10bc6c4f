/* syncd/resident.h: what a project remembers of the server's resident listener (proto/sync.h,
 * RESIDENT LISTENER): its socket and the root it serves, so that the next session reaches `serve`
 * without the server's login shell. Kept in .gpusync/resident under a key made of the target and
 * of the command that would start the agent (which names the agent's build and the remote
 * directory): another server, another gpusync or another directory never uses it. */
#ifndef GS_SYNCD_RESIDENT_H
#define GS_SYNCD_RESIDENT_H

#include "remote/agent_client.h"

#define GS_RESIDENT_FILE ".gpusync/resident" /* relative to the project root */
#define GS_RESIDENT_KEY  33                  /* 32 hex digits and a NUL */

struct gs_resident {
    char socket[GS_AGENT_RESIDENT_MAX];
    char root[4097]; /* the agent's longest root (GS_PROTO_MAX_PATH) and a NUL */
};

/* The key for a session to `target` serving `remote_dir` (a quoted shell word), made from the
 * command that would start the cached agent there (gs_agent_cached_serve_command). */
void gs_resident_key(const char *target, const char *remote_dir, char key[GS_RESIDENT_KEY]);

/* How long a server's refusal of the channel to its listener (AllowStreamLocalForwarding no)
 * keeps sessions from asking for one again: each try costs a round trip. */
#define GS_RESIDENT_RETRY_S (24 * 3600)

/* Fills r from the project's memory if it holds `key`. Returns 0; 1 when the server refused the
 * channel to the listener less than GS_RESIDENT_RETRY_S ago (r says nothing then); -1 when it
 * holds nothing for that key (or nothing readable). */
int gs_resident_recall(const char *project, const char *key, struct gs_resident *r);

/* Remembers socket and root under key, replacing what was there. Best effort: without it the next
 * session starts the agent through the shell, as before. */
void gs_resident_remember(const char *project, const char *key, const char *socket,
                          const char *root);

/* Forgets it: the listener is gone or failed; the next session asks the agent again. */
void gs_resident_forget(const char *project);

/* Remembers that the server refused the channel to the listener for key (gs_resident_recall). */
void gs_resident_refused(const char *project, const char *key);

#endif
