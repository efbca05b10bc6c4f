/* agent/sync_id.h: the token that names the tree a client synced into this root. */
#ifndef GA_SYNC_ID_H
#define GA_SYNC_ID_H

#include "proto/sync.h" /* GS_SYNC_ID_MAX: the longest token kept, without its newline */

#define GA_SYNC_ID_PATH ".gpusync/sync-id" /* relative to the root */

/* Reads the root's sync id into `out`, first creating a random one (32 hex digits) if there is
 * none, so that the client learns it with the handshake instead of a round trip of its own. Two
 * agents racing both end with the one that was linked first. Returns 0 or a negative errno (a
 * symlink in the way is -ELOOP; nothing outside the root is touched). */
int ga_sync_id_get(int rootfd, char out[GS_SYNC_ID_MAX + 1]);

#endif
