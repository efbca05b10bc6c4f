/* syncd/ignore.h: which paths of a project are never synced.
 *
 * Three layers, checked in this order for each path and each of its ancestor directories:
 *  1. built-ins, which nothing can re-include: `.git` and `.gpusync` (at any level), the agent's
 *     temporary files `.gpusync-tmp-*` and its conflict copies `*.gpusync-conflict-*`;
 *  2. `[sync] exclude` globs with gitignore semantics: `data/` matches directories only, `/build`
 *     is anchored at the project root, `*.ckpt` matches at any depth, `**` spans directories, a
 *     later `!pattern` re-includes. When an exclude pattern matches, it decides, so `!small.csv`
 *     syncs a file that .gitignore hides; but as in git, nothing under an ignored directory can
 *     be re-included;
 *  3. git's ignore files, matched as `git check-ignore` does: `.gitignore` files at every level
 *     (a deeper one decides over a shallower one, so a deeper `!keep.tmp` re-includes what a
 *     shallower `*.tmp` hides), then `.git/info/exclude`, then the user's core.excludesFile
 *     (default ~/.config/git/ignore); nothing under an excluded directory can be re-included;
 *     a symlink is a file, even one to a directory, so `data/` never matches it; a symlinked
 *     .gitignore in the project is not read. When the project lies inside a git work tree, that
 *     repository's files and configuration are used, so .gitignore files above the project count
 *     too (unless that repository ignores the project directory itself); otherwise the project
 *     is the work tree and only core.excludesFile joins its own .gitignore files. Every query
 *     re-checks (stats) the files it uses, so an edited .gitignore takes effect at once.
 *
 * Paths are relative to the project root, '/'-separated, with no leading "./" or trailing slash.
 * A gs_ignore may be used by one thread at a time. */
#ifndef GS_SYNCD_IGNORE_H
#define GS_SYNCD_IGNORE_H

#include <stddef.h>

#include "common/error.h"

struct gs_ignore;

/* Builds the rules for the project at `root` with the given exclude globs (copied; NULL with
 * n_excludes 0 for none). On success *out owns a new object (gs_ignore_free). Returns 0, or
 * GS_E_CONFIG (a malformed glob) with a message, and *out is NULL. */
int gs_ignore_open(struct gs_ignore **out, const char *root, const char *const *excludes,
                   size_t n_excludes, struct gs_error *err);

/* Frees `ig`. NULL is fine. */
void gs_ignore_free(struct gs_ignore *ig);

/* The user's excludes file `ig` reads (core.excludesFile, or git's default
 * ~/.config/git/ignore), or NULL. */
const char *gs_ignore_user_path(const struct gs_ignore *ig);

/* Is `relpath` ignored, itself or through an ignored ancestor directory? `is_dir` says whether
 * it is a directory (the watcher knows even for a path that no longer exists). Returns 1 (ignored),
 * 0 (synced), or GS_E_IO with a message when an ignore file cannot be read. The watcher calls
 * this per event. */
int gs_ignore_path(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err);

/* As gs_ignore_path, for a caller that already knows no ancestor of `relpath` is ignored (a
 * scanner walking down from a synced directory): built-ins and excludes look only at the entry. */
int gs_ignore_entry(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err);

/* 1 when the last path component is one of the built-in names (.git, .gpusync, gpusync's temporary
 * and conflict names, and editors' scratch files: .#f, #f#, f~, .f.swp/.swo/.swx, 4913,
 * f___jb_tmp___, f___jb_old___), 0 otherwise. The README lists them for users. Pure; no object. */
int gs_ignore_is_builtin(const char *name);

#endif
