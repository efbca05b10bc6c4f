/* syncd/scan.h: a listing of the local project tree, the left-hand side of a plan.
 *
 * The walk uses lstat semantics throughout (fstatat with AT_SYMLINK_NOFOLLOW, openat with
 * O_NOFOLLOW): a symbolic link is listed as a link with its target, never followed, wherever it
 * points. Ignored directories (see ignore.h) are not descended into. Regular files, directories and
 * symlinks are listed; fifos, sockets and devices are counted as skipped. Paths are arbitrary bytes
 * except NUL and '/': spaces, newlines, non-UTF-8 all pass through untouched. */
#ifndef GS_SYNCD_SCAN_H
#define GS_SYNCD_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "syncd/ignore.h"
#include "syncd/types.h"

struct gs_scan_entry {
    char *path; /* relative to the root, '/'-separated, no leading "./"; owned by the scan */
    enum gs_kind kind;
    unsigned mode;    /* permission bits: st_mode & 07777 */
    uint64_t size;    /* st_size (a symlink: the target's length) */
    int64_t mtime_ns; /* st_mtim in nanoseconds since the epoch */
    int64_t ctime_ns; /* st_ctim: a content change that restores size and mtime still moves it */
    uint64_t ino;
    uint32_t nlink; /* a file with other hard links changes when they are written through */
    char *link;     /* a symlink's target as stored (readlink bytes); NULL for other kinds */
};

/* A scan result. Entries are sorted by path in byte order (strcmp), the order SQLite's BINARY
 * collation and the index use, so a scan and the index can be merged in one pass. */
struct gs_scan {
    struct gs_scan_entry *entries;
    size_t n;
    size_t cap;
    size_t n_ignored; /* ignored entries left out (an ignored directory counts once) */
    size_t n_skipped; /* special files, and entries that vanished while the walk reached them */
    /* Entries whose path (with the root's) is too long to open (ENAMETOOLONG): not listed, nor
     * anything below them; a plan must leave what the server holds there and report them. */
    char **too_long;
    size_t n_too_long;
};

/* An empty value. (Unformatted: clang-format spreads a braced macro over four lines.) */
/* clang-format off */
#define GS_SCAN_INIT {NULL, 0, 0, 0, 0, NULL, 0}
/* clang-format on */

void gs_scan_init(struct gs_scan *s);
/* Frees every entry and the array; the scan is empty and reusable. */
void gs_scan_release(struct gs_scan *s);

/* Lists the whole tree under `root` (the root itself is not an entry) into `out`, which must be
 * empty. `ig` may be NULL: then only the built-in names are ignored. Returns 0, or GS_E_IO naming
 * the directory that could not be read (an unreadable directory is an error, not an empty one:
 * otherwise a plan would delete its contents on the server); on error `out` is released. */
int gs_scan_tree(struct gs_scan *out, const char *root, struct gs_ignore *ig, struct gs_error *err);

/* Lists `relpath` and, when it is a directory, everything below it, adding to `out` (which may
 * already hold entries from elsewhere; the result is sorted again). For the watcher, which rescans
 * a directory that appeared. If `relpath` or an ancestor is ignored, or it does not exist, nothing
 * is added (n_ignored or n_skipped counts it). Errors as gs_scan_tree, but `out` keeps what it held
 * before the call. */
int gs_scan_subtree(struct gs_scan *out, const char *root, const char *relpath,
                    struct gs_ignore *ig, struct gs_error *err);

/* The entry for `path`, by binary search, or NULL. Valid until the scan changes. */
const struct gs_scan_entry *gs_scan_find(const struct gs_scan *s, const char *path);

#endif
