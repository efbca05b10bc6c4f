/* syncd/watch.c: the inotify watcher (see watch.h). */
#include "syncd/watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <search.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/path.h"
#include "common/wrapper.h"

#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVED_FROM |              \
     IN_MOVED_TO | IN_DELETE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/* A file in the middle of a save, or just saved (see watch.h), in a tree keyed by path
 * (tsearch(3)): a git checkout creates thousands of files at once, each held until closed. */
enum hold_kind {
    HOLD_WRITING,    /* created or modified, not yet closed */
    HOLD_SAVED,      /* closed by its writer: held only from a batch planned before the close */
    HOLD_MOVED_AWAY, /* renamed to an editor's scratch name; the new version comes next */
    HOLD_GONE,       /* deleted or renamed away, as an event said: a delete may go */
    HOLD_UNSEEN,     /* found gone by a batch before any event said so */
};

struct hold {
    char *path;
    enum hold_kind kind;
    int64_t since_ms;    /* when this run of saves began: no hold outlasts GS_WATCH_HOLD_MAX_MS */
    int64_t changed_ms;  /* when its last event was read */
    uint64_t changed_at; /* that event's number (gs_watch_events_read) */
};

/* A MOVED_FROM waiting for its MOVED_TO (same cookie). */
struct move {
    uint32_t cookie;
    char *path;
    int is_dir;
};

struct gs_watch {
    int fd;
    char *root;
    struct gs_ignore *ig;
    char **dirs; /* indexed by watch descriptor: the directory's relative path ("" = root) */
    size_t cap;
    size_t count;
    struct move pending[64];
    size_t n_pending;
    int polling;
    char why[512];
    void *holds; /* struct hold *, by path */
    size_t n_holds;
    uint64_t events_read;
    int rules_changed; /* a .gitignore changed: what is watched, and synced, may differ now */
};

/* ---- saves in progress ---- */

static int hold_cmp(const void *a, const void *b)
{
    return strcmp(((const struct hold *)a)->path, ((const struct hold *)b)->path);
}

static void hold_free(void *h)
{
    free(((struct hold *)h)->path);
    free(h);
}

static struct hold *hold_find(struct gs_watch *w, const char *path)
{
    struct hold key = {.path = (char *)path};
    struct hold **found = tfind(&key, &w->holds, hold_cmp);
    return found ? *found : NULL;
}

/* Notes an event of a save of `path`. The limit counts from the start of one write (the first
 * modification after a close) or of one rename away, never across saves: a burst of saves must
 * not have its hold run out in the middle of one of them. */
static void hold_set(struct gs_watch *w, const char *path, enum hold_kind kind)
{
    int64_t now = gs_clock_mono_ms();
    struct hold *h = hold_find(w, path);
    if (!h) {
        h = gs_xcalloc(1, sizeof(*h));
        h->path = gs_xstrdup(path);
        if (!tsearch(h, &w->holds, hold_cmp))
            gs_out_of_memory(sizeof(*h));
        w->n_holds++;
        h->since_ms = now;
    } else if (h->kind != kind && kind != HOLD_SAVED) {
        h->since_ms = now;
    }
    h->kind = kind;
    h->changed_ms = now;
    h->changed_at = w->events_read;
}

static void hold_clear(struct gs_watch *w, const char *path)
{
    struct hold *h = hold_find(w, path);
    if (!h)
        return;
    tdelete(h, &w->holds, hold_cmp);
    hold_free(h);
    w->n_holds--;
}

/* After lost events nothing is known about saves in progress: hold nothing. */
static void hold_clear_all(struct gs_watch *w)
{
    tdestroy(w->holds, hold_free);
    w->holds = NULL;
    w->n_holds = 0;
}

struct stale {
    struct gs_buf paths; /* NUL-separated */
    int64_t before_ms;
};

static void collect_stale(const void *node, VISIT visit, void *ctx)
{
    const struct hold *h = *(const struct hold *const *)node;
    struct stale *st = ctx;
    if ((visit == postorder || visit == leaf) && (h->kind == HOLD_SAVED || h->kind == HOLD_GONE) &&
        h->changed_ms < st->before_ms)
        gs_buf_add(&st->paths, h->path, strlen(h->path) + 1);
}

