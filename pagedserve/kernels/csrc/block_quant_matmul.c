/* y = x W^T for a weight stored in blocks of 32 inputs, each block its own float32 scale (and,
 * for 4-bit codes, its own min), computed as GGUF's CPU runtime does: each row of x is first
 * quantized per block of 32 to int8 with a float16-rounded scale d_x (and the block's sum) --
 * or, with act_bits 16, to int16 with a float32 scale, 256 times finer --
 * each (weight block, activation block) pair is an integer dot product, and the block's scales
 * are applied in float32:
 *
 *   4-bit (w = d_w q + m_w, q in 0..15):  d_w d_x sum(q a) + m_w d_x sum(a)
 *   8-bit (w = d_w q, q in -128..127):    stored as u = q + 128, so that the dot product is
 *                                         unsigned x signed: d_w d_x sum(u a) - 128 d_w d_x sum(a)
 *
 * so both are  d_w d_x sum(u a) + M factor d_x sum(a)  with M the mins (factor 1), or the
 * scales (factor -128 for 8-bit; -8 for 4-bit codes whose min is -8 d_w, GGUF's Q4_0, which
 * then stores no mins).
 *
 * Layout, prepared once at load (cpu_block_quant.py): outputs in groups of 16 (padded), inputs
 * in blocks of 32 (padded). For group g and block b the codes are 8 chunks of 4 inputs, each
 * chunk 16 outputs x 4 inputs (byte 4 o + j: output o, input j): one 512-bit register whose
 * 32-bit lane o is output o, so that a VNNI dot product against 4 activation bytes broadcast to
 * every lane advances all 16 outputs at once, the block's sum stays in int32 and is scaled once
 * per block. 8-bit: 8 x 64 bytes. 4-bit: 4 x 64 bytes, chunk 2t in the low nibbles and chunk
 * 2t + 1 in the high ones. Scales and mins: [groups, blocks, 16] float32.
 *
 * Each thread takes a run of output groups and, for each, all the rows of x in tiles of 8: the
 * group's weights (16 x in/2 bytes for 4-bit) stay in L1 while every row reads them, so a
 * weight is read from memory once per call (per chunk of CHUNK_ROWS rows for a long prefill).
 * The AVX-512 VNNI path is compiled where the target has it; the portable path computes the
 * same integer sums (results differ only in float32 rounding order) and runs when `simd` is 0.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#define GROUP 16
#define BLOCK 32
#define TILE_ROWS 8
#define CHUNK_ROWS 64

int block_quant_has_simd(void) { return HAVE_VNNI; }

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

/* Rounds half to even, as the vector units do; |v| < offset, a power of two, so v + offset is
 * positive and truncation rounds it down. */
static inline int32_t round_even(float v, float offset) {
    const float shifted = v + offset;
    int32_t whole = (int32_t)shifted;
    const float frac = shifted - (float)whole;
    whole += frac > 0.5f || (frac == 0.5f && (whole & 1));
    return whole - (int32_t)offset;
}

