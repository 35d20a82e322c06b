/* F16 and BF16 weights kept at 16 bits: packed in the groups of 16 outputs every path reads,
 * widened to float32 on the fly (F16C's conversion, or bfloat16's 16-bit shift) and
 * multiplied by the float32 activations with FMA: the float32 product of the file's
 * weights, with no float copy of them. */
#ifndef PAGEDSERVE_BQ_FLOAT16_H
#define PAGEDSERVE_BQ_FLOAT16_H

#include "bq_avx2.h"

static inline float bq_bf16(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float bq_half(const bq_layout *L, uint16_t h) {
    return L->codes == C_BF16 ? bq_bf16(h) : bq_f16(h);
}

/* Group g of a 16-bit weight whose row r starts at src + r * src_stride. */
static void bq_pack_group16(const bq_seg *s, const uint8_t *src, int64_t src_stride, int64_t rows,
                            int64_t g) {
    uint16_t *dst = (uint16_t *)(s->codes + g * s->group_bytes);
    memset(dst, 0, (size_t)s->group_bytes);
    for (int o = 0; o < BQ_GROUP && g * BQ_GROUP + o < rows; o++) {
        const uint8_t *row = src + (g * BQ_GROUP + o) * src_stride;
        for (int64_t e = 0; e < s->k; e++) memcpy(dst + e * BQ_GROUP + o, row + 2 * e, 2);
    }
}

static void bq_dequantize_row16(const bq_seg *s, int64_t row, float *out) {
    const uint16_t *w = (const uint16_t *)(s->codes + row / BQ_GROUP * s->group_bytes);
    for (int64_t e = 0; e < s->k; e++) out[e] = bq_half(s->L, w[e * BQ_GROUP + row % BQ_GROUP]);
}

static void tile16_portable(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, int nr,
                            float out[BQ_TILE_ROWS][BQ_GROUP]) {
    const uint16_t *w = (const uint16_t *)(s->codes + g * s->group_bytes);
    for (int r = 0; r < nr; r++) {
        const float *x = xa->x + (r0 + r) * xa->x_stride;
        float acc[BQ_GROUP] = {0};
        for (int64_t e = 0; e < s->k; e++) {
            float wide[BQ_GROUP];
            for (int o = 0; o < BQ_GROUP; o++) wide[o] = bq_half(s->L, w[e * BQ_GROUP + o]);
            for (int o = 0; o < BQ_GROUP; o++) acc[o] += wide[o] * x[e];
        }
        memcpy(out[r], acc, sizeof acc);
    }
}

#if BQ_X86
BQ_INLINE BQ_VNNI __m512 avx512_widen(const uint16_t *p, const int bf16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* unroll: independent sums per row over interleaved inputs, so that a single row is not one
 * chain of dependent FMAs (4 cycles each). */
static inline __attribute__((always_inline)) BQ_VNNI void
tile16_avx512(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, const int nr,
              float (*out)[BQ_GROUP], const int bf16) {
    const uint16_t *w = (const uint16_t *)(s->codes + g * s->group_bytes);
    const int unroll = nr == 1 ? 4 : 2;
    __m512 acc[4][4];
    for (int u = 0; u < unroll; u++)
        for (int r = 0; r < nr; r++) acc[u][r] = _mm512_setzero_ps();
    for (int64_t e = 0; e < s->k; e += unroll) {
        for (int u = 0; u < unroll; u++) {
            const __m512 wide = avx512_widen(w + (e + u) * BQ_GROUP, bf16);
            for (int r = 0; r < nr; r++) {
                const __m512 x = _mm512_set1_ps(xa->x[(r0 + r) * xa->x_stride + e + u]);
                acc[u][r] = _mm512_fmadd_ps(wide, x, acc[u][r]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int u = 1; u < unroll; u++) acc[0][r] = _mm512_add_ps(acc[0][r], acc[u][r]);
        _mm512_storeu_ps(out[r], acc[0][r]);
    }
}

BQ_INLINE BQ_AVX2 __m256 avx2_widen(const uint16_t *p, const int bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline __attribute__((always_inline)) BQ_AVX2 void
tile16_avx2(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, const int nr,
            float out[BQ_TILE_ROWS][BQ_GROUP], int row_at, const int bf16) {
    const uint16_t *w = (const uint16_t *)(s->codes + g * s->group_bytes);
    const int unroll = nr == 1 ? 2 : 1;
    __m256 lo[2][2], hi[2][2];
    for (int u = 0; u < unroll; u++)
        for (int r = 0; r < nr; r++) lo[u][r] = hi[u][r] = _mm256_setzero_ps();
    for (int64_t e = 0; e < s->k; e += unroll) {
        for (int u = 0; u < unroll; u++) {
            const uint16_t *p = w + (e + u) * BQ_GROUP;
            const __m256 w0 = avx2_widen(p, bf16), w1 = avx2_widen(p + 8, bf16);
            for (int r = 0; r < nr; r++) {
                const __m256 x = _mm256_set1_ps(xa->x[(r0 + row_at + r) * xa->x_stride + e + u]);
                lo[u][r] = _mm256_fmadd_ps(w0, x, lo[u][r]);
                hi[u][r] = _mm256_fmadd_ps(w1, x, hi[u][r]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        if (unroll == 2) {
            lo[0][r] = _mm256_add_ps(lo[0][r], lo[1][r]);
            hi[0][r] = _mm256_add_ps(hi[0][r], hi[1][r]);
        }
        _mm256_storeu_ps(out[row_at + r], lo[0][r]);
        _mm256_storeu_ps(out[row_at + r] + 8, hi[0][r]);
    }
}

#define TILE16(bf16)                                                                            \
    static BQ_VNNI void avx512_16_##bf16(const bq_seg *s, const bq_acts *xa, int64_t g,       \
                                         int64_t r0, int nr, float out[BQ_TILE_ROWS][BQ_GROUP]) { \
        for (int at = 0; at < nr; at += 4) {                                                    \
            switch (nr - at) {                                                                  \
            case 1: tile16_avx512(s, xa, g, r0 + at, 1, out + at, bf16); break;                \
            case 2: tile16_avx512(s, xa, g, r0 + at, 2, out + at, bf16); break;                \
            case 3: tile16_avx512(s, xa, g, r0 + at, 3, out + at, bf16); break;                \
            default: tile16_avx512(s, xa, g, r0 + at, 4, out + at, bf16); break;               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    static BQ_AVX2 void avx2_16_##bf16(const bq_seg *s, const bq_acts *xa, int64_t g,         \
                                       int64_t r0, int nr, float out[BQ_TILE_ROWS][BQ_GROUP]) { \
        for (int at = 0; at < nr; at += 2) {                                                    \
            if (nr - at == 1) tile16_avx2(s, xa, g, r0, 1, out, at, bf16);                     \
            else tile16_avx2(s, xa, g, r0, 2, out, at, bf16);                                  \
        }                                                                                       \
    }
TILE16(0)
TILE16(1)
#endif

#endif
