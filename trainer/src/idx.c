/* idx.c: IDX parsing through zlib's gz* API, which reads gzip and plain files alike, so one code
 * path validates both. Every failure message starts with the file's path. */
#include "idx.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Reads exactly n bytes; returns the count actually read (short on EOF or a corrupt stream). */
static size_t read_full(gzFile f, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        unsigned chunk = (n - got) > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

static int parse_header(gzFile f, const char *path, gt_idx *out, gt_err *err)
{
    uint8_t magic[4];
    if (read_full(f, magic, 4) != 4)
        return gt_errf(err, "%s: truncated IDX header (fewer than 4 bytes)", path);
    if (magic[0] != 0 || magic[1] != 0)
        return gt_errf(err, "%s: not an IDX file (magic %02x%02x%02x%02x)", path, magic[0],
                       magic[1], magic[2], magic[3]);
    if (magic[2] != 0x08)
        return gt_errf(err, "%s: IDX data type 0x%02x unsupported (expected 0x08, u8)", path,
                       magic[2]);
    if (magic[3] < 1 || magic[3] > GT_IDX_MAX_DIMS)
        return gt_errf(err, "%s: IDX has %d dimensions (expected 1..%d)", path, magic[3],
                       GT_IDX_MAX_DIMS);
    out->ndim = magic[3];
    out->item_size = 1;
    for (int i = 0; i < out->ndim; i++) {
        uint8_t b[4];
        if (read_full(f, b, 4) != 4)
            return gt_errf(err, "%s: truncated IDX header (dimension %d)", path, i);
        out->dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
        if (out->dims[i] == 0)
            return gt_errf(err, "%s: IDX dimension %d is zero", path, i);
        if (i > 0)
            out->item_size *= out->dims[i];
    }
    out->count = out->dims[0];
    return 0;
}

int gt_idx_load(const char *path, gt_idx *out, gt_err *err)
{
    memset(out, 0, sizeof(*out));
    gzFile f = gzopen(path, "rb");
    if (!f)
        return gt_errf(err, "%s: cannot open", path);
    int rc = parse_header(f, path, out, err);
    if (rc == 0) {
        size_t n = out->count * out->item_size;
        out->data = malloc(n ? n : 1);
        if (!out->data)
            rc = gt_errf(err, "%s: out of memory for %zu bytes", path, n);
        else if (read_full(f, out->data, n) != n)
            rc = gt_errf(err, "%s: truncated: header promises %zu items of %zu bytes", path,
                         out->count, out->item_size);
    }
    gzclose(f);
    if (rc != 0) {
        gt_idx_release(out);
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

void gt_idx_release(gt_idx *idx)
{
    free(idx->data);
    idx->data = NULL;
}

int gt_dataset_from_idx(const gt_idx *images, const gt_idx *labels, const char *what,
                        gt_dataset *out, gt_err *err)
{
    memset(out, 0, sizeof(*out));
    if (labels->ndim != 1)
        return gt_errf(err, "%s: labels file has %d dimensions (expected 1)", what, labels->ndim);
    if (images->count != labels->count)
        return gt_errf(err, "%s: %zu images but %zu labels", what, images->count, labels->count);
    out->count = images->count;
    out->dim = images->item_size;
    out->x = malloc(out->count * out->dim * sizeof(float));
    out->y = malloc(out->count);
    if (!out->x || !out->y) {
        gt_dataset_release(out);
        return gt_errf(err, "%s: out of memory", what);
    }
    for (size_t i = 0; i < out->count * out->dim; i++)
        out->x[i] = images->data[i] / 255.0f;
    for (size_t i = 0; i < out->count; i++) {
        out->y[i] = labels->data[i];
        if (out->y[i] + 1 > out->nclasses)
            out->nclasses = out->y[i] + 1;
    }
    return 0;
}

/* Picks "<dir>/<name>" if it exists, else "<dir>/<name>.gz" (reported in errors either way). */
static void resolve(const char *dir, const char *name, char *buf, size_t len)
{
    struct stat st;
    snprintf(buf, len, "%s/%s", dir, name);
    if (stat(buf, &st) == 0)
        return;
    snprintf(buf, len, "%s/%s.gz", dir, name);
}

int gt_dataset_load(const char *dir, const char *prefix, gt_dataset *out, gt_err *err)
{
    char ipath[4096], lpath[4096], name[256];
    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    resolve(dir, name, ipath, sizeof(ipath));
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    resolve(dir, name, lpath, sizeof(lpath));
    gt_idx images, labels;
    memset(out, 0, sizeof(*out));
    if (gt_idx_load(ipath, &images, err) != 0)
        return -1;
    if (gt_idx_load(lpath, &labels, err) != 0) {
        gt_idx_release(&images);
        return -1;
    }
    char what[8300];
    snprintf(what, sizeof(what), "%s and %s", ipath, lpath);
    int rc = gt_dataset_from_idx(&images, &labels, what, out, err);
    gt_idx_release(&images);
    gt_idx_release(&labels);
    return rc;
}

void gt_dataset_release(gt_dataset *ds)
{
    free(ds->x);
    free(ds->y);
    ds->x = NULL;
    ds->y = NULL;
}
