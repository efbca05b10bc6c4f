/* runs: run-directory files (meta.json, status.json, supervisor.lock), run-name resolution and
 * the `ps` and `stop` commands (see runs.h). Only the supervisor (launch.c) writes status.json
 * while it lives; stop writes it only for a run whose supervisor is gone. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "runs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jsonw.h"
#include "pgroup.h"
#include "procs.h"
#include "wrapper.h"

void ga_runs_status_release(struct ga_runs_status *st)
{
    free(st->ranks);
    memset(st, 0, sizeof(*st));
}

int ga_runs_id_valid(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > GS_PROTO_RUN_ID_MAX || id[0] == '.')
        return 0;
    return strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

int ga_runs_path(char *buf, size_t cap, const char *root, const char *id)
{
    int n = id ? snprintf(buf, cap, "%s/.gpusync/runs/%s", root, id)
               : snprintf(buf, cap, "%s/.gpusync/runs", root);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int ga_runs_join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

void ga_runs_now_iso(char *buf, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%03ldZ", day, ts.tv_nsec / 1000000);
}

long long ga_runs_iso_ms(const char *iso)
{
    struct tm tm;
    int ms = 0;
    memset(&tm, 0, sizeof(tm));
    if (sscanf(iso, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) < 6)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (long long)timegm(&tm) * 1000 + ms;
}

long long ga_runs_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ga_runs_write_atomic(const char *dir, const char *name, const char *data, size_t len)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    char tmpname[NAME_MAX + 1];
    snprintf(tmpname, sizeof(tmpname), ".%.200s.tmp.%ld", name, (long)getpid());
    if (ga_runs_join(dst, sizeof(dst), dir, name) < 0 ||
        ga_runs_join(tmp, sizeof(tmp), dir, tmpname) < 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = ga_write_all(fd, data, len);
    int saved = errno;
    if (close(fd) < 0 && rc == 0)
        rc = -1, saved = errno;
    if (rc == 0 && rename(tmp, dst) < 0)
        rc = -1, saved = errno;
    if (rc < 0)
        unlink(tmp);
    errno = saved;
    return rc;
}

/* 1 if obj's key holds JSON true. */
static int json_true(struct ga_json_span obj, const char *key)
{
    struct ga_json_span v;
    return ga_json_get(obj, key, &v) == 0 && v.n == 4 && memcmp(v.p, "true", 4) == 0;
}

/* Writes an int that -1 (or, for signals, 0) turns into null. */
static void jw_opt(struct ga_jw *w, const char *key, long long v, long long null_value)
{
    ga_jw_key(w, key);
    if (v == null_value)
        ga_jw_null(w);
    else
        ga_jw_int(w, v);
}

/* Writes the rank objects of st; with `live` (ps), also what /proc says of them now. */
static void status_ranks_json(struct ga_jw *w, const struct ga_runs_status *st, int live)
{
    ga_jw_arr(w);
    for (int i = 0; i < st->nranks; i++) {
        const struct ga_runs_rank *r = &st->ranks[i];
        ga_jw_obj(w);
        ga_jw_key_int(w, "rank", r->rank);
        ga_jw_key_int(w, "local_rank", r->local_rank);
        ga_jw_key_int(w, "pid", r->pid);
        ga_jw_key_int(w, "pgid", r->pgid);
        ga_jw_key_int(w, "pgid_start", r->pgid_start);
        ga_jw_key_bool(w, "group_gone", r->group_gone);
        jw_opt(w, "exit_code", r->exit_code, -1);
        jw_opt(w, "signal", r->signal, 0);
        ga_jw_key_bool(w, "oom", r->oom);
        ga_jw_key_bool(w, "stopped", r->stopped);
        if (live)
            ga_jw_key_bool(w, "paused", r->paused);
        ga_jw_obj_end(w);
    }
    ga_jw_arr_end(w);
}

/* Writes how the run ended and what its supervisor had to kill. */
static void status_end_json(struct ga_jw *w, const struct ga_runs_status *st)
{
    ga_jw_key_int(w, "max_restarts", st->max_restarts);
    ga_jw_key_int(w, "grace_ms", st->grace_ms);
    jw_opt(w, "failed_rank", st->failed_rank, -1);
    ga_jw_key_str(w, "oom_scope", st->oom_scope[0] ? st->oom_scope : NULL);
    ga_jw_key_str(w, "cgroup", st->cgroup[0] ? st->cgroup : NULL);
    ga_jw_key_int(w, "others_termed", st->others_termed);
    ga_jw_key_int(w, "killed_count", st->killed_count);
    ga_jw_key(w, "killed");
    ga_jw_arr(w);
    for (int i = 0; i < st->nkilled; i++) {
        ga_jw_obj(w);
        ga_jw_key_int(w, "pid", st->killed[i].pid);
        ga_jw_key_str(w, "name", st->killed[i].name);
        ga_jw_obj_end(w);
    }
    ga_jw_arr_end(w);
}

/* Writes the status.json fields of st (without braces), with state replaced by state_override
 * when it is not NULL (ps reports "lost"). `live` (ps) adds the ranks' paused, which status.json
 * never holds: it is true only at the moment it is read. */
