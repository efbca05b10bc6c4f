/* procs: finding and signalling every process of a run (see procs.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "procs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pgroup.h"

void ga_proclist_release(struct ga_proclist *l)
{
    free(l->v);
    memset(l, 0, sizeof(*l));
}

static int proclist_add(struct ga_proclist *l, const struct ga_proc *p)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct ga_proc *v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return -1;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = *p;
    return 0;
}

/* ---- reading /proc ----------------------------------------------------------------------- */

/* A process as /proc/PID/stat shows it. */
struct entry {
    struct ga_proc p;
    long ppid;
    char state;
    signed char ours; /* descendant of the supervisor: 1 yes, 0 no, -1 not yet known */
};

/* Reads /proc/pid/stat into e. Returns 0, or -1 when the process is gone. */
static int read_stat(long pid, struct entry *e)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* the name (field 2) may hold spaces and parentheses: it ends at the last ')' */
    char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
    if (!open_paren || !close_paren || close_paren < open_paren)
        return -1;
    memset(e, 0, sizeof(*e));
    size_t len = (size_t)(close_paren - open_paren - 1);
    len = len < sizeof(e->p.name) - 1 ? len : sizeof(e->p.name) - 1;
    memcpy(e->p.name, open_paren + 1, len);
    /* fields 3.. : state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
     * stime cutime cstime priority nice num_threads itrealvalue starttime */
    if (sscanf(close_paren + 2,
               "%c %ld %ld %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
               "%*s %*s %*s %lld",
               &e->state, &e->ppid, &e->p.pgid, &e->p.start) != 4)
        return -1;
    e->p.pid = pid;
    e->ours = -1;
    return 0;
}

static int entry_cmp(const void *a, const void *b)
{
    long x = ((const struct entry *)a)->p.pid, y = ((const struct entry *)b)->p.pid;
    return (x > y) - (x < y);
}

/* Every process in /proc, sorted by pid, in *out (n entries, the caller frees). */
static int scan(struct entry **out, size_t *n)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    size_t cap = 256;
    struct entry *v = malloc(cap * sizeof(*v));
    *n = 0;
    for (struct dirent *de; v && (de = readdir(d));) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        if (*n == cap) {
            struct entry *w = realloc(v, 2 * cap * sizeof(*v));
            if (!w) {
                free(v);
                v = NULL;
                break;
            }
            v = w, cap *= 2;
        }
        if (read_stat(pid, &v[*n]) == 0)
            (*n)++;
    }
    closedir(d);
    if (!v)
        return -1;
    qsort(v, *n, sizeof(*v), entry_cmp);
    *out = v;
    return 0;
}

static struct entry *lookup(struct entry *v, size_t n, long pid)
{
    struct entry key = {.p.pid = pid};
    return bsearch(&key, v, n, sizeof(*v), entry_cmp);
}

/* 1 if e descends from sup: walks up the parent links, remembering the answer on the way. */
static int descends(struct entry *v, size_t n, struct entry *e, long sup)
{
    struct entry *chain[64];
    size_t depth = 0;
    int ours = -1;
    for (struct entry *at = e; at && depth < 64; at = lookup(v, n, at->ppid)) {
        if (at->ours >= 0) {
            ours = at->ours;
            break;
        }
        chain[depth++] = at;
        if (at->ppid == sup || at->ppid <= 1) {
            ours = at->ppid == sup;
            break;
        }
    }
    if (ours < 0) /* deeper than we look, or a parent that exited since the scan */
        return 0;
    for (size_t i = 0; i < depth; i++)
        chain[i]->ours = (signed char)ours;
    return ours;
}

