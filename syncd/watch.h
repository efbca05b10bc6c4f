/* syncd/watch.h: raw inotify over the project tree (design decision 11), reporting which paths
 * changed; the daemon then pushes just those paths, and the plan turns a disappeared path plus an
 * appeared one with the same content into one rename.
 *
 * One watch per directory, none inside ignored directories. A new directory gets a watch and is
 * reported whole (files may land in it before the watch exists). A directory renamed inside the
 * tree keeps its watches (their paths are rewritten by cookie pairing); one moved out loses them.
 * A queue overflow, or running out of watches, asks the daemon for a full rescan; out of watches
 * the watcher also switches the daemon to polling, with a message naming the sysctl to raise.
 *
 * It also knows which files are in the middle of a save (gs_watch_hold), so that the server is
 * never given a version the user did not save: a file created or modified and not yet closed by
 * its writer (IN_CLOSE_WRITE) is still being written, whatever the batch timers say; and a file
 * renamed to an editor's scratch name (vim and Emacs move `f` to `f~`, JetBrains to
 * `f___jb_old___`, then write a new `f`) is about to come back, so its disappearance is not yet a
 * delete. Both holds end at the event that completes the save, or after GS_WATCH_HOLD_MAX_MS. */
#ifndef GS_SYNCD_WATCH_H
#define GS_SYNCD_WATCH_H

#include <stddef.h>
#include <stdint.h>

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
 * a full rescan is needed (queue overflow, watches lost, a .gitignore changed: files that were
 * ignored may be synced now, and synced ones ignored), 0 otherwise, or GS_E_IO. */
int gs_watch_read(struct gs_watch *w, gs_watch_fn fn, void *ctx, struct gs_error *err);

/* Uses `ig` (borrowed) from now on, and watches the folders it does not ignore (rules.h: the
 * daemon's rules changed). The caller rescans the whole tree. */
void gs_watch_set_ignore(struct gs_watch *w, struct gs_ignore *ig);

/* 1 when inotify could not watch the whole tree (fs.inotify.max_user_watches too low): the caller
 * must poll. The message for the user is in `why` (valid while `w` lives). */
int gs_watch_polling(const struct gs_watch *w, const char **why);

/* The longest a save in progress holds its file back. A writer that keeps a file open longer (a
 * log, a database), or saves it again and again without a pause, has a snapshot sent this often;
 * a file renamed to a scratch name that does not come back is deleted on the server this late. */
#define GS_WATCH_HOLD_MAX_MS 3000

/* How many events have been read so far: a caller notes it before it reads files for a batch. */
uint64_t gs_watch_events_read(const struct gs_watch *w);

/* The kernel makes a creation, truncation, rename or unlink visible a moment before it queues the
 * event that reports it (longer when the writer is preempted in between). What a batch finds in
 * that moment without an event to explain it (an empty file, a file gone) waits this long. */
#define GS_WATCH_SETTLE_MS 250

/* What a batch found at a path, for gs_watch_hold. */
struct gs_watch_found {
    uint64_t planned_at; /* gs_watch_events_read when the batch began reading files */
    int gone;            /* the path is gone: the batch would delete it (or rename it away) */
    int empty;           /* an empty regular file ... */
    int64_t mtime_ns;    /* ... last modified then (wall clock) */
};

/* Whether the batch that found `found` at `path` must not send it yet, as of the events read so
 * far: 1, with *until set to when to ask again at the latest, or 0. Held: a save still in progress
 * (see above); anything found at a path with an event since the batch began reading (a save that
 * ended, a rename or delete, a file renamed in), since what it read may be a moment inside a save
 * (an in-place save passes through an empty file; a rename save passes through no file at all),
 * and what the events say is newer; a file gone or empty with no event yet to say so
 * (GS_WATCH_SETTLE_MS). When a hold has run out, answers 0 and starts a new one, so a caller that
 * sends the file now waits again next time. */
int gs_watch_hold(struct gs_watch *w, const char *path, const struct gs_watch_found *found,
                  int64_t now_ms, int64_t *until);

/* Number of directories watched. */
size_t gs_watch_count(const struct gs_watch *w);

#endif
