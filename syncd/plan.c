/* syncd/plan.c: scan + index -> operations (see plan.h).
 *
 * The scan and the index are merged by path into one sorted array of items (local side, index
 * side). Files are hashed where the stat cache cannot vouch for them; then renames are found
 * (directories first, parents first, then single files), and every item not taken by a rename
 * becomes at most two operations. A last pass assigns phases and sorts. In byte order, the paths
 * below a directory X are one contiguous run starting at the first path >= "X/", which is how a
 * subtree is found without a tree structure. */
#include "syncd/plan.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/path.h"
#include "common/quote.h"
#include "common/wrapper.h"

struct item {
    const char *path;
    const struct gs_scan_entry *l; /* local side, NULL: not (or no longer) there */
    struct gs_index_entry *r;      /* index side, NULL: gpusync never wrote it */
    struct gs_hash lhash;          /* local content hash, files only */
    int has_lhash;
    struct gs_scan_entry *as_read; /* l as it was hashed, when it changed after the scan (rare) */
    int consumed;                  /* taken by a rename */
    int replaced; /* a directory on one side and not the other: delete, then create */
    int clear;    /* an index entry under a replaced directory: deleted in phase 0 */
};

struct planner {
    int rootfd;
    struct gs_index *idx;
    struct gs_plan_opts opts;
    struct gs_index_entry *ix; /* index entries in scope, sorted */
    size_t n_ix, cap_ix;
    struct item *it;
    size_t n, cap;
    size_t n_replaced;
    int64_t racy_after_ns; /* a local mtime at or after this is too recent to cache */
    struct gs_plan *plan;
    struct gs_error *err;
    struct gs_plan_reading read; /* how far hash_all has got */
};

enum { PH_CLEAR, PH_MKDIR_EARLY, PH_RENAME, PH_MKDIR, PH_PUT, PH_SYMLINK, PH_CHMOD, PH_DELETE };

/* ---- paths and scope ---- */

/* 1 when `inner` is `outer` or lies below it ("" holds everything). */
static int path_within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    if (n == 0)
        return 1;
    return strncmp(inner, outer, n) == 0 && (inner[n] == '\0' || inner[n] == '/');
}

/* 1: `path` is in the plan's scope; 2: it is only a parent directory of a path in scope; 0: out. */
static int scope_of(const struct gs_plan_opts *o, const char *path)
{
    if (!o->n_paths)
        return 1;
    int best = 0;
    for (size_t i = 0; i < o->n_paths && best != 1; i++) {
        if (path_within(path, o->paths[i]))
            best = 1;
        else if (path_within(o->paths[i], path))
            best = 2;
    }
    return best;
}

/* ---- loading the index side ---- */

static int collect_entry(const struct gs_index_entry *e, void *ctx)
{
    struct planner *p = ctx;
    GS_ALLOC_GROW(p->ix, p->n_ix + 1, p->cap_ix);
    gs_index_entry_copy(&p->ix[p->n_ix++], e);
    return 0;
}

static int ix_cmp(const void *a, const void *b)
{
    return strcmp(((const struct gs_index_entry *)a)->path,
                  ((const struct gs_index_entry *)b)->path);
}

/* Loads the index entries in scope, sorted, without duplicates (overlapping PATH arguments). */
static int load_index(struct planner *p)
{
    if (!p->opts.n_paths)
        return gs_index_foreach(p->idx, NULL, collect_entry, p, p->err);
    for (size_t i = 0; i < p->opts.n_paths; i++) {
        const char *pre = p->opts.paths[i];
        int rc = gs_index_foreach(p->idx, *pre ? pre : NULL, collect_entry, p, p->err);
        if (rc < 0)
            return rc;
    }
    if (p->n_ix > 1)
        qsort(p->ix, p->n_ix, sizeof(*p->ix), ix_cmp);
    size_t out = 0;
    for (size_t i = 0; i < p->n_ix; i++) {
        if (out && !strcmp(p->ix[out - 1].path, p->ix[i].path))
            gs_index_entry_release(&p->ix[i]);
        else
            p->ix[out++] = p->ix[i];
    }
    p->n_ix = out;
    return 0;
}

/* ---- merging ---- */

static struct item *push_item(struct planner *p, const char *path)
{
    GS_ALLOC_GROW(p->it, p->n + 1, p->cap);
    struct item *it = &p->it[p->n++];
    memset(it, 0, sizeof(*it));
    it->path = path;
    return it;
}

/* Whether a local entry takes part: in scope, or a parent of the scope that the index lacks (so
 * `gpusync push a/b/c.py` creates a/ and a/b/ when needed). Returns 1, 0, or an error. */
