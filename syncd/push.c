/* syncd/push.c: executing a plan through a transport (see push.h). */
#include "syncd/push.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "syncd/hash.h"
#include "syncd/scan.h"

#define COMMIT_EVERY_MS 50
#define INTENT_WINDOW   512 /* intents recorded (and committed) ahead of the requests */

struct run {
    struct gs_index *idx;
    const struct gs_push_opts *opts;
    struct gs_push_stats *st;
    struct gs_fileops *ops;
    int64_t last_commit_ms;
    int out_of_space; /* stop sending content: the server's disk is full */
    struct gs_error index_err;
    unsigned char *state; /* per plan op: 0 not sent, 1 sent, 2 answered */
    int64_t *intent;      /* per plan op: its intent's id in the index, 0 if none */
    size_t intents_upto;  /* ops below this have their intent recorded */
    const struct gs_plan_op *ops_base;
    uint64_t bytes_base; /* the transport's bytes_sent when this run began */
};

/* Bytes this run's transport has sent on (see gs_push_stats.bytes_out). */
static void count_bytes_out(struct run *run)
{
    uint64_t handed = run->ops->bytes_sent - run->bytes_base;
    run->st->bytes_out = handed > run->ops->bytes_unsent ? handed - run->ops->bytes_unsent : 0;
}

/* The transport streamed more of a file: progress moves before the file's reply. */
static void on_bytes(void *ctx)
{
    struct run *run = ctx;
    count_bytes_out(run);
    if (run->opts->on_progress)
        run->opts->on_progress(run->opts->ctx, run->st);
}

static void count_success(struct gs_push_stats *st, const struct gs_plan_op *op)
{
    switch (op->type) {
    case GS_OP_PUT:
        st->sent++;
        st->bytes_sent += op->record.size;
        break;
    case GS_OP_DELETE:
        st->deleted++;
        break;
    case GS_OP_RENAME:
        st->renamed++;
        break;
    case GS_OP_MKDIR:
        st->mkdirs++;
        break;
    case GS_OP_SYMLINK:
        st->symlinks++;
        break;
    case GS_OP_CHMOD:
        st->chmods++;
        break;
    }
}

static void note_failure(struct run *run, const struct gs_plan_op *op,
                         const struct gs_fop_result *r)
{
    run->st->failed++;
    /* both transports' messages already name the operation and path ("put a.py: No space left
     * on device"); prefixing them again read "put a.py: put a.py: ..." */
    if (!run->st->first_error[0] && r->message && strstr(r->message, op->path))
        snprintf(run->st->first_error, sizeof(run->st->first_error), "%s", r->message);
    else if (!run->st->first_error[0])
        snprintf(run->st->first_error, sizeof(run->st->first_error), "%s %s: %s",
                 gs_plan_op_name(op->type), op->path, r->message ? r->message : "failed");
    if (r->err_no == ENOSPC || r->err_no == EDQUOT)
        run->out_of_space = 1;
}

/* Commits what completed so far, at most every COMMIT_EVERY_MS, so a crash loses little. */
static void maybe_commit(struct run *run)
{
    int64_t now = gs_clock_mono_ms();
    if (now - run->last_commit_ms < COMMIT_EVERY_MS)
        return;
    gs_index_commit(run->idx, &run->index_err);
    gs_index_begin(run->idx, &run->index_err);
    run->last_commit_ms = now;
}

static int is_below(const struct gs_index_entry *e, void *ctx)
{
    return strcmp(e->path, ctx) != 0;
}

/* A directory gpusync wrote that now holds files it did not write is left on the server: the
 * delete succeeded as far as gpusync is concerned (its files are gone), and the rest is kept.
 * While the index still holds a file of gpusync's in it (its delete failed or waits), the refusal
 * is an ordinary failure, retried once that file is gone: not a conflict nobody caused. */
