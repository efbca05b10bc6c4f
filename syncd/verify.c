/* syncd/verify.c: the server still holds what the index says gpusync wrote (see verify.h). */
#include "syncd/verify.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/buf.h"
#include "common/log.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "syncd/hash.h"

/* The index's entries, copied out (the walk must not write to the index), and their paths. */
struct entries {
    struct gs_index_entry *v;
    size_t n, cap;
};

/* Takes the entries the server is checked against: not a pulled file's (index.h, `pulled`), which
 * is the server's, whoever writes it there (a job's next checkpoint is neither lost nor put back).
 */
static int collect(const struct gs_index_entry *e, void *ctx)
{
    struct entries *all = ctx;
    if (e->pulled)
        return 0;
    GS_ALLOC_GROW(all->v, all->n + 1, all->cap);
    gs_index_entry_copy(&all->v[all->n++], e);
    return 0;
}

static void entries_release(struct entries *all)
{
    for (size_t i = 0; i < all->n; i++)
        gs_index_entry_release(&all->v[i]);
    free(all->v);
}

/* The server's set-id bits are always cleared (agent/fs.c), whatever the local mode says. */
#define COMPARED_MODE_BITS (07777 & ~06000u)

enum finding { SAME, GONE, CONTENT, MODE, UNTOLD };

static enum finding compare(const struct gs_index_entry *e, const struct gs_fop_stat *s)
{
    if (s->kind == GS_FOP_KIND_UNKNOWN)
        return UNTOLD;
    if (s->kind == GS_FOP_KIND_NONE)
        return GONE;
    if ((int)s->kind != (int)e->kind)
        return CONTENT;
    if (e->kind == GS_KIND_FILE &&
        (s->size != e->size || gs_time_sec(s->mtime_ns, NULL) != gs_time_sec(e->mtime_ns, NULL)))
        return CONTENT;
    if (e->kind == GS_KIND_SYMLINK) {
        struct gs_hash h;
        gs_hash_link(e->link, &h);
        return s->has_hash && memcmp(s->hash, h.b, GS_HASH_LEN) == 0 ? SAME : CONTENT;
    }
    return (s->mode ^ e->mode) & COMPARED_MODE_BITS ? MODE : SAME;
}

/* Records what the server was found to hold instead of `e` (see verify.h). */
static int correct(struct gs_index *idx, struct gs_index_entry *e, enum finding f,
                   const struct gs_fop_stat *s, struct gs_error *err)
{
    if (f == GONE)
        return e->kind == GS_KIND_DIR ? gs_index_delete_subtree(idx, e->path, err)
                                      : gs_index_delete(idx, e->path, err);
    if (f == MODE) {
        e->mode = s->mode & 07777;
        return gs_index_put(idx, e, err);
    }
    /* A folder that is something else there now took what it held along: what lies below it
     * leaves the index too, so that it is all sent again into the folder the plan makes. */
    if (e->kind == GS_KIND_DIR) {
        int rc = gs_index_delete_subtree(idx, e->path, err);
        if (rc < 0)
            return rc;
    }
    /* unknown content: a plan sends the local copy, expecting what no file holds, so the agent
     * keeps the server's as a conflict copy (plan.c, expect_from_index) */
    free(e->link);
    e->link = NULL;
    e->kind = GS_KIND_FILE;
    e->has_hash = 0;
    e->has_local = 0;
    e->size = s->size;
    e->mtime_ns = s->mtime_ns;
    return gs_index_put(idx, e, err);
}

/* 1 when the index still says what it said when the check was sent (a sync that ran meanwhile
 * has not rewritten the entry, whose finding is then out of date). */
static int still_believed(struct gs_index *idx, const struct gs_index_entry *then, int *rc,
                          struct gs_error *err)
{
    struct gs_index_entry now;
    int found = gs_index_get(idx, then->path, &now, err);
    if (found < 0)
        *rc = found;
    int same = found == 1 && now.kind == then->kind && now.mode == then->mode &&
               now.size == then->size && now.mtime_ns == then->mtime_ns &&
               now.has_hash == then->has_hash &&
               (!now.has_hash || memcmp(&now.hash, &then->hash, sizeof(now.hash)) == 0) &&
               strcmp(now.link ? now.link : "", then->link ? then->link : "") == 0;
    gs_index_entry_release(&now);
    return same;
}

/* ---- a copy of the entries kept between checks (gs_verify_copy) ---- */

#define TOUCHED_MAX 4096 /* writes noted before reading everything again costs less */

struct touched {
    char *path;
    int subtree;
};

struct gs_verify_copy {
    struct gs_index *idx; /* what it copies (its writes are noted), NULL before the first read */
    int64_t data_version; /* idx's when read: another connection's commit changes it */
    struct entries all;   /* in path order */
    struct touched *t;    /* written since, to read again */
    size_t nt, tcap;
    int reread; /* too much was written, or everything: read it all again */
};