static int local_wanted(struct planner *p, const struct gs_scan_entry *e)
{
    int s = scope_of(&p->opts, e->path);
    if (s != 2)
        return s;
    struct gs_index_entry tmp;
    int rc = gs_index_get(p->idx, e->path, &tmp, p->err);
    gs_index_entry_release(&tmp);
    return rc < 0 ? rc : rc == 0 && e->kind == GS_KIND_DIR;
}

/* One pass over two sorted lists. An index entry was loaded only when in scope, so a path on
 * both sides needs no scope check. */
static int merge(struct planner *p, const struct gs_scan *scan)
{
    size_t i = 0, j = 0;
    while (i < scan->n || j < p->n_ix) {
        const struct gs_scan_entry *l = i < scan->n ? &scan->entries[i] : NULL;
        struct gs_index_entry *r = j < p->n_ix ? &p->ix[j] : NULL;
        int c = !l ? 1 : !r ? -1 : strcmp(l->path, r->path);
        if (c < 0) {
            i++;
            int want = local_wanted(p, l);
            if (want <= 0) {
                if (want < 0)
                    return want;
                continue;
            }
            r = NULL;
        } else if (c > 0) {
            j++;
            l = NULL;
        } else {
            i++;
            j++;
        }
        struct item *it = push_item(p, l ? l->path : r->path);
        it->l = l;
        it->r = r;
    }
    return 0;
}

/* ---- hashing ---- */

/* Lists `path` among the files the plan could not read (gs_plan's unreadable). */
static void add_unreadable(struct gs_plan *pl, const char *path, const char *why, uint64_t size,
                           int err_no)
{
    pl->unreadable = gs_xrealloc(pl->unreadable, (pl->n_unreadable + 1) * sizeof(*pl->unreadable));
    pl->unreadable[pl->n_unreadable++] =
        (struct gs_plan_unreadable){gs_xstrdup(path), gs_xstrdup(why), size, err_no};
}

static int stat_matches_cache(const struct gs_scan_entry *l, const struct gs_index_entry *r)
{
    return r && r->kind == GS_KIND_FILE && r->has_hash && r->has_local &&
           r->local_size == l->size && r->local_mtime_ns == l->mtime_ns && r->local_ino == l->ino &&
           r->local_ctime_ns == l->ctime_ns;
}

/* A file modified within the last GS_PLAN_RACY_NS may be modified again within the same
 * filesystem timestamp tick, with the same size: a stat cache taken now could vouch for content
 * it never saw (git's "racily clean" problem). Such a stat is not cached; the file is hashed again
 * next time. */
static int stat_is_racy(const struct planner *p, const struct gs_scan_entry *l)
{
    return l->mtime_ns >= p->racy_after_ns;
}

/* A file gpusync wrote whose content the index knows: a chmod of it carries its mtime too. Not a
 * pulled file (a job's output: its mtime is the job's), nor a folder. */
static int stampable(const struct gs_index_entry *r)
{
    return r->kind == GS_KIND_FILE && r->has_hash && !r->pulled;
}

/* Mode changes matter for files and directories; a symlink's own mode means nothing on Linux. */
static int mode_changed(const struct gs_index_entry *r, const struct gs_scan_entry *l)
{
    return l->kind != GS_KIND_SYMLINK && r->mode != l->mode;
}

/* What a chmod carries changed: the mode, or for a file it may stamp, the mtime (a touch). */
static int meta_changed(const struct gs_index_entry *r, const struct gs_scan_entry *l)
{
    return mode_changed(r, l) ||
           (l->kind == GS_KIND_FILE && stampable(r) && r->mtime_ns != l->mtime_ns);
}

/* A file whose content is what the server holds: remember the new stat. Unchanged, unless its
 * mode or mtime differ from the server's (then a chmod sends them). */
static int refresh_cache(struct planner *p, const struct item *it)
{
    p->plan->n_refreshed += !meta_changed(it->r, it->l);
    if (p->opts.no_refresh || stat_is_racy(p, it->l))
        return 0;
    return gs_index_set_local(p->idx, it->path, it->l->size, it->l->mtime_ns, it->l->ino,
                              it->l->ctime_ns, p->err);
}

/* 1 when `path` is gone or is no longer a regular file (a hash of it failed for that reason);
 * 0 when it still is one, so the failure was a real read error. */
