/* cli/run_local.c: the local copy of a run's logs (see run_local.h). */
#include "cli/run_local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "common/wrapper.h"

#define JOURNAL        "log-times" /* agent/logtimes.h: GA_LOGTIMES_FILE */
#define JOURNAL_HEADER "gpusync-log-times 1\n"

/* A run id is one path component: [A-Za-z0-9._-], not starting with '.' (proto/run.h). */
static int id_valid(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    return n > 0 && n <= GS_PROTO_RUN_ID_MAX && id[0] != '.' &&
           strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

static void local_dir(const char *root, const char *id, struct gs_buf *dir)
{
    gs_buf_addf(dir, "%s/%s/runs/%s", root, GS_DIR, id);
}

/* Appends "rank size ms" to the journal, with the version line first in a new one. */
static void journal_add(const char *dir, int rank, uint64_t size)
{
    struct gs_buf path = GS_BUF_INIT, line = GS_BUF_INIT;
    gs_buf_addf(&path, "%s/%s", dir, JOURNAL);
    int fd = open(path.data, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size == 0)
        gs_buf_adds(&line, JOURNAL_HEADER);
    gs_buf_addf(&line, "%d %llu %lld\n", rank, (unsigned long long)size,
                (long long)gs_clock_wall_ms());
    if (fd < 0 || write(fd, line.data, line.len) != (ssize_t)line.len)
        gs_warn("cannot keep the order of the local copy in %s", path.data);
    if (fd >= 0)
        close(fd);
    gs_buf_release(&path);
    gs_buf_release(&line);
}

void gs_run_local_keep(const char *root, const char *id, int rank, uint64_t off, const char *data,
                       size_t len)
{
    struct gs_buf dir = GS_BUF_INIT, path = GS_BUF_INIT;
    if (!id_valid(id))
        return;
    local_dir(root, id, &dir);
    gs_path_mkdir_p(dir.data, 0755, NULL);
    gs_buf_addf(&path, "%s/rank%d.log", dir.data, rank);
    int fd = open(path.data, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    struct stat sb;
    int had = fd >= 0 && fstat(fd, &sb) == 0 ? 1 : 0;
    if (fd < 0 || pwrite(fd, data, len, (off_t)off) != (ssize_t)len)
        gs_warn("cannot keep a local copy of %s", path.data);
    else if (had && off + len > (uint64_t)sb.st_size)
        journal_add(dir.data, rank, off + len);
    if (fd >= 0)
        close(fd);
    gs_buf_release(&dir);
    gs_buf_release(&path);
}

#define NAME_FILE "name" /* the run's --name, beside its rank logs */

void gs_run_local_keep_name(const char *root, const char *id, const char *name)
{
    struct gs_buf dir = GS_BUF_INIT, path = GS_BUF_INIT;
    if (id_valid(id) && name && name[0]) {
        local_dir(root, id, &dir);
        gs_path_mkdir_p(dir.data, 0755, NULL);
        gs_buf_addf(&path, "%s/%s", dir.data, NAME_FILE);
        struct gs_buf text = GS_BUF_INIT;
        gs_buf_addf(&text, "%s\n", name);
        if (gs_path_write_atomic(path.data, text.data, text.len) != 0)
            gs_warn("cannot keep the run's name in %s", path.data);
        gs_buf_release(&text);
    }
    gs_buf_release(&dir);
    gs_buf_release(&path);
}

/* 1 when run `id`'s local copy records the name `name`. */
static int local_name_is(const char *root, const char *id, const char *name)
{
    struct gs_buf path = GS_BUF_INIT, text = GS_BUF_INIT;
    gs_buf_addf(&path, "%s/%s/runs/%s/%s", root, GS_DIR, id, NAME_FILE);
    int same = gs_path_read_file(path.data, &text) == 0 && text.len == strlen(name) + 1 &&
               memcmp(text.data, name, text.len - 1) == 0 && text.data[text.len - 1] == '\n';
    gs_buf_release(&path);
    gs_buf_release(&text);
    return same;
}

/* The rank of a file name "rank<N>.log", or -1. */
static int rank_of(const char *name)
{
    int rank, used = 0;
    if (sscanf(name, "rank%d.log%n", &rank, &used) != 1 || name[used] || rank < 0 ||
        rank >= GS_RUNS_MAX_RANKS)
        return -1;
    return rank;
}

int gs_run_ranks_has(const char *ranks, int rank)
{
    if (!ranks || strcmp(ranks, "all") == 0)
        return 1;
    for (const char *p = ranks; *p; p += strcspn(p, ","), p += *p == ',')
        if (atoi(p) == rank && *p >= '0' && *p <= '9')
            return 1;
    return 0;
}

int gs_run_local_exists(const char *root, const char *id)
{
    struct gs_buf dir = GS_BUF_INIT;
    int found = 0;
    if (id_valid(id)) {
        local_dir(root, id, &dir);
        DIR *d = opendir(dir.data);
        for (struct dirent *e; d && !found && (e = readdir(d));)
            found = rank_of(e->d_name) >= 0;
        if (d)
            closedir(d);
    }
    gs_buf_release(&dir);
    return found;
}

/* The newest run id with a local copy, and named `name` unless NULL. */
static int newest_local(const char *root, const char *name, struct gs_buf *id)
{
    struct gs_buf dir = GS_BUF_INIT, best = GS_BUF_INIT;
    gs_buf_addf(&dir, "%s/%s/runs", root, GS_DIR);
    DIR *d = opendir(dir.data);
    /* ids begin with the start time (YYYYmmdd-HHMMSS-...): the newest sorts last */
    for (struct dirent *e; d && (e = readdir(d));)
        if ((!best.len || strcmp(e->d_name, best.data) > 0) &&
            gs_run_local_exists(root, e->d_name) &&
            (!name || local_name_is(root, e->d_name, name))) {
            gs_buf_reset(&best);
            gs_buf_adds(&best, e->d_name);
        }
    if (d)
        closedir(d);
    gs_buf_release(&dir);
    int found = best.len > 0;
    if (found)
        gs_buf_adds(id, best.data);
    gs_buf_release(&best);
    return found ? 0 : GS_E_NOTFOUND;
}

int gs_run_local_newest(const char *root, struct gs_buf *id)
{
    return newest_local(root, NULL, id);
}

int gs_run_local_named(const char *root, const char *name, struct gs_buf *id)
{
    return newest_local(root, name, id);
}

/* A replay in progress: the rank logs open, and how far each has been passed on. */
struct replay {
    int fd[GS_RUNS_MAX_RANKS]; /* -1: no such rank, or not wanted */
    uint64_t done[GS_RUNS_MAX_RANKS];
    gs_tail_fn fn;
    void *ctx;
    char buf[65536];
};

/* Passes rank's bytes from where it got to up to `end` (or its end of file, end 0) to fn. */
static void pass_on(struct replay *rp, int rank, uint64_t end)
{
    while (rp->fd[rank] >= 0 && (end == 0 || rp->done[rank] < end)) {
        size_t want = sizeof(rp->buf);
        if (end && end - rp->done[rank] < want)
            want = (size_t)(end - rp->done[rank]);
        ssize_t n = pread(rp->fd[rank], rp->buf, want, (off_t)rp->done[rank]);
        if (n <= 0)
            return;
        rp->fn(rp->ctx, rank, rp->done[rank], rp->buf, (size_t)n);
        rp->done[rank] += (uint64_t)n;
    }
}

/* Opens the wanted rank logs of the copy in dir. Returns how many. */
static int open_ranks(struct replay *rp, const char *dir, const char *ranks)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        int r = rank_of(e->d_name);
        if (r < 0 || !gs_run_ranks_has(ranks, r))
            continue;
        struct gs_buf path = GS_BUF_INIT;
        gs_buf_addf(&path, "%s/%s", dir, e->d_name);
        rp->fd[r] = open(path.data, O_RDONLY | O_CLOEXEC);
        n += rp->fd[r] >= 0;
        gs_buf_release(&path);
    }
    if (d)
        closedir(d);
    return n;
}

