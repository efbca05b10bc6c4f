/* gpu_cnn.cu: see gpu_cnn.h. The functions below follow lenet.c and resnet.c line for line, so
 * a difference between the two paths is a difference of one layer, which test_gpu checks layer
 * by layer. The CPU structs are copied by value for their geometry and offsets; their buffer
 * pointers are then replaced by device ones (never the CPU's). */
extern "C" {
#include "gt_err.h"
#include "layers.h"
#include "lenet.h"
#include "model.h"
#include "resnet.h"
}
#include "gpu_check.h"
#include "gpu_cnn.h"
#include "gpu_layers.h"

#include <stdlib.h>
#include <string.h>

struct gt_gpu_cnn {
    gt_model_kind kind;
    gt_gl *l;
    int cap, classes;
    gt_lenet ln;    /* LeNet geometry, device buffers */
    gt_resnet rn;   /* ResNet geometry, device buffers carved from rn.arena */
    float *scratch; /* convolution scratch for the largest convolution at cap */
    float *buffers; /* (nbuffers) running statistics */
    size_t nbuffers;
    int dropped;         /* the last forward applied dropout (its backward must too) */
    gt_reduce_fn reduce; /* SyncBatchNorm's host reduction, or NULL */
    void *reduce_ctx;
};

static size_t conv_scratch(const gt_conv2d *s, int B, size_t best)
{
    size_t n = gt_gl_conv2d_scratch_len(s, B);
    return n > best ? n : best;
}

/* ---- LeNet --------------------------------------------------------------------------------- */