/* Block b of row x[0:k] into vals (zero past k); returns its largest magnitude. */
static inline float load_block(const float *x, int64_t k, int64_t b, float vals[BLOCK]) {
    float amax = 0.0f;
    for (int j = 0; j < BLOCK; j++) {
        const int64_t i = b * BLOCK + j;
        vals[j] = i < k ? x[i] : 0.0f;
        const float a = vals[j] < 0 ? -vals[j] : vals[j];
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* Row x[0:k] -> qa [k_pad] int8, da [blocks] the float16-rounded scales, sa [blocks]
 * factor * d_x * sum(a) (with mins, factor 1: d_x * sum(a) rounded to float16, as GGUF's
 * runtime rounds it); blocks past k are zero. */
static void quantize_row(const float *x, int64_t k, int64_t k_pad, float factor, int8_t *qa,
                         float *da, float *sa) {
    for (int64_t b = 0; b < k_pad / BLOCK; b++) {
        float vals[BLOCK];
        const float amax = load_block(x, k, b, vals);
        const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < BLOCK; j++) {
            const int32_t q = round_even(vals[j] * inv, 128.0f);
            sum += q;
            qa[b * BLOCK + j] = (int8_t)q;
        }
        da[b] = round_f16(d);
        if (factor == 1.0f) { /* with mins: the block sum as GGUF's Q8_1 keeps it, float16 */
            const float s = d * (float)sum;
            sa[b] = s < 0 ? -round_f16(-s) : round_f16(s);
        } else { /* the exact offset of the codes */
            sa[b] = factor * da[b] * (float)sum;
        }
    }
}

/* As quantize_row with int16 codes (scale amax / 32767, kept in float32): 256 times finer. */
static void quantize_row16(const float *x, int64_t k, int64_t k_pad, float factor, int16_t *qa,
                           float *da, float *sa) {
    for (int64_t b = 0; b < k_pad / BLOCK; b++) {
        float vals[BLOCK];
        const float amax = load_block(x, k, b, vals);
        const float d = amax / 32767.0f, inv = amax > 0 ? 32767.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < BLOCK; j++) {
            int32_t q = round_even(vals[j] * inv, 32768.0f);
            q = q > 32767 ? 32767 : (q < -32767 ? -32767 : q);
            sum += q;
            qa[b * BLOCK + j] = (int16_t)q;
        }
        da[b] = d;
        sa[b] = factor * d * (float)sum;
    }
}

typedef struct {
    const uint8_t *w;
    const float *scales, *mins;
    int64_t blocks, bits;
} weights;

typedef struct {
    const int8_t *qa;
    const int16_t *qa16; /* int16 activations instead, where not NULL */
    const float *da, *sa;
    int64_t blocks;
} acts;

/* out[r][o] = outputs g * 16 + o of activation rows r0 + r. */
static void tile_portable(const weights *wt, const acts *xa, int64_t g, int64_t r0, int nr,
                          float out[TILE_ROWS][GROUP]) {
    const int64_t block_bytes = wt->bits == 4 ? 256 : 512;
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < GROUP; o++) out[r][o] = 0.0f;
    for (int64_t b = 0; b < wt->blocks; b++) {
        const uint8_t *w = wt->w + (g * wt->blocks + b) * block_bytes;
        const float *sc = wt->scales + (g * wt->blocks + b) * GROUP;
        const float *mn = wt->mins + (g * wt->blocks + b) * GROUP;
        for (int r = 0; r < nr; r++) {
            const int64_t row = (r0 + r) * xa->blocks + b;
            const int8_t *a = xa->qa + row * BLOCK;
            const int16_t *a16 = xa->qa16 + row * BLOCK;
            for (int o = 0; o < GROUP; o++) {
                int32_t sum = 0;
                for (int c = 0; c < 8; c++)
                    for (int j = 0; j < 4; j++) {
                        const int32_t u = wt->bits == 4
                            ? (w[(c / 2) * 64 + o * 4 + j] >> (4 * (c % 2))) & 15
                            : w[c * 64 + o * 4 + j];
                        sum += u * (xa->qa16 ? a16[c * 4 + j] : a[c * 4 + j]);
                    }
                out[r][o] += sc[o] * xa->da[row] * (float)sum + mn[o] * xa->sa[row];
            }
        }
    }
}

#if HAVE_VNNI
static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc + the block's integer dots times its weight and activation scales, plus its mins times
 * the activation block's sum. */
