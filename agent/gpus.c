/* gpus: GPU reservations through one lock file per GPU index (see gpus.h). A GPU is held while
 * some process holds an flock on DIR/<index>.lock; what the file says (run id, then project
 * directory, one per line) only names the holder. Launches probe and choose under
 * DIR/choose.lock; a queued launch sleeps on inotify until a holder's file is closed for the
 * last time (the supervisor opened it for writing, so its exit gives IN_CLOSE_WRITE). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "gpus.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHOOSE_LOCK "choose.lock"
#define HOLDER_MAX  600 /* "run ID in ROOT", cut short past this */

/* How long a queued launch sleeps at most between two looks, should an event be missed. */
#define WAIT_RECHECK_MS 5000

/* A GPU some run holds, as a refusal or a wait describes it. */
struct held {
    int index;
    char holder[HOLDER_MAX];
};

/* What one look at the lock files found. */
struct pick {
    int chosen[GA_GPUS_MAX], nchosen;
    struct held *held; /* GA_GPUS_MAX entries, owned */
    int nheld;
};

static void say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int ga_gpus_parse(const char *list, int *idx, int max)
{
    int n = 0;
    for (const char *p = list; *p; p += *p == ',') {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT_MAX || (*end && *end != ',') || n >= max)
            return -1;
        for (int i = 0; i < n; i++)
            if (idx[i] == v)
                return -1;
        idx[n++] = (int)v;
        p = end;
    }
    return n > 0 ? n : -1;
}

/* mkdir that accepts an existing directory, then checks that path is a real directory of ours
 * that nobody else can write. Returns 0 or -1 with the reason in err. */