static void status_fields_json(struct ga_jw *w, const struct ga_runs_status *st,
                               const char *state_override, int live)
{
    ga_jw_key_str(w, "id", st->id);
    ga_jw_key_str(w, "state", state_override ? state_override : st->state);
    jw_opt(w, "exit_code", st->exit_code, -1);
    ga_jw_key_int(w, "restarts", st->restarts);
    ga_jw_key_str(w, "start", st->start);
    ga_jw_key_str(w, "end", st->end[0] ? st->end : NULL);
    ga_jw_key_int(w, "supervisor_pid", st->supervisor_pid);
    ga_jw_key_int(w, "master_port", st->master_port);
    ga_jw_key(w, "ranks");
    status_ranks_json(w, st, live);
    status_end_json(w, st);
}

int ga_runs_write_status(const char *dir, const struct ga_runs_status *st)
{
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_obj(&w);
    status_fields_json(&w, st, NULL, 0);
    ga_jw_obj_end(&w);
    ga_jw_text(&w, "\n");
    int rc = ga_runs_write_atomic(dir, "status.json", w.buf, w.len);
    ga_jw_release(&w);
    return rc;
}

char *ga_runs_slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 0, n = 0;
    char *buf = NULL;
    for (;;) {
        GA_ALLOC_GROW(buf, n + 4096, cap); /* room for a read of 4 KiB or more, and the NUL */
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0) {
                free(buf);
                buf = NULL;
            }
            break;
        }
        n += (size_t)r;
    }
    int saved = errno;
    close(fd);
    errno = saved;
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = n;
    }
    return buf;
}

/* Parses the rank objects of a status.json ranks array into st. Returns 0 or -1. */
static int parse_ranks(struct ga_json_span arr, struct ga_runs_status *st)
{
    struct ga_json_span e;
    size_t pos = 0, cap = 0;
    int rc;
    while ((rc = ga_json_next(arr, &pos, &e)) == 1) {
        GA_ALLOC_GROW(st->ranks, (size_t)st->nranks + 1, cap);
        struct ga_runs_rank *r = &st->ranks[st->nranks++];
        r->rank = (int)ga_json_get_int(e, "rank", -1);
        r->local_rank = (int)ga_json_get_int(e, "local_rank", -1);
        r->pid = (long)ga_json_get_int(e, "pid", 0);
        r->pgid = (long)ga_json_get_int(e, "pgid", 0);
        r->pgid_start = ga_json_get_int(e, "pgid_start", 0);
        r->group_gone = json_true(e, "group_gone");
        r->exit_code = (int)ga_json_get_int(e, "exit_code", -1);
        r->signal = (int)ga_json_get_int(e, "signal", 0);
        r->oom = json_true(e, "oom");
        r->stopped = json_true(e, "stopped");
        r->paused = 0; /* not in the file: ga_runs_mark_paused reads it from /proc */
    }
    return rc;
}

/* Parses status.json's killed array into st. */
static void parse_killed(struct ga_json_span obj, struct ga_runs_status *st)
{
    struct ga_json_span arr, e;
    size_t pos = 0;
    if (ga_json_get(obj, "killed", &arr) < 0)
        return;
    while (st->nkilled < GA_RUNS_KILLED_MAX && ga_json_next(arr, &pos, &e) == 1) {
        struct ga_runs_killed *k = &st->killed[st->nkilled++];
        k->pid = (long)ga_json_get_int(e, "pid", 0);
        ga_json_get_str(e, "name", k->name, sizeof(k->name));
    }
}

/* Reads how the run ended (status_end_json) into st. */
static void parse_end(struct ga_json_span obj, struct ga_runs_status *st)
{
    st->max_restarts = (int)ga_json_get_int(obj, "max_restarts", 0);
    st->grace_ms = (long)ga_json_get_int(obj, "grace_ms", 0);
    st->failed_rank = (int)ga_json_get_int(obj, "failed_rank", -1);
    ga_json_get_str(obj, "oom_scope", st->oom_scope, sizeof(st->oom_scope));
    ga_json_get_str(obj, "cgroup", st->cgroup, sizeof(st->cgroup));
    st->others_termed = (long)ga_json_get_int(obj, "others_termed", 0);
    st->killed_count = (long)ga_json_get_int(obj, "killed_count", 0);
    parse_killed(obj, st);
}

int ga_runs_read_status(const char *dir, struct ga_runs_status *st)
{
    char path[PATH_MAX];
    size_t n;
    memset(st, 0, sizeof(*st));
    if (ga_runs_join(path, sizeof(path), dir, "status.json") < 0)
        return -1;
    char *text = ga_runs_slurp(path, &n);
    if (!text)
        return -1;
    struct ga_json_span obj = {text, n}, ranks;
    ga_json_get_str(obj, "id", st->id, sizeof(st->id));
    ga_json_get_str(obj, "state", st->state, sizeof(st->state));
    ga_json_get_str(obj, "start", st->start, sizeof(st->start));
    ga_json_get_str(obj, "end", st->end, sizeof(st->end));
    st->exit_code = (int)ga_json_get_int(obj, "exit_code", -1);
    st->restarts = (int)ga_json_get_int(obj, "restarts", 0);
    st->supervisor_pid = (long)ga_json_get_int(obj, "supervisor_pid", 0);
    st->master_port = (int)ga_json_get_int(obj, "master_port", 0);
    parse_end(obj, st);
    int rc = st->state[0] && ga_json_get(obj, "ranks", &ranks) == 0 ? parse_ranks(ranks, st) : -1;
    free(text);
    if (rc < 0)
        ga_runs_status_release(st);
    return rc;
}

