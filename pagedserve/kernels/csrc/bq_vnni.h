/* The AVX-512 VNNI path: a chunk of codes (16 outputs x 4 inputs) is one 512-bit register of
 * unsigned bytes, decoded from its planes with a few shifts and masks (the IQ4 codebook by one
 * byte shuffle), and one dpbusd against the row's 4 activations broadcast to every lane adds
 * it to the 16 outputs' int32 sums. With int16 activations each chunk widens to two registers
 * of 16-bit codes and dpwssd takes 2 inputs a lane (the pairs of lanes are added once per
 * sub-block). */
#ifndef PAGEDSERVE_BQ_VNNI_H
#define PAGEDSERVE_BQ_VNNI_H

#include "bq_portable.h"

#if BQ_X86

#define BQ_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define BQ_INLINE static inline __attribute__((always_inline))

/* Bits of each byte of v moved from position `from` to `to` (a constant per unrolled chunk),
 * masked to `mask`: the 16-bit shifts bring in no bits from the neighbouring byte that the
 * mask keeps, as long as from and to lie in 0..7. */
BQ_INLINE BQ_VNNI __m512i vnni_bits(__m512i v, int from, int to, int mask) {
    if (from > to) v = _mm512_srli_epi16(v, from - to);
    if (from < to) v = _mm512_slli_epi16(v, to - from);
    return _mm512_and_si512(v, _mm512_set1_epi8((char)mask));
}

/* Chunk c of the tile's codes as unsigned bytes (enum bq_codes `codes`). */
BQ_INLINE BQ_VNNI __m512i vnni_codes(const uint8_t *tile, const int codes, const int c) {
    if (codes == C_BYTES) return _mm512_loadu_si512(tile + c * BQ_CHUNK);
    if (codes == C_LO2 || codes == C_LO2_HI1) {
        const __m512i crumbs = _mm512_loadu_si512(tile + (c / 4) * BQ_CHUNK);
        const __m512i lo = vnni_bits(crumbs, 2 * (c % 4), 0, 3);
        if (codes == C_LO2) return lo;
        return _mm512_or_si512(lo, vnni_bits(_mm512_loadu_si512(tile + 128), c, 2, 4));
    }
    const __m512i nibbles = _mm512_loadu_si512(tile + (c / 2) * BQ_CHUNK);
    const __m512i low = vnni_bits(nibbles, 4 * (c % 2), 0, 15);
    if (codes == C_NIB) return low;
    if (codes == C_NIB_HI1)
        return _mm512_or_si512(low, vnni_bits(_mm512_loadu_si512(tile + 256), c, 4, 16));
    if (codes == C_NIB_HI2) {
        const __m512i crumbs = _mm512_loadu_si512(tile + 256 + (c / 4) * BQ_CHUNK);
        return _mm512_or_si512(low, vnni_bits(crumbs, 2 * (c % 4), 4, 48));
    }
    const __m128i book = _mm_add_epi8(_mm_loadu_si128((const __m128i *)BQ_CODEBOOK),
                                      _mm_set1_epi8(-128));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(book), low); /* C_BOOK: codebook + 128 */
}

/* D_j = d sc_j of a K type's sub-block j in scale part p, for the 16 lanes. */
BQ_INLINE BQ_VNNI __m512 vnni_k_scale(const bq_layout *L, const uint8_t *p, __m512 d, int j) {
    const __m128i sc = _mm_loadu_si128((const __m128i *)(p + bq_k_scales_at(L, j)));
    __m512i s;
    if (L->scales == S_K_D) s = _mm512_cvtepi8_epi32(sc);
    else if (L->scales == S_K_DM) s = _mm512_cvtepu8_epi32(sc);
    else s = _mm512_and_si512(_mm512_cvtepu8_epi32(sc), _mm512_set1_epi32(15));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(s));
}

/* D (and M) of sub-block h of tile t for the 16 lanes. */
BQ_INLINE BQ_VNNI void vnni_scales(const bq_layout *L, const bq_seg *s, int64_t g, int64_t t,
                                   int h, __m512 *D, __m512 *M) {
    const uint8_t *p = bq_scale_part(s, g, t * BQ_TILE / L->block);
    const int j = (int)((t * BQ_TILE % L->block) / L->sub) + h;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    switch (L->scales) {
    case S_D: *D = d; return;
    case S_DM: *D = d; *M = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))); return;
    case S_K_D: *D = vnni_k_scale(L, p, d, j); return;
    default: {
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        const __m128i mins = _mm_loadu_si128((const __m128i *)(p + bq_k_mins_at(L, j)));
        __m512i m = _mm512_cvtepu8_epi32(mins);
        if (L->scales == S_K_DM4) m = _mm512_srli_epi32(m, 4);
        *D = vnni_k_scale(L, p, d, j);
        *M = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m)));
    }
    }
}

