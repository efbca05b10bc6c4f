/* optim.h: SGD (with momentum) and Adam over one flat parameter buffer, with the exact update
 * rules of torch.optim.SGD (dampening 0, no Nesterov) and torch.optim.Adam (L2 weight decay added
 * to the gradient, bias-corrected step), so a run matches its PyTorch twin step for step. */
#ifndef GT_OPTIM_H
#define GT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "gt_err.h"

typedef enum gt_optim_kind { GT_OPTIM_SGD = 0, GT_OPTIM_ADAM = 1 } gt_optim_kind;

typedef struct gt_optim {
    gt_optim_kind kind;
    float lr, momentum, weight_decay, eps;
    double beta1, beta2; /* Python floats in torch: 1 - beta is formed in double, then cast */
    size_t n;
    int64_t step; /* updates taken so far (Adam's t) */
    float *m;     /* (n) SGD momentum buffer or Adam first moment, owned */
    float *v;     /* (n) Adam second moment, owned; NULL for SGD */
} gt_optim;

/* Parses "sgd" or "adam"; returns -1 on anything else. */
int gt_optim_parse(const char *name, gt_optim_kind *out);
const char *gt_optim_name(gt_optim_kind kind);

/* Allocates zeroed state for n parameters (Adam: betas 0.9/0.999, eps 1e-8). Fails on out of
 * memory, leaving *o zeroed. */
int gt_optim_init(gt_optim *o, gt_optim_kind kind, size_t n, float lr, float momentum,
                  float weight_decay, gt_err *err);
void gt_optim_release(gt_optim *o);

/* One update of params in place from grads (grads are not modified). */
void gt_optim_step(gt_optim *o, float *params, const float *grads);

/* Number of state floats (n for SGD, 2n for Adam) — what a checkpoint stores. */
size_t gt_optim_state_len(const gt_optim *o);

#endif