/* Forgets the saves that ended long ago, which no batch asked about (their file ended as it was):
 * the tree stays small however many files were written. */
static void hold_prune(struct gs_watch *w)
{
    struct stale st = {GS_BUF_INIT, gs_clock_mono_ms() - GS_WATCH_HOLD_MAX_MS};
    twalk_r(w->holds, collect_stale, &st);
    for (size_t at = 0; at < st.paths.len; at += strlen(st.paths.data + at) + 1)
        hold_clear(w, st.paths.data + at);
    gs_buf_release(&st.paths);
}

/* Whether the regular file `rel` exists: a writer created it (open with O_CREAT) and will close
 * it; a symlink or a hard link made in one call will not. */
static int is_regular_file(struct gs_watch *w, const char *rel)
{
    struct gs_buf abs = GS_BUF_INIT;
    struct stat st;
    gs_path_join(&abs, w->root, rel);
    int regular = lstat(abs.data, &st) == 0 && S_ISREG(st.st_mode);
    gs_buf_release(&abs);
    return regular;
}

/* Follows one event on the file `path` (not a directory) through a save. */
static void track_save(struct gs_watch *w, uint32_t mask, const char *path)
{
    if (mask & IN_MOVED_TO)
        hold_set(w, path, HOLD_SAVED); /* a whole file renamed in */
    else if (mask & (IN_DELETE | IN_MOVED_FROM))
        hold_set(w, path, HOLD_GONE); /* moved_away may hold it on */
    else if ((mask & IN_CLOSE_WRITE) && hold_find(w, path))
        hold_set(w, path, HOLD_SAVED);
    else if ((mask & IN_MODIFY) || ((mask & IN_CREATE) && is_regular_file(w, path)))
        hold_set(w, path, HOLD_WRITING);
}

uint64_t gs_watch_events_read(const struct gs_watch *w)
{
    return w->events_read;
}

/* The batch found `path` gone, but no event read so far says it went: the kernel makes a rename
 * or an unlink visible a moment before it queues its event, and in that moment vim's rename to
 * f~ looks like a delete. Held GS_WATCH_SETTLE_MS, by when the event has come. */
static int hold_unseen_gone(struct gs_watch *w, const char *path, int64_t now_ms, int64_t *until)
{
    hold_set(w, path, HOLD_UNSEEN);
    struct hold *h = hold_find(w, path);
    if (now_ms < h->since_ms + GS_WATCH_SETTLE_MS) {
        *until = h->since_ms + GS_WATCH_SETTLE_MS;
        return 1;
    }
    hold_clear(w, path);
    return 0;
}

/* An empty file may be a save caught inside open(O_TRUNC) or open(O_CREAT) before the kernel
 * queued the event that says so: sent once it has stayed empty GS_WATCH_SETTLE_MS. */
static int hold_fresh_empty(int64_t mtime_ns, int64_t now_ms, int64_t *until)
{
    int64_t age_ms = gs_clock_wall_ms() - mtime_ns / 1000000;
    if (age_ms < 0 || age_ms >= GS_WATCH_SETTLE_MS)
        return 0;
    *until = now_ms + GS_WATCH_SETTLE_MS - age_ms;
    return 1;
}

/* Holds what a batch read without a wait of its own: an event since the batch began reading
 * already makes the path part of the next batch. */
static int hold_for_next_batch(int64_t now_ms, int64_t *until)
{
    *until = now_ms + GS_WATCH_HOLD_MAX_MS;
    return 1;
}