static int own_dir(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    if (mkdir(path, 0700) < 0 && errno != EEXIST) {
        say(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    if (lstat(path, &sb) < 0) {
        say(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode) || sb.st_uid != getuid() || (sb.st_mode & 022)) {
        say(err, errlen,
            "%s is not a directory of user %ld that only it can write; remove it (or set "
            "GPUSYNC_GPU_LOCK_DIR)",
            path, (long)getuid());
        return -1;
    }
    return 0;
}

int ga_gpus_dir(char *buf, size_t cap, char *err, size_t errlen)
{
    const char *env = getenv("GPUSYNC_GPU_LOCK_DIR");
    char top[64];
    snprintf(top, sizeof(top), "/tmp/gpusync-%ld", (long)getuid());
    int n = env && *env ? snprintf(buf, cap, "%s", env) : snprintf(buf, cap, "%s/gpus", top);
    if (n < 0 || (size_t)n >= cap) {
        say(err, errlen, "GPUSYNC_GPU_LOCK_DIR is too long");
        return -1;
    }
    if (!(env && *env) && own_dir(top, err, errlen) < 0)
        return -1;
    return own_dir(buf, err, errlen);
}

/* Writes DIR/<index>.lock into buf (PATH_MAX bytes). Returns 0, or -1 (ENAMETOOLONG). */
static int lock_path(char *buf, const char *dir, int index)
{
    int n = snprintf(buf, PATH_MAX, "%s/%d.lock", dir, index);
    if (n >= 0 && n < PATH_MAX)
        return 0;
    errno = ENAMETOOLONG;
    return -1;
}

/* Reads the holder a lock file names into out ("run ID in ROOT"). */
static void read_holder(int fd, char *out, size_t cap)
{
    char text[HOLDER_MAX + 80];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    char *root = strchr(text, '\n');
    if (!root || !root[1]) {
        snprintf(out, cap, "a process that names no run");
        return;
    }
    *root++ = '\0';
    root[strcspn(root, "\n")] = '\0';
    if (snprintf(out, cap, "run %s in %s", text, root) >= (int)cap)
        snprintf(out + cap - 4, 4, "..."); /* a project path longer than anyone reads */
}

/* 1 when GPU index is held (its holder then in holder), 0 when it is free. An flock taken and
 * let go at once: under choose.lock no launch can take it in between. */
static int probe(const char *dir, int index, char *holder, size_t cap)
{
    char path[PATH_MAX];
    if (lock_path(path, dir, index) < 0)
        return 0;
    /* Read-only: closing it gives IN_CLOSE_NOWRITE, which queued launches do not wake for. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0; /* never reserved */
    int held = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    if (held)
        read_holder(fd, holder, cap);
    close(fd);
    return held;
}

static int int_cmp(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

static int held_cmp(const void *a, const void *b)
{
    return ((const struct held *)a)->index - ((const struct held *)b)->index;
}

/* Looks at every GPU of idx (n of them) in order and takes the first `want` free ones into
 * pk->chosen (ascending), recording the held ones. Returns 1 if it got `want`, else 0. */
static int pick(const char *dir, const int *idx, int n, int want, struct pick *pk)
{
    pk->nchosen = pk->nheld = 0;
    for (int i = 0; i < n; i++) {
        struct held *h = &pk->held[pk->nheld];
        if (probe(dir, idx[i], h->holder, sizeof(h->holder)))
            h->index = idx[i], pk->nheld++;
        else if (pk->nchosen < want)
            pk->chosen[pk->nchosen++] = idx[i];
    }
    qsort(pk->chosen, (size_t)pk->nchosen, sizeof(int), int_cmp);
    qsort(pk->held, (size_t)pk->nheld, sizeof(*pk->held), held_cmp);
    return pk->nchosen == want;
}

/* Appends to buf (cap bytes, NUL-terminated) as snprintf would. */
static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* Writes "GPUs 1,3 held by run A in /p; GPU 2 held by run B in /q": the held GPUs of pk grouped
 * by holder, in the order first seen. */
static void describe_held(const struct pick *pk, char *buf, size_t cap)
{
    int done[GA_GPUS_MAX] = {0};
    buf[0] = '\0';
    for (int i = 0; i < pk->nheld; i++) {
        if (done[i])
            continue;
        int same = 0;
        for (int j = i; j < pk->nheld; j++)
            same += !done[j] && !strcmp(pk->held[j].holder, pk->held[i].holder);
        append(buf, cap, "%sGPU%s ", buf[0] ? "; " : "", same > 1 ? "s" : "");
        for (int j = i, k = 0; j < pk->nheld; j++) {
            if (done[j] || strcmp(pk->held[j].holder, pk->held[i].holder))
                continue;
            append(buf, cap, "%s%d", k++ ? "," : "", pk->held[j].index);
            done[j] = 1;
        }
        append(buf, cap, " held by %s", pk->held[i].holder);
    }
}

/* The refusal (queue 0), or the text of the waiting line (queue 1: "for GPU 1: ..."), for a
 * pick that fell short. */
static void shortfall(const struct ga_gpus_req *req, int n, const struct pick *pk, int queue,
                      char *buf, size_t cap)
{
    char held[4096];
    describe_held(pk, held, sizeof(held));
    if (queue && req->count > 0)
        say(buf, cap, "for %d free GPU%s (%d of %d free now): %s", req->count,
            req->count == 1 ? "" : "s", n - pk->nheld, n, held);
    else if (queue)
        say(buf, cap, "for GPU%s %s: %s", n == 1 ? "" : "s", req->list, held);
    else if (req->count > 0)
        say(buf, cap,
            "%d GPU%s wanted, %d of %d free: %s (see 'gpusync ps' there); 'gpusync run --wait' "
            "queues until enough are free",
            req->count, req->count == 1 ? "" : "s", n - pk->nheld, n, held);
    else
        say(buf, cap,
            "GPU%s %s not free: %s (see 'gpusync ps' there); 'gpusync run --wait' queues until "
            "they are free",
            n == 1 ? "" : "s", req->list, held);
}

/* Opens and takes DIR/choose.lock (waiting for another launch's choice). Returns its descriptor
 * or -1 with the reason in err. */
static int take_choose_lock(const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/" CHOOSE_LOCK, dir);
    errno = ENAMETOOLONG;
    /* Read-only for the same reason as probe's. */
    int fd = n < 0 || n >= PATH_MAX ? -1 : open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
    while (fd >= 0 && flock(fd, LOCK_EX) < 0) {
        if (errno != EINTR) {
            int e = errno;
            close(fd);
            fd = -1;
            errno = e;
        }
    }
    if (fd < 0)
        say(err, errlen, "cannot lock %s: %s", path, strerror(errno));
    return fd;
}

/* 1 once stdout has no reader left: the client gave up (Ctrl-C) and the SSH channel is closed,
 * so a queued launch must not start a run nobody waits for any more. */
static int client_gone(void)
{
    struct pollfd p = {STDOUT_FILENO, 0, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP));
}

/* Sleeps until a lock file of dir was closed by a writer (a holder let go), or WAIT_RECHECK_MS.
 * Returns 0, or -1 when the client is gone (client_gone). */
static int await_release(int ino)
{
    struct pollfd p[2] = {{ino, POLLIN, 0}, {STDOUT_FILENO, 0, 0}};
    if (poll(p, 2, WAIT_RECHECK_MS) < 0 && errno != EINTR)
        return 0;
    if (p[1].revents & (POLLERR | POLLHUP))
        return -1;
    char ev[4096];
    while (read(ino, ev, sizeof(ev)) > 0)
        ;
    return 0;
}

/* Formats pk's chosen GPUs as "1,3" into out. */
static void chosen_list(const struct pick *pk, char *out, size_t cap)
{
    out[0] = '\0';
    for (int i = 0; i < pk->nchosen; i++)
        append(out, cap, "%s%d", i ? "," : "", pk->chosen[i]);
}

/* The choose-and-maybe-queue loop of ga_gpus_reserve, over a parsed list. */
static int reserve_loop(const struct ga_gpus_req *req, const char *dir, const int *idx, int n,
                        struct pick *pk, char *out, size_t cap, char *err, size_t errlen)
{
    int want = req->count > 0 ? req->count : n, ino = -1, rc;
    char last[4096] = "";
    if (req->wait && ((ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
                      inotify_add_watch(ino, dir, IN_CLOSE_WRITE | IN_DELETE) < 0)) {
        say(err, errlen, "cannot watch %s: %s", dir, strerror(errno));
        rc = GA_GPUS_ERROR;
        goto out;
    }
    for (;;) {
        int lk = take_choose_lock(dir, err, errlen);
        if (lk < 0 || pick(dir, idx, n, want, pk)) {
            rc = lk < 0 ? GA_GPUS_ERROR : lk;
            break;
        }
        close(lk);
        shortfall(req, n, pk, req->wait, err, errlen);
        if (!req->wait) {
            rc = GA_GPUS_BUSY;
            break;
        }
        if (strcmp(err, last) != 0 && req->waiting)
            req->waiting(err);
        snprintf(last, sizeof(last), "%s", err);
        if (await_release(ino) < 0) {
            say(err, errlen, "the client went away while the launch waited for GPUs");
            rc = GA_GPUS_GONE;
            break;
        }
    }
    if (rc >= 0 && req->wait && client_gone()) { /* gave up just as the GPUs came free */
        close(rc);
        say(err, errlen, "the client went away while the launch waited for GPUs");
        rc = GA_GPUS_GONE;
    }
    if (rc >= 0)
        chosen_list(pk, out, cap);
out:
    if (ino >= 0)
        close(ino);
    return rc;
}

int ga_gpus_reserve(const struct ga_gpus_req *req, char *out, size_t cap, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    int idx[GA_GPUS_MAX];
    int n = ga_gpus_parse(req->list, idx, GA_GPUS_MAX);
    if (n < 0 || req->count > n) {
        say(err, errlen, "bad GPU list '%s' for %d GPUs", req->list, req->count);
        return GA_GPUS_ERROR;
    }
    if (ga_gpus_dir(dir, sizeof(dir), err, errlen) < 0)
        return GA_GPUS_ERROR;
    struct pick pk = {.held = calloc(GA_GPUS_MAX, sizeof(struct held))};
    if (!pk.held) {
        say(err, errlen, "out of memory");
        return GA_GPUS_ERROR;
    }
    int rc = reserve_loop(req, dir, idx, n, &pk, out, cap, err, errlen);
    free(pk.held);
    return rc;
}

/* Takes GPU index's lock for good and names the holder. Returns the descriptor or -1. */
static int hold_one(const char *dir, int index, const char *id, const char *root)
{
    char path[PATH_MAX];
    if (lock_path(path, dir, index) < 0)
        return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno == EWOULDBLOCK ? EBUSY : errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (ftruncate(fd, 0) < 0 || dprintf(fd, "%s\n%s\n", id, root) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int ga_gpus_hold(const char *list, const char *id, const char *root)
{
    char dir[PATH_MAX], why[PATH_MAX + 200];
    int idx[GA_GPUS_MAX], fds[GA_GPUS_MAX];
    int n = ga_gpus_parse(list, idx, GA_GPUS_MAX);
    if (n < 0) {
        errno = EINVAL;
        return -1;
    }
    if (ga_gpus_dir(dir, sizeof(dir), why, sizeof(why)) < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if ((fds[i] = hold_one(dir, idx[i], id, root)) >= 0)
            continue;
        int e = errno;
        while (i-- > 0)
            close(fds[i]);
        errno = e;
        return -1;
    }
    return 0; /* fds stay open: they are the reservation */
}
