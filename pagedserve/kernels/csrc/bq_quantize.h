/* The activations' quantization (bq_kernel.h's module doc): each row per block of 32 inputs
 * to int8 or int16 codes, the block's scale, its two half sums and its scaled sum, and for
 * the x86 paths the tiled copy of every 8 rows (bq_tiled). With `group` 8 the scale is the
 * largest magnitude of 8 blocks' (256 inputs, a K type's file block, as llama.cpp's Q8_K),
 * written for each of them (bq_vnni_k.h).
 *
 * Two loops compute the same values: the plain one, which the compiler vectorises as it can
 * (the portable path, and AVX2 machines), and one in AVX-512, 4 to 5 times faster, which the
 * AVX-512 path takes. Both take the largest magnitude by the integer order of the floats'
 * bits, multiply by the one inverse scale, round to nearest even (the default mode, which
 * rintf and cvtps2dq both use) and truncate to the code's width; the sums are of integers. So
 * every code, scale and sum is the same from either loop (tests/kernels compares them).
 */
#ifndef PAGEDSERVE_BQ_QUANTIZE_H
#define PAGEDSERVE_BQ_QUANTIZE_H

#include "bq_kernel.h"

/* float -> float16 -> float, rounding to nearest even, for d >= 0. */
static float round_f16(float d) {
    if (d < 6.103515625e-05f) { /* float16 subnormals: steps of 2^-24 */
        const float steps = d * 16777216.0f;
        const int32_t whole = (int32_t)steps;
        const float frac = steps - (float)whole;
        const int32_t up = frac > 0.5f || (frac == 0.5f && (whole & 1));
        return (float)(whole + up) * 5.9604644775390625e-08f;
    }
    uint32_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits += 0x0fffu + ((bits >> 13) & 1u);
    bits &= ~0x1fffu;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out > 65504.0f ? 65504.0f : out;
}

/* The larger of `bits` and the magnitude of v, compared as integers (which order the
 * magnitudes as floats do). */
static inline uint32_t max_bits(uint32_t bits, float v) {
    uint32_t m;
    memcpy(&m, &v, sizeof m);
    m &= 0x7fffffffu;
    return m > bits ? m : bits;
}

/* The scale and inverse scale of a block whose largest magnitude has the bits top_bits. */
static inline void block_scale(uint32_t top_bits, float top, float *d, float *inv) {
    float amax;
    memcpy(&amax, &top_bits, sizeof amax);
    *d = amax / top;
    *inv = amax > 0 ? top / amax : 0.0f;
}

/* Block blk's scale and sums, from its scale d and its halves' code sums. */
static inline void block_sums(const bq_acts *xa, int64_t blk, float d, int32_t s0, int32_t s1,
                              int wide) {
    ((int32_t *)xa->s16)[2 * blk] = s0;
    ((int32_t *)xa->s16)[2 * blk + 1] = s1;
    ((float *)xa->da)[blk] = wide ? d : round_f16(d);
    /* GGUF's Q8_1 keeps d * sum in float16 */
    const float sum = d * (float)(s0 + s1);
    ((float *)xa->sx)[blk] = wide ? sum : (sum < 0 ? -round_f16(-sum) : round_f16(sum));
}

/* Row r's block b's sums as int16 pairs (bq_tiled.pair), where the activations keep them. */
static inline void block_pairs(const bq_acts *xa, int64_t r, int64_t b) {
    if (xa->pairs == NULL) return;
    const int64_t blk = r * xa->blocks + b;
    uint32_t *pairs = (uint32_t *)xa->pairs;
    const int32_t whole = xa->s16[2 * blk] + xa->s16[2 * blk + 1];
    pairs[2 * blk] = bq_sum_pair(xa->s16[2 * blk], xa->s16[2 * blk + 1]);
    pairs[2 * blk + 1] = bq_sum_pair(whole, 0);
    if (b % 2)
        pairs[2 * blk - 1] = bq_sum_pair(xa->s16[2 * blk - 2] + xa->s16[2 * blk - 1], whole);
}

/* Row r's block b, already quantized (codes at q), into the tiled activations. */
static inline void tile_block(const bq_acts *xa, const int8_t *q, int64_t r, int64_t b) {
    bq_tiled *T = (bq_tiled *)xa->tiled + (r / BQ_TILE_ROWS) * xa->blocks + b;
    const int i = (int)(r % BQ_TILE_ROWS);
    const int64_t blk = r * xa->blocks + b;
    for (int c = 0; c < BQ_TILE / 4; c++) memcpy(T->codes[c][i], q + 4 * c, 4);
    T->da[i] = xa->da[blk];
    T->sum[0][i] = xa->s16[2 * blk];
    T->sum[1][i] = xa->s16[2 * blk + 1];
    T->sum[2][i] = xa->s16[2 * blk] + xa->s16[2 * blk + 1];
    for (int h = 0; h < 3; h++) T->min[h][i] = xa->da[blk] * (float)T->sum[h][i];
    T->sx[i] = xa->sx[blk];
    if (xa->pairs == NULL) return; /* no K kernel reads them */
    T->pair[0][i] = xa->pairs[2 * blk]; /* as block_pairs wrote them */
    T->pair[1][i] = xa->pairs[2 * blk + 1];
    if (b % 2) T[-1].pair[1][i] = xa->pairs[2 * blk - 1];
}

/* Row r of x (k values) into the activations: the plain loop. The clones for AVX2 and
 * AVX-512 compute the same values as the baseline's, one IEEE operation at a time. */
