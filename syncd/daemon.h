/* syncd/daemon.h: `gpusync watch`: live sync of one project (design decision 12).
 *
 * One process per project (a lock). It first pushes whatever changed while no daemon ran, then
 * pushes each batch of changed paths the watcher reports, debounced (a save goes out almost at
 * once; a burst becomes one batch). It answers the control socket (status, flush, events, stop),
 * keeps the connection alive, notices a dead link within seconds, reconnects with capped
 * exponential backoff and jitter (at once after a laptop suspend), and then pushes what piled up.
 * Nothing is lost across disconnects or a crash: the index records only what the server holds. */
#ifndef GS_SYNCD_DAEMON_H
#define GS_SYNCD_DAEMON_H

#include <stdio.h>

#include "common/config.h"
#include "common/error.h"
#include "remote/ssh.h"

struct gs_daemon_opts {
    const char *root;            /* project root (absolute) */
    const struct gs_config *cfg; /* borrowed */
    struct gs_ssh_opts ssh;      /* how to connect (non-interactive in the background) */
    const char *remote_dir;      /* quoted shell word for the agent */
    int debounce_ms;             /* quiet time before a batch goes out (default 8) */
    int debounce_cap_ms;         /* longest a batch waits (default 100) */
    FILE *status_out;            /* a terminal for the live status line, or NULL */
    int ready_fd;                /* -1, or a pipe: one byte when serving (for watch -d) */
};

/* Takes the project's daemon lock. Returns a descriptor to keep open for the daemon's lifetime,
 * or GS_E_CONFLICT with a message naming the running daemon's pid. */
int gs_daemon_lock(const char *root, struct gs_error *err);

/* Runs until stopped (control "stop", SIGINT or SIGTERM). Returns 0 on a requested stop, or a
 * negative code for a failure that prevents watching at all (it never exits on a lost
 * connection: it reconnects). */
int gs_daemon_run(const struct gs_daemon_opts *opts, struct gs_error *err);

#endif
