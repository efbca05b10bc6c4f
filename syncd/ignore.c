/* syncd/ignore.c: built-in names, [sync] exclude globs and .gitignore through libgit2 (see
 * ignore.h).
 *
 * A path is ignored when any prefix of it is ignored "by itself" (self_decide: built-in, else the
 * exclude list's verdict when it has one, else libgit2's). The scanner walks down from the root
 * and asks only about each entry (gs_ignore_entry); the watcher asks about a whole path
 * (gs_ignore_path), which reaches the same answer with a single libgit2 query because libgit2
 * itself reports a path under an ignored directory as ignored. */
#include "syncd/ignore.h"

#include <fnmatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <git2.h>
#include <git2/sys/repository.h>

#include "common/buf.h"
#include "common/wrapper.h"

/* One exclude glob, split at '/' into components matched one by one with fnmatch(3). */
struct pattern {
    char *text;   /* storage for comps */
    char **comps; /* "**" is a component that spans any number of directories */
    size_t n;
    int negate;   /* "!pat": re-include */
    int dir_only; /* "pat/": directories only */
    int anchored; /* contained a '/': matches from the root, else the last component at any depth */
};

struct gs_ignore {
    git_repository *repo;
    struct gs_buf prefix;  /* the project's place inside the repository's work tree, "" or "a/b/" */
    struct gs_buf scratch; /* the path as handed to libgit2 */
    struct gs_buf comps;   /* relpath with '/' turned into NULs, for fnmatch */
    char **comp_v;         /* components of the path being checked, pointing into comps */
    size_t *end_v;         /* end offset of each component in the path */
    size_t cap_v;
    struct pattern *pats;
    size_t n_pats;
};

static int has_suffix(const char *s, size_t len, const char *suffix)
{
    size_t n = strlen(suffix);
    return len > n && !strcmp(s + len - n, suffix);
}

/* Editors' own scratch files: Emacs lock links (.#f), autosaves (#f#) and backups (f~), Vim swap
 * files (.f.swp/.swo/.swx), the "4913" file Vim creates to test a directory, and the names
 * JetBrains IDEs' safe write moves a file through (f___jb_tmp___, f___jb_old___). Syncing them
 * would only send noise (and an Emacs lock is a dangling symlink). */
static int is_editor_scratch(const char *base, size_t len)
{
    if (!strncmp(base, ".#", 2) || (len > 2 && base[0] == '#' && base[len - 1] == '#'))
        return 1;
    if (has_suffix(base, len, "___jb_tmp___") || has_suffix(base, len, "___jb_old___"))
        return 1;
    if (len > 1 && base[len - 1] == '~')
        return 1;
    if (base[0] == '.' && len > 5 &&
        (!strcmp(base + len - 4, ".swp") || !strcmp(base + len - 4, ".swo") ||
         !strcmp(base + len - 4, ".swx")))
        return 1;
    return !strcmp(base, "4913");
}

int gs_ignore_is_builtin(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strcmp(base, ".git") || !strcmp(base, ".gpusync"))
        return 1;
    if (!strncmp(base, ".gpusync-tmp-", 13) || is_editor_scratch(base, strlen(base)))
        return 1;
    const char *c = strstr(base, ".gpusync-conflict-");
    return c != NULL && c != base;
}

static void pattern_release(struct pattern *p)
{
    free(p->text);
    free(p->comps);
}

/* Splits `s` in place at '/' into p->comps. */
static void pattern_split(struct pattern *p, char *s)
{
    size_t n = 1;
    for (char *c = s; *c; c++)
        n += *c == '/';
    p->comps = gs_xcalloc(n, sizeof(*p->comps));
    p->n = 0;
    for (char *tok = s, *next; tok; tok = next) {
        next = strchr(tok, '/');
        if (next)
            *next++ = '\0';
        if (*tok)
            p->comps[p->n++] = tok;
    }
}

static int pattern_parse(struct pattern *p, const char *glob, struct gs_error *err)
{
    memset(p, 0, sizeof(*p));
    const char *s = glob;
    p->negate = *s == '!';
    s += p->negate;
    size_t len = strlen(s);
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    while (len && s[len - 1] == '/') {
        p->dir_only = 1;
        len--;
    }
    p->text = gs_xstrndup(s, len);
    p->anchored = strchr(p->text, '/') != NULL;
    pattern_split(p, p->text);
    if (p->n == 0) {
        pattern_release(p);
        return gs_error_set(err, GS_E_CONFIG, "[sync] exclude '%s' matches nothing", glob);
    }
    return 0;
}

/* Matches pattern components against path components; "**" matches zero or more of them, and a
 * trailing "**" one or more (everything inside, not the directory itself). */
