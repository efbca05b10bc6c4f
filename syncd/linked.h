/* syncd/linked.h: the project's files that have other hard links, which the watch daemon checks
 * itself: a write through a name outside the project changes them without an inotify event here.
 *
 * The scan of each batch (push.h on_scan) says which files have st_nlink > 1; the daemon keeps
 * their stat as scanned and compares it at each flush and about once a second while idle: one
 * fstatat each. What changed is marked dirty, so the plan reads and sends it as any save. A link
 * made from outside to a file of the project renames nothing here either: the daemon lists the
 * tree again now and then for those (a sweep, daemon.c). */
#ifndef GS_SYNCD_LINKED_H
#define GS_SYNCD_LINKED_H

#include <stddef.h>
#include <stdint.h>

#include "syncd/scan.h"

struct gs_linked_file {
    char *path; /* relative to the root; owned */
    uint64_t ino, size;
    int64_t mtime_ns, ctime_ns;
};

/* Sorted by path (strcmp), unique. Zero-initialised is empty. */
struct gs_linked {
    struct gs_linked_file *v;
    size_t n, cap;
};

/* Takes the files of `scan` that have other hard links. `whole`: the scan covered the whole tree,
 * so these are all of them (the set is rebuilt); else they are added or updated, and a scanned
 * file now linked once is dropped. With `told` (NULL: none), each file new to the set, and each
 * known one whose stat differs from the last seen, is told: a link made from outside since, or
 * a write through one, that no event reported. */
void gs_linked_take_scan(struct gs_linked *l, const struct gs_scan *scan, int whole,
                         void (*told)(void *ctx, const char *path), void *ctx);

/* Stats each file at `rootfd` (lstat semantics) and calls changed(ctx, path) for each whose inode,
 * size, mtime or ctime differs from what was last seen (gone: dropped after the call); what it
 * sees becomes the new reference, so a change is told once. */
void gs_linked_check(struct gs_linked *l, int rootfd, void (*changed)(void *ctx, const char *path),
                     void *ctx);

/* Frees every entry; the set is empty and reusable. */
void gs_linked_release(struct gs_linked *l);

#endif