/* 1 if /proc/pid/environ holds exactly the entry `mark` ("NAME=value"). */
static int has_env(long pid, const char *mark)
{
    char path[64];
    static char *buf;
    static size_t cap;
    snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0; /* gone, or not ours to read (and then not ours to signal either) */
    size_t len = 0;
    for (;;) {
        if (cap - len < 4096) {
            char *b = realloc(buf, cap ? 2 * cap : 65536);
            if (!b)
                break;
            buf = b, cap = cap ? 2 * cap : 65536;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    size_t m = strlen(mark);
    for (size_t at = 0; buf && at < len; at += strnlen(buf + at, len - at) + 1)
        if (len - at >= m && memcmp(buf + at, mark, m) == 0 && (at + m == len || !buf[at + m]))
            return 1;
    return 0;
}

/* 1 if pid is listed in the cgroup's cgroup.procs. */
static int in_cgroup(const char *cgroup, long pid)
{
    char path[PATH_MAX + 32];
    if (!cgroup[0] || snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup) >= (int)sizeof(path))
        return 0;
    FILE *fp = fopen(path, "re");
    long member;
    int found = 0;
    while (fp && !found && fscanf(fp, "%ld", &member) == 1)
        found = member == pid;
    if (fp)
        fclose(fp);
    return found;
}

static int marked(const struct ga_procs *p, long pid)
{
    char mark[PATH_MAX + 32];
    if (p->dir[0]) {
        snprintf(mark, sizeof(mark), "GPUSYNC_RUN_DIR=%s", p->dir);
        if (has_env(pid, mark))
            return 1;
    }
    return in_cgroup(p->cgroup, pid);
}

/* 1 when e is gone for good: exiting, or a zombie with no thread left. A zombie leader whose
 * main thread ended (pthread_exit) while other threads run shows state Z, yet lives on. */
static int dead(const struct entry *e)
{
    if (e->state == 'X')
        return 1;
    if (e->state != 'Z')
        return 0;
    char path[64], line[128];
    snprintf(path, sizeof(path), "/proc/%ld/status", e->p.pid);
    FILE *fp = fopen(path, "re");
    long threads = 1;
    while (fp && fgets(line, sizeof(line), fp))
        if (sscanf(line, "Threads: %ld", &threads) == 1)
            break;
    if (fp)
        fclose(fp);
    return threads <= 1;
}

/* 1 when `pid` is in l already. */
static int listed(const struct ga_proclist *l, long pid)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].pid == pid)
            return 1;
    return 0;
}

/* Adds the members of the run's cgroup the /proc walk did not meet: a process that forks and
 * exits again and again (each time under a new pid, perhaps below where the walk had got) is
 * missed by any walk, but never by the cgroup, whose list is read in one go. */
static int add_cgroup_members(const struct ga_procs *p, long self, struct ga_proclist *out)
{
    char path[PATH_MAX + 32];
    if (!p->cgroup[0] ||
        snprintf(path, sizeof(path), "%s/cgroup.procs", p->cgroup) >= (int)sizeof(path))
        return 0;
    FILE *fp = fopen(path, "re");
    long pid;
    int rc = 0;
    struct entry e;
    while (fp && rc == 0 && fscanf(fp, "%ld", &pid) == 1)
        if (pid != self && pid != p->supervisor && !listed(out, pid) && read_stat(pid, &e) == 0 &&
            !dead(&e))
            rc = proclist_add(out, &e.p);
    if (fp)
        fclose(fp);
    return rc;
}

int ga_procs_find(const struct ga_procs *p, int which, struct ga_proclist *out)
{
    struct entry *v;
    size_t n;
    if (scan(&v, &n) < 0)
        return -1;
    long self = (long)getpid();
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct entry *e = &v[i];
        if (e->p.pid == self || e->p.pid == p->supervisor || dead(e))
            continue;
        int ours =
            (which & GA_PROCS_DESCENDANTS) && p->supervisor > 1 && descends(v, n, e, p->supervisor);
        if (!ours && (which & GA_PROCS_MARKED))
            ours = marked(p, e->p.pid);
        if (ours)
            rc = proclist_add(out, &e->p);
    }
    free(v);
    return rc == 0 ? add_cgroup_members(p, self, out) : rc;
}

int ga_procs_stopped(struct ga_proclist *out)
{
    struct entry *v;
    size_t n;
    if (scan(&v, &n) < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (v[i].state == 'T' || v[i].state == 't')
            rc = proclist_add(out, &v[i].p);
    free(v);
    return rc;
}

/* ---- signals ----------------------------------------------------------------------------- */

/* Sends sig to the process pr names, if that pid is still the process found. 1 if sent. */
static int signal_one(const struct ga_proc *pr, int sig)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pr->pid, 0);
    if (fd >= 0) {
        /* the pidfd pins the process: once its start time matches, the signal reaches it */
        int sent = ga_pgroup_start_ticks(pr->pid) == pr->start &&
                   syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0) == 0;
        close(fd);
        return sent;
    }
    if (errno != ENOSYS)
        return 0; /* gone */
#endif
    return ga_pgroup_start_ticks(pr->pid) == pr->start && kill((pid_t)pr->pid, sig) == 0;
}

size_t ga_procs_signal(const struct ga_proclist *l, int sig)
{
    size_t sent = 0;
    for (size_t i = 0; i < l->n; i++)
        sent += (size_t)signal_one(&l->v[i], sig);
    for (size_t i = 0; sig == SIGTERM && i < l->n; i++) /* as ga_pgroup_signal, not counted */
        signal_one(&l->v[i], SIGCONT);
    return sent;
}