static int kept_directory(struct run *run, const struct gs_plan_op *op,
                          const struct gs_fop_result *r)
{
    if (op->type != GS_OP_DELETE || r->ok || r->err_no != ENOTEMPTY)
        return 0;
    struct gs_error err = {0};
    return gs_index_foreach(run->idx, op->path, is_below, op->path, &err) == 0;
}

/* A rename whose source is gone from the server was usually done already by a push killed
 * between the server's rename and the index commit. Replaying it can never succeed, so the source
 * is dropped from the index instead of failing: planned again, the destination is then sent as
 * new, which the server accepts without a conflict when it already holds those bytes, and
 * anything else there is kept as a conflict copy as usual. Nothing is lost. A mode change of a
 * file the server no longer has (removed there behind gpusync's back) cannot succeed either: the
 * file is dropped from the index, and planned again it is sent whole. So is a file whose mtime a
 * chmod was to set (a touch) but whose content the server no longer holds as gpusync wrote it
 * (ESTALE: edited there): its entry forgets the content (forget_content), and sent whole, it
 * keeps the server's copy as a conflict copy. The operation
 * still reaches on_op with its error, so a caller (gpusync push) can plan again at once. */
int gs_push_lost(const struct gs_plan_op *op, const struct gs_fop_result *r)
{
    if (op->type == GS_OP_CHMOD)
        return !r->ok && (r->err_no == ENOENT || (op->stamp && r->err_no == ESTALE));
    return op->type == GS_OP_RENAME && ((!r->ok && r->err_no == ENOENT) || r->moved_aside);
}

/* The server no longer holds the content the index names at `path` (a stamp refused): the entry
 * stays but names no content, so the plan sends the file whole expecting a hash nothing has,
 * and both transports keep whatever is there as a conflict copy (unless it is the very content
 * sent). Dropping the entry would do too, now that both transports read back a same-sized file
 * a new file's path holds; forgetting only the content is the smaller change to the record. */
static int forget_content(struct run *run, const char *path)
{
    struct gs_index_entry e;
    int rc = gs_index_get(run->idx, path, &e, &run->index_err);
    if (rc == 1) {
        e.has_hash = 0;
        memset(&e.hash, 0, sizeof(e.hash));
        e.has_local = 0;
        rc = gs_index_put(run->idx, &e, &run->index_err);
    }
    gs_index_entry_release(&e);
    return rc < 0 ? rc : 0;
}

static int lost_on_server(struct run *run, const struct gs_plan_op *op,
                          const struct gs_fop_result *r)
{
    const char *gone = op->type == GS_OP_RENAME ? op->from : op->path;
    if (!gs_push_lost(op, r))
        return 0;
    if (op->type == GS_OP_CHMOD && r->err_no == ESTALE)
        return forget_content(run, op->path) == 0;
    return gs_index_delete_subtree(run->idx, gone, &run->index_err) == 0;
}

