/* The GGUF block types the block-quant kernels run, each described once, and the packed form
 * they all share.
 *
 * Every type is read as  w = D (u + offset)  or  w = D u + M : u an unsigned code of 2 to 8
 * bits, D and M per sub-block of 16 or 32 inputs, built from what the file stores (float16
 * block scales for the legacy types; for the K types a float16 d (and dmin) per 256 inputs
 * times small integer sub-block scales (and mins), which float32 holds exactly). A fixed
 * offset needs no stored mins (Q4_0 -8, Q5_0 -16, Q8_0 -128, Q3_K -4, Q6_K -32; the IQ4
 * types' codes are a 16-entry int8 codebook, offset by 128 to make them unsigned).
 *
 * Packed form: outputs in groups of 16 (padded with zero rows); each group's scale parts (one
 * per file block, padded to 64 bytes), then each group's tiles (one per 32 inputs):
 *
 *   [group 0 scales][group 1 scales]...[group 0 tiles][group 1 tiles]...
 *
 * A tile holds 16 outputs x 32 inputs as 8 chunks of 4 inputs; a chunk is 64 bytes in which
 * byte 4 o + j is output o, input j (one 512-bit register whose 32-bit lane o is output o;
 * an AVX2 register holds outputs 0-7, a second one 8-15). The codes are stored as planes:
 *
 *   nibble plane (256 bytes): chunk 2t in the low nibbles of its 64 bytes t, chunk 2t + 1 in
 *       the high ones: u & 15;
 *   2-bit plane (128 bytes): chunk c in bits 2 (c % 4) of its 64 bytes c / 4: u & 3 (Q2_K,
 *       Q3_K) or (u >> 4) & 3 (Q6_K's high bits);
 *   1-bit plane (64 bytes): chunk c in bit c: Q5's bit 4, Q3_K's bit 2;
 *   bytes (512 bytes): chunk c in its 64 bytes c (Q8_0).
 *
 * F16 and BF16 weights keep their 16 bits: a tile is 32 inputs x 16 outputs, input e's 16
 * outputs at bytes 32 e (bq_float16.h).
 *
 * A scale part holds, for the 16 outputs: float16 d[16] (legacy: D), then float16 m[16]
 * (legacy mins: M) or dmin[16] (K mins: M = -dmin m), then per sub-block 16 integer scales
 * (int8 for the K types with a fixed offset, uint8 with mins), then per sub-block 16 uint8
 * mins; Q2_K keeps its 4-bit scale and min in one byte as the file does. So every type takes
 * at most 4% more bytes than the file (Q4_K 148 per 256 inputs against 144, Q5_K 180 against
 * 176, Q3_K 114 against 110, the rest the file's own size).
 */
#ifndef PAGEDSERVE_BQ_LAYOUT_H
#define PAGEDSERVE_BQ_LAYOUT_H

#include <stdint.h>
#include <string.h>

/* Whether the x86 vector paths are compiled (-DBQ_X86=0 builds the portable path alone, as on
 * any other processor). */
#ifndef BQ_X86
#if defined(__x86_64__) || defined(__i386__)
#define BQ_X86 1
#else
#define BQ_X86 0
#endif
#endif

#define BQ_GROUP 16 /* outputs a packed group holds */
#define BQ_TILE 32  /* inputs a tile holds */
#define BQ_CHUNK 64 /* bytes of one chunk: 16 outputs x 4 inputs */

enum bq_codes {
    C_NIB,      /* u in 0..15: nibble plane */
    C_NIB_HI1,  /* 0..31: nibble plane, 1-bit plane for bit 4 */
    C_NIB_HI2,  /* 0..63: nibble plane, 2-bit plane for bits 4-5 */
    C_LO2,      /* 0..3: 2-bit plane */
    C_LO2_HI1,  /* 0..7: 2-bit plane, 1-bit plane for bit 2 */
    C_BYTES,    /* 0..255: bytes */
    C_BOOK,     /* a nibble plane of codebook indices, u = codebook[index] + 128 */
    C_F16,      /* float16 weights as they are (bq_float16.h) */
    C_BF16,     /* bfloat16 weights as they are */
};

enum bq_scales {
    S_D,     /* float16 D per block, fixed offset */
    S_DM,    /* float16 D and M per block */
    S_K_D,   /* float16 d per block, int8 scale per sub-block, fixed offset */
    S_K_DM,  /* float16 d and dmin per block, uint8 scale and min per sub-block */
    S_K_DM4, /* as S_K_DM, scale and min 4 bits each in one byte */
    S_NONE,  /* 16-bit float weights */
};