#if BQ_X86
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void quantize_row_plain(const bq_acts *xa, const float *x, int64_t k, int64_t r,
                               int group) {
    const int wide = xa->qa16 != NULL;
    const float top = wide ? 32767.0f : 127.0f;
    float d = 0.0f, inv = 0.0f; /* of the block's group */
    int8_t *qa = (int8_t *)xa->qa + r * xa->blocks * BQ_TILE;
    int16_t *qa16 = (int16_t *)xa->qa16 + r * xa->blocks * BQ_TILE;
    for (int64_t b = 0; b < xa->blocks; b++) {
        float vals[BQ_TILE];
        if ((b + 1) * BQ_TILE <= k) {
            memcpy(vals, x + b * BQ_TILE, sizeof vals);
        } else { /* the last block, zero past k */
            for (int j = 0; j < BQ_TILE; j++)
                vals[j] = b * BQ_TILE + j < k ? x[b * BQ_TILE + j] : 0.0f;
        }
        if (b % group == 0) { /* the largest magnitude of the block, or of its group */
            uint32_t top_bits = 0;
            if (group == 1) /* a loop of constant length, which the compiler vectorises */
                for (int j = 0; j < BQ_TILE; j++) top_bits = max_bits(top_bits, vals[j]);
            else
                for (int64_t j = b * BQ_TILE; j < (b + group) * BQ_TILE && j < k; j++)
                    top_bits = max_bits(top_bits, x[j]);
            block_scale(top_bits, top, &d, &inv);
        }
        int32_t q[BQ_TILE], sums[2] = {0, 0};
        for (int j = 0; j < BQ_TILE; j++) q[j] = (int32_t)__builtin_rintf(vals[j] * inv);
        for (int j = 0; j < BQ_TILE / 2; j++) {
            sums[0] += q[j];
            sums[1] += q[j + BQ_TILE / 2];
        }
        if (wide)
            for (int j = 0; j < BQ_TILE; j++) qa16[b * BQ_TILE + j] = (int16_t)q[j];
        else
            for (int j = 0; j < BQ_TILE; j++) qa[b * BQ_TILE + j] = (int8_t)q[j];
        block_sums(xa, r * xa->blocks + b, d, sums[0], sums[1], wide);
        block_pairs(xa, r, b);
        if (xa->tiled != NULL) tile_block(xa, qa + b * BQ_TILE, r, b);
    }
}

#if BQ_X86
#define BQ_QUANT_AVX512 __attribute__((target("avx512f")))

/* The 32 values at x as two registers, zero past `left` of them, and their magnitudes'
 * lane-wise largest bits. */
BQ_QUANT_AVX512 static __m512i masked_bits(const float *x, int64_t left, __m512i magnitude,
                                            __m512 *v0, __m512 *v1) {
    const __mmask16 m0 = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    const __mmask16 m1 =
        left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
    *v0 = _mm512_maskz_loadu_ps(m0, x);
    *v1 = _mm512_maskz_loadu_ps(m1, x + 16);
    return _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(*v0), magnitude),
                            _mm512_and_si512(_mm512_castps_si512(*v1), magnitude));
}

/* Row r of x into the activations: the AVX-512 loop, a block as two registers. */
BQ_QUANT_AVX512 static void quantize_row_avx512(const bq_acts *xa, const float *x, int64_t k,
                                                int64_t r, int group) {
    const int wide = xa->qa16 != NULL;
    const float top = wide ? 32767.0f : 127.0f;
    int8_t *qa = (int8_t *)xa->qa + r * xa->blocks * BQ_TILE;
    int16_t *qa16 = (int16_t *)xa->qa16 + r * xa->blocks * BQ_TILE;
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    float d = 0.0f, inv = 0.0f; /* of the block's group */
    for (int64_t b = 0; b < xa->blocks; b++) {
        __m512 v0, v1, w0, w1; /* past k the block reads zeros */
        const __m512i bits = masked_bits(x + b * BQ_TILE, k - b * BQ_TILE, magnitude, &v0, &v1);
        if (b % group == 0) { /* the largest magnitude of the block, or of its group */
            __m512i top_bits = bits;
            for (int64_t e = b + 1; e < b + group && e < xa->blocks; e++)
                top_bits = _mm512_max_epu32(
                    top_bits, masked_bits(x + e * BQ_TILE, k - e * BQ_TILE, magnitude, &w0, &w1));
            block_scale((uint32_t)_mm512_reduce_max_epu32(top_bits), top, &d, &inv);
        }
        const __m512 s = _mm512_set1_ps(inv);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, s));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, s));
        if (wide) {
            _mm256_storeu_si256((__m256i *)(qa16 + b * BQ_TILE), _mm512_cvtepi32_epi16(q0));
            _mm256_storeu_si256((__m256i *)(qa16 + b * BQ_TILE + 16), _mm512_cvtepi32_epi16(q1));
        } else {
            _mm_storeu_si128((__m128i *)(qa + b * BQ_TILE), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(qa + b * BQ_TILE + 16), _mm512_cvtepi32_epi8(q1));
        }
        block_sums(xa, r * xa->blocks + b, d, _mm512_reduce_add_epi32(q0),
                   _mm512_reduce_add_epi32(q1), wide);
        block_pairs(xa, r, b);
        if (xa->tiled != NULL) tile_block(xa, qa + b * BQ_TILE, r, b);
    }
}
#endif

/* Row r of x into the activations, scaled per `group` blocks (1 or 8), by the AVX-512 loop
 * where `vector` (which the caller sets only where bq_paths() has the AVX-512 path), else the
 * plain one. */
static inline void quantize_row(const bq_acts *xa, const float *x, int64_t k, int64_t r,
                                int vector, int group) {
#if BQ_X86
    if (vector) {
        quantize_row_avx512(xa, x, k, r, group);
        return;
    }
#endif
    (void)vector;
    quantize_row_plain(xa, x, k, r, group);
}

#endif
