/* wansim_harness: starts the WAN simulator (tests/tools/wansim) as a child process for tests and
 * benchmarks, sends it control commands and stops it.
 *
 * Typical use:
 *     struct wansim_proc w;
 *     struct wansim_opts o = {.target_port = echo_port, .delay_ms = 25};
 *     if (wansim_start(&w, &o, err, sizeof(err)) < 0) fail(err);
 *     connect to 127.0.0.1:w.port ...; wansim_command(&w, "stall", reply, sizeof(reply));
 *     wansim_stop(&w);
 * The harness never prints and never exits; errors come back as -1 with a message in `err`. */
#ifndef WANSIM_HARNESS_H
#define WANSIM_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

struct wansim_opts {
    const char *binary;      /* path to wansim; NULL: $GS_BUILD_DIR/tests/tools/wansim */
    const char *target_host; /* NULL: 127.0.0.1 */
    int target_port;
    double delay_ms;  /* one-way, each direction */
    double rate_mbit; /* per direction; 0 = unlimited */
};

/* A running wansim. Fields are read-only for callers. */
struct wansim_proc {
    pid_t pid;          /* 0 once stopped */
    int port;           /* where it listens, on 127.0.0.1 */
    char dir[64];       /* private temporary folder holding the control socket */
    char ctl_path[108]; /* its control socket */
};

/* Resolves the wansim binary: `explicit_path` if not NULL, else $GS_BUILD_DIR/tests/tools/wansim.
 * Returns 0 and writes the path into `out`, or -1 with a message in `err` (file missing, variable
 * unset). */
int wansim_binary(const char *explicit_path, char *out, size_t outlen, char *err, size_t errlen);

/* Starts wansim listening on 127.0.0.1:<free port> with a control socket in a new temporary
 * folder, and waits (up to 5 s) for its "port N" line. On success returns 0 and fills `w`; the
 * caller owns the process and must call wansim_stop. On error returns -1, writes a message into
 * `err`, and leaves no process or folder behind. */
int wansim_start(struct wansim_proc *w, const struct wansim_opts *opts, char *err, size_t errlen);

/* Sends one control command (e.g. "delay 10", "stall") and reads its one-line answer into `reply`
 * (without the newline; may be NULL). Returns 0 when the answer starts with "ok", -1 when it is an
 * error answer or the socket could not be reached within 5 s (then `reply` says why). */
int wansim_command(struct wansim_proc *w, const char *cmd, char *reply, size_t replylen);

/* Stops the process with SIGTERM (SIGKILL after 5 s), waits for it, and removes its folder.
 * Returns its exit status (0 for a clean stop), or -1 if it died by a signal or was not running.
 * Safe to call twice. */
int wansim_stop(struct wansim_proc *w);

#endif