typedef struct {
    int type;         /* ggml's type id */
    const char *name;
    int block;        /* inputs per file block */
    int file_bytes;   /* bytes per file block */
    int sub;          /* inputs per sub-block: 16 or 32 */
    int codes;        /* enum bq_codes */
    int scales;       /* enum bq_scales */
    int offset;       /* nonzero: w = D (u + offset); zero: w = D u + M */
} bq_layout;

static const bq_layout BQ_LAYOUTS[] = {
    {2, "Q4_0", 32, 18, 32, C_NIB, S_D, -8},
    {3, "Q4_1", 32, 20, 32, C_NIB, S_DM, 0},
    {6, "Q5_0", 32, 22, 32, C_NIB_HI1, S_D, -16},
    {7, "Q5_1", 32, 24, 32, C_NIB_HI1, S_DM, 0},
    {8, "Q8_0", 32, 34, 32, C_BYTES, S_D, -128},
    {10, "Q2_K", 256, 84, 16, C_LO2, S_K_DM4, 0},
    {11, "Q3_K", 256, 110, 16, C_LO2_HI1, S_K_D, -4},
    {12, "Q4_K", 256, 144, 32, C_NIB, S_K_DM, 0},
    {13, "Q5_K", 256, 176, 32, C_NIB_HI1, S_K_DM, 0},
    {14, "Q6_K", 256, 210, 16, C_NIB_HI2, S_K_D, -32},
    {20, "IQ4_NL", 32, 18, 32, C_BOOK, S_D, -128},
    {23, "IQ4_XS", 256, 136, 32, C_BOOK, S_K_D, -128},
    {1, "F16", 1, 2, 32, C_F16, S_NONE, 0},
    {30, "BF16", 1, 2, 32, C_BF16, S_NONE, 0},
};
#define BQ_NUM_LAYOUTS ((int)(sizeof BQ_LAYOUTS / sizeof BQ_LAYOUTS[0]))

