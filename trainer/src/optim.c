/* optim.c: the update loops. Like PyTorch's single-tensor implementations, SGD momentum starts
 * its buffer at the first gradient (not at zero), and Adam divides by
 * sqrt(v)/sqrt(1-beta2^t) + eps with step size lr/(1-beta1^t). */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int gt_optim_parse(const char *name, gt_optim_kind *out)
{
    if (strcmp(name, "sgd") == 0)
        *out = GT_OPTIM_SGD;
    else if (strcmp(name, "adam") == 0)
        *out = GT_OPTIM_ADAM;
    else
        return -1;
    return 0;
}

const char *gt_optim_name(gt_optim_kind kind)
{
    return kind == GT_OPTIM_ADAM ? "adam" : "sgd";
}

int gt_optim_init(gt_optim *o, gt_optim_kind kind, size_t n, float lr, float momentum,
                  float weight_decay, gt_err *err)
{
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->lr = lr;
    o->momentum = momentum;
    o->weight_decay = weight_decay;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8f;
    o->n = n;
    o->m = calloc(n ? n : 1, sizeof(float));
    if (kind == GT_OPTIM_ADAM)
        o->v = calloc(n ? n : 1, sizeof(float));
    if (!o->m || (kind == GT_OPTIM_ADAM && !o->v)) {
        gt_optim_release(o);
        return gt_errf(err, "optimiser: out of memory for %zu parameters", n);
    }
    return 0;
}

void gt_optim_release(gt_optim *o)
{
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
}

size_t gt_optim_state_len(const gt_optim *o)
{
    return o->kind == GT_OPTIM_ADAM ? 2 * o->n : o->n;
}

static void sgd_step(gt_optim *o, float *p, const float *g)
{
    for (size_t i = 0; i < o->n; i++) {
        float d = g[i] + o->weight_decay * p[i];
        if (o->momentum != 0.0f) {
            o->m[i] = o->step == 0 ? d : o->momentum * o->m[i] + d;
            d = o->m[i];
        }
        p[i] -= o->lr * d;
    }
}

/* torch's _single_tensor_adam on f32 tensors: m.lerp_(g, 1-b1) (lerp with weight < 0.5 is
 * m + w*(g-m)), v.mul_(b2).addcmul_(g, g, value=1-b2), denom = sqrt(v)/bc2_sqrt + eps,
 * p.addcdiv_(m, denom, value=-lr/bc1); the scalars are formed in double and cast to float. */
static void adam_step(gt_optim *o, float *p, const float *g)
{
    double t = (double)(o->step + 1);
    float w1 = (float)(1.0 - o->beta1), b2 = (float)o->beta2, w2 = (float)(1.0 - o->beta2);
    float bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, t));
    float neg_step = (float)(-(double)o->lr / (1.0 - pow(o->beta1, t)));
    for (size_t i = 0; i < o->n; i++) {
        float d = g[i] + o->weight_decay * p[i];
        o->m[i] = o->m[i] + w1 * (d - o->m[i]);
        o->v[i] = o->v[i] * b2 + w2 * (d * d);
        float denom = sqrtf(o->v[i]) / bc2_sqrt + o->eps;
        p[i] = p[i] + neg_step * (o->m[i] / denom);
    }
}

void gt_optim_step(gt_optim *o, float *params, const float *grads)
{
    if (o->kind == GT_OPTIM_ADAM)
        adam_step(o, params, grads);
    else
        sgd_step(o, params, grads);
    o->step++;
}
