/* What every dot-product path of the block-quant kernel shares: the quantized activations and
 * how a tile's integer dot products become float outputs.
 *
 * Each activation row is quantized per block of 32 inputs to int8 (scale amax / 127 rounded to
 * float16, codes rounded half to even) or int16 (scale amax / 32767 in float32), with each
 * half block's code sum. For the K types the AVX-512 path takes int8 activations whose amax
 * is of 256 inputs (bq_vnni_k.h): the same fields, one scale repeated over 8 blocks.
 *
 * For output lane o and a sub-block of the weight (16 or 32 inputs):
 *
 *   y += (D dx) (dot + offset sum)         a type with a fixed offset (the offset's dot is
 *                                          exact: sum of the codes times the offset)
 *   y += (D dx) dot + M smx                a type with mins, smx the activation's sum times
 *                                          its scale: rounded to float16 for the legacy
 *                                          types (as GGUF's Q8_1 stores it), else in float32
 */
#ifndef PAGEDSERVE_BQ_KERNEL_H
#define PAGEDSERVE_BQ_KERNEL_H

#include "bq_gguf.h"

#define BQ_TILE_ROWS 8 /* activation rows a tile call takes */

#if BQ_X86
#include <immintrin.h>
#endif

/* The int8 activations of 8 rows for one block of 32 inputs, as the x86 paths read them: the
 * codes of chunk c (inputs 4c .. 4c + 3) of row i at codes[c][i], then each row's scale, code
 * sums (first half, second half, whole), min factors (the scale times each sum) and scaled
 * sum as the legacy mins want it, and the sums as int16 pairs for bq_vnni_k.h's vpdpwssd
 * (pair[0]: the two halves; pair[1], in an even block: its whole sum and the next block's).
 * A tile of up to 8 rows then reads everything from one address a block, each row and chunk
 * at a constant offset from it, where the rows of the plain layout lie k_pad bytes apart and
 * cost the loop a register or a reload each. */
typedef struct {
    int8_t codes[BQ_TILE / 4][BQ_TILE_ROWS][4];
    float da[BQ_TILE_ROWS];
    int32_t sum[3][BQ_TILE_ROWS];
    float min[3][BQ_TILE_ROWS];
    float sx[BQ_TILE_ROWS];
    uint32_t pair[2][BQ_TILE_ROWS];
} bq_tiled;

/* Two sums as the int16 pair vpdpwssd reads from 32 bits (each fits: at most 32 x 127). */
static inline uint32_t bq_sum_pair(int32_t s0, int32_t s1) {
    return (uint32_t)(uint16_t)s0 | (uint32_t)s1 << 16;
}

typedef struct {
    const int8_t *qa;    /* rows x k_pad int8 codes, or NULL */
    const int16_t *qa16; /* int16 codes instead, where not NULL */
    const float *da;     /* rows x blocks: each block's scale */
    const int32_t *s16;  /* rows x blocks x 2: the sums of the codes per 16 inputs */
    const uint32_t *pairs; /* rows x blocks x 2, or NULL: bq_tiled.pair's values for the
                            * plain rows, where bq_vnni_k.h reads the activations (and
                            * bq_tiled.pair is written only then) */
    const float *sx;     /* rows x blocks: scale times sum, rounded as the legacy mins want */
    int64_t blocks;
    const float *x;      /* the float rows themselves (16-bit weights read them) */
    int64_t x_stride;
    const bq_tiled *tiled; /* (rows / 8) x blocks, for the x86 paths' int8 tiles of 4 rows
                            * or more, or NULL */
} bq_acts;

/* out[r] = outputs 16 g .. 16 g + 15 of activation rows r0 + r, r < nr <= BQ_TILE_ROWS. */
typedef void (*bq_tile_fn)(const bq_seg *, const bq_acts *, int64_t g, int64_t r0, int nr,
                           float (*out)[BQ_GROUP]);

/* A tile's D and M per output lane, for each of its sub-blocks (one or two). */
typedef struct {
    float D[2][BQ_GROUP], M[2][BQ_GROUP];
} bq_tile_scales;

static inline void bq_scales_of_tile(const bq_seg *s, int64_t g, int64_t t, bq_tile_scales *sc) {
    const bq_layout *L = s->L;
    const int64_t block = t * BQ_TILE / L->block;
    const int j0 = (int)((t * BQ_TILE % L->block) / L->sub);
    for (int h = 0; h < BQ_TILE / L->sub; h++)
        for (int o = 0; o < BQ_GROUP; o++) {
            sc->M[h][o] = 0.0f;
            bq_lane_scales(s, g, block, j0 + h, o, &sc->D[h][o], &sc->M[h][o]);
        }
}

/* The sum of the activation codes under sub-block h (of `halves` in the block) of activation
 * block blk. */
static inline int32_t bq_sub_sum(const bq_acts *xa, int64_t blk, int h, int halves) {
    return halves == 2 ? xa->s16[2 * blk + h] : xa->s16[2 * blk] + xa->s16[2 * blk + 1];
}

/* The factor of M for sub-block h of activation block blk. */
static inline float bq_min_factor(const bq_layout *L, const bq_acts *xa, int64_t blk, int h,
                                  int halves) {
    if (L->offset) return 0.0f;
    if (L->scales == S_DM) return xa->sx[blk];
    return xa->da[blk] * (float)bq_sub_sum(xa, blk, h, halves);
}

/* What applying sub-block h's dot needs of one activation row: its block's scale, the code sum
 * that a fixed offset multiplies and the factor of M (bq_min_factor). */
typedef struct {
    float da;
    int32_t sum;
    float mins;
} bq_row_scales;

/* Of block blk in the plain rows. */
static inline bq_row_scales bq_plain_scales(const bq_layout *L, const bq_acts *xa, int64_t blk,
                                            int h, int halves) {
    return (bq_row_scales){xa->da[blk], bq_sub_sum(xa, blk, h, halves),
                           bq_min_factor(L, xa, blk, h, halves)};
}

/* Of row i of a tiled block: the same values, read from the tile. */
static inline bq_row_scales bq_tiled_scales(const bq_layout *L, const bq_tiled *T, int i, int h,
                                            int halves) {
    const int part = halves == 2 ? h : 2;
    const float mins = L->offset ? 0.0f : L->scales == S_DM ? T->sx[i] : T->min[part][i];
    return (bq_row_scales){T->da[i], T->sum[part][i], mins};
}

#endif
