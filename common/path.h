/* common/path.h: local path helpers: joining, home expansion, mkdir -p, and finding the project
 * root (the nearest directory upwards holding .gpusync/config, the way git finds .git). */
#ifndef GS_PATH_H
#define GS_PATH_H

#include <stddef.h>

#include "common/buf.h"
#include "common/error.h"

#define GS_DIR         ".gpusync"
#define GS_CONFIG_FILE ".gpusync/config"

/* Appends `a`/`b` to `out`, with exactly one slash between them. */
void gs_path_join(struct gs_buf *out, const char *a, const char *b);

/* Replaces a leading "~/" with $HOME. Returns a malloc'd string the caller frees; NULL on no
 * memory. */
char *gs_path_expand_home(const char *path);

/* Creates `path` and any missing parents with `mode`. Returns 0, or GS_E_IO with a message naming
 * the directory that could not be made. */
int gs_path_mkdir_p(const char *path, int mode, struct gs_error *err);

/* Makes ROOT/.gpusync, the project's state: private to its user (0700, tightened if it was made
 * looser), and invisible to git through a .gitignore inside it that ignores everything, as a
 * virtualenv does (so `git add -A` never stages the index or the daemon's socket, and `git stash`
 * never takes them away from a running daemon). Returns 0 or GS_E_IO. */
int gs_path_state_dir(const char *root, struct gs_error *err);

/* Opens `path` for writing as a private file (0600), never through a symlink planted at that
 * name: open(2) flags plus O_NOFOLLOW | O_CLOEXEC. Returns the descriptor or -1 (errno set). */
int gs_path_open_private(const char *path, int flags);

/* Replaces the file at `path` with data[0..len), private (0600), through a temporary file beside
 * it and rename(2): a reader finds the old content or the new, never part of either. Returns 0
 * or -1 (errno set; the temporary file is gone). */
int gs_path_write_atomic(const char *path, const void *data, size_t len);

/* Appends the whole content of the file at `path` (never through a symlink) to `out`. Returns 0
 * or -1 (errno set). */
int gs_path_read_file(const char *path, struct gs_buf *out);

/* Walks up from `start` (NULL: the current directory) to the first directory containing
 * .gpusync/config and stores its absolute path in `root`. Returns 0, or GS_E_NOTFOUND with a
 * message suggesting `gpusync init`. */
int gs_path_find_project(const char *start, struct gs_buf *root, struct gs_error *err);

/* Turns `arg` (absolute, or relative to the current directory) into a path relative to the project
 * `root`, lexically ("." and ".." resolved, no symlinks followed, the file need not exist).
 * Appends it to `out` ("" for the root itself). Returns 0, or GS_E_USAGE when it lies outside. */
int gs_path_project_relative(const char *root, const char *arg, struct gs_buf *out,
                             struct gs_error *err);

/* Renames the local file `path` to a free NAME.gpusync-conflict-YYYYmmdd-HHMMSS[-N] beside it
 * (NAME shortened to fit NAME_MAX; never replacing anything), the way the server keeps a copy it
 * must not overwrite. Stores the new path in `kept`. Returns 0 or GS_E_IO. */
int gs_path_keep_conflict(const char *path, struct gs_buf *kept, struct gs_error *err);

/* Returns 1 if `name` exists as any kind of file (lstat), 0 otherwise. */
int gs_path_exists(const char *name);

/* In v[0..n), elements of `size` bytes sorted by the path (a `const char *`) at byte `off` of each,
 * the index of the first whose path is not below `key` in path order (strcmp): where key is, or
 * would go. With key "dir/", the start of the run of paths inside dir. */
size_t gs_path_lower_bound(const void *v, size_t n, size_t size, size_t off, const char *key);

#endif
