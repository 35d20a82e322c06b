/* Paged decode attention for the CPU: one query token per sequence against its KV blocks,
 * read where they are. A work item is a run of sequences and a range of their KV heads: each
 * position's K (then V) row of those KV heads is read once, in cache order, and serves the G
 * query heads that share it.
 *
 * Two passes per sequence: the scores of every position, a float32 softmax over them, then the
 * probability-weighted sum of the V rows. Head sizes 64, 80, 96, 128 and 256 get loops of a
 * constant length, which the compiler unrolls and vectorises without tails.
 * The caller cuts the work into parts of about equal size, run on OpenMP threads: runs of
 * sequences, or with fewer sequences than threads, ranges of one sequence's KV heads (a single
 * stream's attention is split across the cores too).
 *
 * Layouts: query and out [S, H, D]; caches [N, B, Hkv, D]; tables int32 [S, W]; lens int32
 * [S]; parts int64 [P, 4] (first sequence, end sequence, first KV head, end KV head).
 * float32 or bfloat16 throughout, or a float32 query and out over bfloat16 or float16 caches
 * (a float32 model with a half-size KV cache); math in float32.
 *
 * A float32 model's decode step may hand over its fused QKV rows instead (rope_cache_decode_*):
 * each part first rotates its query and key heads in place (rotary_row.h), writes its K and V
 * heads into the sequence's slot, then attends, so that the three ops of a layer are one call.
 * Returns 0, 1 when the scratch memory could not be allocated, or 2 (nothing written) when a
 * slot lies past the cache.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rotary_row.h"
#include "vec_math.h"

static inline float load_f32(const float *p, int64_t i) { return p[i]; }
static inline float load_bf16(const bf16 *p, int64_t i) { return from_bf16(p[i]); }
static inline float load_f16(const f16 *p, int64_t i) { return from_f16(p[i]); }
static inline void store_f32(float *p, int64_t i, float v) { p[i] = v; }
static inline void store_bf16(bf16 *p, int64_t i, float v) { p[i] = to_bf16(v); }

/* The two inner loops, over one KV head's row of D elements: the score of a query head
 * (dot) and its probability-weighted V row added into its output (axpy). Written plainly, the
 * compiler vectorises them; a bfloat16 row is widened in the loop (one shift). A float16 row
 * is widened by the processor's conversion instruction where it has one (AVX-512: 16 elements
 * an instruction), which the compiler does not emit for a loop, and else by vec_math.h's
 * integer and float steps. */
#define DEFINE_ROW_LOOPS(SUFFIX, TC, READ)                                                     \
static inline float dot_##SUFFIX(const float *q, const TC *k, const int64_t D) {               \
    float dot = 0.0f;                                                                          \
    for (int64_t d = 0; d < D; d++) dot += q[d] * READ(k[d]);                                  \
    return dot;                                                                                \
}                                                                                              \
static inline void axpy_##SUFFIX(float *acc, float w, const TC *v, const int64_t D) {          \
    for (int64_t d = 0; d < D; d++) acc[d] += w * READ(v[d]);                                  \
}

#define AS_FLOAT(x) (x)
DEFINE_ROW_LOOPS(f32, float, AS_FLOAT)
DEFINE_ROW_LOOPS(bf16, bf16, from_bf16)
DEFINE_ROW_LOOPS(f16_plain, f16, from_f16)

#if defined(__AVX512F__)
static inline __m512 load_f16x16(const f16 *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline float dot_f16(const float *q, const f16 *k, const int64_t D) {
    if (D % 16) return dot_f16_plain(q, k, D);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load_f16x16(k + d), acc);
    return _mm512_reduce_add_ps(acc);
}
static inline void axpy_f16(float *acc, float w, const f16 *v, const int64_t D) {
    if (D % 16) {
        axpy_f16_plain(acc, w, v, D);
        return;
    }
    const __m512 weight = _mm512_set1_ps(w);
    for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(weight, load_f16x16(v + d),
                                                  _mm512_loadu_ps(acc + d)));
}
#else
#define dot_f16 dot_f16_plain
#define axpy_f16 axpy_f16_plain
#endif

