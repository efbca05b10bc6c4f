/* cli/cmd_pull.c: `gpusync pull REMOTE_PATH [LOCAL_PATH]`: downloads results (checkpoints, logs)
 * from the remote project through the agent; each file is written to a temporary name and renamed
 * into place, so an interrupted pull never leaves half a file. A directory is pulled whole. A
 * local file holding content gpusync did not sync (never pushed nor pulled, or edited since) is
 * kept as a conflict copy, never overwritten; a local symlink where it would write refuses the
 * pull. Each file written is recorded in the index as pulled (index.h): the server's, until it is
 * edited here. A symlink on the server is made a symlink here (its target as the server has it,
 * never followed), after every file is written; anything else (a fifo, a socket, a device) is
 * not pulled and the summary says so. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/progress.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/path.h"
#include "common/quote.h"
#include "common/wrapper.h"
#include "remote/agent_client.h"
#include "syncd/hash.h"
#include "syncd/index.h"
#include "syncd/plan.h"
#include "syncd/session.h"

static const struct option pull_options[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};

/* How often a file that changes on the server while it is read is read again: a checkpoint being
 * saved is usually whole a moment later. The pauses between tries double from PULL_PAUSE_MS. */
#define PULL_TRIES    4
#define PULL_PAUSE_MS 250

enum pull_state {
    PULL_PENDING,
    PULL_DONE,     /* written at its local path and recorded */
    PULL_VANISHED, /* listed, then removed on the server before it was read: skipped */
    PULL_FAILED,   /* it kept changing on the server while read: not written (failures) */
};

struct pull_file {
    char *remote;
    char *local;
    uint64_t size;
    enum pull_state state;
};

struct pull_link {
    char *remote;
    char *local;
    char *target; /* as the server has it: never resolved here */
};

struct pull_job {
    struct gs_cli *cli;
    const char *remote_base; /* the REMOTE_PATH argument */
    const char *local_base;  /* where it goes */
    size_t check_from;       /* local_base's components from here on may hold no symlink */
    struct gs_index *idx;    /* what was synced, to tell an unsynced local edit */
    struct pull_file *files;
    size_t n, cap;
    size_t n_done;  /* files written */
    uint64_t bytes; /* their size */
    int is_folder;  /* REMOTE_PATH is a directory: a file that vanishes from it is skipped */
    struct pull_link *links; /* made after every file is written */
    size_t n_links, cap_links;
    json_t *skipped;  /* [{path, kind}]: what the server holds that pull does not make here */
    json_t *kept;     /* [{local, kept}]: local edits moved aside */
    json_t *failures; /* [{path, error}]: files not pulled because they kept changing there */
    json_t *held;     /* [{path, writer}]: pulled while a process held them open for writing */
    int base_is_link; /* REMOTE_PATH itself is a symlink on the server: made as one */
    char **made;      /* the local directories this pull created, parents first */
    size_t n_made, cap_made;
    uint64_t total, done_before;
    struct gs_progress bar;
};

static void add_file(struct pull_job *job, const char *remote, const char *local, uint64_t size)
{
    GS_ALLOC_GROW(job->files, job->n + 1, job->cap);
    job->files[job->n++] =
        (struct pull_file){gs_xstrdup(remote), gs_xstrdup(local), size, PULL_PENDING};
    job->total += size;
}

static void add_link(struct pull_job *job, const char *remote, const char *local,
                     const char *target)
{
    GS_ALLOC_GROW(job->links, job->n_links + 1, job->cap_links);
    job->links[job->n_links++] =
        (struct pull_link){gs_xstrdup(remote), gs_xstrdup(local), gs_xstrdup(target)};
}

/* Notes a remote path left out (neither file, folder nor symlink, or unlisted) for the summary. */
static void add_skipped(struct pull_job *job, const char *remote, const char *kind)
{
    json_array_append_new(job->skipped, json_pack("{s:o,s:o}", "path", gs_json_text(remote), "kind",
                                                  gs_json_text(kind)));
    struct gs_buf q = GS_BUF_INIT, k = GS_BUF_INIT; /* names shown quoted (common/quote.h) */
    if (!job->cli->json)
        fprintf(stderr,
                "gpusync: %s was not pulled: it is a %s (pull makes files, folders and "
                "symlinks)\n",
                gs_quote_str(&q, remote), gs_quote_str(&k, kind));
    gs_buf_release(&q);
    gs_buf_release(&k);
}

/* Creates `dir` and its missing parents, noting each one made so that a failed pull can remove
 * them again (undo_dirs). Errors are left to the write that needs the directory. */
static void make_dirs(struct pull_job *job, const char *dir)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_buf_adds(&p, dir);
    for (size_t i = 1; i <= p.len; i++) {
        if (i < p.len && p.data[i] != '/')
            continue;
        p.data[i] = '\0';
        if (mkdir(p.data, 0755) == 0) {
            GS_ALLOC_GROW(job->made, job->n_made + 1, job->cap_made);
            job->made[job->n_made++] = gs_xstrdup(p.data);
        }
        if (i < p.len)
            p.data[i] = '/';
    }
    gs_buf_release(&p);
}

