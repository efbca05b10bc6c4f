/* train.c: the data-parallel training loop, PyTorch DDP's math on CPU ranks or GPUs. Each rank
 * walks its DistributedSampler shard in batches; gradients are averaged over ranks before every
 * optimiser step, so all replicas stay bit-identical and rank 0 alone prints and checkpoints.
 * Evaluation is sharded the same way and its counts all-reduced, skipping padding duplicates. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "idx.h"
#include "layers.h"
#include "lenet.h"
#include "pool.h"
#include "resnet.h"
#include "sampler.h"
#include "scaler.h"
#ifdef GT_HAVE_CUDA
#include "gpu.h"
#endif

/* What the model's SyncBatchNorm reduces through: the process group and where a failure's
 * message goes until the step reports it. */
typedef struct bn_reduce {
    gt_dist *dist;
    gt_err err;
} bn_reduce;

typedef struct run {
    const gt_config *c;
    gt_dist dist;
    bn_reduce bn;
    gt_dataset train, test;
    gt_sampler train_s, test_s;
    gt_mlp model;
    gt_optim opt;
    gt_ckpt_meta meta;
    const char *resumed;     /* the checkpoint this run continues (NULL: a fresh start) */
    char restart_ckpt[4200]; /* <save-dir>/last.ckpt, which a restarted attempt continues */
    gt_scaler scaler;        /* fp16 loss scaling */
    int64_t steps;
    int64_t total_steps; /* optimiser steps the whole run takes (the cosine's period) */
    int max_batch;
    float *xb;            /* (max_batch, dim) gathered batch */
    float *aug;           /* (dim) one image's scratch for --augment */
    int side;             /* image side, for --augment (square images) */
    uint64_t epoch;       /* the epoch being trained (the augmentation key) */
    uint8_t *yb;          /* (max_batch) */
    int64_t *idx;         /* this rank's train shard for the current epoch */
    int64_t *tidx, *tpos; /* the test shard and its positions in the padded list */
    FILE *metrics;
    void *gpu; /* gt_gpu * when the CUDA path is on */
} run;

void gt_config_defaults(gt_config *c)
{
    memset(c, 0, sizeof(*c));
    c->data_dir = GT_DEFAULT_DATA;
    c->model = GT_MODEL_MLP;
    c->precision = GT_PREC_FP32;
    c->init_scale = GT_SCALER_INIT;
    c->hidden[0] = 512;
    c->hidden[1] = 256;
    c->nhidden = 2;
    c->eval_batch_size = 1000;
    c->seed = 0;
    gt_config_model_defaults(c);
    gt_dist_config_from_env(&c->dist, NULL);
}

