/* syncd/ignore.c: built-in names, [sync] exclude globs and git's ignore files (see ignore.h).
 *
 * A path is ignored when any prefix of it is ignored "by itself" (self_decide: built-in, else the
 * exclude list's verdict when it has one, else the ignore files'). The scanner walks down from the
 * root and asks only about each entry (gs_ignore_entry); the watcher asks about a whole path
 * (gs_ignore_path), which asks about every prefix as the scanner would on its way down.
 *
 * The ignore files are read and matched here, in git's order (dir.c), not by libgit2, whose
 * git_ignore_path_is_ignored gets three things wrong: it lets the shallowest .gitignore with a
 * matching rule decide, so a deeper `!keep.tmp` never beats a shallower `*.tmp`; it lets a
 * negation that matches a file decide even when a directory above it is excluded; and it can be
 * told "directory" (a trailing slash) but not "not a directory", so it stat(2)s the path, which
 * follows a symlink, and `data/` matched a symlink to a directory. libgit2 still finds the
 * enclosing repository and reads its configuration, once, in gs_ignore_open.
 *
 * The .gitignore of each directory on the path of the last query is kept (the chain), so a scan,
 * which asks about the entries of one directory in a row, parses each file once. Every query
 * re-checks each ignore file it uses with one stat, as libgit2 did, so an edit takes effect at
 * once. */
#include "syncd/ignore.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <git2.h>

#include "common/buf.h"
#include "common/wrapper.h"

/* One glob, split at '/' into components matched one by one with fnmatch(3). */
struct pattern {
    char *text;   /* storage for comps */
    char **comps; /* "**" is a component that spans any number of directories */
    size_t n;
    int negate;   /* "!pat": re-include */
    int dir_only; /* "pat/": directories only */
    int anchored; /* contained a '/': matches from its base, else the last component at any depth */
};

/* The patterns of one ignore file, and the stat they were read under. */
struct rules {
    struct pattern *pats;
    size_t n, alloc;
    int present;    /* the file existed (as a regular file) when last checked */
    struct stat st; /* valid when present */
};

/* One directory on the path of the last query: its path is the first `end` bytes of ig->chain_dir
 * (the root: 0), and `rules` its .gitignore. */
struct level {
    size_t end;
    struct rules rules;
};

