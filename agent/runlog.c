/* runlog: `tail` (see runlog.h). Each pass reads status.json first and the logs second, so the
 * final X frame is only sent after the bytes that were in the logs when the run ended. Waiting
 * is an inotify watch on the run directory (rank writes raise IN_MODIFY, status.json's rename
 * IN_MOVED_TO), so a line reaches stdout within a few milliseconds of its write.
 *
 * With several ranks, what a pass finds goes out in the order it was written, by the times the
 * supervisor recorded in log-times (logtimes.h): a backlog (`logs`, `logs -f` on a running run,
 * a resumed follow) reads as the ranks printed it, not rank by rank. Bytes no record covers yet
 * (just written, or a run from an older agent) come last in a pass, rank by rank. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "runlog.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "logtimes.h"
#include "proto/run.h"
#include "runs.h"
#include "wrapper.h"

#define TAIL_CHUNK      (64 * 1024) /* longest frame; also the longest line kept whole */
#define TAIL_PARTIAL_MS 200         /* how long --follow holds back a partial line */
#define TAIL_POLL_MS    20          /* polling period without inotify */
/* The client refuses an L frame longer than GS_PROTO_RUN_MAX_CHUNK (C99: no _Static_assert). */
typedef char ga_tail_chunk_fits[TAIL_CHUNK <= GS_PROTO_RUN_MAX_CHUNK ? 1 : -1];
#define TAIL_CHECK_MS 250 /* re-check of a silent run (a vanished supervisor) */

/* A time record of a rank's log: it held `size` bytes at `ms` (logtimes.h). */
struct tail_time {
    long long size, ms;
};

struct tail_rank {
    int rank;
    int fd; /* rank<rank>.log, -1 until it exists */
    long long off;
    long long held_since;    /* monotonic ms when a partial line was first held back, 0 if none */
    struct tail_time *times; /* records past off, oldest first: times[head .. n_times) */
    size_t head, n_times, cap_times;
};

struct tail {
    char dir[PATH_MAX];
    struct tail_rank *r;
    int n;
    size_t cap; /* entries r has room for */
    int follow;
    struct ga_logtimes_reader times; /* read only when more than one rank is tailed */
    char buf[TAIL_CHUNK];
};

/* Returns the rank entry for rank, adding it if new. */
static struct tail_rank *rank_find(struct tail *t, int rank);

static struct tail_rank *rank_entry(struct tail *t, int rank)
{
    struct tail_rank *found = rank_find(t, rank);
    if (found)
        return found;
    GA_ALLOC_GROW(t->r, (size_t)t->n + 1, t->cap);
    struct tail_rank *r = &t->r[t->n++];
    memset(r, 0, sizeof(*r));
    r->rank = rank;
    r->fd = -1;
    return r;
}

/* Finds the entry of rank, or NULL. */
static struct tail_rank *rank_find(struct tail *t, int rank)
{
    for (int i = 0; i < t->n; i++)
        if (t->r[i].rank == rank)
            return &t->r[i];
    return NULL;
}

/* Parses "0,1" (ranks: each is added) or "0:123,1:0" (offsets: applied to ranks already
 * selected; others are ignored). Returns 0 or -1 if malformed. */
static int parse_list(struct tail *t, const char *s, int offsets)
{
    while (*s) {
        char *e;
        long rank = strtol(s, &e, 10);
        long long off = 0;
        if (e == s || rank < 0 || rank > INT_MAX)
            return -1;
        if (offsets) {
            if (*e != ':')
                return -1;
            s = e + 1;
            off = strtoll(s, &e, 10);
            if (e == s || off < 0)
                return -1;
        }
        if (*e && *e != ',')
            return -1;
        struct tail_rank *r = offsets ? rank_find(t, (int)rank) : rank_entry(t, (int)rank);
        if (r)
            r->off = off;
        s = *e ? e + 1 : e;
    }
    return 0;
}

/* Adds every rank the run has (from status.json). */
static void add_all_ranks(struct tail *t, const struct ga_runs_status *st)
{
    for (int i = 0; i < st->nranks; i++)
        rank_entry(t, st->ranks[i].rank);
}

/* Opens the rank's log if it exists by now. */
static void open_log(const struct tail *t, struct tail_rank *r)
{
    char name[32], path[PATH_MAX];
    snprintf(name, sizeof(name), "rank%d.log", r->rank);
    if (r->fd < 0 && ga_runs_join(path, sizeof(path), t->dir, name) == 0)
        r->fd = open(path, O_RDONLY | O_CLOEXEC);
}