static int lenet_alloc(gt_gpu_cnn *c, gt_err *err)
{
    int rank = c->l->rank, B = c->cap;
    gt_lenet *n = &c->ln;
    size_t c1 = (size_t)B * 10 * n->conv1.OH * n->conv1.OW,
           p1 = (size_t)B * 10 * n->pool1 * n->pool1;
    size_t c2 = (size_t)B * 20 * n->conv2.OH * n->conv2.OW, p2 = (size_t)B * n->flat;
    size_t h = (size_t)B * n->hidden;
    struct {
        float **p;
        size_t len;
    } f[] = {{&n->c1, c1},  {&n->p1, p1},  {&n->c2, c2},   {&n->p2, p2},
             {&n->h, h},    {&n->dc1, c1}, {&n->dp1, p1},  {&n->dc2, c2},
             {&n->dp2, p2}, {&n->dh, h},   {&n->mask3, h}, {&n->mask2, (size_t)B * 20}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        *f[i].p = NULL; /* the CPU's pointers were copied in: never free those */
    n->arg1 = n->arg2 = NULL;
    n->col = NULL;
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        CUDA_CHECK(cudaMalloc(f[i].p, f[i].len * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&n->arg1, p1 * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&n->arg2, p2 * sizeof(int32_t)));
    size_t sc = conv_scratch(&n->conv2, B, conv_scratch(&n->conv1, B, 0));
    CUDA_CHECK(cudaMalloc(&c->scratch, sc * sizeof(float)));
    return 0;
}

static void lenet_free(gt_lenet *n)
{
    float *bufs[] = {n->c1,    n->p1,  n->c2,  n->p2,  n->h,   n->mask2,
                     n->mask3, n->dc1, n->dp1, n->dc2, n->dp2, n->dh};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        cudaFree(bufs[i]);
    cudaFree(n->arg1);
    cudaFree(n->arg2);
}

static int lenet_forward(gt_gpu_cnn *c, const float *P, const float *x, int B, int training,
                         uint64_t key, const int64_t *ids, float *logits, gt_err *err)
{
    gt_lenet *n = &c->ln;
    gt_gl *l = c->l;
    int plane2 = n->conv2.OH * n->conv2.OW;
    c->dropped = training && n->dropout > 0.0f;
    /* Each ReLU is fused into the pool or linear layer before it (see gpu_layers.h). */
    if (gt_gl_conv2d_forward(l, &n->conv1, B, x, P + n->off[0], P + n->off[1], n->c1, c->scratch,
                             err) != 0 ||
        gt_gl_maxpool2d_forward(l, B * 10, n->conv1.OH, n->conv1.OW, 2, 2, n->c1, n->p1, n->arg1, 1,
                                err) != 0 ||
        gt_gl_conv2d_forward(l, &n->conv2, B, n->p1, P + n->off[2], P + n->off[3], n->c2,
                             c->scratch, err) != 0)
        return -1;
    if (c->dropped && gt_gl_dropout(l, n->c2, n->mask2, B, 20, plane2, n->dropout,
                                    gt_dropout_key(key, 0, 2), ids, err) != 0)
        return -1;
    if (gt_gl_maxpool2d_forward(l, B * 20, n->conv2.OH, n->conv2.OW, 2, 2, n->c2, n->p2, n->arg2, 1,
                                err) != 0 ||
        gt_gl_linear_forward(l, n->p2, B, n->flat, n->hidden, P + n->off[4], P + n->off[5], n->h, 1,
                             err) != 0)
        return -1;
    if (c->dropped && gt_gl_dropout(l, n->h, n->mask3, B, n->hidden, 1, n->dropout,
                                    gt_dropout_key(key, 0, 3), ids, err) != 0)
        return -1;
    return gt_gl_linear_forward(l, n->h, B, n->hidden, c->classes, P + n->off[6], P + n->off[7],
                                logits, 0, err);
}

static int lenet_backward(gt_gpu_cnn *c, const float *P, float *G, const float *x, int B,
                          const float *dlogits, gt_err *err)
{
    gt_lenet *n = &c->ln;
    gt_gl *l = c->l;
    if (gt_gl_linear_backward(l, n->h, dlogits, B, n->hidden, c->classes, P + n->off[6],
                              G + n->off[6], G + n->off[7], n->dh, err) != 0)
        return -1;
    if (c->dropped && gt_gl_dropout_apply(l, n->dh, n->mask3, B, n->hidden, 1, err) != 0)
        return -1;
    if (gt_gl_relu_backward(l, n->dh, n->h, (size_t)B * n->hidden, err) != 0 ||
        gt_gl_linear_backward(l, n->p2, n->dh, B, n->flat, n->hidden, P + n->off[4], G + n->off[4],
                              G + n->off[5], n->dp2, err) != 0 ||
        gt_gl_maxpool2d_backward(l, B * 20, n->conv2.OH, n->conv2.OW, 2, 2, n->dp2, n->arg2, n->p2,
                                 c->dropped ? n->mask2 : NULL, n->dc2, err) != 0)
        return -1;
    return gt_gl_conv2d_backward(l, &n->conv2, B, n->p1, P + n->off[2], n->dc2, G + n->off[2],
                                 G + n->off[3], n->dp1, c->scratch, err) != 0 ||
                   gt_gl_maxpool2d_backward(l, B * 10, n->conv1.OH, n->conv1.OW, 2, 2, n->dp1,
                                            n->arg1, n->p1, NULL, n->dc1, err) != 0 ||
                   gt_gl_conv2d_backward(l, &n->conv1, B, x, P + n->off[0], n->dc1, G + n->off[0],
                                         G + n->off[1], NULL, c->scratch, err) != 0
               ? -1
               : 0;
}

/* ---- ResNet -------------------------------------------------------------------------------- */

static int resnet_alloc(gt_gpu_cnn *c, gt_err *err)
{
    int rank = c->l->rank, B = c->cap;
    gt_resnet *n = &c->rn;
    n->arena = NULL;
    size_t floats = gt_resnet_carve(n, NULL, B);
    CUDA_CHECK(cudaMalloc(&n->arena, floats * sizeof(float)));
    gt_resnet_carve(n, n->arena, B);
    size_t sc = conv_scratch(&n->stem, B, 0);
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        const gt_rn_block *b = &n->blk[i];
        sc = conv_scratch(&b->c1, B, conv_scratch(&b->c2, B, sc));
        if (b->down)
            sc = conv_scratch(&b->cs, B, sc);
    }
    CUDA_CHECK(cudaMalloc(&c->scratch, sc * sizeof(float)));
    return 0;
}

static int bn_forward(gt_gpu_cnn *c, const float *P, const gt_rn_bn *bn, int B, int HW,
                      int training, const float *x, float *y, gt_err *err)
{
    float *buf = c->buffers;
    if (!training)
        return gt_gl_bn_forward_eval(c->l, B, bn->C, HW, x, P + bn->gamma, P + bn->beta,
                                     buf + bn->rmean, buf + bn->rvar, y, err);
    return gt_gl_bn_forward_train(c->l, B, bn->C, HW, x, P + bn->gamma, P + bn->beta, y, bn->mean,
                                  bn->invstd, buf + bn->rmean, buf + bn->rvar, c->reduce,
                                  c->reduce_ctx, err);
}

static int bn_backward(gt_gpu_cnn *c, const float *P, float *G, const gt_rn_bn *bn, int B, int HW,
                       const float *x, const float *dy, float *dx, gt_err *err)
{
    return gt_gl_bn_backward(c->l, B, bn->C, HW, x, dy, P + bn->gamma, bn->mean, bn->invstd, dx,
                             G + bn->gamma, G + bn->beta, c->reduce, c->reduce_ctx, err);
}

