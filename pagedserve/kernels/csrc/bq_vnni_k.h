/* The AVX-512 VNNI path for the K types (256 inputs a file block) over activations scaled per
 * 256 inputs, as llama.cpp's Q8_K scales them: every block of 32 of a row's 256 inputs has the
 * same scale dx, so a file block's float work moves out of its sub-blocks.
 *
 * The per-32 path (bq_vnni.h) applies every sub-block j as
 *
 *   y += (D_j dx_j) dot_j + M_j (dx_j sum_j)      (a multiply and two FMAs a row)
 *
 * With one dx for the file block, D_j = d sc_j and M_j = -dmin m_j give
 *
 *   y += dx (sum_j D_j dot_j  -  dmin sum_j m_j sum_j)
 *
 * one FMA a row per sub-block for the first sum, the second in integers: m_j (6 bits) and the
 * codes' sum_j (|sum_j| <= 32 x 127) as int16 pairs, two sub-blocks to one vpdpwssd. A fixed
 * offset stays in the integer dot (dot_j + offset sum_j). Once per file block a row then
 * takes two FMAs, into its output in memory (bq_vnni.h keeps its sums in registers, which
 * the integer sums take here).
 */
#ifndef PAGEDSERVE_BQ_VNNI_K_H
#define PAGEDSERVE_BQ_VNNI_K_H

#include "bq_vnni.h"

#if BQ_X86

#define BQ_K_TILES (256 / BQ_TILE) /* tiles of a K type's file block */

/* Sub-block j's integer mins for the 16 lanes as bytes (S_K_DM: their own bytes; S_K_DM4: the
 * high nibble of the scale's byte). */
BQ_INLINE BQ_VNNI __m128i vnni_k_mins(const bq_layout *L, const uint8_t *p, int j) {
    const int subs = bq_subs(L);
    if (L->scales == S_K_DM) return _mm_loadu_si128((const __m128i *)(p + 64 + 16 * (subs + j)));
    const __m128i both = _mm_loadu_si128((const __m128i *)(p + 64 + 16 * j));
    return _mm_and_si128(_mm_srli_epi16(both, 4), _mm_set1_epi8(15));
}

/* Lane o: (m_j0[o], m_j1[o]) as two int16, the pair vpdpwssd multiplies with a row's sums. */
BQ_INLINE BQ_VNNI __m512i vnni_k_min_pair(const bq_layout *L, const uint8_t *p, int j0) {
    const __m128i m0 = vnni_k_mins(L, p, j0), m1 = vnni_k_mins(L, p, j0 + 1);
    const __m256i pairs =
        _mm256_set_m128i(_mm_unpackhi_epi8(m0, m1), _mm_unpacklo_epi8(m0, m1));
    return _mm512_cvtepu8_epi16(pairs);
}

/* D_j = d sc_j for the 16 lanes. */
BQ_INLINE BQ_VNNI __m512 vnni_k_scale(const bq_layout *L, const uint8_t *p, __m512 d, int j) {
    const __m128i sc = _mm_loadu_si128((const __m128i *)(p + (L->offset ? 32 : 64) + 16 * j));
    __m512i s;
    if (L->scales == S_K_D) s = _mm512_cvtepi8_epi32(sc);
    else if (L->scales == S_K_DM) s = _mm512_cvtepu8_epi32(sc);
    else s = _mm512_and_si512(_mm512_cvtepu8_epi32(sc), _mm512_set1_epi32(15));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(s));
}

/* Two int16 sums in the 32 bits vpdpwssd broadcasts. */
BQ_INLINE uint32_t vnni_k_sum_pair(int32_t s0, int32_t s1) {
    return (uint32_t)(uint16_t)s0 | (uint32_t)s1 << 16;
}

