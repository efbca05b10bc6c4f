/* common/proc.h: running a local helper program (such as `ssh -G`) and capturing its output. */
#ifndef GS_PROC_H
#define GS_PROC_H

#include "common/buf.h"
#include "common/error.h"

/* Runs argv[0] (searched in PATH) with stdin from /dev/null, appends its stdout to `out` and
 * discards stderr. Returns the exit status (0-255), 128+N for signal N, or GS_E_NOTFOUND when the
 * program does not exist, GS_E_IO when it could not be started. */
int gs_proc_capture(char *const argv[], struct gs_buf *out, struct gs_error *err);

/* Returns 1 if `name` is an executable found in PATH. */
int gs_proc_in_path(const char *name);

#endif
