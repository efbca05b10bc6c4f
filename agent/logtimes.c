/* logtimes: recording and reading when rank log bytes were written (see logtimes.h). The
 * recorder writes a record as soon as a log grows after a quiet spell, and at most every
 * GA_LOGTIMES_MIN_MS while logs keep growing, so a chatty run costs at most 100 short records a
 * second per rank and a quiet one nothing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "logtimes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runs.h"
#include "wrapper.h"

/* Opens dir/log-times for appending and writes the version line. Returns the fd or -1. */
static int create_file(const char *dir)
{
    char path[PATH_MAX], head[64];
    if (ga_runs_join(path, sizeof(path), dir, GA_LOGTIMES_FILE) < 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int n = snprintf(head, sizeof(head), "gpusync-log-times %d\n", GA_LOGTIMES_VERSION);
    if (fd >= 0 && ga_write_all(fd, head, (size_t)n) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int ga_logtimes_open(struct ga_logtimes *lt, const char *dir, int first_rank, int n)
{
    memset(lt, 0, sizeof(*lt));
    lt->ifd = lt->fd = -1;
    snprintf(lt->dir, sizeof(lt->dir), "%s", dir);
    lt->first_rank = first_rank;
    lt->n = n;
    lt->start_ms = ga_runs_mono_ms();
    lt->size = calloc((size_t)n, sizeof(*lt->size));
    lt->dirty = calloc((size_t)n, 1);
    if (lt->size && lt->dirty && (lt->fd = create_file(dir)) >= 0)
        lt->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (lt->ifd >= 0 && inotify_add_watch(lt->ifd, dir, IN_MODIFY) >= 0)
        return 0;
    ga_logtimes_close(lt);
    return -1;
}

int ga_logtimes_fd(const struct ga_logtimes *lt)
{
    return lt->ifd;
}

/* 1 if any rank grew since its last record. */
static int any_dirty(const struct ga_logtimes *lt)
{
    for (int i = 0; lt->ifd >= 0 && i < lt->n; i++)
        if (lt->dirty[i])
            return 1;
    return 0;
}

int ga_logtimes_timeout(const struct ga_logtimes *lt)
{
    if (!any_dirty(lt))
        return -1;
    long long left = lt->next_ms - ga_runs_mono_ms();
    return left < 0 ? 0 : (int)left;
}

/* Marks the local rank whose log is `name` ("rank<N>.log") as grown. */
static void mark(struct ga_logtimes *lt, const char *name)
{
    int rank, used = 0;
    if (sscanf(name, "rank%d.log%n", &rank, &used) == 1 && name[used] == '\0' &&
        rank >= lt->first_rank && rank - lt->first_rank < lt->n)
        lt->dirty[rank - lt->first_rank] = 1;
}

/* Reads the pending inotify events; an overflow marks every rank. */
static void read_events(struct ga_logtimes *lt)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(lt->ifd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            if (e->mask & IN_Q_OVERFLOW)
                memset(lt->dirty, 1, (size_t)lt->n);
            else if (e->len)
                mark(lt, e->name);
            p += sizeof(*e) + e->len;
        }
    }
}

/* Appends a record for each marked rank whose log grew, and clears the marks. */
static void record(struct ga_logtimes *lt)
{
    char lines[4096], path[PATH_MAX], name[32];
    size_t len = 0;
    long long ms = ga_runs_mono_ms() - lt->start_ms;
    for (int i = 0; i < lt->n; i++) {
        struct stat sb;
        snprintf(name, sizeof(name), "rank%d.log", lt->first_rank + i);
        if (!lt->dirty[i] || ga_runs_join(path, sizeof(path), lt->dir, name) < 0 ||
            stat(path, &sb) < 0 || (long long)sb.st_size <= lt->size[i]) {
            lt->dirty[i] = 0;
            continue;
        }
        lt->dirty[i] = 0;
        lt->size[i] = (long long)sb.st_size;
        len += (size_t)snprintf(lines + len, sizeof(lines) - len, "%d %lld %lld\n",
                                lt->first_rank + i, lt->size[i], ms);
        if (len > sizeof(lines) - 64) { /* the buffer is full: out with it */
            ga_write_all(lt->fd, lines, len);
            len = 0;
        }
    }
    if (len)
        ga_write_all(lt->fd, lines, len);
    lt->next_ms = ga_runs_mono_ms() + GA_LOGTIMES_MIN_MS;
}

void ga_logtimes_update(struct ga_logtimes *lt)
{
    if (lt->ifd < 0)
        return;
    read_events(lt);
    if (any_dirty(lt) && ga_runs_mono_ms() >= lt->next_ms)
        record(lt);
}

void ga_logtimes_flush(struct ga_logtimes *lt)
{
    if (lt->ifd < 0)
        return;
    read_events(lt);
    memset(lt->dirty, 1, (size_t)lt->n);
    record(lt);
}

void ga_logtimes_close(struct ga_logtimes *lt)
{
    if (lt->ifd >= 0)
        close(lt->ifd);
    if (lt->fd >= 0)
        close(lt->fd);
    free(lt->size);
    free(lt->dirty);
    lt->ifd = lt->fd = -1;
    lt->size = NULL;
    lt->dirty = NULL;
    lt->n = 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

void ga_logtimes_reader_init(struct ga_logtimes_reader *r)
{
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

/* Handles one complete line (without its newline). */
static void read_line(struct ga_logtimes_reader *r, const char *line, ga_logtimes_fn fn, void *ctx)
{
    int rank, used = 0;
    long long size, ms;
    if (r->version == 0) {
        r->version = sscanf(line, "gpusync-log-times %d%n", &rank, &used) == 1 && !line[used] &&
                             rank == GA_LOGTIMES_VERSION
                         ? rank
                         : -1;
        return;
    }
    if (r->version == GA_LOGTIMES_VERSION &&
        sscanf(line, "%d %lld %lld%n", &rank, &size, &ms, &used) == 3 && !line[used] && rank >= 0 &&
        size >= 0)
        fn(ctx, rank, size, ms);
}

/* Feeds bytes; lines longer than the buffer are malformed and dropped whole. */
static void feed(struct ga_logtimes_reader *r, const char *p, size_t n, ga_logtimes_fn fn,
                 void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (r->len < sizeof(r->line) - 1)
                r->line[r->len] = p[i];
            r->len++;
            continue;
        }
        if (r->len < sizeof(r->line) - 1) {
            r->line[r->len] = '\0';
            read_line(r, r->line, fn, ctx);
        }
        r->len = 0;
    }
}

void ga_logtimes_read(struct ga_logtimes_reader *r, const char *dir, ga_logtimes_fn fn, void *ctx)
{
    char path[PATH_MAX], buf[8192];
    if (r->fd < 0 && ga_runs_join(path, sizeof(path), dir, GA_LOGTIMES_FILE) == 0)
        r->fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    while (r->fd >= 0 && r->version >= 0 && (n = read(r->fd, buf, sizeof(buf))) > 0)
        feed(r, buf, (size_t)n, fn, ctx);
}

void ga_logtimes_reader_close(struct ga_logtimes_reader *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}
