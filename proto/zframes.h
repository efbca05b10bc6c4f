/* proto/zframes.h: packing queued protocol frames into one zstd-compressed ZFRAMES frame and back
 * (proto/sync.h, COMPRESSION), shared by the client and the agent. Built with GS_ZSTD (and
 * libzstd) it compresses; without it gs_zframes_new returns NULL and the protocol stays plain,
 * so an agent built on a server without libzstd still works.
 *
 * Policy: each side keeps one zstd stream for the session, and each batch of queued frames (up
 * to GS_ZFRAMES_TAKE bytes) goes as the next flushed blocks of it, so even a small batch is
 * compressed against everything sent before (as rsync -z's one zlib stream is; measured on
 * Python's standard library at 50 Mbit/s, independent batches reached 2.4x where the stream
 * reaches about 4x). Level 1 by default: about 400 MB/s a core, so a LAN is not slowed by it.
 * A batch that did not shrink by a tenth still goes compressed (zstd stores it raw: a few bytes
 * more; the stream cannot skip bytes it took in), and then the next GS_ZFRAMES_SKIP bytes go
 * plain without a try, so incompressible data (checkpoints, archives, .npy) pays for one try in
 * eight MiB. Batches under GS_ZFRAMES_MIN bytes go plain. Because the stream carries history,
 * the receiver must unpack every ZFRAMES of the session, in order. */
#ifndef GS_PROTO_ZFRAMES_H
#define GS_PROTO_ZFRAMES_H

#include "proto/sync.h"

#define GS_ZFRAMES_MIN  512u
#define GS_ZFRAMES_SKIP (8u << 20)
#define GS_ZFRAMES_TAKE (2u << 20) /* compressed, it still fits one frame whatever the data */

struct gs_zframes;

/* A compressor/decompressor pair with its adaptive state, or NULL (built without zstd, or out
 * of memory). level: zstd's, 1 to 19. */
struct gs_zframes *gs_zframes_new(int level);
void gs_zframes_free(struct gs_zframes *z);

/* Moves whole frames from the start of in[0..n) (at most GS_ZFRAMES_TAKE bytes of them, and at
 * least one frame) to the end of `out`: as one frame of `type` (GS_MSG_ZFRAMES or
 * GS_MSG_ZFRAMES_R), or unchanged (see the policy above). in[0..n) must hold whole frames.
 * Returns the number of bytes of `in` moved, or -1 when out of memory or zstd failed: the
 * stream is then out of step with the peer's, and the session must end. */
long gs_zframes_pack(struct gs_zframes *z, uint8_t type, const uint8_t *in, size_t n,
                     struct gs_proto_buf *out);

/* Decompresses a decoded ZFRAMES/ZFRAMES_R message into `raw` (its previous bytes dropped).
 * Returns 0, or -1 when it is malformed: a raw size over GS_PROTO_ZRAW_MAX, not a zstd frame, or
 * not exactly that many bytes. */
int gs_zframes_unpack(struct gs_zframes *z, const struct gs_proto_msg *m, struct gs_proto_buf *raw);

/* The length of the whole frames at the start of in[0..n) that fit within `max` bytes (the first
 * frame counts whatever its size; n when in[0..n) does not start with a whole frame). */
size_t gs_zframes_whole(const uint8_t *in, size_t n, size_t max);

/* 1 if in[0..n) would shrink by a tenth or more at level 1: a trial on a context of its own, the
 * session's stream untouched (for a sender deciding whether to wait for the peer's agreement). */
int gs_zframes_compressible(struct gs_zframes *z, const uint8_t *in, size_t n);

/* Changes the sender's level from the next batch on (NULL: nothing). The batch after the call
 * ends the current zstd frame, and the next frame starts at the new level: the receiver reads on
 * without being told, but the history is lost once, so a sender changes it rarely (a client that
 * finds the link slow: remote/agent_client.c). gs_zframes_level says the level asked for (0 for
 * NULL). */
void gs_zframes_set_level(struct gs_zframes *z, int level);
int gs_zframes_level(const struct gs_zframes *z);

/* Bytes given to gs_zframes_pack, and bytes it put out: how much compression saved. */
void gs_zframes_stats(const struct gs_zframes *z, unsigned long long *plain,
                      unsigned long long *wire);

#endif
