/* Paged decode attention's two passes over a block, in AVX-512 tiles, for head sizes that are
 * a multiple of 16 (paged_decode.c includes this; elsewhere its plain loops run).
 *
 * The plain loops take one (query head, position) pair at a time: a dot product folded to a
 * scalar (a horizontal sum of about ten instructions for 64 elements), then the probability
 * times the V row added into the head's output row in memory (a load, a multiply-add and a
 * store a vector), each 16-bit row widened again for every query head that shares it. At a
 * few thousand positions that made attention about as costly as a 1B model's weights.
 *
 * Scores: a KV head's rows of up to 16 positions are widened once into a float32 tile; each
 * query head then takes 16 vector dot products against it, left unreduced, and one transpose
 * of sums (sum16) folds the 16 of them into the 16 positions' scores at once.
 * Weighted sum: up to 4 query heads x 4 vectors of their output rows stay in registers over a
 * block's positions, each V row widened once for all of them.
 *
 * Sums run in another order than the plain loops', so results differ from theirs in the last
 * bits; both are float32 throughout. */
#ifndef PAGEDSERVE_DECODE_TILES_H
#define PAGEDSERVE_DECODE_TILES_H

#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdint.h>

static inline __m512 widen16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 widen16_f16(const f16 *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 widen16_bf16(const bf16 *p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* Lane i of the result: the sum of v[i]'s 16 lanes. */
static inline __m512 sum16(const __m512 *v) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++) /* per 128 bits: v2i's and v2i+1's halves, interleaved */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                                 _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128 bits q: lane e holds v4i+e's sum over q */
        const __m512d a = _mm512_castps_pd(pairs[2 * i]);
        const __m512d b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 halves[2]; /* 128-bit lanes: quads 2i's q0+q1, q2+q3, then quads 2i+1's */
    for (int i = 0; i < 2; i++)
        halves[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of G query heads q [G, D] against 16 float32 rows kf [16, D] (rows past n are zero):
 * head g's n scores into scores + g * stride. */
static inline __attribute__((always_inline)) void score_tile(
    const float *q, const float *kf, int64_t n, int64_t G, const int64_t D, float *scores,
    int64_t stride) {
    const __mmask16 mask = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    for (int64_t g = 0; g < G; g++) {
        const float *qg = q + g * D;
        __m512 dots[16];
        for (int o = 0; o < 16; o++) dots[o] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) {
            const __m512 qv = _mm512_loadu_ps(qg + d);
            for (int o = 0; o < 16; o++)
                dots[o] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kf + o * D + d), dots[o]);
        }
        _mm512_mask_storeu_ps(scores + g * stride, mask, sum16(dots));
    }
}

/* acc rows of GN heads (D apart), CN vectors from element 0, += p[g * p_stride + o] x the
 * widened V row v + o * row_stride, for o < n. */
#define DEFINE_V_TILE(NAME, TC, WIDEN)                                                        \
static inline __attribute__((always_inline)) void NAME(                                       \
    float *acc, const int64_t D, const float *p, int64_t p_stride, const TC *v,                \
    int64_t row_stride, int64_t n, const int GN, const int CN) {                               \
    __m512 a[4][4];                                                                            \
    for (int g = 0; g < GN; g++)                                                               \
        for (int c = 0; c < CN; c++) a[g][c] = _mm512_loadu_ps(acc + g * D + 16 * c);          \
    for (int64_t o = 0; o < n; o++) {                                                          \
        __m512 row[4];                                                                         \
        for (int c = 0; c < CN; c++) row[c] = WIDEN(v + o * row_stride + 16 * c);              \
        for (int g = 0; g < GN; g++) {                                                         \
            const __m512 w = _mm512_set1_ps(p[g * p_stride + o]);                              \
            for (int c = 0; c < CN; c++) a[g][c] = _mm512_fmadd_ps(w, row[c], a[g][c]);        \
        }                                                                                      \
    }                                                                                          \
    for (int g = 0; g < GN; g++)                                                               \
        for (int c = 0; c < CN; c++) _mm512_storeu_ps(acc + g * D + 16 * c, a[g][c]);         \
}