int gs_watch_hold(struct gs_watch *w, const char *path, const struct gs_watch_found *found,
                  int64_t now_ms, int64_t *until)
{
    struct hold *h = hold_find(w, path);
    /* An event on the path since the batch began reading: what the batch found may be a moment
     * inside a save (read half written, or gone between an editor's rename and its new file),
     * and what the events say is newer. The state is left as the events made it. */
    int late = h && h->kind != HOLD_UNSEEN && h->changed_at > found->planned_at;
    if (found->gone && h && h->kind == HOLD_GONE) {
        hold_clear(w, path); /* gone, as an event said: the delete may go */
        return 0;
    }
    if (late && (found->gone || (h->kind != HOLD_WRITING && h->kind != HOLD_MOVED_AWAY)))
        return hold_for_next_batch(now_ms, until);
    if (found->gone && (!h || h->kind != HOLD_MOVED_AWAY))
        return hold_unseen_gone(w, path, now_ms, until);
    if (found->empty && hold_fresh_empty(found->mtime_ns, now_ms, until))
        return 1;
    if (!h)
        return 0;
    if (h->kind != HOLD_WRITING && h->kind != HOLD_MOVED_AWAY) {
        hold_clear(w, path); /* saved, gone or unseen before the batch read it: as it is now */
        return 0;
    }
    if (now_ms < h->since_ms + GS_WATCH_HOLD_MAX_MS) {
        *until = h->since_ms + GS_WATCH_HOLD_MAX_MS;
        return 1;
    }
    if (h->kind == HOLD_MOVED_AWAY)
        hold_clear(w, path); /* it did not come back: a delete after all */
    else
        h->since_ms = now_ms; /* sent now as it is; the next change waits again */
    return 0;
}

static void set_dir(struct gs_watch *w, int wd, const char *rel)
{
    if ((size_t)wd >= w->cap) {
        size_t old = w->cap;
        GS_ALLOC_GROW(w->dirs, (size_t)wd + 1, w->cap);
        memset(w->dirs + old, 0, (w->cap - old) * sizeof(*w->dirs));
    }
    if (!w->dirs[wd])
        w->count++;
    free(w->dirs[wd]);
    w->dirs[wd] = gs_xstrdup(rel);
}

static void out_of_watches(struct gs_watch *w)
{
    if (w->polling)
        return;
    w->polling = 1;
    unsigned long max = 0;
    FILE *fp = fopen("/proc/sys/fs/inotify/max_user_watches", "r");
    if (fp) {
        if (fscanf(fp, "%lu", &max) != 1)
            max = 0;
        fclose(fp);
    }
    snprintf(
        w->why, sizeof(w->why),
        "out of inotify watches after %zu directories (fs.inotify.max_user_watches = %lu); "
        "polling instead. To watch live, raise it: sudo sysctl fs.inotify.max_user_watches=%lu",
        w->count, max, max * 4 > 524288 ? max * 4 : 524288);
}

/* Watches `rel` and every non-ignored directory below it. */
static int add_tree(struct gs_watch *w, const char *rel)
{
    struct gs_buf abs = GS_BUF_INIT;
    gs_path_join(&abs, w->root, rel);
    int wd = inotify_add_watch(w->fd, abs.data, WATCH_MASK);
    if (wd < 0) {
        if (errno == ENOSPC)
            out_of_watches(w);
        gs_buf_release(&abs);
        return 0; /* vanished or unreadable: the next scan reports it */
    }
    set_dir(w, wd, rel);
    DIR *d = opendir(abs.data);
    struct dirent *de;
    struct gs_buf child = GS_BUF_INIT;
    while (d && !w->polling && (de = readdir(d))) {
        if (de->d_type != DT_DIR || !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        gs_buf_reset(&child);
        if (*rel)
            gs_buf_addf(&child, "%s/", rel);
        gs_buf_adds(&child, de->d_name);
        if (gs_ignore_path(w->ig, child.data, 1, NULL) == 0)
            add_tree(w, child.data);
    }
    if (d)
        closedir(d);
    gs_buf_release(&child);
    gs_buf_release(&abs);
    return 0;
}

int gs_watch_open(struct gs_watch **out, const char *root, struct gs_ignore *ig,
                  struct gs_error *err)
{
    struct gs_watch *w = gs_xcalloc(1, sizeof(*w));
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        free(w);
        return gs_error_errno(err, GS_E_IO, "inotify_init1");
    }
    w->root = gs_xstrdup(root);
    w->ig = ig;
    add_tree(w, "");
    *out = w;
    return 0;
}

