/* The AVX2 path: the 16-output group as two 8-output halves (bytes 0-31 and 32-63 of each
 * chunk), one half after the other, up to 4 activation rows at a time (AVX2 has 16
 * registers). Codes of up to 6 bits are unsigned: maddubs multiplies them by the row's 4
 * activations and adds pairs into 16 bits, summed in 16 bits for as many chunks as cannot
 * saturate, then madd by ones adds the pairs into each output's int32. 8-bit codes would
 * saturate maddubs (255 x 127 x 2), so Q8_0 and the IQ4 codebook are decoded signed (their
 * offset applied) and multiplied as |q| times the activation carrying q's sign. With int16
 * activations the codes widen to 16 bits and madd takes 2 inputs a lane.
 *
 * The AVX-VNNI path (Intel's client cores since Alder Lake, AMD's since Zen 5: VNNI without
 * AVX-512) is the same loop with one vpdpbusd in place of maddubs, the 16-bit sum and madd:
 * it adds the 4 products of each lane into its int32 at once, so nothing can saturate. */
#ifndef PAGEDSERVE_BQ_AVX2_H
#define PAGEDSERVE_BQ_AVX2_H

#include "bq_vnni.h"

#if BQ_X86

#define BQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_ROWS 4

BQ_INLINE BQ_AVX2 __m256i avx2_bits(__m256i v, int from, int to, int mask) {
    if (from > to) v = _mm256_srli_epi16(v, from - to);
    if (from < to) v = _mm256_slli_epi16(v, to - from);
    return _mm256_and_si256(v, _mm256_set1_epi8((char)mask));
}

/* acc += the 4 products of u's unsigned bytes and a's signed bytes in each int32 lane:
 * AVX-VNNI's vpdpbusd. It is written in assembly so that it can sit in this AVX2 code (a
 * function compiled for the avxvnni target could not be inlined into it); only the AVX-VNNI
 * path, which bq_paths() offers where the CPU has it, reaches it. */
BQ_INLINE BQ_AVX2 __m256i avxvnni_dot(__m256i acc, __m256i u, __m256i a) {
    __asm__("%{vex%} vpdpbusd %t2, %t1, %t0" : "+x"(acc) : "x"(u), "x"(a));
    return acc;
}

BQ_INLINE BQ_AVX2 __m256i avx2_load(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Half `x` of chunk c of the tile's codes: unsigned, or signed (offset applied) for 8-bit
 * codes. */
BQ_INLINE BQ_AVX2 __m256i avx2_codes(const uint8_t *tile, const int codes, const int c, int x) {
    const int at = 32 * x;
    if (codes == C_BYTES)
        return _mm256_xor_si256(avx2_load(tile + c * BQ_CHUNK + at), _mm256_set1_epi8(-128));
    if (codes == C_LO2 || codes == C_LO2_HI1) {
        const __m256i lo = avx2_bits(avx2_load(tile + (c / 4) * BQ_CHUNK + at), 2 * (c % 4), 0, 3);
        if (codes == C_LO2) return lo;
        return _mm256_or_si256(lo, avx2_bits(avx2_load(tile + 128 + at), c, 2, 4));
    }
    const __m256i low = avx2_bits(avx2_load(tile + (c / 2) * BQ_CHUNK + at), 4 * (c % 2), 0, 15);
    if (codes == C_NIB) return low;
    if (codes == C_NIB_HI1)
        return _mm256_or_si256(low, avx2_bits(avx2_load(tile + 256 + at), c, 4, 16));
    if (codes == C_NIB_HI2)
        return _mm256_or_si256(
            low, avx2_bits(avx2_load(tile + 256 + (c / 4) * BQ_CHUNK + at), 2 * (c % 4), 4, 48));
    const __m128i book = _mm_loadu_si128((const __m128i *)BQ_CODEBOOK);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(book), low); /* C_BOOK */
}

/* D (and M) of sub-block h of tile t for the 8 lanes of half x. */
BQ_INLINE BQ_AVX2 void avx2_scales(const bq_layout *L, const bq_seg *s, int64_t g, int64_t t,
                                   int h, int x, __m256 *D, __m256 *M) {
    const uint8_t *p = bq_scale_part(s, g, t * BQ_TILE / L->block);
    const int j = (int)((t * BQ_TILE % L->block) / L->sub) + h;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * x)));
    switch (L->scales) {
    case S_D: *D = d; return;
    case S_DM:
        *D = d;
        *M = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * x)));
        return;
    case S_K_D: {
        const __m128i sc = _mm_loadl_epi64((const __m128i *)(p + bq_k_scales_at(L, j) + 8 * x));
        *D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        return;
    }
    default: {
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * x)));
        const uint8_t *scales = p + bq_k_scales_at(L, j) + 8 * x;
        const uint8_t *mins = p + bq_k_mins_at(L, j) + 8 * x;
        __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)scales)), m;
        if (L->scales == S_K_DM) {
            m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mins));
        } else {
            m = _mm256_srli_epi32(sc, 4);
            sc = _mm256_and_si256(sc, _mm256_set1_epi32(15));
        }
        *D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
        *M = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m)));
    }
    }
}

