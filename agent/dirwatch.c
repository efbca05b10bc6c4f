/* agent/dirwatch.c: the folders a CHECK examined, watched with inotify for what changes in them
 * (see dirwatch.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* inotify, statfs */
#endif
#include "dirwatch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

/* Changes of a folder's entries and of the folder itself. Creation is not needed (a kept path is
 * one that exists) but costs nothing and covers a delete whose event was merged away. */
#define WATCH_MASK                                                                                 \
    (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE |                 \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#define SELF_GONE (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED)

struct watched {
    int wd;
    char *dir; /* root-relative, "" for the root */
};

/* inotify raises no event for a write through a shared mapping (numpy.memmap, a checkpoint
 * written with mmap), though the file's mtime moves: every path is reported at least once per
 * FULL_EVERY_MS, so such a write is found within that time. GPUSYNC_AGENT_FULL_CHECK_MS sets it
 * (tests). A full examination costs about 1.3 us a path (0.25 s for 200,000). */
#define FULL_EVERY_MS 30000

struct ga_dirwatch {
    int fd;        /* the inotify instance */
    int mountinfo; /* /proc/self/mountinfo, polled for a changed mount table; -1 if unavailable */
    struct watched *v; /* ascending wd */
    size_t n, cap;
    long long full_every_ms, last_full_ms;
};

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long full_every_ms(void)
{
    const char *v = getenv("GPUSYNC_AGENT_FULL_CHECK_MS");
    char *end;
    long long ms = v ? strtoll(v, &end, 10) : -1;
    return v && *v && !*end && ms >= 0 ? ms : FULL_EVERY_MS;
}

struct ga_dirwatch *ga_dirwatch_new(void)
{
    struct ga_dirwatch *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    /* Without the mount table's changes a mount over a watched folder would go unseen. */
    w->mountinfo = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (w->fd < 0 || w->mountinfo < 0) {
        ga_dirwatch_free(w);
        return NULL;
    }
    w->full_every_ms = full_every_ms();
    w->last_full_ms = mono_ms(); /* the first check examines everything: nothing is settled */
    return w;
}

void ga_dirwatch_free(struct ga_dirwatch *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->mountinfo >= 0)
        close(w->mountinfo);
    for (size_t i = 0; i < w->n; i++)
        free(w->v[i].dir);
    free(w->v);
    free(w);
}

/* The file systems whose every change passes through this kernel, so raises an event here. */
static int local_fs(int dirfd)
{
    static const unsigned long local[] = {
        0xEF53UL,     /* ext2/3/4 */
        0x58465342UL, /* xfs */
        0x9123683EUL, /* btrfs */
        0x01021994UL, /* tmpfs */
        0x794C7630UL, /* overlayfs (a container's root) */
        0xF2F52010UL, /* f2fs */
        0x2FC12FC1UL, /* zfs */
    };
    struct statfs sf;
    if (fstatfs(dirfd, &sf) < 0)
        return 0;
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if ((unsigned long)sf.f_type == local[i])
            return 1;
    return 0;
}

/* The index of wd in w->v, or where it would go (*found 0). */
static size_t find_wd(const struct ga_dirwatch *w, int wd, int *found)
{
    size_t lo = 0, hi = w->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->v[mid].wd < wd)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < w->n && w->v[lo].wd == wd;
    return lo;
}

static int remember(struct ga_dirwatch *w, int wd, const char *dir)
{
    char *copy = strdup(dir);
    if (!copy)
        return -1;
    int found;
    size_t i = find_wd(w, wd, &found);
    if (found) { /* the same folder, perhaps renamed since: the path it has now */
        free(w->v[i].dir);
        w->v[i].dir = copy;
        return 0;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct watched *v = realloc(w->v, cap * sizeof(*v));
        if (!v) {
            free(copy);
            return -1;
        }
        w->v = v;
        w->cap = cap;
    }
    memmove(&w->v[i + 1], &w->v[i], (w->n - i) * sizeof(*w->v));
    w->v[i] = (struct watched){wd, copy};
    w->n++;
    return 0;
}

