/* A step's new K and V rows written into their slots of the paged KV cache, for the CPU.
 *
 * Token t's key and value rows (width = num_kv_heads * head_dim elements, contiguous within a
 * row, row strides given: views of a fused QKV output) go to row slot[t] of each cache viewed
 * as [num_slots, width]; a negative slot is padding and is skipped. A float32 row written into
 * a bfloat16 or float16 cache is rounded to nearest even, as torch's conversion rounds.
 *
 * Every slot is checked before anything is written: the functions return the index of the
 * first token whose slot lies past the cache (and write nothing), or -1.
 */
#include <stdint.h>
#include <string.h>

#include "parallel_rows.h"
#include "vec_math.h"

static int64_t first_bad_slot(const int64_t *slots, int64_t tokens, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] >= num_slots) return t;
    return -1;
}

#define SAME_DTYPE_WRITE(NAME, T)                                                              \
    static inline void NAME##_row(const T *k, const T *v, T *kc, T *vc, int64_t slot,          \
                                  int64_t width) {                                             \
        if (slot < 0) return;                                                                  \
        memcpy(kc + slot * width, k, width * sizeof(T));                                       \
        memcpy(vc + slot * width, v, width * sizeof(T));                                       \
    }                                                                                          \
    int64_t NAME(const T *key, int64_t key_stride, const T *value, int64_t value_stride,      \
                 T *key_cache, T *value_cache, const int64_t *slots, int64_t tokens,           \
                 int64_t width, int64_t num_slots, int64_t threads) {                          \
        const int64_t bad = first_bad_slot(slots, tokens, num_slots);                          \
        if (bad >= 0) return bad;                                                              \
        FOR_ROWS(t, tokens, threads,                                                           \
                 NAME##_row(key + t * key_stride, value + t * value_stride, key_cache,         \
                            value_cache, slots[t], width));                                    \
        return -1;                                                                             \
    }

SAME_DTYPE_WRITE(cache_write_f32, float)
SAME_DTYPE_WRITE(cache_write_bf16, bf16)

/* A float32 model over a 16-bit KV cache (--kv-cache-dtype bfloat16 / float16). */
#define NARROWING_WRITE(NAME, T, NARROW)                                                       \
    static inline void NAME##_row(const float *k, const float *v, T *kc, T *vc, int64_t slot,  \
                                  int64_t width) {                                             \
        if (slot < 0) return;                                                                  \
        NARROW(k, kc + slot * width, width);                                                   \
        NARROW(v, vc + slot * width, width);                                                   \
    }                                                                                          \
    int64_t NAME(const float *key, int64_t key_stride, const float *value,                     \
                 int64_t value_stride, T *key_cache, T *value_cache, const int64_t *slots,     \
                 int64_t tokens, int64_t width, int64_t num_slots, int64_t threads) {          \
        const int64_t bad = first_bad_slot(slots, tokens, num_slots);                          \
        if (bad >= 0) return bad;                                                              \
        FOR_ROWS(t, tokens, threads,                                                           \
                 NAME##_row(key + t * key_stride, value + t * value_stride, key_cache,         \
                            value_cache, slots[t], width));                                    \
        return -1;                                                                             \
    }

NARROWING_WRITE(cache_write_f32_bf16kv, bf16, narrow_bf16)
NARROWING_WRITE(cache_write_f32_f16kv, f16, narrow_f16)
