/* writers: which processes hold a regular file open for writing, read from /proc/PID/fd and
 * /proc/PID/fdinfo, so that pull does not take a file a job is in the middle of saving (opened,
 * half written, paused) for a finished one (serve_query.c). A file opened for appending (a log)
 * is not counted: whatever it holds at a moment is a version of it. Linux only; where /proc
 * cannot be read, no file has a writer. */
#ifndef GA_WRITERS_H
#define GA_WRITERS_H

#include <stddef.h>
#include <sys/types.h>

struct ga_writer {
    dev_t dev;
    ino_t ino;
    long pid;
    char name[32]; /* /proc/PID/comm */
};

struct ga_writers {
    struct ga_writer *v;
    size_t n, cap;
};

/* Fills w (emptied first) with the regular files that a process other than this one holds open
 * with O_WRONLY or O_RDWR and without O_APPEND. Processes this user may not look into are
 * passed over. Returns 0, or -1 when /proc cannot be read (w then empty). */
int ga_writers_scan(struct ga_writers *w);

/* The writer of the file (dev, ino) in w, or NULL. */
const struct ga_writer *ga_writers_find(const struct ga_writers *w, dev_t dev, ino_t ino);

void ga_writers_release(struct ga_writers *w);

#endif
