/* writers: the files processes hold open for writing (see writers.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "writers.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ga_writers_release(struct ga_writers *w)
{
    free(w->v);
    memset(w, 0, sizeof(*w));
}

static int writers_add(struct ga_writers *w, const struct ga_writer *e)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 32;
        struct ga_writer *v = realloc(w->v, cap * sizeof(*v));
        if (!v)
            return -1;
        w->v = v, w->cap = cap;
    }
    w->v[w->n++] = *e;
    return 0;
}

/* The open flags of descriptor `fd` of process `pid` (the octal "flags:" of its fdinfo), or -1. */
static long fd_flags(long pid, const char *fd)
{
    char path[320], buf[512];
    snprintf(path, sizeof(path), "/proc/%ld/fdinfo/%s", pid, fd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -1;
    ssize_t n = read(f, buf, sizeof(buf) - 1);
    close(f);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *at = strstr(buf, "flags:");
    return at ? strtol(at + 6, NULL, 8) : -1;
}

static void read_comm(long pid, char *name, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = f < 0 ? -1 : read(f, name, cap - 1);
    if (f >= 0)
        close(f);
    name[n > 0 ? n : 0] = '\0';
    name[strcspn(name, "\n")] = '\0';
}

/* Adds the files process `pid` holds open for writing, not appending. */
static int scan_process(struct ga_writers *w, long pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/fd", pid);
    DIR *d = opendir(path);
    if (!d)
        return 0; /* gone, or not ours to look into */
    struct ga_writer e = {.pid = pid};
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        struct stat st;
        /* following the link: the open file itself, wherever its name now is */
        if (de->d_name[0] == '.' || fstatat(dirfd(d), de->d_name, &st, 0) < 0 ||
            !S_ISREG(st.st_mode))
            continue;
        long flags = fd_flags(pid, de->d_name);
        if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY || (flags & O_APPEND))
            continue;
        if (!e.name[0])
            read_comm(pid, e.name, sizeof(e.name));
        e.dev = st.st_dev, e.ino = st.st_ino;
        rc = writers_add(w, &e);
    }
    closedir(d);
    return rc;
}

int ga_writers_scan(struct ga_writers *w)
{
    w->n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    long self = (long)getpid();
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (!*end && pid > 0 && pid != self)
            rc = scan_process(w, pid);
    }
    closedir(d);
    if (rc < 0)
        w->n = 0;
    return rc;
}

const struct ga_writer *ga_writers_find(const struct ga_writers *w, dev_t dev, ino_t ino)
{
    for (size_t i = 0; i < w->n; i++)
        if (w->v[i].dev == dev && w->v[i].ino == ino)
            return &w->v[i];
    return NULL;
}
