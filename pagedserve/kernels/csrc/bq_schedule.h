/* How the threads of one bq_linear call share its work items (chunks of output groups): each
 * thread owns a contiguous run of items and takes them from the front, so that it streams its
 * part of the weight in order; a thread whose run is empty takes items from the back of
 * another's. A thread that another process keeps off its core for a time slice then holds up
 * the call by at most the item it is in, not by its whole share, and a run that costs more
 * (a wider type, a busier core) is evened out as it goes.
 *
 * A run is one 64-bit word, (front << 32) | back, on its own cache line; the owner and a thief
 * each move their end with a compare-and-swap, so an item is taken exactly once. */
#ifndef PAGEDSERVE_BQ_SCHEDULE_H
#define PAGEDSERVE_BQ_SCHEDULE_H

#include <stdint.h>

#define BQ_MAX_RUNS 64

typedef struct {
    uint64_t span; /* (front << 32) | back */
    char pad[64 - sizeof(uint64_t)];
} __attribute__((aligned(64))) bq_run;

/* items split into `parts` contiguous runs, as even as whole items allow. */
static inline void bq_runs_init(bq_run *runs, int parts, int64_t items) {
    for (int p = 0; p < parts; p++) {
        const uint64_t front = (uint64_t)(items * p / parts);
        const uint64_t back = (uint64_t)(items * (p + 1) / parts);
        __atomic_store_n(&runs[p].span, front << 32 | back, __ATOMIC_RELAXED);
    }
}

/* The next item of run p, from its front (owner) or its back (thief); -1 once it is empty. */
static inline int64_t bq_take(bq_run *run, int from_back) {
    uint64_t span = __atomic_load_n(&run->span, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t front = span >> 32, back = span & 0xffffffffu;
        if (front >= back) return -1;
        const uint64_t next = from_back ? (front << 32 | (back - 1)) : ((front + 1) << 32 | back);
        if (__atomic_compare_exchange_n(&run->span, &span, next, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return (int64_t)(from_back ? back - 1 : front);
    }
}

/* The next item for thread `self` of `parts`: its own run first, then the others' backs. */
static inline int64_t bq_next_item(bq_run *runs, int parts, int self) {
    int64_t item = bq_take(&runs[self], 0);
    for (int v = 1; item < 0 && v < parts; v++) item = bq_take(&runs[(self + v) % parts], 1);
    return item;
}

#endif
