/* GGUF's blocks, as ggml stores them, read into codes and scales (bq_block), and written into
 * the packed form of bq_layout.h; and packed rows read back as float weights. */
#ifndef PAGEDSERVE_BQ_GGUF_H
#define PAGEDSERVE_BQ_GGUF_H

#include "bq_layout.h"

/* One file block: codes by input (the IQ4 types: codebook indices), float16 d and dmin (a
 * legacy type's min in dmin), and per sub-block the scale (int8 bits where signed) and min. */
typedef struct {
    uint8_t u[256];
    uint16_t d, dmin;
    uint8_t sc[16], m[16];
} bq_block;

/* 32 nibbles: element j in the low nibble of byte j, element j + 16 in its high nibble. */
static void read_nibbles32(const uint8_t *qs, uint8_t *u) {
    for (int j = 0; j < 16; j++) {
        u[j] = qs[j] & 15;
        u[j + 16] = qs[j] >> 4;
    }
}

/* The 1-bit plane of 32 elements: bit j of a little-endian 32-bit word. */
static void add_high_bits32(const uint8_t *qh, uint8_t *u) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    for (int j = 0; j < 32; j++) u[j] |= (uint8_t)(((bits >> j) & 1u) << 4);
}

/* Q4_K's and Q5_K's twelve bytes of eight 6-bit scales and eight 6-bit mins. */
static void read_k_scales(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 15) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* 256 nibbles in four runs of 64 elements: 32 bytes, the low nibbles then the high ones. */
static void read_k_nibbles(const uint8_t *qs, uint8_t *u) {
    for (int run = 0; run < 4; run++)
        for (int l = 0; l < 32; l++) {
            u[64 * run + l] = qs[32 * run + l] & 15;
            u[64 * run + 32 + l] = qs[32 * run + l] >> 4;
        }
}

/* 256 2-bit codes in two runs of 128: 32 bytes, four 2-bit fields each. */
static void read_k_crumbs(const uint8_t *qs, uint8_t *u) {
    for (int run = 0; run < 2; run++)
        for (int shift = 0; shift < 4; shift++)
            for (int l = 0; l < 32; l++)
                u[128 * run + 32 * shift + l] = (qs[32 * run + l] >> (2 * shift)) & 3;
}

static void read_q2_k(const uint8_t *b, bq_block *o) {
    memcpy(o->sc, b, 16); /* scale | min << 4, kept packed */
    read_k_crumbs(b + 16, o->u);
    o->d = bq_load_u16(b + 80);
    o->dmin = bq_load_u16(b + 82);
}

static void read_q3_k(const uint8_t *b, bq_block *o) {
    read_k_crumbs(b + 32, o->u);
    for (int bit = 0; bit < 8; bit++)
        for (int l = 0; l < 32; l++) o->u[32 * bit + l] |= (uint8_t)(((b[l] >> bit) & 1) << 2);
    const uint8_t *s = b + 96;
    for (int i = 0; i < 16; i++) {
        const int low = (s[i % 8] >> (4 * (i / 8))) & 15;
        const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        o->sc[i] = (uint8_t)(int8_t)((low | (high << 4)) - 32);
    }
    o->d = bq_load_u16(b + 108);
}

static void read_q5_k(const uint8_t *b, bq_block *o) {
    o->d = bq_load_u16(b);
    o->dmin = bq_load_u16(b + 2);
    read_k_scales(b + 4, o->sc, o->m);
    read_k_nibbles(b + 48, o->u);
    for (int bit = 0; bit < 8; bit++)
        for (int l = 0; l < 32; l++) o->u[32 * bit + l] |= (uint8_t)(((b[16 + l] >> bit) & 1) << 4);
}

static void read_q6_k(const uint8_t *b, bq_block *o) {
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 64; l++) {
            o->u[128 * h + l] = b[64 * h + l] & 15;
            o->u[128 * h + 64 + l] = b[64 * h + l] >> 4;
        }
        for (int shift = 0; shift < 4; shift++)
            for (int l = 0; l < 32; l++)
                o->u[128 * h + 32 * shift + l] |=
                    (uint8_t)(((b[128 + 32 * h + l] >> (2 * shift)) & 3) << 4);
    }
    memcpy(o->sc, b + 192, 16);
    o->d = bq_load_u16(b + 208);
}

