/* syncd/scan.c: the local tree walk (see scan.h). Each directory is read whole through a dup of
 * its descriptor and closed before its subdirectories are opened, so the walk holds one descriptor
 * per level of depth and no more. */
#include "syncd/scan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/buf.h"
#include "common/log.h"
#include "common/wrapper.h"

struct walk {
    struct gs_scan *out;
    struct gs_ignore *ig;
    struct gs_buf rel; /* path of the directory being read, "" at the root */
    struct gs_error *err;
    size_t root_len; /* strlen of the root's path */
};

/* What a folder's absolute path must leave room for: ignore.c stats its .gitignore by path. */
#define GITIGNORE_ROOM (sizeof("/.gitignore") - 1)
#define SHOWN_START    60 /* bytes of a skipped path's start named in its warning */

void gs_scan_init(struct gs_scan *s)
{
    memset(s, 0, sizeof(*s));
}

static void entry_release(struct gs_scan_entry *e)
{
    free(e->path);
    free(e->link);
}

/* Frees entries from index `from` on, keeping the ones before. */
static void scan_truncate(struct gs_scan *s, size_t from)
{
    for (size_t i = from; i < s->n; i++)
        entry_release(&s->entries[i]);
    s->n = from;
}

void gs_scan_release(struct gs_scan *s)
{
    scan_truncate(s, 0);
    free(s->entries);
    for (size_t i = 0; i < s->n_too_long; i++)
        free(s->too_long[i]);
    free(s->too_long);
    gs_scan_init(s);
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct gs_scan_entry *)a)->path, ((const struct gs_scan_entry *)b)->path);
}

const struct gs_scan_entry *gs_scan_find(const struct gs_scan *s, const char *path)
{
    struct gs_scan_entry key = {.path = (char *)path};
    return s->n ? bsearch(&key, s->entries, s->n, sizeof(key), entry_cmp) : NULL;
}

static struct gs_scan_entry *scan_push(struct gs_scan *s)
{
    GS_ALLOC_GROW(s->entries, s->n + 1, s->cap);
    struct gs_scan_entry *e = &s->entries[s->n++];
    memset(e, 0, sizeof(*e));
    return e;
}

/* Reads a symlink's target whatever its length. Returns a malloc'd string or NULL (errno set). */
static char *read_link_at(int dirfd, const char *name, size_t hint)
{
    size_t cap = hint + 1 > 64 ? hint + 1 : 64;
    for (;;) {
        char *buf = gs_xmalloc(cap);
        ssize_t n = readlinkat(dirfd, name, buf, cap);
        if (n < 0) {
            free(buf);
            return NULL;
        }
        if ((size_t)n < cap) {
            buf[n] = '\0';
            return buf;
        }
        free(buf);
        cap *= 2;
    }
}

static enum gs_kind kind_of(mode_t m)
{
    if (S_ISREG(m))
        return GS_KIND_FILE;
    if (S_ISDIR(m))
        return GS_KIND_DIR;
    if (S_ISLNK(m))
        return GS_KIND_SYMLINK;
    return GS_KIND_NONE;
}

/* Appends the entry `rel` described by `st`. Returns 0, 1 when the symlink vanished, or an error.
 */
static int add_entry(struct walk *w, int dirfd, const char *name, const char *rel,
                     const struct stat *st)
{
    char *link = NULL;
    if (S_ISLNK(st->st_mode)) {
        link = read_link_at(dirfd, name, (size_t)st->st_size);
        if (!link && (errno == ENOENT || errno == EINVAL))
            return 1;
        if (!link)
            return gs_error_errno(w->err, GS_E_IO, "cannot read symlink %s", rel);
    }
    struct gs_scan_entry *e = scan_push(w->out);
    e->path = gs_xstrdup(rel);
    e->kind = kind_of(st->st_mode);
    e->mode = st->st_mode & 07777;
    e->size = (uint64_t)st->st_size;
    e->mtime_ns = gs_time_ns(st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    e->ino = (uint64_t)st->st_ino;
    e->ctime_ns = gs_time_ns(st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
    e->nlink = (uint32_t)st->st_nlink;
    e->link = link;
    return 0;
}

static int walk_dir(struct walk *w, int dirfd);

/* Opens the subdirectory `name` and walks it. A directory replaced since its stat is left to the
 * watcher or the next scan; one that cannot be opened is an error (see gs_scan_tree). */
static int descend(struct walk *w, int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR || errno == ELOOP))
        return 0;
    if (fd < 0)
        return gs_error_errno(w->err, GS_E_IO,
                              "cannot open directory %s (fix its permissions or add it to "
                              "[sync] exclude; nothing was synced)",
                              w->rel.data);
    int rc = walk_dir(w, fd);
    close(fd);
    return rc;
}

