/* syncd/watch.h: raw inotify over the project tree (design decision 11), reporting which paths
 * changed; the daemon then pushes just those paths, and the plan turns a disappeared path plus an
 * appeared one with the same content into one rename.
 *
 * One watch per directory, none inside ignored directories. A new directory gets a watch and is
 * reported whole (files may land in it before the watch exists). A directory renamed inside the
 * tree keeps its watches (their paths are rewritten by cookie pairing); one moved out loses them.
 * A queue overflow, or running out of watches, asks the daemon for a full rescan; out of watches
 * the watcher also switches the daemon to polling, with a message naming the sysctl to raise. */
#ifndef GS_SYNCD_WATCH_H
#define GS_SYNCD_WATCH_H

#include <stddef.h>

#include "common/error.h"
#include "syncd/ignore.h"

struct gs_watch;

/* Called for each changed path (relative to the root; "" never). */
typedef void (*gs_watch_fn)(void *ctx, const char *path);

/* Watches every non-ignored directory under `root` (`ig` is borrowed). Returns 0, or GS_E_IO.
 * Running out of watches is not an error: gs_watch_polling() then says so. */
int gs_watch_open(struct gs_watch **out, const char *root, struct gs_ignore *ig,
                  struct gs_error *err);
void gs_watch_free(struct gs_watch *w);

/* The inotify descriptor to poll for input. */
int gs_watch_fd(const struct gs_watch *w);

/* Reads every pending event without blocking, calling `fn` for each changed path. Returns 1 when
 * a full rescan is needed (queue overflow, watches lost), 0 otherwise, or GS_E_IO. */
int gs_watch_read(struct gs_watch *w, gs_watch_fn fn, void *ctx, struct gs_error *err);

/* 1 when inotify could not watch the whole tree (fs.inotify.max_user_watches too low): the caller
 * must poll. The message for the user is in `why` (valid while `w` lives). */
int gs_watch_polling(const struct gs_watch *w, const char **why);

/* Number of directories watched. */
size_t gs_watch_count(const struct gs_watch *w);

#endif
