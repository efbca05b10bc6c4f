/* logtimes: when each rank's log bytes were written, so that `tail` can send several ranks'
 * lines in the order they were printed instead of rank by rank. Ranks write their logs directly
 * (rank<N>.log is their stdout and stderr); the supervisor watches the run directory with inotify
 * and appends to log-times, at most every GA_LOGTIMES_MIN_MS, a record per rank whose log grew:
 *
 *   gpusync-log-times 1\n                  (the format's version, first line)
 *   <rank> <size> <ms>\n                   (rank's log held <size> bytes <ms> after the start)
 *
 * Times are monotonic milliseconds since the supervisor started. A run without the file (started
 * by an older agent) or with another version is read rank by rank, as before. */
#ifndef GA_LOGTIMES_H
#define GA_LOGTIMES_H

#include <limits.h>
#include <stddef.h>

#define GA_LOGTIMES_FILE    "log-times"
#define GA_LOGTIMES_VERSION 1
#define GA_LOGTIMES_MIN_MS  10 /* the time resolution, and the most records per rank per ms */

/* The supervisor's recorder for its local ranks first_rank .. first_rank + n - 1. */
struct ga_logtimes {
    int ifd; /* inotify on the run directory; -1 when recording is off */
    int fd;  /* log-times, appended to */
    char dir[PATH_MAX];
    int first_rank, n;
    long long start_ms;   /* monotonic ms the times count from */
    long long *size;      /* per local rank: the size last recorded */
    unsigned char *dirty; /* per local rank: grew since */
    long long next_ms;    /* monotonic ms before which no record is written */
};

/* Starts recording for the ranks' logs in dir (before they are spawned). Returns 0, or -1 with
 * recording off (the run goes on; its logs are then read rank by rank). */
int ga_logtimes_open(struct ga_logtimes *lt, const char *dir, int first_rank, int n);

/* The descriptor to poll for input, or -1 when recording is off. */
int ga_logtimes_fd(const struct ga_logtimes *lt);

/* Milliseconds until a deferred record is due, or -1 when none is waiting. */
int ga_logtimes_timeout(const struct ga_logtimes *lt);

/* Reads what inotify reported and writes the records that are due. */
void ga_logtimes_update(struct ga_logtimes *lt);

/* Records every rank's log size now (at the end of an attempt or of the run). */
void ga_logtimes_flush(struct ga_logtimes *lt);

/* Stops recording and frees what lt holds; safe on a closed or failed recorder. */
void ga_logtimes_close(struct ga_logtimes *lt);

/* A reader of a run's log-times, which may still be growing. */
struct ga_logtimes_reader {
    int fd;      /* -1 until the file exists */
    int version; /* 0 until the first line is read; -1 for a version this agent does not know */
    char line[96];
    size_t len; /* bytes of an unfinished line in `line` */
};

/* Called for each record: rank's log held `size` bytes at `ms`. */
typedef void (*ga_logtimes_fn)(void *ctx, int rank, long long size, long long ms);

void ga_logtimes_reader_init(struct ga_logtimes_reader *r);

/* Reads the records added to dir's log-times since the last call and passes each to fn. A
 * missing file, an unknown version or a malformed line yields no records (never an error). */
void ga_logtimes_read(struct ga_logtimes_reader *r, const char *dir, ga_logtimes_fn fn, void *ctx);

void ga_logtimes_reader_close(struct ga_logtimes_reader *r);

#endif
