/* proto/zframes.h: packing queued protocol frames into one zstd-compressed ZFRAMES frame and back
 * (proto/sync.h, COMPRESSION), shared by the client and the agent. Built with GS_ZSTD (and
 * libzstd) it compresses; without it gs_zframes_new returns NULL and the protocol stays plain,
 * so an agent built on a server without libzstd still works.
 *
 * Policy: a batch of frames is compressed at zstd level 1 (about 400 MB/s a core, so even a
 * 1 Gbit/s link is not slowed by it) and sent compressed only when that saves at least a tenth
 * of it; otherwise the frames go as they are, and the next GS_ZFRAMES_SKIP bytes are not even
 * tried, so a stream of incompressible data (checkpoints, archives, .npy) pays for one try in
 * eight MiB. Small batches (< GS_ZFRAMES_MIN bytes) are never worth the try. */
#ifndef GS_PROTO_ZFRAMES_H
#define GS_PROTO_ZFRAMES_H

#include "proto/sync.h"

#define GS_ZFRAMES_MIN  512u
#define GS_ZFRAMES_SKIP (8u << 20)

struct gs_zframes;

/* A compressor/decompressor pair with its adaptive state, or NULL (built without zstd, or out
 * of memory). level: zstd's, 1 to 19. */
struct gs_zframes *gs_zframes_new(int level);
void gs_zframes_free(struct gs_zframes *z);

/* Moves whole frames from the start of in[0..n) (at most GS_PROTO_ZRAW_MAX bytes of them, and at
 * least one frame) to the end of `out`: as one frame of `type` (GS_MSG_ZFRAMES or
 * GS_MSG_ZFRAMES_R) when compressing saves enough, else unchanged. in[0..n) must hold whole
 * frames. Returns the number of bytes of `in` moved, or -1 when out of memory. */
long gs_zframes_pack(struct gs_zframes *z, uint8_t type, const uint8_t *in, size_t n,
                     struct gs_proto_buf *out);

/* Decompresses a decoded ZFRAMES/ZFRAMES_R message into `raw` (its previous bytes dropped).
 * Returns 0, or -1 when it is malformed: a raw size over GS_PROTO_ZRAW_MAX, not a zstd frame, or
 * not exactly that many bytes. */
int gs_zframes_unpack(struct gs_zframes *z, const struct gs_proto_msg *m, struct gs_proto_buf *raw);

/* Bytes given to gs_zframes_pack, and bytes it put out: how much compression saved. */
void gs_zframes_stats(const struct gs_zframes *z, unsigned long long *plain,
                      unsigned long long *wire);

#endif