/* The IQ4 types' codebook (ggml's kvalues_iq4nl). */
static const int8_t BQ_CODEBOOK[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

static inline const bq_layout *bq_find(int64_t type) {
    for (int i = 0; i < BQ_NUM_LAYOUTS; i++)
        if (BQ_LAYOUTS[i].type == type) return &BQ_LAYOUTS[i];
    return NULL;
}

static inline int bq_is_float16(const bq_layout *L) { return L->scales == S_NONE; }
static inline int bq_subs(const bq_layout *L) { return L->block / L->sub; }
static inline int bq_has_mins(const bq_layout *L) { return L->offset == 0; }

/* Bytes of one group's scale part per file block. */
static inline int64_t bq_scale_bytes(const bq_layout *L) {
    switch (L->scales) {
    case S_NONE: return 0;
    case S_D: return 32;
    case S_DM: return 64;
    case S_K_D: return 32 + 16 * bq_subs(L);
    case S_K_DM: return 64 + 32 * bq_subs(L);
    default: return 64 + 16 * bq_subs(L);
    }
}

/* Bytes of the first (nibble, 2-bit or byte) plane of a tile, and of the whole tile. */
static inline int64_t bq_low_plane_bytes(const bq_layout *L) {
    return L->codes == C_BYTES ? 512 : (L->codes == C_LO2 || L->codes == C_LO2_HI1) ? 128 : 256;
}

static inline int64_t bq_tile_bytes(const bq_layout *L) {
    if (bq_is_float16(L)) return 2 * BQ_TILE * BQ_GROUP; /* input e's 16 outputs at 32 e */
    const int64_t high = L->codes == C_NIB_HI2 ? 128
                         : (L->codes == C_NIB_HI1 || L->codes == C_LO2_HI1) ? 64 : 0;
    return bq_low_plane_bytes(L) + high;
}

/* One segment's packed weight as the loops read it: k inputs (a multiple of the type's block),
 * rows outputs. The scale parts of every group come first, then the codes of every group: the
 * loops read two sequential streams, each in its own pages, which the hardware prefetchers
 * follow (one stream alternating between a group's scales and its codes streamed at half the
 * speed from memory). */
typedef struct {
    const bq_layout *L;
    const uint8_t *base, *codes;
    int64_t k, tiles, groups, scale_region, group_bytes, scale_bytes, tile_bytes;
} bq_seg;

static inline bq_seg bq_segment(const bq_layout *L, const uint8_t *base, int64_t k, int64_t rows) {
    bq_seg s = {L, base, base, k, k / BQ_TILE, (rows + BQ_GROUP - 1) / BQ_GROUP, 0, 0,
                bq_scale_bytes(L), bq_tile_bytes(L)};
    s.scale_region = ((k / L->block) * s.scale_bytes + 63) / 64 * 64;
    s.group_bytes = s.tiles * s.tile_bytes;
    if (base != NULL) s.codes = base + s.groups * s.scale_region;
    return s;
}

static inline int64_t bq_segment_bytes(const bq_seg *s) {
    return s->groups * (s->scale_region + s->group_bytes);
}

static inline const uint8_t *bq_scale_part(const bq_seg *s, int64_t g, int64_t block) {
    return s->base + g * s->scale_region + block * s->scale_bytes;
}

static inline const uint8_t *bq_tile(const bq_seg *s, int64_t g, int64_t t) {
    return s->codes + g * s->group_bytes + t * s->tile_bytes;
}

/* Bytes ahead of the tile being read that a loop asks the caches for: one core alone keeps
 * too few reads in flight to stream memory at its bandwidth. */
#ifndef BQ_PREFETCH_AHEAD
#define BQ_PREFETCH_AHEAD 2048
#endif

/* Asks for the lines BQ_PREFETCH_AHEAD bytes past one tile's codes (and its scales). L is
 * s->L, passed apart so that a loop instanced per layout folds its sizes into constants (the
 * division by the block size read through s is an idiv in every tile). */
static inline void bq_prefetch(const bq_seg *s, const bq_layout *L, int64_t g, int64_t t) {
    if (BQ_PREFETCH_AHEAD == 0) return;
    const int64_t tile_bytes = bq_tile_bytes(L);
    const uint8_t *ahead = s->codes + g * s->group_bytes + t * tile_bytes + BQ_PREFETCH_AHEAD;
    for (int64_t at = 0; at < tile_bytes; at += 64) __builtin_prefetch(ahead + at, 0, 3);
    const uint8_t *scales = bq_scale_part(s, g, t * BQ_TILE / L->block);
    __builtin_prefetch(scales + BQ_PREFETCH_AHEAD / 8, 0, 3);
}

static inline uint16_t bq_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* float16 bits -> float, exactly for every finite value (subnormals included): the bits
 * moved into float32's places and the exponent bias corrected by a multiplication, which
 * the compiler vectorises. Infinities and NaN, which no working file holds, come out
 * finite. */
static inline float bq_f16(uint16_t h) {
    const uint32_t bits = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    f *= 5.192296858534828e+33f; /* 2^112 */
    return (h & 0x8000u) ? -f : f;
}

/* The scales of sub-block j of file block `block` for output lane o: D, and M for a type
 * with mins (w = D u + M; a type with a fixed offset leaves M alone). */
/* Where a K type's sub-block j keeps, in a scale part, the 16 lanes' integer scales (int8
 * where the type has a fixed offset, else uint8; Q2_K's low nibbles) and their mins (Q2_K:
 * the high nibbles of the same bytes). */
static inline int bq_k_scales_at(const bq_layout *L, int j) {
    return (L->scales == S_K_D ? 32 : 64) + 16 * j;
}

static inline int bq_k_mins_at(const bq_layout *L, int j) {
    return L->scales == S_K_DM ? 64 + 16 * (bq_subs(L) + j) : bq_k_scales_at(L, j);
}

static inline void bq_lane_scales(const bq_seg *s, int64_t g, int64_t block, int j, int o,
                                  float *D, float *M) {
    const bq_layout *L = s->L;
    const uint8_t *p = bq_scale_part(s, g, block);
    const float d = bq_f16(bq_load_u16(p + 2 * o));
    switch (L->scales) {
    case S_D: *D = d; break;
    case S_DM: *D = d; *M = bq_f16(bq_load_u16(p + 32 + 2 * o)); break;
    case S_K_D: *D = d * (float)(int8_t)p[bq_k_scales_at(L, j) + o]; break;
    case S_K_DM:
        *D = d * (float)p[bq_k_scales_at(L, j) + o];
        *M = -(bq_f16(bq_load_u16(p + 32 + 2 * o)) * (float)p[bq_k_mins_at(L, j) + o]);
        break;
    default:
        *D = d * (float)(p[bq_k_scales_at(L, j) + o] & 15);
        *M = -(bq_f16(bq_load_u16(p + 32 + 2 * o)) * (float)(p[bq_k_mins_at(L, j) + o] >> 4));
        break;
    }
}

#endif
