/* ckpt.c: checkpoint serialisation. The payload is read into a scratch buffer and verified
 * before anything is copied into the live model, so a bad file never half-loads. */
#include "ckpt.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static const char MAGIC[8] = {'G', 'S', 'T', 'R', 'C', 'K', 'P', 'T'};

typedef struct ckpt_header {
    char magic[8];
    uint32_t version;
    uint32_t nlayers;
    uint32_t sizes[GT_MLP_MAX_LAYERS + 1];
    uint32_t optim_kind;
    uint32_t global_batch;
    uint32_t model;   /* gt_model_kind; was a zeroed reserved field, so older files read as mlp */
    uint64_t nparams; /* the model's parameters and then its buffers (BatchNorm statistics) */
    uint64_t state_len;
    uint64_t epoch;
    int64_t opt_step;
    uint64_t seed;
    double best_acc;
    uint32_t payload_crc;
    uint32_t header_crc; /* CRC-32 of this header (v1: of its v1 part) with header_crc = 0 */
    /* Version 2 from here on. */
    float loss_scale;
    int32_t scaler_clean;
    int64_t scaler_skipped;
    /* Version 3 from here on. */
    uint32_t world_size;
    uint32_t batch_size;
    uint64_t train_samples;
    uint32_t drop_last;
    uint32_t reserved;
} ckpt_header;

#define V1_HEADER_SIZE offsetof(ckpt_header, loss_scale)
#define V2_HEADER_SIZE offsetof(ckpt_header, world_size)

/* The bytes a header of version v occupies (and its CRC covers). */
static size_t header_size(uint32_t v)
{
    return v == 1 ? V1_HEADER_SIZE : v == 2 ? V2_HEADER_SIZE : sizeof(ckpt_header);
}

static uint32_t crc(const void *p, size_t n, uint32_t acc)
{
    const unsigned char *b = p;
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        acc = (uint32_t)crc32(acc, b, chunk);
        b += chunk;
        n -= chunk;
    }
    return acc;
}

static uint32_t header_crc(ckpt_header h)
{
    h.header_crc = 0;
    return crc(&h, header_size(h.version), 0);
}

static void fill_header(ckpt_header *h, const gt_mlp *m, const gt_optim *o,
                        const gt_ckpt_meta *meta)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, MAGIC, sizeof(MAGIC));
    h->version = GT_CKPT_VERSION;
    h->nlayers = (uint32_t)m->nlayers;
    for (int l = 0; l <= m->nlayers; l++)
        h->sizes[l] = (uint32_t)m->sizes[l];
    h->optim_kind = (uint32_t)o->kind;
    h->global_batch = meta->global_batch;
    h->model = (uint32_t)m->kind;
    h->nparams = m->nparams + m->nbuffers;
    h->state_len = gt_optim_state_len(o);
    h->epoch = meta->epoch;
    h->opt_step = o->step;
    h->seed = meta->seed;
    h->best_acc = meta->best_acc;
    h->loss_scale = meta->loss_scale;
    h->scaler_clean = meta->scaler_clean;
    h->scaler_skipped = meta->scaler_skipped;
    h->world_size = meta->world_size;
    h->batch_size = meta->batch_size;
    h->train_samples = meta->train_samples;
    h->drop_last = meta->drop_last;
    h->payload_crc = crc(m->params, m->nparams * sizeof(float), 0);
    if (m->nbuffers)
        h->payload_crc = crc(m->buffers, m->nbuffers * sizeof(float), h->payload_crc);
    h->payload_crc = crc(o->m, o->n * sizeof(float), h->payload_crc);
    if (o->v)
        h->payload_crc = crc(o->v, o->n * sizeof(float), h->payload_crc);
    h->header_crc = header_crc(*h);
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int gt_ckpt_save(const char *path, const gt_mlp *m, const gt_optim *o, const gt_ckpt_meta *meta,
                 gt_err *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    ckpt_header h;
    fill_header(&h, m, o, meta);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return gt_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_all(f, &h, sizeof(h));
    rc = rc ? rc : write_all(f, m->params, m->nparams * sizeof(float));
    if (m->nbuffers)
        rc = rc ? rc : write_all(f, m->buffers, m->nbuffers * sizeof(float));
    rc = rc ? rc : write_all(f, o->m, o->n * sizeof(float));
    if (o->v)
        rc = rc ? rc : write_all(f, o->v, o->n * sizeof(float));
    rc = rc ? rc : fflush(f);
    rc = rc ? rc : fsync(fileno(f));
    int e = errno;
    if (fclose(f) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlink(tmp);
        return gt_errf(err, "%s: cannot write checkpoint: %s", path, strerror(e));
    }
    return 0;
}

static const char *model_name(uint32_t kind)
{
    return kind == GT_MODEL_LENET ? "lenet" : kind == GT_MODEL_RESNET ? "resnet" : "mlp";
}

