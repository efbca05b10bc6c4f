/* scaler.h: dynamic loss scaling for --precision fp16, as torch.cuda.amp.GradScaler with its
 * defaults: the loss (so every gradient) is multiplied by the scale, initially 2^16; a step
 * whose averaged gradients hold an inf or NaN is skipped and halves the scale; 2000 clean steps
 * in a row double it. Gradients are unscaled before the optimiser sees them. */
#ifndef GT_SCALER_H
#define GT_SCALER_H

#include <stddef.h>
#include <stdint.h>

#define GT_SCALER_INIT            65536.0f
#define GT_SCALER_GROWTH_INTERVAL 2000

typedef struct gt_scaler {
    float scale;
    int clean;       /* clean steps since the last change of scale */
    int64_t skipped; /* steps skipped for an inf or NaN */
} gt_scaler;

void gt_scaler_init(gt_scaler *s, float init_scale);

/* After the backward of a scaled loss (and the all-reduce): returns 1 when grads (n) are finite,
 * having divided them by the scale, or 0 when the step must be skipped. Updates the scale. */
int gt_scaler_unscale_and_update(gt_scaler *s, float *grads, size_t n);

/* The scale's bookkeeping alone, for gradients unscaled elsewhere (the CUDA path, which divides
 * by the scale read before this call): halves and counts a skip when !finite, else counts a
 * clean step and doubles after GT_SCALER_GROWTH_INTERVAL of them. Returns finite. */
int gt_scaler_update(gt_scaler *s, int finite);

#endif