/* As vnni_tile, for layout li (a K type), int8 activations scaled per 256 inputs. */
static inline __attribute__((always_inline)) BQ_VNNI void
vnni_k_tile(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, const int nr,
            float (*out)[BQ_GROUP], const int li) {
    const bq_layout *L = &BQ_LAYOUTS[li];
    const int codes = L->codes, halves = BQ_TILE / L->sub, mins = !L->offset;
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(out[r], _mm512_setzero_ps());
    const int tiled = nr >= 4;
    const int i0 = (int)(r0 % BQ_TILE_ROWS);
    const uint8_t *at = !tiled ? NULL
                             : (const uint8_t *)(xa->tiled + r0 / BQ_TILE_ROWS * xa->blocks) +
                                   4 * i0;
    for (int64_t b = 0; b < s->tiles / BQ_K_TILES; b++) {
        const uint8_t *p = bq_scale_part(s, g, b);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 inner[BQ_TILE_ROWS];
        __m512i imin[BQ_TILE_ROWS];
        for (int r = 0; r < nr; r++) inner[r] = _mm512_setzero_ps();
        for (int r = 0; r < nr; r++) imin[r] = _mm512_setzero_si512();
        int32_t held[BQ_TILE_ROWS]; /* a one-half type's sum of the even tile, for the pair */
        /* two tiles a pass (a one-half type's pair of sub-blocks), the passes a loop */
#pragma GCC unroll 1
        for (int kk = 0; kk < BQ_K_TILES; kk += 2)
#pragma GCC unroll 2
        for (int k = kk; k < kk + 2; k++) {
            const int64_t t = b * BQ_K_TILES + k;
            const uint8_t *tile = bq_tile(s, g, t);
            const bq_tiled *T =
                tiled ? (const bq_tiled *)(at + k * (int64_t)sizeof(bq_tiled)) : NULL;
            bq_prefetch(s, L, g, t);
            int32_t sums[2][BQ_TILE_ROWS]; /* each half's code sum, per row */
            for (int r = 0; r < nr; r++)
                for (int h = 0; h < halves; h++)
                    sums[h][r] = tiled ? T->sum[halves == 2 ? h : 2][r]
                                       : bq_sub_sum(xa, (r0 + r) * xa->blocks + t, h, halves);
#pragma GCC unroll 2
            for (int h = 0; h < halves; h++) {
                __m512i dot[BQ_TILE_ROWS], odd[BQ_TILE_ROWS];
                for (int r = 0; r < nr; r++) dot[r] = odd[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int c = h * 8 / halves; c < (h + 1) * 8 / halves; c++) {
                    const __m512i u = vnni_codes(tile, codes, c);
                    for (int r = 0; r < nr; r++) {
                        const int8_t *a =
                            tiled ? T->codes[c][r]
                                  : xa->qa + ((r0 + r) * xa->blocks + t) * BQ_TILE + 4 * c;
                        if (nr <= 2 && c % 2) odd[r] = vnni_dot_at(odd[r], u, a);
                        else dot[r] = vnni_dot_at(dot[r], u, a);
                    }
                }
                const __m512 D = vnni_k_scale(L, p, d, k * halves + h);
                for (int r = 0; r < nr; r++) {
                    __m512i v = nr <= 2 ? _mm512_add_epi32(dot[r], odd[r]) : dot[r];
                    if (L->offset) v = _mm512_add_epi32(v, _mm512_set1_epi32(L->offset * sums[h][r]));
                    inner[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), D, inner[r]);
                }
            }
            if (mins && halves == 2) { /* the tile's two sub-blocks are a pair */
                const __m512i m = vnni_k_min_pair(L, p, 2 * k);
                for (int r = 0; r < nr; r++)
                    imin[r] = _mm512_dpwssd_epi32(
                        imin[r], m, _mm512_set1_epi32((int)vnni_k_sum_pair(sums[0][r], sums[1][r])));
            } else if (mins && k == kk) {
                for (int r = 0; r < nr; r++) held[r] = sums[0][r];
            } else if (mins) { /* tiles k - 1 and k are a pair */
                const __m512i m = vnni_k_min_pair(L, p, k - 1);
                for (int r = 0; r < nr; r++)
                    imin[r] = _mm512_dpwssd_epi32(
                        imin[r], m, _mm512_set1_epi32((int)vnni_k_sum_pair(held[r], sums[0][r])));
            }
        }
        const __m512 dmin = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)))
                                 : _mm512_setzero_ps();
        for (int r = 0; r < nr; r++) {
            const float dx = tiled ? ((const bq_tiled *)at)->da[r]
                                   : xa->da[(r0 + r) * xa->blocks + b * BQ_K_TILES];
            __m512 v = inner[r];
            if (mins) v = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(imin[r]), v);
            _mm512_storeu_ps(out[r], _mm512_fmadd_ps(v, _mm512_set1_ps(dx),
                                                     _mm512_loadu_ps(out[r])));
        }
        if (tiled) at += BQ_K_TILES * sizeof(bq_tiled);
    }
}

BQ_INLINE BQ_VNNI void vnni_k_rows(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0,
                                   int nr, float (*out)[BQ_GROUP], const int li) {
    int at = 0;
    if (nr - at >= 8) { vnni_k_tile(s, xa, g, r0 + at, 8, out + at, li); at += 8; }
    while (nr - at >= 4) { vnni_k_tile(s, xa, g, r0 + at, 4, out + at, li); at += 4; }
    if (nr - at >= 2) { vnni_k_tile(s, xa, g, r0 + at, 2, out + at, li); at += 2; }
    while (nr - at >= 1) { vnni_k_tile(s, xa, g, r0 + at, 1, out + at, li); at += 1; }
}

#define VNNI_K_TYPE(li)                                                                        \
    static BQ_VNNI void vnni_k_##li(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, \
                                    int nr, float (*out)[BQ_GROUP]) {                         \
        vnni_k_rows(s, xa, g, r0, nr, out, li);                                               \
    }
VNNI_K_TYPE(5) VNNI_K_TYPE(6) VNNI_K_TYPE(7) VNNI_K_TYPE(8) VNNI_K_TYPE(9) VNNI_K_TYPE(11)

/* By layout index: the K types' (Q2_K .. Q6_K, IQ4_XS), NULL for the others. */
static const bq_tile_fn VNNI_K_TILES[12] = {
    NULL, NULL, NULL, NULL, NULL, vnni_k_5, vnni_k_6, vnni_k_7, vnni_k_8, vnni_k_9, NULL, vnni_k_11,
};

#endif
#endif
