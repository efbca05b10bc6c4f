/* lenet.c: LeNet forward and backward from layers.c's pieces; shapes on every buffer. The logits
 * live in m->acts[1] and their gradient in m->dacts[1], where gt_mlp_loss reads and writes. */
#include "lenet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

static int geometry(gt_lenet *n, int dim, float dropout, gt_err *err)
{
    int side = (int)lround(sqrt((double)dim));
    if (side * side != dim || side < 16)
        return gt_errf(err,
                       "--model lenet: images of %d pixels; it needs square images of at "
                       "least 16x16 (28x28 as MNIST)",
                       dim);
    if (!(dropout >= 0.0f && dropout < 1.0f))
        return gt_errf(err, "--dropout %g: use a probability in [0, 1)", (double)dropout);
    gt_conv2d_init(&n->conv1, 1, side, side, 10, 5, 1, 0);
    n->pool1 = n->conv1.OH / 2;
    gt_conv2d_init(&n->conv2, 10, n->pool1, n->pool1, 20, 5, 1, 0);
    n->pool2 = n->conv2.OH / 2;
    n->flat = 20 * n->pool2 * n->pool2;
    n->hidden = 50;
    n->dropout = dropout;
    return 0;
}

static void layout(gt_mlp *m, gt_lenet *n, int out)
{
    size_t sizes[GT_LENET_NPARAM_BLOCKS] = {
        10 * 25, 10, 20 * 10 * 25, 20, (size_t)50 * n->flat, 50, (size_t)out * 50, (size_t)out};
    m->nparams = 0;
    for (int i = 0; i < GT_LENET_NPARAM_BLOCKS; i++) {
        n->off[i] = m->nparams;
        m->nparams += sizes[i];
    }
}

/* Weights and biases of each layer uniform in +-1/sqrt(fan_in), nn.Conv2d's and nn.Linear's
 * default (kaiming_uniform with a = sqrt(5)). */
static void init_params(gt_mlp *m, const gt_lenet *n, uint64_t seed)
{
    const int fan_in[4] = {25, 250, n->flat, 50};
    gt_mt19937 mt;
    gt_mt_seed(&mt, seed);
    for (int l = 0; l < 4; l++) {
        float bound = 1.0f / sqrtf((float)fan_in[l]);
        size_t end = l + 1 < 4 ? n->off[2 * l + 2] : m->nparams;
        for (size_t i = n->off[2 * l]; i < end; i++)
            m->params[i] = (2.0f * gt_mt_uniform(&mt) - 1.0f) * bound;
    }
}

