/* train.h: the training run — data, sampler, model, optimiser, process group and checkpoints
 * wired together; main.c only parses flags into a gt_config and calls gt_train_run. */
#ifndef GT_TRAIN_H
#define GT_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "dist.h"
#include "gt_err.h"
#include "model.h"
#include "optim.h"

#define GT_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct gt_config {
    const char *data_dir;
    gt_model_kind model;    /* --model mlp|lenet|resnet */
    bool sync_bn;           /* resnet: SyncBatchNorm (statistics over all ranks) */
    gt_precision precision; /* --precision fp32|bf16|fp16 (emulated rounding on the CPU) */
    float init_scale;       /* fp16: GradScaler's initial loss scale (2^16) */
    bool augment;           /* random crop (padding 2) and horizontal flip of training images */
    float dropout;          /* p of the LeNet's dropout and dropout2d */
    int hidden[GT_MLP_MAX_LAYERS];
    int nhidden;
    gt_optim_kind optim;
    float lr, momentum, weight_decay;
    bool cosine; /* lr follows a cosine from lr to 0 over all steps of the run */
    int epochs;
    int batch_size;      /* per rank, as in PyTorch */
    int eval_batch_size; /* per rank */
    uint64_t seed;
    bool drop_last;
    int64_t max_steps;       /* stop after this many optimiser steps in total (0: no limit) */
    int64_t limit_train;     /* use only the first N training samples (0: all) */
    const char *save_dir;    /* writes last.ckpt / best.ckpt there (NULL: none) */
    const char *resume;      /* checkpoint to continue from (NULL: fresh start) */
    const char *metrics;     /* JSON-lines file written by rank 0 (NULL: none) */
    const char *dump_params; /* raw f32 parameters written by rank 0 at the end (tests) */
    int threads;             /* CPU threads of lenet and resnet (0: gt_pool_default_threads) */
    bool use_gpu;
    bool device_auto; /* --device auto: a model without a GPU path falls back to the CPU */
    bool quiet;
    gt_dist_config dist;
} gt_config;

/* Fills the defaults: Fashion-MNIST, --model mlp with hidden 512,256, seed 0, and mlp's training
 * defaults (gt_config_model_defaults). */
void gt_config_defaults(gt_config *c);

/* Sets the training hyperparameters (optimiser, lr, momentum, weight decay, schedule, epochs,
 * batch size, dropout, augmentation) to c->model's defaults, leaving everything else alone. The
 * flag parser applies them once --model is known, before the other flags. */
void gt_config_model_defaults(gt_config *c);

/* gt_train_run's return when the flags contradict the run being resumed (a usage error). */
#define GT_TRAIN_USAGE (-2)

/* Runs training to completion. Returns 0, or -1 with a message naming this rank in err, or
 * GT_TRAIN_USAGE when --resume names a checkpoint of a run with another seed, rank count,
 * per-rank batch, training set (--limit-train) or --drop-last. Rank 0 prints one line per epoch
 * on stdout (unless quiet) and writes metrics and checkpoints. */
int gt_train_run(const gt_config *c, gt_err *err);

/* "fp32", "bf16" or "fp16". */
const char *gt_precision_name(gt_precision p);

/* "mlp", "lenet" or "resnet". */
const char *gt_model_name(gt_model_kind k);

/* The learning rate of optimiser step `step` (0-based) out of `total`: c->lr, or with c->cosine
 * c->lr * (1 + cos(pi * step / total)) / 2, which is torch's CosineAnnealingLR(T_max=total,
 * eta_min=0) stepped once per batch. */
float gt_train_lr_at(const gt_config *c, int64_t step, int64_t total);

#endif
