/* idx.h: loading and validating MNIST-format IDX files (optionally gzipped) into float datasets.
 * An IDX file is a 4-byte magic (0, 0, type, ndim), ndim big-endian u32 sizes, then the data. */
#ifndef GT_IDX_H
#define GT_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "gt_err.h"

#define GT_IDX_MAX_DIMS 4

/* One IDX file of unsigned bytes (type 0x08, the only type MNIST-style data uses). */
typedef struct gt_idx {
    int ndim;
    uint32_t dims[GT_IDX_MAX_DIMS];
    size_t count;     /* dims[0] */
    size_t item_size; /* product of dims[1..] (1 for labels) */
    uint8_t *data;    /* count * item_size bytes, owned */
} gt_idx;

/* A images+labels pair: pixels scaled to [0,1] as torchvision's ToTensor does. */
typedef struct gt_dataset {
    size_t count;
    size_t dim;   /* features per sample (784 for 28x28) */
    float *x;     /* (count, dim), owned */
    uint8_t *y;   /* (count), owned */
    int nclasses; /* max label + 1 */
} gt_dataset;

/* Reads path (gzip or plain; zlib reads both). Fails with a message naming path on an unreadable
 * file, a wrong magic, a type other than u8, zero dimensions, or fewer data bytes than the header
 * promises; on failure *out is left zeroed. The caller owns out->data (gt_idx_release). */
int gt_idx_load(const char *path, gt_idx *out, gt_err *err);
void gt_idx_release(gt_idx *idx);

/* Loads `<dir>/<prefix>-images-idx3-ubyte[.gz]` and the matching labels, checking that the image
 * and label counts agree and that labels are < 256 classes. On failure *out is zeroed. */
int gt_dataset_load(const char *dir, const char *prefix, gt_dataset *out, gt_err *err);
/* Builds a dataset from two loaded IDX files (ownership stays with the caller). */
int gt_dataset_from_idx(const gt_idx *images, const gt_idx *labels, const char *what,
                        gt_dataset *out, gt_err *err);
void gt_dataset_release(gt_dataset *ds);

#endif