/* After a failed pull: removes the directories it created, deepest first, if they are still
 * empty (a file pulled before the failure stays, and so does its folder). A refused or missing
 * REMOTE_PATH thus leaves nothing behind for the next push to send. */
static void undo_dirs(struct pull_job *job)
{
    while (job->n_made) {
        char *dir = job->made[--job->n_made];
        rmdir(dir);
        free(dir);
    }
}

/* Refuses a symlink at any component of `path` from job->check_from on: pull neither writes
 * through one (it may lead out of the project and replace files there) nor replaces one (the
 * user made it). Checks stop at the first component that does not exist yet. */
static int refuse_symlinks(struct pull_job *job, const char *path)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_buf_adds(&p, path);
    int rc = 0, found = 1;
    for (size_t i = job->check_from; rc == 0 && found && i <= p.len; i++) {
        if (i < p.len && (p.data[i] != '/' || i == job->check_from)) /* not a component's end */
            continue;
        char c = p.data[i];
        p.data[i] = '\0';
        struct stat st;
        found = lstat(p.data, &st) == 0;
        if (found && S_ISLNK(st.st_mode))
            rc = gs_error_set(&job->cli->err, GS_E_CONFLICT,
                              "%s is a symlink; pull does not write through or over a symlink: "
                              "move it away, or give another LOCAL_PATH",
                              p.data);
        p.data[i] = c;
    }
    gs_buf_release(&p);
    return rc;
}

/* refuse_symlinks for the directories above `path`, not `path` itself: where pull makes a
 * symlink, a link already at that name is replaced or kept aside (make_link), never followed. */
static int refuse_symlinks_above(struct pull_job *job, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) < job->check_from)
        return 0;
    char *parent = gs_xstrndup(path, (size_t)(slash - path));
    int rc = refuse_symlinks(job, parent);
    free(parent);
    return rc;
}

/* Collects files and symlinks under a remote directory (LIST gives paths relative to the root,
 * each checked against the wire path rules by the agent client). An entry outside the directory
 * asked for is a server that lies: the pull stops before anything is written. */
static int on_entry(void *ctx, const struct gs_agent_entry *e)
{
    struct pull_job *job = ctx;
    size_t blen = strlen(job->remote_base);
    if (!strcmp(e->path, job->remote_base) && e->kind == 3 && e->link && e->link[0]) {
        job->base_is_link = 1; /* LIST names a symlink asked for by its own path */
        int rc = refuse_symlinks_above(job, job->local_base);
        if (rc == 0)
            add_link(job, e->path, job->local_base, e->link);
        return rc;
    }
    if (strncmp(e->path, job->remote_base, blen) != 0 || e->path[blen] != '/')
        return gs_error_set(&job->cli->err, GS_E_PROTO,
                            "the server listed %s, which is not under %s; pull refused", e->path,
                            job->remote_base);
    const char *rest = e->path + blen + 1;
    if (e->skipped) { /* too long, or too deep to walk: said, not silently missing */
        struct gs_buf q = GS_BUF_INIT;
        fprintf(stderr, "gpusync: %s was not pulled: the server cannot list it (%s)\n",
                gs_quote_str(&q, e->path), strerror(e->skipped));
        gs_buf_release(&q);
        json_array_append_new(job->skipped, json_pack("{s:o,s:s}", "path", gs_json_text(e->path),
                                                      "kind", "unlisted"));
        return 0;
    }
    if (e->kind != 1 && e->kind != 2 && e->kind != 3) {
        add_skipped(job, e->path, e->link && e->link[0] ? e->link : "other");
        return 0;
    }
    struct gs_buf local = GS_BUF_INIT;
    gs_path_join(&local, job->local_base, rest);
    int rc =
        e->kind == 3 ? refuse_symlinks_above(job, local.data) : refuse_symlinks(job, local.data);
    if (rc == 0 && e->kind == 3 && !e->link[0]) /* the agent could not read its target */
        add_skipped(job, e->path, "unreadable-symlink");
    else if (rc == 0 && e->kind == 3)
        add_link(job, e->path, local.data, e->link);
    if (rc == 0 && e->kind == 2) /* the listing can name a directory before LOCAL_PATH exists */
        make_dirs(job, local.data);
    else if (rc == 0 && e->kind == 1)
        add_file(job, e->path, local.data, e->size);
    gs_buf_release(&local);
    return rc;
}

