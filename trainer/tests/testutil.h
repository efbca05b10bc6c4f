/* testutil.h: helpers shared by the trainer's tests: temporary directories, small IDX files
 * written on the fly (plain or gzipped), a learnable synthetic dataset, a free TCP port, and
 * running several ranks of gt_train_run as forked processes. */
#ifndef GT_TESTUTIL_H
#define GT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "train.h"

/* cmocka 1.1.5 (Debian 12) has no float asserts: |a - b| <= tol, printing both on failure. */
#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        if (!(a_ - b_ <= (double)(tol) && b_ - a_ <= (double)(tol)))                               \
            fail_msg("%s = %.9g, expected %.9g within %g", #a, a_, b_, (double)(tol));             \
    } while (0)

/* Creates a fresh directory under $TMPDIR (or /tmp) and writes its path into dir (>= 64 bytes).
 * Aborts the test process on failure. */
void tu_mkdtemp(char *dir, size_t len);
/* Removes dir and the files directly inside it. */
void tu_rmtree(const char *dir);

/* Writes an IDX file of u8 data: ndim dims, then data (product of dims bytes). gz selects a
 * gzipped file. Returns 0 or -1. */
int tu_write_idx(const char *path, int gz, const uint32_t *dims, int ndim, const uint8_t *data);
/* Writes raw bytes (for malformed files). */
int tu_write_raw(const char *path, const void *data, size_t n);

/* Writes train-/t10k- images and labels to dir: ntrain/ntest samples of side x side pixels,
 * nclasses classes, each class a bright bar at its own rows plus seeded noise, so an MLP learns
 * it within a few steps. */
int tu_write_synthetic(const char *dir, int ntrain, int ntest, int side, int nclasses,
                       uint32_t seed);

/* The synthetic data (1280 8x8 images, 4 classes) on which the ResNet's 1-rank and 2-rank runs
 * are compared after 20 SGD steps (lr 0.05, seed 7), on the CPU and on the GPU. Chosen, not
 * arbitrary: those 20 steps pass ~10M values through ReLUs, and where one lands within rounding
 * of 0 a change of summation order (the ranks', the BLAS's threads', the GPU's) flips it and the
 * runs part by a whole gradient term. Data seed 777 parts them by 3.1e-5 (norm) through one
 * input of -6e-8 in the 4th step, 778 by 2.7e-7 with two BLAS threads; 809 was the seed among
 * 778..809 on which 1-ulp to 1e-6 relative noise in every gradient (64 + 48 + 32 runs) never
 * moved the result beyond the tests' bounds. A change of the model or of these settings needs
 * the seed picked again the same way: tests/tools/seed_margin.sh. */
#define GT_TEST_RESNET_DATA_SEED 809

/* A TCP port that was free a moment ago (bound to port 0 and released). */
int tu_free_port(void);

/* Runs world ranks of gt_train_run, each in a forked child with c->dist set to its rank,
 * world, 127.0.0.1:port. rank_cfg (may be NULL) adjusts each rank's copy before the run.
 * Returns the number of ranks that exited non-zero. Each failing rank's message goes to stderr
 * and, when err_dir is non-NULL, to err_dir/rankN.err. */
int tu_run_ranks(const gt_config *c, int world, int port,
                 void (*rank_cfg)(gt_config *c, int rank, void *arg), void *arg,
                 const char *err_dir);

/* Reads a whole file into a malloc'd buffer; *n receives its size. NULL on failure. */
void *tu_read_file(const char *path, size_t *n);

#endif