/* ---- the end of a run, summed up ---------------------------------------------------------- */

#define SUMMARY_LINES    5   /* of the failing rank's log */
#define SUMMARY_LINE_MAX 240 /* bytes kept of each */

/* The length of the UTF-8 sequence at p[0..n), or 0 when it is not a valid one. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len = p[0] < 0x80             ? 1
                 : (p[0] & 0xe0) == 0xc0 ? 2
                 : (p[0] & 0xf0) == 0xe0 ? 3
                 : (p[0] & 0xf8) == 0xf0 ? 4
                                         : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* Copies a log line into dst (cap bytes, NUL-terminated) as a terminal would show it: what
 * follows its last carriage return (a progress bar's last state), cut at a character boundary,
 * with bytes that are not UTF-8 as '?' (JSON readers refuse them). */
static void shown_line(const char *src, size_t len, char *dst, size_t cap)
{
    const char *cr = memchr(src, '\r', len);
    while (cr && cr + 1 < src + len) { /* the last non-empty part after a '\r' */
        len -= (size_t)(cr + 1 - src);
        src = cr + 1;
        cr = memchr(src, '\r', len);
    }
    if (cr)
        len = (size_t)(cr - src);
    size_t out = 0;
    for (size_t at = 0; at < len;) {
        size_t n = utf8_len((const unsigned char *)src + at, len - at);
        if (out + (n ? n : 1) >= cap)
            break;
        if (n)
            memcpy(dst + out, src + at, n);
        else
            dst[out] = '?';
        out += n ? n : 1;
        at += n ? n : 1;
    }
    dst[out] = '\0';
}

/* Writes up to SUMMARY_LINES last lines of rank's log in dir as a JSON array of strings. */
static void last_lines_json(const char *dir, int rank, struct ga_jw *w)
{
    char name[32], path[PATH_MAX], buf[4096];
    snprintf(name, sizeof(name), "rank%d.log", rank);
    ssize_t n = -1;
    int fd =
        ga_runs_join(path, sizeof(path), dir, name) == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        off_t end = lseek(fd, 0, SEEK_END);
        off_t from = end > (off_t)sizeof(buf) ? end - (off_t)sizeof(buf) : 0;
        n = pread(fd, buf, sizeof(buf), from);
        close(fd);
    }
    const char *start[SUMMARY_LINES];
    size_t len[SUMMARY_LINES], count = 0;
    /* walk back from the end: lines as the log holds them, the last one possibly unterminated */
    for (ssize_t at = n > 0 && buf[n - 1] == '\n' ? n - 1 : n; at > 0 && count < SUMMARY_LINES;) {
        ssize_t b = at;
        while (b > 0 && buf[b - 1] != '\n')
            b--;
        if (b == 0 && n == (ssize_t)sizeof(buf))
            break; /* a line cut by the window: not shown in part */
        start[count] = buf + b;
        len[count++] = (size_t)(at - b);
        at = b - 1;
    }
    ga_jw_arr(w);
    for (size_t i = count; i-- > 0;) {
        char line[SUMMARY_LINE_MAX + 1];
        shown_line(start[i], len[i], line, sizeof(line));
        ga_jw_str(w, line);
    }
    ga_jw_arr_end(w);
}

/* Writes the failing rank (status.json's failed_rank) with how it ended, or null. */
static void failed_rank_json(const char *dir, const struct ga_runs_status *st, struct ga_jw *w)
{
    ga_jw_key(w, "failed");
    const struct ga_runs_rank *r = NULL;
    for (int i = 0; i < st->nranks && st->failed_rank >= 0; i++)
        if (st->ranks[i].rank == st->failed_rank)
            r = &st->ranks[i];
    if (!r) {
        ga_jw_null(w);
        return;
    }
    ga_jw_obj(w);
    ga_jw_key_int(w, "rank", r->rank);
    jw_opt(w, "exit_code", r->exit_code, -1);
    jw_opt(w, "signal", r->signal, 0);
    ga_jw_key_bool(w, "oom", r->oom);
    ga_jw_key_str(w, "oom_scope", r->oom && st->oom_scope[0] ? st->oom_scope : NULL);
    ga_jw_key(w, "last_lines");
    last_lines_json(dir, r->rank, w);
    ga_jw_obj_end(w);
}

