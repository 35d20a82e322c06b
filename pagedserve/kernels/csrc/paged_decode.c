/* Paged decode attention for the CPU: one query token per sequence against its KV blocks,
 * read where they are. A work item is one sequence: each position's K (then V) row of every
 * KV head is read once, in cache order, and serves the G query heads that share it.
 *
 * Two passes per item: the scores of every position, a float32 softmax over them, then the
 * probability-weighted sum of the V rows. Head sizes 64, 80, 96, 128 and 256 get loops of a
 * constant length, which the compiler unrolls and vectorises without tails.
 * The caller cuts the sequences into parts of about equal work, run on OpenMP threads.
 *
 * Layouts: query and out [S, H, D]; caches [N, B, Hkv, D]; tables int32 [S, W]; lens int32
 * [S]. float32 or bfloat16 throughout, or a float32 query and out over bfloat16 caches (a
 * float32 model with a half-size KV cache); math in float32.
 * Returns 0, or 1 when the scratch memory could not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec_math.h"

static inline float load_f32(const float *p, int64_t i) { return p[i]; }
static inline float load_bf16(const bf16 *p, int64_t i) { return from_bf16(p[i]); }
static inline void store_f32(float *p, int64_t i, float v) { p[i] = v; }
static inline void store_bf16(bf16 *p, int64_t i, float v) { p[i] = to_bf16(v); }

/* Blocks are scattered, so the hardware prefetcher stops at each block's end, and a decode
 * step streams every sequence's K and V from memory: reads run AHEAD blocks ahead in the
 * order the kernel visits them (this sequence's K blocks, its V blocks, then the next
 * sequence's K blocks), one row requested per row read, into L2 rather than L1: a decode step
 * of 64 sequences x 192 positions over 2 threads read 21-28 GB/s that way against 13-15 with
 * the rows requested into L1, whose few miss slots the requests then fill. */
enum { AHEAD = 2 };