/* Whether the local file `st` describes differs from what the index says was last synced. */
static int changed_since_sync(const char *local, const struct stat *st,
                              const struct gs_index_entry *e)
{
    int64_t mtime_ns = gs_time_ns(st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    int64_t ctime_ns = gs_time_ns(st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
    /* the stat cache as the plan reads it (plan.c): the ctime catches an edit that put the size
     * and mtime back */
    if (e->has_local && e->local_size == (uint64_t)st->st_size && e->local_mtime_ns == mtime_ns &&
        e->local_ctime_ns == ctime_ns)
        return 0;
    struct gs_hash h;
    return !(e->has_hash && gs_hash_file(local, &h, NULL) == 0 && gs_hash_equal(&h, &e->hash));
}

/* Whether the regular local file `st` describes holds content gpusync does not know it synced:
 * absent from the index (never pushed nor pulled: a new file), or edited since its sync or pull. A
 * lookup that fails counts as unknown: asking the server costs a round trip, guessing wrong could
 * cost the file. */
static int unknown_content(struct pull_job *job, const char *local, const struct stat *st)
{
    struct gs_buf rel = GS_BUF_INIT;
    struct gs_index_entry e = {0};
    int unknown = 1;
    if (gs_path_project_relative(job->cli->root.data, local, &rel, NULL) == 0 && rel.len &&
        gs_index_get(job->idx, rel.data, &e, NULL) == 1 && e.kind == GS_KIND_FILE)
        unknown = changed_since_sync(local, st, &e);
    gs_index_entry_release(&e);
    gs_buf_release(&rel);
    return unknown;
}

/* Sets *differs to whether the local file's content is other than the server's: the same content
 * arriving again (a file pulled twice) needs no copy. Returns 0, or the error asking the server
 * (nothing is moved then: the download would fail the same way). */
static int differs_from_server(struct pull_job *job, struct gs_agent *agent,
                               const struct pull_file *f, int *differs)
{
    uint8_t theirs[GS_HASH_LEN];
    struct gs_hash ours;
    int rc = gs_agent_hash(agent, f->remote, theirs, &job->cli->err);
    if (rc == 0)
        *differs =
            gs_hash_file(f->local, &ours, NULL) != 0 || memcmp(ours.b, theirs, GS_HASH_LEN) != 0;
    return rc;
}

/* Moves the local file aside to a conflict copy and reports it in "kept". */
static int keep_copy(struct pull_job *job, const char *local)
{
    struct gs_buf kept = GS_BUF_INIT;
    int rc = gs_path_keep_conflict(local, &kept, &job->cli->err);
    if (rc == 0)
        json_array_append_new(job->kept, json_pack("{s:o,s:o}", "local", gs_json_text(local),
                                                   "kept", gs_json_text(kept.data)));
    struct gs_buf q = GS_BUF_INIT, k = GS_BUF_INIT;
    if (rc == 0 && !job->cli->json)
        fprintf(stderr, "gpusync: %s held content the server does not have; kept as %s\n",
                gs_quote_str(&q, local), gs_quote_str(&k, kept.data));
    gs_buf_release(&q);
    gs_buf_release(&k);
    gs_buf_release(&kept);
    return rc;
}

/* A local file whose content gpusync did not sync holds work the server may not have: it is moved
 * to a conflict copy before the pull replaces it, unless the server holds the same content. */
static int keep_local_change(struct pull_job *job, struct gs_agent *agent,
                             const struct pull_file *f)
{
    struct stat st;
    int differs = 0;
    if (lstat(f->local, &st) != 0 || !S_ISREG(st.st_mode) || !unknown_content(job, f->local, &st))
        return 0;
    int rc = differs_from_server(job, agent, f, &differs);
    return rc == 0 && differs ? keep_copy(job, f->local) : rc;
}

/* A pulled path the index could not record: the pull stands, but a push may send it back. */
static void say_unrecorded(const char *local, const struct gs_error *err)
{
    struct gs_buf q = GS_BUF_INIT, why = GS_BUF_INIT;
    const char *names[] = {local, NULL};
    gs_quote_message(&why, err->msg, names, 0);
    fprintf(stderr,
            "gpusync: %s was pulled but not recorded as pulled (%s): a push may send it back\n",
            gs_quote_str(&q, local), why.data);
    gs_buf_release(&q);
    gs_buf_release(&why);
}

/* Records in the index that the local file `f` was pulled (index.h, `pulled`): its content is the
 * server's and its stat is cached, so the plan sends nothing for it while it is unchanged and the
 * next pull replaces it without a conflict copy, while the server's copy stays its writer's (a
 * job's next checkpoint is neither checked nor put back). Only where the local path is the remote
 * one: a copy pulled elsewhere is a new file of the project. A failure to record is said and
 * leaves the file as if pulled before: unknown to gpusync. */
static void record_pulled(struct pull_job *job, const struct pull_file *f)
{
    struct gs_buf rel = GS_BUF_INIT;
    struct gs_index_entry e = {.kind = GS_KIND_FILE, .has_hash = 1, .pulled = 1};
    struct stat st;
    struct gs_error err = {0};
    int rc = 0;
    if (gs_path_project_relative(job->cli->root.data, f->local, &rel, NULL) == 0 && rel.len &&
        !strcmp(rel.data, f->remote) && lstat(f->local, &st) == 0 && S_ISREG(st.st_mode)) {
        rc = gs_hash_file(f->local, &e.hash, &err);
        int64_t mtime_ns = gs_time_ns(st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        e.path = rel.data;
        e.mode = st.st_mode & 07777;
        e.size = e.local_size = (uint64_t)st.st_size;
        e.mtime_ns = e.local_mtime_ns = mtime_ns; /* the server's: gs_agent_get set it */
        e.local_ino = (uint64_t)st.st_ino;
        e.local_ctime_ns = gs_time_ns(st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
        /* a stat too recent to vouch for the content is not cached (plan.h, GS_PLAN_RACY_NS) */
        e.has_local = mtime_ns < gs_time_ns(now.tv_sec, now.tv_nsec) - GS_PLAN_RACY_NS;
        if (rc == 0)
            rc = gs_index_put(job->idx, &e, &err);
    }
    if (rc < 0)
        say_unrecorded(f->local, &err);
    gs_buf_release(&rel);
}

/* record_pulled for a symlink made here: a job that points it elsewhere later (latest.pt ->
 * ckpt-300.pt) is neither reverted nor called a conflict, and it is not sent back. */
static void record_pulled_link(struct pull_job *job, const struct pull_link *l)
{
    struct gs_buf rel = GS_BUF_INIT;
    struct gs_index_entry e = {.kind = GS_KIND_SYMLINK, .pulled = 1};
    struct stat st;
    struct gs_error err = {0};
    int rc = 0;
    if (gs_path_project_relative(job->cli->root.data, l->local, &rel, NULL) == 0 && rel.len &&
        !strcmp(rel.data, l->remote) && lstat(l->local, &st) == 0 && S_ISLNK(st.st_mode)) {
        e.path = rel.data;
        e.link = l->target;
        e.mode = 0777;
        e.size = strlen(l->target);
        rc = gs_index_put(job->idx, &e, &err);
    }
    if (rc < 0)
        say_unrecorded(l->local, &err);
    gs_buf_release(&rel);
}

static void on_bytes(void *ctx, uint64_t done, uint64_t total)
{
    (void)total;
    struct pull_job *job = ctx;
    gs_progress_update(&job->bar, 0, 1, job->done_before + done, job->total);
}

/* Creates the directory that will hold `local`: the temporary file is made beside it, and a
 * nested file's directory may not exist yet (only LOCAL_PATH's parent was made up front). */
static void make_parent(struct pull_job *job, const char *local)
{
    struct gs_buf parent = GS_BUF_INIT;
    gs_buf_adds(&parent, local);
    char *slash = strrchr(parent.data, '/');
    if (slash && slash != parent.data) {
        *slash = '\0';
        make_dirs(job, parent.data);
    }
    gs_buf_release(&parent);
}

/* Reads the target of the symlink `path` into *out (the caller frees it). Returns 0 or -1. */
static int read_link(const char *path, char **out)
{
    for (size_t cap = 256;; cap *= 2) {
        char *buf = gs_xmalloc(cap);
        ssize_t n = readlink(path, buf, cap);
        if (n >= 0 && (size_t)n < cap) {
            buf[n] = '\0';
            *out = buf;
            return 0;
        }
        free(buf);
        if (n < 0)
            return -1;
    }
}

/* Whether the local symlink `local` is the one gpusync last synced there (pushed, with this
 * target); a lookup that fails counts as not. */
static int synced_link(struct pull_job *job, const char *local, const char *target)
{
    struct gs_buf rel = GS_BUF_INIT;
    struct gs_index_entry e = {0};
    int synced = gs_path_project_relative(job->cli->root.data, local, &rel, NULL) == 0 && rel.len &&
                 gs_index_get(job->idx, rel.data, &e, NULL) == 1 && e.kind == GS_KIND_SYMLINK &&
                 e.link && strcmp(e.link, target) == 0;
    gs_index_entry_release(&e);
    gs_buf_release(&rel);
    return synced;
}

/* Makes way for the server's symlink at l->local: sets *same when a link with its target is
 * already there (nothing to do); keeps a file or link gpusync did not sync there as a conflict
 * copy; refuses a directory or anything else (GS_E_CONFLICT), which the pull never replaces. */
static int clear_for_link(struct pull_job *job, const struct pull_link *l, int *same)
{
    struct stat st;
    *same = 0;
    if (lstat(l->local, &st) != 0)
        return errno == ENOENT ? 0 : gs_error_errno(&job->cli->err, GS_E_IO, "%s", l->local);
    if (S_ISLNK(st.st_mode)) {
        char *have = NULL;
        if (read_link(l->local, &have) == 0 && strcmp(have, l->target) == 0)
            *same = 1;
        int known = have && synced_link(job, l->local, have);
        free(have);
        return *same || known ? 0 : keep_copy(job, l->local);
    }
    if (S_ISREG(st.st_mode))
        return unknown_content(job, l->local, &st) ? keep_copy(job, l->local) : 0;
    return gs_error_set(&job->cli->err, GS_E_CONFLICT,
                        "%s is a %s here, and the server holds a symlink there: move it away, or "
                        "give another LOCAL_PATH",
                        l->local, S_ISDIR(st.st_mode) ? "folder" : "special file");
}

/* Makes the server's symlink at l->local as a temporary link beside it renamed into place, so
 * whatever was there is replaced whole and never followed. Checks again that no directory above
 * it is a symlink: only now are they all made. */
static int make_link(struct pull_job *job, const struct pull_link *l)
{
    int same = 0;
    int rc = refuse_symlinks_above(job, l->local); /* before mkdir, which would follow one */
    if (rc == 0)
        make_parent(job, l->local);
    if (rc == 0)
        rc = clear_for_link(job, l, &same);
    if (rc == 0 && same)
        record_pulled_link(job, l);
    if (rc < 0 || same)
        return rc;
    struct gs_buf tmp = GS_BUF_INIT;
    const char *slash = strrchr(l->local, '/');
    if (slash)
        gs_buf_add(&tmp, l->local, (size_t)(slash - l->local) + 1);
    gs_buf_addf(&tmp, ".gpusync-tmp-%d", (int)getpid());
    if (symlink(l->target, tmp.data) != 0 &&
        (errno != EEXIST || unlink(tmp.data) != 0 || symlink(l->target, tmp.data) != 0))
        rc = gs_error_errno(&job->cli->err, GS_E_IO, "cannot create the symlink %s", tmp.data);
    else if (rename(tmp.data, l->local) != 0) {
        rc = gs_error_errno(&job->cli->err, GS_E_IO, "cannot rename %s to %s", tmp.data, l->local);
        unlink(tmp.data);
    }
    gs_buf_release(&tmp);
    if (rc == 0)
        record_pulled_link(job, l);
    return rc;
}

/* Works out the file list: one file, or every file below a directory. Creates no directory
 * before the server has listed REMOTE_PATH as one. */
static int collect(struct pull_job *job, struct gs_agent *agent)
{
    /* LOCAL_PATH itself may be a symlink only where the server's REMOTE_PATH is one (then the
     * pull replaces the link); every listed entry's path is checked whole in on_entry. */
    int rc = refuse_symlinks_above(job, job->local_base);
    if (rc < 0)
        return rc;
    rc = gs_agent_list(agent, job->remote_base, 0, on_entry, job, &job->cli->err);
    if (rc == GS_E_REMOTE && job->n == 0) { /* not a directory: a single file */
        gs_error_clear(&job->cli->err);
        rc = refuse_symlinks(job, job->local_base);
        if (rc == 0)
            add_file(job, job->remote_base, job->local_base, 0);
    } else if (rc == 0 && !job->base_is_link) {
        job->is_folder = 1;
        rc = refuse_symlinks(job, job->local_base);
        if (rc == 0)
            make_dirs(job, job->local_base);
    }
    return rc;
}

/* REMOTE_PATH was a symlink, made here as one: where what it points to is not here (pulled
 * alone, latest.pt -> ckpt-200.pt dangles), says what to pull for the content. */
static void note_link_target(const struct pull_job *job)
{
    struct stat st;
    const struct pull_link *l = &job->links[0];
    if (stat(l->local, &st) == 0)
        return;
    struct gs_buf q = GS_BUF_INIT, t = GS_BUF_INIT;
    fprintf(stderr,
            "gpusync: %s is a symlink on the server (-> %s), made here as one; what it points to "
            "is not here: pull that too, or the folder holding both\n",
            gs_quote_str(&q, l->remote), gs_quote_str(&t, l->target));
    gs_buf_release(&q);
    gs_buf_release(&t);
}

/* A file of a folder pull that the server no longer holds (removed since it was listed): the
 * pull goes on without it and names it (`skipped`), as it names what it cannot make. A folder
 * copied file by file while a job changes it is never one moment of the server: each file pulled
 * is whole, as the server held it when it was read. */
static void skip_vanished(struct pull_job *job, struct pull_file *f)
{
    f->state = PULL_VANISHED;
    json_array_append_new(
        job->skipped, json_pack("{s:o,s:s}", "path", gs_json_text(f->remote), "kind", "vanished"));
    struct gs_buf q = GS_BUF_INIT;
    fprintf(stderr, "gpusync: %s was not pulled: it was removed on the server during the pull\n",
            gs_quote_str(&q, f->remote));
    gs_buf_release(&q);
    gs_error_clear(&job->cli->err);
}

/* A file that changed on the server each time it was read: not written here (the local path
 * keeps what it held), named in `failures`, and the pull fails once the other files are in. */
static void fail_changed(struct pull_job *job, struct pull_file *f)
{
    struct gs_buf msg = GS_BUF_INIT;
    gs_buf_addf(&msg,
                "%s changed on the server while it was pulled (a job still writing it?); pulled "
                "again %d times; try again once it is written",
                f->remote, PULL_TRIES - 1);
    f->state = PULL_FAILED;
    json_array_append_new(job->failures, json_pack("{s:o,s:o}", "path", gs_json_text(f->remote),
                                                   "error", gs_json_text(msg.data)));
    struct gs_buf shown = GS_BUF_INIT;
    const char *names[] = {f->remote, NULL};
    gs_quote_message(&shown, msg.data, names, 0);
    fprintf(stderr, "gpusync: %s\n", shown.data);
    gs_buf_release(&shown);
    gs_buf_release(&msg);
    gs_error_clear(&job->cli->err);
}

/* A file pulled while a process on the server held it open for writing, not appending: it is
 * the file as it was then, a log so far or maybe a checkpoint half saved. Said, and listed. */
static void note_held_open(struct pull_job *job, struct pull_file *f, const char *writer)
{
    json_array_append_new(job->held, json_pack("{s:o,s:o}", "path", gs_json_text(f->remote),
                                               "writer", gs_json_text(writer)));
    struct gs_buf q = GS_BUF_INIT, w = GS_BUF_INIT;
    gs_quote_message(&w, writer, NULL, 0);
    fprintf(stderr,
            "gpusync: %s was open for writing on the server (%s) as it was pulled: it is the "
            "file as it was then, maybe a part of what is being written\n",
            gs_quote_str(&q, f->remote), w.data);
    gs_buf_release(&q);
    gs_buf_release(&w);
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Pulls one file, reading it again while the agent says it changed as it was read. Returns 0
 * (pulled, vanished from a folder, or kept changing: f->state says which) or the error that ends
 * the pull. */
static int fetch_one(struct pull_job *job, struct gs_agent *agent, struct pull_file *f)
{
    int rc = 0;
    struct gs_agent_got got = {0};
    make_parent(job, f->local);
    for (int try = 0; try < PULL_TRIES; try++) {
        if (try > 0)
            pause_ms((long)PULL_PAUSE_MS << (try - 1));
        got.changed = 0;
        rc = keep_local_change(job, agent, f);
        if (rc == 0)
            rc = gs_agent_get(agent, f->remote, f->local, on_bytes, job, &got, &job->cli->err);
        if (rc == 0 || !got.changed)
            break;
    }
    if (rc == GS_E_NOTFOUND && job->is_folder)
        skip_vanished(job, f);
    else if (rc < 0 && got.changed)
        fail_changed(job, f);
    else if (rc == 0 && got.writer[0])
        note_held_open(job, f, got.writer);
    if (rc < 0)
        return f->state == PULL_PENDING ? rc : 0;
    struct stat st;
    f->state = PULL_DONE;
    record_pulled(job, f);
    job->n_done++;
    if (stat(f->local, &st) == 0) /* what arrived: the listing's size may be older */
        job->bytes += (uint64_t)st.st_size;
    return 0;
}

static int fetch_all(struct pull_job *job, struct gs_agent *agent)
{
    gs_progress_init(&job->bar);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < job->n; i++) {
        rc = fetch_one(job, agent, &job->files[i]);
        job->done_before += job->files[i].size;
    }
    gs_progress_end(&job->bar);
    for (size_t i = 0; rc == 0 && i < job->n_links; i++) /* files first: see make_link */
        rc = make_link(job, &job->links[i]);
    if (rc == 0 && job->base_is_link)
        note_link_target(job);
    return rc;
}

/* The symlinks made, as --json lists them: [{remote, local, target}]. */
static json_t *links_json(const struct pull_job *job)
{
    json_t *links = json_array();
    for (size_t i = 0; i < job->n_links; i++)
        json_array_append_new(links, json_pack("{s:o,s:o,s:o}", "remote",
                                               gs_json_text(job->links[i].remote), "local",
                                               gs_json_text(job->links[i].local), "target",
                                               gs_json_text(job->links[i].target)));
    return links;
}

/* The summary: --json's object (with `error` and `message` too when a file kept changing, as the
 * error object has them), or a line on stdout. Returns the exit status. */
static int report(struct pull_job *job)
{
    char b[32];
    size_t skipped = json_array_size(job->skipped), failed = json_array_size(job->failures);
    const char *first =
        failed ? json_string_value(json_object_get(json_array_get(job->failures, 0), "error"))
               : NULL;
    if (job->cli->json) {
        json_t *files = json_array();
        for (size_t i = 0; i < job->n; i++)
            if (job->files[i].state == PULL_DONE)
                json_array_append_new(files, json_pack("{s:o,s:o}", "remote",
                                                       gs_json_text(job->files[i].remote), "local",
                                                       gs_json_text(job->files[i].local)));
        json_t *o = json_pack("{s:i,s:b,s:o,s:o,s:O,s:I,s:O,s:O,s:O}", "v", 1, "ok", failed == 0,
                              "files", files, "symlinks", links_json(job), "skipped", job->skipped,
                              "bytes", (json_int_t)job->bytes, "kept", job->kept, "failures",
                              job->failures, "open_for_writing", job->held);
        if (failed) {
            json_object_set_new(o, "error", json_string(gs_error_name(GS_E_ERR)));
            json_object_set_new(o, "message", json_string(first));
        }
        gs_cli_json_print(o);
        return failed ? gs_error_exit_code(GS_E_ERR) : 0;
    }
    printf("pulled %zu file%s", job->n_done, job->n_done == 1 ? "" : "s");
    if (job->n_links)
        printf(" and %zu symlink%s", job->n_links, job->n_links == 1 ? "" : "s");
    struct gs_buf base = GS_BUF_INIT;
    printf(" (%s) into %s", gs_format_bytes(job->bytes, b), gs_quote_str(&base, job->local_base));
    gs_buf_release(&base);
    if (json_array_size(job->held))
        printf("; %zu open for writing there, as they were (named above)",
               json_array_size(job->held));
    if (skipped)
        printf("; %zu not pulled (named above)", skipped);
    if (failed)
        printf("; %zu failed (named above)", failed);
    printf("\n");
    return failed ? gs_error_exit_code(GS_E_ERR) : 0;
}

/* A pull right after the session found the server wiped or recreated (its index cleared): the
 * server holds none of what was synced, and pull sends nothing, so it says so rather than the
 * session's "sending everything again". A REMOTE_PATH it no longer has is not found, said why. */
static int after_reset(struct pull_job *job, int rc)
{
    struct gs_error *err = &job->cli->err;
    if (rc == GS_E_NOTFOUND) {
        gs_error_clear(err);
        return gs_error_set(err, GS_E_NOTFOUND,
                            "%s: not on the server, which no longer holds the tree gpusync last "
                            "synced there (wiped or recreated?): there is nothing to pull; the "
                            "next push or watch sends the project again",
                            job->remote_base);
    }
    if (rc == 0)
        gs_warn("the server no longer holds the tree gpusync last synced there (wiped or "
                "recreated?): pulled what it holds now; the next push or watch sends the project "
                "again");
    return rc;
}

/* A pull that fails after it wrote files keeps them (each one whole, the server's copy at the time,
 * recorded as pulled, so the next pull replaces it without a conflict copy): the error says how
 * many, and where, instead of leaving an unexplained part of the folder. */
static void say_what_was_left(struct pull_job *job)
{
    struct gs_error *err = &job->cli->err;
    if (job->n_done == 0)
        return;
    char was[GS_ERROR_MSG_MAX];
    snprintf(was, sizeof(was), "%s", err->msg);
    gs_error_set(err, err->code,
                 "%s; %zu of %zu files were pulled into %s before that (each whole, as the server "
                 "held it); pull again for the rest",
                 was, job->n_done, job->n, job->local_base);
}

static int run_pull(struct gs_cli *cli, struct pull_job *job)
{
    struct gs_session s;
    int rc = gs_session_open(&s, cli->root.data, &cli->cfg, &cli->err);
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    s.no_server_check = 1;                  /* a file the job changed there is what pull is for */
    s.reset_quiet = 1;                      /* pull sends nothing: after_reset words it */
    rc = gs_session_lock(&s, 1, &cli->err); /* one agent session per project (session.h) */
    if (rc == 0)
        rc = gs_cli_connect(cli);
    if (rc == 0)
        rc = gs_session_connect(&s, cli->ssh, dir.data, cli->cfg.remote_path, &cli->err);
    if (rc == 0 && !s.agent)
        rc = gs_error_set(&cli->err, GS_E_REMOTE, "pull needs the agent (transport is %s)",
                          s.transport);
    job->idx = s.idx;
    if (rc == 0)
        rc = collect(job, s.agent);
    if (rc == 0)
        rc = fetch_all(job, s.agent);
    if (s.index_reset)
        rc = after_reset(job, rc);
    gs_buf_release(&dir);
    gs_session_close(&s);
    if (rc < 0) {
        undo_dirs(job);
        say_what_was_left(job);
        return gs_cli_fail(cli, rc);
    }
    return report(job);
}

static int pull_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_pull, argc, argv, "h", pull_options, NULL);
    if (r == 0 && (cli->argc < 1 || cli->argc > 2))
        return gs_cli_usage_error(&gs_cmd_pull, "expected REMOTE_PATH [LOCAL_PATH]");
    return r;
}

/* REMOTE_PATH read as push reads its PATHs: relative to the current directory ("./" and trailing
 * slashes dropped) and inside the project, stored relative to its root in `rel`. An empty path,
 * one outside the project, or the project itself is a usage error. */
static int remote_path(struct gs_cli *cli, const char *arg, struct gs_buf *rel)
{
    if (!arg[0])
        return gs_error_set(&cli->err, GS_E_USAGE,
                            "REMOTE_PATH is empty; name a file or directory of the project");
    int rc = gs_path_project_relative(cli->root.data, arg, rel, &cli->err);
    if (rc == 0 && rel->len == 0)
        rc = gs_error_set(&cli->err, GS_E_USAGE,
                          "%s is the whole project; name a file or directory in it", arg);
    return rc;
}

/* Stores where the pull writes in `local` and returns the offset of its first component that
 * refuse_symlinks checks. Inside the project every component below the root is checked, and
 * LOCAL_PATH is resolved lexically, so that "link/.." cannot climb through a symlink somewhere
 * the check never looked. A LOCAL_PATH outside the project is the user's choice of place up to
 * its last component, which is checked. */
static size_t local_path(struct gs_cli *cli, const char *arg, const char *rel, struct gs_buf *local)
{
    struct gs_buf in = GS_BUF_INIT;
    if (!arg || gs_path_project_relative(cli->root.data, arg, &in, NULL) == 0) {
        gs_path_join(local, cli->root.data, arg ? (in.data ? in.data : "") : rel);
        gs_buf_release(&in);
        return cli->root.len + 1;
    }
    gs_buf_release(&in);
    gs_buf_adds(local, arg);
    while (local->len > 1 && local->data[local->len - 1] == '/')
        local->data[--local->len] = '\0';
    char *slash = strrchr(local->data, '/');
    return slash ? (size_t)(slash - local->data) + 1 : 0;
}

/* Frees what the job owns (not the strings it borrows from pull_exec). */
static void pull_job_release(struct pull_job *job)
{
    for (size_t i = 0; i < job->n; i++) {
        free(job->files[i].remote);
        free(job->files[i].local);
    }
    free(job->files);
    for (size_t i = 0; i < job->n_links; i++) {
        free(job->links[i].remote);
        free(job->links[i].local);
        free(job->links[i].target);
    }
    free(job->links);
    json_decref(job->skipped);
    for (size_t i = 0; i < job->n_made; i++)
        free(job->made[i]);
    free(job->made);
    json_decref(job->kept);
    json_decref(job->failures);
    json_decref(job->held);
}

/* Connects itself (not GS_CMD_NEED_CONNECTION): after taking the project's session lock. */
static int pull_exec(struct gs_cli *cli)
{
    struct gs_buf remote = GS_BUF_INIT, local = GS_BUF_INIT;
    if (remote_path(cli, cli->argv[0], &remote) < 0) {
        gs_buf_release(&remote);
        return gs_cli_fail(cli, GS_E_USAGE);
    }
    size_t check_from = local_path(cli, cli->argc == 2 ? cli->argv[1] : NULL, remote.data, &local);
    struct pull_job job = {.cli = cli,
                           .remote_base = remote.data,
                           .local_base = local.data,
                           .check_from = check_from,
                           .skipped = json_array(),
                           .kept = json_array(),
                           .failures = json_array(),
                           .held = json_array()};
    int rc = run_pull(cli, &job);
    pull_job_release(&job);
    gs_buf_release(&local);
    gs_buf_release(&remote);
    return rc;
}

const struct gs_cmd gs_cmd_pull = {
    .name = "pull",
    .usage = "pull REMOTE_PATH [LOCAL_PATH]",
    .summary = "Download a file or directory from the remote project",
    .help = "  REMOTE_PATH is a path in the project, as push reads one (relative to the current\n"
            "  directory); LOCAL_PATH defaults to the same path in the local project. Files are\n"
            "  replaced atomically. A local file holding content gpusync did not sync (never\n"
            "  pushed nor pulled, or edited since) that differs from the server's is first kept\n"
            "  as NAME.gpusync-conflict-YYYYmmdd-HHMMSS. A pulled file stays the server's until\n"
            "  you edit it here: push and watch do not send it back or check it there (a job may\n"
            "  write it again); edited here, it is sent; deleted here, the server keeps it. A\n"
            "  local symlink where the pull would write is never followed or replaced: the pull\n"
            "  is refused (exit 6). Every path the server lists must lie under REMOTE_PATH, or\n"
            "  nothing is pulled. A pull that fails before it writes a file leaves no new folder\n"
            "  behind; one that fails later keeps the files it wrote, whole, and says how many.\n"
            "  A file that only grows while it is read (a log) comes as it was when the read\n"
            "  began. One a job writes while it is read is read again (up to 3 times); one that\n"
            "  keeps changing is not pulled, its local copy kept, and the pull exits 1 once the\n"
            "  other files are in. One a process holds open for writing is pulled as it is and\n"
            "  named (a log so far, or a checkpoint maybe half saved). A file removed on the\n"
            "  server during a folder pull is skipped and named. setuid, setgid and sticky bits\n"
            "  are not pulled. The server's symlinks arrive as symlinks (never followed), made\n"
            "  after the files; fifos, sockets and devices are not pulled, and are named.\n"
            "  After the server was wiped or recreated, a REMOTE_PATH it lacks fails: pull\n"
            "  sends nothing.\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = pull_parse,
    .exec = pull_exec,
};