void ga_runs_summary_json(const char *dir, const struct ga_runs_status *st, struct ga_jw *w)
{
    long long start = ga_runs_iso_ms(st->start), end = ga_runs_iso_ms(st->end);
    ga_jw_obj(w);
    ga_jw_key_str(w, "state", st->state);
    jw_opt(w, "exit_code", st->exit_code, -1);
    ga_jw_key_int(w, "duration_ms", start < 0 || end < 0 ? -1 : end - start);
    ga_jw_key_int(w, "restarts", st->restarts);
    ga_jw_key_int(w, "max_restarts", st->max_restarts);
    failed_rank_json(dir, st, w);
    ga_jw_key(w, "stopped_ranks");
    ga_jw_arr(w);
    for (int i = 0; i < st->nranks; i++)
        if (st->ranks[i].stopped)
            ga_jw_int(w, st->ranks[i].rank);
    ga_jw_arr_end(w);
    ga_jw_key_int(w, "others_termed", st->others_termed);
    ga_jw_key_int(w, "killed_count", st->killed_count);
    ga_jw_obj_end(w);
}

void ga_runs_mark_paused(struct ga_runs_status *st, const struct ga_proclist *stopped)
{
    for (int i = 0; i < st->nranks; i++) {
        struct ga_runs_rank *r = &st->ranks[i];
        r->paused = 0;
        for (size_t k = 0; k < stopped->n && r->exit_code < 0 && !r->paused; k++)
            r->paused = stopped->v[k].pgid == r->pgid;
        if (r->paused) {
            /* the pgid may be a reused number; asked on a copy: ps would otherwise print a
             * group_gone that status.json does not hold */
            struct ga_runs_rank probe = *r;
            r->paused = ga_pgroup_alive(&probe);
        }
    }
}

