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
 * codes' sum_j (|sum_j| <= 32 x 127) as int16 pairs, two sub-blocks to one vpdpwssd whose
 * pair of sums is a memory operand (bq_tiled's pair fields). A fixed offset is summed the
 * same way, D_j offset sum_j = d offset sc_j sum_j. Once per file block a row then takes
 * two FMAs, into its output in memory (bq_vnni.h keeps its sums in registers, which the
 * file block's sums take here).
 */
#ifndef PAGEDSERVE_BQ_VNNI_K_H
#define PAGEDSERVE_BQ_VNNI_K_H

#include "bq_vnni.h"

#if BQ_X86

#define BQ_K_TILES (256 / BQ_TILE) /* tiles of a K type's file block */

/* Lane o: (w_2q[o], w_2q+1[o]) as two int16, the pair vpdpwssd multiplies with a row's two
 * sums; w the integer mins (S_K_DM: their own bytes; S_K_DM4: the high nibble of the scale's
 * byte) or the signed scales of a type with a fixed offset. Sub-blocks 2q and 2q + 1 lie in
 * 32 adjacent bytes, widened and then interleaved by one word permutation. */
BQ_INLINE BQ_VNNI __m512i vnni_k_weight_pair(const bq_layout *L, const uint8_t *p, int q) {
    const __m512i interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i w;
    if (L->scales == S_K_D) {
        const uint8_t *scales = p + bq_k_scales_at(L, 2 * q);
        w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)scales));
    } else {
        __m256i mins = _mm256_loadu_si256((const __m256i *)(p + bq_k_mins_at(L, 2 * q)));
        if (L->scales == S_K_DM4)
            mins = _mm256_and_si256(_mm256_srli_epi16(mins, 4), _mm256_set1_epi8(15));
        w = _mm512_cvtepu8_epi16(mins);
    }
    return _mm512_permutexvar_epi16(interleave, w);
}

/* acc += w's int16 pairs dotted with the pair at p, broadcast to every lane (folded into the
 * instruction's memory operand, as vnni_dot_at does). */
BQ_INLINE BQ_VNNI __m512i vnni_pair_dot_at(__m512i acc, __m512i w, const uint32_t *p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}

/* Row r's pair q of sums in file block b, in the plain rows' pairs (as bq_tiled.pair). */
BQ_INLINE const uint32_t *vnni_k_plain_pair(const bq_acts *xa, int64_t row, int64_t b, int q,
                                            int halves) {
    const int64_t blk = row * xa->blocks + b * BQ_K_TILES + (halves == 2 ? q : 2 * q);
    return &xa->pairs[2 * blk + (halves == 2 ? 0 : 1)];
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
        for (int r = 0; r < nr; r++) inner[r] = _mm512_setzero_ps();
        /* two tiles a pass, the passes a loop (all eight unrolled take the decoded-op cache) */
#pragma GCC unroll 1
        for (int kk = 0; kk < BQ_K_TILES; kk += 2)
#pragma GCC unroll 2
        for (int k = kk; k < kk + 2; k++) {
            const int64_t t = b * BQ_K_TILES + k;
            const uint8_t *tile = bq_tile(s, g, t);
            const bq_tiled *T =
                tiled ? (const bq_tiled *)(at + k * (int64_t)sizeof(bq_tiled)) : NULL;
            bq_prefetch(s, L, g, t);
#pragma GCC unroll 2
            for (int h = 0; h < halves; h++) {
                __m512i dot[BQ_TILE_ROWS], odd[BQ_TILE_ROWS];
                for (int r = 0; r < nr; r++) dot[r] = odd[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int c = h * 8 / halves; c < (h + 1) * 8 / halves; c++) {
                    vnni_rows_dot(xa, T, tiled, r0, nr, t, c, vnni_codes(tile, codes, c), dot,
                                  odd);
                }
                const __m512 D = vnni_k_scale(L, p, d, k * halves + h);
                for (int r = 0; r < nr; r++) {
                    const __m512i v = nr <= 2 ? _mm512_add_epi32(dot[r], odd[r]) : dot[r];
                    inner[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), D, inner[r]);
                }
            }
        }
        /* the sums' part in integers: sum_j w_j sum_j, w the mins or the offset's scales */
        __m512i isum[BQ_TILE_ROWS];
        for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 4 * halves; q++) {
            const __m512i w = vnni_k_weight_pair(L, p, q);
            const int64_t tile_of_pair = halves == 2 ? q : 2 * q;
            const bq_tiled *T =
                tiled ? (const bq_tiled *)(at + tile_of_pair * (int64_t)sizeof(bq_tiled)) : NULL;
            for (int r = 0; r < nr; r++)
                isum[r] = vnni_pair_dot_at(isum[r], w,
                                           tiled ? &T->pair[halves == 2 ? 0 : 1][r]
                                                 : vnni_k_plain_pair(xa, r0 + r, b, q, halves));
        }
        /* mins: M_j = -dmin m_j; a fixed offset: D_j offset = d offset sc_j */
        const __m512 coef =
            mins ? _mm512_sub_ps(_mm512_setzero_ps(),
                                 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))))
                 : _mm512_mul_ps(d, _mm512_set1_ps((float)L->offset));
        for (int r = 0; r < nr; r++) {
            const float dx = tiled ? ((const bq_tiled *)at)->da[r]
                                   : xa->da[(r0 + r) * xa->blocks + b * BQ_K_TILES];
            const __m512 v = _mm512_fmadd_ps(coef, _mm512_cvtepi32_ps(isum[r]), inner[r]);
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