typedef struct {
    const char *key_cache, *value_cache;
    const int32_t *table, *next_table; /* next_table: NULL for the last sequence of a range */
    int64_t num_blocks, next_num_blocks, block_bytes;
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

static inline void prefetch_row(const char *block, int64_t row, int64_t row_bytes) {
    if (block == NULL) return;
    for (int64_t at = 0; at < row_bytes; at += 64) __builtin_prefetch(block + row * row_bytes + at, 0, 2);
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

#define DEFINE_ITEM(NAME, TQ, TC, LOADQ, LOADC, STORE)                                        \
static inline __attribute__((always_inline)) void NAME(                                       \
    const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *table,         \
    int64_t len, TQ *out, int64_t H, int64_t G, const int64_t D, int64_t block_size,           \
    float scale, float *scores, int64_t score_stride, float *q, float *acc, const Visit *visit) \
{                                                                                              \
    const int64_t row_stride = H / G * D, row_bytes = row_stride * (int64_t)sizeof(TC);        \
    const int64_t nb = visit->num_blocks;                                                      \
    for (int64_t i = 0; i < H * D; i++) q[i] = LOADQ(query, i) * scale;                        \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const TC *k = key_cache + (int64_t)table[b] * block_size * row_stride;                 \
        const char *ahead = block_at(visit, b + AHEAD);                                        \
        for (int64_t o = 0; o < n; o++, k += row_stride) {                                     \
            prefetch_row(ahead, o, row_bytes);                                                 \
            for (int64_t h = 0; h < H; h++) {                                                  \
                const TC *kh = k + h / G * D;                                                  \
                float dot = 0.0f;                                                              \
                for (int64_t d = 0; d < D; d++) dot += q[h * D + d] * LOADC(kh, d);            \
                scores[h * score_stride + start + o] = dot;                                    \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    softmax_rows(scores, H, score_stride, len);                                                \
    memset(acc, 0, sizeof(float) * (size_t)(H * D));                                           \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const TC *v = value_cache + (int64_t)table[b] * block_size * row_stride;               \
        const char *ahead = block_at(visit, nb + b + AHEAD);                                   \
        for (int64_t o = 0; o < n; o++, v += row_stride) {                                     \
            prefetch_row(ahead, o, row_bytes);                                                 \
            for (int64_t h = 0; h < H; h++) {                                                  \
                const TC *vh = v + h / G * D;                                                  \
                const float w = scores[h * score_stride + start + o];                          \
                for (int64_t d = 0; d < D; d++) acc[h * D + d] += w * LOADC(vh, d);            \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (int64_t i = 0; i < H * D; i++) STORE(out, i, acc[i]);                                 \
}

#define CALL_ITEM(ITEM, DIM)                                                                  \
    ITEM(query + head, key_cache, value_cache, table, lens[seq], out + head, num_heads, G,     \
         DIM, block_size, scale, scores, max_len, q, acc, &visit)

#define DEFINE_RANGE(NAME, ITEM, TQ, TC)                                                      \
static int NAME(const TQ *query, const TC *key_cache, const TC *value_cache,                   \
                const int32_t *tables, const int32_t *lens, TQ *out, int64_t num_heads,        \
                int64_t num_kv_heads, int64_t head_dim, int64_t block_size,                    \
                int64_t table_width, float scale, int64_t begin, int64_t end) {                \
    const int64_t G = num_heads / num_kv_heads, D = head_dim;                                  \
    int64_t max_len = 1;                                                                       \
    for (int64_t seq = begin; seq < end; seq++)                                                \
        if (lens[seq] > max_len) max_len = lens[seq];                                          \
    float *buf = malloc(sizeof(float) * (size_t)(num_heads * (max_len + 2 * D)));              \
    if (buf == NULL) return 1;                                                                 \
    float *scores = buf, *q = buf + num_heads * max_len, *acc = q + num_heads * D;             \
    for (int64_t seq = begin; seq < end; seq++) {                                              \
        const int64_t head = seq * num_heads * D;                                              \
        const int32_t *table = tables + seq * table_width;                                     \
        const int64_t block_bytes = block_size * num_kv_heads * D * (int64_t)sizeof(TC);       \
        const Visit visit = {                                                                  \
            (const char *)key_cache, (const char *)value_cache, table,                         \
            seq + 1 < end ? table + table_width : NULL,                                        \
            (lens[seq] + block_size - 1) / block_size,                                         \
            seq + 1 < end ? (lens[seq + 1] + block_size - 1) / block_size : 0, block_bytes};   \
        if (seq == begin) /* the first blocks; later sequences' come from the one before */    \
            for (int64_t b = 0; b < AHEAD; b++)                                                \
                for (int64_t o = 0; o < block_size; o++)                                       \
                    prefetch_row(block_at(&visit, b), o, block_bytes / block_size);            \
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

DEFINE_ITEM(item_f32, float, float, load_f32, load_f32, store_f32)
DEFINE_ITEM(item_bf16, bf16, bf16, load_bf16, load_bf16, store_bf16)
DEFINE_ITEM(item_f32_bf16kv, float, bf16, load_f32, load_bf16, store_f32)
/* The exported entry points: sequences [bounds[p], bounds[p + 1]) for each of `parts` parts,
 * handed out to `threads` threads of the OpenMP pool (torch's own, when torch is loaded: its
 * threads are the ones already running, so the kernel neither oversubscribes the cores nor
 * waits for threads that spin in torch's pool). Parts are taken as threads come free. */
#define DEFINE_DECODE(NAME, RANGE, TQ, TC)                                                    \
int NAME(const TQ *query, const TC *key_cache, const TC *value_cache, const int32_t *tables,   \
         const int32_t *lens, TQ *out, int64_t num_heads, int64_t num_kv_heads,                \
         int64_t head_dim, int64_t block_size, int64_t table_width, float scale,               \
         const int64_t *bounds, int64_t parts, int64_t threads) {                              \
    int failed = 0;                                                                            \
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(|: failed)") \
    for (int64_t p = 0; p < parts; p++)                                                        \
        failed |= RANGE(query, key_cache, value_cache, tables, lens, out, num_heads,           \
                        num_kv_heads, head_dim, block_size, table_width, scale, bounds[p],     \
                        bounds[p + 1]);                                                        \
    return failed;                                                                             \
}

DEFINE_RANGE(range_f32, item_f32, float, float)
DEFINE_RANGE(range_bf16, item_bf16, bf16, bf16)
DEFINE_RANGE(range_f32_bf16kv, item_f32_bf16kv, float, bf16)
DEFINE_DECODE(paged_decode_f32, range_f32, float, float)
DEFINE_DECODE(paged_decode_bf16, range_bf16, bf16, bf16)
DEFINE_DECODE(paged_decode_f32_bf16kv, range_f32_bf16kv, float, bf16)
