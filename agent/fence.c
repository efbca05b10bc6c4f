/* agent/fence.c: the root's writer lock, fencing a stalled session out, and the sweep of
 * dead agents' temporaries (see fence.h). */
/* POSIX.1-2008 with XSI (kill, nanosleep); _GNU_SOURCE from the top-level build is fine too. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "fence.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"

#define DIR_FLAGS       (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define RETRY_NS        10000000L /* 10 ms between attempts to take the lock */
#define SWEEP_MAX_DEPTH 256
#define AGENT_NAME      "gpusync-agent"

void ga_fence_init(struct ga_fence *f)
{
    f->fd = -1;
    f->killed = 0;
    f->swept = 0;
}

/* Opens (creating them if missing) .gpusync and the lock file, without following a symlink.
 * Returns the descriptor or a negative errno. */
static int open_lock_file(int rootfd)
{
    char name[GA_FS_NAME_MAX + 1];
    int dirfd, rc = ga_fs_open_parent(rootfd, GA_FENCE_LOCK_PATH, 1, &dirfd, name);
    if (rc < 0)
        return rc;
    int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    rc = fd < 0 ? -errno : fd;
    close(dirfd);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        rc = -EINVAL; /* a FIFO or device planted there: never lock (or write) it */
    }
    return rc;
}

/* Tries to take the whole-file write lock once. Returns 0, -EAGAIN if another process holds it,
 * or another negative errno. */
static int try_lock(int fd)
{
    struct flock l;
    memset(&l, 0, sizeof(l));
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &l) == 0)
        return 0;
    return errno == EACCES || errno == EAGAIN ? -EAGAIN : -errno;
}

/* The pid holding the lock (as the kernel reports it), 0 if it is free or the holder is not
 * visible from here (another host, another pid namespace), or a negative errno. */
static long lock_holder(int fd)
{
    struct flock l;
    memset(&l, 0, sizeof(l));
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    if (fcntl(fd, F_GETLK, &l) < 0)
        return -errno;
    return l.l_type == F_UNLCK ? 0 : (long)l.l_pid;
}

/* True if /proc says pid runs `gpusync-agent* ... serve ...`; its argv[0] goes to what. */
static int is_serve_agent(long pid, char *what, size_t cap)
{
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
    snprintf(what, cap, "command line unreadable");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    snprintf(what, cap, "%.200s", buf);
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (strncmp(base, AGENT_NAME, strlen(AGENT_NAME)) != 0)
        return 0;
    for (const char *a = buf + strlen(buf) + 1; a < buf + n; a += strlen(a) + 1)
        if (strcmp(a, "serve") == 0)
            return 1;
    return 0;
}

/* Kills the holder `pid` after verifying it. Returns 0 or -EBUSY with the reason in err. */
static int kill_holder(long pid, const char *root, char *err, size_t errlen)
{
    char what[256];
    if (pid <= 0) {
        snprintf(err, errlen,
                 "%s is locked by a gpusync session on another host or in another PID namespace "
                 "(%s/%s); stop that session (gpusync watch --stop there), then connect again",
                 root, root, GA_FENCE_LOCK_PATH);
        return -EBUSY;
    }
    if (!is_serve_agent(pid, what, sizeof(what))) {
        snprintf(err, errlen,
                 "%s/%s is locked by pid %ld (%s), which is not a gpusync-agent serve session; "
                 "it was left alone: stop that process, then connect again",
                 root, GA_FENCE_LOCK_PATH, pid, what);
        return -EBUSY;
    }
    if (kill((pid_t)pid, SIGKILL) < 0 && errno != ESRCH) {
        snprintf(err, errlen,
                 "cannot stop the previous gpusync agent (pid %ld) writing %s: %s; stop it "
                 "(kill -9 %ld as its owner), then connect again",
                 pid, root, strerror(errno), pid);
        return -EBUSY;
    }
    return 0;
}

/* Milliseconds on a monotonic clock. */
static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The error once GA_FENCE_WAIT_MS passed without the lock: -EBUSY with err filled. */
static int wait_failed(const struct ga_fence *f, const char *root, char *err, size_t errlen)
{
    if (f->killed == 0) /* held all along by a process we cannot see */
        return kill_holder(0, root, err, errlen);
    snprintf(err, errlen,
             "the previous gpusync agent (pid %ld) writing %s did not exit within %d s of "
             "SIGKILL; check it with 'ps -o pid,stat,cmd -p %ld', then connect again",
             f->killed, root, GA_FENCE_WAIT_MS / 1000, f->killed);
    return -EBUSY;
}

/* Takes the lock on fd, fencing out (killing) verified agents that hold it, for at most
 * GA_FENCE_WAIT_MS. Returns 0 or a negative errno with err filled. */
