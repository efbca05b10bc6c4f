/* syncd/relay.h: remote commands for control clients over warm spare connections.
 *
 * A command that connects by itself pays the SSH handshake and authentication first: about five
 * round trips (0.3 s at 50 ms RTT). While `gpusync watch` runs, the daemon keeps two spare
 * connections ready and runs a client's command on one ({"cmd":"exec"}, see control.h): a request
 * takes a spare and a background thread connects the next. A spare is a connection of its own,
 * used by one worker thread at a time: a libssh2 1.10 session shared between threads,
 * or between channels that write while another has a half-sent packet, is not safe.
 *
 * The control connection then carries the command's output as frames (control.h), until the
 * command ends or the client leaves (the channel is then closed: the remote command gets EOF). */
#ifndef GS_SYNCD_RELAY_H
#define GS_SYNCD_RELAY_H

#include "common/error.h"
#include "remote/ssh.h"

struct gs_relay;

/* Starts the spare-connection thread. `ssh` is borrowed and must outlive the relay and its
 * workers (the daemon's options: they live until the process exits). Returns 0 or GS_E_NOMEM. */
int gs_relay_start(struct gs_relay **out, const struct gs_ssh_opts *ssh, struct gs_error *err);

/* Commands that may run at once; the next is refused with a message until one ends. */
#define GS_RELAY_MAX_WORKERS 16

/* Runs `command` for the client on `fd` (taken: the relay closes it) in a worker thread, on the
 * spare connection if one is ready, else on a new one. */
void gs_relay_exec(struct gs_relay *r, int fd, const char *command);

/* The daemon's own connection to the server was lost or made again: the spares, connections to
 * the same server, may have died with it, or can be made now. Has the spare thread check each
 * idle spare with a round trip at once (not at its next periodic check; meanwhile none is
 * offered) and connect missing ones without waiting out its backoff. Returns at once. */
void gs_relay_recheck(struct gs_relay *r);

/* Whether a spare connection is ready now, and how many commands were relayed so far. */
void gs_relay_stats(struct gs_relay *r, int *spare_ready, long *relayed);

/* Stops the spare thread and frees the spares. Workers still running finish on their own. */
void gs_relay_stop(struct gs_relay *r);

#endif
