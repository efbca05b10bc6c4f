/* syncd/conflicts.h: the conflict copies the watch daemon made the server keep (the server had
 * changed a file since gpusync wrote it; its version was renamed NAME.gpusync-conflict-...), kept
 * in the index until the user acknowledges them, so that `status` and `flush` list them after the
 * daemon restarted and `status` lists them without a daemon.
 *
 * The list is a JSON array of {"path": S, "kept": S}, oldest first, stored with the index's
 * server identity: an index opened for another server has none. */
#ifndef GS_SYNCD_CONFLICTS_H
#define GS_SYNCD_CONFLICTS_H

#include <jansson.h>

#include "common/error.h"
#include "syncd/index.h"

/* At most this many are kept; older ones drop off the list (the daemon's log still has them). */
#define GS_CONFLICTS_MAX 100

/* Reads the list recorded in `idx`. Returns 0 with *out (a new reference; an empty array when
 * none is recorded, or when what is recorded is not a list of this server), or GS_E_IO with
 * *out NULL. */
int gs_conflicts_load(struct gs_index *idx, json_t **out, struct gs_error *err);

/* Records `list` (borrowed) in `idx`, replacing what was there. Returns 0 or GS_E_IO / GS_E_NOMEM
 * (the old list is kept then). */
int gs_conflicts_save(struct gs_index *idx, json_t *list, struct gs_error *err);

/* Appends {path, kept} to `list`, dropping the oldest entries beyond GS_CONFLICTS_MAX. */
void gs_conflicts_add(json_t *list, const char *path, const char *kept);

#endif
