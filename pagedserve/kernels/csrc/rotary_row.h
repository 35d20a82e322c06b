/* The rotary embedding of one float32 row, shared by the element-wise op (layer_ops.c) and the
 * fused decode step (paged_decode.c), so that both compute it with the same expression. */
#ifndef PAGEDSERVE_ROTARY_ROW_H
#define PAGEDSERVE_ROTARY_ROW_H

#include <stdint.h>

/* Rotates, in place, `heads` head vectors from xr (head size 2 * half, GPT-NeoX halves) by
 * cos/sin [half]: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). */
static inline void rotary_row_f32(float *xr, int64_t heads, int64_t half, const float *c,
                                  const float *s) {
    for (int64_t h = 0; h < heads; h++) {
        float *x1 = xr + h * 2 * half, *x2 = x1 + half;
        for (int64_t i = 0; i < half; i++) {
            const float a = x1[i], b = x2[i];
            x1[i] = a * c[i] - b * s[i];
            x2[i] = b * c[i] + a * s[i];
        }
    }
}

#endif