void gs_watch_free(struct gs_watch *w)
{
    if (!w)
        return;
    close(w->fd);
    for (size_t i = 0; i < w->cap; i++)
        free(w->dirs[i]);
    for (size_t i = 0; i < w->n_pending; i++)
        free(w->pending[i].path);
    hold_clear_all(w);
    free(w->dirs);
    free(w->root);
    free(w);
}

int gs_watch_fd(const struct gs_watch *w)
{
    return w->fd;
}

int gs_watch_polling(const struct gs_watch *w, const char **why)
{
    if (why)
        *why = w->why;
    return w->polling;
}

size_t gs_watch_count(const struct gs_watch *w)
{
    return w->count;
}

/* Rewrites the paths of watched directories at or below `from` to lie below `to`. */
static void rename_watched(struct gs_watch *w, const char *from, const char *to)
{
    size_t flen = strlen(from);
    struct gs_buf b = GS_BUF_INIT;
    for (size_t i = 0; i < w->cap; i++) {
        char *d = w->dirs[i];
        if (!d || strncmp(d, from, flen) != 0 || (d[flen] != '\0' && d[flen] != '/'))
            continue;
        gs_buf_reset(&b);
        gs_buf_adds(&b, to);
        gs_buf_adds(&b, d + flen);
        free(d);
        w->dirs[i] = gs_xstrdup(b.data);
    }
    gs_buf_release(&b);
}

/* Stops watching directories at or below `rel` (moved out of the tree). */
static void forget_tree(struct gs_watch *w, const char *rel)
{
    size_t len = strlen(rel);
    for (size_t i = 0; i < w->cap; i++) {
        char *d = w->dirs[i];
        if (d && strncmp(d, rel, len) == 0 && (d[len] == '\0' || d[len] == '/')) {
            inotify_rm_watch(w->fd, (int)i);
            free(d);
            w->dirs[i] = NULL;
            w->count--;
        }
    }
}

static void finish_pending(struct gs_watch *w)
{
    for (size_t i = 0; i < w->n_pending; i++) {
        if (w->pending[i].is_dir)
            forget_tree(w, w->pending[i].path);
        free(w->pending[i].path);
    }
    w->n_pending = 0;
}

static void moved_from(struct gs_watch *w, uint32_t cookie, const char *path, int is_dir)
{
    if (w->n_pending == sizeof(w->pending) / sizeof(w->pending[0]))
        finish_pending(w);
    w->pending[w->n_pending++] = (struct move){cookie, gs_xstrdup(path), is_dir};
}

/* Pairs a MOVED_TO with its MOVED_FROM; returns 1 if the source was inside the tree. */
static int moved_to(struct gs_watch *w, uint32_t cookie, const char *path, int is_dir)
{
    for (size_t i = 0; i < w->n_pending; i++) {
        if (w->pending[i].cookie != cookie)
            continue;
        if (is_dir)
            rename_watched(w, w->pending[i].path, path);
        free(w->pending[i].path);
        w->pending[i] = w->pending[--w->n_pending];
        return 1;
    }
    return 0;
}

/* A MOVED_TO an ignored name: when its source is a file of the tree renamed to an editor's
 * scratch name (vim's `f~`, JetBrains' `f___jb_old___`), a new version of the file is on its way,
 * and its absence meanwhile is not a delete. */
static void moved_away(struct gs_watch *w, uint32_t cookie, const char *to)
{
    for (size_t i = 0; i < w->n_pending; i++) {
        if (w->pending[i].cookie != cookie)
            continue;
        if (!w->pending[i].is_dir && gs_ignore_is_builtin(to))
            hold_set(w, w->pending[i].path, HOLD_MOVED_AWAY);
        return; /* unpaired: finish_pending treats it as a move out of the tree */
    }
}

/* The kernel dropped watch `wd` (its directory was deleted or unmounted): forget it, or the
 * status "watches" count would only ever grow. */
