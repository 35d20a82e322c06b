/* The block-quant kernel's entry points: repack GGUF blocks into the packed form
 * (bq_layout.h), read packed rows back as floats, and y = x W^T for a weight made of row
 * segments of any of the types, each segment writing its slice of y's columns, all in one
 * OpenMP region on torch's threads.
 *
 * Four dot-product paths are compiled into this one library, each function carrying its own
 * target attributes, so that each can be forced (and tested) on any machine that has it:
 * AVX-512 VNNI (bq_vnni.h; for the K types over activations scaled per 256 inputs,
 * bq_vnni_k.h), AVX-VNNI and AVX2 + FMA (bq_avx2.h) and portable C (bq_portable.h). A call
 * whose segments read both kinds of activations quantizes its rows both ways.
 * bq_paths() says which ones this CPU runs.
 *
 * Each thread takes chunks of output groups (bq_schedule.h) and, for each group, every row of
 * x in tiles of up to 8: the group's codes stay in L1 while the rows read them, so a weight is
 * read from memory once per call (once per CHUNK_ROWS rows for a long prefill).
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bq_float16.h"
#include "bq_quantize.h"
#include "bq_schedule.h"
#include "bq_vnni_k.h"

#define CHUNK_ROWS 64

enum bq_path { PATH_PORTABLE = 0, PATH_AVX2 = 1, PATH_AVX_VNNI = 2, PATH_VNNI = 3 };

#if BQ_X86
#include <cpuid.h>

/* AVX-VNNI (the VEX-encoded vpdpbusd): CPUID leaf 7, sub-leaf 1, EAX bit 4. */
static int has_avx_vnni(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1);
}
#endif

/* Bit p set where this CPU runs path p. */
int64_t bq_paths(void) {
    int64_t paths = 1 << PATH_PORTABLE;
#if BQ_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        paths |= 1 << PATH_AVX2;
    if ((paths >> PATH_AVX2 & 1) && has_avx_vnni()) paths |= 1 << PATH_AVX_VNNI;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
        paths |= 1 << PATH_VNNI;
#endif
    return paths;
}

/* The layout table, for the Python side to check its own against: entry i as (type, inputs
 * per block, bytes per block); returns the number of entries. */
int64_t bq_layout_info(int64_t i, int64_t *out) {
    if (i >= 0 && i < BQ_NUM_LAYOUTS) {
        out[0] = BQ_LAYOUTS[i].type;
        out[1] = BQ_LAYOUTS[i].block;
        out[2] = BQ_LAYOUTS[i].file_bytes;
    }
    return BQ_NUM_LAYOUTS;
}

/* Bytes of the packed form of a [rows, k] weight of `type`; -1 for an unknown type or a k
 * that is not whole blocks. */
int64_t bq_packed_bytes(int64_t type, int64_t rows, int64_t k) {
    const bq_layout *L = bq_find(type);
    if (L == NULL || k <= 0 || k % L->block || k % BQ_TILE || rows <= 0) return -1;
    const bq_seg s = bq_segment(L, NULL, k, rows);
    return bq_segment_bytes(&s);
}

/* Packs a [rows, k] weight whose row r starts at src + r * src_stride (ggml's blocks) into
 * dst (bq_packed_bytes of it); returns 0, or -1 where bq_packed_bytes refuses. */
int64_t bq_repack(int64_t type, const uint8_t *src, int64_t src_stride, int64_t rows, int64_t k,
                  uint8_t *dst, int64_t threads) {
    const bq_layout *L = bq_find(type);
    if (bq_packed_bytes(type, rows, k) < 0) return -1;
    const bq_seg s = bq_segment(L, dst, k, rows);
    const int64_t groups = s.groups;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; g++) {
        if (bq_is_float16(L)) bq_pack_group16(&s, src, src_stride, rows, g);
        else bq_pack_group(&s, src, src_stride, rows, g);
    }
    return 0;
}

/* out [n, k] = rows ids of the packed [rows, k] weight, as floats. */
void bq_dequantize_rows(int64_t type, const uint8_t *packed, int64_t rows, int64_t k,
                        const int64_t *ids, int64_t n, float *out, int64_t threads) {
    const bq_seg s = bq_segment(bq_find(type), packed, k, rows);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) {
        if (bq_is_float16(s.L)) bq_dequantize_row16(&s, ids[i], out + i * k);
        else bq_dequantize_row(&s, ids[i], out + i * k);
    }
}