static int comps_match(char *const *pc, size_t np, char *const *sc, size_t ns)
{
    if (np == 0)
        return ns == 0;
    if (!strcmp(pc[0], "**")) {
        if (np == 1)
            return ns >= 1;
        for (size_t k = 0; k <= ns; k++)
            if (comps_match(pc + 1, np - 1, sc + k, ns - k))
                return 1;
        return 0;
    }
    if (ns == 0 || fnmatch(pc[0], sc[0], 0) != 0)
        return 0;
    return comps_match(pc + 1, np - 1, sc + 1, ns - 1);
}

static int pattern_match(const struct pattern *p, char *const *comps, size_t n, int is_dir)
{
    if (p->dir_only && !is_dir)
        return 0;
    if (p->anchored)
        return comps_match(p->comps, p->n, comps, n);
    return p->n == 1 && fnmatch(p->comps[0], comps[n - 1], 0) == 0;
}

/* The exclude list's verdict on one entry: 1 excluded, 0 re-included, -1 no pattern matched.
 * As in gitignore, the last matching pattern wins. */
static int excludes_decide(const struct gs_ignore *ig, char *const *comps, size_t n, int is_dir)
{
    for (size_t i = ig->n_pats; i-- > 0;)
        if (pattern_match(&ig->pats[i], comps, n, is_dir))
            return ig->pats[i].negate ? 0 : 1;
    return -1;
}

/* libgit2's verdict on the first `len` bytes of a relative path. */
static int git_decide(struct gs_ignore *ig, const char *relpath, size_t len, int is_dir,
                      struct gs_error *err)
{
    gs_buf_reset(&ig->scratch);
    if (ig->prefix.len)
        gs_buf_add(&ig->scratch, ig->prefix.data, ig->prefix.len);
    gs_buf_add(&ig->scratch, relpath, len);
    if (is_dir) /* a trailing slash tells libgit2 it is a directory without a stat */
        gs_buf_addc(&ig->scratch, '/');
    int ignored = 0;
    if (git_ignore_path_is_ignored(&ignored, ig->repo, ig->scratch.data) < 0) {
        const git_error *e = git_error_last();
        return gs_error_set(err, GS_E_IO, "checking .gitignore rules for %.*s: %s", (int)len,
                            relpath, e ? e->message : "libgit2 error");
    }
    return ignored ? 1 : 0;
}

/* Splits relpath into NUL-terminated components (in ig->comps) with the end offset of each in
 * relpath, in arrays owned by ig. Empty components ("a//b") are skipped. Returns their number. */
static size_t split_path(struct gs_ignore *ig, const char *relpath)
{
    gs_buf_reset(&ig->comps);
    gs_buf_adds(&ig->comps, relpath);
    size_t need = 1;
    for (const char *c = relpath; *c; c++)
        need += *c == '/';
    if (need > ig->cap_v) {
        free(ig->comp_v);
        free(ig->end_v);
        ig->comp_v = gs_xcalloc(need, sizeof(*ig->comp_v));
        ig->end_v = gs_xcalloc(need, sizeof(*ig->end_v));
        ig->cap_v = need;
    }
    size_t n = 0;
    char *s = ig->comps.data;
    for (size_t i = 0, start = 0;; i++) {
        if (s[i] != '/' && s[i] != '\0')
            continue;
        int last = s[i] == '\0';
        s[i] = '\0';
        if (i > start) {
            ig->comp_v[n] = s + start;
            ig->end_v[n++] = i;
        }
        start = i + 1;
        if (last)
            return n;
    }
}

/* Is the prefix made of the first k components ignored by itself (not through its parents)? */
static int self_decide(struct gs_ignore *ig, const char *relpath, size_t k, int is_dir,
                       struct gs_error *err)
{
    if (gs_ignore_is_builtin(ig->comp_v[k - 1]))
        return 1;
    int ex = excludes_decide(ig, ig->comp_v, k, is_dir);
    if (ex >= 0)
        return ex;
    return git_decide(ig, relpath, ig->end_v[k - 1], is_dir, err);
}

int gs_ignore_entry(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err)
{
    size_t n = split_path(ig, relpath);
    return n == 0 ? 0 : self_decide(ig, relpath, n, is_dir, err);
}

/* For a leaf that an exclude pattern re-includes: is it under a directory that .gitignore hides
 * (and no exclude re-includes)? The scanner would not descend there, so neither may we say yes. */
