/* model.h: the CPU model: the MLP (Linear -> ReLU -> ... -> Linear) or, with cnn or rn set, the
 * LeNet of lenet.h or the ResNet of resnet.h, with softmax cross-entropy.
 * All parameters live in one flat buffer, layer by layer as PyTorch's nn.Linear stores them
 * (weight (out, in) row-major, then bias (out)), and gradients in a buffer of the same layout,
 * so the all-reduce, the optimiser and the checkpoint each see one array. */
#ifndef GT_MODEL_H
#define GT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gt_err.h"

#define GT_MLP_MAX_LAYERS 8

/* The architectures --model names; the value is stored in checkpoints. */
typedef enum { GT_MODEL_MLP = 0, GT_MODEL_LENET = 1, GT_MODEL_RESNET = 2 } gt_model_kind;

/* --precision: the GEMMs' (and so the convolutions') inputs are rounded to this format, with
 * fp32 accumulation, as tensor-core GEMMs under autocast compute; everything else stays fp32. */
typedef enum { GT_PREC_FP32 = 0, GT_PREC_BF16 = 1, GT_PREC_FP16 = 2 } gt_precision;

struct gt_lenet;
struct gt_resnet;

/* Sums v (n doubles) over all ranks in place (SyncBatchNorm); 0, or -1 with its own message. */
typedef int (*gt_model_reduce_fn)(void *ctx, double *v, size_t n);

typedef struct gt_mlp {
    int nlayers;                      /* Linear layers (hidden + 1) */
    int sizes[GT_MLP_MAX_LAYERS + 1]; /* sizes[0] = input, sizes[nlayers] = classes */
    size_t w_off[GT_MLP_MAX_LAYERS];  /* offset of layer l's weight in params */
    size_t b_off[GT_MLP_MAX_LAYERS];  /* offset of layer l's bias in params */
    size_t nparams;
    float *params; /* (nparams), owned */
    float *grads;  /* (nparams), owned */
    int max_batch;
    float
        *acts[GT_MLP_MAX_LAYERS + 1]; /* acts[l+1]: (B, sizes[l+1]) layer outputs; acts[0] unused */
    float *dacts[GT_MLP_MAX_LAYERS + 1]; /* gradients w.r.t. acts, same shapes */
    gt_model_kind kind;
    struct gt_lenet *cnn; /* the LeNet's layers when kind is GT_MODEL_LENET, owned; the logits
                             are still acts[nlayers] (nlayers 1) so the loss is shared */
    struct gt_resnet *rn; /* the residual network's layers when kind is GT_MODEL_RESNET, owned */
    float *buffers;       /* (nbuffers) BatchNorm running statistics, checkpointed, owned */
    size_t nbuffers;
    gt_model_reduce_fn reduce; /* set: BatchNorm statistics are reduced over ranks (--sync-bn) */
    void *reduce_ctx;
    int failed;              /* a reduce failed during the last pass (its ctx has the message) */
    int training;            /* dropout on and batch statistics (training) or not (evaluation) */
    uint64_t drop_key;       /* this step's dropout key (gt_dropout_key) */
    const int64_t *drop_ids; /* (B) dataset indices of the batch's samples, not owned */
} gt_mlp;

/* Allocates an MLP in -> hidden[0] -> ... -> out for batches up to max_batch, initialised as
 * nn.Linear does (weights and biases uniform in +-1/sqrt(fan_in)) from an mt19937 seeded with
 * seed. Fails on too many layers, a non-positive size or out of memory, leaving *m zeroed. */
int gt_mlp_init(gt_mlp *m, int in, const int *hidden, int nhidden, int out, int max_batch,
                uint64_t seed, gt_err *err);
void gt_mlp_release(gt_mlp *m);

/* Sets dropout for the next forward: training with this step's key and the batch's dataset
 * indices (ids must stay valid until the backward), or evaluation (dropout off). The MLP has no
 * dropout and ignores it. */
void gt_mlp_set_mode(gt_mlp *m, int training, uint64_t key, const int64_t *ids);

/* Forward pass on x (B, in); returns the logits (B, out), owned by m, valid until the next call. */
const float *gt_mlp_forward(gt_mlp *m, const float *x, int B);

/* Mean softmax cross-entropy of the last forward's logits against y. Returns the SUM of
 * per-sample losses (so shards can be added) and adds the number of correct argmax predictions
 * to *correct. When with_grad, leaves d(mean loss)/d(logits) ready for gt_mlp_backward. */
double gt_mlp_loss(gt_mlp *m, const uint8_t *y, int B, int with_grad, int64_t *correct);

/* Backward pass for the last forward on x; overwrites m->grads with d(mean loss)/d(params). */
void gt_mlp_backward(gt_mlp *m, const float *x, int B);

/* Row-major C = op(A) * op(B) with beta 0 (CBLAS when built with it); exposed for tests. */
void gt_gemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
             int ldb, float *C, int ldc);
/* Sets the precision every later gt_gemm / gt_gemm_ex in this process emulates (fp32 by
 * default). Set it before GEMMs run on several threads; each thread rounds into its own scratch. */
void gt_gemm_set_precision(gt_precision p);
/* Frees the calling thread's rounding scratch (a worker thread calls it before it ends). */
void gt_gemm_release_scratch(void);
/* x rounded to nearest-even in p (fp16 overflows to inf, as the hardware conversion does). */
float gt_round_to(gt_precision p, float x);

/* The same with C = op(A) * op(B) + beta * C (beta 0 never reads C). */
void gt_gemm_ex(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);

#endif