int ga_runs_supervisor_alive(const char *dir)
{
    char path[PATH_MAX];
    if (ga_runs_join(path, sizeof(path), dir, "supervisor.lock") < 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int alive = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    close(fd); /* also drops our shared lock, if we got it */
    return alive;
}

/* Reads meta.json of the run in dir; returns the malloc'd text (caller frees) or NULL. */
static char *read_meta(const char *dir, size_t *n)
{
    char path[PATH_MAX];
    if (ga_runs_join(path, sizeof(path), dir, "meta.json") < 0)
        return NULL;
    return ga_runs_slurp(path, n);
}

/* Checks whether the run in runs/ent is named name; if it is newer than *best_start, records
 * it as the best match so far. */
static void match_name(const char *runs, const char *ent, const char *name, char *best, size_t cap,
                       char *best_start)
{
    char dir[PATH_MAX], got[GA_RUNS_NAME_MAX + 1], start[40];
    size_t n;
    if (ga_runs_join(dir, sizeof(dir), runs, ent) < 0)
        return;
    char *meta = read_meta(dir, &n);
    if (!meta)
        return;
    struct ga_json_span obj = {meta, n};
    ga_json_get_str(obj, "name", got, sizeof(got));
    ga_json_get_str(obj, "start", start, sizeof(start));
    if (!strcmp(got, name) && strcmp(start, best_start) >= 0 && strlen(ent) < cap) {
        snprintf(best, cap, "%s", ent);
        snprintf(best_start, 40, "%s", start);
    }
    free(meta);
}

int ga_runs_resolve(const char *root, const char *arg, char *out, size_t cap, char *err,
                    size_t errlen)
{
    char runs[PATH_MAX], dir[PATH_MAX], best_start[40] = "";
    struct stat sb;
    if (ga_runs_path(runs, sizeof(runs), root, NULL) < 0) {
        snprintf(err, errlen, "path too long: %s", root);
        return -1;
    }
    if (ga_runs_id_valid(arg) && ga_runs_path(dir, sizeof(dir), root, arg) == 0 &&
        stat(dir, &sb) == 0 && strlen(arg) < cap) {
        snprintf(out, cap, "%s", arg);
        return 0;
    }
    out[0] = 0;
    DIR *d = opendir(runs);
    for (struct dirent *e; d && (e = readdir(d));)
        if (ga_runs_id_valid(e->d_name))
            match_name(runs, e->d_name, arg, out, cap, best_start);
    if (d)
        closedir(d);
    if (out[0])
        return 0;
    snprintf(err, errlen, "no run with id or name '%s' in %s", arg, runs);
    return -1;
}

/* ---- ps ---------------------------------------------------------------------------------- */

/* One run as ps lists it. */
struct ps_row {
    struct ga_runs_status st;
    char *meta; /* meta.json text, owned */
    size_t meta_len;
    int lost; /* status says running, but the supervisor is gone */
};

/* A run whose status.json is there but does not parse (written whole by rename, so damaged
 * from outside) is listed as "damaged" rather than left out: a running one's supervisor writes
 * it again within RUN_DIR_CHECK_MS (launch.c), and one that ended has still left its folder.
 * Returns 0 with st filled so, or -1 where there is no status.json (a run starting up). */
static int status_damaged(const char *dir, const char *id, struct ga_runs_status *st)
{
    char path[PATH_MAX];
    struct stat sb;
    if (ga_runs_join(path, sizeof(path), dir, "status.json") < 0 || stat(path, &sb) != 0)
        return -1;
    memset(st, 0, sizeof(*st));
    snprintf(st->id, sizeof(st->id), "%s", id);
    snprintf(st->state, sizeof(st->state), "damaged");
    st->exit_code = -1;
    return 0;
}

/* Loads one run directory into row. Returns 0, or -1 if it is not a readable run. */
static int ps_load(const char *runs, const char *id, struct ps_row *row)
{
    char dir[PATH_MAX];
    memset(row, 0, sizeof(*row));
    if (ga_runs_join(dir, sizeof(dir), runs, id) < 0)
        return -1;
    if (ga_runs_read_status(dir, &row->st) < 0 && status_damaged(dir, id, &row->st) < 0)
        return -1;
    row->meta = read_meta(dir, &row->meta_len);
    row->lost = !strcmp(row->st.state, "running") && !ga_runs_supervisor_alive(dir);
    return 0;
}

/* Orders rows newest first (ISO times compare as strings), then by id. */
static int ps_cmp(const void *a, const void *b)
{
    const struct ps_row *x = a, *y = b;
    int c = strcmp(y->st.start, x->st.start);
    return c ? c : strcmp(x->st.id, y->st.id);
}

/* Formats a duration in ms as 1h02m03s / 2m03s / 3.4s. */
static void fmt_duration(long long ms, char *buf, size_t cap)
{
    long long s = ms / 1000;
    if (ms < 0)
        snprintf(buf, cap, "-");
    else if (s >= 3600)
        snprintf(buf, cap, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60)
        snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else
        snprintf(buf, cap, "%lld.%llds", s, ms % 1000 / 100);
}

/* The run's time so far, or in all; -1 for a lost run, whose end nobody saw (counting on to now
 * would call a run that died long ago long-running). */
static long long row_duration(const struct ps_row *r)
{
    if (r->lost && !r->st.end[0])
        return -1;
    long long start = ga_runs_iso_ms(r->st.start);
    char now[40];
    ga_runs_now_iso(now, sizeof(now));
    long long end = ga_runs_iso_ms(r->st.end[0] ? r->st.end : now);
    return start < 0 || end < 0 ? -1 : end - start;
}

static void ps_print_json(struct ps_row *rows, size_t n)
{
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_arr(&w);
    for (size_t i = 0; i < n; i++) {
        struct ga_json_span meta = {rows[i].meta ? rows[i].meta : "{}",
                                    rows[i].meta ? rows[i].meta_len : 2},
                            v;
        ga_jw_obj(&w);
        status_fields_json(&w, &rows[i].st, rows[i].lost ? "lost" : NULL, 1);
        ga_jw_key(&w, "name");
        if (ga_json_get(meta, "name", &v) == 0)
            ga_jw_raw(&w, v.p, v.n);
        else
            ga_jw_null(&w);
        ga_jw_key(&w, "command");
        if (ga_json_get(meta, "command", &v) == 0)
            ga_jw_raw(&w, v.p, v.n);
        else
            ga_jw_null(&w);
        ga_jw_key(&w, "gpus"); /* the GPUs reserved for it, null for CPU ranks */
        if (ga_json_get(meta, "gpus", &v) == 0)
            ga_jw_raw(&w, v.p, v.n);
        else
            ga_jw_null(&w);
        ga_jw_key(&w, "duration_ms");
        ga_jw_int(&w, row_duration(&rows[i]));
        ga_jw_obj_end(&w);
    }
    ga_jw_arr_end(&w);
    printf("%s\n", w.buf);
    ga_jw_release(&w);
}

/* Writes meta's "gpus" array as "1,3" into buf ("-" when null or missing). */
static void meta_gpus(struct ga_json_span meta, char *buf, size_t cap)
{
    struct ga_json_span arr, e;
    size_t pos = 0, len = 0;
    buf[0] = '\0';
    if (ga_json_get(meta, "gpus", &arr) == 0)
        while (ga_json_next(arr, &pos, &e) == 1 && len + e.n + 2 < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%.*s", len ? "," : "", (int)e.n, e.p);
    if (!buf[0])
        snprintf(buf, cap, "-");
}

/* STATE as the table shows it: the JSON's, but "paused" for a running run whose every rank still
 * running is paused, "paused:K/N" when K of its N ranks are (no space: a column of words). */
static const char *row_state(const struct ps_row *r, char *buf, size_t cap)
{
    int paused = 0, running = 0;
    for (int i = 0; i < r->st.nranks; i++) {
        paused += r->st.ranks[i].paused;
        running += r->st.ranks[i].exit_code < 0;
    }
    if (r->lost || !paused)
        return r->lost ? "lost" : r->st.state;
    if (paused == running)
        snprintf(buf, cap, "paused");
    else
        snprintf(buf, cap, "paused:%d/%d", paused, r->st.nranks);
    return buf;
}

static void ps_print_table(struct ps_row *rows, size_t n)
{
    printf("%-24s %-16s %-9s %5s %-8s %-24s %10s %4s\n", "ID", "NAME", "STATE", "RANKS", "GPUS",
           "START", "DURATION", "EXIT");
    for (size_t i = 0; i < n; i++) {
        char name[GA_RUNS_NAME_MAX + 1] = "-", dur[32], code[16] = "-", gpus[64] = "-", state[32];
        if (rows[i].meta) {
            struct ga_json_span meta = {rows[i].meta, rows[i].meta_len};
            ga_json_get_str(meta, "name", name, sizeof(name));
            if (!name[0])
                snprintf(name, sizeof(name), "-");
            meta_gpus(meta, gpus, sizeof(gpus));
        }
        fmt_duration(row_duration(&rows[i]), dur, sizeof(dur));
        if (rows[i].st.exit_code >= 0)
            snprintf(code, sizeof(code), "%d", rows[i].st.exit_code);
        printf("%-24s %-16s %-9s %5d %-8s %-24s %10s %4s\n", rows[i].st.id, name,
               row_state(&rows[i], state, sizeof(state)), rows[i].st.nranks, gpus, rows[i].st.start,
               dur, code);
    }
}

/* Marks the paused ranks of the runs ps shows running: one scan of /proc for them all, and none
 * when nothing runs. A run that ended, or is lost, is left as status.json has it. */
static void ps_mark_paused(struct ps_row *rows, size_t n)
{
    struct ga_proclist stopped = {0};
    int scanned = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].lost || strcmp(rows[i].st.state, "running") != 0)
            continue;
        if (!scanned++)
            ga_procs_stopped(&stopped); /* /proc unreadable: nothing is called paused */
        ga_runs_mark_paused(&rows[i].st, &stopped);
    }
    ga_proclist_release(&stopped);
}

