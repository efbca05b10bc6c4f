/* cli/run_local.h: the local copy of a run's logs in the project, .gpusync/runs/<id>/: every byte
 * a follow received, written at its offset in rank<N>.log (so showing the logs twice does not
 * double them), and log-times, a journal of the order the bytes arrived in (the agent's format,
 * agent/logtimes.h, with the time of arrival here). When the server no longer has the run
 * (it was recreated), `logs RUN` shows this copy instead, in that order. */
#ifndef GS_RUN_LOCAL_H
#define GS_RUN_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/error.h"
#include "remote/runs.h"

/* Writes `len` bytes of rank's log, from byte `off`, into the local copy of run `id` under the
 * project `root`, and journals them when they were not there yet. A failure is warned about
 * (gs_warn) and otherwise ignored: the copy must never stop a follow. */
void gs_run_local_keep(const char *root, const char *id, int rank, uint64_t off, const char *data,
                       size_t len);

/* Records that run `id` was started with --name `name` (NULL or "": nothing), beside its local
 * copy, so that `logs NAME` finds the copy once the server has lost the run. */
void gs_run_local_keep_name(const char *root, const char *id, const char *name);

/* Appends the id of the newest run named `name` that the project holds a local copy of to `id`.
 * Returns 0, or GS_E_NOTFOUND. */
int gs_run_local_named(const char *root, const char *name, struct gs_buf *id);

/* 1 when `ranks` ("0,2"; NULL or "all": every rank) holds rank. */
int gs_run_ranks_has(const char *ranks, int rank);

/* 1 when `id` is a run id and the project holds a local copy of at least one of its rank logs. */
int gs_run_local_exists(const char *root, const char *id);

/* Appends the id of the newest run the project holds a local copy of to `id`. Returns 0, or
 * GS_E_NOTFOUND when it holds none. */
int gs_run_local_newest(const char *root, struct gs_buf *id);

/* Passes the local copy of run `id` to fn, the ranks in `ranks` ("0,2"; NULL or "all": every
 * one), in the order it arrived: as the journal says, then what it does not cover, rank by rank.
 * Returns 0, or GS_E_NOTFOUND (no copy) or GS_E_IO in err. */
int gs_run_local_replay(const char *root, const char *id, const char *ranks, gs_tail_fn fn,
                        void *ctx, struct gs_error *err);

#endif