struct gs_ignore {
    struct gs_buf workdir; /* the work tree the ignore files belong to, absolute, with a '/' */
    struct gs_buf prefix;  /* the project's place inside the work tree, "" or "a/b/" */
    size_t n_prefix;       /* components of prefix */
    int fnm_case;          /* FNM_CASEFOLD under core.ignoreCase, else 0 (ignore files only) */
    char *info_path;       /* $GIT_DIR/info/exclude, or NULL without a repository */
    char *user_path;       /* core.excludesFile (or git's default), or NULL */
    struct rules info;     /* read from info_path */
    struct rules user;     /* read from user_path */
    struct level *chain;   /* chain[i]: the directory made of the first i components */
    size_t n_chain, cap_chain;
    struct gs_buf chain_dir; /* the deepest chain directory, relative to the work tree */
    struct gs_buf path;      /* the path being checked, relative to the work tree */
    struct gs_buf file;      /* the absolute path of a .gitignore */
    struct gs_buf scratch;   /* an ignore file's contents */
    struct gs_buf comps;     /* path with '/' turned into NULs, for fnmatch */
    char **comp_v;           /* components of path, pointing into comps */
    size_t *end_v;           /* end offset of each component in path */
    size_t cap_v;
    struct pattern *pats; /* [sync] exclude, relative to the project */
    int git_ready;        /* git_libgit2_init was called for this object */
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

/* Parses the `len` bytes at `s`, already stripped of trailing blanks: "!", a trailing '/', and
 * whether a '/' anchors it. Returns 0, or -1 (nothing stored) when the glob has no component. */
static int pattern_build(struct pattern *p, const char *s, size_t len)
{
    memset(p, 0, sizeof(*p));
    if (len && *s == '!') {
        p->negate = 1;
        s++;
        len--;
    }
    while (len && s[len - 1] == '/') {
        p->dir_only = 1;
        len--;
    }
    p->text = gs_xstrndup(s, len);
    p->anchored = strchr(p->text, '/') != NULL;
    pattern_split(p, p->text);
    if (p->n > 0)
        return 0;
    pattern_release(p);
    return -1;
}

static int pattern_parse(struct pattern *p, const char *glob, struct gs_error *err)
{
    size_t len = strlen(glob);
    while (len && (glob[len - 1] == ' ' || glob[len - 1] == '\t'))
        len--;
    if (pattern_build(p, glob, len) < 0)
        return gs_error_set(err, GS_E_CONFIG, "[sync] exclude '%s' matches nothing", glob);
    return 0;
}

/* Matches pattern components against path components; "**" matches zero or more of them, and a
 * trailing "**" one or more (everything inside, not the directory itself). */
static int comps_match(char *const *pc, size_t np, char *const *sc, size_t ns, int flags)
{
    if (np == 0)
        return ns == 0;
    if (!strcmp(pc[0], "**")) {
        if (np == 1)
            return ns >= 1;
        for (size_t k = 0; k <= ns; k++)
            if (comps_match(pc + 1, np - 1, sc + k, ns - k, flags))
                return 1;
        return 0;
    }
    if (ns == 0 || fnmatch(pc[0], sc[0], flags) != 0)
        return 0;
    return comps_match(pc + 1, np - 1, sc + 1, ns - 1, flags);
}

/* Does `p` match the path made of `n` components, relative to the pattern's base? */
static int pattern_match(const struct pattern *p, char *const *comps, size_t n, int is_dir,
                         int flags)
{
    if (p->dir_only && !is_dir)
        return 0;
    if (p->anchored)
        return comps_match(p->comps, p->n, comps, n, flags);
    return p->n == 1 && fnmatch(p->comps[0], comps[n - 1], flags) == 0;
}

/* The verdict of a list of patterns: 1 excluded, 0 re-included, -1 no pattern matched. As in
 * gitignore, the last matching pattern wins. */
static int patterns_decide(const struct pattern *pats, size_t n_pats, char *const *comps, size_t n,
                           int is_dir, int flags)
{
    for (size_t i = n_pats; i-- > 0;)
        if (pattern_match(&pats[i], comps, n, is_dir, flags))
            return pats[i].negate ? 0 : 1;
    return -1;
}

static void rules_clear(struct rules *r)
{
    for (size_t i = 0; i < r->n; i++)
        pattern_release(&r->pats[i]);
    r->n = 0;
    r->present = 0;
}

static void rules_release(struct rules *r)
{
    rules_clear(r);
    free(r->pats);
    r->pats = NULL;
    r->alloc = 0;
}

/* git's trim_trailing_spaces: drops trailing spaces unless a backslash quotes the first. */
static size_t trim_trailing_spaces(const char *s, size_t len)
{
    size_t first_space = len; /* of the spaces that end s so far; len: none */
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            if (first_space == len)
                first_space = i;
            continue;
        }
        if (s[i] == '\\' && ++i == len)
            return len;
        first_space = len;
    }
    return first_space;
}

/* Parses an ignore file's `len` bytes as git does: a UTF-8 BOM, CRLF line ends, '#' comments,
 * blank lines, and trailing spaces are skipped. */
static void rules_parse(struct rules *r, const char *data, size_t len)
{
    if (len >= 3 && !memcmp(data, "\xef\xbb\xbf", 3)) {
        data += 3;
        len -= 3;
    }
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t line = nl ? (size_t)(nl - data) : len, n = line;
        if (n && data[n - 1] == '\r')
            n--;
        n = trim_trailing_spaces(data, n);
        if (n && data[0] != '#') {
            GS_ALLOC_GROW(r->pats, r->n + 1, r->alloc);
            r->n += pattern_build(&r->pats[r->n], data, n) == 0;
        }
        data += nl ? line + 1 : line;
        len -= nl ? line + 1 : line;
    }
}

static int same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Reads the ignore file at `path` into `r` (through a symlink only when `follow`). Uses
 * ig->scratch. Returns 0, or GS_E_IO with a message. */
static int rules_read(struct gs_ignore *ig, struct rules *r, const char *path, int follow,
                      struct gs_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0 && (errno == ENOENT || errno == ELOOP))
        return 0; /* gone since its stat, or replaced by a symlink: none */
    if (fd < 0 || fstat(fd, &r->st) < 0)
        goto err;
    gs_buf_reset(&ig->scratch);
    char chunk[16384];
    ssize_t got;
    while ((got = read(fd, chunk, sizeof(chunk))) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            goto err;
        gs_buf_add(&ig->scratch, chunk, (size_t)got);
    }
    close(fd);
    rules_parse(r, ig->scratch.data, ig->scratch.len);
    r->present = 1;
    return 0;
