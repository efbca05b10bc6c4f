/* resnet.c: the residual network's layout, forward and backward. All activations come from one
 * arena sized in a counting pass, so init has a single allocation to fail and release frees
 * one block. Block internals are kept for the backward; gradients go through three scratch
 * buffers the size of the largest activation. */
#include "resnet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

typedef struct arena {
    float *base; /* NULL in the counting pass */
    size_t used;
} arena;

static float *take(arena *a, size_t n)
{
    float *p = a->base ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

static void bn_layout(gt_rn_bn *bn, int C, size_t *np, size_t *nb)
{
    bn->C = C;
    bn->gamma = *np;
    bn->beta = *np + C;
    *np += 2 * (size_t)C;
    bn->rmean = *nb;
    bn->rvar = *nb + C;
    *nb += 2 * (size_t)C;
}

/* Stage s, block j: 16/32/64 channels, stride 2 where a stage begins (but the first). */
static void block_layout(gt_rn_block *b, int cin, int side_in, int cout, int stride, size_t *np,
                         size_t *nb)
{
    b->cin = cin, b->cout = cout, b->side_in = side_in;
    gt_conv2d_init(&b->c1, cin, side_in, side_in, cout, 3, stride, 1);
    b->side = b->c1.OH;
    b->w1 = *np;
    *np += (size_t)cout * cin * 9;
    bn_layout(&b->b1, cout, np, nb);
    gt_conv2d_init(&b->c2, cout, b->side, b->side, cout, 3, 1, 1);
    b->w2 = *np;
    *np += (size_t)cout * cout * 9;
    bn_layout(&b->b2, cout, np, nb);
    b->down = stride != 1 || cin != cout;
    if (!b->down)
        return;
    gt_conv2d_init(&b->cs, cin, side_in, side_in, cout, 1, stride, 0);
    b->ws = *np;
    *np += (size_t)cout * cin;
    bn_layout(&b->bs, cout, np, nb);
}

static void layout(gt_mlp *m, gt_resnet *n, int out)
{
    size_t np = 0, nb = 0;
    gt_conv2d_init(&n->stem, 1, n->side, n->side, 16, 3, 1, 1);
    n->stem_w = np;
    np += 16 * 9;
    bn_layout(&n->stem_bn, 16, &np, &nb);
    const int widths[3] = {16, 32, 64};
    int cin = 16, side = n->side;
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        int stage = i / 2, stride = stage > 0 && i % 2 == 0 ? 2 : 1;
        block_layout(&n->blk[i], cin, side, widths[stage], stride, &np, &nb);
        cin = n->blk[i].cout;
        side = n->blk[i].side;
    }
    n->fc_w = np;
    np += (size_t)out * 64;
    n->fc_b = np;
    np += (size_t)out;
    m->nparams = np;
    m->nbuffers = nb;
}

static void bn_buffers(arena *a, gt_rn_bn *bn)
{
    bn->mean = take(a, (size_t)bn->C);
    bn->invstd = take(a, (size_t)bn->C);
}

static size_t conv_col(const gt_conv2d *c, size_t best)
{
    size_t n = gt_conv2d_col_len(c);
    return n > best ? n : best;
}

/* Carves every activation buffer for batches of B out of a (or counts them). */
static void carve(arena *a, gt_resnet *n, int B)
{
    size_t big = (size_t)B * 16 * n->side * n->side, col = conv_col(&n->stem, 0);
    n->s_a = take(a, big), n->s_out = take(a, big), n->s_dout = take(a, big);
    bn_buffers(a, &n->stem_bn);
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        gt_rn_block *b = &n->blk[i];
        size_t len = (size_t)B * b->cout * b->side * b->side;
        float **bufs[] = {&b->a1, &b->r1, &b->a2, &b->n2, &b->out, &b->dout};
        for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++)
            *bufs[k] = take(a, len);
        b->as = b->down ? take(a, len) : NULL;
        b->ns = b->down ? take(a, len) : NULL;
        bn_buffers(a, &b->b1);
        bn_buffers(a, &b->b2);
        if (b->down)
            bn_buffers(a, &b->bs);
        col = conv_col(&b->c1, conv_col(&b->c2, b->down ? conv_col(&b->cs, col) : col));
    }
    n->pooled = take(a, (size_t)B * 64), n->dpooled = take(a, (size_t)B * 64);
    n->t1 = take(a, big), n->t2 = take(a, big), n->t3 = take(a, big);
    n->col = take(a, col);
}

typedef struct weight_block {
    size_t off, len;
    int fan_in;
} weight_block;

/* PyTorch's defaults: weights (and the head's bias) uniform +-1/sqrt(fan_in); BatchNorm weight
 * 1, bias 0, running mean 0, running variance 1. */
