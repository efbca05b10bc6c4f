/* flags.c: the flag table and its parser. Each entry names its kind and its field in gt_config;
 * anything that needs more than storing a number or string has a small parse function. */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifdef GT_HAVE_CUDA
#include "gpu.h"
#endif

typedef enum { F_INT, F_U64, F_FLOAT, F_STR, F_BOOL, F_FN } flag_kind;

typedef struct flag {
    const char *name;
    const char *metavar; /* NULL for switches */
    flag_kind kind;
    size_t offset; /* into gt_config */
    int (*fn)(gt_config *c, const char *v, gt_err *err);
    const char *help;
} flag;

static int parse_hidden(gt_config *c, const char *v, gt_err *err)
{
    c->nhidden = 0;
    const char *p = v;
    while (*p) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > 1 << 20 || (*end && *end != ','))
            return gt_errf(err, "--hidden %s: expected sizes like 512,256", v);
        if (c->nhidden == GT_MLP_MAX_LAYERS - 1)
            return gt_errf(err, "--hidden %s: at most %d layers", v, GT_MLP_MAX_LAYERS - 1);
        c->hidden[c->nhidden++] = (int)n;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int parse_optim(gt_config *c, const char *v, gt_err *err)
{
    return gt_optim_parse(v, &c->optim) == 0 ? 0 : gt_errf(err, "--optim %s: use sgd or adam", v);
}

static int parse_schedule(gt_config *c, const char *v, gt_err *err)
{
    if (strcmp(v, "cosine") == 0)
        c->cosine = true;
    else if (strcmp(v, "constant") == 0)
        c->cosine = false;
    else
        return gt_errf(err, "--lr-schedule %s: use cosine or constant", v);
    return 0;
}

static int parse_model(gt_config *c, const char *v, gt_err *err)
{
    if (strcmp(v, "mlp") == 0)
        c->model = GT_MODEL_MLP;
    else if (strcmp(v, "lenet") == 0)
        c->model = GT_MODEL_LENET;
    else if (strcmp(v, "resnet") == 0)
        c->model = GT_MODEL_RESNET;
    else
        return gt_errf(err, "--model %s: use mlp, lenet or resnet", v);
    return 0;
}

static int parse_precision(gt_config *c, const char *v, gt_err *err)
{
    if (strcmp(v, "fp32") == 0)
        c->precision = GT_PREC_FP32;
    else if (strcmp(v, "bf16") == 0)
        c->precision = GT_PREC_BF16;
    else if (strcmp(v, "fp16") == 0)
        c->precision = GT_PREC_FP16;
    else
        return gt_errf(err, "--precision %s: use fp32, bf16 or fp16", v);
    return 0;
}

static int parse_device(gt_config *c, const char *v, gt_err *err)
{
    c->device_auto = strcmp(v, "auto") == 0;
    if (strcmp(v, "cpu") == 0)
        c->use_gpu = false;
    else if (strcmp(v, "cuda") == 0 || strcmp(v, "gpu") == 0)
        c->use_gpu = true;
    else if (strcmp(v, "auto") == 0) {
#ifdef GT_HAVE_CUDA
        c->use_gpu = gt_gpu_device_count(NULL) > 0; /* --device cuda says why not */
#else
        c->use_gpu = false;
#endif
    } else
        return gt_errf(err, "--device %s: use cpu, cuda or auto", v);
    return 0;
}

/* --max-steps and --limit-train: a count of at least 1. Leaving the flag out means no limit
 * (stored as 0), so 0 given explicitly, which read as "no limit", is refused with the rest. */
static int parse_count(const char *name, int64_t *out, const char *v, gt_err *err)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < 1)
        return gt_errf(err,
                       "%s %s: use a whole number of at least 1 (leave the flag out for no "
                       "limit)",
                       name, v);
    *out = (int64_t)n;
    return 0;
}

static int parse_max_steps(gt_config *c, const char *v, gt_err *err)
{
    return parse_count("--max-steps", &c->max_steps, v, err);
}

static int parse_limit_train(gt_config *c, const char *v, gt_err *err)
{
    return parse_count("--limit-train", &c->limit_train, v, err);
}