/* Loads every run under runs into a malloc'd array (*n entries). Returns NULL when empty. */
static struct ps_row *ps_collect(const char *runs, size_t *n)
{
    struct ps_row *rows = NULL;
    size_t cap = 0;
    *n = 0;
    DIR *d = opendir(runs);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!ga_runs_id_valid(e->d_name))
            continue;
        GA_ALLOC_GROW(rows, *n + 1, cap);
        if (ps_load(runs, e->d_name, &rows[*n]) == 0)
            (*n)++;
    }
    if (d)
        closedir(d);
    if (*n)
        qsort(rows, *n, sizeof(*rows), ps_cmp);
    ps_mark_paused(rows, *n);
    return rows;
}

int ga_ps_main(int argc, char **argv)
{
    const char *root = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--root") && i + 1 < argc)
            root = argv[++i];
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: gpusync-agent ps --root DIR [--json]\n");
            return 2;
        }
    }
    if (!root) {
        fprintf(stderr, "usage: gpusync-agent ps --root DIR [--json]\n");
        return 2;
    }
    char runs[PATH_MAX];
    if (ga_runs_path(runs, sizeof(runs), root, NULL) < 0) {
        fprintf(stderr, "gpusync-agent ps: path too long: %s\n", root);
        return 1;
    }
    size_t n;
    struct ps_row *rows = ps_collect(runs, &n);
    if (json)
        ps_print_json(rows, n);
    else
        ps_print_table(rows, n);
    for (size_t i = 0; i < n; i++) {
        ga_runs_status_release(&rows[i].st);
        free(rows[i].meta);
    }
    free(rows);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- stop -------------------------------------------------------------------------------- */

/* Returns 1 if any rank group of st is still the run's and not empty (pgroup.h: a recorded
 * pgid whose number now belongs to someone else, or that was seen empty, is not). */
static int any_group_alive(struct ga_runs_status *st)
{
    int alive = 0;
    for (int i = 0; i < st->nranks; i++)
        alive |= ga_pgroup_alive(&st->ranks[i]);
    return alive;
}

static void kill_groups(struct ga_runs_status *st, int sig)
{
    for (int i = 0; i < st->nranks; i++)
        ga_pgroup_signal(&st->ranks[i], sig);
}

/* Sleeps about ms milliseconds (used only while waiting on processes that are not our
 * children: there is no event to wait on for those). */
static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Waits up to ms for the supervisor to let go of its lock and the groups to empty. Returns 1
 * when everything is gone. */
static int wait_gone(const char *dir, struct ga_runs_status *st, long ms)
{
    long long deadline = ga_runs_mono_ms() + ms;
    for (;;) {
        int gone = !ga_runs_supervisor_alive(dir) && !any_group_alive(st);
        if (gone || ga_runs_mono_ms() >= deadline)
            return gone;
        nap_ms(5);
    }
}

void ga_runs_note_killed(struct ga_runs_status *st, const struct ga_proclist *l)
{
    for (size_t i = 0; i < l->n; i++) {
        int known = 0;
        for (int k = 0; k < st->nkilled && !known; k++)
            known = st->killed[k].pid == l->v[i].pid;
        if (known)
            continue;
        st->killed_count++;
        if (st->nkilled < GA_RUNS_KILLED_MAX) {
            struct ga_runs_killed *k = &st->killed[st->nkilled++];
            k->pid = l->v[i].pid;
            snprintf(k->name, sizeof(k->name), "%s", l->v[i].name);
        }
    }
}

/* Marks a run whose supervisor vanished as stopped, so ps stops calling it lost. */
static void mark_stopped(const char *dir, struct ga_runs_status *st)
{
    snprintf(st->state, sizeof(st->state), "stopped");
    ga_runs_now_iso(st->end, sizeof(st->end));
    if (st->exit_code < 0)
        st->exit_code = 128 + SIGKILL;
    ga_runs_write_status(dir, st);
}

/* What stop did, for its report. */
struct stop_report {
    int was_running;
    struct ga_runs_status st; /* as the supervisor left it */
    struct ga_proclist swept; /* processes stop itself had to kill (the supervisor was gone) */
    struct ga_proclist left;  /* processes that survived everything */
};

