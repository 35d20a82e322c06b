/* Greedy decoding's argmax on the CPU: per row, the first index of the largest logit, or of
 * the first NaN when the row has one (torch.argmax's rules). One pass finds the largest in
 * vector lanes and notes whether a NaN occurred; a second finds where it is. Rows run on the
 * OpenMP pool.
 */
#include <stdint.h>

#include <string.h>

/* GCC/clang vector extensions: one vector of 16 lanes (lowered to what the machine has). */
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define LANES 16

/* The largest of x[0..n) in 16 independent lanes, ignoring NaN; *nan is set when some
 * element is NaN (the caller then looks for the first NaN instead). */
static float largest(const float *x, int64_t n, int *nan) {
    vf lane;
    vi seen_nan = {0};
    for (int j = 0; j < LANES; j++) lane[j] = x[0];
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vf v;
        memcpy(&v, x + i, sizeof v);
        const vi greater = v > lane;
        seen_nan |= v != v;
        vi bits_v, bits_lane;
        memcpy(&bits_v, &v, sizeof v);
        memcpy(&bits_lane, &lane, sizeof lane);
        bits_lane = (greater & bits_v) | (~greater & bits_lane);
        memcpy(&lane, &bits_lane, sizeof lane);
    }
    float best = lane[0];
    int any_nan = 0;
    for (int j = 0; j < LANES; j++) {
        best = lane[j] > best ? lane[j] : best;
        any_nan |= seen_nan[j] != 0;
    }
    for (; i < n; i++) {
        best = x[i] > best ? x[i] : best;
        any_nan |= x[i] != x[i];
    }
    *nan = any_nan;
    return best;
}

static int64_t argmax_row(const float *x, int64_t n) {
    int nan;
    const float best = largest(x, n, &nan);
    int64_t at = 0;
    if (nan)
        while (x[at] == x[at]) at++;
    else
        while (at < n - 1 && x[at] != best) at++;
    return at;
}

/* x [rows, n] float32 with row stride `stride` (elements); out int64 [rows]. */
void argmax_f32(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out,
                int64_t threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * stride, n);
}
