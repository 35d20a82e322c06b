/* Scalar helpers shared by the CPU kernels, written so that GCC and clang vectorise the loops
 * that call them (no libm calls, no branches the vectoriser cannot if-convert). */
#ifndef PAGEDSERVE_VEC_MATH_H
#define PAGEDSERVE_VEC_MATH_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t bf16;

static inline float from_bf16(bf16 v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline bf16 to_bf16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bf16)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (bf16)(bits >> 16);
}
static inline float round_bf16(float v) { return from_bf16(to_bf16(v)); }

/* IEEE half precision as its bits, converted with integer and float operations the compiler
 * vectorises (GCC 12 converts _Float16 one element at a time without AVX512-FP16).
 * Widening is exact: the exponent and mantissa move into place, and a multiply by 2^112
 * rebiases the exponent (which also normalises subnormal halves); infinities and NaNs keep
 * an all-ones exponent. Narrowing rounds to nearest even, as torch's conversion does:
 * overflow gives infinity, NaN a quiet NaN, and results below the smallest normal half are
 * rounded by the float adder (adding 0.5 moves the bits to round into place). */
typedef uint16_t f16;

static inline float from_f16(f16 h) {
    const uint32_t bits = h, sign = (bits & 0x8000u) << 16, magnitude = (bits & 0x7fffu) << 13;
    float f;
    memcpy(&f, &magnitude, sizeof f);
    f *= 0x1p112f;
    uint32_t out;
    memcpy(&out, &f, sizeof out);
    out |= magnitude >= (0x7c00u << 13) ? 0x7f800000u : 0u; /* infinity, NaN */
    out |= sign;
    memcpy(&f, &out, sizeof f);
    return f;
}

static inline f16 to_f16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    const uint32_t sign = bits & 0x80000000u, magnitude = bits ^ sign;
    /* below 2^-14: the float sum with 0.5 rounds the magnitude to a multiple of 2^-24 */
    float small;
    memcpy(&small, &magnitude, sizeof small);
    small += 0.5f;
    uint32_t small_bits;
    memcpy(&small_bits, &small, sizeof small_bits);
    const uint32_t subnormal = small_bits - 0x3f000000u;
    /* normal: rebias the exponent, round the 13 dropped bits to nearest even */
    const uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
    uint32_t out = magnitude < 0x38800000u ? subnormal : normal;
    out = magnitude >= 0x47800000u ? 0x7c00u : out;  /* overflow: infinity */
    out = magnitude > 0x7f800000u ? 0x7e00u : out;   /* NaN */
    return (f16)(out | (sign >> 16));
}

static inline void narrow_bf16(const float *restrict in, bf16 *restrict out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = to_bf16(in[i]);
}

/* A run of n halves widened, or n floats narrowed, with the processor's conversion
 * instructions where it has them (AVX-512: 16 a instruction, F16C: 8; both exact and rounding
 * to nearest even, as above, which the rest of each run uses). */
static inline void widen_f16(const f16 *restrict in, float *restrict out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(in + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
#endif
    for (; i < n; i++) out[i] = from_f16(in[i]);
}

static inline void narrow_f16(const float *restrict in, f16 *restrict out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) out[i] = to_f16(in[i]);
}

/* e^x in float32 that the compiler vectorises (libm's expf is a call per element, and its
 * vector forms are only declared under -ffast-math): 2^(x log2 e) split into an integer power,
 * set in the exponent bits, and 2^f for |f| <= 1/2 by its degree-6 Taylor polynomial
 * (relative error about 2e-7). Inputs are clamped to the range where e^x is a normal float. */
static inline float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* t lies in [-125.6, 127]: truncating t + 128.5, a positive number, rounds t to the
     * nearest integer k (a float trick such as adding 1.5 * 2^23 would be folded away under
     * -fassociative-math). */
    const float t = x * 1.44269504088896341f;
    const int32_t k = (int32_t)(t + 128.5f) - 128;
    const float f = t - (float)k;
    float p = 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    const union { uint32_t bits; float value; } scale = {(uint32_t)(k + 127) << 23};
    return p * scale.value;
}

/* 1 / b for b in [1, 1e38] that the compiler vectorises (a vector division costs about as
 * much as the rest of SiLU): a first guess from the exponent bits (within 12%), then three
 * Newton steps, each squaring the error, to within 2e-7. Larger b is taken as 1e38. */
static inline float rcp_f32(float b) {
    b = b > 1e38f ? 1e38f : b;
    union { float value; uint32_t bits; } v = {b};
    v.bits = 0x7ef311c3u - v.bits;
    float r = v.value;
    r = r * (2.0f - b * r);
    r = r * (2.0f - b * r);
    return r * (2.0f - b * r);
}

/* ln x for a positive normal float x, vectorisable: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
 * and ln m = 2 atanh(t) with t = (m - 1) / (m + 1), |t| < 0.172, by its odd series to t^9
 * (relative error about 1e-7). */
static inline float log_f32(float x) {
    union { float value; uint32_t bits; } v = {x};
    int32_t e = (int32_t)(v.bits >> 23) - 127;
    v.bits = (v.bits & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */
    float m = v.value;
    const int32_t high = m > 1.41421356f;
    m = high ? m * 0.5f : m;
    e += high;
    const float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float p = 1.0f / 9.0f;
    p = p * t2 + 1.0f / 7.0f;
    p = p * t2 + 1.0f / 5.0f;
    p = p * t2 + 1.0f / 3.0f;
    p = p * t2 + 1.0f;
    return 2.0f * t * p + (float)e * 0.693147180559945309f;
}

#endif
