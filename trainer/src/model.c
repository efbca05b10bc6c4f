/* model.c: MLP forward/backward on the CPU. GEMMs go through gt_gemm (CBLAS or plain loops);
 * everything else is element-wise. Shapes are noted on each buffer as (rows, cols). */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lenet.h"
#include "resnet.h"
#include "sampler.h"

#ifdef GT_HAVE_CBLAS
#include <cblas.h>
#endif

#ifndef GT_HAVE_CBLAS
static float at(const float *A, int lda, int trans, int r, int c)
{
    return trans ? A[(size_t)c * lda + r] : A[(size_t)r * lda + c];
}
#endif

static gt_precision gemm_precision;
/* Grown on demand, one per thread (pool.c's workers round at once): the main thread's lives as
 * long as the process, a worker's until gt_gemm_release_scratch. */
static _Thread_local float *round_scratch;
static _Thread_local size_t round_cap;

void gt_gemm_release_scratch(void)
{
    free(round_scratch);
    round_scratch = NULL;
    round_cap = 0;
}

void gt_gemm_set_precision(gt_precision p)
{
    gemm_precision = p;
}

float gt_round_to(gt_precision p, float x)
{
    if (p == GT_PREC_FP16)
        return (float)(_Float16)x;
    if (p != GT_PREC_BF16 || isnan(x))
        return x;
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* round to nearest, ties to even */
    memcpy(&x, &u, sizeof(u));
    return x;
}

/* A rows x cols matrix with leading dimension ld, rounded into scratch from offset at. */
static const float *rounded(const float *A, int rows, int cols, int ld, size_t at)
{
    size_t n = (size_t)(rows - 1) * ld + cols;
    for (size_t i = 0; i < n; i++)
        round_scratch[at + i] = gt_round_to(gemm_precision, A[i]);
    return round_scratch + at;
}

static int ensure_scratch(size_t n)
{
    if (n <= round_cap)
        return 0;
    float *p = realloc(round_scratch, n * sizeof(float));
    if (!p)
        return -1;
    round_scratch = p;
    round_cap = n;
    return 0;
}

static void gemm_fp32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);

void gt_gemm_ex(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc)
{
    int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    size_t na = (size_t)(ar - 1) * lda + ac, nb = (size_t)(br - 1) * ldb + bc;
    /* Out of memory for the rounding copies: compute in fp32 rather than fail a step. */
    if (gemm_precision != GT_PREC_FP32 && M > 0 && N > 0 && K > 0 && ensure_scratch(na + nb) == 0) {
        A = rounded(A, ar, ac, lda, 0);
        B = rounded(B, br, bc, ldb, na);
    }
    gemm_fp32(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static void gemm_fp32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef GT_HAVE_CBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
#else
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += at(A, lda, trans_a, i, k) * at(B, ldb, trans_b, k, j);
            float *c = &C[(size_t)i * ldc + j];
            *c = beta == 0.0f ? acc : acc + beta * *c; /* beta 0 ignores C, as BLAS does */
        }
#endif
}

void gt_gemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
             int ldb, float *C, int ldc)
{
    gt_gemm_ex(trans_a, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, ldc);
}

static int layout(gt_mlp *m, int in, const int *hidden, int nhidden, int out, gt_err *err)
{
    if (nhidden < 0 || nhidden + 1 > GT_MLP_MAX_LAYERS)
        return gt_errf(err, "model: %d hidden layers (at most %d)", nhidden, GT_MLP_MAX_LAYERS - 1);
    m->nlayers = nhidden + 1;
    m->sizes[0] = in;
    for (int i = 0; i < nhidden; i++)
        m->sizes[i + 1] = hidden[i];
    m->sizes[m->nlayers] = out;
    m->nparams = 0;
    for (int l = 0; l < m->nlayers; l++) {
        if (m->sizes[l] <= 0 || m->sizes[l + 1] <= 0)
            return gt_errf(err, "model: layer %d has size %d -> %d", l, m->sizes[l],
                           m->sizes[l + 1]);
        m->w_off[l] = m->nparams;
        m->nparams += (size_t)m->sizes[l] * m->sizes[l + 1];
        m->b_off[l] = m->nparams;
        m->nparams += (size_t)m->sizes[l + 1];
    }
    return 0;
}

static void init_params(gt_mlp *m, uint64_t seed)
{
    gt_mt19937 mt;
    gt_mt_seed(&mt, seed);
    for (int l = 0; l < m->nlayers; l++) {
        float bound = 1.0f / sqrtf((float)m->sizes[l]);
        size_t n = (size_t)m->sizes[l] * m->sizes[l + 1] + (size_t)m->sizes[l + 1];
        float *p = m->params + m->w_off[l];
        for (size_t i = 0; i < n; i++)
            p[i] = (2.0f * gt_mt_uniform(&mt) - 1.0f) * bound;
    }
}