/* The activations of x [rows, k] as bq_linear quantizes them (act_bits 8 or 16; scaled per
 * `group` blocks of 32, 1 or 8), by the AVX-512 loop where `vector` and this CPU has the
 * AVX-512 path, else the plain one: codes [rows, k_pad] (int8 or int16), then per block of 32
 * its scale, scaled sum and two half sums. */
void bq_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t k, int64_t k_pad,
                 int64_t act_bits, int64_t vector, int64_t group, void *codes, float *da,
                 float *sx, int32_t *s16) {
    const int wide = act_bits == 16;
    const bq_acts xa = {wide ? NULL : (int8_t *)codes, wide ? (int16_t *)codes : NULL, da, s16,
                        NULL, sx, k_pad / BQ_TILE, x, x_stride, NULL};
    const int avx512 = vector && (bq_paths() >> PATH_VNNI & 1);
    for (int64_t r = 0; r < rows; r++)
        quantize_row(&xa, x + r * x_stride, k, r, avx512, (int)group);
}

typedef bq_tile_fn tile_fn;

/* Whether the path reads a K type's activations scaled per 256 inputs (bq_vnni_k.h). */
static int per_block_acts(int64_t path, const bq_layout *L, int wide) {
#if BQ_X86
    return path == PATH_VNNI && !wide && !bq_is_float16(L) &&
           VNNI_K_TILES[L - BQ_LAYOUTS] != NULL;
#else
    (void)path, (void)L, (void)wide;
    return 0;
#endif
}

/* The blocks of 32 inputs that share an activation scale where `path` runs a weight of `type`
 * (act_bits 8 or 16): 8 where the path reads them scaled per 256 inputs, else 1. */
int64_t bq_act_group(int64_t path, int64_t type, int64_t act_bits) {
    const bq_layout *L = bq_find(type);
    return L != NULL && per_block_acts(path, L, act_bits == 16) ? 8 : 1;
}

static tile_fn pick_tile(int64_t path, const bq_layout *L, int wide) {
    const int bf16 = L->codes == C_BF16;
#if BQ_X86
    if (per_block_acts(path, L, wide)) return VNNI_K_TILES[L - BQ_LAYOUTS];
    if (path == PATH_VNNI && bq_is_float16(L)) return bf16 ? avx512_16_1 : avx512_16_0;
    if ((path == PATH_AVX2 || path == PATH_AVX_VNNI) && bq_is_float16(L))
        return bf16 ? avx2_16_1 : avx2_16_0;
    if (path == PATH_AVX_VNNI && !wide) return AVXVNNI_TILES[L - BQ_LAYOUTS];
    if (path == PATH_VNNI) return VNNI_TILES[L - BQ_LAYOUTS][wide];
    if (path == PATH_AVX2 || path == PATH_AVX_VNNI) return AVX2_TILES[L - BQ_LAYOUTS][wide];
#endif
    (void)path, (void)wide, (void)bf16;
    return bq_is_float16(L) ? tile16_portable : tile_portable;
}

typedef struct {
    bq_seg seg;
    tile_fn tile;
    int64_t rows, col, first_group;
    int acts; /* the activations it reads: 0 scaled per 32 inputs, 1 per 256 */
} segment_run;

/* The activations' buffers: kept from call to call on the calling thread (one allocation,
 * grown as needed) up to KEEP_BYTES, so that a decode step's many calls do not each allocate
 * five buffers; a larger prefill allocates its own for the call. */
#define KEEP_BYTES (8 << 20)
static __thread void *kept;
static __thread size_t kept_bytes;

static void *acts_buffer(size_t bytes, void **owned) {
    *owned = NULL;
    if (bytes > KEEP_BYTES) return *owned = malloc(bytes);
    if (bytes > kept_bytes) {
        free(kept);
        kept = malloc(KEEP_BYTES < 2 * bytes ? KEEP_BYTES : 2 * bytes);
        kept_bytes = kept != NULL ? (KEEP_BYTES < 2 * bytes ? KEEP_BYTES : 2 * bytes) : 0;
    }
    return kept;
}

/* Group chunks per thread: enough that a thread held off its core leaves little for the
 * others to wait on, few enough that taking one costs nothing against its reads. */
#define ITEMS_PER_THREAD 16