static void read_iq4_xs(const uint8_t *b, bq_block *o) {
    o->d = bq_load_u16(b);
    const uint16_t high = bq_load_u16(b + 2);
    for (int i = 0; i < 8; i++) {
        const int ls = ((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((high >> (2 * i)) & 3) << 4);
        o->sc[i] = (uint8_t)(int8_t)(ls - 32);
        read_nibbles32(b + 8 + 16 * i, o->u + 32 * i);
    }
}

/* Inlined into the packer's clones, so that each is vectorised for its target. */
#define BQ_PACK_INLINE static inline __attribute__((always_inline))

/* File block `b` of layout L into `o`. */
BQ_PACK_INLINE void bq_read_block(const bq_layout *L, const uint8_t *b, bq_block *o) {
    switch (L->type) {
    case 2: case 20: o->d = bq_load_u16(b); read_nibbles32(b + 2, o->u); break;   /* Q4_0, IQ4_NL */
    case 3: o->d = bq_load_u16(b); o->dmin = bq_load_u16(b + 2); read_nibbles32(b + 4, o->u); break;
    case 6: o->d = bq_load_u16(b); read_nibbles32(b + 6, o->u); add_high_bits32(b + 2, o->u); break;
    case 7:
        o->d = bq_load_u16(b);
        o->dmin = bq_load_u16(b + 2);
        read_nibbles32(b + 8, o->u);
        add_high_bits32(b + 4, o->u);
        break;
    case 8:
        o->d = bq_load_u16(b);
        for (int j = 0; j < 32; j++) o->u[j] = (uint8_t)(b[2 + j] ^ 0x80); /* int8 + 128 */
        break;
    case 10: read_q2_k(b, o); break;
    case 11: read_q3_k(b, o); break;
    case 12:
        o->d = bq_load_u16(b);
        o->dmin = bq_load_u16(b + 2);
        read_k_scales(b + 4, o->sc, o->m);
        read_k_nibbles(b + 16, o->u);
        break;
    case 13: read_q5_k(b, o); break;
    case 14: read_q6_k(b, o); break;
    default: read_iq4_xs(b, o); break; /* 23 */
    }
}

/* The tile planes from its 8 chunks of codes (chunk c: byte 4 o + j is output o, input
 * 4 c + j), each plane written 64 bytes at a time. */
BQ_PACK_INLINE void pack_tile(const bq_layout *L, uint8_t chunks[8][BQ_CHUNK], uint8_t *tile) {
    uint8_t *high = tile + bq_low_plane_bytes(L);
    for (int c = 0; c < 8; c++) {
        const uint8_t *u = chunks[c];
        if (L->codes == C_BYTES) {
            memcpy(tile + c * BQ_CHUNK, u, BQ_CHUNK);
            continue;
        }
        if (L->codes == C_LO2 || L->codes == C_LO2_HI1) {
            uint8_t *lo = tile + (c / 4) * BQ_CHUNK;
            for (int i = 0; i < BQ_CHUNK; i++) lo[i] |= (uint8_t)((u[i] & 3) << (2 * (c % 4)));
            if (L->codes == C_LO2_HI1)
                for (int i = 0; i < BQ_CHUNK; i++) high[i] |= (uint8_t)(((u[i] >> 2) & 1) << c);
            continue;
        }
        uint8_t *nib = tile + (c / 2) * BQ_CHUNK;
        for (int i = 0; i < BQ_CHUNK; i++) nib[i] |= (uint8_t)((u[i] & 15) << (4 * (c % 2)));
        if (L->codes == C_NIB_HI1)
            for (int i = 0; i < BQ_CHUNK; i++) high[i] |= (uint8_t)(((u[i] >> 4) & 1) << c);
        if (L->codes == C_NIB_HI2) {
            uint8_t *h2 = high + (c / 4) * BQ_CHUNK;
            for (int i = 0; i < BQ_CHUNK; i++)
                h2[i] |= (uint8_t)(((u[i] >> 4) & 3) << (2 * (c % 4)));
        }
    }
}

/* The scale part of one file block for the 16 outputs' blocks. */
BQ_PACK_INLINE void pack_scales(const bq_layout *L, const bq_block *blk, uint8_t *p) {
    const int subs = bq_subs(L);
    for (int o = 0; o < BQ_GROUP; o++) {
        memcpy(p + 2 * o, &blk[o].d, 2);
        if (L->scales != S_D && L->scales != S_K_D) memcpy(p + 32 + 2 * o, &blk[o].dmin, 2);
        if (L->scales >= S_K_D)
            for (int j = 0; j < subs; j++) p[bq_k_scales_at(L, j) + o] = blk[o].sc[j];
        if (L->scales == S_K_DM)
            for (int j = 0; j < subs; j++) p[bq_k_mins_at(L, j) + o] = blk[o].m[j];
    }
}

/* Packs group g (rows 16 g .. 16 g + 15; rows past `rows` are zero) of a weight whose row r
 * starts at src + r * src_stride, as ggml stores it. */
#if BQ_X86
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void bq_pack_group(const bq_seg *s, const uint8_t *src, int64_t src_stride, int64_t rows,
                          int64_t g) {
    const bq_layout *L = s->L;
    uint8_t *scales = (uint8_t *)bq_scale_part(s, g, 0);
    memset(scales, 0, (size_t)s->scale_region);
    memset((uint8_t *)bq_tile(s, g, 0), 0, (size_t)s->group_bytes);
    const int64_t blocks = s->k / L->block, tiles_per_block = L->block / BQ_TILE;
    bq_block blk[BQ_GROUP];
    for (int64_t b = 0; b < blocks; b++) {
        memset(blk, 0, sizeof blk);
        for (int o = 0; o < BQ_GROUP; o++) {
            const int64_t row = g * BQ_GROUP + o;
            if (row < rows) bq_read_block(L, src + row * src_stride + b * L->file_bytes, &blk[o]);
        }
        pack_scales(L, blk, scales + b * s->scale_bytes);
        for (int64_t t = 0; t < tiles_per_block; t++) {
            uint8_t chunks[8][BQ_CHUNK];
            for (int c = 0; c < 8; c++)
                for (int o = 0; o < BQ_GROUP; o++)
                    memcpy(chunks[c] + 4 * o, blk[o].u + t * BQ_TILE + 4 * c, 4);
            pack_tile(L, chunks, (uint8_t *)bq_tile(s, g, b * tiles_per_block + t));
        }
    }
}

/* Code u of output o, input e of tile `tile` (the codebook index for the IQ4 types). */
static inline int bq_code(const bq_layout *L, const uint8_t *tile, int o, int e) {
    const int c = e / 4, i = 4 * o + e % 4;
    const uint8_t *high = tile + bq_low_plane_bytes(L);
    switch (L->codes) {
    case C_BYTES: return tile[c * BQ_CHUNK + i];
    case C_LO2: case C_LO2_HI1: {
        const int u = (tile[(c / 4) * BQ_CHUNK + i] >> (2 * (c % 4))) & 3;
        return L->codes == C_LO2 ? u : u | (((high[i] >> c) & 1) << 2);
    }
    default: {
        const int u = (tile[(c / 2) * BQ_CHUNK + i] >> (4 * (c % 2))) & 15;
        if (L->codes == C_NIB_HI1) return u | (((high[i] >> c) & 1) << 4);
        if (L->codes == C_NIB_HI2)
            return u | (((high[(c / 4) * BQ_CHUNK + i] >> (2 * (c % 4))) & 3) << 4);
        return u;
    }
    }
}

/* Row `row` of the packed weight as float, with gguf's own arithmetic: D (u + offset) or
 * D u + M, D and M as bq_lane_scales gives them. */
static void bq_dequantize_row(const bq_seg *s, int64_t row, float *out) {
    const bq_layout *L = s->L;
    const int64_t g = row / BQ_GROUP;
    const int o = (int)(row % BQ_GROUP);
    for (int64_t t = 0; t < s->tiles; t++) {
        const int64_t block = t * BQ_TILE / L->block;
        const uint8_t *tile = bq_tile(s, g, t);
        for (int half = 0; half < BQ_TILE / L->sub; half++) {
            const int j = (int)((t * BQ_TILE % L->block) / L->sub) + half;
            float D, M = 0.0f;
            bq_lane_scales(s, g, block, j, o, &D, &M);
            for (int e = half * L->sub; e < (half + 1) * L->sub; e++) {
                const int u = bq_code(L, tile, o, e);
                float w;
                if (L->codes == C_BOOK) w = D * (float)BQ_CODEBOOK[u];
                else if (L->offset) w = D * (float)(u + L->offset);
                else w = D * (float)u + M;
                out[t * BQ_TILE + e] = w;
            }
        }
    }
}

#endif