static int alloc_buffers(gt_mlp *m, gt_lenet *n, int B)
{
    size_t c1 = (size_t)B * 10 * n->conv1.OH * n->conv1.OW,
           p1 = (size_t)B * 10 * n->pool1 * n->pool1;
    size_t c2 = (size_t)B * 20 * n->conv2.OH * n->conv2.OW, p2 = (size_t)B * n->flat;
    size_t h = (size_t)B * n->hidden, col1 = gt_conv2d_col_len(&n->conv1);
    size_t col2 = gt_conv2d_col_len(&n->conv2);
    n->c1 = malloc(c1 * sizeof(float));
    n->p1 = malloc(p1 * sizeof(float));
    n->c2 = malloc(c2 * sizeof(float));
    n->p2 = malloc(p2 * sizeof(float));
    n->h = malloc(h * sizeof(float));
    n->arg1 = malloc(p1 * sizeof(int32_t));
    n->arg2 = malloc(p2 * sizeof(int32_t));
    n->mask2 = malloc((size_t)B * 20 * sizeof(float));
    n->mask3 = malloc(h * sizeof(float));
    n->dc1 = malloc(c1 * sizeof(float));
    n->dp1 = malloc(p1 * sizeof(float));
    n->dc2 = malloc(c2 * sizeof(float));
    n->dp2 = malloc(p2 * sizeof(float));
    n->dh = malloc(h * sizeof(float));
    n->col = malloc((col1 > col2 ? col1 : col2) * sizeof(float));
    m->params = malloc(m->nparams * sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    m->acts[1] = malloc((size_t)B * m->sizes[1] * sizeof(float));
    m->dacts[1] = malloc((size_t)B * m->sizes[1] * sizeof(float));
    return n->c1 && n->p1 && n->c2 && n->p2 && n->h && n->arg1 && n->arg2 && n->mask2 && n->mask3 &&
                   n->dc1 && n->dp1 && n->dc2 && n->dp2 && n->dh && n->col && m->params &&
                   m->grads && m->acts[1] && m->dacts[1]
               ? 0
               : -1;
}

int gt_lenet_init(gt_mlp *m, int dim, int out, int max_batch, uint64_t seed, float dropout,
                  gt_err *err)
{
    memset(m, 0, sizeof(*m));
    if (max_batch < 1 || out < 1)
        return gt_errf(err, "model: batch size %d, %d classes", max_batch, out);
    gt_lenet *n = calloc(1, sizeof(*n));
    if (!n)
        return gt_errf(err, "model: out of memory");
    m->cnn = n;
    m->kind = GT_MODEL_LENET;
    if (geometry(n, dim, dropout, err) != 0) {
        gt_mlp_release(m);
        return -1;
    }
    m->nlayers = 1; /* the loss and the checkpoint header see in -> classes */
    m->sizes[0] = dim;
    m->sizes[1] = out;
    m->max_batch = max_batch;
    layout(m, n, out);
    if (alloc_buffers(m, n, max_batch) != 0) {
        gt_mlp_release(m);
        return gt_errf(err, "model: out of memory for the LeNet's buffers (batch %d)", max_batch);
    }
    init_params(m, n, seed);
    return 0;
}

void gt_lenet_free(gt_lenet *n)
{
    if (!n)
        return;
    float *bufs[] = {n->c1,  n->p1,  n->c2,  n->p2,  n->h,  n->mask2, n->mask3,
                     n->dc1, n->dp1, n->dc2, n->dp2, n->dh, n->col};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(n->arg1);
    free(n->arg2);
    free(n);
}

static int dropping(const gt_mlp *m)
{
    return m->training && m->cnn->dropout > 0.0f;
}

const float *gt_lenet_forward(gt_mlp *m, const float *x, int B)
{
    gt_lenet *n = m->cnn;
    const float *P = m->params;
    int plane2 = n->conv2.OH * n->conv2.OW;
    gt_conv2d_forward(&n->conv1, B, x, P + n->off[0], P + n->off[1], n->c1, n->col);
    gt_maxpool2d_forward(B * 10, n->conv1.OH, n->conv1.OW, 2, 2, n->c1, n->p1, n->arg1);
    gt_relu(n->p1, (size_t)B * 10 * n->pool1 * n->pool1);
    gt_conv2d_forward(&n->conv2, B, n->p1, P + n->off[2], P + n->off[3], n->c2, n->col);
    if (dropping(m)) {
        gt_dropout_mask(n->mask2, B, 20, n->dropout, gt_dropout_key(m->drop_key, 0, 2),
                        m->drop_ids);
        gt_dropout_apply(n->c2, n->mask2, B, 20, plane2);
    }
    gt_maxpool2d_forward(B * 20, n->conv2.OH, n->conv2.OW, 2, 2, n->c2, n->p2, n->arg2);
    gt_relu(n->p2, (size_t)B * n->flat);
    gt_linear_forward(n->p2, B, n->flat, n->hidden, P + n->off[4], P + n->off[5], n->h);
    gt_relu(n->h, (size_t)B * n->hidden);
    if (dropping(m)) {
        /* Each layer derives its own key: the two masks must not be correlated. */
        gt_dropout_mask(n->mask3, B, n->hidden, n->dropout, gt_dropout_key(m->drop_key, 0, 3),
                        m->drop_ids);
        gt_dropout_apply(n->h, n->mask3, B, n->hidden, 1);
    }
    gt_linear_forward(n->h, B, n->hidden, m->sizes[1], P + n->off[6], P + n->off[7], m->acts[1]);
    return m->acts[1];
}

void gt_lenet_backward(gt_mlp *m, const float *x, int B)
{
    gt_lenet *n = m->cnn;
    const float *P = m->params;
    float *G = m->grads;
    int plane2 = n->conv2.OH * n->conv2.OW;
    gt_linear_backward(n->h, m->dacts[1], B, n->hidden, m->sizes[1], P + n->off[6], G + n->off[6],
                       G + n->off[7], n->dh);
    if (dropping(m))
        gt_dropout_apply(n->dh, n->mask3, B, n->hidden, 1);
    gt_relu_backward(n->dh, n->h, (size_t)B * n->hidden);
    gt_linear_backward(n->p2, n->dh, B, n->flat, n->hidden, P + n->off[4], G + n->off[4],
                       G + n->off[5], n->dp2);
    gt_relu_backward(n->dp2, n->p2, (size_t)B * n->flat);
    gt_maxpool2d_backward(B * 20, n->conv2.OH, n->conv2.OW, 2, 2, n->dp2, n->arg2, n->dc2);
    if (dropping(m))
        gt_dropout_apply(n->dc2, n->mask2, B, 20, plane2);
    gt_conv2d_backward(&n->conv2, B, n->p1, P + n->off[2], n->dc2, G + n->off[2], G + n->off[3],
                       n->dp1, n->col);
    gt_relu_backward(n->dp1, n->p1, (size_t)B * 10 * n->pool1 * n->pool1);
    gt_maxpool2d_backward(B * 10, n->conv1.OH, n->conv1.OW, 2, 2, n->dp1, n->arg1, n->dc1);
    gt_conv2d_backward(&n->conv1, B, x, P + n->off[0], n->dc1, G + n->off[0], G + n->off[1], NULL,
                       n->col);
}
