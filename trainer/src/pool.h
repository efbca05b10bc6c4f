/* pool.h: the CPU worker threads that split a convolution's batch between cores. One pool per
 * process, started once (gt_pool_start) before training. A convolution unfolds one sample at a
 * time, and those per-sample GEMMs are too small for a BLAS's own threads (OpenBLAS's workers
 * spent 40% of a one-rank ResNet run in sched_yield); splitting the batch instead gives each core
 * whole samples, the im2col included. The split depends only on the batch and the thread count,
 * and partial sums are added in worker order, so a run is reproducible for a given count. */
#ifndef GT_POOL_H
#define GT_POOL_H

#include <stddef.h>

/* fn handles items [lo, hi) as worker w (0 is the calling thread). */
typedef void (*gt_pool_fn)(void *ctx, int w, int lo, int hi);

/* Starts threads - 1 workers (threads < 2: none, everything runs on the caller) and makes the
 * BLAS single-threaded: the pool is now what uses the cores (with one thread too: a one-rank
 * ResNet ran at 190 samples/s with OpenBLAS's two threads, 339 with one). Returns 0, or -1 when
 * no thread could be started (the caller then runs alone, which is still correct). */
int gt_pool_start(int threads);
/* Joins the workers and gives the BLAS its threads back; the pool is then one thread again. */
void gt_pool_stop(void);
/* The threads a loop is split between now (1 without a pool). */
int gt_pool_threads(void);

/* The threads to use by default: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS where set (a launcher
 * such as torchrun or gpusync sets OMP_NUM_THREADS for each rank), else this process's CPUs
 * shared by LOCAL_WORLD_SIZE ranks. */
int gt_pool_default_threads(void);

/* Makes sure each worker from 1 on has a scratch of at least floats floats; returns the workers
 * a loop may use: gt_pool_threads(), or 1 when the memory cannot be had. */
int gt_pool_reserve(size_t floats);
/* Worker w's scratch (w >= 1), as gt_pool_reserve left it. */
float *gt_pool_scratch(int w);

/* Runs fn over [0, n) split into at most `workers` contiguous chunks, the first on the calling
 * thread, and returns once every chunk is done; returns the chunks, each non-empty (0 when n is
 * 0). Chunk w is the same for the same n and workers. */
int gt_pool_for(int n, int workers, gt_pool_fn fn, void *ctx);

#endif