BQ_INLINE int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

BQ_INLINE int64_t load_i64(const void *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc += the sub-block's dot (int32 lanes) as bq_kernel.h says. */
BQ_INLINE BQ_VNNI __m512 vnni_apply(const bq_layout *L, __m512 acc, __m512i dot, __m512 D,
                                    __m512 M, bq_row_scales a) {
    if (L->offset) dot = _mm512_add_epi32(dot, _mm512_set1_epi32(L->offset * a.sum));
    const __m512 scale = _mm512_mul_ps(D, _mm512_set1_ps(a.da));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
    if (!L->offset) acc = _mm512_fmadd_ps(M, _mm512_set1_ps(a.mins), acc);
    return acc;
}

/* acc += u's unsigned bytes dotted with the 4 signed bytes at p, broadcast to every lane, the
 * broadcast folded into the instruction's memory operand (the compiler emits a separate
 * broadcast for the intrinsic: one more instruction for every dot product). */
BQ_INLINE BQ_VNNI __m512i vnni_dot_at(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
}

/* dot[r] (odd[r] for an odd chunk of one or two rows, so that a row's dot products are not
 * one chain of dependent instructions) += chunk c of block t's codes u times row r0 + r's
 * int8 activations: the tiled block T's where `tiled`, else the plain rows'. */
BQ_INLINE BQ_VNNI void vnni_rows_dot(const bq_acts *xa, const bq_tiled *T, const int tiled,
                                     int64_t r0, const int nr, int64_t t, const int c, __m512i u,
                                     __m512i *dot, __m512i *odd) {
    for (int r = 0; r < nr; r++) {
        const int8_t *a =
            tiled ? T->codes[c][r] : xa->qa + ((r0 + r) * xa->blocks + t) * BQ_TILE + 4 * c;
        if (nr <= 2 && c % 2) odd[r] = vnni_dot_at(odd[r], u, a);
        else dot[r] = vnni_dot_at(dot[r], u, a);
    }
}

/* li: the layout's index in BQ_LAYOUTS, a constant in every instance, so that its fields
 * fold into the code. */
static inline __attribute__((always_inline)) BQ_VNNI void
vnni_tile(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, const int nr,
          float (*out)[BQ_GROUP], const int li, const int wide) {
    const bq_layout *L = &BQ_LAYOUTS[li];
    const int codes = L->codes;
    const int halves = (codes == C_NIB_HI2 || codes == C_LO2 || codes == C_LO2_HI1) ? 2 : 1;
    const __m512i evens =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds =
        _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 acc[BQ_TILE_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    /* int8 activations of 4 rows or more come tiled: rows r0 .. r0 + nr - 1 are rows i0 ..
     * of their 8. The loop moves one pointer, to row i0's codes of block t, and reads every
     * row and chunk at a constant offset from it (an index kept apart per row and chunk would
     * be 64 values the loop reloads). One or two rows read the plain rows, which take fewer
     * cache lines a block than the tiles. */
    const int tiled = !wide && nr >= 4;
    const int i0 = (int)(r0 % BQ_TILE_ROWS);
    const uint8_t *at = !tiled ? NULL
                             : (const uint8_t *)(xa->tiled + r0 / BQ_TILE_ROWS * xa->blocks) +
                                   4 * i0;
    for (int64_t t = 0; t < s->tiles; t++, at += tiled ? sizeof(bq_tiled) : 0) {
        const uint8_t *tile = bq_tile(s, g, t);
        /* block t's tiled activations, shifted by i0 rows: T->x[r] is row i0 + r's */
        const bq_tiled *T = (const bq_tiled *)(at);
        bq_prefetch(s, L, g, t);
        /* unrolled, so that each half's chunk loop has constant bounds */
#pragma GCC unroll 2
        for (int h = 0; h < halves; h++) {
            /* few rows: even and odd chunks in two sums, so that the dot products of one row
             * are not one chain of dependent instructions */
            __m512i dot[BQ_TILE_ROWS], hi[BQ_TILE_ROWS], odd[BQ_TILE_ROWS];
            for (int r = 0; r < nr; r++) dot[r] = hi[r] = odd[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = h * 8 / halves; c < (h + 1) * 8 / halves; c++) {
                const __m512i u = vnni_codes(tile, codes, c);
                if (!wide) {
                    vnni_rows_dot(xa, T, tiled, r0, nr, t, c, u, dot, odd);
                } else {
                    const __m512i ulo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(u));
                    const __m512i uhi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(u, 1));
                    for (int r = 0; r < nr; r++) {
                        const int16_t *a = xa->qa16 + ((r0 + r) * xa->blocks + t) * BQ_TILE + 4 * c;
                        const __m512i av = _mm512_set1_epi64(load_i64(a));
                        dot[r] = _mm512_dpwssd_epi32(dot[r], ulo, av);
                        hi[r] = _mm512_dpwssd_epi32(hi[r], uhi, av);
                    }
                }
            }
            __m512 D, M = _mm512_setzero_ps();
            vnni_scales(L, s, g, t, h, &D, &M);
            for (int r = 0; r < nr; r++) {
                __m512i d = nr <= 2 && !wide ? _mm512_add_epi32(dot[r], odd[r]) : dot[r];
                if (wide) /* lanes (output, input pair) -> output */
                    d = _mm512_add_epi32(_mm512_permutex2var_epi32(dot[r], evens, hi[r]),
                                         _mm512_permutex2var_epi32(dot[r], odds, hi[r]));
                acc[r] = vnni_apply(
                    L, acc[r], d, D, M,
                    tiled ? bq_tiled_scales(L, T, r, h, halves)
                          : bq_plain_scales(L, xa, (r0 + r) * xa->blocks + t, h, halves));
            }
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(out[r], acc[r]);
}

/* Rows in tiles of 8, 4, 2 and 1 (int16 activations: 4 and 1), each row count a constant so
 * that the accumulators stay in registers. */
BQ_INLINE BQ_VNNI void vnni_rows(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0,
                                 int nr, float (*out)[BQ_GROUP], const int li, const int wide) {
    int at = 0;
    if (!wide && nr - at >= 8) { vnni_tile(s, xa, g, r0 + at, 8, out + at, li, 0); at += 8; }
    while (nr - at >= 4) { vnni_tile(s, xa, g, r0 + at, 4, out + at, li, wide); at += 4; }
    if (!wide && nr - at >= 2) { vnni_tile(s, xa, g, r0 + at, 2, out + at, li, 0); at += 2; }
    while (nr - at >= 1) { vnni_tile(s, xa, g, r0 + at, 1, out + at, li, wide); at += 1; }
}

#define VNNI_TYPE(li)                                                                           \
    static BQ_VNNI void vnni_##li##_0(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, \
                                      int nr, float (*out)[BQ_GROUP]) {                         \
        vnni_rows(s, xa, g, r0, nr, out, li, 0);                                                \
    }                                                                                           \
    static BQ_VNNI void vnni_##li##_1(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, \
                                      int nr, float (*out)[BQ_GROUP]) {                         \
        vnni_rows(s, xa, g, r0, nr, out, li, 1);                                                \
    }
VNNI_TYPE(0) VNNI_TYPE(1) VNNI_TYPE(2) VNNI_TYPE(3) VNNI_TYPE(4) VNNI_TYPE(5)
VNNI_TYPE(6) VNNI_TYPE(7) VNNI_TYPE(8) VNNI_TYPE(9) VNNI_TYPE(10) VNNI_TYPE(11)

/* By layout index (the block types: the first 12 of BQ_LAYOUTS) and activation width. */
static const bq_tile_fn VNNI_TILES[12][2] = {
    {vnni_0_0, vnni_0_1}, {vnni_1_0, vnni_1_1}, {vnni_2_0, vnni_2_1}, {vnni_3_0, vnni_3_1},
    {vnni_4_0, vnni_4_1}, {vnni_5_0, vnni_5_1}, {vnni_6_0, vnni_6_1}, {vnni_7_0, vnni_7_1},
    {vnni_8_0, vnni_8_1}, {vnni_9_0, vnni_9_1}, {vnni_10_0, vnni_10_1}, {vnni_11_0, vnni_11_1},
};

#endif
#endif