static void init_params(gt_mlp *m, gt_resnet *n, uint64_t seed)
{
    gt_mt19937 mt;
    gt_mt_seed(&mt, seed);
    memset(m->params, 0, m->nparams * sizeof(float));
    weight_block w[2 + 3 * GT_RESNET_BLOCKS];
    int nw = 0;
    w[nw++] = (weight_block){n->stem_w, 16 * 9, 9};
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        gt_rn_block *b = &n->blk[i];
        w[nw++] = (weight_block){b->w1, (size_t)b->cout * b->cin * 9, b->cin * 9};
        w[nw++] = (weight_block){b->w2, (size_t)b->cout * b->cout * 9, b->cout * 9};
        if (b->down)
            w[nw++] = (weight_block){b->ws, (size_t)b->cout * b->cin, b->cin};
    }
    w[nw++] = (weight_block){n->fc_w, m->nparams - n->fc_w, 64}; /* head weight and bias */
    for (int k = 0; k < nw; k++) {
        float bound = 1.0f / sqrtf((float)w[k].fan_in);
        for (size_t i = 0; i < w[k].len; i++)
            m->params[w[k].off + i] = (2.0f * gt_mt_uniform(&mt) - 1.0f) * bound;
    }
    gt_rn_bn *bns[GT_RESNET_MAX_BNS];
    int nbn = gt_resnet_bns(n, bns);
    for (int k = 0; k < nbn; k++)
        for (int c = 0; c < bns[k]->C; c++) {
            m->params[bns[k]->gamma + c] = 1.0f;
            m->buffers[bns[k]->rmean + c] = 0.0f;
            m->buffers[bns[k]->rvar + c] = 1.0f;
        }
}

int gt_resnet_bns(gt_resnet *n, gt_rn_bn **out)
{
    int k = 0;
    out[k++] = &n->stem_bn;
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        out[k++] = &n->blk[i].b1;
        out[k++] = &n->blk[i].b2;
        if (n->blk[i].down)
            out[k++] = &n->blk[i].bs;
    }
    return k;
}

size_t gt_resnet_carve(gt_resnet *n, float *base, int B)
{
    arena a = {base, 0};
    carve(&a, n, B);
    return a.used;
}

