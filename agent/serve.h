/* The agent's `serve` session: executes protocol requests (proto/sync.h) against a root directory,
 * in arrival order, and buffers the replies. The frame loop over file descriptors
 * (ga_serve_run) and the in-memory entry point used by the fuzzer (ga_serve_feed) share it. */
#ifndef GA_SERVE_H
#define GA_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "fence.h"
#include "proto/sync.h"
#include "proto/zframes.h"

#define GA_AGENT_VERSION "0.1.0"

/* Writes n bytes of replies somewhere; returns 0, or -1 if they cannot be delivered (the
 * session then ends). */
typedef int (*ga_serve_write_fn)(void *ctx, const uint8_t *p, size_t n);

struct ga_serve_stream; /* an open put stream (serve.c) */
struct ga_check_set;    /* the entries CHECK keeps (serve_check.c) */
struct ga_dirwatch;     /* the kept entries' folders, watched (dirwatch.h) */

struct ga_serve {
    int rootfd;
    char *root; /* absolute path of the root, owned */
    int fsync;  /* fsync files and directories before replying */
    int greeted;
    int fatal; /* set once the session must end (protocol error or undeliverable output) */
    struct gs_proto_buf out;
    ga_serve_write_fn write;
    void *write_ctx;
    struct ga_serve_stream *streams; /* GS_PROTO_MAX_STREAMS slots, owned */
    int writer;                      /* take the root's writer lock in the handshake (fence.h) */
    struct ga_fence fence;           /* that lock, held from HELLO_OK to ga_serve_release */
    int clean_end;                   /* ga_serve_run ended at end of input, no error */
    struct gs_zframes *z;            /* set once both sides said GS_HELLO_ZSTD (zframes.h) */
    int delta;                       /* both sides said GS_HELLO_DELTA: PUT_DELTA accepted */
    struct gs_proto_buf zin, zout;   /* a ZFRAMES's frames; replies packed for the wire */
    struct ga_check_set *kept;       /* CHECK's entries kept for the session (GS_CHECK_KEEP) */
    struct ga_dirwatch *dirwatch;    /* what changed in the kept entries' folders (dirwatch.h) */
};

/* Opens the root (creating it with mkdir -p if create is set) and prepares a session writing
 * through write(ctx, ...). Returns 0, or a negative errno with *s released and an explanation
 * in err (errlen bytes). */
int ga_serve_init(struct ga_serve *s, const char *root, int create, ga_serve_write_fn write,
                  void *ctx, char *err, size_t errlen);

/* Removes the temporary files of streams still open, releases the writer lock (marking a clean end
 * when ga_serve_run saw one, so the next session does not sweep) and frees everything. */
void ga_serve_release(struct ga_serve *s);

/* Executes one frame. The first must be a HELLO; with s->writer set, the session takes the root's
 * writer lock before answering it (fencing out a previous session, fence.h); a lock held by
 * something it may not kill is an ERROR EBUSY reply that ends the session. Returns 0 to go on, -1
 * when the session must end (s->fatal set). */
int ga_serve_frame(struct ga_serve *s, const struct gs_proto_frame *f);

/* Executes the complete frames at the start of p[0..n) and returns the number of bytes used
 * (a partial frame at the end is left). Returns -1 when the session must end (fatal frame,
 * failed write). */
long ga_serve_feed(struct ga_serve *s, const uint8_t *p, size_t n);

/* Writes the buffered replies. Returns 0 or -1. */
int ga_serve_flush(struct ga_serve *s);

/* Serves requests from infd, replying through s->write, until end of input. Flushes the replies
 * whenever no more input is ready, so a lone request is answered at once and a burst is
 * batched. Returns the process exit status: 0 at a clean end of input, 2 after a protocol
 * error (bad handshake, oversized or truncated frame), 1 after an I/O error, 3 once the root's
 * folder was removed on the server (the client connects again to make it anew); the reason is
 * written to stderr. */
int ga_serve_run(struct ga_serve *s, int infd);

#endif