static int block_forward(gt_gpu_cnn *c, const float *P, gt_rn_block *b, int B, int training,
                         const float *x, gt_err *err)
{
    gt_gl *l = c->l;
    int HW = b->side * b->side;
    size_t len = (size_t)B * b->cout * HW;
    if (gt_gl_conv2d_forward(l, &b->c1, B, x, P + b->w1, NULL, b->a1, c->scratch, err) != 0 ||
        bn_forward(c, P, &b->b1, B, HW, training, b->a1, b->r1, err) != 0 ||
        gt_gl_relu(l, b->r1, len, err) != 0 ||
        gt_gl_conv2d_forward(l, &b->c2, B, b->r1, P + b->w2, NULL, b->a2, c->scratch, err) != 0 ||
        bn_forward(c, P, &b->b2, B, HW, training, b->a2, b->n2, err) != 0)
        return -1;
    const float *sc = x;
    if (b->down) {
        if (gt_gl_conv2d_forward(l, &b->cs, B, x, P + b->ws, NULL, b->as, c->scratch, err) != 0 ||
            bn_forward(c, P, &b->bs, B, HW, training, b->as, b->ns, err) != 0)
            return -1;
        sc = b->ns;
    }
    return gt_gl_add_relu(l, b->out, b->n2, sc, len, err);
}

static int resnet_forward(gt_gpu_cnn *c, const float *P, const float *x, int B, int training,
                          float *logits, gt_err *err)
{
    gt_resnet *n = &c->rn;
    gt_gl *l = c->l;
    int HW = n->side * n->side;
    if (gt_gl_conv2d_forward(l, &n->stem, B, x, P + n->stem_w, NULL, n->s_a, c->scratch, err) !=
            0 ||
        bn_forward(c, P, &n->stem_bn, B, HW, training, n->s_a, n->s_out, err) != 0 ||
        gt_gl_relu(l, n->s_out, (size_t)B * 16 * HW, err) != 0)
        return -1;
    const float *in = n->s_out;
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        if (block_forward(c, P, &n->blk[i], B, training, in, err) != 0)
            return -1;
        in = n->blk[i].out;
    }
    const gt_rn_block *last = &n->blk[GT_RESNET_BLOCKS - 1]; /* global average pooling */
    if (gt_gl_avgpool2d_forward(l, B * 64, last->side, last->side, last->side, 1, in, n->pooled,
                                err) != 0)
        return -1;
    return gt_gl_linear_forward(l, n->pooled, B, 64, c->classes, P + n->fc_w, P + n->fc_b, logits,
                                0, err);
}

/* From b->dout, the block's parameter gradients and dx (its input's gradient), as resnet.c. */
static int block_backward(gt_gpu_cnn *c, const float *P, float *G, gt_rn_block *b, int B,
                          const float *x, float *dx, gt_err *err)
{
    gt_resnet *n = &c->rn;
    gt_gl *l = c->l;
    int HW = b->side * b->side;
    size_t len = (size_t)B * b->cout * HW, in_len = (size_t)B * b->cin * b->side_in * b->side_in;
    if (gt_gl_relu_grad(l, n->t1, b->dout, b->out, len, err) != 0 ||
        bn_backward(c, P, G, &b->b2, B, HW, b->a2, n->t1, n->t2, err) != 0 ||
        gt_gl_conv2d_backward(l, &b->c2, B, b->r1, P + b->w2, n->t2, G + b->w2, NULL, n->t3,
                              c->scratch, err) != 0 ||
        gt_gl_relu_backward(l, n->t3, b->r1, len, err) != 0 ||
        bn_backward(c, P, G, &b->b1, B, HW, b->a1, n->t3, n->t2, err) != 0 ||
        gt_gl_conv2d_backward(l, &b->c1, B, x, P + b->w1, n->t2, G + b->w1, NULL, dx, c->scratch,
                              err) != 0)
        return -1;
    const float *dsc = n->t1; /* the identity shortcut passes the gradient through */
    if (b->down) {
        if (bn_backward(c, P, G, &b->bs, B, HW, b->as, n->t1, n->t2, err) != 0 ||
            gt_gl_conv2d_backward(l, &b->cs, B, x, P + b->ws, n->t2, G + b->ws, NULL, n->t3,
                                  c->scratch, err) != 0)
            return -1;
        dsc = n->t3;
    }
    return gt_gl_add(l, dx, dsc, in_len, err);
}

