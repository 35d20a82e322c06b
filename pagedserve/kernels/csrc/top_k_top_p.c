/* Top-k and top-p truncation on the CPU without sorting the row.
 *
 * The rules are transformers' (TopKLogitsWarper, then TopPLogitsWarper): keep the logits at
 * or above the k-th largest (ties at the k-th kept); then order the row ascending, ties by
 * token id, and drop the leading run whose cumulative probability stays at or below 1 - p,
 * always keeping the last (largest) token. A full sort finds both cuts in O(V log V); here a
 * histogram of the row over value buckets finds the bucket each cut falls in, and only that
 * bucket's entries are sorted. The buckets split [lowest, highest] finite value evenly, and
 * the bucket of a value never decreases with it, so whole buckets below a cut lie below it.
 * Cumulative mass adds up in double, as torch's cumsum does on the CPU, and is compared in
 * float32. Rows run on the OpenMP pool; the caller keeps rows with NaN or +inf out.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec_math.h"

#define BUCKETS 4096

typedef struct {
    float value;
    int32_t id;
} entry;

typedef struct {
    int32_t count[BUCKETS];
    double mass[BUCKETS];
    entry *entries;  /* room for a whole row */
    uint16_t *which; /* each token's bucket */
    float *weight;   /* each token's exp(x - max), 0 where masked */
} scratch;

/* Each token's bucket among BUCKETS even splits of [lo, hi]; -inf tokens go to bucket 0
 * and are told apart by their value. */
static void assign_buckets(const float *x, int64_t n, float lo, float hi, uint16_t *which) {
    const float scale = hi > lo ? (float)(BUCKETS - 1) / (hi - lo) : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float at = (x[i] - lo) * scale;
        at = at > 0.0f ? at : 0.0f; /* also -inf and anything below lo */
        at = at < (float)(BUCKETS - 1) ? at : (float)(BUCKETS - 1);
        which[i] = (uint16_t)(int32_t)at;
    }
}

static int ascending(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->value != y->value) return x->value < y->value ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The tokens of bucket `bucket` with a value >= floor (and above -inf), ascending by
 * (value, id). */
static int64_t sorted_bucket(const float *x, int64_t n, const scratch *s, int bucket,
                             float floor) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (s->which[i] == bucket && x[i] >= floor && x[i] > -INFINITY) {
            s->entries[m].value = x[i];
            s->entries[m].id = (int32_t)i;
            m++;
        }
    qsort(s->entries, (size_t)m, sizeof *s->entries, ascending);
    return m;
}

/* The k-th largest value of the row (-inf when fewer than k values are finite). */
static float kth_largest(const float *x, int64_t n, int64_t k, scratch *s) {
    memset(s->count, 0, sizeof s->count);
    for (int64_t i = 0; i < n; i++) s->count[s->which[i]] += x[i] > -INFINITY;
    int64_t above = 0;
    int bucket = BUCKETS - 1;
    while (bucket >= 0 && above + s->count[bucket] < k) above += s->count[bucket--];
    if (bucket < 0) return -INFINITY;
    const int64_t m = sorted_bucket(x, n, s, bucket, -INFINITY);
    return s->entries[m - 1 - (k - 1 - above)].value;
}

/* The first token (in ascending order) that top-p keeps, among values >= floor; the row's
 * largest value is `hi`. */
static entry top_p_cut(const float *x, int64_t n, float floor, float hi, float drop_mass,
                       scratch *s) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float w = exp_f32(x[i] - hi);
        s->weight[i] = x[i] >= floor && x[i] > -INFINITY ? w : 0.0f;
        total += (double)s->weight[i];
    }
    const double inv_total = 1.0 / total;
    memset(s->count, 0, sizeof s->count);
    memset(s->mass, 0, sizeof s->mass);
    for (int64_t i = 0; i < n; i++)
        if (s->weight[i] > 0.0f) {
            s->count[s->which[i]]++;
            s->mass[s->which[i]] += (double)s->weight[i];
        }
    int top = BUCKETS - 1;
    while (s->count[top] == 0) top--;
    double cumulative = 0.0;
    for (int bucket = 0;; bucket++) {
        if (s->count[bucket] == 0) continue;
        const double mass = s->mass[bucket] * inv_total;
        if (bucket < top && (float)(cumulative + mass) <= drop_mass) {
            cumulative += mass;
            continue;
        }
        const int64_t m = sorted_bucket(x, n, s, bucket, floor);
        for (int64_t j = 0; j < m; j++) {
            const double p = (double)exp_f32(s->entries[j].value - hi) * inv_total;
            const int last = bucket == top && j == m - 1;
            if (last || (float)(cumulative + p) > drop_mass) return s->entries[j];
            cumulative += p;
        }
    }
}

/* One row: out = x with the truncated tokens at -inf. k >= n: no top-k; top_p >= 1: no
 * top-p. */
static void truncate_row(const float *x, int64_t n, int64_t k, float top_p, float *out,
                         scratch *s) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float finite_or_inf = x[i] > -INFINITY ? x[i] : INFINITY;
        lo = finite_or_inf < lo ? finite_or_inf : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    memcpy(out, x, sizeof *out * (size_t)n);
    if (hi == -INFINITY) return; /* every token already masked */
    float floor = -INFINITY;
    if (k < n) {
        assign_buckets(x, n, lo, hi, s->which);
        floor = kth_largest(x, n, k, s);
    }
    if (top_p >= 1.0f) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] < floor ? -INFINITY : x[i];
        return;
    }
    if (floor > lo || k >= n) assign_buckets(x, n, floor > lo ? floor : lo, hi, s->which);
    const entry cut = top_p_cut(x, n, floor, hi, 1.0f - top_p, s);
    for (int64_t i = 0; i < n; i++) {
        const int below = x[i] < cut.value || (x[i] == cut.value && i < cut.id);
        out[i] = x[i] < floor || below ? -INFINITY : x[i];
    }
}

/* logits [rows, n] float32 contiguous, finite or -inf; top_k int64 [rows] (n: none);
 * top_p float32 [rows] (1: none); out [rows, n]. Returns 0, or 1 when scratch memory could
 * not be allocated. */
int top_k_top_p_f32(const float *logits, int64_t rows, int64_t n, const int64_t *top_k,
                    const float *top_p, float *out, int64_t threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(|: failed)
    {
        const size_t width = (size_t)(n > 0 ? n : 1);
        scratch *s = malloc(sizeof *s);
        entry *entries = malloc(sizeof(entry) * width);
        uint16_t *which = malloc(sizeof(uint16_t) * width);
        float *weight = malloc(sizeof(float) * width);
        if (s == NULL || entries == NULL || which == NULL || weight == NULL) {
            failed = 1;
        } else {
            s->entries = entries;
            s->which = which;
            s->weight = weight;
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; r++)
            if (!failed)
                truncate_row(logits + r * n, n, top_k[r], top_p[r], out + r * n, s);
        free(weight);
        free(which);
        free(entries);
        free(s);
    }
    return failed;
}
