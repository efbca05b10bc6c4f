/* proto/zframes.c: ZFRAMES packing with libzstd (see zframes.h). C99. */
#include "proto/zframes.h"

#include <stdlib.h>
#include <string.h>

size_t gs_zframes_whole(const uint8_t *in, size_t n, size_t max)
{
    size_t at = 0;
    while (n - at >= 4) {
        size_t len = 4 + ((size_t)in[at] << 24 | (size_t)in[at + 1] << 16 |
                          (size_t)in[at + 2] << 8 | (size_t)in[at + 3]);
        if (len > n - at || (at > 0 && at + len > max))
            break;
        at += len;
    }
    return at ? at : n;
}

#ifdef GS_ZSTD
#include <zstd.h>

struct gs_zframes {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    ZSTD_CCtx *trial; /* gs_zframes_compressible's, apart from the session's stream */
    void *scratch;
    size_t scratch_cap;
    int level;
    int next_level; /* gs_zframes_set_level's: applied once the current zstd frame is ended */
    size_t skip;    /* bytes still to send without trying: the last try did not pay */
    unsigned long long plain, wire;
};

struct gs_zframes *gs_zframes_new(int level)
{
    struct gs_zframes *z = calloc(1, sizeof(*z));
    if (!z)
        return NULL;
    z->cctx = ZSTD_createCCtx();
    z->dctx = ZSTD_createDCtx();
    z->level = z->next_level = level;
    if (!z->cctx || !z->dctx ||
        ZSTD_isError(ZSTD_CCtx_setParameter(z->cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_DCtx_setParameter(z->dctx, ZSTD_d_windowLogMax, 23))) {
        gs_zframes_free(z);
        return NULL;
    }
    return z;
}

void gs_zframes_free(struct gs_zframes *z)
{
    if (!z)
        return;
    ZSTD_freeCCtx(z->cctx);
    ZSTD_freeDCtx(z->dctx);
    ZSTD_freeCCtx(z->trial);
    free(z->scratch);
    free(z);
}

/* Appends in[0..n) to out as it is. */
static long plain(struct gs_zframes *z, const uint8_t *in, size_t n, struct gs_proto_buf *out)
{
    if (gs_proto_buf_reserve(out, n) < 0)
        return -1;
    memcpy(out->data + out->len, in, n);
    out->len += n;
    z->plain += n;
    z->wire += n;
    return (long)n;
}

/* Compresses in[0..n) as the next flushed blocks of the session's one zstd stream into `out`,
 * after room for the frame header. A level change ends the zstd frame with this batch (one
 * thread's zstd takes a new level only between frames; the receiver's stream reads the next
 * frame on), which costs the history once. Returns the compressed length, or -1. */
static long stream_compress(struct gs_zframes *z, const uint8_t *in, size_t n,
                            struct gs_proto_buf *out, size_t at)
{
    ZSTD_EndDirective how = z->next_level != z->level ? ZSTD_e_end : ZSTD_e_flush;
    ZSTD_inBuffer src = {in, n, 0};
    size_t room = ZSTD_compressBound(n) + 64, produced = 0;
    for (;;) {
        if (gs_proto_buf_reserve(out, at - out->len + produced + room) < 0)
            return -1;
        ZSTD_outBuffer dst = {out->data + at + produced, room, 0};
        size_t left = ZSTD_compressStream2(z->cctx, &dst, &src, how);
        if (ZSTD_isError(left))
            return -1;
        produced += dst.pos;
        if (left == 0 && src.pos == n && how == ZSTD_e_end &&
            ZSTD_isError(ZSTD_CCtx_setParameter(z->cctx, ZSTD_c_compressionLevel, z->next_level)))
            return -1;
        if (left == 0 && src.pos == n) {
            z->level = z->next_level;
            return (long)produced;
        }
        room = left + 64; /* more to flush: grow and go on */
    }
}

long gs_zframes_pack(struct gs_zframes *z, uint8_t type, const uint8_t *in, size_t n,
                     struct gs_proto_buf *out)
{
    size_t take = gs_zframes_whole(in, n, GS_ZFRAMES_TAKE);
    if (take < GS_ZFRAMES_MIN || take > GS_ZFRAMES_TAKE || z->skip > 0) {
        z->skip = z->skip > take ? z->skip - take : 0;
        return plain(z, in, take, out);
    }
    /* One stream for the whole session: each batch is a flushed block of it, so small batches
     * (a save, a burst of small files) compress against everything sent before, as rsync -z's
     * single zlib stream does. Once in the stream, the bytes must go: a batch that did not
     * shrink is sent anyway (zstd stores it raw, a few bytes more) and trying pauses. */
    size_t mark = out->len, body = mark + GS_PROTO_HDR + 4;
    long c = stream_compress(z, in, take, out, body);
    if (c < 0 || (size_t)c + 4 > GS_PROTO_MAX_PAYLOAD)
        return -1; /* the stream is now out of step with the peer's: the session must end */
    if ((size_t)c > take - take / 10)
        z->skip = GS_ZFRAMES_SKIP;
    out->len = mark;
    gs_proto_encode_header(out, type, 0, (uint32_t)(4 + c)); /* room was reserved */
    uint8_t *raw = out->data + out->len;
    raw[0] = (uint8_t)(take >> 24), raw[1] = (uint8_t)(take >> 16);
    raw[2] = (uint8_t)(take >> 8), raw[3] = (uint8_t)take;
    out->len += 4 + (size_t)c;
    z->plain += take;
    z->wire += GS_PROTO_HDR + 4 + (size_t)c;
    return (long)take;
}

void gs_zframes_set_level(struct gs_zframes *z, int level)
{
    if (z)
        z->next_level = level;
}

int gs_zframes_level(const struct gs_zframes *z)
{
    return z ? z->next_level : 0;
}

int gs_zframes_unpack(struct gs_zframes *z, const struct gs_proto_msg *m, struct gs_proto_buf *raw)
{
    raw->len = 0;
    if (m->size > GS_PROTO_ZRAW_MAX || gs_proto_buf_reserve(raw, (size_t)m->size) < 0)
        return -1;
    ZSTD_inBuffer src = {m->data.p, m->data.len, 0};
    ZSTD_outBuffer dst = {raw->data, (size_t)m->size, 0};
    while (src.pos < src.size) {
        size_t before = dst.pos, used = src.pos;
        size_t r = ZSTD_decompressStream(z->dctx, &dst, &src);
        if (ZSTD_isError(r) || (dst.pos == before && src.pos == used))
            return -1; /* not zstd, or more output than raw_size says */
    }
    if (dst.pos != m->size)
        return -1;
    raw->len = dst.pos;
    return 0;
}

int gs_zframes_compressible(struct gs_zframes *z, const uint8_t *in, size_t n)
{
    size_t bound = ZSTD_compressBound(n);
    if (!z->trial && !(z->trial = ZSTD_createCCtx()))
        return 0;
    if (z->scratch_cap < bound) {
        void *p = realloc(z->scratch, bound);
        if (!p)
            return 0;
        z->scratch = p, z->scratch_cap = bound;
    }
    size_t c = ZSTD_compressCCtx(z->trial, z->scratch, bound, in, n, 1);
    return !ZSTD_isError(c) && c <= n - n / 10;
}

void gs_zframes_stats(const struct gs_zframes *z, unsigned long long *plain_bytes,
                      unsigned long long *wire)
{
    *plain_bytes = z ? z->plain : 0;
    *wire = z ? z->wire : 0;
}

#else /* built without libzstd: no compression, and the protocol never offers it */

struct gs_zframes *gs_zframes_new(int level)
{
    (void)level;
    return NULL;
}

void gs_zframes_free(struct gs_zframes *z)
{
    (void)z;
}

long gs_zframes_pack(struct gs_zframes *z, uint8_t type, const uint8_t *in, size_t n,
                     struct gs_proto_buf *out)
{
    (void)z, (void)type, (void)in, (void)n, (void)out;
    return -1;
}

int gs_zframes_unpack(struct gs_zframes *z, const struct gs_proto_msg *m, struct gs_proto_buf *raw)
{
    (void)z, (void)m, (void)raw;
    return -1;
}

int gs_zframes_compressible(struct gs_zframes *z, const uint8_t *in, size_t n)
{
    (void)z, (void)in, (void)n;
    return 0;
}

void gs_zframes_stats(const struct gs_zframes *z, unsigned long long *plain,
                      unsigned long long *wire)
{
    (void)z;
    *plain = *wire = 0;
}

void gs_zframes_set_level(struct gs_zframes *z, int level)
{
    (void)z, (void)level;
}

int gs_zframes_level(const struct gs_zframes *z)
{
    (void)z;
    return 0;
}

#endif