int gs_push_changed_locally(const char *root, const struct gs_plan_op *op)
{
    if (op->type != GS_OP_PUT)
        return 0;
    struct gs_buf abs = GS_BUF_INIT;
    struct stat st;
    struct gs_hash now;
    gs_path_join(&abs, root, op->path);
    if (lstat(abs.data, &st) < 0 && errno == ENAMETOOLONG) {
        gs_buf_release(&abs);
        return 0; /* too long to open (scan.h too_long): no save will make it sendable */
    }
    int changed =
        lstat(abs.data, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != op->record.size;
    /* same size: a rewrite within one timestamp tick keeps the mtime too, so compare the bytes */
    if (!changed && op->record.has_hash)
        changed = gs_hash_file(abs.data, &now, NULL) < 0 || !gs_hash_equal(&now, &op->record.hash);
    gs_buf_release(&abs);
    return changed;
}

static void on_done(void *cb_ctx, void *req_ctx, const struct gs_fop_result *orig)
{
    struct run *run = cb_ctx;
    const struct gs_plan_op *op = req_ctx;
    struct gs_fop_result kept = {.ok = 1, .kept = op->path};
    const struct gs_fop_result *r = kept_directory(run, op, orig) ? &kept : orig;
    size_t i = (size_t)(op - run->ops_base);
    run->state[i] = 2;
    /* the outcome is known now: recorded below in the same transaction as the intent's end */
    gs_index_intent_drop(run->idx, run->intent[i], &run->index_err);
    run->intent[i] = 0;
    run->st->ops_done++;
    if (lost_on_server(run, op, r)) {
        /* neither a success nor a failure: see gs_push_lost (a source kept aside is a conflict) */
        run->st->conflicts += r->moved_aside;
    } else if (r->ok) {
        count_success(run->st, op);
        run->st->conflicts += r->kept != NULL;
        gs_plan_record(run->idx, op, &run->index_err);
    } else {
        note_failure(run, op, r);
    }
    if (run->opts->on_op)
        run->opts->on_op(run->opts->ctx, op, r);
    count_bytes_out(run);
    if (run->opts->on_progress)
        run->opts->on_progress(run->opts->ctx, run->st);
    maybe_commit(run);
}

static enum gs_fop_expect expect_of(const struct gs_plan_expect *e, uint8_t hash[16])
{
    switch (e->kind) {
    case GS_EXPECT_ABSENT:
        return GS_FOP_EXPECT_ABSENT;
    case GS_EXPECT_FILE:
        memcpy(hash, e->hash.b, 16);
        return GS_FOP_EXPECT_HASH;
    case GS_EXPECT_SYMLINK: { /* the agent hashes a symlink's target string */
        struct gs_hash h;
        gs_hash_link(e->link, &h);
        memcpy(hash, h.b, 16);
        return GS_FOP_EXPECT_HASH;
    }
    case GS_EXPECT_DIR: /* a file that replaced it on the server is kept, not deleted */
        return GS_FOP_EXPECT_DIR;
    default:
        return GS_FOP_EXPECT_FORCE;
    }
}

static enum gs_fop_type fop_type(enum gs_op_type t)
{
    static const enum gs_fop_type map[] = {
        [GS_OP_RENAME] = GS_FOP_RENAME, [GS_OP_MKDIR] = GS_FOP_MKDIR,
        [GS_OP_PUT] = GS_FOP_PUT,       [GS_OP_SYMLINK] = GS_FOP_SYMLINK,
        [GS_OP_CHMOD] = GS_FOP_CHMOD,   [GS_OP_DELETE] = GS_FOP_DELETE,
    };
    return map[t];
}

/* Builds the transport request for `op`; `local` receives the absolute local path of a put. */
static void make_request(const char *root, struct gs_plan_op *op, struct gs_buf *local,
                         struct gs_fop_req *req)
{
    memset(req, 0, sizeof(*req));
    req->type = fop_type(op->type);
    req->ctx = op;
    req->mode = op->record.mode;
    req->mtime_ns = op->record.mtime_ns;
    req->size = op->record.size;
    req->path = op->path;
    req->expect = expect_of(&op->expect, req->hash);
    if (op->type == GS_OP_RENAME) {
        req->from_expect = expect_of(&op->expect, req->from_hash); /* the plan's is about `from` */
        req->path = op->from;
        req->path2 = op->path;
        req->expect = GS_FOP_EXPECT_ABSENT; /* the destination is new: the plan never chains */
    } else if (op->type == GS_OP_SYMLINK) {
        req->path2 = op->record.link;
    } else if (op->type == GS_OP_CHMOD) {
        req->stamp = op->stamp && req->expect == GS_FOP_EXPECT_HASH;
    } else if (op->type == GS_OP_PUT) {
        gs_buf_reset(local);
        gs_path_join(local, root, op->path);
        req->local_file = local->data;
        memcpy(req->content_hash, op->record.hash.b, 16);
    }
}

/* What the server holds at op's path once it completed: its record, or nothing for a delete. */
static struct gs_index_intent intent_of(const struct gs_plan_op *op)
{
    struct gs_index_intent in = {
        .op = (int)op->type, .subtree = op->subtree, .from = op->from, .after = op->record};
    if (op->type == GS_OP_DELETE)
        in.after = (struct gs_index_entry){.path = op->path, .kind = GS_KIND_NONE};
    return in;
}

/* Records the intents of the next INTENT_WINDOW operations from `first` and commits them (with
 * whatever completed so far), so that none of their requests can reach the server before the
 * index knows it may have: a process killed after sending is reconciled by the next one
 * (syncd/reconcile.h). A window keeps what a crash leaves to probe small in a large push. */
static int record_intents(struct run *run, const struct gs_plan *plan, size_t first,
                          struct gs_error *err)
{
    size_t end = plan->n_ops - first > INTENT_WINDOW ? first + INTENT_WINDOW : plan->n_ops;
    int rc = 0;
    for (size_t i = first; rc == 0 && i < end; i++) {
        struct gs_index_intent in = intent_of(&plan->ops[i]);
        rc = gs_index_intent_add(run->idx, &in, &run->intent[i], err);
    }
    if (rc == 0)
        rc = gs_index_commit(run->idx, err);
    if (rc == 0)
        rc = gs_index_begin(run->idx, err);
    run->intents_upto = end;
    run->last_commit_ms = gs_clock_mono_ms();
    return rc;
}

/* Drops the intents of operations that were never sent (a full disk stopped the puts, or the
 * transport failed first): nothing of theirs can be on the server. Those sent and unanswered keep
 * theirs, for the next process to reconcile. */
static void drop_unsent_intents(struct run *run, const struct gs_plan *plan)
{
    for (size_t i = 0; i < plan->n_ops; i++)
        if (run->state[i] == 0 && run->intent[i])
            gs_index_intent_drop(run->idx, run->intent[i], &run->index_err);
}

static void report_dry_run(const struct gs_plan *plan, const struct gs_push_opts *o)
{
    for (size_t i = 0; o->on_op && i < plan->n_ops; i++)
        o->on_op(o->ctx, &plan->ops[i], NULL);
}

/* Submits every operation; stops early on a transport error or a full disk (nothing more would
 * fit, and the rest stay planned for the next push). */
static int execute(const char *root, struct gs_plan *plan, struct run *run, struct gs_error *err)
{
    struct gs_buf local = GS_BUF_INIT;
    int rc = gs_index_begin(run->idx, err);
    run->last_commit_ms = gs_clock_mono_ms();
    for (size_t i = 0; rc == 0 && i < plan->n_ops; i++) {
        struct gs_plan_op *op = &plan->ops[i];
        if (run->out_of_space && op->type == GS_OP_PUT)
            continue;
        if (i >= run->intents_upto && (rc = record_intents(run, plan, i, err)) < 0)
            break;
        struct gs_fop_req req;
        make_request(root, op, &local, &req);
        if (run->state[i] != 2) /* a put whose file vanished is answered within submit */
            run->state[i] = 1;
        rc = run->ops->submit(run->ops, &req, err);
    }
    if (rc == 0)
        rc = run->ops->drain(run->ops, err);
    drop_unsent_intents(run, plan);
    int crc = gs_index_commit(run->idx, &run->index_err);
    gs_buf_release(&local);
    if (rc == 0 && crc < 0)
        rc = gs_error_set(err, crc, "%s", run->index_err.msg);
    return rc;
}

static void fill_plan_stats(struct gs_push_stats *st, const struct gs_plan *plan)
{
    st->ops_total = plan->n_ops;
    st->bytes_total = plan->bytes_to_send;
    st->hashed = plan->n_hashed;
    st->unchanged = plan->n_refreshed;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct gs_scan_entry *)a)->path, ((const struct gs_scan_entry *)b)->path);
}

