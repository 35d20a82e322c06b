/* Paged decode attention in AVX-512 tiles, for head sizes that are a multiple of 16
 * (paged_decode.c includes this; elsewhere its plain loops run).
 *
 * The plain loops take one (query head, position) pair at a time: a dot product folded to a
 * scalar (a horizontal sum of about ten instructions for 64 elements), then the probability
 * times the V row added into the head's output row in memory (a load, a multiply-add and a
 * store a vector), each 16-bit row widened again for every query head that shares it, and a
 * score buffer of every position written, read by the softmax and read again.
 *
 * Here one pass goes over the blocks, reading each block's K and V together, 16 positions at a
 * time:
 * - Scores: a KV head's 16 rows are widened once into a float32 tile; each query head takes 16
 *   vector dot products against it, left unreduced, and one transpose of sums (sum16) folds
 *   them into the 16 positions' scores at once.
 * - Softmax online: each head keeps its running maximum and sum; the 16 new weights are
 *   e^(score - maximum), and the output so far is rescaled when the maximum grows.
 * - Weighted sum: up to 4 query heads x 4 vectors of their output rows stay in registers over
 *   the 16 positions, each V row widened once for all of them.
 *
 * On the 1B model's shape (32 query heads, 8 KV heads of 64) with 2 threads, a step's 16
 * layers at 4,096 positions took 3.6 ms against 7.1 with the plain loops when the cache was
 * in the processor's caches, and about 10 ms either way from memory, where the scattered
 * blocks' reads, not the arithmetic, set the pace. Sums run in another order than the plain
 * loops', so results differ from theirs in the last bits; both are float32 throughout. */
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

/* e^x of 16 lanes, as vec_math.h's exp_f32 computes it (the same clamp and polynomial), with
 * the power of two applied by scalef. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, k);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* Query heads q [G, D] against 16 float32 rows kf [16, D] (rows n and past are zero): each
 * head's running maximum m and sum l take the n new scores (online softmax); its weights
 * e^(score - m) go to p + 16 g and the factor its earlier output rescales by to alpha[g]. */
static inline __attribute__((always_inline)) void score_tile(
    const float *q, const float *kf, int64_t n, int64_t G, const int64_t D, float *m, float *l,
    float *p, float *alpha) {
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
        const __m512 scores = sum16(dots);
        const float top = _mm512_mask_reduce_max_ps(mask, scores);
        const float m_new = top > m[g] ? top : m[g];
        const __m512 w = _mm512_maskz_mov_ps(
            mask, exp16(_mm512_sub_ps(scores, _mm512_set1_ps(m_new))));
        alpha[g] = exp_f32(m[g] - m_new);
        l[g] = l[g] * alpha[g] + _mm512_reduce_add_ps(w);
        m[g] = m_new;
        _mm512_storeu_ps(p + 16 * g, w);
    }
}

/* acc rows of GN heads (D apart), CN vectors from element 0: acc = acc alpha[g] + the sum over
 * o < n of p[16 g + o] x the widened V row v + o * row_stride. */
#define DEFINE_V_TILE(NAME, TC, WIDEN)                                                        \
static inline __attribute__((always_inline)) void NAME(                                       \
    float *acc, const int64_t D, const float *p, const float *alpha, const TC *v,              \
    int64_t row_stride, int64_t n, const int GN, const int CN) {                               \
    __m512 a[4][4];                                                                            \
    for (int g = 0; g < GN; g++)                                                               \
        for (int c = 0; c < CN; c++)                                                           \
            a[g][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + 16 * c),                     \
                                    _mm512_set1_ps(alpha[g]));                                 \
    for (int64_t o = 0; o < n; o++) {                                                          \
        __m512 row[4];                                                                         \
        for (int c = 0; c < CN; c++) row[c] = WIDEN(v + o * row_stride + 16 * c);              \
        for (int g = 0; g < GN; g++) {                                                         \
            const __m512 w = _mm512_set1_ps(p[16 * g + o]);                                    \
            for (int c = 0; c < CN; c++) a[g][c] = _mm512_fmadd_ps(w, row[c], a[g][c]);        \
        }                                                                                      \
    }                                                                                          \
    for (int g = 0; g < GN; g++)                                                               \
        for (int c = 0; c < CN; c++) _mm512_storeu_ps(acc + g * D + 16 * c, a[g][c]);         \
}

/* The V tile for the (GN, CN) at hand, each a constant there, so its registers stay put. */
#define V_TILE_CASE(TILE, GN, CN)                                                             \
    case (GN) * 4 + (CN): TILE(acc, D, p, alpha, v, row_stride, n, GN, CN); break;
#define DEFINE_V_TILES(NAME, TILE, TC)                                                        \
static inline __attribute__((always_inline)) void NAME(                                       \
    float *acc, const int64_t D, const float *p, const float *alpha, const TC *v,              \
    int64_t row_stride, int64_t n, int GN, int CN) {                                           \
    switch (GN * 4 + CN) {                                                                     \
    V_TILE_CASE(TILE, 1, 1) V_TILE_CASE(TILE, 1, 2) V_TILE_CASE(TILE, 1, 3)                    \
    V_TILE_CASE(TILE, 1, 4) V_TILE_CASE(TILE, 2, 1) V_TILE_CASE(TILE, 2, 2)                    \
    V_TILE_CASE(TILE, 2, 3) V_TILE_CASE(TILE, 2, 4) V_TILE_CASE(TILE, 3, 1)                    \
    V_TILE_CASE(TILE, 3, 2) V_TILE_CASE(TILE, 3, 3) V_TILE_CASE(TILE, 3, 4)                    \
    V_TILE_CASE(TILE, 4, 1) V_TILE_CASE(TILE, 4, 2) V_TILE_CASE(TILE, 4, 3)                    \
    default: TILE(acc, D, p, alpha, v, row_stride, n, 4, 4); break;                            \
    }                                                                                          \
}