/* Writes one L frame. Returns 0, or -1 if stdout is gone. */
static int send_frame(const struct tail_rank *r, const char *p, size_t n)
{
    char hdr[96];
    int h = gs_proto_run_log_format(hdr, sizeof(hdr), r->rank, r->off, n);
    return ga_write_all(1, hdr, (size_t)h) < 0 || ga_write_all(1, p, n) < 0 ? -1 : 0;
}

/* Length of the part of p[0..n) that ends at its last line end, 0 if none. */
static size_t whole_lines(const char *p, size_t n)
{
    while (n > 0 && p[n - 1] != '\n' && p[n - 1] != '\r')
        n--;
    return n;
}

/* How many of the n bytes read may go out now (see the frame rule in runlog.h). */
static size_t sendable(struct tail *t, struct tail_rank *r, size_t n, int ended)
{
    if (n == 0) { /* nothing new: nothing held (a held start would end every wait at once) */
        r->held_since = 0;
        return 0;
    }
    size_t whole = whole_lines(t->buf, n);
    if (whole > 0 || n == TAIL_CHUNK || ended || !t->follow)
        return whole > 0 ? whole : n;
    long long now = ga_runs_mono_ms();
    if (!r->held_since)
        r->held_since = now;
    return now - r->held_since >= TAIL_PARTIAL_MS ? n : 0;
}

/* ---- time order --------------------------------------------------------------------------- */

/* Keeps a time record for a tailed rank, unless its bytes were sent already. */
static void add_time(void *ctx, int rank, long long size, long long ms)
{
    struct tail_rank *r = rank_find(ctx, rank);
    if (!r || size <= r->off || (r->n_times > r->head && size <= r->times[r->n_times - 1].size))
        return;
    if (r->n_times == r->cap_times) {
        if (r->head > 0) { /* reuse the room of records already passed */
            memmove(r->times, r->times + r->head, (r->n_times - r->head) * sizeof(*r->times));
            r->n_times -= r->head;
            r->head = 0;
        }
        GA_ALLOC_GROW(r->times, r->n_times + 1, r->cap_times);
    }
    r->times[r->n_times].size = size;
    r->times[r->n_times++].ms = ms;
}

/* Drops the records of bytes that were sent. */
static void pass_times(struct tail_rank *r)
{
    while (r->head < r->n_times && r->times[r->head].size <= r->off)
        r->head++;
}

/* The first record of rank r at or past `end` bytes (when they had all been written), or NULL
 * when none is there yet. */
static const struct tail_time *time_at(const struct tail_rank *r, long long end)
{
    for (size_t i = r->head; i < r->n_times; i++)
        if (r->times[i].size >= end)
            return &r->times[i];
    return NULL;
}

/* Length of the first line of p[0..n), its line end included; n if it has none. */
static size_t first_line(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n' || p[i] == '\r')
            return i + 1;
    return n;
}

/* Reads up to n bytes of r's log at r->off into t->buf. Returns the count (0 at the end). */
static size_t read_at(struct tail *t, struct tail_rank *r, size_t n)
{
    for (;;) {
        ssize_t got = pread(r->fd, t->buf, n, (off_t)r->off);
        if (got < 0 && errno == EINTR)
            continue;
        return got > 0 ? (size_t)got : 0;
    }
}

/* The length of rank r's next frame (0: nothing to send now) and, in *when, the time it was
 * written. A frame holds the whole lines of one time record at most, so that lines of another
 * rank written in between can go out between them. Leaves the frame's bytes in t->buf. */
static size_t next_frame(struct tail *t, struct tail_rank *r, int ended, long long *when)
{
    open_log(t, r);
    if (r->fd < 0)
        return 0;
    if (r->head < r->n_times && r->times[r->head].size - r->off < TAIL_CHUNK) {
        /* the common case, reading no more than the record covers */
        size_t k = whole_lines(t->buf, read_at(t, r, (size_t)(r->times[r->head].size - r->off)));
        *when = r->times[r->head].ms;
        if (k > 0)
            return k;
    }
    size_t k = sendable(t, r, read_at(t, r, TAIL_CHUNK), ended);
    /* The first line ended in a later record: cut at that record, so that the lines after it,
     * written later, keep their own times. */
    const struct tail_time *first = time_at(r, r->off + (long long)first_line(t->buf, k));
    if (first && first->size < r->off + (long long)k)
        k = whole_lines(t->buf, (size_t)(first->size - r->off));
    *when = first ? first->ms : LLONG_MAX;
    return k;
}