/* Adds the directories above `path` (they are in scope for creating missing parents) unless the
 * scan already has them. */
static void add_ancestors(struct gs_scan *scan, const char *root, const char *path)
{
    struct gs_buf prefix = GS_BUF_INIT, abs = GS_BUF_INIT;
    for (const char *slash = strchr(path, '/'); slash; slash = strchr(slash + 1, '/')) {
        gs_buf_reset(&prefix);
        gs_buf_add(&prefix, path, (size_t)(slash - path));
        gs_buf_reset(&abs);
        gs_path_join(&abs, root, prefix.data);
        struct stat st;
        if (lstat(abs.data, &st) < 0 || !S_ISDIR(st.st_mode))
            break;
        GS_ALLOC_GROW(scan->entries, scan->n + 1, scan->cap);
        scan->entries[scan->n++] =
            (struct gs_scan_entry){.path = gs_xstrdup(prefix.data),
                                   .kind = GS_KIND_DIR,
                                   .mode = st.st_mode & 07777,
                                   .mtime_ns = gs_time_ns(st.st_mtim.tv_sec, st.st_mtim.tv_nsec),
                                   .ino = st.st_ino};
    }
    gs_buf_release(&prefix);
    gs_buf_release(&abs);
}

/* Sorts and drops duplicate paths (subtrees and ancestors may overlap). */
static void sort_unique(struct gs_scan *scan)
{
    if (scan->n > 1) /* qsort of a NULL array is undefined, even for 0 entries */
        qsort(scan->entries, scan->n, sizeof(*scan->entries), entry_cmp);
    size_t out = 0;
    for (size_t i = 0; i < scan->n; i++) {
        if (out && strcmp(scan->entries[out - 1].path, scan->entries[i].path) == 0) {
            free(scan->entries[i].path);
            free(scan->entries[i].link);
            continue;
        }
        scan->entries[out++] = scan->entries[i];
    }
    scan->n = out;
}