/* The K or V block the single pass reaches AHEAD blocks after block b: this sequence's, else
 * (K only) the next sequence's first ones. */
static inline const char *tile_ahead(const Visit *v, int64_t b, int value) {
    const int64_t i = b + AHEAD;
    const char *cache = value ? v->value_cache : v->key_cache;
    if (i < v->num_blocks) return cache + (int64_t)v->table[i] * v->block_bytes;
    if (value || v->next_table == NULL || i - v->num_blocks >= v->next_num_blocks) return NULL;
    return cache + (int64_t)v->next_table[i - v->num_blocks] * v->block_bytes;
}

/* One sequence, KV heads [kv0, kv1), as paged_decode.c's DEFINE_ITEM (same arguments), for D a
 * multiple of 16, in one pass over the blocks: each block's K and V are read together, and the
 * softmax is the online one (running maximum and sum, earlier output rescaled as the maximum
 * grows). Scratch after acc: kf [16, D], p [G, 16], alpha, m and l [G] (tiled_scratch). */
#define DEFINE_TILED_ITEM(NAME, TQ, TC, LOADQ, WIDEN, STORE)                                  \
DEFINE_V_TILE(NAME##_v_tile, TC, WIDEN)                                                        \
DEFINE_V_TILES(NAME##_v_tiles, NAME##_v_tile, TC)                                              \
static inline __attribute__((always_inline)) void NAME(                                       \
    const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *table,         \
    int64_t len, TQ *out, int64_t kv0, int64_t kv1, int64_t num_kv_heads, int64_t G,           \
    const int64_t D, int64_t block_size, float scale, float *scores, int64_t score_stride,     \
    float *q, float *acc, const Visit *visit)                                                  \
{                                                                                              \
    (void)scores, (void)score_stride;                                                          \
    const int64_t row_stride = num_kv_heads * D, H = (kv1 - kv0) * G;                         \
    float *kf = acc + H * D, *p = kf + 16 * D, *alpha = p + 16 * G;                            \
    float *m = alpha + G, *l = m + H;                                                          \
    for (int64_t i = 0; i < H * D; i++) q[i] = LOADQ(query, i) * scale;                        \
    memset(acc, 0, sizeof(float) * (size_t)(H * D));                                           \
    for (int64_t h = 0; h < H; h++) m[h] = -INFINITY, l[h] = 0.0f;                             \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t in_block = len - start < block_size ? len - start : block_size;          \
        const int64_t at = (int64_t)table[b] * block_size * row_stride + kv0 * D;              \
        const char *k_ahead = tile_ahead(visit, b, 0), *v_ahead = tile_ahead(visit, b, 1);     \
        for (int64_t o = 0; o < in_block; o++) {                                               \
            prefetch_row(visit, k_ahead, o);                                                   \
            prefetch_row(visit, v_ahead, o);                                                   \
        }                                                                                      \
        for (int64_t o0 = 0; o0 < in_block; o0 += 16) {                                        \
            const int64_t n = in_block - o0 < 16 ? in_block - o0 : 16;                         \
            const TC *k = key_cache + at + o0 * row_stride;                                    \
            const TC *v = value_cache + at + o0 * row_stride;                                  \
            for (int64_t j = 0; j < kv1 - kv0; j++) {                                          \
                for (int64_t o = 0; o < 16; o++)                                               \
                    for (int64_t d = 0; d < D; d += 16)                                        \
                        _mm512_storeu_ps(kf + o * D + d,                                       \
                                         o < n ? WIDEN(k + o * row_stride + j * D + d)         \
                                               : _mm512_setzero_ps());                         \
                score_tile(q + j * G * D, kf, n, G, D, m + j * G, l + j * G, p, alpha);        \
                for (int64_t g = 0; g < G; g += 4)                                             \
                    for (int64_t c = 0; c < D / 16; c += 4)                                    \
                        NAME##_v_tiles(acc + (j * G + g) * D + 16 * c, D, p + 16 * g,          \
                                       alpha + g, v + j * D + 16 * c, row_stride, n,           \
                                       (int)(G - g < 4 ? G - g : 4),                           \
                                       (int)(D / 16 - c < 4 ? D / 16 - c : 4));                \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (int64_t h = 0; h < H; h++) {                                                          \
        const float inv = 1.0f / l[h];                                                         \
        for (int64_t d = 0; d < D; d++) STORE(out, h * D + d, acc[h * D + d] * inv);           \
    }                                                                                          \
}

/* Floats of scratch a tiled item needs after acc, for H query heads of G per KV head. */
static inline int64_t tiled_scratch(int64_t H, int64_t G, int64_t D) {
    return 16 * D + 17 * G + 2 * H;
}
#else
static inline int64_t tiled_scratch(int64_t H, int64_t G, int64_t D) {
    (void)H, (void)G, (void)D;
    return 0;
}
#endif

#endif