/* Writes group g of run `run` for rows [r0, r_end) of y. */
static void group_rows(const segment_run *run, const bq_acts *acts, int64_t g, int64_t r0,
                       int64_t r_end, float *y, int64_t y_stride) {
    const bq_acts *xa = &acts[run->acts];
    const int64_t left = run->rows - g * BQ_GROUP;
    const int64_t width = left < BQ_GROUP ? left : BQ_GROUP;
    for (; r0 < r_end; r0 += BQ_TILE_ROWS) {
        const int64_t left_rows = r_end - r0;
        const int nr = (int)(left_rows < BQ_TILE_ROWS ? left_rows : BQ_TILE_ROWS);
        float out[BQ_TILE_ROWS][BQ_GROUP];
        run->tile(&run->seg, xa, g, r0, nr, out);
        float *to = y + r0 * y_stride + run->col + g * BQ_GROUP;
        if (width == BQ_GROUP) /* a copy of constant size: inlined, not a call per row */
            for (int r = 0; r < nr; r++) memcpy(to + r * y_stride, out[r], sizeof out[r]);
        else
            for (int r = 0; r < nr; r++) memcpy(to + r * y_stride, out[r], (size_t)width * 4);
    }
}

typedef struct {
    const segment_run *runs;
    int64_t nseg, groups, k, k_pad, threads;
    int wide, vector, tiles; /* tiles: whether the path reads bq_tiled */
    int needs[2];            /* whether some segment reads activations of each scaling */
} linear_plan;

/* The activations of `rows` rows laid out from buf: plain codes, then da, sx, s16 and pairs,
 * then (where `tiled`) the tiled copy; returns the bytes they take. */
static size_t acts_at(uint8_t *buf, int64_t rows, int64_t k_pad, int wide, int tiled,
                      int pairs, const float *x, int64_t x_stride, bq_acts *xa) {
    const int64_t blocks = k_pad / BQ_TILE;
    const size_t code_bytes = (size_t)(rows * k_pad) * (wide ? 2 : 1);
    const size_t codes_at = (code_bytes + 63) / 64 * 64;
    const size_t plain_bytes = codes_at + ((size_t)(rows * blocks) * 24 + 63) / 64 * 64;
    const size_t tiled_bytes =
        tiled ? (size_t)((rows + BQ_TILE_ROWS - 1) / BQ_TILE_ROWS * blocks) * sizeof(bq_tiled) : 0;
    if (buf != NULL) {
        float *da = (float *)(buf + codes_at);
        float *sx = da + rows * blocks;
        int32_t *s16 = (int32_t *)(sx + rows * blocks);
        *xa = (bq_acts){wide ? NULL : (int8_t *)buf, wide ? (int16_t *)buf : NULL, da, s16,
                        pairs ? (uint32_t *)(s16 + 2 * rows * blocks) : NULL, sx, blocks, x,
                        x_stride, tiled ? (const bq_tiled *)(buf + plain_bytes) : NULL};
    }
    return plain_bytes + tiled_bytes;
}

/* Rows of one bq_linear call at a time: as many as the kept activation buffer holds (whole
 * chunks of rows, each set of activations laid out as acts_at lays it out), so that a long
 * prefill neither allocates nor faults in a buffer of its own on every call; each slab's
 * activations are written and read while they are in cache. */
static int64_t slab_rows(int64_t k_pad, int wide, int sets) {
    const size_t chunk = acts_at(NULL, CHUNK_ROWS, k_pad, wide, 1, 1, NULL, 0, NULL) *
                         (size_t)(sets > 1 ? sets : 1);
    const int64_t fit = (int64_t)(KEEP_BYTES / chunk) * CHUNK_ROWS;
    return fit > CHUNK_ROWS ? fit : CHUNK_ROWS;
}

/* Rows [r0, r_end) of x into each needed set of activations (set 1 scaled per 8 blocks). */
static void quantize_rows(const linear_plan *p, const bq_acts *acts, const float *x,
                          int64_t x_stride, int64_t r0, int64_t r_end) {
    for (int set = 0; set < 2; set++)
        if (p->needs[set])
            for (int64_t r = r0; r < r_end; r++)
                quantize_row(&acts[set], x + r * x_stride, p->k, r, p->vector, set ? 8 : 1);
}