/* Blocks are scattered, so the hardware prefetcher stops at each block's end, and a decode
 * step streams every sequence's K and V from memory: reads run AHEAD blocks ahead in the
 * order the kernel visits them (this sequence's K blocks, its V blocks, then the next
 * sequence's K blocks), the part's slice of each row requested as the row is read, into L2
 * rather than L1: a decode step of 64 sequences x 192 positions over 2 threads read 21-28 GB/s
 * that way against 13-15 with the rows requested into L1, whose few miss slots the requests
 * then fill. */
enum { AHEAD = 2 };

typedef struct {
    const char *key_cache, *value_cache;
    const int32_t *table, *next_table; /* next_table: NULL for the last sequence of a part */
    int64_t num_blocks, next_num_blocks, block_bytes;
    int64_t row_bytes, slice_offset, slice_bytes; /* the part's KV heads within each row */
} Visit;

static inline const char *block_at(const Visit *v, int64_t i) {
    if (i < v->num_blocks) return v->key_cache + (int64_t)v->table[i] * v->block_bytes;
    i -= v->num_blocks;
    if (i < v->num_blocks) return v->value_cache + (int64_t)v->table[i] * v->block_bytes;
    i -= v->num_blocks;
    if (v->next_table != NULL && i < v->next_num_blocks)
        return v->key_cache + (int64_t)v->next_table[i] * v->block_bytes;
    return NULL;
}

static inline void prefetch_row(const Visit *v, const char *block, int64_t row) {
    if (block == NULL) return;
    const char *slice = block + row * v->row_bytes + v->slice_offset;
    for (int64_t at = 0; at < v->slice_bytes; at += 64) __builtin_prefetch(slice + at, 0, 2);
}

static void softmax_rows(float *scores, int64_t rows, int64_t stride, int64_t len) {
    for (int64_t g = 0; g < rows; g++) {
        float *s = scores + g * stride, top = -INFINITY, total = 0.0f;
        for (int64_t p = 0; p < len; p++) top = s[p] > top ? s[p] : top;
        for (int64_t p = 0; p < len; p++) {
            s[p] = exp_f32(s[p] - top);
            total += s[p];
        }
        const float inv = 1.0f / total;
        for (int64_t p = 0; p < len; p++) s[p] *= inv;
    }
}

/* One sequence, KV heads [kv0, kv1): query and out point at the sequence's first query head of
 * kv0, scores [(kv1 - kv0) G, score_stride], q and acc [(kv1 - kv0) G D]. */