/* The V tile for the (GN, CN) at hand, each a constant there, so its registers stay put. */
#define DEFINE_V_TILES(NAME, TILE, TC)                                                        \
static inline __attribute__((always_inline)) void NAME(                                       \
    float *acc, const int64_t D, const float *p, int64_t p_stride, const TC *v,                \
    int64_t row_stride, int64_t n, int GN, int CN) {                                           \
    switch (GN * 4 + CN) {                                                                     \
    case 4 + 1: TILE(acc, D, p, p_stride, v, row_stride, n, 1, 1); break;                      \
    case 4 + 2: TILE(acc, D, p, p_stride, v, row_stride, n, 1, 2); break;                      \
    case 4 + 3: TILE(acc, D, p, p_stride, v, row_stride, n, 1, 3); break;                      \
    case 4 + 4: TILE(acc, D, p, p_stride, v, row_stride, n, 1, 4); break;                      \
    case 8 + 1: TILE(acc, D, p, p_stride, v, row_stride, n, 2, 1); break;                      \
    case 8 + 2: TILE(acc, D, p, p_stride, v, row_stride, n, 2, 2); break;                      \
    case 8 + 3: TILE(acc, D, p, p_stride, v, row_stride, n, 2, 3); break;                      \
    case 8 + 4: TILE(acc, D, p, p_stride, v, row_stride, n, 2, 4); break;                      \
    case 12 + 1: TILE(acc, D, p, p_stride, v, row_stride, n, 3, 1); break;                     \
    case 12 + 2: TILE(acc, D, p, p_stride, v, row_stride, n, 3, 2); break;                     \
    case 12 + 3: TILE(acc, D, p, p_stride, v, row_stride, n, 3, 3); break;                     \
    case 12 + 4: TILE(acc, D, p, p_stride, v, row_stride, n, 3, 4); break;                     \
    case 16 + 1: TILE(acc, D, p, p_stride, v, row_stride, n, 4, 1); break;                     \
    case 16 + 2: TILE(acc, D, p, p_stride, v, row_stride, n, 4, 2); break;                     \
    case 16 + 3: TILE(acc, D, p, p_stride, v, row_stride, n, 4, 3); break;                     \
    default: TILE(acc, D, p, p_stride, v, row_stride, n, 4, 4); break;                         \
    }                                                                                          \
}

/* One sequence, KV heads [kv0, kv1), as paged_decode.c's DEFINE_ITEM (same arguments and
 * scratch; kf, 16 D floats, follows acc), for D a multiple of 16. */
#define DEFINE_TILED_ITEM(NAME, TQ, TC, LOADQ, WIDEN, STORE)                                  \
DEFINE_V_TILE(NAME##_v_tile, TC, WIDEN)                                                        \
DEFINE_V_TILES(NAME##_v_tiles, NAME##_v_tile, TC)                                              \
static inline __attribute__((always_inline)) void NAME(                                       \
    const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *table,         \
    int64_t len, TQ *out, int64_t kv0, int64_t kv1, int64_t num_kv_heads, int64_t G,           \
    const int64_t D, int64_t block_size, float scale, float *scores, int64_t score_stride,     \
    float *q, float *acc, const Visit *visit)                                                  \
{                                                                                              \
    const int64_t row_stride = num_kv_heads * D, H = (kv1 - kv0) * G;                         \
    const int64_t nb = visit->num_blocks;                                                      \
    float *kf = acc + H * D;                                                                   \
    for (int64_t i = 0; i < H * D; i++) q[i] = LOADQ(query, i) * scale;                        \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t in_block = len - start < block_size ? len - start : block_size;          \
        const TC *k = key_cache + (int64_t)table[b] * block_size * row_stride + kv0 * D;       \
        const char *ahead = block_at(visit, b + AHEAD);                                        \
        for (int64_t o = 0; o < in_block; o++) prefetch_row(visit, ahead, o);                  \
        for (int64_t o0 = 0; o0 < in_block; o0 += 16) {                                       \
            const int64_t n = in_block - o0 < 16 ? in_block - o0 : 16;                         \
            for (int64_t j = 0; j < kv1 - kv0; j++) {                                          \
                for (int64_t o = 0; o < 16; o++)                                               \
                    for (int64_t d = 0; d < D; d += 16)                                        \
                        _mm512_storeu_ps(kf + o * D + d,                                       \
                                         o < n ? WIDEN(k + (o0 + o) * row_stride + j * D + d)  \
                                               : _mm512_setzero_ps());                         \
                score_tile(q + j * G * D, kf, n, G, D,                                         \
                           scores + j * G * score_stride + start + o0, score_stride);          \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    softmax_rows(scores, H, score_stride, len);                                                \
    memset(acc, 0, sizeof(float) * (size_t)(H * D));                                           \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const TC *v = value_cache + (int64_t)table[b] * block_size * row_stride + kv0 * D;     \
        const char *ahead = block_at(visit, nb + b + AHEAD);                                   \
        for (int64_t o = 0; o < n; o++) prefetch_row(visit, ahead, o);                         \
        for (int64_t j = 0; j < kv1 - kv0; j++)                                                \
            for (int64_t g = 0; g < G; g += 4)                                                 \
                for (int64_t c = 0; c < D / 16; c += 4)                                        \
                    NAME##_v_tiles(acc + (j * G + g) * D + 16 * c, D,                          \
                                   scores + (j * G + g) * score_stride + start, score_stride,  \
                                   v + j * D + 16 * c, row_stride, n,                          \
                                   (int)(G - g < 4 ? G - g : 4),                               \
                                   (int)(D / 16 - c < 4 ? D / 16 - c : 4));                    \
    }                                                                                          \
    for (int64_t i = 0; i < H * D; i++) STORE(out, i, acc[i]);                                 \
}

#endif
#endif