/* Scans only what a restricted push can touch: each path's subtree and its ancestors. A save in a
 * 100,000-file project then costs a few lstat calls, not a walk of the whole tree. */
static int scan_paths(struct gs_scan *scan, const char *root, struct gs_ignore *ig,
                      const struct gs_push_opts *o, struct gs_error *err)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < o->n_paths; i++) {
        if (!o->paths[i][0])
            return gs_scan_tree(scan, root, ig, err); /* the root: everything */
        rc = gs_scan_subtree(scan, root, o->paths[i], ig, err);
        add_ancestors(scan, root, o->paths[i]);
    }
    sort_unique(scan);
    return rc;
}

struct hold_ctx {
    const struct gs_push_opts *opts;
    char **held; /* the paths of the operations held so far */
    size_t n_held, cap_held;
    char **removed_dirs; /* the directories the plan deletes, sorted */
    size_t n_removed_dirs, cap_removed_dirs;
};

static int compare_paths(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Notes the directories the plan deletes: the operations inside them must be done first. */
static void note_removed_dirs(struct hold_ctx *h, const struct gs_plan *plan)
{
    for (size_t i = 0; i < plan->n_ops; i++) {
        const struct gs_plan_op *op = &plan->ops[i];
        if (op->type != GS_OP_DELETE || op->expect.kind != GS_EXPECT_DIR)
            continue;
        GS_ALLOC_GROW(h->removed_dirs, h->n_removed_dirs + 1, h->cap_removed_dirs);
        h->removed_dirs[h->n_removed_dirs++] = gs_xstrdup(op->path);
    }
    if (h->n_removed_dirs)
        qsort(h->removed_dirs, h->n_removed_dirs, sizeof(char *), compare_paths);
}

/* Whether a directory above `path` is deleted by the plan: it is, from the plan's scan, and it
 * would be refused as not empty while this path's operation waits. (The local tree is no guide:
 * the directory may have been made again since the scan.) */
static int inside_removed_dir(const struct hold_ctx *h, const char *path)
{
    char dir[4096];
    if (!h->n_removed_dirs)
        return 0;
    for (const char *slash = strchr(path, '/'); slash; slash = strchr(slash + 1, '/')) {
        size_t len = (size_t)(slash - path);
        if (len >= sizeof(dir))
            return 1; /* cannot tell: do not hold */
        memcpy(dir, path, len);
        dir[len] = '\0';
        const char *key = dir;
        if (bsearch(&key, h->removed_dirs, h->n_removed_dirs, sizeof(char *), compare_paths))
            return 1;
    }
    return 0;
}

/* The operations a caller may hold back are those no other operation of the plan waits for: a
 * put, a delete of a file or a rename of one, but not one that clears the way for a change of
 * kind (phase 0), nor one inside a directory the plan removes. */
static int holdable(const struct hold_ctx *h, const struct gs_plan_op *op)
{
    int kind = op->type == GS_OP_PUT || (op->type == GS_OP_RENAME && !op->subtree) ||
               (op->type == GS_OP_DELETE && op->expect.kind != GS_EXPECT_DIR);
    return kind && op->phase != 0 && !inside_removed_dir(h, op->path) &&
           (!op->from || !inside_removed_dir(h, op->from));
}

static int is_held_path(const struct hold_ctx *h, const char *path)
{
    for (size_t i = 0; path && i < h->n_held; i++)
        if (strcmp(h->held[i], path) == 0)
            return 1;
    return 0;
}

static void note_held(struct hold_ctx *h, const struct gs_plan_op *op)
{
    GS_ALLOC_GROW(h->held, h->n_held + 2, h->cap_held);
    h->held[h->n_held++] = gs_xstrdup(op->path); /* the op itself is released when it is dropped */
    if (op->from)
        h->held[h->n_held++] = gs_xstrdup(op->from);
}

static int holdable_held(void *ctx, const struct gs_plan_op *op)
{
    struct hold_ctx *h = ctx;
    if (!holdable(h, op) || !h->opts->hold(h->opts->ctx, op))
        return 0;
    note_held(h, op);
    return 1;
}

/* An operation on a path a held one also acts on waits with it: a chmod of the path a held rename
 * makes would find nothing there, and a put sent before the held rename away of its path would be
 * undone by it. Its own paths are held in turn. */
static int held_along(void *ctx, const struct gs_plan_op *op)
{
    struct hold_ctx *h = ctx;
    if (op->phase == 0 || (!is_held_path(h, op->path) && !is_held_path(h, op->from)))
        return 0;
    note_held(h, op);
    if (h->opts->held_along)
        h->opts->held_along(h->opts->ctx, op);
    return 1;
}

/* Leaves out what the caller holds back, and every operation that must wait with it. */
static void remove_held(struct gs_plan *plan, const struct gs_push_opts *opts)
{
    struct hold_ctx h = {.opts = opts};
    note_removed_dirs(&h, plan);
    gs_plan_remove_if(plan, holdable_held, &h);
    size_t before = 0;
    while (h.n_held > before) { /* a rename held along holds its other path too */
        before = h.n_held;
        gs_plan_remove_if(plan, held_along, &h);
    }
    for (size_t i = 0; i < h.n_held; i++)
        free(h.held[i]);
    free(h.held);
    for (size_t i = 0; i < h.n_removed_dirs; i++)
        free(h.removed_dirs[i]);
    free(h.removed_dirs);
}

/* The paths a restricted plan covers: those asked for, and the other names of their files. */
struct scope {
    const char **v;
    size_t n, cap;
    char **owned; /* the other names, freed with the scope */
    size_t n_owned, cap_owned;
};

static int add_other_name(void *ctx, const char *path)
{
    struct scope *s = ctx;
    GS_ALLOC_GROW(s->owned, s->n_owned + 1, s->cap_owned);
    s->owned[s->n_owned++] = gs_xstrdup(path);
    return 0;
}

/* A file with other hard links that changed through one name changed under the others too, but
 * the watcher reports only the name written: the other names the index knows (by the inode their
 * last sync read) join the scope of a restricted plan. One pass over the index, only when the
 * scan met such a file. */
static int add_other_links(struct gs_scan *scan, const char *root, struct gs_ignore *ig,
                           struct gs_index *idx, struct scope *s, struct gs_error *err)
{
    uint64_t *inos = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < scan->n; i++) {
        if (scan->entries[i].kind != GS_KIND_FILE || scan->entries[i].nlink < 2)
            continue;
        GS_ALLOC_GROW(inos, n + 1, cap);
        inos[n++] = scan->entries[i].ino;
    }
    int rc = n ? gs_index_files_with_inos(idx, inos, n, add_other_name, s, err) : 0;
    free(inos);
    for (size_t i = 0; rc == 0 && i < s->n_owned; i++) {
        rc = gs_scan_subtree(scan, root, s->owned[i], ig, err);
        add_ancestors(scan, root, s->owned[i]);
        GS_ALLOC_GROW(s->v, s->n + 1, s->cap);
        s->v[s->n++] = s->owned[i];
    }
    if (s->n_owned) /* scan_paths sorted what it scanned; only the additions need it again */
        sort_unique(scan);
    return rc;
}

