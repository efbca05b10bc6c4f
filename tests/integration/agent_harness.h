/* Test harness for the agent: spawns the built `gpusync-agent serve` over pipes, sends frames
 * and reads replies with the shared codec (proto/sync.h). Test code only. */
#ifndef GS_AGENT_HARNESS_H
#define GS_AGENT_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/sync.h"

struct agent_h {
    pid_t pid;
    int to_agent, from_agent; /* pipe ends: the agent's stdin and stdout */
    struct gs_proto_buf tx, rx;
    size_t rx_used; /* bytes of rx taken by the last frame returned */
    uint32_t next_id;
};

/* Path of the built agent from GS_BUILD_DIR, or NULL if unset. Static storage. */
const char *agent_h_binary(void);

/* Starts `gpusync-agent serve --root root [extra]` (extra may be NULL). Returns 0 or -1. */
int agent_h_start(struct agent_h *a, const char *root, const char *extra);

/* Starts the agent and completes the handshake; the agent's root path is copied to root_out
 * (if not NULL, size cap). Returns 0 or -1. */
int agent_h_open(struct agent_h *a, const char *root, char *root_out, size_t cap);

/* Queues a message (its id is taken from m unless m->id is 0: then the next id is used and
 * returned). Returns the id used. */
uint32_t agent_h_queue(struct agent_h *a, struct gs_proto_msg *m);

/* Queues raw bytes. */
void agent_h_queue_raw(struct agent_h *a, const void *p, size_t n);

/* Writes everything queued, reading replies meanwhile so neither side can block the other.
 * Returns 0, or -1 if the agent stopped reading. */
int agent_h_flush(struct agent_h *a);

/* Flushes, then waits for the next reply frame and decodes it into *m (borrowed until the next
 * call). Returns 0, -1 at end of output or on a malformed frame. */
int agent_h_recv(struct agent_h *a, struct gs_proto_msg *m);

/* Sends m, flushes and receives one reply. Returns what agent_h_recv returns. */
int agent_h_call(struct agent_h *a, struct gs_proto_msg *m, struct gs_proto_msg *reply);

/* Closes the agent's stdin and waits for it; returns its exit status, or 128+signal. */
int agent_h_close(struct agent_h *a);

/* Hash helper: XXH3-128 canonical bytes of p[0..n). */
void agent_h_hash(const void *p, size_t n, uint8_t out[GS_PROTO_HASH_LEN]);

#endif
