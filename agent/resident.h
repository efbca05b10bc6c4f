/* The resident listener (proto/sync.h, RESIDENT LISTENER): `gpusync-agent listen` keeps a UNIX
 * socket in ~/.gpusync/run (HOST-gpusync-agent-KEY.sock) and starts `serve` on each connection, so
 * that a session skips the server's login shell; `serve` starts the listener when a client asks for
 * it. */
#ifndef GA_RESIDENT_H
#define GA_RESIDENT_H

#include <stddef.h>

/* How long a listener nobody connects to lives on, and how often it looks at its socket. */
#define GA_RESIDENT_IDLE_S  (12 * 3600)
#define GA_RESIDENT_CHECK_S 5
/* How long a connection may take to send its OPEN before the listener closes it. */
#define GA_RESIDENT_OPEN_S 10
/* Room for a socket path (sockaddr_un's sun_path is 108 bytes on Linux). */
#define GA_RESIDENT_PATH_MAX 128

/* Writes the socket path of this agent build's listener to path (cap bytes) and starts the
 * listener, detached, if none runs. Returns 1 when one was running already, 0 when it started
 * one, or -1 when this server cannot have one (not an installed build named by its content, no
 * HOME, ~/.gpusync/run not a private directory of ours, a path too long for a socket, fork
 * failed): then path is "". Cheap when the listener
 * runs: one open and one flock. */
int ga_resident_offer(char *path, size_t cap);

/* `gpusync-agent listen --socket PATH`: the listener itself. Returns the exit status (0 when
 * another listener already holds PATH, or when it ends idle or replaced). */
int ga_resident_main(int argc, char **argv);

#endif
