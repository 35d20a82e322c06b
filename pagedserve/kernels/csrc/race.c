/* The exponential race on the CPU: token = argmax_i p_i / E_i with E_i ~ Exp(1), the noise
 * drawn here from a counter-based generator instead of a stream: E_i = -log(U_i) with U_i
 * from a 32-bit hash of (the row's key, i), the key taken from SplitMix64 of (the call's
 * seed, the row). The hash needs only 32-bit multiplies, which every vector unit has (a
 * 64-bit hash per token ran seven times slower on AVX2). One pass per row computes the
 * scores, a second finds the first index of the largest in vector lanes (torch.argmax's
 * rules, argmax_row.h). Rows run on the OpenMP pool.
 */
#include <stdint.h>
#include <stdlib.h>

#include "argmax_row.h"
#include "vec_math.h"

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A bijection of 32-bit words with full avalanche (two multiply-xorshift rounds). */
static inline uint32_t mix32(uint32_t x) {
    x = (x ^ (x >> 16)) * 0x7FEB352Du;
    x = (x ^ (x >> 15)) * 0x846CA68Bu;
    return x ^ (x >> 16);
}

/* U in (0, 1): the top 23 bits of the hash of the row's Weyl sequence at i, offset by half a
 * step so that neither 0 nor 1 occurs (E is then finite and positive: a zero probability can
 * never win). 23 bits, not 24: k + 0.5 must be exact in a float's 24-bit significand, and
 * with k up to 2^24 - 1 the top word rounded to 2^24, U to 1 and E to 0, so that token won
 * the race whatever its probability (0/0 is NaN, which the argmax prefers). Distinct tokens
 * of a row get distinct words. */
static inline float uniform_open(uint32_t key, int64_t i) {
    const uint32_t h = mix32(key + 0x9E3779B9u * (uint32_t)(i + 1));
    return ((float)(h >> 9) + 0.5f) * 1.1920928955078125e-7f;
}

static void race_row(const float *probs, int64_t vocab, uint32_t key, float *scores,
                    int64_t *out) {
    for (int64_t i = 0; i < vocab; i++) scores[i] = probs[i] / -log_f32(uniform_open(key, i));
    *out = argmax_row(scores, vocab);
}

static inline uint32_t row_key(uint64_t seed, int64_t row) {
    const uint64_t h = mix64(seed ^ mix64((uint64_t)row));
    return (uint32_t)(h ^ (h >> 32));
}

/* probs [rows, vocab] float32, contiguous; out int64 [rows]. Returns 0,
 * or 1 when scratch memory could not be allocated. Row r draws with the key
 * mix64(seed ^ mix64(r)) folded to 32 bits. */
int exponential_race_f32(const float *probs, int64_t rows, int64_t vocab, uint64_t seed,
                         int64_t *out, int64_t threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(|: failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)vocab);
        if (scores == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            if (scores != NULL)
                race_row(probs + r * vocab, vocab, row_key(seed, r), scores, out + r);
        free(scores);
    }
    return failed;
}