int gt_mlp_init(gt_mlp *m, int in, const int *hidden, int nhidden, int out, int max_batch,
                uint64_t seed, gt_err *err)
{
    memset(m, 0, sizeof(*m));
    if (max_batch < 1)
        return gt_errf(err, "model: batch size %d", max_batch);
    if (layout(m, in, hidden, nhidden, out, err) != 0)
        return -1;
    m->max_batch = max_batch;
    m->params = malloc(m->nparams * sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    int ok = m->params && m->grads;
    for (int l = 1; ok && l <= m->nlayers; l++) {
        m->acts[l] = malloc((size_t)max_batch * m->sizes[l] * sizeof(float));
        m->dacts[l] = malloc((size_t)max_batch * m->sizes[l] * sizeof(float));
        ok = m->acts[l] && m->dacts[l];
    }
    if (!ok) {
        gt_mlp_release(m);
        return gt_errf(err, "model: out of memory for %zu parameters", m->nparams);
    }
    init_params(m, seed);
    return 0;
}

void gt_mlp_release(gt_mlp *m)
{
    gt_lenet_free(m->cnn);
    gt_resnet_free(m->rn);
    free(m->buffers);
    free(m->params);
    free(m->grads);
    for (int l = 0; l <= GT_MLP_MAX_LAYERS; l++) {
        free(m->acts[l]);
        free(m->dacts[l]);
    }
    memset(m, 0, sizeof(*m));
}

void gt_mlp_set_mode(gt_mlp *m, int training, uint64_t key, const int64_t *ids)
{
    m->training = training;
    m->drop_key = key;
    m->drop_ids = ids;
}

const float *gt_mlp_forward(gt_mlp *m, const float *x, int B)
{
    if (m->cnn)
        return gt_lenet_forward(m, x, B);
    if (m->rn)
        return gt_resnet_forward(m, x, B);
    for (int l = 0; l < m->nlayers; l++) {
        int in = m->sizes[l], out = m->sizes[l + 1];
        const float *X = l == 0 ? x : m->acts[l]; /* (B, in) */
        float *Y = m->acts[l + 1];                /* (B, out) */
        const float *W = m->params + m->w_off[l]; /* (out, in) */
        const float *b = m->params + m->b_off[l]; /* (out) */
        gt_gemm(0, 1, B, out, in, X, in, W, in, Y, out);
        int relu = l + 1 < m->nlayers;
        for (int i = 0; i < B; i++)
            for (int j = 0; j < out; j++) {
                float v = Y[(size_t)i * out + j] + b[j];
                Y[(size_t)i * out + j] = relu && v < 0.0f ? 0.0f : v;
            }
    }
    return m->acts[m->nlayers];
}

double gt_mlp_loss(gt_mlp *m, const uint8_t *y, int B, int with_grad, int64_t *correct)
{
    int C = m->sizes[m->nlayers];
    const float *logits = m->acts[m->nlayers]; /* (B, C) */
    float *dlogits = m->dacts[m->nlayers];     /* (B, C) */
    double total = 0.0;
    for (int i = 0; i < B; i++) {
        const float *z = logits + (size_t)i * C;
        int best = 0;
        for (int j = 1; j < C; j++)
            if (z[j] > z[best])
                best = j;
        *correct += best == y[i];
        double sum = 0.0;
        for (int j = 0; j < C; j++)
            sum += exp((double)z[j] - z[best]);
        double lse = z[best] + log(sum);
        total += lse - z[y[i]];
        if (!with_grad)
            continue;
        for (int j = 0; j < C; j++) {
            double p = exp((double)z[j] - lse);
            dlogits[(size_t)i * C + j] = (float)((p - (j == y[i])) / B);
        }
    }
    return total;
}

void gt_mlp_backward(gt_mlp *m, const float *x, int B)
{
    if (m->cnn) {
        gt_lenet_backward(m, x, B);
        return;
    }
    if (m->rn) {
        gt_resnet_backward(m, x, B);
        return;
    }
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int in = m->sizes[l], out = m->sizes[l + 1];
        const float *X = l == 0 ? x : m->acts[l]; /* (B, in) */
        const float *dY = m->dacts[l + 1];        /* (B, out) */
        float *dW = m->grads + m->w_off[l];       /* (out, in) */
        float *db = m->grads + m->b_off[l];       /* (out) */
        gt_gemm(1, 0, out, in, B, dY, out, X, in, dW, in);
        for (int j = 0; j < out; j++)
            db[j] = 0.0f;
        for (int i = 0; i < B; i++)
            for (int j = 0; j < out; j++)
                db[j] += dY[(size_t)i * out + j];
        if (l == 0)
            break;
        float *dX = m->dacts[l]; /* (B, in) */
        gt_gemm(0, 0, B, in, out, dY, out, m->params + m->w_off[l], in, dX, in);
        /* ReLU: the layer's output is zero exactly where its input was clamped. */
        for (size_t i = 0; i < (size_t)B * in; i++)
            if (X[i] <= 0.0f)
                dX[i] = 0.0f;
    }
}