void ga_proclist_describe(const struct ga_proclist *l, size_t show, char *buf, size_t cap)
{
    size_t at = 0;
    int n = snprintf(buf, cap, "%zu process%s", l->n, l->n == 1 ? "" : "es");
    for (size_t i = 0; n >= 0 && (at += (size_t)n) < cap && i < l->n && i < show; i++)
        n = snprintf(buf + at, cap - at, "%s%ld %s", i ? ", " : " (pid ", l->v[i].pid,
                     l->v[i].name);
    if (at < cap && l->n > 0)
        snprintf(buf + at, cap - at, "%s)", l->n > show ? ", ..." : "");
}

/* ---- the run's cgroup -------------------------------------------------------------------- */

/* The cgroup2 mount point and the root it shows (mountinfo fields 5 and 4). Returns 0 or -1. */
static int cgroup2_mount(char *mnt, size_t cap, char *root, size_t rcap)
{
    FILE *fp = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    int found = 0;
    while (fp && !found && fgets(line, sizeof(line), fp)) {
        char r[PATH_MAX], m[PATH_MAX], *dash = strstr(line, " - ");
        if (dash && strncmp(dash + 3, "cgroup2 ", 8) == 0 &&
            sscanf(line, "%*s %*s %*s %4095s %4095s", r, m) == 2)
            found =
                snprintf(mnt, cap, "%s", m) < (int)cap && snprintf(root, rcap, "%s", r) < (int)rcap;
    }
    if (fp)
        fclose(fp);
    return found ? 0 : -1;
}

/* The caller's cgroup v2 path ("0::/path" in /proc/self/cgroup). Returns 0 or -1. */
static int own_cgroup(char *buf, size_t cap)
{
    FILE *fp = fopen("/proc/self/cgroup", "re");
    char line[PATH_MAX + 16];
    int found = 0;
    while (fp && !found && fgets(line, sizeof(line), fp))
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            found = snprintf(buf, cap, "%s", line + 3) < (int)cap;
        }
    if (fp)
        fclose(fp);
    return found ? 0 : -1;
}

void ga_procs_cgroup_make(struct ga_procs *p)
{
    char mnt[PATH_MAX], root[PATH_MAX], own[PATH_MAX];
    p->cgroup[0] = '\0';
    if (cgroup2_mount(mnt, sizeof(mnt), root, sizeof(root)) < 0 || own_cgroup(own, sizeof(own)) < 0)
        return;
    /* a mount of a subtree shows paths below its root */
    const char *rel = own;
    size_t rl = strlen(root);
    if (strcmp(root, "/") != 0 && strncmp(own, root, rl) == 0)
        rel = own + rl;
    while (*rel == '/')
        rel++;
    char dir[PATH_MAX];
    int n = snprintf(dir, sizeof(dir), "%s%s%s/gpusync-run-%s-%ld", mnt, *rel ? "/" : "", rel,
                     p->id, p->supervisor);
    if (n < 0 || (size_t)n >= sizeof(dir) || mkdir(dir, 0755) < 0)
        return; /* an existing one may be someone else's */
    snprintf(p->cgroup, sizeof(p->cgroup), "%s", dir);
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX + 32];
    if (!dir[0] || snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return -1;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    return w == (ssize_t)strlen(text) ? 0 : -1;
}

int ga_procs_cgroup_enter(const struct ga_procs *p)
{
    return write_file(p->cgroup, "cgroup.procs", "0");
}

int ga_procs_cgroup_kill(const struct ga_procs *p)
{
    return write_file(p->cgroup, "cgroup.kill", "1");
}

int ga_procs_cgroup_remove(struct ga_procs *p)
{
    if (!p->cgroup[0] || rmdir(p->cgroup) < 0)
        return -1;
    p->cgroup[0] = '\0';
    return 0;
}

/* The value of `key` in a "key value" per line file, or -1. */
static long long keyed_value(const char *path, const char *key)
{
    FILE *fp = fopen(path, "re");
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fp && v < 0 && fgets(line, sizeof(line), fp))
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ')
            v = atoll(line + kl + 1);
    if (fp)
        fclose(fp);
    return v;
}

long long ga_procs_oom_kills(const struct ga_procs *p, const char **scope)
{
    char path[PATH_MAX + 32];
    long long v = -1;
    if (p->cgroup[0] &&
        snprintf(path, sizeof(path), "%s/memory.events", p->cgroup) < (int)sizeof(path) &&
        (v = keyed_value(path, "oom_kill")) >= 0) {
        if (scope)
            *scope = "cgroup";
        return v;
    }
    v = keyed_value("/proc/vmstat", "oom_kill");
    if (scope)
        *scope = "machine";
    return v;
}