int gt_resnet_init(gt_mlp *m, int dim, int out, int max_batch, uint64_t seed, gt_err *err)
{
    memset(m, 0, sizeof(*m));
    int side = (int)lround(sqrt((double)dim));
    if (side * side != dim || side < 8)
        return gt_errf(err,
                       "--model resnet: images of %d pixels; it needs square images of at "
                       "least 8x8 (28x28 as MNIST)",
                       dim);
    if (max_batch < 1 || out < 1)
        return gt_errf(err, "model: batch size %d, %d classes", max_batch, out);
    gt_resnet *n = calloc(1, sizeof(*n));
    if (!n)
        return gt_errf(err, "model: out of memory");
    m->rn = n;
    m->kind = GT_MODEL_RESNET;
    n->side = side;
    m->nlayers = 1; /* the loss and the checkpoint header see in -> classes */
    m->sizes[0] = dim;
    m->sizes[1] = out;
    m->max_batch = max_batch;
    layout(m, n, out);
    arena a = {NULL, 0};
    carve(&a, n, max_batch);
    n->arena = malloc(a.used * sizeof(float));
    m->params = malloc(m->nparams * sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    m->buffers = malloc(m->nbuffers * sizeof(float));
    m->acts[1] = malloc((size_t)max_batch * out * sizeof(float));
    m->dacts[1] = malloc((size_t)max_batch * out * sizeof(float));
    if (!n->arena || !m->params || !m->grads || !m->buffers || !m->acts[1] || !m->dacts[1]) {
        gt_mlp_release(m);
        return gt_errf(err, "model: out of memory for the ResNet's buffers (batch %d)", max_batch);
    }
    a = (arena){n->arena, 0};
    carve(&a, n, max_batch);
    init_params(m, n, seed);
    return 0;
}

void gt_resnet_free(gt_resnet *n)
{
    if (n)
        free(n->arena);
    free(n);
}

static void bn_forward(gt_mlp *m, const gt_rn_bn *bn, int B, int HW, const float *x, float *y)
{
    const float *P = m->params;
    float *buf = m->buffers;
    if (!m->training) {
        gt_bn_forward_eval(B, bn->C, HW, x, P + bn->gamma, P + bn->beta, buf + bn->rmean,
                           buf + bn->rvar, y);
        return;
    }
    if (gt_bn_forward_train(B, bn->C, HW, x, P + bn->gamma, P + bn->beta, y, bn->mean, bn->invstd,
                            buf + bn->rmean, buf + bn->rvar, m->reduce, m->reduce_ctx) != 0)
        m->failed = 1;
}

static void bn_backward(gt_mlp *m, const gt_rn_bn *bn, int B, int HW, const float *x,
                        const float *dy, float *dx)
{
    if (gt_bn_backward(B, bn->C, HW, x, dy, m->params + bn->gamma, bn->mean, bn->invstd, dx,
                       m->grads + bn->gamma, m->grads + bn->beta, m->reduce, m->reduce_ctx) != 0)
        m->failed = 1;
}

static void block_forward(gt_mlp *m, gt_resnet *n, gt_rn_block *b, int B, const float *x)
{
    const float *P = m->params;
    int HW = b->side * b->side;
    size_t len = (size_t)B * b->cout * HW;
    gt_conv2d_forward(&b->c1, B, x, P + b->w1, NULL, b->a1, n->col);
    bn_forward(m, &b->b1, B, HW, b->a1, b->r1);
    gt_relu(b->r1, len);
    gt_conv2d_forward(&b->c2, B, b->r1, P + b->w2, NULL, b->a2, n->col);
    bn_forward(m, &b->b2, B, HW, b->a2, b->n2);
    const float *sc = x;
    if (b->down) {
        gt_conv2d_forward(&b->cs, B, x, P + b->ws, NULL, b->as, n->col);
        bn_forward(m, &b->bs, B, HW, b->as, b->ns);
        sc = b->ns;
    }
    for (size_t i = 0; i < len; i++) {
        float v = b->n2[i] + sc[i];
        b->out[i] = v > 0.0f ? v : 0.0f;
    }
}

const float *gt_resnet_forward(gt_mlp *m, const float *x, int B)
{
    gt_resnet *n = m->rn;
    int HW = n->side * n->side;
    gt_conv2d_forward(&n->stem, B, x, m->params + n->stem_w, NULL, n->s_a, n->col);
    bn_forward(m, &n->stem_bn, B, HW, n->s_a, n->s_out);
    gt_relu(n->s_out, (size_t)B * 16 * HW);
    const float *in = n->s_out;
    for (int i = 0; i < GT_RESNET_BLOCKS; i++) {
        block_forward(m, n, &n->blk[i], B, in);
        in = n->blk[i].out;
    }
    const gt_rn_block *last = &n->blk[GT_RESNET_BLOCKS - 1]; /* global average pooling */
    gt_avgpool2d_forward(B * 64, last->side, last->side, last->side, 1, in, n->pooled);
    gt_linear_forward(n->pooled, B, 64, m->sizes[1], m->params + n->fc_w, m->params + n->fc_b,
                      m->acts[1]);
    return m->acts[1];
}

/* From b->dout, accumulates the block's parameter gradients and overwrites dx (its input's). */
static void block_backward(gt_mlp *m, gt_resnet *n, gt_rn_block *b, int B, const float *x,
                           float *dx)
{
    float *G = m->grads;
    int HW = b->side * b->side;
    size_t len = (size_t)B * b->cout * HW, in_len = (size_t)B * b->cin * b->side_in * b->side_in;
    for (size_t i = 0; i < len; i++) /* t1: gradient at the sum, through the final ReLU */
        n->t1[i] = b->out[i] > 0.0f ? b->dout[i] : 0.0f;
    bn_backward(m, &b->b2, B, HW, b->a2, n->t1, n->t2);
    gt_conv2d_backward(&b->c2, B, b->r1, m->params + b->w2, n->t2, G + b->w2, NULL, n->t3, n->col);
    gt_relu_backward(n->t3, b->r1, len);
    bn_backward(m, &b->b1, B, HW, b->a1, n->t3, n->t2);
    gt_conv2d_backward(&b->c1, B, x, m->params + b->w1, n->t2, G + b->w1, NULL, dx, n->col);
    const float *dsc = n->t1; /* the identity shortcut passes the gradient through */
    if (b->down) {
        bn_backward(m, &b->bs, B, HW, b->as, n->t1, n->t2);
        gt_conv2d_backward(&b->cs, B, x, m->params + b->ws, n->t2, G + b->ws, NULL, n->t3, n->col);
        dsc = n->t3;
    }
    for (size_t i = 0; i < in_len; i++)
        dx[i] += dsc[i];
}

void gt_resnet_backward(gt_mlp *m, const float *x, int B)
{
    gt_resnet *n = m->rn;
    float *G = m->grads;
    gt_linear_backward(n->pooled, m->dacts[1], B, 64, m->sizes[1], m->params + n->fc_w, G + n->fc_w,
                       G + n->fc_b, n->dpooled);
    gt_rn_block *last = &n->blk[GT_RESNET_BLOCKS - 1];
    gt_avgpool2d_backward(B * 64, last->side, last->side, last->side, 1, n->dpooled, last->dout);
    for (int i = GT_RESNET_BLOCKS - 1; i >= 0; i--) {
        const float *in = i ? n->blk[i - 1].out : n->s_out;
        float *din = i ? n->blk[i - 1].dout : n->s_dout;
        block_backward(m, n, &n->blk[i], B, in, din);
    }
    int HW = n->side * n->side;
    gt_relu_backward(n->s_dout, n->s_out, (size_t)B * 16 * HW);
    bn_backward(m, &n->stem_bn, B, HW, n->s_a, n->s_dout, n->t1);
    gt_conv2d_backward(&n->stem, B, x, m->params + n->stem_w, n->t1, G + n->stem_w, NULL, NULL,
                       n->col);
}
