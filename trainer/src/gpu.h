/* gpu.h: the CUDA path's C interface (implemented in gpu_model.cu). Both datasets are uploaded
 * once; each epoch uploads this rank's index shard once, and each step names a slice of it, so
 * a step moves no data from the host. A step gathers its rows on the device, runs the model
 * (MLP, LeNet or ResNet) with cuBLAS GEMMs in --precision (fp32 without TF32 as PyTorch's
 * default; bf16/fp16 inputs with fp32 accumulation) and gpu_layers.h's kernels, averages
 * gradients with NCCL on its own stream (nccl_comm.h) or, when ranks share a GPU, over the TCP
 * ring, and applies the optimiser in a kernel with the CPU path's exact formulas.
 * Parameters use the CPU model's flat layout, so checkpoints are shared between the two paths.
 * Every function returns 0, or -1 with a message naming the rank, file and line of the failing
 * CUDA/cuBLAS/NCCL call. Only built when GT_HAVE_CUDA is defined. */
#ifndef GT_GPU_H
#define GT_GPU_H

#include <stdint.h>

#include "dist.h"
#include "gt_err.h"
#include "idx.h"
#include "model.h"
#include "optim.h"
#include "scaler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_gpu gt_gpu;

/* Number of visible CUDA devices (0 when there is no driver or no device). When it is 0 and why
 * is not NULL, *why is CUDA's reason (no device; a driver older than this build's CUDA; ...). */
int gt_gpu_device_count(const char **why);

/* Selects device dist->local_rank (an error when that many devices are not visible), uploads
 * m's parameters (and BatchNorm statistics), o's state and both datasets (test may be NULL),
 * and picks the all-reduce: NCCL, or dist's TCP ring when two ranks share one GPU or any rank
 * has GT_GPU_ALLREDUCE=tcp (collective: every rank calls it). max_batch bounds B in the calls
 * below; a LeNet or ResNet also takes training batches of at most m->max_batch and evaluates
 * in chunks of it. m->reduce set makes the ResNet's BatchNorms SyncBatchNorms through it. dist
 * must outlive the result. On failure *out is NULL and nothing stays allocated. The caller owns
 * the result (gt_gpu_free). */
int gt_gpu_init(gt_gpu **out, const gt_mlp *m, const gt_optim *o, const gt_dataset *train,
                const gt_dataset *test, int max_batch, gt_precision prec, gt_dist *dist,
                gt_err *err);
void gt_gpu_free(gt_gpu *g);

/* Uploads n dataset indices (the train or test shard) that later calls address by offset. */
int gt_gpu_set_indices(gt_gpu *g, int test, const int64_t *idx, int64_t n, gt_err *err);

/* What one training step needs to know. */
typedef struct gt_gpu_step {
    int64_t off; /* rows idx[off .. off+B) of the uploaded training shard */
    int B;
    float lr;
    uint64_t drop_key; /* gt_dropout_key(seed, step, 0), as the CPU step's */
    gt_scaler *scaler; /* fp16's loss scaler (host state, updated here), or NULL */
} gt_gpu_step;

/* One step: forward, backward, average over ranks, optimiser update. With a scaler the loss is
 * scaled, and a step whose averaged gradients hold an inf or NaN is skipped (*applied 0).
 * Loss sum and correct count accumulate on the device until gt_gpu_take_stats. */
int gt_gpu_train_step(gt_gpu *g, const gt_gpu_step *s, int *applied, gt_err *err);
/* Forward on test rows idx[off .. off+count) of the uploaded test shard (count real rows). */
int gt_gpu_eval_batch(gt_gpu *g, int64_t off, int count, gt_err *err);
/* Copies and zeroes the accumulated [loss sum, correct, samples]; stats[3]. */
int gt_gpu_take_stats(gt_gpu *g, double *stats, gt_err *err);

/* Forward + backward only on training rows idx[off .. off+B) (no all-reduce, no update):
 * copies the gradient (nparams floats) into grads and returns the loss sum in *loss. For
 * comparing against the CPU path. */
int gt_gpu_grads(gt_gpu *g, int64_t off, int B, uint64_t drop_key, float *grads, double *loss,
                 gt_err *err);

/* Copies parameters, BatchNorm statistics and optimiser state (incl. its step count) back into
 * m and o. */
int gt_gpu_download(gt_gpu *g, gt_mlp *m, gt_optim *o, gt_err *err);

/* "NCCL all-reduce", "TCP all-reduce" or "one rank": how this rank averages gradients. */
const char *gt_gpu_allreduce_name(const gt_gpu *g);

#ifdef __cplusplus
}
#endif

#endif
