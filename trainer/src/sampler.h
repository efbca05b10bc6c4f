/* sampler.h: PyTorch-compatible shuffling. gt_mt19937 is the 32-bit Mersenne Twister that a
 * CPU torch.Generator wraps; gt_randperm reproduces torch.randperm(n, generator=g) after
 * g.manual_seed(seed) bit for bit; gt_sampler reproduces torch.utils.data.DistributedSampler
 * (shuffle with seed + epoch, pad by repeating the head or drop the tail, rank r takes r::W). */
#ifndef GT_SAMPLER_H
#define GT_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "gt_err.h"

#define GT_MT_N 624

typedef struct gt_mt19937 {
    uint32_t state[GT_MT_N];
    uint32_t pos; /* next word to temper; GT_MT_N means "twist first" */
} gt_mt19937;

/* Seeds like std::mt19937(seed) and torch's manual_seed (which keeps the low 32 bits). */
void gt_mt_seed(gt_mt19937 *mt, uint64_t seed);
uint32_t gt_mt_next(gt_mt19937 *mt);
/* torch's random64(): two draws, the first as the high word. */
uint64_t gt_mt_next64(gt_mt19937 *mt);
/* A float in [0,1) from 24 random bits, for initialisation (not torch-compatible). */
float gt_mt_uniform(gt_mt19937 *mt);

/* Writes torch.randperm(n) for a generator freshly seeded with seed into out[0..n). */
void gt_randperm(int64_t n, uint64_t seed, int64_t *out);
/* The path torch takes for n >= UINT32_MAX/20 (inside-out Fisher-Yates on random64()); exposed
 * so tests can run it on small n. */
void gt_randperm_inside_out(int64_t n, gt_mt19937 *mt, int64_t *out);

typedef struct gt_sampler {
    int64_t n; /* dataset length */
    int world, rank;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t num_samples; /* per rank, as DistributedSampler.num_samples */
    int64_t total_size;  /* num_samples * world */
} gt_sampler;

/* Fails (message in err) when rank is outside [0, world) or the dataset is smaller than the
 * world with drop_last (no sample would be left). */
int gt_sampler_init(gt_sampler *s, int64_t n, int world, int rank, bool shuffle, bool drop_last,
                    uint64_t seed, gt_err *err);
/* Writes this rank's num_samples indices for epoch into out. When pos is non-NULL it receives,
 * per index, its position in the padded global list: positions >= n are padding duplicates,
 * which sharded evaluation must not count. */
void gt_sampler_indices(const gt_sampler *s, uint64_t epoch, int64_t *out, int64_t *pos);

#endif