/* Follows the journal: each record passes its rank on up to the size it names. A missing
 * journal (a copy kept before there was one) or another version passes nothing. */
static void follow_journal(struct replay *rp, const char *dir)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_buf_addf(&path, "%s/%s", dir, JOURNAL);
    FILE *fp = fopen(path.data, "r");
    char line[128];
    int rank;
    unsigned long long size;
    if (fp && fgets(line, sizeof(line), fp) && strcmp(line, JOURNAL_HEADER) == 0)
        while (fgets(line, sizeof(line), fp))
            if (sscanf(line, "%d %llu", &rank, &size) == 2 && rank >= 0 &&
                rank < GS_RUNS_MAX_RANKS && size > 0)
                pass_on(rp, rank, size);
    if (fp)
        fclose(fp);
    gs_buf_release(&path);
}

int gs_run_local_replay(const char *root, const char *id, const char *ranks, gs_tail_fn fn,
                        void *ctx, struct gs_error *err)
{
    struct gs_buf dir = GS_BUF_INIT;
    struct replay *rp = gs_xcalloc(1, sizeof(*rp));
    rp->fn = fn;
    rp->ctx = ctx;
    for (int r = 0; r < GS_RUNS_MAX_RANKS; r++)
        rp->fd[r] = -1;
    int rc = 0;
    if (id_valid(id))
        local_dir(root, id, &dir);
    if (!dir.data || open_ranks(rp, dir.data, ranks) == 0)
        rc = gs_error_set(err, GS_E_NOTFOUND, "no local copy of run '%s' in %s/%s/runs/", id, root,
                          GS_DIR);
    if (rc == 0)
        follow_journal(rp, dir.data);
    for (int r = 0; r < GS_RUNS_MAX_RANKS; r++) {
        if (rc == 0)
            pass_on(rp, r, 0);
        if (rp->fd[r] >= 0)
            close(rp->fd[r]);
    }
    free(rp);
    gs_buf_release(&dir);
    return rc;
}
