/* syncd/rules.c: a change of the exclude rules outside the watched tree, noticed (see rules.h). */
#include "syncd/rules.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "syncd/session.h"

static void excludes_free(struct gs_rules *r)
{
    for (size_t i = 0; i < r->n_excludes; i++)
        free(r->excludes[i]);
    free(r->excludes);
    r->excludes = NULL;
    r->n_excludes = 0;
}

static void excludes_set(struct gs_rules *r, char *const *excludes, size_t n)
{
    excludes_free(r);
    r->excludes = gs_xcalloc(n ? n : 1, sizeof(*r->excludes));
    for (size_t i = 0; i < n; i++)
        r->excludes[i] = gs_xstrdup(excludes[i]);
    r->n_excludes = n;
}

/* What stat says of `path`, folded into one number that any rewrite changes; 0 when absent.
 * Unsigned arithmetic: the folding wraps by design. */
static int64_t stamp_path(const char *path)
{
    struct stat st;
    uint64_t stamp = 0;
    if (path && stat(path, &st) == 0) {
        stamp = (uint64_t)st.st_mtim.tv_sec * 1000000007u + (uint64_t)st.st_mtim.tv_nsec;
        stamp =
            stamp * 31 + (uint64_t)st.st_ctim.tv_sec * 1000000007u + (uint64_t)st.st_ctim.tv_nsec;
        stamp = stamp * 31 + (uint64_t)st.st_size * 7 + (uint64_t)st.st_ino;
        stamp = (stamp >> 1) | 1; /* positive, never the 0 of "absent" */
    }
    return (int64_t)stamp;
}

static int64_t stamp_of(const char *root, const char *rel)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, root, rel);
    int64_t stamp = stamp_path(path.data);
    gs_buf_release(&path);
    return stamp;
}

/* The git config files that may set core.excludesFile, as one stamp: the project's repository's,
 * the user's two and the system's. (A repository enclosing the project from above is not
 * looked at: its config is rarely where a user sets it.) */
static int64_t gitconfig_stamp(const char *root)
{
    const char *home = getenv("HOME"), *xdg = getenv("XDG_CONFIG_HOME");
    struct gs_buf p = GS_BUF_INIT;
    uint64_t stamp = (uint64_t)stamp_of(root, ".git/config");
    if (home && *home) {
        gs_buf_addf(&p, "%s/.gitconfig", home);
        stamp = stamp * 31 + (uint64_t)stamp_path(p.data);
    }
    gs_buf_reset(&p);
    if (xdg && *xdg)
        gs_buf_addf(&p, "%s/git/config", xdg);
    else if (home && *home)
        gs_buf_addf(&p, "%s/.config/git/config", home);
    stamp = stamp * 31 + (uint64_t)stamp_path(p.len ? p.data : NULL);
    stamp = stamp * 31 + (uint64_t)stamp_path("/etc/gitconfig");
    gs_buf_release(&p);
    return (int64_t)stamp;
}

void gs_rules_init(struct gs_rules *r, const char *root, const char *remote_id,
                   char *const *excludes, size_t n_excludes)
{
    memset(r, 0, sizeof(*r));
    r->root = gs_xstrdup(root);
    r->remote_id = gs_xstrdup(remote_id);
    r->config_stamp = stamp_of(root, GS_CONFIG_FILE);
    r->exclude_stamp = stamp_of(root, ".git/info/exclude");
    r->gitconfig_stamp = gitconfig_stamp(root);
    excludes_set(r, excludes, n_excludes);
}

void gs_rules_release(struct gs_rules *r)
{
    excludes_free(r);
    free(r->root);
    free(r->remote_id);
    memset(r, 0, sizeof(*r));
}

static int same_excludes(const struct gs_rules *r, const struct gs_config *cfg)
{
    if (cfg->n_excludes != r->n_excludes)
        return 0;
    for (size_t i = 0; i < r->n_excludes; i++)
        if (strcmp(cfg->excludes[i], r->excludes[i]) != 0)
            return 0;
    return 1;
}

/* The config as it is now: GS_RULES_OTHER_SERVER when it names another server; else 1 with *ig
 * rebuilt when its excludes changed, 0 when they did not. */
static int reload_config(struct gs_rules *r, struct gs_ignore **ig, struct gs_error *err)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_path_join(&path, r->root, GS_CONFIG_FILE);
    struct gs_config cfg;
    int rc = gs_config_load(&cfg, path.data, err);
    gs_buf_release(&path);
    if (rc < 0)
        return rc;
    char *remote_id = gs_session_remote_id(&cfg);
    int other = strcmp(remote_id, r->remote_id) != 0;
    free(remote_id);
    if (other) {
        gs_config_release(&cfg);
        return GS_RULES_OTHER_SERVER;
    }
    struct gs_ignore *fresh = NULL;
    if (!same_excludes(r, &cfg))
        rc =
            gs_ignore_open(&fresh, r->root, (const char *const *)cfg.excludes, cfg.n_excludes, err);
    if (rc == 0 && fresh) {
        excludes_set(r, cfg.excludes, cfg.n_excludes);
        *ig = fresh;
        rc = 1;
    }
    gs_config_release(&cfg);
    return rc;
}

/* The git config named another excludes file, or none: the rules are built again, to read it.
 * Returns 1 with *ig the new object, or the error of building it (the old rules kept). */
static int reopen_for_gitconfig(struct gs_rules *r, struct gs_ignore **ig, struct gs_error *err)
{
    struct gs_ignore *fresh = NULL;
    int rc = gs_ignore_open(&fresh, r->root, (const char *const *)r->excludes, r->n_excludes, err);
    if (rc < 0)
        return rc;
    *ig = fresh;
    return 1;
}

/* 1 when the user's excludes file changed since the last look (its content: *ig reads it again
 * by itself); the first look only takes its stamp. */
static int user_file_changed(struct gs_rules *r, const struct gs_ignore *ig)
{
    int64_t user = stamp_path(gs_ignore_user_path(ig));
    int changed = r->user_known && user != r->user_stamp;
    r->user_stamp = user;
    r->user_known = 1;
    return changed;
}

int gs_rules_check(struct gs_rules *r, struct gs_ignore **ig, struct gs_error *err)
{
    int64_t config = stamp_of(r->root, GS_CONFIG_FILE);
    int64_t exclude = stamp_of(r->root, ".git/info/exclude");
    int64_t gitconfig = gitconfig_stamp(r->root);
    struct gs_ignore *was = *ig;
    int changed = exclude != r->exclude_stamp;
    if (config != r->config_stamp) {
        r->config_stamp = config; /* a broken config is reported once, not at every look */
        int rc = config ? reload_config(r, ig, err) : 0; /* gone: the daemon stops (daemon.c) */
        if (rc < 0 || rc == GS_RULES_OTHER_SERVER)
            return rc; /* exclude_stamp unchanged: its change is told at the next look */
        changed |= rc;
    }
    if (gitconfig != r->gitconfig_stamp) {
        r->gitconfig_stamp = gitconfig; /* a failure is reported once, not at every look */
        int rc = *ig == was ? reopen_for_gitconfig(r, ig, err) : 1; /* else built just now */
        if (rc < 0)
            return rc;
        changed = 1;
    }
    r->exclude_stamp = exclude;
    changed |= user_file_changed(r, *ig);
    return changed;
}
