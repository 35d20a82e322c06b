/* A step's new K and V rows written into their slots of the paged KV cache, for the CPU.
 *
 * Token t's key and value rows (width = num_kv_heads * head_dim elements, contiguous within a
 * row, row strides given: views of a fused QKV output) go to row slot[t] of each cache viewed
 * as [num_slots, width]; a negative slot is padding and is skipped. A float32 row written into
 * a bfloat16 cache is rounded to nearest even, as torch's conversion rounds.
 *
 * Every slot is checked before anything is written: the functions return the index of the
 * first token whose slot lies past the cache (and write nothing), or -1.
 */
#include <stdint.h>
#include <string.h>

#include "vec_math.h"

static int64_t first_bad_slot(const int64_t *slots, int64_t tokens, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] >= num_slots) return t;
    return -1;
}

#define SAME_DTYPE_WRITE(NAME, T)                                                              \
    int64_t NAME(const T *key, int64_t key_stride, const T *value, int64_t value_stride,      \
                 T *key_cache, T *value_cache, const int64_t *slots, int64_t tokens,           \
                 int64_t width, int64_t num_slots, int64_t threads) {                          \
        const int64_t bad = first_bad_slot(slots, tokens, num_slots);                          \
        if (bad >= 0) return bad;                                                              \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
        for (int64_t t = 0; t < tokens; t++) {                                                 \
            if (slots[t] < 0) continue;                                                        \
            memcpy(key_cache + slots[t] * width, key + t * key_stride, width * sizeof(T));     \
            memcpy(value_cache + slots[t] * width, value + t * value_stride, width * sizeof(T)); \
        }                                                                                      \
        return -1;                                                                             \
    }

SAME_DTYPE_WRITE(cache_write_f32, float)
SAME_DTYPE_WRITE(cache_write_bf16, bf16)

/* A float32 model over a bfloat16 KV cache (--kv-cache-dtype bfloat16). */
int64_t cache_write_f32_bf16kv(const float *key, int64_t key_stride, const float *value,
                               int64_t value_stride, bf16 *key_cache, bf16 *value_cache,
                               const int64_t *slots, int64_t tokens, int64_t width,
                               int64_t num_slots, int64_t threads) {
    const int64_t bad = first_bad_slot(slots, tokens, num_slots);
    if (bad >= 0) return bad;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        const float *k = key + t * key_stride, *v = value + t * value_stride;
        bf16 *kc = key_cache + slots[t] * width, *vc = value_cache + slots[t] * width;
        for (int64_t i = 0; i < width; i++) kc[i] = to_bf16(k[i]);
        for (int64_t i = 0; i < width; i++) vc[i] = to_bf16(v[i]);
    }
    return -1;
}
