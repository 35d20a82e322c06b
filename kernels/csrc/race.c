/* The exponential race on the CPU: token = argmax_i p_i / E_i with E_i ~ Exp(1), the noise
 * drawn here from a counter-based generator instead of a stream: E_i = -log(U_i) with U_i
 * from SplitMix64 of (the row's seed, i). One pass per row computes the scores, a second finds
 * the first index of the largest (torch.argmax's tie rule). Rows run on the OpenMP pool.
 */
#include <stdint.h>
#include <stdlib.h>

#include "vec_math.h"

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* U in (0, 1): the top 24 bits of the hash, offset by half a step so that neither 0 nor 1
 * occurs (E is then finite and positive: a zero probability can never win). */
static inline float uniform_open(uint64_t seed, int64_t i) {
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
    return ((float)(h >> 40) + 0.5f) * 5.9604644775390625e-8f;
}

static void race_row(const float *probs, int64_t vocab, uint64_t seed, float *scores,
                    int64_t *out) {
    for (int64_t i = 0; i < vocab; i++) scores[i] = probs[i] / -log_f32(uniform_open(seed, i));
    float best = scores[0];
    for (int64_t i = 1; i < vocab; i++) best = scores[i] > best ? scores[i] : best;
    int64_t at = 0;
    while (at < vocab - 1 && scores[at] != best) at++; /* a NaN row ends at its last id */
    *out = at;
}

/* probs [rows, vocab] float32, contiguous; out int64 [rows]. Returns 0,
 * or 1 when scratch memory could not be allocated. Row r draws from mix64(seed ^ mix64(r)). */
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
                race_row(probs + r * vocab, vocab, mix64(seed ^ mix64((uint64_t)r)), scores,
                         out + r);
        free(scores);
    }
    return failed;
}