static int parse_master(gt_config *c, const char *v, gt_err *err)
{
    return gt_dist_parse_master(&c->dist, v, err);
}

#define OFF(field) offsetof(gt_config, field)

static const flag FLAGS[] = {
    {"--data", "DIR", F_STR, OFF(data_dir), NULL,
     "MNIST-format directory (train-/t10k- images/labels, .gz or not); default " GT_DEFAULT_DATA},
    {"--model", "mlp|lenet|resnet", F_FN, 0, parse_model,
     "mlp: Linear+ReLU layers of --hidden sizes (default).\n"
     "    lenet: the seeds' MNIST CNN: conv 1->10 k5, max-pool 2, ReLU; conv 10->20 k5, "
     "dropout2d,\n    max-pool 2, ReLU; fc 320->50, ReLU, dropout; fc 50->10 (21,840 params).\n"
     "    resnet: conv 1->16 3x3, BN, ReLU; 3 stages of 2 basic blocks (conv3x3-BN-ReLU-"
     "conv3x3-BN\n    + shortcut, ReLU) of 16, 32, 64 channels, stages 2 and 3 start with "
     "stride 2 and a\n    1x1 conv+BN shortcut (28->14->7); global average pool; fc 64->10 "
     "(174,970 params).\n    All three run on the CPU and on CUDA (--device)"},
    {"--hidden", "N,N,...", F_FN, 0, parse_hidden, "hidden layer sizes of mlp (default 512,256)"},
    {"--precision", "fp32|bf16|fp16", F_FN, 0, parse_precision,
     "GEMM and convolution inputs in bf16 or fp16 with fp32 accumulation and fp32 master "
     "weights (emulated by rounding on the CPU); fp16 adds GradScaler's dynamic loss scaling "
     "(x0.5 and the step skipped on inf/NaN, x2 after 2000 clean steps; skipped steps are "
     "printed). The all-reduce stays fp32 (default fp32)"},
    {"--init-scale", "F", F_FLOAT, OFF(init_scale), NULL,
     "fp16: GradScaler's initial loss scale (default 65536)"},
    {"--augment", NULL, F_BOOL, OFF(augment), NULL,
     "random crop with padding 2 and horizontal flip of training images, from a hash of seed, "
     "epoch and sample (the same on any rank and on resume; CPU only)"},
    {"--sync-bn", NULL, F_BOOL, OFF(sync_bn), NULL,
     "resnet: SyncBatchNorm, batch statistics over all ranks (default: each rank's own)"},
    {"--dropout", "P", F_FLOAT, OFF(dropout), NULL,
     "lenet's dropout and dropout2d probability (default 0.1); masks depend on seed, step and "
     "sample only, so any rank count and --resume draw the same"},
    {"--optim", "sgd|adam", F_FN, 0, parse_optim, "optimiser (default adam; resnet: sgd)"},
    {"--lr", "F", F_FLOAT, OFF(lr), NULL,
     "learning rate, finite and >= 0 (default mlp 0.001, lenet 0.003, resnet 0.1)"},
    {"--lr-schedule", "cosine|constant", F_FN, 0, parse_schedule,
     "cosine decays lr to 0 over the run, per step, as torch's CosineAnnealingLR (default); "
     "a step that fp16 skips still advances it, as PyTorch's loop calls scheduler.step()"},
    {"--momentum", "F", F_FLOAT, OFF(momentum), NULL, "SGD momentum, in [0, 1] (default 0.9)"},
    {"--weight-decay", "F", F_FLOAT, OFF(weight_decay), NULL,
     "L2 weight decay added to the gradient, as torch.optim does; finite and >= 0 (default 0; "
     "resnet 5e-4)"},
    {"--epochs", "N", F_INT, OFF(epochs), NULL,
     "epochs to train (default mlp 10, lenet 20, resnet 30)"},
    {"--batch-size", "N", F_INT, OFF(batch_size), NULL,
     "batch size PER RANK, as in PyTorch (default 64; resnet 128); the global batch is "
     "printed"},
    {"--eval-batch-size", "N", F_INT, OFF(eval_batch_size), NULL,
     "evaluation batch per rank (default 1000)"},
    {"--seed", "N", F_U64, OFF(seed), NULL, "initialisation and shuffling seed (default 0)"},
    {"--drop-last", NULL, F_BOOL, OFF(drop_last), NULL,
     "drop the tail of the training set instead of padding the shards (DistributedSampler)"},
    {"--max-steps", "N", F_FN, 0, parse_max_steps,
     "stop after N >= 1 optimiser steps in total (default: no limit)"},
    {"--limit-train", "N", F_FN, 0, parse_limit_train,
     "use only the first N >= 1 training samples (default: all)"},
    {"--save-dir", "DIR", F_STR, OFF(save_dir), NULL,
     "rank 0 writes DIR/last.ckpt every epoch and DIR/best.ckpt on a new best test accuracy; "
     "a restarted attempt (TORCHELASTIC_RESTART_COUNT >= 1, as torchrun and gpusync run set "
     "it) continues DIR/last.ckpt when there is one"},
    {"--resume", "FILE", F_STR, OFF(resume), NULL,
     "continue bit-exactly from a checkpoint file (read by rank 0, sent to the others); "
     "refused (exit 2) unless --seed, the rank count, --batch-size, --limit-train and "
     "--drop-last are the checkpointed run's"},
    {"--metrics", "FILE", F_STR, OFF(metrics), NULL,
     "rank 0 appends one JSON object per epoch to FILE"},
    {"--dump-params", "FILE", F_STR, OFF(dump_params), NULL,
     "rank 0 writes the final parameters as raw f32 (for tests and comparisons)"},
    {"--device", "cpu|cuda|auto", F_FN, 0, parse_device,
     "where to train (default auto: cuda when built with CUDA and a GPU is visible, except "
     "with --augment); ranks sharing one GPU average gradients over TCP, others with NCCL"},
    {"--threads", "N", F_INT, OFF(threads), NULL,
     "CPU threads of lenet and resnet, each taking whole samples of a batch (default: "
     "OPENBLAS_NUM_THREADS or OMP_NUM_THREADS, else this process's CPUs / LOCAL_WORLD_SIZE); "
     "mlp uses the BLAS's own threads"},
    {"--rank", "N", F_INT, OFF(dist.rank), NULL,
     "this process's rank (default: RANK or SLURM_PROCID)"},
    {"--world-size", "N", F_INT, OFF(dist.world), NULL,
     "number of ranks (default: WORLD_SIZE or SLURM_NTASKS, else 1)"},
    {"--local-rank", "N", F_INT, OFF(dist.local_rank), NULL,
     "GPU index on this host (default: LOCAL_RANK or SLURM_LOCALID)"},
    {"--master", "tcp://HOST:PORT", F_FN, 0, parse_master,
     "rank 0's rendezvous address (default: MASTER_ADDR:MASTER_PORT, else 127.0.0.1:29500)"},
    {"--rdzv-timeout", "S", F_INT, OFF(dist.rdzv_timeout_s), NULL,
     "seconds to wait for all ranks to join (default 60)"},
    {"--timeout", "S", F_INT, OFF(dist.timeout_s), NULL,
     "seconds any collective waits for a peer before failing (default 300)"},
    {"--quiet", NULL, F_BOOL, OFF(quiet), NULL, "print nothing but errors"},
    {"--help", NULL, F_BOOL, 0, NULL, "show this help"},
};