static inline __m512 add_block(__m512 acc, __m512i dot, __m512 sc, __m512 mn, const acts *xa,
                               int64_t row) {
    const __m512 scale = _mm512_mul_ps(sc, _mm512_set1_ps(xa->da[row]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
    return _mm512_fmadd_ps(mn, _mm512_set1_ps(xa->sa[row]), acc);
}

static inline __attribute__((always_inline)) void tile_vnni(const weights *wt, const acts *xa,
                                                            int64_t g, int64_t r0, const int nr,
                                                            float out[TILE_ROWS][GROUP]) {
    const int four = wt->bits == 4;
    const int64_t block_bytes = four ? 256 : 512;
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < wt->blocks; b++) {
        const uint8_t *w = wt->w + (g * wt->blocks + b) * block_bytes;
        __m512i dot[TILE_ROWS];
        for (int r = 0; r < nr; r++) dot[r] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
            __m512i even, odd;
            if (four) {
                const __m512i packed = _mm512_loadu_si512(w + (c / 2) * 64);
                even = _mm512_and_si512(packed, low);
                odd = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
            } else {
                even = _mm512_loadu_si512(w + c * 64);
                odd = _mm512_loadu_si512(w + (c + 1) * 64);
            }
            for (int r = 0; r < nr; r++) {
                const int8_t *a = xa->qa + ((r0 + r) * xa->blocks + b) * BLOCK + c * 4;
                dot[r] = _mm512_dpbusd_epi32(dot[r], even, _mm512_set1_epi32(load_i32(a)));
                dot[r] = _mm512_dpbusd_epi32(dot[r], odd, _mm512_set1_epi32(load_i32(a + 4)));
            }
        }
        const __m512 sc = _mm512_loadu_ps(wt->scales + (g * wt->blocks + b) * GROUP);
        const __m512 mn = _mm512_loadu_ps(wt->mins + (g * wt->blocks + b) * GROUP);
        for (int r = 0; r < nr; r++)
            acc[r] = add_block(acc[r], dot[r], sc, mn, xa, (r0 + r) * xa->blocks + b);
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(out[r], acc[r]);
}

/* int16 activations: VNNI's 16-bit dot product takes 2 inputs a lane, so each chunk's 16
 * outputs x 4 inputs widen to two registers (outputs 0-7, 8-15), each output's partial sums in
 * 2 lanes (inputs 0-1, 2-3) against the chunk's 4 activations broadcast; the pairs of lanes
 * are added once per block. */
static inline __m512i widen_lo(__m512i v) { return _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)); }
static inline __m512i widen_hi(__m512i v) { return _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1)); }

