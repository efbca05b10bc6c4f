/* resnet.h: a small residual network for 28x28 inputs (ResNet-14 in the CIFAR style), on the CPU:
 *   stem: conv 1->16 3x3 pad 1, BatchNorm, ReLU;
 *   stage 1: 2 basic blocks of 16 channels (28x28);
 *   stage 2: 2 basic blocks of 32 channels, the first with stride 2 (14x14);
 *   stage 3: 2 basic blocks of 64 channels, the first with stride 2 (7x7);
 *   global average pooling, fc 64->classes.
 * A basic block is conv 3x3 (stride s) -> BN -> ReLU -> conv 3x3 -> BN, plus the shortcut (the
 * input, or conv 1x1 stride s -> BN where the shape changes), then ReLU. Convolutions have no
 * bias. 174,970 parameters for 10 classes; 1,120 buffer floats (running mean and variance of
 * the 14 BatchNorms, kept in m->buffers and checkpointed after the parameters).
 * Initialisation is PyTorch's default: convolutions and the head uniform +-1/sqrt(fan_in),
 * BatchNorm weight 1 and bias 0, running mean 0 and variance 1. With m->reduce set, every
 * BatchNorm is a SyncBatchNorm. */
#ifndef GT_RESNET_H
#define GT_RESNET_H

#include <stdint.h>

#include "gt_err.h"
#include "layers.h"
#include "model.h"

#define GT_RESNET_BLOCKS 6

typedef struct gt_rn_bn {
    int C;
    size_t gamma, beta;   /* parameter offsets */
    size_t rmean, rvar;   /* buffer offsets */
    float *mean, *invstd; /* (C) the last training forward's batch statistics */
} gt_rn_bn;

typedef struct gt_rn_block {
    int cin, cout, side_in, side; /* side: the block's output side */
    int down;                     /* a 1x1 conv + BN shortcut (stride or width change) */
    gt_conv2d c1, c2, cs;
    size_t w1, w2, ws; /* conv weight offsets */
    gt_rn_bn b1, b2, bs;
    float *a1, *r1, *a2, *n2, *as, *ns; /* (B, cout, side, side) each */
    float *out;                         /* (B, cout, side, side) relu(n2 + shortcut) */
    float *dout;                        /* gradient w.r.t. out */
} gt_rn_block;

typedef struct gt_resnet {
    int side;
    gt_conv2d stem;
    size_t stem_w;
    gt_rn_bn stem_bn;
    float *s_a, *s_out, *s_dout; /* (B, 16, side, side) stem conv out, ReLU'd BN out, grad */
    gt_rn_block blk[GT_RESNET_BLOCKS];
    float *pooled, *dpooled; /* (B, 64) */
    size_t fc_w, fc_b;
    float *t1, *t2, *t3; /* gradient scratch, the largest activation each */
    float *col;          /* im2col scratch, the largest convolution */
    float *arena;        /* owns every buffer above */
} gt_resnet;

/* Makes m the residual network for square images of dim pixels (side >= 8) and out classes, for
 * batches up to max_batch. Fails on a non-square or too small image or out of memory, leaving *m
 * zeroed. Release with gt_mlp_release. */
int gt_resnet_init(gt_mlp *m, int dim, int out, int max_batch, uint64_t seed, gt_err *err);
void gt_resnet_free(gt_resnet *n);

/* The most BatchNorms the network has: the stem's, then each block's two and its shortcut's. */
#define GT_RESNET_MAX_BNS (1 + 3 * GT_RESNET_BLOCKS)

/* Puts n's BatchNorms in out in nn.Module order (the stem's, then each block's bn1, bn2 and
 * shortcut BN), which is also the order of their statistics in m->buffers; returns how many. */
int gt_resnet_bns(gt_resnet *n, gt_rn_bn **out);

/* Points n's activation buffers (for batches up to B) into base, in a fixed order, and returns
 * the floats they take; base NULL only counts. The CUDA path carves device memory this way
 * (base is only offset, never read), so both paths share one buffer plan. n's geometry must be
 * laid out already (a copy of an initialised model's gt_resnet). */
size_t gt_resnet_carve(gt_resnet *n, float *base, int B);

/* The passes behind gt_mlp_forward / gt_mlp_backward; a failed SyncBatchNorm reduction sets
 * m->failed (the reduce function holds the message). */
const float *gt_resnet_forward(gt_mlp *m, const float *x, int B);
void gt_resnet_backward(gt_mlp *m, const float *x, int B);

#endif