static int resnet_backward(gt_gpu_cnn *c, const float *P, float *G, const float *x, int B,
                           const float *dlogits, gt_err *err)
{
    gt_resnet *n = &c->rn;
    gt_gl *l = c->l;
    gt_rn_block *last = &n->blk[GT_RESNET_BLOCKS - 1];
    if (gt_gl_linear_backward(l, n->pooled, dlogits, B, 64, c->classes, P + n->fc_w, G + n->fc_w,
                              G + n->fc_b, n->dpooled, err) != 0 ||
        gt_gl_avgpool2d_backward(l, B * 64, last->side, last->side, last->side, 1, n->dpooled,
                                 last->dout, err) != 0)
        return -1;
    for (int i = GT_RESNET_BLOCKS - 1; i >= 0; i--) {
        const float *in = i ? n->blk[i - 1].out : n->s_out;
        float *din = i ? n->blk[i - 1].dout : n->s_dout;
        if (block_backward(c, P, G, &n->blk[i], B, in, din, err) != 0)
            return -1;
    }
    int HW = n->side * n->side;
    if (gt_gl_relu_backward(l, n->s_dout, n->s_out, (size_t)B * 16 * HW, err) != 0 ||
        bn_backward(c, P, G, &n->stem_bn, B, HW, n->s_a, n->s_dout, n->t1, err) != 0)
        return -1;
    return gt_gl_conv2d_backward(l, &n->stem, B, x, P + n->stem_w, n->t1, G + n->stem_w, NULL, NULL,
                                 c->scratch, err);
}

/* ---- common -------------------------------------------------------------------------------- */

static int cnn_setup(gt_gpu_cnn *c, const gt_mlp *m, gt_err *err)
{
    int rank = c->l->rank;
    if (m->kind == GT_MODEL_LENET) {
        c->ln = *m->cnn;
        return lenet_alloc(c, err);
    }
    c->rn = *m->rn;
    if (resnet_alloc(c, err) != 0)
        return -1;
    c->nbuffers = m->nbuffers;
    CUDA_CHECK(cudaMalloc(&c->buffers, m->nbuffers * sizeof(float)));
    /* Synchronous from pageable memory, before any kernel reads it on the stream. */
    CUDA_CHECK(
        cudaMemcpy(c->buffers, m->buffers, m->nbuffers * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

int gt_gpu_cnn_init(gt_gpu_cnn **out, const gt_mlp *m, gt_gl *l, gt_err *err)
{
    *out = NULL;
    if (m->kind != GT_MODEL_LENET && m->kind != GT_MODEL_RESNET)
        return gt_errf(err, "rank %d: gt_gpu_cnn_init: not a LeNet or ResNet", l->rank);
    gt_gpu_cnn *c = (gt_gpu_cnn *)calloc(1, sizeof(*c));
    if (!c)
        return gt_errf(err, "rank %d: out of memory", l->rank);
    c->kind = m->kind;
    c->l = l;
    c->cap = m->max_batch;
    c->classes = m->sizes[m->nlayers];
    c->reduce = m->reduce;
    c->reduce_ctx = m->reduce_ctx;
    if (cnn_setup(c, m, err) != 0) {
        gt_gpu_cnn_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void gt_gpu_cnn_free(gt_gpu_cnn *c)
{
    if (!c)
        return;
    if (c->kind == GT_MODEL_LENET)
        lenet_free(&c->ln);
    else
        cudaFree(c->rn.arena);
    cudaFree(c->scratch);
    cudaFree(c->buffers);
    free(c);
}

int gt_gpu_cnn_capacity(const gt_gpu_cnn *c)
{
    return c->cap;
}

int gt_gpu_cnn_forward(gt_gpu_cnn *c, const float *params, const float *x, int B, int training,
                       uint64_t key, const int64_t *ids, float *logits, gt_err *err)
{
    if (B < 1 || B > c->cap)
        return gt_errf(err, "rank %d: a batch of %d on a model sized for %d", c->l->rank, B,
                       c->cap);
    if (c->kind == GT_MODEL_LENET)
        return lenet_forward(c, params, x, B, training, key, ids, logits, err);
    return resnet_forward(c, params, x, B, training, logits, err);
}

int gt_gpu_cnn_backward(gt_gpu_cnn *c, const float *params, float *grads, const float *x, int B,
                        const float *dlogits, gt_err *err)
{
    if (c->kind == GT_MODEL_LENET)
        return lenet_backward(c, params, grads, x, B, dlogits, err);
    return resnet_backward(c, params, grads, x, B, dlogits, err);
}

float *gt_gpu_cnn_buffers(gt_gpu_cnn *c, size_t *nbuffers)
{
    *nbuffers = c->nbuffers;
    return c->buffers;
}
