/* syncd/reconcile.h: settling what an interrupted sync left uncertain.
 *
 * The executor records an intent (index.h) for every request before it leaves, and drops it when
 * the reply is recorded. A process that was killed, or a link that died, leaves intents whose
 * requests may or may not have reached the server. Reconciling asks the server what it holds at
 * each such path (one pipelined round trip through the agent) and records an operation as done
 * exactly when the server holds what it would have written: a put's content hash, a symlink's
 * target, a directory, a chmod's mode, a delete's absence, a rename's destination with its source
 * gone. Anything else leaves the index as it was, which is always safe: the index then still
 * names what gpusync wrote before, so a later plan expects that, and a server copy that differs
 * is kept as a conflict copy rather than overwritten.
 *
 * It runs before anything is planned, in every process that writes to the server (push, the watch
 * daemon at each connection), so that a file an interrupted push placed is known, and deleted or
 * renamed when the local tree says so. */
#ifndef GS_SYNCD_RECONCILE_H
#define GS_SYNCD_RECONCILE_H

#include <stddef.h>

#include "common/error.h"
#include "remote/fileops.h"
#include "syncd/index.h"

/* Settles every intent in `idx` by probing the server through `ops`. On success returns 0, the
 * index records each operation that completed and holds no intent, and *settled (may be NULL)
 * is the number of intents there were. On a transport or index error returns it and leaves the
 * index as it was (the intents stay for the next try). */
int gs_reconcile(struct gs_index *idx, struct gs_fileops *ops, size_t *settled,
                 struct gs_error *err);

#endif
