/* layer_index.h: the index math and the dropout hash that the CPU layers (layers.c) and the CUDA
 * kernels (gpu_layers.cu) share, as inline functions compiled for both host and device. One
 * definition means the two paths cannot drift apart: im2col reads the same input element for the
 * same column entry, and a dropout mask is the same bit pattern on either device, so CUDA and CPU
 * runs agree exactly on which units are dropped. test_layers checks these on the host. */
#ifndef GT_LAYER_INDEX_H
#define GT_LAYER_INDEX_H

#include <stdint.h>

#ifdef __CUDACC__
#define GT_HD static inline __host__ __device__
#else
#define GT_HD static inline
#endif

/* splitmix64's finaliser: a well-mixed 64-bit function of its input. */
GT_HD uint64_t gt_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Dropout's multiplier for unit u of the sample with dataset index id: 0 with probability p,
 * else keep (1/(1-p), computed once by the caller so both paths use the same float). 24 random
 * bits make a uniform float in [0, 1) with every value exact. */
GT_HD float gt_dropout_unit(uint64_t key, int64_t id, int u, float p, float keep)
{
    uint64_t sample = gt_mix64(key ^ (uint64_t)id);
    float r = (float)(gt_mix64(sample + (uint64_t)u) >> 40) * (1.0f / 16777216.0f);
    return r < p ? 0.0f : keep;
}

/* The input offset within one sample (C, H, W) that im2col row (c, ki, kj) reads at output
 * position (oy, ox), or -1 where that falls in the zero padding. */
GT_HD int64_t gt_im2col_src(int H, int W, int stride, int pad, int c, int ki, int kj, int oy,
                            int ox)
{
    int iy = oy * stride - pad + ki, ix = ox * stride - pad + kj;
    if (iy < 0 || iy >= H || ix < 0 || ix >= W)
        return -1;
    return ((int64_t)c * H + iy) * W + ix;
}

/* The inverse for col2im: the output position along one axis whose window puts kernel tap kk on
 * input coordinate i, or -1 when none does (off the stride grid or outside 0..O-1). */
GT_HD int gt_col2im_out(int i, int kk, int stride, int pad, int O)
{
    int t = i + pad - kk;
    if (t < 0 || t % stride != 0 || t / stride >= O)
        return -1;
    return t / stride;
}

#endif