static inline int64_t load_i64(const int16_t *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void tile_vnni16(const weights *wt, const acts *xa,
                                                              int64_t g, int64_t r0, const int nr,
                                                              float out[TILE_ROWS][GROUP]) {
    const int four = wt->bits == 4;
    const int64_t block_bytes = four ? 256 : 512;
    const __m512i low = _mm512_set1_epi8(15);
    const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < wt->blocks; b++) {
        const uint8_t *w = wt->w + (g * wt->blocks + b) * block_bytes;
        __m512i lo[TILE_ROWS], hi[TILE_ROWS];
        for (int r = 0; r < nr; r++) lo[r] = hi[r] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c++) {
            __m512i chunk;
            if (four) {
                const __m512i packed = _mm512_loadu_si512(w + (c / 2) * 64);
                chunk = c % 2 ? _mm512_and_si512(_mm512_srli_epi16(packed, 4), low)
                              : _mm512_and_si512(packed, low);
            } else {
                chunk = _mm512_loadu_si512(w + c * 64);
            }
            const __m512i wlo = widen_lo(chunk), whi = widen_hi(chunk);
            for (int r = 0; r < nr; r++) {
                const int16_t *a = xa->qa16 + ((r0 + r) * xa->blocks + b) * BLOCK + c * 4;
                const __m512i av = _mm512_set1_epi64(load_i64(a));
                lo[r] = _mm512_dpwssd_epi32(lo[r], wlo, av);
                hi[r] = _mm512_dpwssd_epi32(hi[r], whi, av);
            }
        }
        const __m512 sc = _mm512_loadu_ps(wt->scales + (g * wt->blocks + b) * GROUP);
        const __m512 mn = _mm512_loadu_ps(wt->mins + (g * wt->blocks + b) * GROUP);
        for (int r = 0; r < nr; r++) {
            const __m512i dot = _mm512_add_epi32(_mm512_permutex2var_epi32(lo[r], evens, hi[r]),
                                                 _mm512_permutex2var_epi32(lo[r], odds, hi[r]));
            acc[r] = add_block(acc[r], dot, sc, mn, xa, (r0 + r) * xa->blocks + b);
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(out[r], acc[r]);
}

/* Constant row counts, so that the accumulators stay in registers. */
#define TILE_BY_ROWS(tile)                                                                      \
    switch (nr) {                                                                               \
    case 8: tile(wt, xa, g, r0, 8, out); break;                                                 \
    case 7: tile(wt, xa, g, r0, 7, out); break;                                                 \
    case 6: tile(wt, xa, g, r0, 6, out); break;                                                 \
    case 5: tile(wt, xa, g, r0, 5, out); break;                                                 \
    case 4: tile(wt, xa, g, r0, 4, out); break;                                                 \
    case 3: tile(wt, xa, g, r0, 3, out); break;                                                 \
    case 2: tile(wt, xa, g, r0, 2, out); break;                                                 \
    default: tile(wt, xa, g, r0, 1, out); break;                                                \
    }

static void tile_simd(const weights *wt, const acts *xa, int64_t g, int64_t r0, int nr,
                      float out[TILE_ROWS][GROUP]) {
    if (xa->qa16) {
        TILE_BY_ROWS(tile_vnni16)
    } else {
        TILE_BY_ROWS(tile_vnni)
    }
}
#endif

static void quantize(const acts *xa, const float *x, int64_t x_stride, int64_t k, int64_t k_pad,
                     float factor, int64_t r) {
    float *da = (float *)xa->da + r * xa->blocks, *sa = (float *)xa->sa + r * xa->blocks;
    if (xa->qa16)
        quantize_row16(x + r * x_stride, k, k_pad, factor, (int16_t *)xa->qa16 + r * k_pad, da,
                       sa);
    else
        quantize_row(x + r * x_stride, k, k_pad, factor, (int8_t *)xa->qa + r * k_pad, da, sa);
}

/* y [rows, n] (row stride y_stride) = x [rows, k] (row stride x_stride) times the weight^T;
 * w, scales and mins (NULL: the scales, with factor) in the layout above, k_pad a multiple of
 * 32, n padded to groups of 16. */
void block_quant_linear(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                        const uint8_t *w, const float *scales, const float *mins, float factor,
                        int64_t bits, int64_t n, int64_t k_pad, float *y, int64_t y_stride,
                        int64_t threads, int64_t simd, int64_t act_bits) {
    const int64_t blocks = k_pad / BLOCK, groups = (n + GROUP - 1) / GROUP;
    int8_t *qa = act_bits == 8 ? malloc((size_t)(rows * k_pad)) : NULL;
    int16_t *qa16 = act_bits == 8 ? NULL : malloc((size_t)(rows * k_pad) * sizeof(int16_t));
    float *da = malloc((size_t)(rows * blocks) * sizeof(float));
    float *sa = malloc((size_t)(rows * blocks) * sizeof(float));
    const weights wt = {w, scales, mins ? mins : scales, blocks, bits};
    const acts xa = {qa, qa16, da, sa, blocks};
    if (mins) factor = 1.0f;
    /* A few rows (a decode step) are quantized before the threads start: a barrier between
     * the two phases costs a time slice whenever another process holds a core. */
    const int split = rows >= CHUNK_ROWS;
    if (!split)
        for (int64_t r = 0; r < rows; r++) quantize(&xa, x, x_stride, k, k_pad, factor, r);
#pragma omp parallel num_threads(threads)
    {
        if (split) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) quantize(&xa, x, x_stride, k, k_pad, factor, r);
        }
        for (int64_t chunk = 0; chunk < rows; chunk += CHUNK_ROWS) {
            const int64_t chunk_end = chunk + CHUNK_ROWS < rows ? chunk + CHUNK_ROWS : rows;
#pragma omp for schedule(static) nowait
            for (int64_t g = 0; g < groups; g++) {
                const int64_t width = n - g * GROUP < GROUP ? n - g * GROUP : GROUP;
                for (int64_t r0 = chunk; r0 < chunk_end; r0 += TILE_ROWS) {
                    const int nr = (int)(chunk_end - r0 < TILE_ROWS ? chunk_end - r0 : TILE_ROWS);
                    float out[TILE_ROWS][GROUP];
#if HAVE_VNNI
                    if (simd) tile_simd(&wt, &xa, g, r0, nr, out);
                    else
#endif
                        tile_portable(&wt, &xa, g, r0, nr, out);
                    for (int r = 0; r < nr; r++)
                        memcpy(y + (r0 + r) * y_stride + g * GROUP, out[r],
                               (size_t)width * sizeof(float));
                }
            }
        }
    }
    free(qa);
    free(qa16);
    free(da);
    free(sa);
}
