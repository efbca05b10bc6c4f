/* syncd/linked.c: the project's files with other hard links, checked by stat (see linked.h). */
#include "syncd/linked.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/wrapper.h"

static int file_cmp(const void *a, const void *b)
{
    return strcmp(((const struct gs_linked_file *)a)->path,
                  ((const struct gs_linked_file *)b)->path);
}

/* Removes entry i, keeping the order. */
static void drop_at(struct gs_linked *l, size_t i)
{
    free(l->v[i].path);
    memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof(*l->v));
    l->n--;
}

static void take_stat(struct gs_linked_file *f, uint64_t ino, uint64_t size, int64_t mtime_ns,
                      int64_t ctime_ns)
{
    f->ino = ino;
    f->size = size;
    f->mtime_ns = mtime_ns;
    f->ctime_ns = ctime_ns;
}

static int linked_file(const struct gs_scan_entry *e)
{
    return e->kind == GS_KIND_FILE && e->nlink > 1;
}

static void add(struct gs_linked *l, const struct gs_scan_entry *e)
{
    GS_ALLOC_GROW(l->v, l->n + 1, l->cap);
    l->v[l->n] = (struct gs_linked_file){.path = gs_xstrdup(e->path)};
    take_stat(&l->v[l->n++], e->ino, e->size, e->mtime_ns, e->ctime_ns);
}

static int same_stat(const struct gs_linked_file *f, const struct gs_scan_entry *e)
{
    return f->ino == e->ino && f->size == e->size && f->mtime_ns == e->mtime_ns &&
           f->ctime_ns == e->ctime_ns;
}

/* Known files: updated, or dropped when linked once now (the array stays sorted meanwhile); on a
 * whole scan, those it no longer lists are dropped too. */
static void update_known(struct gs_linked *l, const struct gs_scan *scan, int whole,
                         void (*told)(void *ctx, const char *path), void *ctx)
{
    for (size_t i = 0; i < l->n;) {
        const struct gs_scan_entry *e = gs_scan_find(scan, l->v[i].path);
        if (e && linked_file(e)) {
            if (told && !same_stat(&l->v[i], e))
                told(ctx, e->path);
            take_stat(&l->v[i++], e->ino, e->size, e->mtime_ns, e->ctime_ns);
        } else if (e || whole) { /* linked once now, no longer a file, or gone */
            drop_at(l, i);
        } else {
            i++;
        }
    }
}

void gs_linked_take_scan(struct gs_linked *l, const struct gs_scan *scan, int whole,
                         void (*told)(void *ctx, const char *path), void *ctx)
{
    update_known(l, scan, whole, told, ctx);
    size_t known = l->n;
    for (size_t i = 0; i < scan->n; i++) {
        const struct gs_scan_entry *e = &scan->entries[i];
        struct gs_linked_file key = {.path = e->path};
        if (!linked_file(e) || (known && bsearch(&key, l->v, known, sizeof(key), file_cmp)))
            continue;
        add(l, e);
        if (told)
            told(ctx, e->path);
    }
    if (l->n > known)
        qsort(l->v, l->n, sizeof(*l->v), file_cmp);
}

static int64_t ns_of(const struct timespec *t)
{
    return gs_time_ns(t->tv_sec, t->tv_nsec);
}

void gs_linked_check(struct gs_linked *l, int rootfd, void (*changed)(void *ctx, const char *path),
                     void *ctx)
{
    for (size_t i = 0; i < l->n;) {
        struct gs_linked_file *f = &l->v[i];
        struct stat st;
        if (fstatat(rootfd, f->path, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) {
            changed(ctx, f->path);
            drop_at(l, i);
            continue;
        }
        if (st.st_ino != f->ino || (uint64_t)st.st_size != f->size ||
            ns_of(&st.st_mtim) != f->mtime_ns || ns_of(&st.st_ctim) != f->ctime_ns) {
            changed(ctx, f->path);
            take_stat(f, st.st_ino, (uint64_t)st.st_size, ns_of(&st.st_mtim), ns_of(&st.st_ctim));
        }
        i++;
    }
}

void gs_linked_release(struct gs_linked *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].path);
    free(l->v);
    memset(l, 0, sizeof(*l));
}
