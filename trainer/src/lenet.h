/* lenet.h: the seeds' LeNet (PyTorch's MNIST example) on the CPU:
 *   conv 1->10 k5, max-pool 2, ReLU; conv 10->20 k5, dropout2d, max-pool 2, ReLU;
 *   flatten (320 for 28x28), fc 320->50, ReLU, dropout; fc 50->classes.
 * Both dropouts use p = --dropout (0.5, the seeds'). Parameters sit in the gt_mlp's flat buffer
 * in nn.Module order (conv1.weight (10,1,5,5), conv1.bias, conv2.weight (20,10,5,5),
 * conv2.bias, fc1.weight (50,320), fc1.bias, fc2.weight (classes,50), fc2.bias), initialised as
 * PyTorch's defaults (uniform +-1/sqrt(fan_in) for weights and biases), so the all-reduce, the
 * optimiser and checkpoints work unchanged. gt_mlp_forward/backward dispatch here. */
#ifndef GT_LENET_H
#define GT_LENET_H

#include <stdint.h>

#include "gt_err.h"
#include "layers.h"
#include "model.h"

enum { GT_LENET_NPARAM_BLOCKS = 8 };

typedef struct gt_lenet {
    gt_conv2d conv1, conv2;
    int pool1, pool2;                   /* side of the pooled maps (12 and 4 for 28x28) */
    int flat, hidden;                   /* 320 and 50 for 28x28 */
    float dropout;                      /* p of both dropouts */
    size_t off[GT_LENET_NPARAM_BLOCKS]; /* each weight and bias block's offset in params */
    float *c1, *p1;                     /* (B,10,24,24) conv1 out; (B,10,12,12) pooled and ReLU'd */
    float *c2, *p2;       /* (B,20,8,8) conv2 out (dropped); (B,320) pooled and ReLU'd */
    float *h;             /* (B,50) fc1 out, ReLU'd and dropped */
    int32_t *arg1, *arg2; /* pooling argmaxes, shaped as p1 and p2 */
    float *mask2, *mask3; /* (B,20) dropout2d and (B,50) dropout masks */
    float *dc1, *dp1, *dc2, *dp2, *dh; /* gradients, shaped as their activations */
    float *col;                        /* im2col scratch for the larger of the two convolutions */
} gt_lenet;

/* Makes m a LeNet for square images of dim pixels (side >= 16) and out classes, for batches up
 * to max_batch, dropout p in [0, 1). Fails on a non-square or too small image, a bad p or out of
 * memory, leaving *m zeroed. Release with gt_mlp_release. */
int gt_lenet_init(gt_mlp *m, int dim, int out, int max_batch, uint64_t seed, float dropout,
                  gt_err *err);
void gt_lenet_free(gt_lenet *n);

/* The forward and backward passes behind gt_mlp_forward / gt_mlp_backward. */
const float *gt_lenet_forward(gt_mlp *m, const float *x, int B);
void gt_lenet_backward(gt_mlp *m, const float *x, int B);

#endif