static void touched_clear(struct gs_verify_copy *c)
{
    for (size_t i = 0; i < c->nt; i++)
        free(c->t[i].path);
    c->nt = 0;
}

static void note_write(void *ctx, const char *path, int subtree)
{
    struct gs_verify_copy *c = ctx;
    if (c->reread)
        return;
    if (c->nt == TOUCHED_MAX || (subtree && !*path)) {
        touched_clear(c);
        c->reread = 1;
        return;
    }
    GS_ALLOC_GROW(c->t, c->nt + 1, c->tcap);
    c->t[c->nt++] = (struct touched){gs_xstrdup(path), subtree};
}

struct gs_verify_copy *gs_verify_copy_new(void)
{
    return gs_xcalloc(1, sizeof(struct gs_verify_copy));
}

void gs_verify_copy_reset(struct gs_verify_copy *c)
{
    if (!c)
        return;
    if (c->idx)
        gs_index_on_write(c->idx, NULL, NULL);
    c->idx = NULL;
    entries_release(&c->all);
    memset(&c->all, 0, sizeof(c->all));
    touched_clear(c);
    c->reread = 0;
}

void gs_verify_copy_free(struct gs_verify_copy *c)
{
    gs_verify_copy_reset(c);
    if (c)
        free(c->t);
    free(c);
}

/* The first entry whose path is not below `key` in path order. */
static size_t lower_bound(const struct entries *all, const char *key)
{
    return gs_path_lower_bound(all->v, all->n, sizeof(*all->v),
                               offsetof(struct gs_index_entry, path), key);
}

/* Replaces entries [from, to) of `all` with got[0..n) (moved in). */
static void splice(struct entries *all, size_t from, size_t to, struct entries *got)
{
    for (size_t i = from; i < to; i++)
        gs_index_entry_release(&all->v[i]);
    size_t n = all->n - (to - from) + got->n;
    GS_ALLOC_GROW(all->v, n, all->cap);
    if (all->n > to) /* all->v may be NULL when empty, which memmove may not be given */
        memmove(&all->v[from + got->n], &all->v[to], (all->n - to) * sizeof(*all->v));
    if (got->n)
        memcpy(&all->v[from], got->v, got->n * sizeof(*got->v));
    all->n = n;
    free(got->v);
    memset(got, 0, sizeof(*got));
}

/* Reads `path` again (and with subtree, what lies below it). */
static int reread_path(struct gs_verify_copy *c, const char *path, int subtree,
                       struct gs_error *err)
{
    struct entries got = {0};
    GS_ALLOC_GROW(got.v, 1, got.cap);
    int rc = gs_index_get(c->idx, path, &got.v[0], err);
    if (rc < 0) {
        free(got.v);
        return rc;
    }
    got.n = (size_t)rc;
    if (got.n && got.v[0].pulled) { /* not checked (collect) */
        gs_index_entry_release(&got.v[0]);
        got.n = 0;
    }
    size_t at = lower_bound(&c->all, path);
    splice(&c->all, at, at + (at < c->all.n && strcmp(c->all.v[at].path, path) == 0), &got);
    if (!subtree)
        return 0;
    /* what lies below: the run of paths that start "path/" (not contiguous with "path" itself:
     * "path-x" sorts between) */
    struct gs_buf below = GS_BUF_INIT;
    gs_buf_addf(&below, "%s/", path);
    size_t from = lower_bound(&c->all, below.data), to = from;
    while (to < c->all.n && strncmp(c->all.v[to].path, below.data, below.len) == 0)
        to++;
    rc = gs_index_foreach(c->idx, path, collect, &got, err);
    if (rc == 0 && got.n && strcmp(got.v[0].path, path) == 0) { /* the path itself: done above */
        gs_index_entry_release(&got.v[0]);
        memmove(&got.v[0], &got.v[1], --got.n * sizeof(*got.v));
    }
    if (rc == 0)
        splice(&c->all, from, to, &got);
    else
        entries_release(&got);
    gs_buf_release(&below);
    return rc;
}

/* Brings the copy up to date with `idx`: the paths written since, or everything. */
static int copy_refresh(struct gs_verify_copy *c, struct gs_index *idx, struct gs_error *err)
{
    int64_t version;
    int rc = gs_index_data_version(idx, &version, err);
    if (rc < 0)
        return rc;
    if (c->idx != idx || c->reread || version != c->data_version) {
        gs_verify_copy_reset(c);
        c->idx = idx;
        gs_index_on_write(idx, note_write, c);
        c->data_version = version;
        rc = gs_index_foreach(idx, NULL, collect, &c->all, err);
    }
    for (size_t i = 0; rc == 0 && i < c->nt; i++)
        rc = reread_path(c, c->t[i].path, c->t[i].subtree, err);
    touched_clear(c);
    if (rc < 0)
        gs_verify_copy_reset(c);
    return rc;
}

/* A check under way: the index's entries when it was sent (its own, or a copy's), and the
 * answer. */