/* y [rows, ...] = x [rows, k] times the weight^T, for rows that fit one slab. */
static void linear_slab(const linear_plan *p, const float *x, int64_t x_stride, int64_t rows,
                        float *y, int64_t y_stride) {
    const int64_t threads = p->threads, groups = p->groups;
    const int tiled = p->tiles && rows >= 4;
    const size_t set_bytes = acts_at(NULL, rows, p->k_pad, p->wide, tiled, 1, x, x_stride, NULL);
    void *owned;
    uint8_t *buf = acts_buffer(set_bytes * (size_t)(p->needs[0] + p->needs[1]), &owned);
    /* the 16-bit weights' tiles read only the float rows */
    bq_acts acts[2] = {{.blocks = p->k_pad / BQ_TILE, .x = x, .x_stride = x_stride},
                       {.blocks = p->k_pad / BQ_TILE, .x = x, .x_stride = x_stride}};
    for (int set = 0, at = 0; set < 2; set++)
        if (p->needs[set])
            acts_at(buf + set_bytes * (size_t)at++, rows, p->k_pad, p->wide, tiled, set == 1, x,
                    x_stride, &acts[set]); /* the sums' pairs: bq_vnni_k.h's */
    int64_t per_item = groups / (threads * ITEMS_PER_THREAD);
    if (per_item < 1) per_item = 1;
    const int64_t group_items = (groups + per_item - 1) / per_item;
    const int64_t row_chunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    bq_run spans[BQ_MAX_RUNS];
    bq_runs_init(spans, (int)threads, row_chunks * group_items);
    /* A few rows (a decode step) are quantized before the threads start: a barrier between
     * the two phases costs a time slice whenever another process holds a core. */
    const int split = (p->needs[0] || p->needs[1]) && rows >= CHUNK_ROWS;
    if (!split) quantize_rows(p, acts, x, x_stride, 0, rows);
#pragma omp parallel num_threads(threads)
    {
        if (split) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) quantize_rows(p, acts, x, x_stride, r, r + 1);
        }
        int self = 0;
#ifdef _OPENMP
        self = omp_get_thread_num();
#endif
        int64_t i = 0; /* the segment of the last group, where the next one search starts */
        for (int64_t item; (item = bq_next_item(spans, (int)threads, self)) >= 0;) {
            const int64_t chunk = item / group_items * CHUNK_ROWS;
            const int64_t chunk_end = chunk + CHUNK_ROWS < rows ? chunk + CHUNK_ROWS : rows;
            const int64_t first = item % group_items * per_item;
            const int64_t last = first + per_item < groups ? first + per_item : groups;
            for (int64_t gi = first; gi < last; gi++) {
                while (i + 1 < p->nseg && gi >= p->runs[i + 1].first_group) i++;
                while (i > 0 && gi < p->runs[i].first_group) i--;
                group_rows(&p->runs[i], acts, gi - p->runs[i].first_group, chunk, chunk_end, y,
                           y_stride);
            }
        }
    }
    free(owned);
}

/* y [rows, n] (row stride y_stride) = x [rows, k] (row stride x_stride) times the weight^T.
 * The weight is nseg row segments: segs[4 s ..] = (type, rows, byte offset into packed,
 * first column of y), each packed for k_pad inputs (k rounded up to whole blocks). path:
 * enum bq_path (one bq_paths() has); act_bits 8 or 16.
 *
 * The rows go in slabs (slab_rows); within one, the work items are (chunk of CHUNK_ROWS rows,
 * chunk of groups), row chunks outermost, shared out as bq_schedule.h says. */
void bq_linear(const float *x, int64_t x_stride, int64_t rows, int64_t k, int64_t k_pad,
               const uint8_t *packed, const int64_t *segs, int64_t nseg, float *y,
               int64_t y_stride, int64_t threads, int64_t path, int64_t act_bits) {
    const int wide = act_bits == 16;
    segment_run few[8];
    segment_run *runs = nseg <= 8 ? few : malloc((size_t)nseg * sizeof *runs);
    int64_t groups = 0;
    int needs[2] = {0, 0}; /* whether any segment reads quantized activations of each kind */
    for (int64_t i = 0; i < nseg; i++) {
        const bq_layout *L = bq_find(segs[4 * i]);
        const int acts = per_block_acts(path, L, wide);
        needs[acts] |= !bq_is_float16(L);
        runs[i] = (segment_run){bq_segment(L, packed + segs[4 * i + 2], k_pad, segs[4 * i + 1]),
                                pick_tile(path, L, wide), segs[4 * i + 1], segs[4 * i + 3], groups,
                                acts};
        groups += (runs[i].rows + BQ_GROUP - 1) / BQ_GROUP;
    }
    if (threads < 1) threads = 1;
    if (threads > BQ_MAX_RUNS) threads = BQ_MAX_RUNS;
    const linear_plan plan = {runs,  nseg, groups,          k,
                              k_pad, threads, wide,         path == PATH_VNNI,
                              path != PATH_PORTABLE && !wide && (needs[0] || needs[1]),
                              {needs[0], needs[1]}};
    const int64_t slab = slab_rows(k_pad, wide, needs[0] + needs[1]);
    for (int64_t r = 0; r < rows; r += slab)
        linear_slab(&plan, x + r * x_stride, x_stride, rows - r < slab ? rows - r : slab,
                    y + r * y_stride, y_stride);
    if (runs != few) free(runs);
}
