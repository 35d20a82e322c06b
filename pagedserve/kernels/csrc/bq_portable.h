/* The portable path: each (group, tile) is decoded once into int8 codes, chunk by chunk as the
 * vector paths hold them (64 bytes: 16 outputs x 4 inputs), then every row of the tile runs
 * plain integer loops over those bytes that the compiler vectorises (NEON on ARM, SSE on an
 * x86 without AVX2): 16-bit products summed in 16 bits for as many chunks as cannot
 * overflow, then in 32. Codes of up to 6 bits stay unsigned; 8-bit codes (Q8_0, the IQ4
 * codebook) are decoded signed, their offset already applied. */
#ifndef PAGEDSERVE_BQ_PORTABLE_H
#define PAGEDSERVE_BQ_PORTABLE_H

#include "bq_kernel.h"

static inline int bq_signed_codes(const bq_layout *L) {
    return L->codes == C_BYTES || L->codes == C_BOOK;
}

/* Chunk c of the tile's codes: u, or u + offset for 8-bit codes. */
static void decode_chunk(const bq_layout *L, const uint8_t *tile, int c, int8_t q[BQ_CHUNK]) {
    const uint8_t *high = tile + bq_low_plane_bytes(L);
    uint8_t u[BQ_CHUNK];
    if (L->codes == C_BYTES) {
        for (int i = 0; i < BQ_CHUNK; i++) q[i] = (int8_t)(tile[c * BQ_CHUNK + i] ^ 0x80);
        return;
    }
    if (L->codes == C_LO2 || L->codes == C_LO2_HI1) {
        const uint8_t *lo = tile + (c / 4) * BQ_CHUNK;
        const int s = 2 * (c % 4);
        for (int i = 0; i < BQ_CHUNK; i++) u[i] = (lo[i] >> s) & 3;
        if (L->codes == C_LO2_HI1)
            for (int i = 0; i < BQ_CHUNK; i++) u[i] |= ((high[i] >> c) & 1) << 2;
    } else {
        const uint8_t *nib = tile + (c / 2) * BQ_CHUNK;
        const int s = 4 * (c % 2);
        for (int i = 0; i < BQ_CHUNK; i++) u[i] = (nib[i] >> s) & 15;
        if (L->codes == C_NIB_HI1)
            for (int i = 0; i < BQ_CHUNK; i++) u[i] |= ((high[i] >> c) & 1) << 4;
        if (L->codes == C_NIB_HI2) {
            const uint8_t *h2 = high + (c / 4) * BQ_CHUNK;
            const int s2 = 2 * (c % 4);
            for (int i = 0; i < BQ_CHUNK; i++) u[i] |= ((h2[i] >> s2) & 3) << 4;
        }
    }
    if (L->codes == C_BOOK)
        for (int i = 0; i < BQ_CHUNK; i++) q[i] = BQ_CODEBOOK[u[i]];
    else
        memcpy(q, u, BQ_CHUNK);
}

/* Chunks in a row whose 16-bit sums cannot overflow (|q a| <= 127 max|q|), within a
 * sub-block. */
static inline int bq_span16(const bq_layout *L) {
    const int top = bq_signed_codes(L) ? 128 : (L->codes == C_NIB_HI2 ? 63 : 31);
    const int span = 32767 / (127 * top);
    const int per_sub = L->sub / 4;
    return span < per_sub ? span : per_sub;
}

/* acc[i] += q[i] * the chunk's activation (i % 4), in 16 bits. */
static inline void mac_chunk8(const int8_t q[BQ_CHUNK], const int8_t *a4, int16_t acc[BQ_CHUNK]) {
    uint32_t word, rep[BQ_GROUP];
    memcpy(&word, a4, sizeof word);
    for (int o = 0; o < BQ_GROUP; o++) rep[o] = word;
    int8_t a[BQ_CHUNK];
    memcpy(a, rep, sizeof a);
    for (int i = 0; i < BQ_CHUNK; i++) acc[i] = (int16_t)(acc[i] + q[i] * a[i]);
}

static inline void mac_chunk16(const int8_t q[BQ_CHUNK], const int16_t *a4, int32_t acc[BQ_CHUNK]) {
    uint64_t word, rep[BQ_GROUP];
    memcpy(&word, a4, sizeof word);
    for (int o = 0; o < BQ_GROUP; o++) rep[o] = word;
    int16_t a[BQ_CHUNK];
    memcpy(a, rep, sizeof a);
    for (int i = 0; i < BQ_CHUNK; i++) acc[i] += (int32_t)q[i] * a[i];
}

/* The dot products of one activation row with the tile: dots[h][o] for sub-block h. */
static void row_dots(const bq_layout *L, const int8_t q[8][BQ_CHUNK], const bq_acts *xa,
                     int64_t blk, int32_t dots[2][BQ_GROUP]) {
    const int per_sub = L->sub / 4, span = bq_span16(L);
    int32_t acc[BQ_CHUNK];
    for (int h = 0; h < 8 / per_sub; h++) {
        memset(acc, 0, sizeof acc);
        for (int c0 = h * per_sub; c0 < (h + 1) * per_sub; c0 += span) {
            if (xa->qa16) {
                for (int c = c0; c < c0 + span; c++)
                    mac_chunk16(q[c], xa->qa16 + blk * BQ_TILE + 4 * c, acc);
                continue;
            }
            int16_t acc16[BQ_CHUNK] = {0};
            for (int c = c0; c < c0 + span; c++)
                mac_chunk8(q[c], xa->qa + blk * BQ_TILE + 4 * c, acc16);
            for (int i = 0; i < BQ_CHUNK; i++) acc[i] += acc16[i];
        }
        for (int o = 0; o < BQ_GROUP; o++)
            dots[h][o] = acc[4 * o] + acc[4 * o + 1] + acc[4 * o + 2] + acc[4 * o + 3];
    }
}

static void tile_portable(const bq_seg *s, const bq_acts *xa, int64_t g, int64_t r0, int nr,
                          float out[BQ_TILE_ROWS][BQ_GROUP]) {
    const bq_layout *L = s->L;
    const int halves = BQ_TILE / L->sub;
    const int offset = bq_signed_codes(L) ? 0 : L->offset;
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < BQ_GROUP; o++) out[r][o] = 0.0f;
    int8_t q[8][BQ_CHUNK];
    for (int64_t t = 0; t < s->tiles; t++) {
        const uint8_t *tile = bq_tile(s, g, t);
        for (int c = 0; c < 8; c++) decode_chunk(L, tile, c, q[c]);
        bq_tile_scales sc;
        bq_scales_of_tile(s, g, t, &sc);
        for (int r = 0; r < nr; r++) {
            const int64_t blk = (r0 + r) * xa->blocks + t;
            int32_t dots[2][BQ_GROUP];
            row_dots(L, (const int8_t(*)[BQ_CHUNK])q, xa, blk, dots);
            const float dx = xa->da[blk];
            for (int h = 0; h < halves; h++) {
                const int32_t sum = bq_sub_sum(xa, blk, h, halves);
                const float smx = bq_min_factor(L, xa, blk, h, halves);
                for (int o = 0; o < BQ_GROUP; o++) {
                    out[r][o] += (float)(dots[h][o] + offset * sum) * (sc.D[h][o] * dx);
                    if (!L->offset) out[r][o] += sc.M[h][o] * smx;
                }
            }
        }
    }
}

#endif
