/* The element-wise ops between a decoder layer's GEMMs, for the CPU: RMSNorm (alone, or after
 * the residual add), SiLU-and-mul and the rotary embedding (GPT-NeoX halves). Each replaces a
 * chain of torch ops, each of which reads and writes the whole activation and pays a dispatch,
 * with one pass over the rows.
 *
 * Every function splits its rows across `threads` threads of the OpenMP pool (parallel_rows.h;
 * the caller passes 1 for inputs too small to be worth waking a thread). Math is float32;
 * bfloat16 inputs are widened on load and rounded to nearest even where the torch reference
 * rounds, so bfloat16 results match it to within one rounding.
 */
#include <math.h>
#include <stdint.h>

#include "parallel_rows.h"
#include "rotary_row.h"
#include "vec_math.h"

/* out = weight * (x * rsqrt(mean(x^2) + eps)) for one row. */
static inline void rms_norm_row_f32(const float *xr, const float *weight, float *yr,
                                    int64_t hidden, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; i++) sum += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (int64_t i = 0; i < hidden; i++) yr[i] = weight[i] * (xr[i] * inv);
}

/* As the torch reference in bfloat16: the normalised row is rounded, then multiplied. */
static inline void rms_norm_row_bf16(const bf16 *xr, const bf16 *weight, bf16 *yr,
                                     int64_t hidden, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; i++) sum += from_bf16(xr[i]) * from_bf16(xr[i]);
    const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (int64_t i = 0; i < hidden; i++)
        yr[i] = to_bf16(from_bf16(weight[i]) * round_bf16(from_bf16(xr[i]) * inv));
}

/* x and out [rows, hidden] with row strides. */
void rms_norm_f32(const float *x, int64_t x_stride, const float *weight, float *out,
                  int64_t out_stride, int64_t hidden, float eps, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             rms_norm_row_f32(x + r * x_stride, weight, out + r * out_stride, hidden, eps));
}

void rms_norm_bf16(const bf16 *x, int64_t x_stride, const bf16 *weight, bf16 *out,
                   int64_t out_stride, int64_t hidden, float eps, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             rms_norm_row_bf16(x + r * x_stride, weight, out + r * out_stride, hidden, eps));
}

/* residual += x, then out = RMSNorm(residual) as above: a decoder layer's residual add and the
 * next norm in one pass over the row (the sum is what the torch reference adds and rounds). */
static inline void add_rms_norm_row_f32(const float *xr, float *rr, const float *weight,
                                        float *yr, int64_t hidden, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; i++) {
        const float v = rr[i] + xr[i];
        rr[i] = v;
        sum += v * v;
    }
    const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (int64_t i = 0; i < hidden; i++) yr[i] = weight[i] * (rr[i] * inv);
}

static inline void add_rms_norm_row_bf16(const bf16 *xr, bf16 *rr, const bf16 *weight,
                                         bf16 *yr, int64_t hidden, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; i++) {
        const float v = round_bf16(from_bf16(rr[i]) + from_bf16(xr[i]));
        rr[i] = to_bf16(v);
        sum += v * v;
    }
    const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (int64_t i = 0; i < hidden; i++)
        yr[i] = to_bf16(from_bf16(weight[i]) * round_bf16(from_bf16(rr[i]) * inv));
}

/* x and out [rows, hidden] with row strides, residual [rows, hidden] contiguous, in place. */
void add_rms_norm_f32(const float *x, int64_t x_stride, float *residual, const float *weight,
                      float *out, int64_t hidden, float eps, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             add_rms_norm_row_f32(x + r * x_stride, residual + r * hidden, weight,
                                  out + r * hidden, hidden, eps));
}

void add_rms_norm_bf16(const bf16 *x, int64_t x_stride, bf16 *residual, const bf16 *weight,
                       bf16 *out, int64_t hidden, float eps, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             add_rms_norm_row_bf16(x + r * x_stride, residual + r * hidden, weight,
                                   out + r * hidden, hidden, eps));
}

/* The logistic function; its division is a vectorised reciprocal (vec_math.h), 2.3x faster
 * than a vector division and within 2e-7. Below -88 it is 0, as in float32 (so -inf gives
 * NaN after the multiply, as torch's SiLU does). */
static inline float sigmoid_f32(float x) {
    const float s = rcp_f32(1.0f + exp_f32(-x));
    return x < -88.0f ? 0.0f : s;
}

/* out[r] = silu(x[r, :d]) * x[r, d:]; x [rows, 2d], out [rows, d], both contiguous. */
static inline void silu_and_mul_row_f32(const float *restrict gate, float *restrict yr,
                                        int64_t d) {
    const float *restrict up = gate + d;
    for (int64_t i = 0; i < d; i++) yr[i] = gate[i] * sigmoid_f32(gate[i]) * up[i];
}

static inline void silu_and_mul_row_bf16(const bf16 *restrict gate, bf16 *restrict yr,
                                         int64_t d) {
    const bf16 *restrict up = gate + d;
    for (int64_t i = 0; i < d; i++) {
        const float g = from_bf16(gate[i]);
        yr[i] = to_bf16(round_bf16(g * sigmoid_f32(g)) * from_bf16(up[i]));
    }
}

void silu_and_mul_f32(const float *x, float *out, int64_t d, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads, silu_and_mul_row_f32(x + r * 2 * d, out + r * d, d));
}

void silu_and_mul_bf16(const bf16 *x, bf16 *out, int64_t d, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads, silu_and_mul_row_bf16(x + r * 2 * d, out + r * d, d));
}

/* As the torch reference in bfloat16: cos/sin rounded to bfloat16, every product and sum
 * rounded. */
static inline void rotary_row_bf16(bf16 *xr, int64_t heads, int64_t half, const float *c,
                                   const float *s) {
    for (int64_t h = 0; h < heads; h++) {
        bf16 *x1 = xr + h * 2 * half, *x2 = x1 + half;
        for (int64_t i = 0; i < half; i++) {
            const float a = from_bf16(x1[i]), b = from_bf16(x2[i]);
            const float cr = round_bf16(c[i]), sr = round_bf16(s[i]);
            x1[i] = to_bf16(round_bf16(a * cr) - round_bf16(b * sr));
            x2[i] = to_bf16(round_bf16(b * cr) + round_bf16(a * sr));
        }
    }
}

/* x [rows, ...] with row stride x_stride, cos/sin [rows, half]. */
void rotary_f32(float *x, int64_t x_stride, int64_t heads, int64_t half, const float *cos_t,
                const float *sin_t, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             rotary_row_f32(x + r * x_stride, heads, half, cos_t + r * half, sin_t + r * half));
}

void rotary_bf16(bf16 *x, int64_t x_stride, int64_t heads, int64_t half, const float *cos_t,
                 const float *sin_t, int64_t rows, int64_t threads) {
    FOR_ROWS(r, rows, threads,
             rotary_row_bf16(x + r * x_stride, heads, half, cos_t + r * half, sin_t + r * half));
}