BQ_INLINE BQ_AVX2 __m256 avx2_apply(const bq_layout *L, __m256 acc, __m256i dot, __m256 D, __m256 M,
                                    bq_row_scales a, int offset) {
    if (offset) dot = _mm256_add_epi32(dot, _mm256_set1_epi32(offset * a.sum));
    const __m256 scale = _mm256_mul_ps(D, _mm256_set1_ps(a.da));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc);
    if (!L->offset) acc = _mm256_fmadd_ps(M, _mm256_set1_ps(a.mins), acc);
    return acc;
}

/* The int32 dot of one 8-output half-chunk of codes with a row's 4 int16 activations, as
 * (output, input pair) lanes: outputs 0-3 in lo, 4-7 in hi. */
BQ_INLINE BQ_AVX2 void avx2_dot16(__m256i u, int is_signed, const int16_t *a, __m256i *lo,
                                  __m256i *hi) {
    const __m256i av = _mm256_set1_epi64x(load_i64(a));
    const __m128i u0 = _mm256_castsi256_si128(u), u1 = _mm256_extracti128_si256(u, 1);
    const __m256i w0 = is_signed ? _mm256_cvtepi8_epi16(u0) : _mm256_cvtepu8_epi16(u0);
    const __m256i w1 = is_signed ? _mm256_cvtepi8_epi16(u1) : _mm256_cvtepu8_epi16(u1);
    *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(w0, av));
    *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(w1, av));
}

static inline __attribute__((always_inline)) BQ_AVX2 void
avx2_tile(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, const int nr,
          float (*out)[BQ_GROUP], const int li, const int wide, const int vnni) {
    const bq_layout *L = &BQ_LAYOUTS[li];
    const int codes = L->codes;
    const int halves = (codes == C_NIB_HI2 || codes == C_LO2 || codes == C_LO2_HI1) ? 2 : 1;
    const int is_signed = codes == C_BYTES || codes == C_BOOK;
    const int offset = is_signed ? 0 : L->offset;
    /* chunks whose maddubs pairs sum within int16: 2 x 127 x the largest code (vpdpbusd
     * sums in int32: a whole half at once) */
    const int span = vnni        ? 8 / halves
                     : is_signed ? 1
                     : codes == C_NIB_HI2 ? 2
                     : codes == C_NIB_HI1 ? 4 : 8 / halves;
    /* one or two rows: the chunks in 4 / nr vpdpbusd chains (each a few cycles deep), so
     * that one row's products are not one chain of dependent instructions */
    const int chains = vnni && !wide && nr <= 2 ? 4 / nr : 1;
    const __m256i ones = _mm256_set1_epi16(1);
    /* int8 activations of 4 rows come tiled, read as the VNNI path reads them (bq_vnni.h),
     * except against signed codes (Q8_0, IQ4): their sign step leaves the loop bound by
     * other work, and a 4-row tile reads twice the cache lines of the plain rows */
    const int tiled = !wide && nr >= 4 && !is_signed;
    const uint8_t *at = !tiled ? NULL
                             : (const uint8_t *)(xa->tiled + r0 / BQ_TILE_ROWS * xa->blocks) +
                                   4 * (r0 % BQ_TILE_ROWS);
    /* One row takes both halves in one pass over the tiles, so that each of its activations
     * is broadcast once and each tile's scales are found once; more rows would not keep
     * both halves' sums in 16 registers. */
    /* x_per_pass: how many of the two 8-output halves (x) one pass takes */
    const int both = nr == 1, passes = both ? 1 : 2, x_per_pass = both ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        __m256 acc[2][AVX2_ROWS];
        for (int r = 0; r < nr; r++) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
        for (int64_t t = 0; t < s->tiles; t++) {
            const uint8_t *tile = bq_tile(s, g, t);
            const bq_tiled *T = (const bq_tiled *)(tiled ? at + t * sizeof(bq_tiled) : NULL);
            if (pass == 0) bq_prefetch(s, L, g, t);
#pragma GCC unroll 2
            for (int xi = 0; xi < x_per_pass; xi++) {
                const int x = both ? xi : pass;
                /* unrolled, so that each half's chunk loop has constant bounds */
#pragma GCC unroll 2
                for (int h = 0; h < halves; h++) {
                    __m256i dot[AVX2_ROWS], hi[AVX2_ROWS], more[AVX2_ROWS][4];
                    for (int r = 0; r < nr; r++) {
                        dot[r] = hi[r] = _mm256_setzero_si256();
                        for (int i = 1; i < chains; i++) more[r][i] = _mm256_setzero_si256();
                    }
#pragma GCC unroll 8
                    for (int c0 = h * 8 / halves; c0 < (h + 1) * 8 / halves; c0 += span) {
                        __m256i sum16[AVX2_ROWS];
                        for (int r = 0; r < nr; r++) sum16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                        for (int c = c0; c < c0 + span; c++) {
                            const __m256i u = avx2_codes(tile, codes, c, x);
                            const __m256i mag = is_signed ? _mm256_abs_epi8(u) : u;
                            for (int r = 0; r < nr; r++) {
                                if (wide) {
                                    const int64_t blk = (r0 + r) * xa->blocks + t;
                                    const int16_t *a = xa->qa16 + blk * BQ_TILE + 4 * c;
                                    avx2_dot16(u, is_signed, a, &dot[r], &hi[r]);
                                    continue;
                                }
                                const int8_t *q = tiled ? T->codes[c][r]
                                                        : xa->qa + ((r0 + r) * xa->blocks + t) *
                                                                       BQ_TILE + 4 * c;
                                __m256i a = _mm256_set1_epi32(load_i32(q));
                                if (is_signed) a = _mm256_sign_epi8(a, u);
                                if (chains > 1 && c % chains)
                                    more[r][c % chains] = avxvnni_dot(more[r][c % chains], mag, a);
                                else if (vnni) dot[r] = avxvnni_dot(dot[r], mag, a);
                                else sum16[r] = _mm256_add_epi16(sum16[r],
                                                                 _mm256_maddubs_epi16(mag, a));
                            }
                        }
                        if (!wide && !vnni)
                            for (int r = 0; r < nr; r++)
                                dot[r] = _mm256_add_epi32(dot[r],
                                                          _mm256_madd_epi16(sum16[r], ones));
                    }
                    __m256 D, M = _mm256_setzero_ps();
                    avx2_scales(L, s, g, t, h, x, &D, &M);
                    for (int r = 0; r < nr; r++) {
                        __m256i d = dot[r];
                        for (int i = 1; i < chains; i++) d = _mm256_add_epi32(d, more[r][i]);
                        if (wide) /* (output, pair) lanes -> outputs 0-7 */
                            d = _mm256_permute4x64_epi64(_mm256_hadd_epi32(dot[r], hi[r]), 0xd8);
                        acc[xi][r] = avx2_apply(
                            L, acc[xi][r], d, D, M,
                            tiled ? bq_tiled_scales(L, T, r, h, halves)
                                  : bq_plain_scales(L, xa, (r0 + r) * xa->blocks + t, h, halves),
                            offset);
                    }
                }
            }
        }
        for (int xi = 0; xi < x_per_pass; xi++)
            for (int r = 0; r < nr; r++)
                _mm256_storeu_ps(out[r] + 8 * (both ? xi : pass), acc[xi][r]);
    }
}