static int lock_fencing(struct ga_fence *f, int fd, const char *root, char *err, size_t errlen)
{
    long long deadline = mono_ms() + GA_FENCE_WAIT_MS;
    struct timespec pause = {0, RETRY_NS};
    for (;;) {
        int rc = try_lock(fd);
        if (rc != -EAGAIN) {
            if (rc < 0)
                snprintf(err, errlen, "cannot lock %s/%s: %s", root, GA_FENCE_LOCK_PATH,
                         strerror(-rc));
            return rc;
        }
        long pid = lock_holder(fd); /* 0 (or < 0): released meanwhile, or invisible from here */
        if (pid > 0 && pid != f->killed) {
            if ((rc = kill_holder(pid, root, err, errlen)) < 0)
                return rc;
            f->killed = pid;
        }
        if (mono_ms() > deadline)
            return wait_failed(f, root, err, errlen);
        nanosleep(&pause, NULL);
    }
}

/* Records our pid in the lock file. Returns 0 or a negative errno. */
static int write_pid(int fd)
{
    char pid[32];
    int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        return errno ? -errno : -EIO;
    return 0;
}

int ga_fence_acquire(struct ga_fence *f, int rootfd, const char *root, char *err, size_t errlen)
{
    ga_fence_init(f);
    int fd = open_lock_file(rootfd);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s/%s: %s%s", root, GA_FENCE_LOCK_PATH, strerror(-fd),
                 fd == -ELOOP ? " (a symlink is in the way: remove it)" : "");
        return fd;
    }
    struct stat st;
    int rc = lock_fencing(f, fd, root, err, errlen);
    if (rc == 0 && fstat(fd, &st) < 0)
        rc = -errno;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    if ((rc = write_pid(fd)) < 0) /* still the only writer; a crash now just goes unswept */
        fprintf(stderr, "gpusync-agent: cannot write %s/%s: %s\n", root, GA_FENCE_LOCK_PATH,
                strerror(-rc));
    if (st.st_size > 0) /* the previous writer did not end cleanly */
        f->swept = ga_fence_sweep(rootfd);
    return 0;
}

void ga_fence_release(struct ga_fence *f, int clean)
{
    if (f->fd < 0)
        return;
    if (clean && ftruncate(f->fd, 0) < 0)
        fprintf(stderr, "gpusync-agent: cannot empty %s: %s\n", GA_FENCE_LOCK_PATH,
                strerror(errno));
    close(f->fd);
    f->fd = -1;
}

/* ---- the sweep ------------------------------------------------------------------------------ */

/* Parses a run of decimal digits at *p (advancing it) into *v. Returns 0 if there was none. */
static int digits(const char **p, unsigned long long *v)
{
    const char *s = *p;
    *v = 0;
    while (**p >= '0' && **p <= '9' && *p - s < 20)
        *v = *v * 10 + (unsigned long long)(*(*p)++ - '0');
    return *p > s;
}

/* True if name is exactly GS_PROTO_TMP_PREFIX<digits>-<digits> with a pid other than ours. */
static int is_stale_tmp(const char *name)
{
    if (!ga_fs_is_tmp(name))
        return 0;
    const char *p = name + strlen(GS_PROTO_TMP_PREFIX);
    unsigned long long pid, n;
    if (!digits(&p, &pid) || *p++ != '-' || !digits(&p, &n) || *p != '\0')
        return 0;
    return pid != (unsigned long long)getpid();
}

/* True if the entry cannot be a directory worth opening (known from readdir when it can tell). */
static int surely_not_dir(const struct dirent *de)
{
#ifdef DT_DIR
    return de->d_type != DT_DIR && de->d_type != DT_UNKNOWN;
#else
    (void)de;
    return 0;
#endif
}

/* Sweeps the directory open as fd (closed here); `skip` names a child not to enter, or NULL. */
static void sweep_dir(int fd, const char *skip, int depth, long *removed)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..") || (skip && !strcmp(name, skip)))
            continue;
        if (is_stale_tmp(name)) {
            if (unlinkat(dirfd(d), name, 0) == 0)
                (*removed)++;
            continue;
        }
        if (depth >= SWEEP_MAX_DEPTH || surely_not_dir(de))
            continue;
        int sub = openat(dirfd(d), name, DIR_FLAGS); /* fails on symlinks and non-directories */
        if (sub >= 0)
            sweep_dir(sub, depth == 0 && !strcmp(name, ".gpusync") ? "runs" : NULL, depth + 1,
                      removed);
    }
    closedir(d);
}

long ga_fence_sweep(int rootfd)
{
    long removed = 0;
    /* A new open file description: a dup of rootfd would share (and move) its read offset. */
    int fd = openat(rootfd, ".", DIR_FLAGS);
    if (fd >= 0)
        sweep_dir(fd, NULL, 0, &removed);
    return removed;
}
