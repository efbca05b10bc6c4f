/* syncd/push.h: one sync of the local tree to the server: scan, plan, execute through a
 * transport (remote/fileops.h), recording each completed operation in the index as its reply
 * arrives. Killed at any instant, the next push resumes without losing or repeating an edit:
 * what completed is in the index (committed every 50 ms); every request's intent was committed
 * before it left, so one answered too late, or never, is settled by syncd/reconcile.h before
 * the next plan; and what did not happen is planned again. */
#ifndef GS_SYNCD_PUSH_H
#define GS_SYNCD_PUSH_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "remote/agent_client.h"
#include "remote/fileops.h"
#include "syncd/ignore.h"
#include "syncd/index.h"
#include "syncd/plan.h"

struct gs_push_stats {
    size_t ops_total, ops_done;
    size_t sent, deleted, renamed, mkdirs, symlinks, chmods;
    size_t conflicts, failed;
    size_t unchanged; /* touched files with the same content: nothing sent */
    size_t hashed;
    uint64_t bytes_total, bytes_sent; /* bytes_sent: of the files the server has confirmed */
    uint64_t bytes_out; /* sent on by the transport so far, files in flight included: moves
                         * while one large file goes */
    int64_t start_ms;   /* when planning began (gs_clock_mono_ms) */
    int64_t elapsed_ms; /* from then until the last reply */
    char first_error[512];
};

/* Adds the counts of `from` (a later pass or batch) to `to`; `unchanged` and the times are left
 * to the caller, as a later pass looks at part of the tree only. */
void gs_push_stats_add(struct gs_push_stats *to, const struct gs_push_stats *from);

/* Called for each operation: when it completes (`r` set) or, in a dry run, as planned (`r` NULL).
 */
typedef void (*gs_push_op_fn)(void *ctx, const struct gs_plan_op *op,
                              const struct gs_fop_result *r);
/* Called after each completion with the running totals. */
typedef void (*gs_push_progress_fn)(void *ctx, const struct gs_push_stats *st);

struct gs_push_opts {
    const char *const *paths; /* restrict to these (relative) paths; NULL: the whole tree */
    size_t n_paths;
    int dry_run; /* plan and report, change nothing (not even the index's cache) */
    gs_push_op_fn on_op;
    gs_push_progress_fn on_progress;
    /* Called for each planned put, file delete and rename before anything is sent; 1 leaves it
     * out of this push (the watch daemon holds back a file in the middle of a save and sends it
     * later). NULL: nothing is held. */
    int (*hold)(void *ctx, const struct gs_plan_op *op);
    /* Called for each operation left out with a held one because it acts on one of its paths (a
     * chmod of the path a held rename makes): the caller must send its paths later as well. */
    void (*held_along)(void *ctx, const struct gs_plan_op *op);
    /* Told how far the plan has read the changed files (every few files, and about every 4 MB
     * of a large one): nonzero ends the push with GS_E_INTERRUPTED before anything is sent. */
    gs_plan_reading_fn on_reading;
    /* Told of each scan before it is planned; `whole`: of the whole tree (no paths). The watch
     * daemon learns there which files have other hard links (linked.h). NULL: not told. */
    void (*on_scan)(void *ctx, const struct gs_scan *scan, int whole);
    void *ctx;
};

/* 1 when `r` answers an operation whose path the server no longer had where the index said: a
 * RENAME whose source is gone (renamed by an earlier session whose reply was lost, or edited there
 * and kept aside as `r->kept`), a CHMOD of a file removed there, or a stamping CHMOD (a touch)
 * refused with ESTALE because the file was edited there. The executor then drops that path from
 * the index (for the ESTALE, only the content it names); a caller plans `op->path` (and a
 * rename's `op->from`) again, which sends the file afresh (keeping an edited copy aside). */
int gs_push_lost(const struct gs_plan_op *op, const struct gs_fop_result *r);

/* 1 when the local file of the PUT `op`, planned from the tree at `root`, no longer holds the
 * planned bytes: it was written, replaced or removed while it was being sent. A put refused then
 * is no error: the file's new version is a change of its own, sent by the next sync. */
int gs_push_changed_locally(const char *root, const struct gs_plan_op *op);

/* Makes the server match the tree at `root`. `ops` may be NULL for a dry run. Fills `st` (also on
 * failure). Returns 0 when every operation succeeded (conflicts are successes: the server's copy
 * was kept); GS_E_REMOTE when some failed (st->first_error says which; the rest were done);
 * GS_E_IO for a local failure; a transport error (GS_E_DISCONNECTED, ...) when the connection
 * broke: everything completed before that is recorded. */
int gs_push_run(const char *root, struct gs_ignore *ig, struct gs_index *idx,
                struct gs_fileops *ops, const struct gs_push_opts *opts, struct gs_push_stats *st,
                struct gs_error *err);

/* The two halves of gs_push_run, for a caller that plans while it connects. gs_push_plan scans
 * and plans (touching only local files and the index) and zeroes then fills `st`; gs_push_execute
 * runs `plan` (which the caller releases) and completes `st`. Same returns as gs_push_run. */
int gs_push_plan(const char *root, struct gs_ignore *ig, struct gs_index *idx,
                 const struct gs_push_opts *opts, struct gs_plan *plan, struct gs_push_stats *st,
                 struct gs_error *err);
int gs_push_execute(const char *root, struct gs_index *idx, struct gs_fileops *ops,
                    const struct gs_push_opts *opts, struct gs_plan *plan, struct gs_push_stats *st,
                    struct gs_error *err);

/* Makes ahead the deltas of the plan's puts whose server copy has a signature kept in sig_dir
 * (remote/agent_client.h, gs_agent_prepare_delta), for a caller that plans while it connects:
 * that work then overlaps the connection instead of following it. Stops once the files read
 * pass GS_PUSH_PREPARE_MAX bytes. Returns the deltas (malloc'd; NULL when none) and their count
 * in *n, for gs_agent_take_deltas. */
#define GS_PUSH_PREPARE_MAX (256ull << 20)
struct gs_agent_delta *gs_push_prepare_deltas(const char *root, const struct gs_plan *plan,
                                              const char *sig_dir, size_t *n);

#endif