static int under_gitignored_dir(struct gs_ignore *ig, const char *relpath, size_t n,
                                struct gs_error *err)
{
    for (size_t k = 1; k < n; k++) {
        if (excludes_decide(ig, ig->comp_v, k, 1) == 0)
            continue;
        int rc = git_decide(ig, relpath, ig->end_v[k - 1], 1, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Equivalent to asking self_decide about every prefix, as the scanner does on its way down, but
 * with one libgit2 query instead of one per level: libgit2 already reports a path under an
 * ignored directory as ignored. */
int gs_ignore_path(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err)
{
    size_t n = split_path(ig, relpath);
    if (n == 0)
        return 0;
    for (size_t k = 1; k < n; k++)
        if (gs_ignore_is_builtin(ig->comp_v[k - 1]) || excludes_decide(ig, ig->comp_v, k, 1) == 1)
            return 1;
    if (gs_ignore_is_builtin(ig->comp_v[n - 1]))
        return 1;
    int ex = excludes_decide(ig, ig->comp_v, n, is_dir);
    if (ex == 1)
        return 1;
    if (ex == 0)
        return under_gitignored_dir(ig, relpath, n, err);
    return git_decide(ig, relpath, ig->end_v[n - 1], is_dir, err);
}

/* Uses the git repository whose work tree holds `root`, if there is one, so that .gitignore files
 * above the project and .git/info/exclude apply as git applies them. Returns 1 when found. */
static int open_enclosing_repo(struct gs_ignore *ig, const char *root)
{
    char real_root[PATH_MAX], real_wd[PATH_MAX];
    git_repository *repo = NULL;
    if (!realpath(root, real_root) || git_repository_open_ext(&repo, root, 0, NULL) < 0)
        return 0;
    const char *wd = git_repository_workdir(repo);
    size_t wlen = wd && realpath(wd, real_wd) ? strlen(real_wd) : 0;
    if (!wlen || strncmp(real_root, real_wd, wlen) != 0 ||
        (real_root[wlen] != '/' && real_root[wlen] != '\0')) {
        git_repository_free(repo);
        return 0;
    }
    const char *rest = real_root + wlen;
    while (*rest == '/')
        rest++;
    int ignored = 0;
    if (*rest) {
        gs_buf_addf(&ig->prefix, "%s/", rest);
        /* a project that the enclosing repository ignores (a home directory under git with "*"
         * in its .gitignore) is not part of it: its rules would hide every file */
        if (git_ignore_path_is_ignored(&ignored, repo, ig->prefix.data) < 0 || ignored) {
            gs_buf_reset(&ig->prefix);
            git_repository_free(repo);
            return 0;
        }
    }
    ig->repo = repo;
    return 1;
}

/* An in-memory repository whose work tree is the project: .gitignore semantics without a .git. */
static int open_memory_repo(struct gs_ignore *ig, const char *root, struct gs_error *err)
{
    if (git_repository_new(&ig->repo) < 0 || git_repository_set_workdir(ig->repo, root, 0) < 0) {
        const git_error *e = git_error_last();
        return gs_error_set(err, GS_E_IO, "%s: cannot read .gitignore rules: %s", root,
                            e ? e->message : "libgit2 error");
    }
    return 0;
}

static int load_excludes(struct gs_ignore *ig, const char *const *excludes, size_t n,
                         struct gs_error *err)
{
    ig->pats = gs_xcalloc(n ? n : 1, sizeof(*ig->pats));
    for (size_t i = 0; i < n; i++) {
        const char *g = excludes[i];
        if (!*g || *g == '#')
            continue;
        int rc = pattern_parse(&ig->pats[ig->n_pats], g, err);
        if (rc < 0)
            return rc;
        ig->n_pats++;
    }
    return 0;
}

int gs_ignore_open(struct gs_ignore **out, const char *root, const char *const *excludes,
                   size_t n_excludes, struct gs_error *err)
{
    *out = NULL;
    struct gs_ignore *ig = gs_xcalloc(1, sizeof(*ig));
    git_libgit2_init();
    int rc = load_excludes(ig, excludes, n_excludes, err);
    if (rc == 0 && !open_enclosing_repo(ig, root))
        rc = open_memory_repo(ig, root, err);
    if (rc < 0) {
        gs_ignore_free(ig);
        return rc;
    }
    *out = ig;
    return 0;
}

void gs_ignore_free(struct gs_ignore *ig)
{
    if (!ig)
        return;
    for (size_t i = 0; i < ig->n_pats; i++)
        pattern_release(&ig->pats[i]);
    free(ig->pats);
    free(ig->comp_v);
    free(ig->end_v);
    gs_buf_release(&ig->prefix);
    gs_buf_release(&ig->scratch);
    gs_buf_release(&ig->comps);
    git_repository_free(ig->repo);
    free(ig);
    git_libgit2_shutdown();
}
