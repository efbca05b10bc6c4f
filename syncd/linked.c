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

static struct gs_linked_file *find(struct gs_linked *l, const char *path)
{
    struct gs_linked_file key = {.path = (char *)path};
    return l->n ? bsearch(&key, l->v, l->n, sizeof(key), file_cmp) : NULL;
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

void gs_linked_take_scan(struct gs_linked *l, const struct gs_scan *scan, int whole)
{
    if (whole)
        gs_linked_release(l);
    /* first what is known (the array stays sorted while entries are dropped), then the new */
    size_t known = l->n;
    for (size_t i = 0; i < scan->n && known; i++) {
        const struct gs_scan_entry *e = &scan->entries[i];
        struct gs_linked_file *f = find(l, e->path);
        if (f && linked_file(e))
            take_stat(f, e->ino, e->size, e->mtime_ns, e->ctime_ns);
        else if (f) /* linked once now, or no longer a file */
            drop_at(l, (size_t)(f - l->v));
    }
    known = l->n;
    for (size_t i = 0; i < scan->n; i++) {
        const struct gs_scan_entry *e = &scan->entries[i];
        struct gs_linked_file key = {.path = e->path};
        if (linked_file(e) && !(known && bsearch(&key, l->v, known, sizeof(key), file_cmp)))
            add(l, e);
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