static void scope_release(struct scope *s)
{
    for (size_t i = 0; i < s->n_owned; i++)
        free(s->owned[i]);
    free(s->owned);
    free(s->v);
}

static int plan_tree(const char *root, struct gs_ignore *ig, struct gs_index *idx,
                     const struct gs_push_opts *o, struct gs_plan *plan, struct gs_error *err)
{
    struct gs_scan scan = GS_SCAN_INIT;
    struct scope scope = {0};
    int rc = o->n_paths ? scan_paths(&scan, root, ig, o, err) : gs_scan_tree(&scan, root, ig, err);
    for (size_t i = 0; i < o->n_paths; i++) {
        GS_ALLOC_GROW(scope.v, scope.n + 1, scope.cap);
        scope.v[scope.n++] = o->paths[i];
    }
    if (rc == 0 && o->n_paths)
        rc = add_other_links(&scan, root, ig, idx, &scope, err);
    if (rc == 0 && o->on_scan)
        o->on_scan(o->ctx, &scan, !o->n_paths);
    struct gs_plan_opts popts = {.paths = scope.v,
                                 .n_paths = scope.n,
                                 .no_refresh = o->dry_run,
                                 .reading = o->on_reading,
                                 .reading_ctx = o->ctx};
    if (rc == 0)
        rc = gs_plan_build(plan, root, &scan, idx, &popts, err);
    gs_scan_release(&scan);
    scope_release(&scope);
    return rc;
}

