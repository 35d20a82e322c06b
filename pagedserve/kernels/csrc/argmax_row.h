/* The first index of the largest float in a row, or of the first NaN when the row has one
 * (torch.argmax's rules), in vector lanes: each lane keeps the largest value it has seen and
 * where it saw it first. Shared by the greedy argmax and the exponential race. */
#ifndef PAGEDSERVE_ARGMAX_ROW_H
#define PAGEDSERVE_ARGMAX_ROW_H

#include <stdint.h>
#include <string.h>

/* GCC/clang vector extensions, one register wide: 16 lanes under AVX-512, else 8 (a wider
 * vector than the registers is split into scalar code here, not into two registers). A cast
 * between the two types keeps the bits. */
#ifdef __AVX512F__
#define ARGMAX_LANES 16
#else
#define ARGMAX_LANES 8
#endif
typedef float argmax_vf __attribute__((vector_size(4 * ARGMAX_LANES)));
typedef int32_t argmax_vi __attribute__((vector_size(4 * ARGMAX_LANES)));

static inline int64_t first_nan(const float *x, int64_t n) {
    int64_t at = 0;
    while (at < n && x[at] == x[at]) at++;
    return at;
}

static inline int64_t argmax_short(const float *x, int64_t n) {
    int64_t at = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[at]) at = i;
    return at;
}

/* Rows of at least ARGMAX_LANES elements and below 2^31 (the lane indices are 32-bit). */
static inline int64_t argmax_lanes(const float *x, int64_t n) {
    argmax_vf best;
    memcpy(&best, x, sizeof best);
    argmax_vi at, best_at;
    for (int j = 0; j < ARGMAX_LANES; j++) at[j] = j;
    best_at = at;
    argmax_vi seen_nan = (argmax_vi)(best != best);
    int64_t i = ARGMAX_LANES;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES) {
        argmax_vf v;
        memcpy(&v, x + i, sizeof v);
        at += ARGMAX_LANES;
        const argmax_vi greater = v > best;  /* strict: a lane keeps the first index of its best */
        seen_nan |= v != v;
        best = (argmax_vf)((greater & (argmax_vi)v) | (~greater & (argmax_vi)best));
        best_at = (greater & at) | (~greater & best_at);
    }
    int any_nan = 0;
    float top = best[0];
    int64_t top_at = best_at[0];
    for (int j = 0; j < ARGMAX_LANES; j++) {
        any_nan |= seen_nan[j] != 0;
        if (best[j] > top || (best[j] == top && best_at[j] < top_at)) {
            top = best[j];
            top_at = best_at[j];
        }
    }
    for (; i < n; i++) {  /* the tail's indices come after every lane's */
        any_nan |= x[i] != x[i];
        if (x[i] > top) {
            top = x[i];
            top_at = i;
        }
    }
    return any_nan ? first_nan(x, n) : top_at;
}

static inline int64_t argmax_row(const float *x, int64_t n) {
    if (n < ARGMAX_LANES || n >= INT32_MAX) {
        const int64_t nan_at = first_nan(x, n);
        return nan_at < n ? nan_at : argmax_short(x, n);
    }
    return argmax_lanes(x, n);
}

#endif
