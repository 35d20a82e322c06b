/* Greedy decoding's argmax on the CPU: per row, the first index of the largest logit, or of
 * the first NaN when the row has one (torch.argmax's rules). One pass in vector lanes
 * (argmax_row.h); rows run on the OpenMP pool.
 */
#include <stdint.h>

#include "argmax_row.h"

/* x [rows, n] float32 with row stride `stride` (elements); out int64 [rows]. */
void argmax_f32(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out,
                int64_t threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * stride, n);
}
