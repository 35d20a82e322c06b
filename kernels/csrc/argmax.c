/* Greedy decoding's argmax on the CPU: per row, the first index of the largest logit, or of
 * the first NaN when the row has one (torch.argmax's rules). One pass keeps, in each vector
 * lane, the largest value the lane has seen and where it saw it first, and notes
 * whether a NaN occurred (the row is then scanned for its first NaN instead). Rows run on
 * the OpenMP pool.
 */
#include <stdint.h>

#include <string.h>

/* GCC/clang vector extensions, one register wide: 16 lanes under AVX-512, else 8 (a wider
 * vector than the registers is split into scalar code here, not into two registers). A cast
 * between the two types keeps the bits. */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static int64_t first_nan(const float *x, int64_t n) {
    int64_t at = 0;
    while (at < n && x[at] == x[at]) at++;
    return at;
}

static int64_t argmax_short(const float *x, int64_t n) {
    int64_t at = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[at]) at = i;
    return at;
}

/* Rows of at least LANES elements and below 2^31 (the lane indices are 32-bit). */
static int64_t argmax_lanes(const float *x, int64_t n) {
    vf best;
    memcpy(&best, x, sizeof best);
    vi at, best_at;
    for (int j = 0; j < LANES; j++) at[j] = j;
    best_at = at;
    vi seen_nan = (vi)(best != best);
    int64_t i = LANES;
    for (; i + LANES <= n; i += LANES) {
        vf v;
        memcpy(&v, x + i, sizeof v);
        at += LANES;
        const vi greater = v > best;  /* strict: a lane keeps the first index of its best */
        seen_nan |= v != v;
        best = (vf)((greater & (vi)v) | (~greater & (vi)best));
        best_at = (greater & at) | (~greater & best_at);
    }
    int any_nan = 0;
    float top = best[0];
    int64_t top_at = best_at[0];
    for (int j = 0; j < LANES; j++) {
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

static int64_t argmax_row(const float *x, int64_t n) {
    if (n < LANES || n >= INT32_MAX) {
        const int64_t nan_at = first_nan(x, n);
        return nan_at < n ? nan_at : argmax_short(x, n);
    }
    return argmax_lanes(x, n);
}

/* x [rows, n] float32 with row stride `stride` (elements); out int64 [rows]. */
void argmax_f32(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out,
                int64_t threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * stride, n);
}