static int check_header(const char *path, const ckpt_header *h, const gt_mlp *m, const gt_optim *o,
                        gt_err *err)
{
    if (memcmp(h->magic, MAGIC, sizeof(MAGIC)) != 0)
        return gt_errf(err, "%s: not a gpusync-train checkpoint (bad magic)", path);
    if (h->version < 1 || h->version > GT_CKPT_VERSION)
        return gt_errf(err, "%s: checkpoint format version %u, this build reads %d", path,
                       h->version, GT_CKPT_VERSION);
    if (h->header_crc != header_crc(*h))
        return gt_errf(err, "%s: checkpoint header is corrupt (checksum mismatch)", path);
    if (h->model != (uint32_t)m->kind)
        return gt_errf(err, "%s: checkpoint holds a %s model, this run trains --model %s", path,
                       model_name(h->model), model_name((uint32_t)m->kind));
    int same = h->nlayers == (uint32_t)m->nlayers && h->nparams == m->nparams + m->nbuffers;
    for (int l = 0; same && l <= m->nlayers; l++)
        same = h->sizes[l] == (uint32_t)m->sizes[l];
    if (!same) {
        char got[128] = "", *p = got;
        for (uint32_t l = 0; l <= h->nlayers && l <= GT_MLP_MAX_LAYERS; l++)
            p += snprintf(p, (size_t)(got + sizeof(got) - p), l ? ",%u" : "%u", h->sizes[l]);
        return gt_errf(err, "%s: checkpoint layer sizes %s differ from this model's", path, got);
    }
    if (h->optim_kind != (uint32_t)o->kind || h->state_len != gt_optim_state_len(o))
        return gt_errf(err, "%s: checkpoint was written with --optim %s, this run uses %s", path,
                       gt_optim_name((gt_optim_kind)h->optim_kind), gt_optim_name(o->kind));
    return 0;
}

/* Reads the v1 part, then the later versions' tails that the version says are there; what an
 * older header lacks reads as 0 (no loss scaling, an unknown run shape). h must be zeroed.
 * Returns -1 on a short file. */
static int read_header(FILE *f, ckpt_header *h)
{
    if (fread(h, 1, V1_HEADER_SIZE, f) != V1_HEADER_SIZE)
        return -1;
    if (h->version <= 1 || h->version > GT_CKPT_VERSION)
        return 0; /* check_header refuses an unknown version */
    size_t tail = header_size(h->version) - V1_HEADER_SIZE;
    return fread((char *)h + V1_HEADER_SIZE, 1, tail, f) == tail ? 0 : -1;
}

/* A directory opens for reading but reads as empty: name it as one, pointing at the
 * last.ckpt that --save-dir writes there when it holds one. */
static int directory_error(const char *path, gt_err *err)
{
    char last[4200];
    size_t n = strlen(path);
    snprintf(last, sizeof(last), "%s%slast.ckpt", path, n && path[n - 1] == '/' ? "" : "/");
    if (access(last, R_OK) == 0)
        return gt_errf(err, "%s: is a directory, not a checkpoint file; did you mean %s?", path,
                       last);
    return gt_errf(err, "%s: is a directory, not a checkpoint file (and holds no last.ckpt)", path);
}

int gt_ckpt_load(const char *path, gt_mlp *m, gt_optim *o, gt_ckpt_meta *meta, gt_err *err)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return directory_error(path, err);
    FILE *f = fopen(path, "rb");
    if (!f)
        return gt_errf(err, "%s: cannot open checkpoint: %s", path, strerror(errno));
    ckpt_header h;
    memset(&h, 0, sizeof(h));
    float *buf = NULL;
    int rc = read_header(f, &h) == 0
                 ? check_header(path, &h, m, o, err)
                 : gt_errf(err, "%s: checkpoint truncated (short header)", path);
    size_t n = (size_t)(h.nparams + h.state_len);
    if (rc == 0 && !(buf = malloc(n * sizeof(float))))
        rc = gt_errf(err, "%s: out of memory", path);
    if (rc == 0 && fread(buf, sizeof(float), n, f) != n)
        rc = gt_errf(err, "%s: checkpoint truncated (payload)", path);
    if (rc == 0 && fgetc(f) != EOF)
        rc = gt_errf(err, "%s: trailing bytes after the checkpoint payload", path);
    if (rc == 0 && crc(buf, n * sizeof(float), 0) != h.payload_crc)
        rc = gt_errf(err, "%s: checkpoint payload is corrupt (checksum mismatch)", path);
    if (rc == 0) {
        size_t state = m->nparams + m->nbuffers;
        memcpy(m->params, buf, m->nparams * sizeof(float));
        if (m->nbuffers)
            memcpy(m->buffers, buf + m->nparams, m->nbuffers * sizeof(float));
        memcpy(o->m, buf + state, o->n * sizeof(float));
        if (o->v)
            memcpy(o->v, buf + state + o->n, o->n * sizeof(float));
        o->step = h.opt_step;
        meta->epoch = h.epoch;
        meta->seed = h.seed;
        meta->best_acc = h.best_acc;
        meta->global_batch = h.global_batch;
        meta->loss_scale = h.loss_scale;
        meta->scaler_clean = h.scaler_clean;
        meta->scaler_skipped = h.scaler_skipped;
        meta->world_size = h.world_size;
        meta->batch_size = h.batch_size;
        meta->train_samples = h.train_samples;
        meta->drop_last = h.drop_last;
    }
    free(buf);
    fclose(f);
    return rc;
}