/* Is the entry at w->rel ignored? 1, 0, or an error. */
static int entry_ignored(struct walk *w, const char *name, enum gs_kind kind)
{
    if (!w->ig)
        return gs_ignore_is_builtin(name);
    return gs_ignore_entry(w->ig, w->rel.data, kind == GS_KIND_DIR, w->err);
}

/* 1 when the entry at w->rel (of `kind`) is too deep for its absolute path to be opened (the
 * ignore rules and the plan read files by path; over PATH_MAX that fails with ENAMETOOLONG, which
 * used to fail the whole scan): it is then left out of the entries and listed in too_long, so that
 * a plan reports it and deletes nothing of what the server holds there. */
static int too_long(const struct walk *w, enum gs_kind kind)
{
    size_t len = w->root_len + 1 + w->rel.len;
    if (len + (kind == GS_KIND_DIR ? GITIGNORE_ROOM : 0) < PATH_MAX)
        return 0;
    gs_debug("too long to open: %.*s... (%zu bytes)", SHOWN_START, w->rel.data, w->rel.len);
    struct gs_scan *s = w->out;
    s->too_long = gs_xrealloc(s->too_long, (s->n_too_long + 1) * sizeof(*s->too_long));
    s->too_long[s->n_too_long++] = gs_xstrdup(w->rel.data);
    return 1;
}

/* Lists one directory entry `name` of `dirfd`; w->rel holds its relative path. */
static int walk_entry(struct walk *w, int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT)
            return gs_error_errno(w->err, GS_E_IO, "cannot stat %s", w->rel.data);
        w->out->n_skipped++; /* vanished since readdir */
        return 0;
    }
    enum gs_kind kind = kind_of(st.st_mode);
    if (kind == GS_KIND_NONE) {
        w->out->n_skipped++;
        return 0;
    }
    /* ignored first: "add it to [sync] exclude" is the way out of a path too long */
    int rc = entry_ignored(w, name, kind);
    if (rc != 0) {
        w->out->n_ignored += rc > 0;
        return rc < 0 ? rc : 0;
    }
    if (too_long(w, kind))
        return 0;
    rc = add_entry(w, dirfd, name, w->rel.data, &st);
    if (rc > 0)
        w->out->n_skipped++;
    if (rc != 0 || kind != GS_KIND_DIR)
        return rc < 0 ? rc : 0;
    return descend(w, dirfd, name);
}

/* Reads all names of the directory open as `dirfd` into `names` (a NUL-separated list). */
static int read_names(struct walk *w, int dirfd, struct gs_buf *names, size_t *count)
{
    int fd = dup(dirfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return gs_error_errno(w->err, GS_E_IO, "cannot read directory %s",
                              w->rel.len ? w->rel.data : ".");
    }
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        gs_buf_add(names, de->d_name, strlen(de->d_name) + 1);
        (*count)++;
    }
    int rc = errno ? gs_error_errno(w->err, GS_E_IO, "cannot read directory %s",
                                    w->rel.len ? w->rel.data : ".")
                   : 0;
    closedir(d);
    return rc;
}

