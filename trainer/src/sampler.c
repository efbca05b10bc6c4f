/* sampler.c: mt19937 and the two torch.randperm CPU paths (aten/src/ATen/native/
 * TensorFactories.cpp randperm_cpu, checked against its 2.x source): for
 * n < UINT32_MAX/20 a forward swap shuffle drawing random() % (n - i), else the inside-out
 * Fisher-Yates drawing random64() % (i + 1). DistributedSampler layout follows torch 2.x. */
#include "sampler.h"

#include <stdlib.h>

void gt_mt_seed(gt_mt19937 *mt, uint64_t seed)
{
    mt->state[0] = (uint32_t)seed;
    for (uint32_t i = 1; i < GT_MT_N; i++) {
        uint32_t prev = mt->state[i - 1];
        mt->state[i] = 1812433253u * (prev ^ (prev >> 30)) + i;
    }
    mt->pos = GT_MT_N;
}

static void twist(gt_mt19937 *mt)
{
    enum { M = 397 };
    for (uint32_t i = 0; i < GT_MT_N; i++) {
        uint32_t y = (mt->state[i] & 0x80000000u) | (mt->state[(i + 1) % GT_MT_N] & 0x7fffffffu);
        uint32_t v = mt->state[(i + M) % GT_MT_N] ^ (y >> 1);
        mt->state[i] = (y & 1u) ? v ^ 0x9908b0dfu : v;
    }
    mt->pos = 0;
}

uint32_t gt_mt_next(gt_mt19937 *mt)
{
    if (mt->pos >= GT_MT_N)
        twist(mt);
    uint32_t y = mt->state[mt->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t gt_mt_next64(gt_mt19937 *mt)
{
    uint64_t hi = gt_mt_next(mt);
    uint64_t lo = gt_mt_next(mt);
    return hi << 32 | lo;
}

float gt_mt_uniform(gt_mt19937 *mt)
{
    return (gt_mt_next(mt) >> 8) * (1.0f / 16777216.0f);
}

void gt_randperm_inside_out(int64_t n, gt_mt19937 *mt, int64_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t z = (int64_t)(gt_mt_next64(mt) % (uint64_t)(i + 1));
        out[i] = i; /* as torch does, so z == i never reads an unset slot */
        out[i] = out[z];
        out[z] = i;
    }
}

void gt_randperm(int64_t n, uint64_t seed, int64_t *out)
{
    gt_mt19937 mt;
    gt_mt_seed(&mt, seed);
    if (n < (int64_t)(UINT32_MAX / 20)) {
        for (int64_t i = 0; i < n; i++)
            out[i] = i;
        for (int64_t i = 0; i < n - 1; i++) {
            int64_t z = (int64_t)(gt_mt_next(&mt) % (uint64_t)(n - i));
            int64_t save = out[i];
            out[i] = out[z + i];
            out[z + i] = save;
        }
        return;
    }
    gt_randperm_inside_out(n, &mt, out);
}

int gt_sampler_init(gt_sampler *s, int64_t n, int world, int rank, bool shuffle, bool drop_last,
                    uint64_t seed, gt_err *err)
{
    if (world < 1 || rank < 0 || rank >= world)
        return gt_errf(err, "sampler: rank %d outside world of %d", rank, world);
    if (n < 1 || (drop_last && n < world))
        return gt_errf(err, "sampler: %lld samples cannot be split over %d ranks", (long long)n,
                       world);
    s->n = n;
    s->world = world;
    s->rank = rank;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->seed = seed;
    /* DistributedSampler: drop_last with a remainder floors, otherwise ceil. */
    if (drop_last && n % world != 0)
        s->num_samples = (n - world) / world + ((n - world) % world != 0);
    else
        s->num_samples = (n + world - 1) / world;
    s->total_size = s->num_samples * world;
    return 0;
}

/* Global list index p (0 <= p < total_size) -> dataset index, padding by wrapping around. */
static int64_t global_at(const int64_t *perm, int64_t n, int64_t p)
{
    return perm ? perm[p % n] : p % n;
}

void gt_sampler_indices(const gt_sampler *s, uint64_t epoch, int64_t *out, int64_t *pos)
{
    int64_t *perm = NULL;
    if (s->shuffle) {
        perm = malloc((size_t)s->n * sizeof(*perm));
        if (!perm)
            abort(); /* 8 bytes per sample; no useful recovery */
        gt_randperm(s->n, s->seed + epoch, perm);
    }
    /* torch pads with indices[:pad] (or repeats the list when pad > n): both equal wrapping,
     * and drop_last truncates, which the same formula covers because total_size <= n. */
    for (int64_t k = 0; k < s->num_samples; k++) {
        int64_t p = s->rank + k * s->world;
        out[k] = global_at(perm, s->n, p);
        if (pos)
            pos[k] = p;
    }
    free(perm);
}
