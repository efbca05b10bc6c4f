/* agent/dirwatch.h: which of the folders a session examined changed since (inotify), so that a
 * CHECK re-examines only the paths in those (serve_check.c).
 *
 * A path examined in a watched folder stays settled until an event names it, its folder or a
 * folder above it. Whatever inotify cannot vouch for is reported as changed: the folders of a
 * file system other than a local one (NFS, FUSE: writes from other machines raise no event), an
 * overflowed queue, a change in the mount table (a mount over a folder raises none); and, since a
 * write through a shared mapping raises none either, everything every 30 s. */
#ifndef GA_DIRWATCH_H
#define GA_DIRWATCH_H

struct ga_dirwatch;

/* A new watcher, or NULL where inotify cannot be had (then every path is examined each time). */
struct ga_dirwatch *ga_dirwatch_new(void);
void ga_dirwatch_free(struct ga_dirwatch *w);

/* Watches the folder open at dirfd, root-relative path `dir` ("" for the root), before its
 * entries are examined. Returns 1 when any later change of those entries will be reported, 0 when
 * it cannot be (then they are examined each time). */
int ga_dirwatch_add(struct ga_dirwatch *w, const char *dir, int dirfd);

/* What changed since the last call: changed(ctx, path, subtree) for each root-relative path
 * named (subtree: everything below it too; path "" with subtree: everything). */
typedef void (*ga_dirwatch_fn)(void *ctx, const char *path, int subtree);
void ga_dirwatch_drain(struct ga_dirwatch *w, ga_dirwatch_fn changed, void *ctx);

#endif