int gs_push_plan(const char *root, struct gs_ignore *ig, struct gs_index *idx,
                 const struct gs_push_opts *opts, struct gs_plan *plan, struct gs_push_stats *st,
                 struct gs_error *err)
{
    memset(st, 0, sizeof(*st));
    st->start_ms = gs_clock_mono_ms();
    int rc = plan_tree(root, ig, idx, opts, plan, err);
    if (rc == 0 && opts->hold && !opts->dry_run)
        remove_held(plan, opts);
    if (rc == 0)
        fill_plan_stats(st, plan);
    return rc;
}

/* The files the plan could not read, each reported as a put that failed here (counted as failed
 * when `run`, a push, is given; a dry run only tells of them): what the server holds of them
 * stays, and the next push tries them again. */
static void report_unreadable(const struct gs_plan *plan, const struct gs_push_opts *opts,
                              struct run *run)
{
    for (size_t i = 0; i < plan->n_unreadable; i++) {
        const struct gs_plan_unreadable *u = &plan->unreadable[i];
        /* the size as scanned: the daemon takes another as a save since (gs_push_changed_locally)
         */
        struct gs_plan_op op = {.type = GS_OP_PUT, .path = u->path, .record.size = u->size};
        struct gs_fop_result r = {.message = u->why, .err_no = u->err_no, .local = 1};
        if (run) {
            run->st->ops_total++;
            note_failure(run, &op, &r);
        }
        if (opts->on_op)
            opts->on_op(opts->ctx, &op, &r);
    }
}