#define DEFINE_ITEM(NAME, TQ, TC, LOADQ, DOT, AXPY, STORE)                                    \
static inline __attribute__((always_inline)) void NAME(                                       \
    const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *table,         \
    int64_t len, TQ *out, int64_t kv0, int64_t kv1, int64_t num_kv_heads, int64_t G,           \
    const int64_t D, int64_t block_size, float scale, float *scores, int64_t score_stride,     \
    float *q, float *acc, const Visit *visit)                                                  \
{                                                                                              \
    const int64_t row_stride = num_kv_heads * D, H = (kv1 - kv0) * G;                         \
    const int64_t nb = visit->num_blocks;                                                      \
    for (int64_t i = 0; i < H * D; i++) q[i] = LOADQ(query, i) * scale;                        \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const TC *k = key_cache + (int64_t)table[b] * block_size * row_stride + kv0 * D;       \
        const char *ahead = block_at(visit, b + AHEAD);                                        \
        for (int64_t o = 0; o < n; o++, k += row_stride) {                                     \
            prefetch_row(visit, ahead, o);                                                     \
            for (int64_t j = 0; j < kv1 - kv0; j++) {                                          \
                for (int64_t h = j * G; h < (j + 1) * G; h++)                                  \
                    scores[h * score_stride + start + o] = DOT(q + h * D, k + j * D, D);       \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    softmax_rows(scores, H, score_stride, len);                                                \
    memset(acc, 0, sizeof(float) * (size_t)(H * D));                                           \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const TC *v = value_cache + (int64_t)table[b] * block_size * row_stride + kv0 * D;     \
        const char *ahead = block_at(visit, nb + b + AHEAD);                                   \
        for (int64_t o = 0; o < n; o++, v += row_stride) {                                     \
            prefetch_row(visit, ahead, o);                                                     \
            for (int64_t j = 0; j < kv1 - kv0; j++) {                                          \
                for (int64_t h = j * G; h < (j + 1) * G; h++)                                  \
                    AXPY(acc + h * D, scores[h * score_stride + start + o], v + j * D, D);     \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (int64_t i = 0; i < H * D; i++) STORE(out, i, acc[i]);                                 \
}

/* A fused decode step's own inputs: the QKV rows, the rotary tables and each row's slot. */
typedef struct {
    float *qkv;
    int64_t qkv_stride;
    const float *cos_t, *sin_t; /* [S, D / 2] */
    const int64_t *slots;       /* [S]; a negative slot is padding */
} Fused;

#define COPY_F32(in, out, n) memcpy((out), (in), sizeof(float) * (size_t)(n))

/* Rotates sequence seq's query heads of KV heads [kv0, kv1) and those key heads, then writes
 * its K and V heads [kv0, kv1) into its slot, narrowed to the cache's type. */
#define DEFINE_PREP(NAME, TC, WRITE)                                                          \
static inline void NAME(const Fused *f, int64_t seq, int64_t kv0, int64_t kv1, int64_t H,      \
                        int64_t Hkv, int64_t D, TC *key_cache, TC *value_cache) {             \
    float *row = f->qkv + seq * f->qkv_stride;                                                 \
    const int64_t G = H / Hkv, half = D / 2;                                                   \
    const float *c = f->cos_t + seq * half, *s = f->sin_t + seq * half;                        \
    rotary_row_f32(row + kv0 * G * D, (kv1 - kv0) * G, half, c, s);                            \
    rotary_row_f32(row + (H + kv0) * D, kv1 - kv0, half, c, s);                                \
    if (f->slots[seq] < 0) return;                                                             \
    const int64_t at = f->slots[seq] * Hkv * D + kv0 * D, n = (kv1 - kv0) * D;                \
    WRITE(row + (H + kv0) * D, key_cache + at, n);                                             \
    WRITE(row + (H + Hkv + kv0) * D, value_cache + at, n);                                     \
}

DEFINE_PREP(prep_f32, float, COPY_F32)
DEFINE_PREP(prep_bf16kv, bf16, narrow_bf16)
DEFINE_PREP(prep_f16kv, f16, narrow_f16)
#define NO_PREP(...) ((void)0)

#define CALL_ITEM(ITEM, DIM)                                                                  \
    ITEM(q_row, key_cache, value_cache, table, lens[seq], out + head, kv0, kv1,                \
         num_kv_heads, G, DIM, block_size, scale, scores, max_len, q, acc, &visit)

/* Sequences [seq0, seq1), KV heads [kv0, kv1) of each; with `fused`, the query is the
 * rotated part of each sequence's QKV row (PREP rotates it and writes K and V first). */
#define DEFINE_PART(NAME, ITEM, TQ, TC, PREP)                                                 \
static int NAME(const TQ *query, TC *key_cache, TC *value_cache,                               \
                const int32_t *tables, const int32_t *lens, TQ *out, int64_t num_heads,        \
                int64_t num_kv_heads, int64_t head_dim, int64_t block_size,                    \
                int64_t table_width, float scale, const int64_t *part, const Fused *fused) {   \
    const int64_t seq0 = part[0], seq1 = part[1], kv0 = part[2], kv1 = part[3];                \
    const int64_t G = num_heads / num_kv_heads, D = head_dim, H = (kv1 - kv0) * G;             \
    int64_t max_len = 1;                                                                       \
    for (int64_t seq = seq0; seq < seq1; seq++)                                                \
        if (lens[seq] > max_len) max_len = lens[seq];                                          \
    float *buf = malloc(sizeof(float) * (size_t)(H * (max_len + 2 * D)));                      \
    if (buf == NULL) return 1;                                                                 \
    float *scores = buf, *q = buf + H * max_len, *acc = q + H * D;                              \
    const int64_t row_bytes = num_kv_heads * D * (int64_t)sizeof(TC);                          \
    for (int64_t seq = seq0; seq < seq1; seq++) {                                              \
        const int64_t head = (seq * num_heads + kv0 * G) * D;                                  \
        const TQ *q_row = query + head;                                                        \
        if (fused != NULL) {                                                                   \
            PREP(fused, seq, kv0, kv1, num_heads, num_kv_heads, D, key_cache, value_cache);    \
            q_row = (const TQ *)(fused->qkv + seq * fused->qkv_stride) + kv0 * G * D;          \
        }                                                                                      \
        const int32_t *table = tables + seq * table_width;                                     \
        const Visit visit = {                                                                  \
            (const char *)key_cache, (const char *)value_cache, table,                         \
            seq + 1 < seq1 ? table + table_width : NULL,                                       \
            (lens[seq] + block_size - 1) / block_size,                                         \
            seq + 1 < seq1 ? (lens[seq + 1] + block_size - 1) / block_size : 0,                \
            block_size * row_bytes, row_bytes, kv0 * D * (int64_t)sizeof(TC),                  \
            (kv1 - kv0) * D * (int64_t)sizeof(TC)};                                            \
        if (seq == seq0) /* the first blocks; later sequences' come from the one before */     \
            for (int64_t b = 0; b < AHEAD; b++)                                                \
                for (int64_t o = 0; o < block_size; o++)                                       \
                    prefetch_row(&visit, block_at(&visit, b), o);                              \
        switch (D) {                                                                           \
        case 64: CALL_ITEM(ITEM, 64); break;                                                   \
        case 80: CALL_ITEM(ITEM, 80); break;                                                   \
        case 96: CALL_ITEM(ITEM, 96); break;                                                   \
        case 128: CALL_ITEM(ITEM, 128); break;                                                 \
        case 256: CALL_ITEM(ITEM, 256); break;                                                 \
        default: CALL_ITEM(ITEM, D);                                                           \
        }                                                                                      \
    }                                                                                          \
    free(buf);                                                                                 \
    return 0;                                                                                  \
}

DEFINE_ITEM(item_f32, float, float, load_f32, dot_f32, axpy_f32, store_f32)
DEFINE_ITEM(item_bf16, bf16, bf16, load_bf16, dot_bf16, axpy_bf16, store_bf16)
DEFINE_ITEM(item_f32_bf16kv, float, bf16, load_f32, dot_bf16, axpy_bf16, store_f32)
DEFINE_ITEM(item_f32_f16kv, float, f16, load_f32, dot_f16, axpy_f16, store_f32)

/* The exported entry points: each of `num_parts` parts (rows of `parts`) handed out to
 * `threads` threads of the OpenMP pool (torch's own, when torch is loaded: its threads are the
 * ones already running, so the kernel neither oversubscribes the cores nor waits for threads
 * that spin in torch's pool). Parts are taken as threads come free; one part runs on the
 * calling thread alone, without entering the pool. */
#define DEFINE_RUN(NAME, PART, TQ, TC)                                                        \
static int NAME(const TQ *query, TC *key_cache, TC *value_cache, const int32_t *tables,        \
                const int32_t *lens, TQ *out, int64_t num_heads, int64_t num_kv_heads,         \
                int64_t head_dim, int64_t block_size, int64_t table_width, float scale,        \
                const int64_t *parts, int64_t num_parts, int64_t threads,                      \
                const Fused *fused) {                                                          \
    if (num_parts == 1)                                                                        \
        return PART(query, key_cache, value_cache, tables, lens, out, num_heads, num_kv_heads, \
                    head_dim, block_size, table_width, scale, parts, fused);                   \
    int failed = 0;                                                                            \
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(|: failed)") \
    for (int64_t p = 0; p < num_parts; p++)                                                    \
        failed |= PART(query, key_cache, value_cache, tables, lens, out, num_heads,            \
                       num_kv_heads, head_dim, block_size, table_width, scale, parts + 4 * p,  \
                       fused);                                                                 \
    return failed;                                                                             \
}

#define DEFINE_DECODE(NAME, RUN, TQ, TC)                                                      \
int NAME(const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *tables,   \
         const int32_t *lens, TQ *out, int64_t num_heads, int64_t num_kv_heads,                \
         int64_t head_dim, int64_t block_size, int64_t table_width, float scale,               \
         const int64_t *parts, int64_t num_parts, int64_t threads) {                           \
    return RUN(query, (TC *)key_cache, (TC *)value_cache, tables, lens, out, num_heads,        \
               num_kv_heads, head_dim, block_size, table_width, scale, parts, num_parts,       \
               threads, NULL);                                                                 \
}

/* A float32 model's decode step from its fused QKV rows [S, >= (H + 2 Hkv) D] (row stride
 * qkv_stride): rotary embedding of the query and key heads (in place), the K and V rows
 * written into slots [S] of caches of num_slots slots, then attention into out [S, H, D]. */
#define DEFINE_FUSED(NAME, RUN, TC)                                                           \
int NAME(float *qkv, int64_t qkv_stride, const float *cos_t, const float *sin_t,               \
         const int64_t *slots, int64_t num_slots, TC *key_cache, TC *value_cache,              \
         const int32_t *tables, const int32_t *lens, float *out, int64_t num_heads,            \
         int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t table_width,      \
         float scale, const int64_t *parts, int64_t num_parts, int64_t threads,                \
         int64_t num_seqs) {                                                                   \
    for (int64_t s = 0; s < num_seqs; s++)                                                     \
        if (slots[s] >= num_slots) return 2;                                                   \
    const Fused fused = {qkv, qkv_stride, cos_t, sin_t, slots};                                \
    return RUN(NULL, key_cache, value_cache, tables, lens, out, num_heads, num_kv_heads,       \
               head_dim, block_size, table_width, scale, parts, num_parts, threads, &fused);   \
}

DEFINE_PART(part_f32, item_f32, float, float, prep_f32)
DEFINE_PART(part_bf16, item_bf16, bf16, bf16, NO_PREP)
DEFINE_PART(part_f32_bf16kv, item_f32_bf16kv, float, bf16, prep_bf16kv)
DEFINE_PART(part_f32_f16kv, item_f32_f16kv, float, f16, prep_f16kv)
DEFINE_RUN(run_f32, part_f32, float, float)
DEFINE_RUN(run_bf16, part_bf16, bf16, bf16)
DEFINE_RUN(run_f32_bf16kv, part_f32_bf16kv, float, bf16)
DEFINE_RUN(run_f32_f16kv, part_f32_f16kv, float, f16)
DEFINE_DECODE(paged_decode_f32, run_f32, float, float)
DEFINE_DECODE(paged_decode_bf16, run_bf16, bf16, bf16)
DEFINE_DECODE(paged_decode_f32_bf16kv, run_f32_bf16kv, float, bf16)
DEFINE_DECODE(paged_decode_f32_f16kv, run_f32_f16kv, float, f16)
DEFINE_FUSED(rope_cache_decode_f32, run_f32, float)
DEFINE_FUSED(rope_cache_decode_f32_bf16kv, run_f32_bf16kv, bf16)
DEFINE_FUSED(rope_cache_decode_f32_f16kv, run_f32_f16kv, f16)