static int walk_dir(struct walk *w, int dirfd)
{
    struct gs_buf names = GS_BUF_INIT;
    size_t count = 0, base = w->rel.len;
    int rc = read_names(w, dirfd, &names, &count);
    const char *name = names.data;
    for (size_t i = 0; rc == 0 && i < count; i++, name += strlen(name) + 1) {
        if (base)
            gs_buf_addc(&w->rel, '/');
        gs_buf_adds(&w->rel, name);
        rc = walk_entry(w, dirfd, name);
        w->rel.len = base;
        w->rel.data[base] = '\0';
    }
    gs_buf_release(&names);
    return rc;
}

static int open_root(const char *root, struct gs_error *err)
{
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        gs_error_errno(err, GS_E_IO, "cannot open project directory %s", root);
    return fd;
}

int gs_scan_tree(struct gs_scan *out, const char *root, struct gs_ignore *ig, struct gs_error *err)
{
    int fd = open_root(root, err);
    if (fd < 0)
        return GS_E_IO;
    struct walk w = {out, ig, GS_BUF_INIT, err, strlen(root)};
    gs_buf_grow(&w.rel, 256);
    int rc = walk_dir(&w, fd);
    close(fd);
    gs_buf_release(&w.rel);
    if (rc < 0) {
        gs_scan_release(out);
        return rc;
    }
    if (out->n > 1)
        qsort(out->entries, out->n, sizeof(*out->entries), entry_cmp);
    return 0;
}

/* Opens the parent directory of `relpath` under the root without following symlinks on the way,
 * so a subtree scan cannot be led out of the tree. Returns a descriptor, or -1 with errno. */
static int open_parent(int rootfd, const char *relpath, const char **leaf)
{
    int fd = dup(rootfd);
    const char *p = relpath;
    for (const char *slash; fd >= 0 && (slash = strchr(p, '/')) != NULL; p = slash + 1) {
        if (slash == p)
            continue;
        char *comp = gs_xstrndup(p, (size_t)(slash - p));
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        free(comp);
        close(fd);
        fd = next;
    }
    *leaf = p;
    return fd;
}

static int scan_one(struct walk *w, int rootfd, const char *relpath)
{
    const char *leaf;
    int pfd = open_parent(rootfd, relpath, &leaf);
    if (pfd < 0 && (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)) {
        w->out->n_skipped++; /* gone, or a symlink on the way: not ours to follow */
        return 0;
    }
    if (pfd < 0)
        return gs_error_errno(w->err, GS_E_IO, "cannot open the directory holding %s", relpath);
    gs_buf_adds(&w->rel, relpath);
    int rc = walk_entry(w, pfd, leaf);
    close(pfd);
    return rc;
}

/* Is a directory above `relpath` ignored? The entry itself is judged by walk_entry, which knows
 * its kind. Returns 1, 0 or an error. */
static int ancestors_ignored(struct gs_ignore *ig, const char *relpath, struct gs_error *err)
{
    const char *slash = strrchr(relpath, '/');
    if (!slash)
        return 0;
    char *parent = gs_xstrndup(relpath, (size_t)(slash - relpath));
    int rc = 0;
    if (ig) {
        rc = gs_ignore_path(ig, parent, 1, err);
    } else {
        char *save = NULL;
        for (char *c = strtok_r(parent, "/", &save); c && !rc; c = strtok_r(NULL, "/", &save))
            rc = gs_ignore_is_builtin(c);
    }
    free(parent);
    return rc;
}

int gs_scan_subtree(struct gs_scan *out, const char *root, const char *relpath,
                    struct gs_ignore *ig, struct gs_error *err)
{
    int rc = ancestors_ignored(ig, relpath, err);
    if (rc != 0) {
        out->n_ignored += rc > 0;
        return rc < 0 ? rc : 0;
    }
    int fd = open_root(root, err);
    if (fd < 0)
        return GS_E_IO;
    size_t before = out->n;
    struct walk w = {out, ig, GS_BUF_INIT, err, strlen(root)};
    rc = scan_one(&w, fd, relpath);
    close(fd);
    gs_buf_release(&w.rel);
    if (rc < 0)
        scan_truncate(out, before);
    else if (out->n > 1)
        qsort(out->entries, out->n, sizeof(*out->entries), entry_cmp);
    return rc;
}