err:
    gs_error_errno(err, GS_E_IO, "cannot read ignore file %s (fix its permissions)", path);
    if (fd >= 0)
        close(fd);
    return GS_E_IO;
}

/* Brings `r` up to date with the file at `path`: one stat, and a read only when it changed. A
 * missing file has no rules. git does not follow a symlinked .gitignore in the work tree (`follow`
 * 0), but does follow core.excludesFile. Returns 0, or GS_E_IO with a message. */
static int rules_refresh(struct gs_ignore *ig, struct rules *r, const char *path, int follow,
                         struct gs_error *err)
{
    struct stat st;
    int rc = follow ? stat(path, &st) : lstat(path, &st);
    if (rc < 0 && errno != ENOENT && errno != ENOTDIR)
        return gs_error_errno(err, GS_E_IO, "cannot stat ignore file %s", path);
    if (rc < 0 || !S_ISREG(st.st_mode)) {
        rules_clear(r);
        return 0;
    }
    if (r->present && same_stat(&r->st, &st))
        return 0;
    rules_clear(r);
    return rules_read(ig, r, path, follow, err);
}

/* Does chain level `i` hold the directory made of the first i components of ig->path? */
static int level_matches(const struct gs_ignore *ig, size_t i)
{
    size_t end = i ? ig->end_v[i - 1] : 0;
    return ig->chain[i].end == end && (!end || !memcmp(ig->chain_dir.data, ig->path.data, end));
}

/* Makes the chain hold the .gitignore of the first `ndirs` directories of ig->path (the root and
 * the ancestors of the first ndirs components), each brought up to date. Levels that the previous
 * query shared are kept; one stat each. Returns 0, or GS_E_IO with a message. */
