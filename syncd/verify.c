/* syncd/verify.c: the server still holds what the index says gpusync wrote (see verify.h). */
#include "syncd/verify.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/wrapper.h"
#include "syncd/hash.h"

/* The index's entries, copied out (the walk must not write to the index), and their paths. */
struct entries {
    struct gs_index_entry *v;
    size_t n, cap;
};

static int collect(const struct gs_index_entry *e, void *ctx)
{
    struct entries *all = ctx;
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

static int64_t whole_seconds(int64_t ns)
{
    return ns >= 0 ? ns / 1000000000 : -((-ns + 999999999) / 1000000000);
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
        (s->size != e->size || whole_seconds(s->mtime_ns) != whole_seconds(e->mtime_ns)))
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

static int apply(struct gs_index *idx, struct entries *all, const struct gs_fop_stat *seen,
                 struct gs_verify_result *out, struct gs_error *err)
{
    int rc = gs_index_begin(idx, err);
    for (size_t i = 0; rc == 0 && i < all->n; i++) {
        enum finding f = compare(&all->v[i], &seen[i]);
        if (f == SAME || f == UNTOLD)
            continue;
        if (f == GONE)
            out->gone++;
        else
            out->changed++;
        rc = correct(idx, &all->v[i], f, &seen[i], err);
    }
    if (rc == 0)
        return gs_index_commit(idx, err);
    gs_index_rollback(idx, NULL);
    out->gone = out->changed = 0;
    return rc;
}

/* Asks the server about every entry and corrects the index by what it says. */
static int check_all(struct gs_index *idx, struct gs_fileops *ops, struct entries *all,
                     struct gs_verify_result *out, struct gs_error *err)
{
    const char **paths = gs_xcalloc(all->n, sizeof(*paths));
    struct gs_fop_stat *seen = gs_xcalloc(all->n, sizeof(*seen));
    for (size_t i = 0; i < all->n; i++)
        paths[i] = all->v[i].path;
    int rc = ops->stat(ops, paths, all->n, seen, err);
    if (rc == 0)
        rc = apply(idx, all, seen, out, err);
    free(paths);
    free(seen);
    return rc;
}

int gs_verify_server(struct gs_index *idx, struct gs_fileops *ops, struct gs_verify_result *out,
                     struct gs_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!ops->stat)
        return 0;
    struct entries all = {0};
    int rc = gs_index_foreach(idx, NULL, collect, &all, err);
    if (rc == 0 && all.n)
        rc = check_all(idx, ops, &all, out, err);
    if (rc == 0)
        out->checked = all.n;
    size_t off = out->gone + out->changed;
    if (rc == 0 && off)
        gs_info("the server no longer held %zu of the %zu paths gpusync wrote there (%zu gone, "
                "%zu changed there): sending them again",
                off, all.n, out->gone, out->changed);
    entries_release(&all);
    return rc;
}
