/* syncd/verify.h: checking that the server still holds what the index says gpusync wrote.
 *
 * The index records what gpusync put on the server, and a plan trusts it: a file whose local copy
 * did not change is not looked at again. But the server is not only gpusync's: a file deleted or
 * edited there (by hand, by a job, by `rm -rf` of a folder) would leave the index, and every
 * "up to date" after it, wrong until the local copy changed. So at each connection, once the
 * intents are settled, every indexed path is compared with what the server holds (`check`,
 * remote/fileops.h: the agent stats them, reads no file, and answers with the ones that differ;
 * a connection's later checks send only what changed in the index since) as rsync's quick check
 * does, by kind, size and mtime (to the second, as file systems keep it), plus mode and a
 * symlink's target:
 *
 * - gone from the server: the entry (and what lies below it) leaves the index, so the next plan
 *   sends the file whole, as new;
 * - another kind, size or mtime, or another symlink target: the entry becomes a file of unknown
 *   content, so the next plan sends the local copy expecting content that cannot match, and the
 *   agent keeps what the server held as a conflict copy (nothing is lost);
 * - only the mode: the entry takes the server's mode, so the plan sets the local one again.
 *
 * An edit on the server that keeps both the size and the mtime to the second is not seen (nor is
 * it by rsync without --checksum). Paths the server would not let the agent examine are left as
 * they are. A file `pull` wrote here and that was not edited here since (index.h, `pulled`) is
 * not compared: gpusync did not write the server's copy, whose writer (a job) may replace it. */
#ifndef GS_SYNCD_VERIFY_H
#define GS_SYNCD_VERIFY_H

#include <stddef.h>

#include "common/error.h"
#include "remote/fileops.h"
#include "syncd/index.h"

struct gs_verify_result {
    size_t checked; /* index entries compared with the server */
    size_t gone;    /* missing on the server: to be sent again */
    size_t changed; /* changed there (content, kind or mode): to be set right again */
    size_t moved;   /* gone or changed there, but rewritten in the index while the check ran:
                       by a sync of the path, which made it true, or by a rename of it or of a
                       folder above it, which carried what the server lacks to another path: a
                       caller about to say "up to date" checks again first */
};

/* Told each path the check corrected (gone or changed there), once the index is written: a
 * caller that syncs part of the tree sends those paths. */
struct gs_verify_found {
    void (*fn)(void *ctx, const char *path);
    void *ctx;
};

/* Compares every index entry with what the server holds, through the transport's check, and
 * corrects the index as above, in one transaction, then tells `found` (may be NULL) the
 * corrected paths. Does nothing (returns 0, `out` zeroed) when the transport has no check.
 * Returns 0, or a transport or index error (the index is then as it was). */
int gs_verify_server(struct gs_index *idx, struct gs_fileops *ops,
                     const struct gs_verify_found *found, struct gs_verify_result *out,
                     struct gs_error *err);

/* A copy of the index's entries for a caller that checks one index again and again (the watch
 * daemon, at every flush): gs_verify_prepare with it reads only the paths written since the last
 * time (gs_index_on_write tells it, through the index it was last given) instead of every entry,
 * or everything when another connection wrote or too much changed. gs_verify_copy_reset forgets
 * it all (before that index is closed); gs_verify_copy_free too, then frees it. A gs_verify
 * prepared from a copy uses it until finished or abandoned. */
struct gs_verify_copy;
struct gs_verify_copy *gs_verify_copy_new(void);
void gs_verify_copy_reset(struct gs_verify_copy *c);
void gs_verify_copy_free(struct gs_verify_copy *c);

/* The same in steps, so that a sync goes on while the server answers. gs_verify_prepare takes the
 * index's entries as they are now (`copy` may be NULL; *out NULL on error); gs_verify_send asks the
 * server about them (nothing when the transport has no check, or nothing was written there), and
 * what is submitted after it goes on meanwhile; gs_verify_finish sends it to `ops` if that was not
 * done, waits for the answer and corrects only the entries the index still holds as they were when
 * prepared (a sync that rewrote one meanwhile has made it true again), then frees `v`.
 * gs_verify_abandon frees one whose answer is not wanted (NULL: nothing). */
struct gs_verify;
int gs_verify_prepare(struct gs_index *idx, struct gs_verify_copy *copy, struct gs_verify **out,
                      struct gs_error *err);
int gs_verify_send(struct gs_verify *v, struct gs_fileops *ops, struct gs_error *err);
int gs_verify_finish(struct gs_verify *v, struct gs_fileops *ops,
                     const struct gs_verify_found *found, struct gs_verify_result *out,
                     struct gs_error *err);
void gs_verify_abandon(struct gs_verify *v);

#endif