static int chain_load(struct gs_ignore *ig, size_t ndirs, struct gs_error *err)
{
    size_t keep = 0;
    while (keep < ig->n_chain && keep < ndirs && level_matches(ig, keep))
        keep++;
    for (size_t i = keep; i < ig->n_chain; i++)
        rules_release(&ig->chain[i].rules);
    GS_ALLOC_GROW(ig->chain, ndirs, ig->cap_chain);
    memset(ig->chain + keep, 0, (ndirs - keep) * sizeof(*ig->chain));
    ig->n_chain = ndirs;
    size_t deepest = ndirs > 1 ? ig->end_v[ndirs - 2] : 0;
    gs_buf_reset(&ig->chain_dir);
    gs_buf_add(&ig->chain_dir, ig->path.data, deepest);
    for (size_t i = 0; i < ndirs; i++) {
        struct level *l = &ig->chain[i];
        l->end = i ? ig->end_v[i - 1] : 0;
        gs_buf_reset(&ig->file);
        gs_buf_add(&ig->file, ig->workdir.data, ig->workdir.len);
        gs_buf_add(&ig->file, ig->path.data, l->end);
        gs_buf_adds(&ig->file, i ? "/.gitignore" : ".gitignore");
        int rc = rules_refresh(ig, &l->rules, ig->file.data, 0, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Re-checks $GIT_DIR/info/exclude and core.excludesFile. Returns 0 or GS_E_IO. */
static int globals_load(struct gs_ignore *ig, struct gs_error *err)
{
    int rc = 0;
    if (ig->info_path)
        rc = rules_refresh(ig, &ig->info, ig->info_path, 1, err);
    if (rc == 0 && ig->user_path)
        rc = rules_refresh(ig, &ig->user, ig->user_path, 1, err);
    return rc;
}

/* The ignore files' verdict on the first `j` components of ig->path by themselves (not through
 * their parents), as git's last_matching_pattern: the .gitignore files from the deepest to the
 * root, then info/exclude, then core.excludesFile; the first with a matching pattern decides.
 * Needs chain_load(ig, j) and globals_load. Returns 1 or 0. */
static int git_decide(const struct gs_ignore *ig, size_t j, int is_dir)
{
    int flags = ig->fnm_case;
    for (size_t b = j; b-- > 0;) {
        const struct rules *r = &ig->chain[b].rules;
        int v = patterns_decide(r->pats, r->n, ig->comp_v + b, j - b, is_dir, flags);
        if (v >= 0)
            return v;
    }
    int v = patterns_decide(ig->info.pats, ig->info.n, ig->comp_v, j, is_dir, flags);
    if (v < 0)
        v = patterns_decide(ig->user.pats, ig->user.n, ig->comp_v, j, is_dir, flags);
    return v == 1;
}

/* Sets ig->path to prefix + relpath and splits it into NUL-terminated components (in ig->comps)
 * with the end offset of each in ig->path, in arrays owned by ig. Empty components ("a//b") are
 * skipped. Returns their number, prefix included. */
static size_t split_path(struct gs_ignore *ig, const char *relpath)
{
    gs_buf_reset(&ig->path);
    gs_buf_add(&ig->path, ig->prefix.data, ig->prefix.len);
    gs_buf_adds(&ig->path, relpath);
    gs_buf_reset(&ig->comps);
    gs_buf_add(&ig->comps, ig->path.data, ig->path.len);
    size_t need = 1;
    for (const char *c = ig->path.data; *c; c++)
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

/* Is the prefix made of the first j components of ig->path (j > n_prefix) ignored by itself? The
 * exclude list sees it relative to the project. Needs chain_load(ig, j) and globals_load. */
static int self_decide(const struct gs_ignore *ig, size_t j, int is_dir)
{
    if (gs_ignore_is_builtin(ig->comp_v[j - 1]))
        return 1;
    size_t p = ig->n_prefix;
    int ex = patterns_decide(ig->pats, ig->n_pats, ig->comp_v + p, j - p, is_dir, 0);
    return ex >= 0 ? ex : git_decide(ig, j, is_dir);
}

/* Splits relpath and loads the ignore files that can decide on it. Returns its number of
 * components with the prefix (n_prefix when relpath is empty), or GS_E_IO with a message. */
static int prepare(struct gs_ignore *ig, const char *relpath, size_t *n, struct gs_error *err)
{
    *n = split_path(ig, relpath);
    if (*n <= ig->n_prefix)
        return 0;
    int rc = chain_load(ig, *n, err);
    return rc < 0 ? rc : globals_load(ig, err);
}

int gs_ignore_entry(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err)
{
    size_t n;
    int rc = prepare(ig, relpath, &n, err);
    if (rc < 0 || n <= ig->n_prefix)
        return rc;
    return self_decide(ig, n, is_dir);
}

/* What the scanner would find on its way down: the first prefix ignored by itself decides. */
int gs_ignore_path(struct gs_ignore *ig, const char *relpath, int is_dir, struct gs_error *err)
{
    size_t n;
    int rc = prepare(ig, relpath, &n, err);
    if (rc < 0)
        return rc;
    for (size_t j = ig->n_prefix + 1; j <= n; j++)
        if (self_decide(ig, j, j < n || is_dir))
            return 1;
    return 0;
}

/* The chain belongs to one work tree: forget it when the work tree changes. */
static void chain_release(struct gs_ignore *ig)
{
    for (size_t i = 0; i < ig->n_chain; i++)
        rules_release(&ig->chain[i].rules);
    ig->n_chain = 0;
}

/* Reads core.ignoreCase and core.excludesFile as git would for this repository (NULL: outside
 * one, from the user's and the system's configuration only). Without core.excludesFile, git's
 * default $XDG_CONFIG_HOME/git/ignore (or ~/.config/git/ignore). */
static void read_config(struct gs_ignore *ig, git_repository *repo)
{
    git_config *cfg = NULL;
    int rc = repo ? git_repository_config_snapshot(&cfg, repo) : git_config_open_default(&cfg);
    if (rc == 0) {
        int fold = 0;
        git_buf buf = {0};
        if (git_config_get_bool(&fold, cfg, "core.ignorecase") == 0)
            ig->fnm_case = fold ? FNM_CASEFOLD : 0;
        if (git_config_get_path(&buf, cfg, "core.excludesfile") == 0 && buf.ptr && *buf.ptr)
            ig->user_path = gs_xstrdup(buf.ptr);
        git_buf_dispose(&buf);
        git_config_free(cfg);
    }
    git_error_clear();
    if (ig->user_path)
        return;
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    struct gs_buf p = GS_BUF_INIT;
    if (xdg && *xdg)
        gs_buf_addf(&p, "%s/git/ignore", xdg);
    else if (home && *home)
        gs_buf_addf(&p, "%s/.config/git/ignore", home);
    ig->user_path = p.len ? gs_buf_detach(&p, NULL) : NULL;
}

/* Does the repository's own ignore files exclude the project directory (ig->prefix) or a directory
 * above it? A home directory under git with "*" in its .gitignore would hide every file. */
static int prefix_ignored(struct gs_ignore *ig)
{
    char *dir = gs_buf_detach(&ig->prefix, NULL); /* split it from the work tree's root */
    size_t n_prefix = ig->n_prefix, n;
    ig->n_prefix = 0;
    int ignored = prepare(ig, dir, &n, NULL) < 0;
    for (size_t j = 1; !ignored && j <= n; j++)
        ignored = git_decide(ig, j, 1);
    gs_buf_adds(&ig->prefix, dir);
    free(dir);
    ig->n_prefix = n_prefix;
    chain_release(ig);
    return ignored;
}

/* Uses the git repository whose work tree holds `root`, if there is one, so that .gitignore files
 * above the project, $GIT_DIR/info/exclude and the repository's configuration apply as git
 * applies them. Returns 1 when found and used. */
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
    gs_buf_adds(&ig->workdir, real_wd);
    if (ig->workdir.data[ig->workdir.len - 1] != '/')
        gs_buf_addc(&ig->workdir, '/');
    const char *rest = real_root + wlen;
    while (*rest == '/')
        rest++;
    if (*rest)
        gs_buf_addf(&ig->prefix, "%s/", rest);
    for (const char *c = ig->prefix.data; c && *c; c++)
        ig->n_prefix += *c == '/';
    git_buf info = {0};
    if (git_repository_item_path(&info, repo, GIT_REPOSITORY_ITEM_INFO) == 0) {
        struct gs_buf p = GS_BUF_INIT;
        gs_buf_adds(&p, info.ptr);
        if (p.len && p.data[p.len - 1] != '/')
            gs_buf_addc(&p, '/');
        gs_buf_adds(&p, "exclude");
        ig->info_path = gs_buf_detach(&p, NULL);
    }
    git_buf_dispose(&info);
    read_config(ig, repo);
    git_repository_free(repo);
    git_error_clear();
    if (ig->n_prefix && prefix_ignored(ig))
        return 0;
    return 1;
}

/* No repository (or one that ignores the project): the project's own .gitignore files and the
 * user's core.excludesFile, with the project as the work tree. */
static void open_plain(struct gs_ignore *ig, const char *root)
{
    gs_buf_reset(&ig->workdir);
    gs_buf_reset(&ig->prefix);
    ig->n_prefix = 0;
    free(ig->info_path);
    ig->info_path = NULL;
    rules_release(&ig->info);
    free(ig->user_path);
    ig->user_path = NULL;
    ig->fnm_case = 0;
    gs_buf_adds(&ig->workdir, root);
    if (ig->workdir.len == 0 || ig->workdir.data[ig->workdir.len - 1] != '/')
        gs_buf_addc(&ig->workdir, '/');
    read_config(ig, NULL);
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

const char *gs_ignore_user_path(const struct gs_ignore *ig)
{
    return ig ? ig->user_path : NULL;
}

int gs_ignore_open(struct gs_ignore **out, const char *root, const char *const *excludes,
                   size_t n_excludes, struct gs_error *err)
{
    *out = NULL;
    struct gs_ignore *ig = gs_xcalloc(1, sizeof(*ig));
    int rc = load_excludes(ig, excludes, n_excludes, err);
    if (rc < 0) {
        gs_ignore_free(ig);
        return rc;
    }
    /* libgit2 stays initialised while the rules live, as it did when it matched them: its last
     * shutdown may clean OpenSSL up, under the SSH threads (libssh2) that a daemon starts next */
    git_libgit2_init();
    ig->git_ready = 1;
    if (!open_enclosing_repo(ig, root))
        open_plain(ig, root);
    *out = ig;
    return 0;
}

void gs_ignore_free(struct gs_ignore *ig)
{
    if (!ig)
        return;
    if (ig->git_ready)
        git_libgit2_shutdown();
    for (size_t i = 0; i < ig->n_pats; i++)
        pattern_release(&ig->pats[i]);
    free(ig->pats);
    chain_release(ig);
    free(ig->chain);
    rules_release(&ig->info);
    rules_release(&ig->user);
    free(ig->info_path);
    free(ig->user_path);
    free(ig->comp_v);
    free(ig->end_v);
    gs_buf_release(&ig->workdir);
    gs_buf_release(&ig->prefix);
    gs_buf_release(&ig->chain_dir);
    gs_buf_release(&ig->path);
    gs_buf_release(&ig->file);
    gs_buf_release(&ig->scratch);
    gs_buf_release(&ig->comps);
    free(ig);
}