/* The run's processes that only marks can find now (procs.h): its environment, its cgroup. */
static void find_marked(const char *dir, const struct ga_runs_status *st, struct ga_proclist *out)
{
    struct ga_procs p = {.supervisor = 0};
    if (!realpath(dir, p.dir)) /* as the supervisor wrote it: launch makes it absolute */
        p.dir[0] = '\0';
    snprintf(p.cgroup, sizeof(p.cgroup), "%s", st->cgroup);
    ga_procs_find(&p, GA_PROCS_MARKED, out);
}

/* Kills what is left of the run once its supervisor is gone, and waits up to 3 s for it to go:
 * what is still there then is in r->left. */
static void sweep(const char *dir, struct stop_report *r)
{
    find_marked(dir, &r->st, &r->swept);
    struct ga_procs p = {.supervisor = 0};
    snprintf(p.cgroup, sizeof(p.cgroup), "%s", r->st.cgroup);
    if (r->swept.n > 0) {
        ga_procs_cgroup_kill(&p);
        ga_procs_signal(&r->swept, SIGKILL);
    }
    for (long long end = ga_runs_mono_ms() + 3000;;) {
        ga_proclist_release(&r->left);
        find_marked(dir, &r->st, &r->left);
        int gone = r->left.n == 0 && wait_gone(dir, &r->st, 0);
        if (gone || ga_runs_mono_ms() >= end)
            break;
        nap_ms(10);
    }
    if (r->left.n == 0)
        ga_procs_cgroup_remove(&p);
}

/* 1 if pgid is the group of a rank that is still the run's (a group signal reaches its
 * members). */
static int in_rank_group(struct ga_runs_status *st, long pgid)
{
    for (int i = 0; i < st->nranks; i++)
        if (st->ranks[i].pgid == pgid && ga_pgroup_alive(&st->ranks[i]))
            return 1;
    return 0;
}

/* SIGTERM to the rank groups and to the run's other processes, each once, counted in st as the
 * supervisor counts them (ranks[].stopped, others_termed). */
static void term_lost(const char *dir, struct ga_runs_status *st)
{
    struct ga_proclist l = {0};
    find_marked(dir, st, &l);
    size_t kept = 0;
    for (size_t i = 0; i < l.n; i++)
        if (!in_rank_group(st, l.v[i].pgid))
            l.v[kept++] = l.v[i];
    l.n = kept;
    for (int i = 0; i < st->nranks; i++)
        st->ranks[i].stopped = ga_pgroup_alive(&st->ranks[i]);
    kill_groups(st, SIGTERM);
    st->others_termed += (long)ga_procs_signal(&l, SIGTERM);
    ga_proclist_release(&l);
}

/* Waits up to ms for the run's groups and marked processes to go. Returns 1 once they have. */
static int wait_marked_gone(const char *dir, struct ga_runs_status *st, long ms)
{
    for (long long end = ga_runs_mono_ms() + ms;;) {
        struct ga_proclist l = {0};
        find_marked(dir, st, &l);
        int gone = l.n == 0 && !any_group_alive(st);
        ga_proclist_release(&l);
        if (gone || ga_runs_mono_ms() >= end)
            return gone;
        nap_ms(20);
    }
}

/* Does for a lost run (status running, supervisor gone) what its supervisor would have: SIGTERM
 * to everything of it, SIGKILL to what outlives the grace period, and all of it recorded in
 * status.json, so that the report and `ps` say what stop ended rather than nothing. */
static void stop_lost(const char *dir, long grace_ms, struct ga_runs_status *st)
{
    if (grace_ms >= 0)
        st->grace_ms = grace_ms; /* the report says which grace period it gave */
    term_lost(dir, st);
    if (wait_marked_gone(dir, st, st->grace_ms ? st->grace_ms : 10000))
        return;
    struct ga_proclist l = {0};
    find_marked(dir, st, &l);
    ga_runs_note_killed(st, &l);
    struct ga_procs p = {.supervisor = 0};
    snprintf(p.cgroup, sizeof(p.cgroup), "%s", st->cgroup);
    ga_procs_cgroup_kill(&p);
    kill_groups(st, SIGKILL);
    ga_procs_signal(&l, SIGKILL);
    ga_proclist_release(&l);
    wait_gone(dir, st, 1000); /* as below: a process killed here may still be on its way out */
}

/* Stops the run in dir: SIGTERM to its supervisor (with the grace period it is to give the
 * ranks, when grace_ms >= 0; else the run keeps its own), SIGKILL to it and the groups if it does
 * not end in time, then a sweep for anything of the run still alive. Fills r; returns 0, or -1 if
 * status.json is unreadable. */