static void watch_gone(struct gs_watch *w, int wd)
{
    if (wd < 0 || (size_t)wd >= w->cap || !w->dirs[wd])
        return;
    free(w->dirs[wd]);
    w->dirs[wd] = NULL;
    w->count--;
}

/* After a queue overflow the events that would have added watches for new directories, moved
 * watched ones or removed deleted ones are lost: watch the tree afresh. A directory already
 * watched keeps its descriptor (inotify returns the same one for the same inode) and gets its
 * current path; descriptors not found again are removed. The caller rescans the whole tree. */
static void rewatch_all(struct gs_watch *w)
{
    char **old = w->dirs;
    size_t old_cap = w->cap;
    w->dirs = NULL;
    w->cap = w->count = 0;
    add_tree(w, "");
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] && (i >= w->cap || !w->dirs[i]))
            inotify_rm_watch(w->fd, (int)i);
        free(old[i]);
    }
    free(old);
}

static void handle_event(struct gs_watch *w, const struct inotify_event *ev, gs_watch_fn fn,
                         void *ctx, int *rescan)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        *rescan = 1;
        return;
    }
    if (ev->mask & IN_IGNORED) {
        watch_gone(w, ev->wd);
        return;
    }
    if (ev->wd < 0 || (size_t)ev->wd >= w->cap || !w->dirs[ev->wd] || !ev->len)
        return; /* DELETE_SELF of a forgotten watch, or an event on the dir itself */
    struct gs_buf path = GS_BUF_INIT;
    if (*w->dirs[ev->wd])
        gs_buf_addf(&path, "%s/", w->dirs[ev->wd]);
    gs_buf_adds(&path, ev->name);
    int is_dir = (ev->mask & IN_ISDIR) != 0;
    if (gs_ignore_path(w->ig, path.data, is_dir, NULL) != 0) {
        if ((ev->mask & IN_MOVED_TO) && !is_dir)
            moved_away(w, ev->cookie, path.data);
        gs_buf_release(&path);
        return;
    }
    if (!is_dir)
        track_save(w, ev->mask, path.data);
    if (strcmp(ev->name, ".gitignore") == 0)
        w->rules_changed = 1;
    if (ev->mask & IN_MOVED_FROM)
        moved_from(w, ev->cookie, path.data, is_dir);
    if (ev->mask & IN_MOVED_TO)
        moved_to(w, ev->cookie, path.data, is_dir);
    /* A directory moved here, from inside or outside, is (re)watched whole: when its source was
     * created and moved before we read the IN_CREATE, adding the watch at the old path failed, and
     * the pairing alone would leave it unwatched. A directory already watched keeps its
     * descriptor (same inode) and gets its new path. */
    if ((ev->mask & (IN_MOVED_TO | IN_CREATE)) && is_dir)
        add_tree(w, path.data);
    fn(ctx, path.data);
    gs_buf_release(&path);
}

int gs_watch_read(struct gs_watch *w, gs_watch_fn fn, void *ctx, struct gs_error *err)
{
    char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
    int rescan = 0, was_polling = w->polling;
    for (;;) {
        ssize_t n = read(w->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0)
            return gs_error_errno(err, GS_E_IO, "reading inotify events");
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            w->events_read++;
            handle_event(w, ev, fn, ctx, &rescan);
            p += sizeof(*ev) + ev->len;
        }
    }
    /* A MOVED_FROM still unpaired after the queue is empty was a move out of the tree. */
    finish_pending(w);
    if (rescan)
        hold_clear_all(w);
    else if (w->n_holds > 1024)
        hold_prune(w);
    if ((rescan || w->rules_changed) && !w->polling)
        rewatch_all(w); /* folders ignored before may be synced now, and the other way round */
    rescan |= w->rules_changed;
    w->rules_changed = 0;
    return rescan || (w->polling && !was_polling);
}

void gs_watch_set_ignore(struct gs_watch *w, struct gs_ignore *ig)
{
    w->ig = ig;
    if (!w->polling)
        rewatch_all(w);
}
