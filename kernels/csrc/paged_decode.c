/* Paged decode attention for the CPU: one query token per sequence against its KV blocks,
 * read where they are. A work item is one sequence: each position's K (then V) row of every
 * KV head is read once, in cache order, and serves the G query heads that share it.
 *
 * Two passes per item: the scores of every position, a float32 softmax over them, then the
 * probability-weighted sum of the V rows. Head sizes 64, 80, 96, 128 and 256 get loops of a
 * constant length, which the compiler unrolls and vectorises without tails.
 * The caller splits the items across threads.
 *
 * Layouts: query and out [S, H, D]; caches [N, B, Hkv, D]; tables int32 [S, W]; lens int32
 * [S]. float32 or bfloat16 (query, caches and out share the dtype; math in float32).
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

/* Blocks are scattered: the hardware prefetcher stops at a block's end, so the next block's
 * rows are requested while the current block is read. */
static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch((const char *)row + at);
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

#define DEFINE_ITEM(NAME, T, LOAD, STORE)                                                     \
static inline __attribute__((always_inline)) void NAME(                                       \
    const T *query, const T *key_cache, const T *value_cache, const int32_t *table,            \
    int64_t len, T *out, int64_t H, int64_t G, const int64_t D, int64_t block_size,            \
    float scale, float *scores, int64_t score_stride, float *q, float *acc) {                  \
    const int64_t row_stride = H / G * D;                                                      \
    for (int64_t i = 0; i < H * D; i++) q[i] = LOAD(query, i) * scale;                         \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const T *k = key_cache + (int64_t)table[b] * block_size * row_stride;                  \
        const T *next = start + block_size < len ? key_cache + (int64_t)table[b + 1]           \
                        * block_size * row_stride : NULL;                                      \
        for (int64_t o = 0; o < n; o++, k += row_stride) {                                     \
            if (next != NULL) prefetch_row(next + o * row_stride, row_stride * sizeof(T));     \
            for (int64_t h = 0; h < H; h++) {                                                  \
                const T *kh = k + h / G * D;                                                   \
                float dot = 0.0f;                                                              \
                for (int64_t d = 0; d < D; d++) dot += q[h * D + d] * LOAD(kh, d);             \
                scores[h * score_stride + start + o] = dot;                                    \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    softmax_rows(scores, H, score_stride, len);                                                \
    memset(acc, 0, sizeof(float) * (size_t)(H * D));                                           \
    for (int64_t start = 0, b = 0; start < len; start += block_size, b++) {                    \
        const int64_t n = len - start < block_size ? len - start : block_size;                 \
        const T *v = value_cache + (int64_t)table[b] * block_size * row_stride;                \
        const T *next = start + block_size < len ? value_cache + (int64_t)table[b + 1]         \
                        * block_size * row_stride : NULL;                                      \
        for (int64_t o = 0; o < n; o++, v += row_stride) {                                     \
            if (next != NULL) prefetch_row(next + o * row_stride, row_stride * sizeof(T));     \
            for (int64_t h = 0; h < H; h++) {                                                  \
                const T *vh = v + h / G * D;                                                   \
                const float w = scores[h * score_stride + start + o];                          \
                for (int64_t d = 0; d < D; d++) acc[h * D + d] += w * LOAD(vh, d);             \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (int64_t i = 0; i < H * D; i++) STORE(out, i, acc[i]);                                 \
}

#define CALL_ITEM(ITEM, DIM)                                                                  \
    ITEM(query + head, key_cache, value_cache, table, lens[seq], out + head, num_heads, G,     \
         DIM, block_size, scale, scores, max_len, q, acc)

#define DEFINE_DECODE(NAME, ITEM, T)                                                          \
int NAME(const T *query, const T *key_cache, const T *value_cache, const int32_t *tables,      \
         const int32_t *lens, T *out, int64_t num_heads, int64_t num_kv_heads,                 \
         int64_t head_dim, int64_t block_size, int64_t table_width, float scale,               \
         int64_t begin, int64_t end) {                                                         \
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

DEFINE_ITEM(item_f32, float, load_f32, store_f32)
DEFINE_ITEM(item_bf16, bf16, load_bf16, store_bf16)
DEFINE_DECODE(paged_decode_f32, item_f32, float)
DEFINE_DECODE(paged_decode_bf16, item_bf16, bf16)
