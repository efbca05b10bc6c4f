/* scaler.c: see scaler.h. The inf/NaN check runs on the all-reduced gradients, which every rank
 * holds bit-identically, so all ranks skip the same steps without another collective. */
#include "scaler.h"

#include <math.h>

void gt_scaler_init(gt_scaler *s, float init_scale)
{
    s->scale = init_scale;
    s->clean = 0;
    s->skipped = 0;
}

int gt_scaler_update(gt_scaler *s, int finite)
{
    if (!finite) {
        s->scale *= 0.5f;
        s->clean = 0;
        s->skipped++;
        return 0;
    }
    if (++s->clean == GT_SCALER_GROWTH_INTERVAL) {
        s->scale *= 2.0f;
        s->clean = 0;
    }
    return 1;
}

int gt_scaler_unscale_and_update(gt_scaler *s, float *grads, size_t n)
{
    int finite = 1;
    for (size_t i = 0; i < n && finite; i++)
        finite = isfinite(grads[i]);
    float inv = 1.0f / s->scale; /* GradScaler multiplies by the reciprocal too */
    for (size_t i = 0; finite && i < n; i++)
        grads[i] *= inv;
    return gt_scaler_update(s, finite);
}