/* Sends rank r's next frame of k bytes (read again: t->buf may hold another rank's by now).
 * Returns 0, 1 when the bytes are gone (the log was truncated), or -1 if stdout is gone. */
static int send_next(struct tail *t, struct tail_rank *r, size_t k)
{
    size_t n = read_at(t, r, k);
    if (n == 0)
        return 1;
    if (send_frame(r, t->buf, n) < 0)
        return -1;
    r->off += (long long)n;
    r->held_since = 0;
    pass_times(r);
    return 0;
}

/* Sends what the logs hold beyond each rank's offset, oldest first: repeatedly the frame with
 * the earliest time among the ranks' next frames (ties: the lower rank). Returns 0, or -1 if
 * stdout is gone. */
static int drain(struct tail *t, int ended)
{
    if (t->n > 1)
        ga_logtimes_read(&t->times, t->dir, add_time, t);
    long long *when = malloc((size_t)t->n * sizeof(*when));
    size_t *len = malloc((size_t)t->n * sizeof(*len));
    int rc = when && len ? 0 : -1;
    for (int i = 0; i < t->n && rc == 0; i++)
        len[i] = next_frame(t, &t->r[i], ended, &when[i]);
    while (rc == 0) {
        int best = -1;
        for (int i = 0; i < t->n; i++)
            if (len[i] > 0 && (best < 0 || when[i] < when[best]))
                best = i;
        if (best < 0)
            break;
        rc = send_next(t, &t->r[best], len[best]);
        len[best] = rc == 0 ? next_frame(t, &t->r[best], ended, &when[best]) : 0;
        rc = rc > 0 ? 0 : rc;
    }
    free(when);
    free(len);
    return rc;
}

/* Reads the run's state: 1 if it has ended (code and state filled in), 0 if it runs on. */
static int run_ended(const struct tail *t, int *code, char *state, size_t cap)
{
    struct ga_runs_status st;
    if (ga_runs_read_status(t->dir, &st) < 0) {
        /* No status yet: starting while the supervisor holds its lock, else it never will. */
        if (ga_runs_supervisor_alive(t->dir))
            return 0;
        snprintf(state, cap, "lost");
        *code = -1;
        return 1;
    }
    int ended = strcmp(st.state, "running") != 0;
    snprintf(state, cap, "%s", st.state);
    *code = st.exit_code;
    if (!ended && !ga_runs_supervisor_alive(t->dir)) {
        /* A last look, in case the supervisor wrote its final status while exiting. */
        ga_runs_status_release(&st);
        int late = ga_runs_read_status(t->dir, &st) == 0 && strcmp(st.state, "running") != 0;
        snprintf(state, cap, "%s", late ? st.state : "lost");
        *code = late ? st.exit_code : -1;
        ended = 1;
    }
    ga_runs_status_release(&st);
    return ended;
}

/* Writes the X line: the run's exit code and state, and the summary of how it ended. */
static int write_end(const struct tail *t, int code, const char *state)
{
    struct ga_runs_status st;
    struct ga_jw summary;
    ga_jw_init(&summary);
    if (ga_runs_read_status(t->dir, &st) == 0) {
        snprintf(st.state, sizeof(st.state), "%s", state); /* "lost" is only derived */
        ga_runs_summary_json(t->dir, &st, &summary);
        ga_runs_status_release(&st);
    }
    size_t cap = summary.len + 96;
    char *x = malloc(cap);
    int n = x ? gs_proto_run_exit_format(x, cap, code, state, summary.buf) : -1;
    int rc = n < 0 ? -1 : ga_write_all(1, x, (size_t)n);
    free(x);
    ga_jw_release(&summary);
    return rc;
}

/* Milliseconds to wait for the next pass. */
static int wait_ms(const struct tail *t, int inotify_fd)
{
    long long now = ga_runs_mono_ms(), ms = inotify_fd >= 0 ? TAIL_CHECK_MS : TAIL_POLL_MS;
    for (int i = 0; i < t->n; i++)
        if (t->r[i].held_since && t->r[i].held_since + TAIL_PARTIAL_MS - now < ms)
            ms = t->r[i].held_since + TAIL_PARTIAL_MS - now;
    return ms < 0 ? 0 : (int)ms;
}