static int no_longer_a_file(const struct planner *p, const char *path)
{
    struct stat st;
    if (fstatat(p->rootfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT || errno == ENOTDIR;
    return !S_ISREG(st.st_mode);
}

/* A file written between the scan and its reading is planned with the size and mtime it had when
 * read, so that the hash, the size and the mtime of its put describe one version. Caught inside a
 * save (truncated, not yet written) it is then a fresh empty file, which the watch daemon holds
 * back, not an old size with empty bytes, which nothing would. */
static void take_stat_as_read(struct item *it, const struct stat *after)
{
    int64_t mtime_ns = gs_time_ns(after->st_mtim.tv_sec, after->st_mtim.tv_nsec);
    int64_t ctime_ns = gs_time_ns(after->st_ctim.tv_sec, after->st_ctim.tv_nsec);
    if ((uint64_t)after->st_size == it->l->size && mtime_ns == it->l->mtime_ns &&
        ctime_ns == it->l->ctime_ns)
        return;
    it->as_read = gs_xmalloc(sizeof(*it->as_read));
    *it->as_read = *it->l; /* path and link stay the scan's */
    it->as_read->size = (uint64_t)after->st_size;
    it->as_read->mtime_ns = mtime_ns;
    it->as_read->ino = (uint64_t)after->st_ino;
    it->as_read->ctime_ns = ctime_ns;
    it->l = it->as_read;
}

/* Whether an item is a file the plan must read: its stat differs from the index's cache. */
static int must_read(const struct item *it)
{
    return it->l && it->l->kind == GS_KIND_FILE && !stat_matches_cache(it->l, it->r);
}

/* gs_hash_check's callback: `bytes` of the file being read, on top of the files before it. */
static int reading_file(void *ctx, uint64_t bytes)
{
    struct planner *p = ctx;
    struct gs_plan_reading r = p->read;
    r.bytes_done += bytes;
    r.bytes_done = r.bytes_done < r.bytes_total ? r.bytes_done : r.bytes_total;
    return p->opts.reading(p->opts.reading_ctx, &r);
}

static int hash_item(struct planner *p, struct item *it)
{
    if (stat_matches_cache(it->l, it->r)) {
        it->lhash = it->r->hash;
        it->has_lhash = 1;
        return 0;
    }
    struct gs_error herr = {0};
    struct stat after;
    struct gs_hash_check check = {.fn = reading_file, .ctx = p};
    int rc = gs_hash_file_at(p->rootfd, it->path, &it->lhash, &after,
                             p->opts.reading ? &check : NULL, &herr);
    if (rc == GS_E_NOTFOUND || (rc < 0 && no_longer_a_file(p, it->path))) {
        /* removed, or replaced by a symlink or a directory, since the scan: plan it as removed.
         * That change came after the scan, so the watcher reports it and the next push sends
         * what is there now; failing the whole plan instead would hold back every other path. */
        it->l = NULL;
        return 0;
    }
    if (rc == GS_E_IO) { /* unreadable here (permission): left alone, reported as failed */
        add_unreadable(p->plan, it->path, herr.msg, it->l->size, EACCES);
        it->consumed = 1; /* no operation, and no part in a rename */
        return 0;
    }
    if (rc < 0)
        return gs_error_set(p->err, rc, "%s", herr.msg);
    take_stat_as_read(it, &after);
    p->plan->n_hashed++;
    it->has_lhash = 1;
    const struct gs_index_entry *r = it->r;
    if (r && r->kind == GS_KIND_FILE && r->has_hash && gs_hash_equal(&r->hash, &it->lhash))
        return refresh_cache(p, it);
    return 0;
}

static int hash_all(struct planner *p)
{
    for (size_t i = 0; i < p->n; i++)
        if (must_read(&p->it[i])) {
            p->read.files_total++;
            p->read.bytes_total += p->it[i].l->size;
        }
    for (size_t i = 0; i < p->n; i++) {
        struct item *it = &p->it[i];
        /* every few files: a poll per file would cost a tree of small files more than its hashes */
        if (p->opts.reading && i % 16 == 0 && p->opts.reading(p->opts.reading_ctx, &p->read))
            return gs_error_set(p->err, GS_E_INTERRUPTED, "planning stopped");
        if (it->l && it->l->kind == GS_KIND_FILE) {
            int read = must_read(it);
            uint64_t size = it->l->size;
            int rc = hash_item(p, it);
            if (rc < 0)
                return rc;
            p->read.files_done += read;
            p->read.bytes_done += read ? size : 0;
        }
    }
    return 0;
}

/* An index path that is ignored now is not the scan's to judge: keep it on the server. */
static int keep_ignored(struct planner *p)
{
    for (size_t i = 0; i < p->n && p->opts.ignore; i++) {
        struct item *it = &p->it[i];
        if (it->l || !it->r)
            continue;
        int rc = gs_ignore_path(p->opts.ignore, it->path, it->r->kind == GS_KIND_DIR, p->err);
        if (rc < 0)
            return rc;
        it->consumed = rc;
    }
    return 0;
}

/* A pulled file (index.h, `pulled`) that is no longer here was deleted here: the server's copy is
 * its writer's (a job's output), so no operation touches it and the index forgets it (not with
 * opts->no_refresh). One the scan did not list but that is still here (ignored, changed since the
 * scan) is left alone, entry and all. Either way it takes no part in a rename: moving a pulled file
 * here makes a new file, and leaves the job's where the job wrote it. */
static int forget_pulled(struct planner *p)
{
    for (size_t i = 0; i < p->n; i++) {
        struct item *it = &p->it[i];
        if (it->l || !it->r || !it->r->pulled || it->consumed || it->clear)
            continue;
        it->consumed = 1;
        struct stat st;
        if (fstatat(p->rootfd, it->path, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
            (errno != ENOENT && errno != ENOTDIR) || p->opts.no_refresh)
            continue;
        int rc = gs_index_delete(p->idx, it->path, p->err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- subtrees ---- */

/* Index of the first item whose path is >= key. */
static size_t lower_bound(const struct planner *p, const char *key)
{
    return gs_path_lower_bound(p->it, p->n, sizeof(*p->it), offsetof(struct item, path), key);
}

/* The index's items at `path` and below it, not listed here: no operation, no part in a rename. */
static void keep_on_server(struct planner *p, const char *path)
{
    struct gs_buf below = GS_BUF_INIT;
    gs_buf_addf(&below, "%s/", path);
    size_t i = lower_bound(p, path);
    if (i < p->n && !strcmp(p->it[i].path, path) && !p->it[i].l)
        p->it[i].consumed = 1;
    for (i = lower_bound(p, below.data); i < p->n && path_within(p->it[i].path, path); i++)
        if (!p->it[i].l)
            p->it[i].consumed = 1;
    gs_buf_release(&below);
}

/* A path too long to open (the scan's too_long): reported as unreadable, and every index path at
 * or below it kept on the server, as the scan could not say whether it is still here. */
static void keep_too_long(struct planner *p, const struct gs_scan *scan)
{
    for (size_t t = 0; t < scan->n_too_long; t++) {
        const char *path = scan->too_long[t];
        if (!scope_of(&p->opts, path))
            continue;
        struct gs_buf why = GS_BUF_INIT;
        gs_buf_addf(&why,
                    "%s: the path is longer than this system can open (%d bytes with the "
                    "project's folder); shorten it or add it to [sync] exclude",
                    path, PATH_MAX);
        add_unreadable(p->plan, path, why.data, 0, ENAMETOOLONG);
        gs_buf_release(&why);
        keep_on_server(p, path);
    }
}

/* The items strictly below item i: [*begin, *end). */
static void subtree_range(const struct planner *p, size_t i, size_t *begin, size_t *end)
{
    size_t len = strlen(p->it[i].path);
    char *key = gs_xmalloc(len + 2);
    memcpy(key, p->it[i].path, len);
    key[len] = '/';
    key[len + 1] = '\0';
    size_t k = lower_bound(p, key);
    *begin = k;
    while (k < p->n && strncmp(p->it[k].path, key, len + 1) == 0)
        k++;
    *end = k;
    free(key);
}

/* The item for exactly `path`, or NULL. */
static struct item *find_item(const struct planner *p, const char *path)
{
    size_t k = lower_bound(p, path);
    return k < p->n && !strcmp(p->it[k].path, path) ? &p->it[k] : NULL;
}

/* 1 when a directory above `path` changes kind: a rename must not move into or out of it, since
 * it is deleted and re-created around the renames. */
static int under_replaced(const struct planner *p, const char *path)
{
    if (!p->n_replaced)
        return 0;
    char *copy = gs_xstrdup(path);
    int found = 0;
    for (char *s = strrchr(copy, '/'); s && !found; s = strrchr(copy, '/')) {
        *s = '\0';
        const struct item *it = find_item(p, copy);
        found = it && it->replaced;
    }
    free(copy);
    return found;
}

static int kind_differs_with_dir(const struct item *it)
{
    return it->l && it->r && it->l->kind != it->r->kind &&
           (it->l->kind == GS_KIND_DIR || it->r->kind == GS_KIND_DIR);
}

static void mark_replaced(struct planner *p)
{
    for (size_t i = 0; i < p->n; i++) {
        struct item *it = &p->it[i];
        if (!kind_differs_with_dir(it))
            continue;
        it->replaced = 1;
        p->n_replaced++;
        if (it->r->kind != GS_KIND_DIR)
            continue;
        size_t b, e;
        subtree_range(p, i, &b, &e);
        for (size_t k = b; k < e; k++)
            p->it[k].clear = p->it[k].r != NULL;
    }
}

/* ---- building operations ---- */

static struct gs_plan_op *push_op(struct planner *p, enum gs_op_type type, const char *path,
                                  int phase)
{
    struct gs_plan *pl = p->plan;
    GS_ALLOC_GROW(pl->ops, pl->n_ops + 1, pl->cap);
    struct gs_plan_op *op = &pl->ops[pl->n_ops++];
    memset(op, 0, sizeof(*op));
    op->type = type;
    op->path = gs_xstrdup(path);
    op->phase = phase;
    return op;
}

/* The server holds what the index says: expect that. */
static void expect_from_index(struct gs_plan_expect *ex, const struct gs_index_entry *r)
{
    memset(ex, 0, sizeof(*ex));
    if (r->kind == GS_KIND_DIR) {
        ex->kind = GS_EXPECT_DIR;
    } else if (r->kind == GS_KIND_SYMLINK) {
        ex->kind = GS_EXPECT_SYMLINK;
        ex->link = gs_xstrdup(r->link ? r->link : "");
    } else {
        ex->kind = GS_EXPECT_FILE;
        if (r->has_hash) /* else an all-zero hash: never matches, the agent keeps a copy */
            ex->hash = r->hash;
    }
}

static void set_local(const struct planner *p, struct gs_index_entry *rec,
                      const struct gs_scan_entry *l)
{
    rec->has_local = !stat_is_racy(p, l);
    rec->local_size = l->size;
    rec->local_mtime_ns = l->mtime_ns;
    rec->local_ino = l->ino;
    rec->local_ctime_ns = l->ctime_ns;
}

/* The entry for a path created from the local tree. */
static void record_from_local(const struct planner *p, struct gs_index_entry *rec,
                              const struct item *it)
{
    const struct gs_scan_entry *l = it->l;
    memset(rec, 0, sizeof(*rec));
    rec->path = gs_xstrdup(l->path);
    rec->link = l->link ? gs_xstrdup(l->link) : NULL;
    rec->kind = l->kind;
    rec->mode = l->mode;
    rec->size = l->kind == GS_KIND_DIR ? 0 : l->size;
    rec->mtime_ns = l->mtime_ns;
    rec->has_hash = it->has_lhash;
    rec->hash = it->lhash;
    set_local(p, rec, l);
}

/* What the server holds for `r` once it sits at dst's path (after a rename or a chmod), with the
 * local stat of `dst`. */
static void record_moved(const struct planner *p, struct gs_index_entry *rec,
                         const struct gs_index_entry *r, const struct item *dst)
{
    gs_index_entry_copy(rec, r);
    free(rec->path);
    rec->path = gs_xstrdup(dst->path);
    rec->pulled = 0; /* a change made here, sent: gpusync's from now on */
    set_local(p, rec, dst->l);
}

static void emit_chmod(struct planner *p, const struct gs_index_entry *r, const struct item *dst)
{
    struct gs_plan_op *op = push_op(p, GS_OP_CHMOD, dst->path, PH_CHMOD);
    expect_from_index(&op->expect, r);
    op->stamp = stampable(r);
    record_moved(p, &op->record, r, dst);
    op->record.mode = dst->l->mode;
    if (op->stamp)
        op->record.mtime_ns = dst->l->mtime_ns;
}

static void emit_rename(struct planner *p, struct item *from, struct item *to, int subtree)
{
    struct gs_plan_op *op = push_op(p, GS_OP_RENAME, to->path, PH_RENAME);
    op->from = gs_xstrdup(from->path);
    op->subtree = subtree;
    expect_from_index(&op->expect, from->r);
    record_moved(p, &op->record, from->r, to);
    from->consumed = to->consumed = 1;
    if (meta_changed(from->r, to->l))
        emit_chmod(p, from->r, to);
}

static void emit_create(struct planner *p, const struct item *it, const struct gs_index_entry *old)
{
    static const enum gs_op_type type[] = {
        [GS_KIND_FILE] = GS_OP_PUT, [GS_KIND_DIR] = GS_OP_MKDIR, [GS_KIND_SYMLINK] = GS_OP_SYMLINK};
    static const int phase[] = {
        [GS_KIND_FILE] = PH_PUT, [GS_KIND_DIR] = PH_MKDIR, [GS_KIND_SYMLINK] = PH_SYMLINK};
    enum gs_kind k = it->l->kind;
    struct gs_plan_op *op = push_op(p, type[k], it->path, phase[k]);
    if (old)
        expect_from_index(&op->expect, old);
    else
        op->expect.kind = GS_EXPECT_ABSENT;
    record_from_local(p, &op->record, it);
    if (k == GS_KIND_FILE)
        p->plan->bytes_to_send += it->l->size;
}

static void emit_delete(struct planner *p, const struct item *it, int phase)
{
    struct gs_plan_op *op = push_op(p, GS_OP_DELETE, it->path, phase);
    expect_from_index(&op->expect, it->r);
}

/* Same path, same kind on both sides. */
static void emit_change(struct planner *p, const struct item *it)
{
    const struct gs_index_entry *r = it->r;
    const struct gs_scan_entry *l = it->l;
    int content = 0;
    if (l->kind == GS_KIND_FILE)
        content = !r->has_hash || !gs_hash_equal(&r->hash, &it->lhash);
    else if (l->kind == GS_KIND_SYMLINK)
        content = strcmp(r->link ? r->link : "", l->link ? l->link : "") != 0;
    if (content)
        emit_create(p, it, r);
    else if (meta_changed(r, l))
        emit_chmod(p, r, it);
}

static void emit_rest(struct planner *p)
{
    for (size_t i = 0; i < p->n; i++) {
        const struct item *it = &p->it[i];
        if (it->consumed || (!it->l && !it->r))
            continue;
        if (!it->l) {
            emit_delete(p, it, it->clear ? PH_CLEAR : PH_DELETE);
        } else if (!it->r) {
            emit_create(p, it, NULL);
        } else if (it->replaced) {
            emit_delete(p, it, PH_CLEAR);
            emit_create(p, it, NULL);
        } else if (it->l->kind != it->r->kind) {
            emit_create(p, it, it->r); /* file <-> symlink: replaced in place */
        } else {
            emit_change(p, it);
        }
    }
}

/* ---- directory renames ---- */

static int gone_dir(const struct item *it)
{
    return !it->l && it->r && it->r->kind == GS_KIND_DIR && !it->clear && !it->consumed;
}

static int new_dir(const struct planner *p, const struct item *it)
{
    return it->l && !it->r && it->l->kind == GS_KIND_DIR && !it->consumed &&
           !under_replaced(p, it->path);
}

/* Feeds one subtree member into a signature: relative path, kind, content. 0 when it cannot
 * take part (no hash, or not wholly gone / wholly new). */
static int sig_add(XXH3_state_t *st, const struct item *c, size_t skip, int gone)
{
    if (c->consumed || (gone ? c->l || !c->r || c->clear : !c->l || c->r))
        return 0;
    unsigned char kind = (unsigned char)(gone ? c->r->kind : c->l->kind);
    const char *link = gone ? c->r->link : c->l->link;
    const struct gs_hash *h =
        gone ? (c->r->has_hash ? &c->r->hash : NULL) : (c->has_lhash ? &c->lhash : NULL);
    if (kind == GS_KIND_FILE && !h)
        return 0;
    XXH3_128bits_update(st, c->path + skip, strlen(c->path + skip) + 1);
    XXH3_128bits_update(st, &kind, 1);
    if (kind == GS_KIND_FILE)
        XXH3_128bits_update(st, h->b, GS_HASH_LEN);
    else if (kind == GS_KIND_SYMLINK && link)
        XXH3_128bits_update(st, link, strlen(link) + 1);
    return 1;
}

/* Hashes what lies below directory item i (relative paths, kinds, hashes, link targets) from the
 * index side (gone) or the local side. Returns 1 and the signature, or 0 when it cannot match. */
static int dir_signature(const struct planner *p, size_t i, int gone, struct gs_hash *out,
                         size_t *count)
{
    size_t b, e, skip = strlen(p->it[i].path) + 1;
    subtree_range(p, i, &b, &e);
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        gs_out_of_memory(0); /* a size xxhash does not tell */
    XXH3_128bits_reset(st);
    int ok = 1;
    for (size_t k = b; k < e && ok; k++)
        ok = sig_add(st, &p->it[k], skip, gone);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out->b, c.digest, GS_HASH_LEN);
    XXH3_freeState(st);
    *count = e - b;
    return ok;
}

struct dir_cand {
    size_t item;
    size_t count;
    struct gs_hash sig;
};

/* Turns a matched pair into one rename, with chmods where modes differ below it. */
static void emit_dir_rename(struct planner *p, size_t gi, size_t ni)
{
    size_t gb, ge, nb, ne;
    subtree_range(p, gi, &gb, &ge);
    subtree_range(p, ni, &nb, &ne);
    emit_rename(p, &p->it[gi], &p->it[ni], 1);
    for (size_t g = gb, n = nb; g < ge && n < ne; g++, n++) {
        p->it[g].consumed = p->it[n].consumed = 1;
        if (meta_changed(p->it[g].r, p->it[n].l))
            emit_chmod(p, p->it[g].r, &p->it[n]);
    }
}

/* Finds a gone directory with the same signature whose subtree is still wholly available. */
static struct dir_cand *match_gone(struct planner *p, struct dir_cand *g, size_t ng,
                                   const struct gs_hash *sig, size_t count)
{
    for (size_t k = 0; k < ng; k++) {
        if (g[k].count != count || !gs_hash_equal(&g[k].sig, sig) || !gone_dir(&p->it[g[k].item]))
            continue;
        struct gs_hash now;
        size_t c2;
        if (dir_signature(p, g[k].item, 1, &now, &c2) && gs_hash_equal(&now, sig))
            return &g[k];
    }
    return NULL;
}

static void find_dir_renames(struct planner *p)
{
    struct dir_cand *g = NULL;
    size_t ng = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!gone_dir(&p->it[i]))
            continue;
        g = gs_xrealloc(g, (ng + 1) * sizeof(*g));
        g[ng].item = i;
        if (dir_signature(p, i, 1, &g[ng].sig, &g[ng].count))
            ng++;
    }
    for (size_t i = 0; i < p->n && ng; i++) {
        struct gs_hash sig;
        size_t count;
        if (!new_dir(p, &p->it[i]) || !dir_signature(p, i, 0, &sig, &count))
            continue;
        struct dir_cand *m = match_gone(p, g, ng, &sig, count);
        if (m)
            emit_dir_rename(p, m->item, i);
    }
    free(g);
}

/* ---- file renames ---- */

struct gone_file {
    struct gs_hash hash;
    size_t item;
};

static int gone_file_cmp(const void *a, const void *b)
{
    const struct gone_file *x = a, *y = b;
    int c = memcmp(x->hash.b, y->hash.b, GS_HASH_LEN);
    return c ? c : (x->item > y->item) - (x->item < y->item);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Among the gone files with `hash`, the first still free, preferring one with the same name. */
static struct item *pick_gone(struct planner *p, const struct gone_file *g, size_t ng,
                              const struct item *dst)
{
    size_t lo = 0, hi = ng;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (memcmp(g[mid].hash.b, dst->lhash.b, GS_HASH_LEN) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    struct item *first = NULL;
    for (size_t k = lo; k < ng && gs_hash_equal(&g[k].hash, &dst->lhash); k++) {
        struct item *it = &p->it[g[k].item];
        if (it->consumed)
            continue;
        if (!strcmp(base_name(it->path), base_name(dst->path)))
            return it;
        if (!first)
            first = it;
    }
    return first;
}

static int gone_file(const struct item *it)
{
    return !it->l && it->r && it->r->kind == GS_KIND_FILE && it->r->has_hash && !it->consumed &&
           !it->clear;
}

static int new_file(const struct planner *p, const struct item *it)
{
    return it->l && !it->r && it->l->kind == GS_KIND_FILE && it->has_lhash && !it->consumed &&
           !under_replaced(p, it->path);
}

static void find_file_renames(struct planner *p)
{
    struct gone_file *g = NULL;
    size_t ng = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!gone_file(&p->it[i]))
            continue;
        g = gs_xrealloc(g, (ng + 1) * sizeof(*g));
        g[ng].hash = p->it[i].r->hash;
        g[ng++].item = i;
    }
    if (ng > 1)
        qsort(g, ng, sizeof(*g), gone_file_cmp);
    for (size_t i = 0; i < p->n && ng; i++) {
        struct item *dst = &p->it[i];
        struct item *src = new_file(p, dst) ? pick_gone(p, g, ng, dst) : NULL;
        if (src)
            emit_rename(p, src, dst, 0);
    }
    free(g);
}

/* ---- order ---- */

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A mkdir that a rename's destination needs must come before the renames. */
static void hoist_mkdirs(struct gs_plan *pl)
{
    char **dst = gs_xcalloc(pl->n_ops + 1, sizeof(*dst));
    size_t nd = 0;
    for (size_t i = 0; i < pl->n_ops; i++)
        if (pl->ops[i].type == GS_OP_RENAME)
            dst[nd++] = pl->ops[i].path;
    if (nd > 1)
        qsort(dst, nd, sizeof(*dst), str_ptr_cmp);
    for (size_t i = 0; i < pl->n_ops && nd; i++) {
        struct gs_plan_op *op = &pl->ops[i];
        if (op->type != GS_OP_MKDIR)
            continue;
        size_t len = strlen(op->path), lo = 0, hi = nd;
        while (lo < hi) { /* first destination >= op->path */
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(dst[mid], op->path) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t k = lo; k < nd && !strncmp(dst[k], op->path, len); k++)
            if (dst[k][len] == '/')
                op->phase = PH_MKDIR_EARLY;
    }
    free(dst);
}

static int op_cmp(const void *a, const void *b)
{
    const struct gs_plan_op *x = a, *y = b;
    if (x->phase != y->phase)
        return x->phase - y->phase;
    int c = strcmp(x->path, y->path);
    if (x->phase == PH_CLEAR || x->phase == PH_DELETE)
        c = -c; /* children before their parents */
    return c ? c : (int)x->type - (int)y->type;
}

/* ---- public ---- */

static void planner_release(struct planner *p)
{
    for (size_t i = 0; i < p->n_ix; i++)
        gs_index_entry_release(&p->ix[i]);
    free(p->ix);
    for (size_t i = 0; i < p->n; i++)
        free(p->it[i].as_read);
    free(p->it);
    if (p->rootfd >= 0)
        close(p->rootfd);
}

int gs_plan_build(struct gs_plan *plan, const char *root, const struct gs_scan *scan,
                  struct gs_index *idx, const struct gs_plan_opts *opts, struct gs_error *err)
{
    struct planner p = {.idx = idx, .plan = plan, .err = err};
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    p.racy_after_ns = gs_time_ns(now.tv_sec, now.tv_nsec) - GS_PLAN_RACY_NS;
    if (opts)
        p.opts = *opts;
    p.rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = p.rootfd < 0 ? gs_error_errno(err, GS_E_IO, "cannot open project directory %s", root)
                          : load_index(&p);
    if (rc == 0)
        rc = merge(&p, scan);
    if (rc == 0)
        rc = hash_all(&p);
    if (rc == 0) {
        keep_too_long(&p, scan);
        rc = keep_ignored(&p);
    }
    if (rc == 0) {
        mark_replaced(&p);
        rc = forget_pulled(&p);
    }
    if (rc == 0) {
        find_dir_renames(&p);
        find_file_renames(&p);
        emit_rest(&p);
        hoist_mkdirs(plan);
        if (plan->n_ops > 1)
            qsort(plan->ops, plan->n_ops, sizeof(*plan->ops), op_cmp);
    }
    planner_release(&p);
    if (rc < 0)
        gs_plan_release(plan);
    return rc;
}

static void op_release(struct gs_plan_op *op)
{
    free(op->path);
    free(op->from);
    free(op->expect.link);
    gs_index_entry_release(&op->record);
}

void gs_plan_remove_if(struct gs_plan *plan, int (*drop)(void *ctx, const struct gs_plan_op *op),
                       void *ctx)
{
    size_t kept = 0;
    for (size_t i = 0; i < plan->n_ops; i++) {
        struct gs_plan_op *op = &plan->ops[i];
        if (!drop(ctx, op)) {
            plan->ops[kept++] = *op;
            continue;
        }
        if (op->type == GS_OP_PUT)
            plan->bytes_to_send -= op->record.size;
        op_release(op);
    }
    plan->n_ops = kept;
}

void gs_plan_release(struct gs_plan *plan)
{
    for (size_t i = 0; i < plan->n_ops; i++)
        op_release(&plan->ops[i]);
    free(plan->ops);
    for (size_t i = 0; i < plan->n_unreadable; i++) {
        free(plan->unreadable[i].path);
        free(plan->unreadable[i].why);
    }
    free(plan->unreadable);
    memset(plan, 0, sizeof(*plan));
}

int gs_plan_record(struct gs_index *idx, const struct gs_plan_op *op, struct gs_error *err)
{
    switch (op->type) {
    case GS_OP_DELETE:
        return gs_index_delete(idx, op->path, err);
    case GS_OP_RENAME: {
        int rc = gs_index_rename(idx, op->from, op->path, err);
        return rc < 0 ? rc : gs_index_put(idx, &op->record, err);
    }
    default:
        return gs_index_put(idx, &op->record, err);
    }
}

const char *gs_plan_op_name(enum gs_op_type type)
{
    static const char *const names[] = {
        [GS_OP_RENAME] = "rename",   [GS_OP_MKDIR] = "mkdir", [GS_OP_PUT] = "put",
        [GS_OP_SYMLINK] = "symlink", [GS_OP_CHMOD] = "chmod", [GS_OP_DELETE] = "delete"};
    return (unsigned)type < sizeof(names) / sizeof(names[0]) ? names[type] : "?";
}

void gs_plan_quote_path(struct gs_buf *out, const char *path)
{
    /* a dry run's line also quotes a name with a space, or none: "put a b (1 bytes)" is ambiguous
     */
    if (!*path || strchr(path, ' ') || gs_quote_needed(path))
        gs_quote_always(out, path);
    else
        gs_buf_adds(out, path);
}

void gs_plan_op_format(const struct gs_plan_op *op, struct gs_buf *out)
{
    gs_buf_addf(out, "%-8s ", gs_plan_op_name(op->type));
    if (op->type == GS_OP_RENAME) {
        gs_plan_quote_path(out, op->from);
        gs_buf_adds(out, op->subtree ? "/ -> " : " -> ");
    }
    gs_plan_quote_path(out, op->path);
    switch (op->type) {
    case GS_OP_RENAME:
    case GS_OP_MKDIR:
        if (op->type == GS_OP_MKDIR || op->subtree)
            gs_buf_addc(out, '/');
        break;
    case GS_OP_PUT:
        gs_buf_addf(out, " (%llu bytes, %s)", (unsigned long long)op->record.size,
                    op->expect.kind == GS_EXPECT_ABSENT ? "new" : "changed");
        break;
    case GS_OP_SYMLINK:
        gs_buf_adds(out, " -> ");
        gs_plan_quote_path(out, op->record.link ? op->record.link : "");
        break;
    case GS_OP_CHMOD:
        gs_buf_addf(out, " %04o", op->record.mode);
        break;
    case GS_OP_DELETE:
        if (op->expect.kind == GS_EXPECT_DIR)
            gs_buf_addc(out, '/');
        break;
    }
}
