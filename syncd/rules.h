/* syncd/rules.h: noticing, while the watch daemon runs, that what decides which paths are synced
 * has changed outside the tree it watches: the [sync] exclude globs of .gpusync/config,
 * .git/info/exclude, the user's excludes file (core.excludesFile, or ~/.config/git/ignore) and the
 * git config files that name it. (A .gitignore inside the tree is an event of the watcher's:
 * watch.h.)
 *
 * Without this a daemon kept the rules it started with: a file excluded after its start was sent
 * anyway, and one no longer excluded was never sent, while it said "up to date". */
#ifndef GS_SYNCD_RULES_H
#define GS_SYNCD_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "syncd/ignore.h"

struct gs_rules {
    char *root;
    char *remote_id;                     /* the server and path the daemon syncs to */
    int64_t config_stamp, exclude_stamp; /* what stat said of each file, folded; 0: none */
    int64_t user_stamp, gitconfig_stamp; /* the same of the user's excludes file, and of the git
                                            config files that may name it */
    int user_known;                      /* user_stamp was taken (the first check) */
    char **excludes;                     /* the globs `ig` was built with */
    size_t n_excludes;
};

/* Starts noticing for the project at `root`, synced to `remote_id` (gs_session_remote_id), whose
 * rules were built from `excludes`. */
void gs_rules_init(struct gs_rules *r, const char *root, const char *remote_id,
                   char *const *excludes, size_t n_excludes);
void gs_rules_release(struct gs_rules *r);

#define GS_RULES_OTHER_SERVER 2

/* Looks at both files (two stats; the config is read only when its stat changed). Returns 0 when
 * neither changed; GS_RULES_OTHER_SERVER when the config names another server or path now (`init`
 * run again): what the daemon syncs to is no longer the project's, and it must stop; 1 when the
 * rules changed: *ig is then a new object built with the config's new
 * excludes, or for a git config that may name another excludes file (the caller frees the old
 * one), or, when only .git/info/exclude or the user's excludes file changed, the same one (it
 * reads those again by itself); either way everything must be scanned again. A
 * config that cannot be read or parsed now keeps the old rules: GS_E_CONFIG with a message, once
 * per change of the file. */
int gs_rules_check(struct gs_rules *r, struct gs_ignore **ig, struct gs_error *err);

#endif