/* Waits for a change in the run directory (or a timeout). Returns -1 if stdout closed. */
static int wait_change(const struct tail *t, int ifd)
{
    struct pollfd p[2] = {{1, 0, 0}, {ifd, POLLIN, 0}};
    int n = poll(p, ifd >= 0 ? 2 : 1, wait_ms(t, ifd));
    if (n > 0 && (p[0].revents & (POLLERR | POLLHUP)))
        return -1;
    char ev[4096];
    if (n > 0 && ifd >= 0 && (p[1].revents & POLLIN))
        while (read(ifd, ev, sizeof(ev)) > 0)
            ;
    return 0;
}

/* The streaming loop. Returns the exit status. */
static int tail_run(struct tail *t)
{
    int ifd = -1;
    if (t->follow) {
        ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (ifd >= 0 &&
            inotify_add_watch(ifd, t->dir, IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) <
                0) {
            close(ifd);
            ifd = -1; /* e.g. no watches left: fall back to polling */
        }
    }
    int rc = 0;
    for (;;) {
        int code = -1;
        char state[32] = "";
        int ended = run_ended(t, &code, state, sizeof(state));
        rc = drain(t, ended);
        if (rc == 0 && ended)
            rc = write_end(t, code, state);
        if (rc < 0 || ended || !t->follow || (rc = wait_change(t, ifd)) < 0)
            break;
    }
    if (ifd >= 0)
        close(ifd);
    return rc < 0 ? 1 : 0;
}

/* Parses the arguments into t. Returns 0, or -1 (usage printed). */
static int tail_args(struct tail *t, int argc, char **argv, const char **root, const char **id,
                     const char **ranks, const char **offsets)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--follow") || !strcmp(a, "-f"))
            t->follow = 1;
        else if (v && !strcmp(a, "--root"))
            *root = v, i++;
        else if (v && !strcmp(a, "--id"))
            *id = v, i++;
        else if (v && !strcmp(a, "--ranks"))
            *ranks = v, i++;
        else if (v && !strcmp(a, "--offsets"))
            *offsets = v, i++;
        else
            *root = NULL, i = argc;
    }
    int ok = *root && *id && (!strcmp(*ranks, "all") || parse_list(t, *ranks, 0) == 0);
    if (!ok)
        fprintf(stderr, "usage: gpusync-agent tail --root DIR --id ID [--ranks all|0,1] "
                        "[--offsets R:OFF,R:OFF] [--follow]\n");
    return ok ? 0 : -1;
}

int ga_tail_main(int argc, char **argv)
{
    static struct tail t; /* holds the 64 KiB read buffer */
    const char *root = NULL, *arg = NULL, *ranks = "all", *offsets = NULL;
    char id[GS_PROTO_RUN_ID_MAX + 1], err[PATH_MAX + 256];
    memset(&t, 0, sizeof(t));
    ga_logtimes_reader_init(&t.times);
    signal(SIGPIPE, SIG_IGN); /* a vanished reader is a write error, not a silent death */
    if (tail_args(&t, argc, argv, &root, &arg, &ranks, &offsets) < 0)
        return free(t.r), 2;
    if (ga_runs_resolve(root, arg, id, sizeof(id), err, sizeof(err)) < 0) {
        fprintf(stderr, "gpusync-agent tail: %s\n", err);
        return free(t.r), 1;
    }
    ga_runs_path(t.dir, sizeof(t.dir), root, id);
    struct ga_runs_status st;
    if (!strcmp(ranks, "all") && ga_runs_read_status(t.dir, &st) == 0) {
        add_all_ranks(&t, &st);
        ga_runs_status_release(&st);
    }
    if (offsets && parse_list(&t, offsets, 1) < 0) {
        fprintf(stderr, "gpusync-agent tail: --offsets wants RANK:OFFSET,... (got '%s')\n",
                offsets);
        return free(t.r), 2;
    }
    int rc = tail_run(&t);
    for (int i = 0; i < t.n; i++) {
        if (t.r[i].fd >= 0)
            close(t.r[i].fd);
        free(t.r[i].times);
    }
    ga_logtimes_reader_close(&t.times);
    free(t.r);
    return rc;
}