int gs_push_execute(const char *root, struct gs_index *idx, struct gs_fileops *ops,
                    const struct gs_push_opts *opts, struct gs_plan *plan, struct gs_push_stats *st,
                    struct gs_error *err)
{
    int rc = 0;
    if (opts->dry_run || !ops) {
        report_dry_run(plan, opts);
        report_unreadable(plan, opts, NULL); /* what the push would fail to send */
    } else {
        struct run run = {.idx = idx,
                          .opts = opts,
                          .st = st,
                          .ops = ops,
                          .state = gs_xcalloc(plan->n_ops + 1, 1),
                          .intent = gs_xcalloc(plan->n_ops + 1, sizeof(int64_t)),
                          .ops_base = plan->ops,
                          .bytes_base = ops->bytes_sent};
        report_unreadable(plan, opts, &run);
        ops->done = on_done;
        ops->done_ctx = &run;
        ops->progress = on_bytes;
        ops->progress_ctx = &run;
        rc = execute(root, plan, &run, err);
        ops->done = NULL;
        ops->progress = NULL;
        free(run.state);
        free(run.intent);
    }
    st->elapsed_ms = gs_clock_mono_ms() - st->start_ms;
    if (rc == 0 && st->failed)
        rc = gs_error_set(err, GS_E_REMOTE, "%zu of %zu operations failed; first: %s", st->failed,
                          st->ops_total, st->first_error);
    return rc;
}

int gs_push_run(const char *root, struct gs_ignore *ig, struct gs_index *idx,
                struct gs_fileops *ops, const struct gs_push_opts *opts, struct gs_push_stats *st,
                struct gs_error *err)
{
    struct gs_plan plan = GS_PLAN_INIT;
    int rc = gs_push_plan(root, ig, idx, opts, &plan, st, err);
    if (rc == 0)
        rc = gs_push_execute(root, idx, ops, opts, &plan, st, err);
    gs_plan_release(&plan);
    return rc;
}

void gs_push_stats_add(struct gs_push_stats *to, const struct gs_push_stats *from)
{
    to->ops_total += from->ops_total;
    to->ops_done += from->ops_done;
    to->sent += from->sent;
    to->deleted += from->deleted;
    to->renamed += from->renamed;
    to->mkdirs += from->mkdirs;
    to->symlinks += from->symlinks;
    to->chmods += from->chmods;
    to->conflicts += from->conflicts;
    to->failed += from->failed;
    to->bytes_total += from->bytes_total;
    to->bytes_sent += from->bytes_sent;
    to->bytes_out += from->bytes_out;
    if (!to->first_error[0])
        memcpy(to->first_error, from->first_error, sizeof(to->first_error));
}

struct gs_agent_delta *gs_push_prepare_deltas(const char *root, const struct gs_plan *plan,
                                              const char *sig_dir, size_t *n)
{
    struct gs_agent_delta *list = NULL;
    size_t cap = 0;
    uint64_t read = 0;
    struct gs_buf local = GS_BUF_INIT;
    *n = 0;
    for (size_t i = 0; i < plan->n_ops && read < GS_PUSH_PREPARE_MAX; i++) {
        const struct gs_plan_op *op = &plan->ops[i];
        if (op->type != GS_OP_PUT || op->expect.kind != GS_EXPECT_FILE)
            continue;
        gs_buf_reset(&local);
        gs_path_join(&local, root, op->path);
        GS_ALLOC_GROW(list, *n + 1, cap);
        if (gs_agent_prepare_delta(sig_dir, local.data, op->record.size, op->expect.hash.b,
                                   op->record.hash.b, &list[*n]) == 0) {
            read += op->record.size;
            (*n)++;
        }
    }
    gs_buf_release(&local);
    return list;
}