struct gs_verify {
    struct gs_index *idx;
    struct gs_fileops *ops;
    struct entries *all;
    struct entries own;
    struct gs_fop_stat *seen;
};

/* Corrects the index where the server differs, then tells `found` each corrected path. What to
 * correct is decided before any correction: a folder gone takes its files out of the index, and
 * they were gone as well. */
static int apply(struct gs_verify *v, const struct gs_verify_found *found,
                 struct gs_verify_result *out, struct gs_error *err)
{
    struct entries *all = v->all;
    size_t *fixed = gs_xcalloc(all->n, sizeof(*fixed)), n_fixed = 0;
    enum finding *how = gs_xcalloc(all->n, sizeof(*how));
    int rc = gs_index_begin(v->idx, err);
    for (size_t i = 0; rc == 0 && i < all->n; i++) {
        how[i] = compare(&all->v[i], &v->seen[i]);
        if (how[i] == SAME || how[i] == UNTOLD)
            continue;
        if (still_believed(v->idx, &all->v[i], &rc, err))
            fixed[n_fixed++] = i;
        else if (rc == 0)
            out->moved++;
    }
    for (size_t k = 0; rc == 0 && k < n_fixed; k++) {
        size_t i = fixed[k];
        if (how[i] == GONE)
            out->gone++;
        else
            out->changed++;
        rc = correct(v->idx, &all->v[i], how[i], &v->seen[i], err);
    }
    if (rc == 0)
        rc = gs_index_commit(v->idx, err);
    else
        gs_index_rollback(v->idx, NULL);
    if (rc < 0)
        out->gone = out->changed = out->moved = 0;
    for (size_t k = 0; rc == 0 && found && k < n_fixed; k++)
        found->fn(found->ctx, all->v[fixed[k]].path);
    free(how);
    free(fixed);
    return rc;
}

static struct gs_fop_belief belief_of(const struct gs_index_entry *e)
{
    return (struct gs_fop_belief){.path = e->path,
                                  .kind = (enum gs_fop_kind)e->kind,
                                  .mode = e->mode,
                                  .size = e->size,
                                  .mtime_ns = e->mtime_ns,
                                  .link = e->link};
}

void gs_verify_abandon(struct gs_verify *v)
{
    if (!v)
        return;
    entries_release(&v->own);
    free(v->seen);
    free(v);
}

int gs_verify_prepare(struct gs_index *idx, struct gs_verify_copy *copy, struct gs_verify **out,
                      struct gs_error *err)
{
    struct gs_verify *v = gs_xcalloc(1, sizeof(*v));
    v->idx = idx;
    v->all = copy ? &copy->all : &v->own;
    int rc =
        copy ? copy_refresh(copy, idx, err) : gs_index_foreach(idx, NULL, collect, &v->own, err);
    if (rc < 0) {
        gs_verify_abandon(v);
        v = NULL;
    }
    *out = v;
    return rc;
}

int gs_verify_send(struct gs_verify *v, struct gs_fileops *ops, struct gs_error *err)
{
    if (v->ops || !ops->check_send || !v->all->n) /* sent already; cannot; nothing written there */
        return 0;
    struct gs_fop_belief *beliefs = gs_xcalloc(v->all->n, sizeof(*beliefs));
    for (size_t i = 0; i < v->all->n; i++)
        beliefs[i] = belief_of(&v->all->v[i]);
    int rc = ops->check_send(ops, beliefs, v->all->n, err);
    free(beliefs);
    if (rc == 0)
        v->ops = ops;
    return rc;
}

int gs_verify_finish(struct gs_verify *v, struct gs_fileops *ops,
                     const struct gs_verify_found *found, struct gs_verify_result *out,
                     struct gs_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!v)
        return 0;
    int rc = gs_verify_send(v, ops, err);
    if (rc == 0 && v->ops) {
        v->seen = gs_xcalloc(v->all->n, sizeof(*v->seen));
        rc = v->ops->check_wait(v->ops, v->seen, err);
        if (rc == 0)
            rc = apply(v, found, out, err);
        if (rc == 0)
            out->checked = v->all->n;
    }
    size_t off = out->gone + out->changed;
    if (rc == 0 && off)
        gs_info("the server no longer held %zu of the %zu paths gpusync wrote there (%zu gone, "
                "%zu changed there): sending them again",
                off, v->all->n, out->gone, out->changed);
    if (rc == 0 && out->moved)
        gs_debug("%zu path%s the server did not hold as believed were renamed or written since "
                 "the check: checked again",
                 out->moved, out->moved == 1 ? "" : "s");
    gs_verify_abandon(v);
    return rc;
}

int gs_verify_server(struct gs_index *idx, struct gs_fileops *ops,
                     const struct gs_verify_found *found, struct gs_verify_result *out,
                     struct gs_error *err)
{
    struct gs_verify *v;
    int rc = gs_verify_prepare(idx, NULL, &v, err);
    if (rc == 0)
        return gs_verify_finish(v, ops, found, out, err);
    memset(out, 0, sizeof(*out));
    return rc;
}