#define NFLAGS (sizeof(FLAGS) / sizeof(FLAGS[0]))

void gt_flags_usage(FILE *out)
{
    fprintf(out, "usage: gpusync-train [flags]\n"
                 "Data-parallel MLP, LeNet or ResNet training on MNIST-format data (default "
                 "Fashion-MNIST).\n"
                 "Ranks come from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                 "MASTER_PORT),\nSlurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or the flags "
                 "below.\n\n");
    for (size_t i = 0; i < NFLAGS; i++) {
        char left[64];
        snprintf(left, sizeof(left), "%s%s%s", FLAGS[i].name, FLAGS[i].metavar ? " " : "",
                 FLAGS[i].metavar ? FLAGS[i].metavar : "");
        fprintf(out, "  %-30s %s\n", left, FLAGS[i].help);
    }
}

static int store(gt_config *c, const flag *f, const char *v, gt_err *err)
{
    char *base = (char *)c + f->offset, *end = NULL;
    errno = 0;
    switch (f->kind) {
    case F_INT: {
        long n = strtol(v, &end, 10);
        if (n < 0 || n > 1 << 30)
            errno = ERANGE;
        *(int *)base = (int)n;
        break;
    }
    case F_U64:
        *(uint64_t *)base = strtoull(v, &end, 10);
        break;
    case F_FLOAT:
        *(float *)base = strtof(v, &end);
        break;
    case F_STR:
        *(const char **)base = v;
        return 0;
    case F_FN:
        return f->fn(c, v, err);
    case F_BOOL:
        break;
    }
    if (errno || !end || end == v || *end)
        return gt_errf(err, "%s %s: not a valid number", f->name, v);
    return 0;
}

