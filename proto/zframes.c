/* proto/zframes.c: ZFRAMES packing with libzstd (see zframes.h). C99. */
#include "proto/zframes.h"

#include <stdlib.h>
#include <string.h>

#ifdef GS_ZSTD
#include <zstd.h>

struct gs_zframes {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    int level;
    size_t skip; /* bytes still to send without trying: the last try did not pay */
    unsigned long long plain, wire;
};

struct gs_zframes *gs_zframes_new(int level)
{
    struct gs_zframes *z = calloc(1, sizeof(*z));
    if (!z)
        return NULL;
    z->cctx = ZSTD_createCCtx();
    z->dctx = ZSTD_createDCtx();
    z->level = level;
    if (!z->cctx || !z->dctx) {
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
    free(z);
}

/* The length of the whole frames at the start of in[0..n) that fit within `max` bytes (the
 * first frame always counts, whatever its size). */
static size_t whole_frames(const uint8_t *in, size_t n, size_t max)
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

long gs_zframes_pack(struct gs_zframes *z, uint8_t type, const uint8_t *in, size_t n,
                     struct gs_proto_buf *out)
{
    size_t take = whole_frames(in, n, GS_PROTO_ZRAW_MAX);
    if (take < GS_ZFRAMES_MIN || take > GS_PROTO_ZRAW_MAX || z->skip > 0) {
        z->skip = z->skip > take ? z->skip - take : 0;
        return plain(z, in, take, out);
    }
    size_t bound = ZSTD_compressBound(take), mark = out->len;
    if (gs_proto_buf_reserve(out, GS_PROTO_HDR + 4 + bound) < 0)
        return -1;
    uint8_t *body = out->data + mark + GS_PROTO_HDR + 4;
    size_t c = ZSTD_compressCCtx(z->cctx, body, bound, in, take, z->level);
    if (ZSTD_isError(c) || c + GS_PROTO_HDR + 4 > take - take / 10) {
        z->skip = GS_ZFRAMES_SKIP;
        return plain(z, in, take, out);
    }
    /* the header is written after the body it describes: encode it in place */
    out->len = mark;
    if (gs_proto_encode_header(out, type, 0, (uint32_t)(4 + c)) < 0)
        return -1;
    uint8_t *raw = out->data + out->len;
    raw[0] = (uint8_t)(take >> 24), raw[1] = (uint8_t)(take >> 16);
    raw[2] = (uint8_t)(take >> 8), raw[3] = (uint8_t)take;
    out->len += 4 + c;
    z->plain += take;
    z->wire += GS_PROTO_HDR + 4 + c;
    return (long)take;
}

int gs_zframes_unpack(struct gs_zframes *z, const struct gs_proto_msg *m, struct gs_proto_buf *raw)
{
    raw->len = 0;
    if (m->size > GS_PROTO_ZRAW_MAX || gs_proto_buf_reserve(raw, (size_t)m->size) < 0)
        return -1;
    unsigned long long content = ZSTD_getFrameContentSize(m->data.p, m->data.len);
    if (content != m->size) /* also refuses an unknown size, and what is not zstd at all */
        return -1;
    size_t got = ZSTD_decompressDCtx(z->dctx, raw->data, (size_t)m->size, m->data.p, m->data.len);
    if (ZSTD_isError(got) || got != m->size)
        return -1;
    raw->len = got;
    return 0;
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

void gs_zframes_stats(const struct gs_zframes *z, unsigned long long *plain,
                      unsigned long long *wire)
{
    (void)z;
    *plain = *wire = 0;
}

#endif