BQ_INLINE BQ_AVX2 void avx2_rows(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0,
                                 int nr, float (*out)[BQ_GROUP], const int li, const int wide,
                                 const int vnni) {
    int at = 0;
    while (nr - at >= 4) { avx2_tile(s, xa, g, r0 + at, 4, out + at, li, wide, vnni); at += 4; }
    if (nr - at >= 2) { avx2_tile(s, xa, g, r0 + at, 2, out + at, li, wide, vnni); at += 2; }
    if (nr - at >= 1) avx2_tile(s, xa, g, r0 + at, 1, out + at, li, wide, vnni);
}

#define AVX2_TYPE(li)                                                                           \
    static BQ_AVX2 void avx2_##li##_0(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, \
                                      int nr, float (*out)[BQ_GROUP]) {                         \
        avx2_rows(s, xa, g, r0, nr, out, li, 0, 0);                                             \
    }                                                                                           \
    static BQ_AVX2 void avx2_##li##_1(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, \
                                      int nr, float (*out)[BQ_GROUP]) {                         \
        avx2_rows(s, xa, g, r0, nr, out, li, 1, 0);                                             \
    }                                                                                           \
    static BQ_AVX2 void avxvnni_##li(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0,  \
                                     int nr, float (*out)[BQ_GROUP]) {                          \
        avx2_rows(s, xa, g, r0, nr, out, li, 0, 1);                                             \
    }
AVX2_TYPE(0) AVX2_TYPE(1) AVX2_TYPE(2) AVX2_TYPE(3) AVX2_TYPE(4) AVX2_TYPE(5)
AVX2_TYPE(6) AVX2_TYPE(7) AVX2_TYPE(8) AVX2_TYPE(9) AVX2_TYPE(10) AVX2_TYPE(11)

static const bq_tile_fn AVX2_TILES[12][2] = {
    {avx2_0_0, avx2_0_1}, {avx2_1_0, avx2_1_1}, {avx2_2_0, avx2_2_1}, {avx2_3_0, avx2_3_1},
    {avx2_4_0, avx2_4_1}, {avx2_5_0, avx2_5_1}, {avx2_6_0, avx2_6_1}, {avx2_7_0, avx2_7_1},
    {avx2_8_0, avx2_8_1}, {avx2_9_0, avx2_9_1}, {avx2_10_0, avx2_10_1}, {avx2_11_0, avx2_11_1},
};

/* The AVX-VNNI path's int8-activation tiles (its int16 ones are AVX2's). */
static const bq_tile_fn AVXVNNI_TILES[12] = {
    avxvnni_0, avxvnni_1, avxvnni_2, avxvnni_3, avxvnni_4,  avxvnni_5,
    avxvnni_6, avxvnni_7, avxvnni_8, avxvnni_9, avxvnni_10, avxvnni_11,
};

#endif
#endif