static const flag *lookup(const char *name)
{
    for (size_t i = 0; i < NFLAGS; i++)
        if (strcmp(FLAGS[i].name, name) == 0)
            return &FLAGS[i];
    return NULL;
}

static int parse_all(gt_config *c, int argc, char **argv, gt_err *err)
{
    for (int i = 0; i < argc; i++) {
        char name[64];
        const char *eq = strchr(argv[i], '='), *val = NULL;
        size_t len = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
        snprintf(name, sizeof(name), "%.*s", (int)len, argv[i]);
        const flag *f = lookup(name);
        if (!f)
            return gt_errf(err, "unknown flag %s (see --help)", argv[i]);
        if (strcmp(f->name, "--help") == 0)
            return 1;
        if (f->kind == F_BOOL) {
            *(bool *)((char *)c + f->offset) = true;
            continue;
        }
        val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val)
            return gt_errf(err, "%s needs a value (%s)", f->name, f->metavar);
        if (store(c, f, val, err) != 0)
            return -1;
        if (strncmp(f->name, "--rank", 6) == 0 || strcmp(f->name, "--world-size") == 0 ||
            strcmp(f->name, "--master") == 0)
            c->dist.source = "flags";
    }
    return 0;
}

/* The optimiser's numbers, refused where torch.optim refuses them ("Invalid learning rate"):
 * NaN, infinite or negative (a sign typo trains by gradient ascent); momentum also above 1,
 * where the velocity grows without bound. */
static int check_optimiser(const gt_config *c, gt_err *err)
{
    if (!(c->lr >= 0.0f) || isinf(c->lr))
        return gt_errf(err, "--lr %g: use a finite learning rate >= 0", (double)c->lr);
    if (!(c->momentum >= 0.0f && c->momentum <= 1.0f))
        return gt_errf(err, "--momentum %g: use a value in [0, 1]", (double)c->momentum);
    if (!(c->weight_decay >= 0.0f) || isinf(c->weight_decay))
        return gt_errf(err, "--weight-decay %g: use a finite decay >= 0", (double)c->weight_decay);
    return 0;
}

int gt_flags_parse(gt_config *c, int argc, char **argv, gt_err *err)
{
    /* Twice: the first pass finds --model, whose defaults then yield to the flags given. */
    gt_model_kind before = c->model;
    int rc = parse_all(c, argc, argv, err);
    if (rc != 0)
        return rc;
    if (c->model != before) {
        gt_config_model_defaults(c);
        parse_all(c, argc, argv, err);
    }
    if (!(c->init_scale > 0.0f) || isinf(c->init_scale))
        return gt_errf(err, "--init-scale %g: use a positive finite scale", (double)c->init_scale);
    if (c->device_auto && c->augment)
        c->use_gpu = false; /* auto picks the CPU for what the GPU path lacks */
    if (check_optimiser(c, err) != 0)
        return -1;
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return gt_errf(err, "--dropout %g: use a probability in [0, 1)", (double)c->dropout);
    if (c->epochs < 1 || c->batch_size < 1 || c->eval_batch_size < 1)
        return gt_errf(err, "--epochs, --batch-size and --eval-batch-size must be at least 1");
    if (c->dist.world < 1 || c->dist.rank >= c->dist.world)
        return gt_errf(err, "--rank %d is outside --world-size %d", c->dist.rank, c->dist.world);
    return 0;
}
