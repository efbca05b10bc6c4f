/* syncd/reconcile.c: settling intents left by an interrupted sync (see reconcile.h). */
#include "syncd/reconcile.h"

#include <stdlib.h>
#include <string.h>

#include "syncd/hash.h"
#include "syncd/plan.h"
#include "common/clock.h"
#include "common/wrapper.h"

/* The intents, copied out of the index, and the paths to probe: intent i's path is paths[2i],
 * a rename's source paths[2i + 1] (else the same path again, probed once more: simpler than a
 * map, and renames are few). */
struct intents {
    struct gs_index_intent *v;
    size_t n, cap;
    const char **paths;
    struct gs_fop_stat *seen;
};

static int collect(const struct gs_index_intent *in, void *ctx)
{
    struct intents *all = ctx;
    GS_ALLOC_GROW(all->v, all->n + 1, all->cap);
    struct gs_index_intent *copy = &all->v[all->n++];
    *copy = *in;
    copy->from = in->from ? gs_xstrdup(in->from) : NULL;
    gs_index_entry_copy(&copy->after, &in->after);
    return 0;
}

static void intents_release(struct intents *all)
{
    for (size_t i = 0; i < all->n; i++)
        gs_index_intent_release(&all->v[i]);
    free(all->v);
    free(all->paths);
    free(all->seen);
}

/* 1 when the server's `s` is what `e` describes: same kind and, for files and symlinks, the
 * same content hash (a symlink's is the hash of its target string, as the agent computes it). */
static int holds(const struct gs_fop_stat *s, const struct gs_index_entry *e)
{
    struct gs_hash h;
    switch (e->kind) {
    case GS_KIND_NONE:
        return s->kind == GS_FOP_KIND_NONE;
    case GS_KIND_DIR:
        return s->kind == GS_FOP_KIND_DIR;
    case GS_KIND_FILE:
        return s->kind == GS_FOP_KIND_FILE && s->has_hash && e->has_hash &&
               memcmp(s->hash, e->hash.b, GS_HASH_LEN) == 0;
    case GS_KIND_SYMLINK:
        gs_hash_link(e->link, &h);
        return s->kind == GS_FOP_KIND_SYMLINK && s->has_hash &&
               memcmp(s->hash, h.b, GS_HASH_LEN) == 0;
    }
    return 0;
}

/* Records intent `in` as completed when the server shows it did (`at`: its path, `src`: a
 * rename's source); otherwise changes nothing. */
static int settle(struct gs_index *idx, const struct gs_index_intent *in,
                  const struct gs_fop_stat *at, const struct gs_fop_stat *src, struct gs_error *err)
{
    if (!holds(at, &in->after))
        return 0;
    switch (in->op) {
    case GS_OP_DELETE:
        return gs_index_delete_subtree(idx, in->after.path, err);
    case GS_OP_RENAME: {
        if (src->kind != GS_FOP_KIND_NONE)
            return 0; /* the source is still there: the rename did not happen */
        int rc = gs_index_rename(idx, in->from, in->after.path, err);
        return rc < 0 ? rc : gs_index_put(idx, &in->after, err);
    }
    case GS_OP_CHMOD: /* a touch's mtime too, to the second, where the transport tells it */
        if ((at->mode & 07777) != (in->after.mode & 07777) ||
            (at->mtime_ns &&
             gs_time_sec(at->mtime_ns, NULL) != gs_time_sec(in->after.mtime_ns, NULL)))
            return 0;
        return gs_index_put(idx, &in->after, err);
    default:
        return gs_index_put(idx, &in->after, err);
    }
}

static int probe_all(struct intents *all, struct gs_fileops *ops, struct gs_error *err)
{
    all->paths = gs_xcalloc(2 * all->n, sizeof(*all->paths));
    all->seen = gs_xcalloc(2 * all->n, sizeof(*all->seen));
    for (size_t i = 0; i < all->n; i++) {
        all->paths[2 * i] = all->v[i].after.path;
        all->paths[2 * i + 1] = all->v[i].from ? all->v[i].from : all->v[i].after.path;
    }
    return ops->probe(ops, all->paths, 2 * all->n, all->seen, err);
}

/* Applies what the probe found and drops every intent, in one transaction. */
static int apply_all(struct gs_index *idx, const struct intents *all, struct gs_error *err)
{
    int rc = gs_index_begin(idx, err);
    for (size_t i = 0; rc == 0 && i < all->n; i++)
        rc = settle(idx, &all->v[i], &all->seen[2 * i], &all->seen[2 * i + 1], err);
    if (rc == 0)
        rc = gs_index_intent_clear(idx, err);
    if (rc == 0)
        return gs_index_commit(idx, err);
    gs_index_rollback(idx, NULL);
    return rc;
}

int gs_reconcile(struct gs_index *idx, struct gs_fileops *ops, size_t *settled,
                 struct gs_error *err)
{
    struct intents all = {0};
    int rc = gs_index_intent_foreach(idx, collect, &all, err);
    if (rc == 0 && all.n)
        rc = probe_all(&all, ops, err);
    if (rc == 0 && all.n)
        rc = apply_all(idx, &all, err);
    if (settled)
        *settled = rc == 0 ? all.n : 0;
    intents_release(&all);
    return rc;
}