void gt_config_model_defaults(gt_config *c)
{
    /* mlp: Adam 1e-3, cosine, 10 epochs of 64 reach 0.89 (issue 5). */
    c->optim = GT_OPTIM_ADAM;
    c->lr = 1e-3f;
    c->momentum = 0.9f;
    c->weight_decay = 0.0f;
    c->epochs = 10;
    c->cosine = true;
    c->batch_size = 64;
    c->dropout = 0.5f;
    c->augment = false;
    if (c->model == GT_MODEL_LENET) {
        /* Measured on Fashion-MNIST, 1 CPU rank: the table in trainer/README.md. */
        c->lr = 3e-3f;
        c->epochs = 20;
        c->dropout = 0.1f;
    } else if (c->model == GT_MODEL_RESNET) {
        /* The usual CIFAR-style ResNet recipe, sized for a GPU run: SGD with momentum and
         * weight decay, cosine to 0 over 30 epochs, batch 128 per rank. */
        c->optim = GT_OPTIM_SGD;
        c->lr = 0.1f;
        c->weight_decay = 5e-4f;
        c->epochs = 30;
        c->batch_size = 128;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int load_data(run *r, gt_err *err)
{
    const gt_config *c = r->c;
    if (gt_dataset_load(c->data_dir, "train", &r->train, err) != 0 ||
        gt_dataset_load(c->data_dir, "t10k", &r->test, err) != 0)
        return -1;
    if (r->train.dim != r->test.dim)
        return gt_errf(err, "%s: train images have %zu pixels, test images %zu", c->data_dir,
                       r->train.dim, r->test.dim);
    if (c->limit_train > 0 && (size_t)c->limit_train < r->train.count)
        r->train.count = (size_t)c->limit_train;
    if (r->test.nclasses > r->train.nclasses)
        r->train.nclasses = r->test.nclasses;
    return 0;
}

static int alloc_buffers(run *r, gt_err *err)
{
    const gt_config *c = r->c;
    r->max_batch = c->batch_size > c->eval_batch_size ? c->batch_size : c->eval_batch_size;
    r->xb = malloc((size_t)r->max_batch * r->train.dim * sizeof(float));
    r->yb = malloc((size_t)r->max_batch);
    r->aug = malloc(r->train.dim * sizeof(float));
    r->idx = malloc((size_t)r->train_s.num_samples * sizeof(int64_t));
    r->tidx = malloc((size_t)r->test_s.num_samples * sizeof(int64_t));
    r->tpos = malloc((size_t)r->test_s.num_samples * sizeof(int64_t));
    if (!r->xb || !r->yb || !r->aug || !r->idx || !r->tidx || !r->tpos)
        return gt_errf(err, "out of memory for batch buffers");
    return 0;
}

/* Records the run's shape in r->meta, where checkpoints take it from. */
static void set_run_shape(run *r)
{
    r->meta.global_batch = (uint32_t)(r->c->batch_size * r->dist.world);
    r->meta.world_size = (uint32_t)r->dist.world;
    r->meta.batch_size = (uint32_t)r->c->batch_size;
    r->meta.train_samples = (uint64_t)r->train.count;
    r->meta.drop_last = r->c->drop_last;
}

/* A checkpoint is a place in one run's sequence of batches and lr steps: its epoch counts
 * epochs of that run's steps, its step count positions the cosine, and the seed replays the
 * shuffles and dropout masks. A run of another shape would continue somewhere else while
 * claiming to resume, so it is refused naming the setting (as a DDP script that restores its
 * sampler and scheduler state must). m is the checkpoint's meta; files before version 3 carry
 * only the seed and the global batch. Returns 0 or -1. */
static int check_resume(const run *r, const gt_ckpt_meta *m, const char *path, gt_err *err)
{
    const gt_config *c = r->c;
    unsigned W = (unsigned)r->dist.world, B = (unsigned)c->batch_size;
    if (m->seed != c->seed)
        return gt_errf(err,
                       "%s: cannot resume: the checkpoint was written with --seed %llu, this run "
                       "has --seed %llu; "
                       "resume with --seed %llu",
                       path, (unsigned long long)m->seed, (unsigned long long)c->seed,
                       (unsigned long long)m->seed);
    if (m->world_size && (m->world_size != W || m->batch_size != B))
        return gt_errf(err,
                       "%s: cannot resume: the checkpoint was written by %u rank(s) x --batch-size "
                       "%u (global batch "
                       "%u), this run has %u x %u (global batch %u); resume with the same "
                       "ranks and --batch-size, or start afresh",
                       path, m->world_size, m->batch_size, m->global_batch, W, B, W * B);
    if (m->global_batch != W * B) /* a file before version 3 */
        return gt_errf(err,
                       "%s: cannot resume: the checkpoint was written with global batch %u, this "
                       "run has %u (%u "
                       "rank(s) x --batch-size %u); resume with the same global batch",
                       path, m->global_batch, W * B, W, B);
    if (m->train_samples && m->train_samples != (uint64_t)r->train.count)
        return gt_errf(
            err,
            "%s: cannot resume: the checkpoint trained on %llu samples per epoch, this run on %zu; "
            "resume with the same --limit-train",
            path, (unsigned long long)m->train_samples, r->train.count);
    if (m->world_size && m->drop_last != (uint32_t)c->drop_last)
        return gt_errf(err,
                       "%s: cannot resume: the checkpoint was written %s --drop-last; resume %s it",
                       path, m->drop_last ? "with" : "without", m->drop_last ? "with" : "without");
    return 0;
}

/* Rank 0 reads the checkpoint and checks it fits this run, then passes everything to the other
 * ranks, so only rank 0's filesystem needs the file; a failed read on rank 0 makes every rank
 * fail. Returns 0, -1, or GT_TRAIN_USAGE when the checkpoint's run had another shape. */
static int resume(run *r, const char *path, gt_err *err)
{
    int32_t status = 0; /* 1 loaded, 0 unreadable, GT_TRAIN_USAGE another run's shape */
    if (r->dist.rank == 0) {
        gt_ckpt_meta m = {0};
        status = gt_ckpt_load(path, &r->model, &r->opt, &m, err) == 0;
        if (status == 1 && check_resume(r, &m, path, err) != 0)
            status = GT_TRAIN_USAGE;
        if (status == 1)
            r->meta = m;
    }
    if (gt_dist_broadcast(&r->dist, &status, sizeof(status), err) != 0)
        return -1;
    if (status == GT_TRAIN_USAGE && r->dist.rank != 0)
        gt_errf(err, "rank 0 refused checkpoint %s: this run's settings differ", path);
    if (status == GT_TRAIN_USAGE)
        return GT_TRAIN_USAGE;
    if (status != 1)
        return r->dist.rank == 0 ? -1 : gt_errf(err, "rank 0 could not read checkpoint %s", path);
    int rc = gt_dist_broadcast(&r->dist, r->model.params, r->model.nparams * sizeof(float), err);
    if (r->model.nbuffers)
        rc = rc ? rc
                : gt_dist_broadcast(&r->dist, r->model.buffers, r->model.nbuffers * sizeof(float),
                                    err);
    rc = rc ? rc : gt_dist_broadcast(&r->dist, r->opt.m, r->opt.n * sizeof(float), err);
    if (r->opt.v)
        rc = rc ? rc : gt_dist_broadcast(&r->dist, r->opt.v, r->opt.n * sizeof(float), err);
    rc = rc ? rc : gt_dist_broadcast(&r->dist, &r->opt.step, sizeof(r->opt.step), err);
    rc = rc ? rc : gt_dist_broadcast(&r->dist, &r->meta, sizeof(r->meta), err);
    return rc;
}

/* Sets r->resumed to the checkpoint this run continues. A restarted attempt (torchrun's and
 * gpusync run's TORCHELASTIC_RESTART_COUNT >= 1) continues <save-dir>/last.ckpt when rank 0 has
 * one, as torchrun's docs ask of training scripts, so a group restart carries on from the failed
 * attempt's last epoch (and its best accuracy, so best.ckpt never goes back) instead of
 * overwriting both from epoch 1; otherwise --resume, else nothing. Rank 0 decides and tells the
 * others, whose --save-dir may not hold the file. Returns 0 or -1. */
static int pick_resume(run *r, gt_err *err)
{
    const gt_config *c = r->c;
    r->resumed = c->resume;
    if (c->dist.restart < 1 || !c->save_dir)
        return 0;
    snprintf(r->restart_ckpt, sizeof(r->restart_ckpt), "%s/last.ckpt", c->save_dir);
    int32_t found = r->dist.rank == 0 && access(r->restart_ckpt, F_OK) == 0;
    if (gt_dist_broadcast(&r->dist, &found, sizeof(found), err) != 0)
        return -1;
    if (found)
        r->resumed = r->restart_ckpt;
    return 0;
}

static int setup_gpu(run *r, gt_err *err)
{
#ifdef GT_HAVE_CUDA
    if (r->c->augment)
        return gt_errf(err, "--device cuda: --augment has no GPU path yet; use --device cpu");
    const char *why = NULL;
    if (gt_gpu_device_count(&why) <= 0)
        return gt_errf(err, "--device cuda: no CUDA device is usable (%s)", why);
    return gt_gpu_init((gt_gpu **)&r->gpu, &r->model, &r->opt, &r->train, &r->test, r->max_batch,
                       r->c->precision, &r->dist, err);
#else
    (void)r;
    return gt_errf(err, "--device cuda: this build has no GPU path (CUDA/NCCL not found at "
                        "configure time)");
#endif
}

const char *gt_model_name(gt_model_kind k)
{
    return k == GT_MODEL_LENET ? "lenet" : k == GT_MODEL_RESNET ? "resnet" : "mlp";
}

static int reduce_over_ranks(void *ctx, double *v, size_t n)
{
    bn_reduce *b = ctx;
    return gt_dist_allreduce_f64(b->dist, v, n, &b->err);
}

static int init_model(run *r, gt_err *err)
{
    const gt_config *c = r->c;
    /* The CNNs keep every activation for the backward: they are sized for the training batch
     * and evaluation runs in chunks of it, not for the (larger) evaluation batch. */
    if (c->model == GT_MODEL_LENET)
        return gt_lenet_init(&r->model, (int)r->train.dim, r->train.nclasses, c->batch_size,
                             c->seed, c->dropout, err);
    if (c->model == GT_MODEL_RESNET) {
        if (gt_resnet_init(&r->model, (int)r->train.dim, r->train.nclasses, c->batch_size, c->seed,
                           err) != 0)
            return -1;
        r->bn.dist = &r->dist;
        if (c->sync_bn && r->dist.world > 1) {
            r->model.reduce = reduce_over_ranks;
            r->model.reduce_ctx = &r->bn;
        }
        return 0;
    }
    return gt_mlp_init(&r->model, (int)r->train.dim, c->hidden, c->nhidden, r->train.nclasses,
                       r->max_batch, c->seed, err);
}

/* Training iterations so far, skipped ones included. PyTorch's loop calls scheduler.step() after
 * every batch even when GradScaler skips optimizer.step(), so the lr schedule (and the dropout
 * key) follow this count; opt.step counts only the updates taken, which is Adam's t. */
static int64_t iteration(const run *r)
{
    return r->opt.step + r->scaler.skipped;
}

static int setup(run *r, gt_err *err)
{
    const gt_config *c = r->c;
    if (gt_dist_init(&r->dist, &c->dist, err) != 0 || load_data(r, err) != 0)
        return -1;
    int W = r->dist.world, R = r->dist.rank;
    if (gt_sampler_init(&r->train_s, (int64_t)r->train.count, W, R, true, c->drop_last, c->seed,
                        err) != 0 ||
        gt_sampler_init(&r->test_s, (int64_t)r->test.count, W, R, false, false, 0, err) != 0 ||
        alloc_buffers(r, err) != 0)
        return -1;
    if (init_model(r, err) != 0 || gt_optim_init(&r->opt, c->optim, r->model.nparams, c->lr,
                                                 c->momentum, c->weight_decay, err) != 0)
        return -1;
    int64_t per_epoch = (r->train_s.num_samples + c->batch_size - 1) / c->batch_size;
    r->total_steps = per_epoch * c->epochs;
    r->meta.seed = c->seed;
    int rc = pick_resume(r, err);
    rc = rc == 0 && r->resumed ? resume(r, r->resumed, err) : rc;
    if (rc != 0)
        return rc;
    set_run_shape(r); /* the same as a version-3 checkpoint's; fills in an older one's */
    /* The sampler must replay the checkpointed run's shuffles. */
    r->train_s.seed = r->meta.seed;
    r->side = (int)lround(sqrt((double)r->train.dim));
    if (c->augment && (size_t)r->side * r->side != r->train.dim)
        return gt_errf(err, "--augment: images of %zu pixels are not square", r->train.dim);
    gt_gemm_set_precision(c->precision);
    /* A convolution's per-sample GEMMs are too small for the BLAS's threads: the pool splits
     * the batch between the cores instead (pool.h). The MLP's GEMMs keep the BLAS's. */
    if (!c->use_gpu && c->model != GT_MODEL_MLP)
        gt_pool_start(c->threads > 0 ? c->threads : gt_pool_default_threads());
    gt_scaler_init(&r->scaler, c->precision == GT_PREC_FP16 ? c->init_scale : 1.0f);
    /* A checkpoint of an fp16 run continues its scale; any other starts at --init-scale. The
     * skipped count always carries over: it is part of the iteration count (see iteration()). */
    if (r->resumed && c->precision == GT_PREC_FP16 && r->meta.loss_scale > 0.0f) {
        r->scaler.scale = r->meta.loss_scale;
        r->scaler.clean = r->meta.scaler_clean;
    }
    if (r->resumed)
        r->scaler.skipped = r->meta.scaler_skipped;
    r->steps = iteration(r); /* --max-steps counts the checkpointed run's steps too */
    if (c->use_gpu && setup_gpu(r, err) != 0)
        return -1;
    if (R == 0 && c->metrics && !(r->metrics = fopen(c->metrics, "a")))
        return gt_errf(err, "%s: cannot open metrics file: %s", c->metrics, strerror(errno));
    return 0;
}

static void gather(run *r, const gt_dataset *ds, const int64_t *idx, int B)
{
    for (int i = 0; i < B; i++) {
        memcpy(r->xb + (size_t)i * ds->dim, ds->x + (size_t)idx[i] * ds->dim,
               ds->dim * sizeof(float));
        r->yb[i] = ds->y[idx[i]];
    }
}

static void scale_logit_grads(gt_mlp *m, int B, float scale)
{
    float *d = m->dacts[m->nlayers]; /* (B, classes) */
    for (size_t i = 0; i < (size_t)B * m->sizes[m->nlayers]; i++)
        d[i] *= scale;
}

/* --augment on image x (side x side), as torchvision's RandomCrop(side, padding=2) then
 * RandomHorizontalFlip: out[y][x] = in[y+i-2][x'+j-2] with x' = x or side-1-x, zero outside.
 * The offsets and the flip come from a hash of (seed, epoch, dataset index), so a sample is
 * augmented alike on any rank and on resume. */
static void augment_image(float *x, float *tmp, int side, uint64_t h)
{
    int i = (int)(h % 5), j = (int)((h >> 8) % 5), flip = (int)((h >> 16) & 1);
    memcpy(tmp, x, (size_t)side * side * sizeof(float));
    for (int y = 0; y < side; y++)
        for (int c = 0; c < side; c++) {
            int sy = y + i - 2, sx = (flip ? side - 1 - c : c) + j - 2;
            int in = sy >= 0 && sy < side && sx >= 0 && sx < side;
            x[y * side + c] = in ? tmp[sy * side + sx] : 0.0f;
        }
}

static void augment_batch(run *r, const int64_t *idx, int B)
{
    uint64_t key = gt_dropout_key(r->meta.seed, (int64_t)r->epoch, 1000);
    for (int b = 0; b < B; b++)
        augment_image(r->xb + (size_t)b * r->train.dim, r->aug, r->side,
                      gt_dropout_key(key, idx[b], 0));
}

/* One CPU step: local mean gradient, averaged over ranks, then the optimiser update. */
static int cpu_step(run *r, const int64_t *idx, int B, double *stats, gt_err *err)
{
    gt_mlp *m = &r->model;
    gather(r, &r->train, idx, B);
    if (r->c->augment)
        augment_batch(r, idx, B);
    /* DDP's broadcast_buffers: every forward starts from rank 0's BatchNorm running statistics. */
    if (r->dist.world > 1 && m->nbuffers &&
        gt_dist_broadcast(&r->dist, m->buffers, m->nbuffers * sizeof(float), err) != 0)
        return -1;
    /* Dropout masks are a function of (seed, step, sample): the same on any rank and on resume. */
    gt_mlp_set_mode(m, 1, gt_dropout_key(r->meta.seed, iteration(r), 0), idx);
    gt_mlp_forward(m, r->xb, B);
    int64_t correct = 0;
    stats[0] += gt_mlp_loss(m, r->yb, B, 1, &correct);
    stats[1] += (double)correct;
    stats[2] += B;
    if (r->c->precision == GT_PREC_FP16) /* scaler.scale(loss).backward() */
        scale_logit_grads(m, B, r->scaler.scale);
    gt_mlp_backward(m, r->xb, B);
    if (m->failed) {
        *err = r->bn.err; /* a SyncBatchNorm reduction failed mid-pass */
        return -1;
    }
    if (r->dist.world > 1) {
        if (gt_dist_allreduce_f32(&r->dist, m->grads, m->nparams, err) != 0)
            return -1;
        float scale = 1.0f / (float)r->dist.world;
        for (size_t i = 0; i < m->nparams; i++)
            m->grads[i] *= scale;
    }
    /* fp16: every rank holds the same averaged gradients, so all skip the same steps. */
    if (r->c->precision == GT_PREC_FP16 &&
        !gt_scaler_unscale_and_update(&r->scaler, m->grads, m->nparams))
        return 0;
    gt_optim_step(&r->opt, m->params, m->grads);
    return 0;
}

float gt_train_lr_at(const gt_config *c, int64_t step, int64_t total)
{
    if (!c->cosine || total <= 0)
        return c->lr;
    double t = step < total ? (double)step / (double)total : 1.0;
    return (float)(c->lr * 0.5 * (1.0 + cos(M_PI * t)));
}

/* Step on shard rows [off, off+B). */
static int train_step(run *r, int64_t off, int B, double *stats, gt_err *err)
{
    /* The schedule is a function of the iteration count, which checkpoints keep. */
    r->opt.lr = gt_train_lr_at(r->c, iteration(r), r->total_steps);
#ifdef GT_HAVE_CUDA
    if (r->gpu) {
        gt_gpu_step st = {off, B, r->opt.lr, gt_dropout_key(r->meta.seed, iteration(r), 0),
                          r->c->precision == GT_PREC_FP16 ? &r->scaler : NULL};
        int applied = 0;
        if (gt_gpu_train_step((gt_gpu *)r->gpu, &st, &applied, err) != 0) {
            if (r->bn.err.msg[0])
                *err = r->bn.err; /* a SyncBatchNorm reduction failed mid-pass */
            return -1;
        }
        r->opt.step += applied; /* the device optimiser's count; skips are in r->scaler */
        return 0;
    }
#endif
    return cpu_step(r, r->idx + off, B, stats, err);
}

/* Hands the GPU this epoch's shard (train) or the test shard once, so steps move no data. */
static int upload_shard(run *r, int test, gt_err *err)
{
#ifdef GT_HAVE_CUDA
    if (r->gpu)
        return gt_gpu_set_indices((gt_gpu *)r->gpu, test, test ? r->tidx : r->idx,
                                  test ? r->test_s.num_samples : r->train_s.num_samples, err);
#endif
    (void)r;
    (void)test;
    (void)err;
    return 0;
}

static int take_stats(run *r, double *stats, gt_err *err)
{
#ifdef GT_HAVE_CUDA
    if (r->gpu)
        return gt_gpu_take_stats((gt_gpu *)r->gpu, stats, err);
#endif
    (void)r;
    (void)stats;
    (void)err;
    return 0;
}

/* Trains one epoch; stats receives the global [loss sum, correct, samples]. Returns 1 when
 * --max-steps cut the epoch short, 0 otherwise, -1 on error. */
static int train_epoch(run *r, uint64_t epoch, double *stats, gt_err *err)
{
    int B = r->c->batch_size;
    int64_t n = r->train_s.num_samples;
    gt_sampler_indices(&r->train_s, epoch, r->idx, NULL);
    r->epoch = epoch;
    stats[0] = stats[1] = stats[2] = 0.0;
    if (upload_shard(r, 0, err) != 0)
        return -1;
    int stopped = 0;
    for (int64_t k = 0; k < n; k += B) {
        int b = (int)(n - k < B ? n - k : B);
        if (train_step(r, k, b, stats, err) != 0)
            return -1;
        r->steps++;
        if (r->c->max_steps > 0 && r->steps >= r->c->max_steps) {
            stopped = k + B < n; /* a cut at the epoch's end still evaluates and saves */
            break;
        }
    }
    if (take_stats(r, stats, err) != 0)
        return -1;
    if (gt_dist_allreduce_f64(&r->dist, stats, 3, err) != 0)
        return -1;
    return stopped;
}

/* Adds loss, correct and count of the gathered rows to stats, in chunks the model holds. */
static void eval_rows(run *r, int rows, double *stats)
{
    gt_mlp *m = &r->model;
    gt_mlp_set_mode(m, 0, 0, NULL);
    for (int s = 0; s < rows; s += m->max_batch) {
        int b = rows - s < m->max_batch ? rows - s : m->max_batch;
        gt_mlp_forward(m, r->xb + (size_t)s * r->test.dim, b);
        int64_t correct = 0;
        stats[0] += gt_mlp_loss(m, r->yb + s, b, 0, &correct);
        stats[1] += (double)correct;
        stats[2] += b;
    }
}

/* Counts correct predictions on this rank's test shard, leaving out padding positions. */
static int evaluate(run *r, double *acc, gt_err *err)
{
    gt_sampler_indices(&r->test_s, 0, r->tidx, r->tpos);
    double stats[3] = {0, 0, 0};
    if (upload_shard(r, 1, err) != 0)
        return -1;
    int E = r->c->eval_batch_size;
    for (int64_t k = 0; k < r->test_s.num_samples; k += E) {
        int b = (int)(r->test_s.num_samples - k < E ? r->test_s.num_samples - k : E);
        int real = 0; /* padding sits at the end of a shard, so real rows come first */
        while (real < b && r->tpos[k + real] < r->test_s.n)
            real++;
        if (real == 0)
            continue; /* a batch of padding only (eval batch smaller than the world) */
#ifdef GT_HAVE_CUDA
        if (r->gpu) {
            if (gt_gpu_eval_batch((gt_gpu *)r->gpu, k, real, err) != 0)
                return -1;
            continue;
        }
#endif
        gather(r, &r->test, r->tidx + k, real);
        eval_rows(r, real, stats);
    }
    if (take_stats(r, stats, err) != 0 || gt_dist_allreduce_f64(&r->dist, stats, 3, err) != 0)
        return -1;
    if ((int64_t)stats[2] != r->test_s.n)
        return gt_errf(err, "evaluation counted %.0f samples, expected %lld", stats[2],
                       (long long)r->test_s.n);
    *acc = stats[1] / stats[2];
    return 0;
}

static int sync_to_host(run *r, gt_err *err)
{
#ifdef GT_HAVE_CUDA
    if (r->gpu)
        return gt_gpu_download((gt_gpu *)r->gpu, &r->model, &r->opt, err);
#endif
    (void)r;
    (void)err;
    return 0;
}

static int save_checkpoints(run *r, int improved, gt_err *err)
{
    char path[4200];
    r->meta.loss_scale = r->c->precision == GT_PREC_FP16 ? r->scaler.scale : 0.0f;
    r->meta.scaler_clean = r->scaler.clean;
    r->meta.scaler_skipped = r->scaler.skipped;
    if (!r->c->save_dir || r->dist.rank != 0)
        return 0;
    if (mkdir(r->c->save_dir, 0777) != 0 && errno != EEXIST)
        return gt_errf(err, "%s: cannot create: %s", r->c->save_dir, strerror(errno));
    snprintf(path, sizeof(path), "%s/last.ckpt", r->c->save_dir);
    if (gt_ckpt_save(path, &r->model, &r->opt, &r->meta, err) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/best.ckpt", r->c->save_dir);
    return improved ? gt_ckpt_save(path, &r->model, &r->opt, &r->meta, err) : 0;
}

const char *gt_precision_name(gt_precision p)
{
    return p == GT_PREC_BF16 ? "bf16" : p == GT_PREC_FP16 ? "fp16" : "fp32";
}

/* fp16's epoch line ends with the loss scale and the steps skipped so far. */
static const char *fp16_note(run *r)
{
    static char note[96];
    if (r->c->precision != GT_PREC_FP16)
        return "";
    snprintf(note, sizeof(note), " | loss scale %g | %lld skipped step(s)", (double)r->scaler.scale,
             (long long)r->scaler.skipped);
    return note;
}

static void report(run *r, uint64_t epoch, const double *stats, double test_acc, double train_s,
                   double epoch_s)
{
    if (r->dist.rank != 0)
        return;
    double loss = stats[0] / stats[2], acc = stats[1] / stats[2], sps = stats[2] / train_s;
    if (!r->c->quiet)
        printf("epoch %3llu/%d | train loss %.4f | train acc %.4f | test acc %.4f | "
               "%.0f samples/s | %.2f s%s\n",
               (unsigned long long)epoch + 1, r->c->epochs, loss, acc, test_acc, sps, epoch_s,
               fp16_note(r));
    fflush(stdout);
    if (r->metrics) {
        fprintf(r->metrics,
                "{\"epoch\":%llu,\"train_loss\":%.6f,\"train_acc\":%.6f,\"test_acc\":%.6f,"
                "\"samples_per_s\":%.1f,\"epoch_time_s\":%.4f,\"global_batch\":%u,"
                "\"world_size\":%d,\"precision\":\"%s\",\"loss_scale\":%.9g,"
                "\"skipped_steps\":%lld,\"lr\":%.9g}\n",
                (unsigned long long)epoch + 1, loss, acc, test_acc, sps, epoch_s,
                r->meta.global_batch, r->dist.world, gt_precision_name(r->c->precision),
                (double)r->scaler.scale, (long long)r->scaler.skipped,
                (double)gt_train_lr_at(r->c, iteration(r), r->total_steps));
        fflush(r->metrics);
    }
}

/* The banner's tail on where the run starts: ", resumed from FILE after epoch N", with
 * "(restart K)" when a restarted attempt continued its save dir; a restart that found nothing
 * to continue says so. Empty for a fresh first attempt. */
static const char *resume_note(const run *r)
{
    static char note[4400];
    int restart = r->c->dist.restart;
    char tail[32] = "";
    if (restart > 0)
        snprintf(tail, sizeof(tail), " (restart %d)", restart);
    if (r->resumed)
        snprintf(note, sizeof(note), ", resumed from %s after epoch %llu%s", r->resumed,
                 (unsigned long long)r->meta.epoch, r->resumed == r->restart_ckpt ? tail : "");
    else if (restart > 0 && r->c->save_dir)
        snprintf(note, sizeof(note), ", restart %d: no %s yet, starting afresh", restart,
                 r->restart_ckpt);
    else if (restart > 0)
        snprintf(note, sizeof(note), ", restart %d: no --save-dir to continue, starting afresh",
                 restart);
    else
        note[0] = '\0';
    return note;
}

static void banner(const run *r)
{
    const gt_config *c = r->c;
    if (r->dist.rank != 0 || c->quiet)
        return;
    char arch[128], *p = arch, reduce[64] = "", device[32] = "cuda";
    if (!r->gpu)
        snprintf(device, sizeof(device), gt_pool_threads() > 1 ? "cpu (%d threads)" : "cpu",
                 gt_pool_threads());
#ifdef GT_HAVE_CUDA
    /* After the precision: scripts parse "device cuda," (scripts/bench/trainer.sh). */
    if (r->gpu && r->dist.world > 1)
        snprintf(reduce, sizeof(reduce), ", %s", gt_gpu_allreduce_name((gt_gpu *)r->gpu));
#endif
    if (r->model.kind == GT_MODEL_LENET)
        snprintf(arch, sizeof(arch), "lenet (dropout %g)", (double)c->dropout);
    if (r->model.kind == GT_MODEL_RESNET)
        snprintf(arch, sizeof(arch), "resnet (%s)", c->sync_bn ? "SyncBatchNorm" : "BatchNorm");
    for (int l = 0; r->model.kind == GT_MODEL_MLP && l <= r->model.nlayers; l++)
        p += snprintf(p, (size_t)(arch + sizeof(arch) - p), l ? "-%d" : "%d", r->model.sizes[l]);
    printf("gpusync-train: %d rank(s) (%s), device %s, model %s (%zu params), %s lr %g, "
           "global batch %u (%d per rank x %d), %s%s%s\n",
           r->dist.world, c->dist.source, device, arch, r->model.nparams, gt_optim_name(c->optim),
           (double)c->lr, r->meta.global_batch, c->batch_size, r->dist.world,
           gt_precision_name(c->precision), reduce, resume_note(r));
    fflush(stdout);
}

static int dump_params(run *r, gt_err *err)
{
    if (!r->c->dump_params || r->dist.rank != 0)
        return 0;
    FILE *f = fopen(r->c->dump_params, "wb");
    size_t n = r->model.nparams;
    int ok = f && fwrite(r->model.params, sizeof(float), n, f) == n;
    size_t nb = r->model.nbuffers; /* then BatchNorm's running statistics */
    ok = ok && (nb == 0 || fwrite(r->model.buffers, sizeof(float), nb, f) == nb);
    if (f && fclose(f) != 0)
        ok = 0;
    return ok ? 0 : gt_errf(err, "%s: cannot write parameters", r->c->dump_params);
}

static int loop(run *r, gt_err *err)
{
    banner(r);
    for (uint64_t e = r->meta.epoch; e < (uint64_t)r->c->epochs; e++) {
        if (r->c->max_steps > 0 && r->steps >= r->c->max_steps)
            break;
        double t0 = now_s(), stats[3], acc = 0.0;
        int stopped = train_epoch(r, e, stats, err);
        if (stopped < 0)
            return -1;
        if (stopped)
            break;
        double t1 = now_s();
        if (evaluate(r, &acc, err) != 0)
            return -1;
        r->meta.epoch = e + 1;
        int improved = acc > r->meta.best_acc;
        if (improved)
            r->meta.best_acc = acc;
        report(r, e, stats, acc, t1 - t0, now_s() - t0);
        if (sync_to_host(r, err) != 0 || save_checkpoints(r, improved, err) != 0)
            return -1;
    }
    return sync_to_host(r, err) != 0 ? -1 : dump_params(r, err);
}

static void release(run *r)
{
#ifdef GT_HAVE_CUDA
    if (r->gpu)
        gt_gpu_free((gt_gpu *)r->gpu);
#endif
    if (r->metrics)
        fclose(r->metrics);
    free(r->xb);
    free(r->yb);
    free(r->aug);
    free(r->idx);
    free(r->tidx);
    free(r->tpos);
    gt_pool_stop();
    gt_mlp_release(&r->model);
    gt_optim_release(&r->opt);
    gt_dataset_release(&r->train);
    gt_dataset_release(&r->test);
    gt_dist_release(&r->dist);
}

int gt_train_run(const gt_config *c, gt_err *err)
{
    run r;
    memset(&r, 0, sizeof(r));
    r.c = c;
    r.dist.next_fd = r.dist.prev_fd = -1;
    int rc = setup(&r, err);
    if (rc == 0)
        rc = loop(&r, err);
    release(&r);
    if (rc != 0 && err && strncmp(err->msg, "rank ", 5) != 0) {
        char tmp[sizeof(err->msg)];
        snprintf(tmp, sizeof(tmp), "%s", err->msg);
        snprintf(err->msg, sizeof(err->msg), "rank %d: %.480s", c->dist.rank, tmp);
    }
    return rc;
}