int ga_dirwatch_add(struct ga_dirwatch *w, const char *dir, int dirfd)
{
    if (!w || !local_fs(dirfd))
        return 0;
    /* The open folder itself, not its path: the path might have changed since it was opened. */
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", dirfd);
    int wd = inotify_add_watch(w->fd, self, WATCH_MASK);
    if (wd < 0) /* ENOSPC: past fs.inotify.max_user_watches */
        return 0;
    if (remember(w, wd, dir) < 0) {
        inotify_rm_watch(w->fd, wd);
        return 0;
    }
    return 1;
}

/* 1 when `path` is `dir` or below it. */
static int within(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return n == 0 || (strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/'));
}

/* Stops watching `dir` and every folder below it: their paths may name other folders now.
 * Their entries are re-examined, and watched again, by the next check. */
static void forget_below(struct ga_dirwatch *w, const char *dir)
{
    size_t kept = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (within(w->v[i].dir, dir)) {
            inotify_rm_watch(w->fd, w->v[i].wd); /* its IN_IGNORED then names no folder */
            free(w->v[i].dir);
        } else {
            w->v[kept++] = w->v[i];
        }
    }
    w->n = kept;
}

static void forget_all(struct ga_dirwatch *w)
{
    forget_below(w, "");
}

/* Reports one event; returns 0, or -1 when everything must be taken as changed. */
static int take_event(struct ga_dirwatch *w, const struct inotify_event *e, ga_dirwatch_fn changed,
                      void *ctx)
{
    if (e->mask & IN_Q_OVERFLOW)
        return -1;
    int found;
    size_t i = find_wd(w, e->wd, &found);
    if (!found) /* a watch already forgotten */
        return 0;
    if (e->mask & SELF_GONE) {
        char *dir = strdup(w->v[i].dir); /* forget_below frees the one it holds */
        if (!dir)
            return -1;
        changed(ctx, dir, 1);
        forget_below(w, dir);
        free(dir);
        return 0;
    }
    if (!e->len)
        return 0;
    const char *dir = w->v[i].dir;
    size_t n = strlen(dir) + 1 + strlen(e->name) + 1;
    char *path = malloc(n);
    if (!path)
        return -1;
    snprintf(path, n, "%s%s%s", dir, *dir ? "/" : "", e->name);
    int folder_moved =
        (e->mask & IN_ISDIR) && (e->mask & (IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE));
    changed(ctx, path, folder_moved);
    if (folder_moved)
        forget_below(w, path);
    free(path);
    return 0;
}

/* 1 when the mount table changed since the last poll (which the poll itself acknowledges). */
static int mounts_changed(struct ga_dirwatch *w)
{
    struct pollfd p = {.fd = w->mountinfo, .events = POLLPRI};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLPRI | POLLERR));
}

void ga_dirwatch_drain(struct ga_dirwatch *w, ga_dirwatch_fn changed, void *ctx)
{
    char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
    int everything = mounts_changed(w);
    ssize_t got;
    while ((got = read(w->fd, buf, sizeof(buf))) > 0 && !everything) {
        for (char *p = buf; p < buf + got && !everything;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            everything = take_event(w, e, changed, ctx) < 0;
            p += sizeof(*e) + e->len;
        }
    }
    if (got < 0 && errno != EAGAIN && errno != EINTR)
        everything = 1;
    if (everything) {
        while (read(w->fd, buf, sizeof(buf)) > 0) /* what is left says nothing more */
            ;
        forget_all(w);
    }
    long long now = mono_ms();
    if (everything || now - w->last_full_ms >= w->full_every_ms) {
        w->last_full_ms = now;
        changed(ctx, "", 1); /* the watches stay: only what they cannot see is caught up */
    }
}
