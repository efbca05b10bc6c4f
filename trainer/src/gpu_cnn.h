/* gpu_cnn.h: the LeNet and the ResNet on one GPU (gpu_cnn.cu), for gpu_model.cu. Each pass is
 * lenet.c's or resnet.c's, call for call, with gpu_layers.h in place of layers.h: the geometry
 * and the parameter offsets are copied from the CPU model, the activations live in device
 * buffers of the same shapes (the ResNet's carved by gt_resnet_carve), and the BatchNorm running
 * statistics sit in a device copy of the model's buffers. Parameters and gradients are the
 * caller's device arrays in the CPU's flat layout. Functions return 0, or -1 with err filled.
 * Built only with CUDA. */
#ifndef GT_GPU_CNN_H
#define GT_GPU_CNN_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_layers.h"
#include "gt_err.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_gpu_cnn gt_gpu_cnn;

/* Device buffers for m's LeNet or ResNet, for batches up to m->max_batch, launching on l (kept,
 * not owned); uploads m->buffers. m->reduce, when set, makes every BatchNorm a SyncBatchNorm
 * (called from the host; see gt_gl_bn_forward_train). On failure *out is NULL. */
int gt_gpu_cnn_init(gt_gpu_cnn **out, const gt_mlp *m, gt_gl *l, gt_err *err);
void gt_gpu_cnn_free(gt_gpu_cnn *c);
/* The largest batch one pass takes. */
int gt_gpu_cnn_capacity(const gt_gpu_cnn *c);

/* Forward of x (B, dim) into logits (B, classes). training: dropout with key (the step's
 * gt_dropout_key(seed, step, 0)) and ids (B device dataset indices), BatchNorm on batch
 * statistics (moving the running ones); else evaluation. */
int gt_gpu_cnn_forward(gt_gpu_cnn *c, const float *params, const float *x, int B, int training,
                       uint64_t key, const int64_t *ids, float *logits, gt_err *err);
/* Backward of the last (training) forward on x from dlogits (B, classes); overwrites grads. */
int gt_gpu_cnn_backward(gt_gpu_cnn *c, const float *params, float *grads, const float *x, int B,
                        const float *dlogits, gt_err *err);

/* The device running statistics (nbuffers floats; NULL for the LeNet), for download and the
 * broadcast of rank 0's copy. */
float *gt_gpu_cnn_buffers(gt_gpu_cnn *c, size_t *nbuffers);

#ifdef __cplusplus
}
#endif

#endif
