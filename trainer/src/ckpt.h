/* ckpt.h: training checkpoints. A file is a fixed header (magic "GSTRCKPT", format version,
 * layer sizes, optimiser kind, counts, epoch, seed, CRC-32s of header and payload) followed by
 * the parameters and the optimiser state as raw little-endian f32. Saving writes a temp file,
 * fsyncs and renames it over the target, so a crash never leaves a torn checkpoint.
 * The run's only randomness after initialisation is the sampler, a pure function of
 * (seed, epoch); storing both is what makes --resume bit-exact. */
#ifndef GT_CKPT_H
#define GT_CKPT_H

#include <stdint.h>

#include "gt_err.h"
#include "model.h"
#include "optim.h"

/* Version 2 appends fp16's loss-scaler state to the header; version 1 files still load (as a
 * run without loss scaling). Version 3 appends the run's shape (ranks, per-rank batch, training
 * samples, --drop-last), which a resume must match; older files read it as 0 (unknown). */
#define GT_CKPT_VERSION 3

typedef struct gt_ckpt_meta {
    uint64_t epoch;  /* epochs completed */
    uint64_t seed;   /* the run's --seed (sampler and init) */
    double best_acc; /* best test accuracy so far */
    uint32_t global_batch;
    float loss_scale;       /* fp16 GradScaler state (scale 0 when the run was not fp16) */
    int32_t scaler_clean;   /* clean steps since the scale last changed */
    int64_t scaler_skipped; /* steps skipped so far */
    /* The run's shape, which fixes its batches and step count (0 in files before version 3). */
    uint32_t world_size;    /* ranks */
    uint32_t batch_size;    /* per rank */
    uint64_t train_samples; /* training samples used (after --limit-train) */
    uint32_t drop_last;     /* --drop-last */
} gt_ckpt_meta;

/* Writes path atomically (path.tmp, fsync, rename). Fails with a message naming path. */
int gt_ckpt_save(const char *path, const gt_mlp *m, const gt_optim *o, const gt_ckpt_meta *meta,
                 gt_err *err);

/* Reads path into an already initialised model and optimiser. Fails (leaving m and o
 * unchanged) on a short file, a bad magic or version, a checksum mismatch, or layer sizes or an
 * optimiser that differ from m and o — each message names path and what differed. A directory
 * is refused as one, suggesting path/last.ckpt when that exists. */
int gt_ckpt_load(const char *path, gt_mlp *m, gt_optim *o, gt_ckpt_meta *meta, gt_err *err);

#endif