static int stop_run(const char *dir, long grace_ms, struct stop_report *r)
{
    struct ga_runs_status *st = &r->st;
    if (ga_runs_read_status(dir, st) < 0)
        return -1;
    int sup = ga_runs_supervisor_alive(dir);
    /* A lost run (status running, supervisor gone) counts as running: stop ends it. */
    r->was_running = sup || !strcmp(st->state, "running");
    if (sup && st->supervisor_pid > 1) {
        union sigval grace = {.sival_int = (int)grace_ms};
        if (grace_ms >= 0)
            sigqueue((pid_t)st->supervisor_pid, SIGTERM, grace);
        else
            kill((pid_t)st->supervisor_pid, SIGTERM);
        /* the grace, the kill, and two seconds for the supervisor to see everything gone */
        wait_gone(dir, st, (grace_ms >= 0 ? grace_ms : st->grace_ms ? st->grace_ms : 10000) + 2000);
    }
    /* The supervisor may have restarted the group since we read it, and it records what it
     * killed: read again. */
    struct ga_runs_status now;
    if (ga_runs_read_status(dir, &now) == 0) {
        ga_runs_status_release(st);
        *st = now;
    }
    if (!sup && !strcmp(st->state, "running")) {
        stop_lost(dir, grace_ms, st);
    } else if (!strcmp(st->state, "running") || sup) {
        if (ga_runs_supervisor_alive(dir) && st->supervisor_pid > 1)
            kill((pid_t)st->supervisor_pid, SIGKILL);
        kill_groups(st, SIGKILL);
        /* A process killed here may still be on its way out when the sweep looks (seen under
         * ASan: the sweep then "found" the rank's own child, which the group kill had ended):
         * only what outlives its group's kill was left behind. */
        wait_gone(dir, st, 1000);
    }
    sweep(dir, r);
    if (r->left.n == 0 && !strcmp(st->state, "running"))
        mark_stopped(dir, st);
    return 0;
}

/* Counts the ranks the supervisor ended with its signal. */
static int ranks_stopped(const struct ga_runs_status *st)
{
    int n = 0;
    for (int i = 0; i < st->nranks; i++)
        n += st->ranks[i].stopped;
    return n;
}

/* Prints what stop did: "stopped ID: SIGTERM to 2 ranks and 3 other processes; 1 process
 * outlived the 10.0 s grace period and got SIGKILL (pid 4242 python3)". */
static void print_report(const char *id, const struct stop_report *r)
{
    const struct ga_runs_status *st = &r->st;
    int ranks = ranks_stopped(st);
    printf("%s %s", r->was_running ? "stopped" : "not running", id);
    const char *sep = ": ";
    if (r->was_running && ranks) {
        printf("%sSIGTERM to %d rank%s", sep, ranks, ranks == 1 ? "" : "s");
        sep = "; ";
    }
    if (r->was_running && st->others_termed) {
        printf("%s%ld other process%s", ranks ? " and " : "SIGTERM to ", st->others_termed,
               st->others_termed == 1 ? "" : "es");
        sep = "; ";
    }
    if (r->was_running && st->killed_count) {
        printf("%s%ld process%s outlived the %.1f s grace period and got SIGKILL (pid", sep,
               st->killed_count, st->killed_count == 1 ? "" : "es", (double)st->grace_ms / 1000.0);
        sep = "; ";
        for (int i = 0; i < st->nkilled; i++)
            printf("%s%ld %s", i ? ", " : " ", st->killed[i].pid, st->killed[i].name);
        printf("%s)", st->killed_count > st->nkilled ? ", ..." : "");
    }
    if (r->swept.n) {
        char what[1024];
        ga_proclist_describe(&r->swept, 8, what, sizeof(what));
        printf("%sSIGKILL to %s it had left behind", sep, what);
    }
    printf("\n");
}

int ga_stop_main(int argc, char **argv)
{
    const char *root = NULL, *arg = NULL;
    long grace_ms = -1; /* the run's own (launch --grace-ms) */
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (v && !strcmp(argv[i], "--root"))
            root = v, i++;
        else if (v && !strcmp(argv[i], "--id"))
            arg = v, i++;
        else if (v && !strcmp(argv[i], "--grace-ms"))
            grace_ms = strtol(v, &end, 10), bad = *end || end == v, i++;
        else
            bad = 1;
    }
    if (bad || !root || !arg || grace_ms < -1 || grace_ms > INT_MAX) {
        fprintf(stderr, "usage: gpusync-agent stop --root DIR --id ID [--grace-ms MS]\n");
        return 2;
    }
    char id[GS_PROTO_RUN_ID_MAX + 1], dir[PATH_MAX], err[PATH_MAX + 256];
    if (ga_runs_resolve(root, arg, id, sizeof(id), err, sizeof(err)) < 0) {
        fprintf(stderr, "gpusync-agent stop: %s\n", err);
        return 1;
    }
    ga_runs_path(dir, sizeof(dir), root, id);
    struct stop_report r;
    memset(&r, 0, sizeof(r));
    int rc = stop_run(dir, grace_ms, &r);
    if (rc < 0)
        fprintf(stderr, "gpusync-agent stop: cannot read %s/status.json\n", dir);
    else if (r.left.n) {
        char what[1024];
        ga_proclist_describe(&r.left, 16, what, sizeof(what));
        fprintf(stderr, "gpusync-agent stop: run %s: %s survived SIGKILL\n", id, what);
        rc = -1;
    } else
        print_report(id, &r);
    ga_runs_status_release(&r.st);
    ga_proclist_release(&r.swept);
    ga_proclist_release(&r.left);
    if (rc < 0)
        return 1;
    return fflush(stdout) == 0 ? 0 : 1;
}
