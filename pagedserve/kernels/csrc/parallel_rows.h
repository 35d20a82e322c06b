/* Rows of a kernel shared out among the threads of the OpenMP pool (torch's own, when torch is
 * loaded), or run on the calling thread alone when the caller passes one thread: entering the
 * pool costs about half a microsecond even for a team of one (an `if` clause does not avoid
 * it), which is half of what a one-token RMSNorm costs in all. */
#ifndef PAGEDSERVE_PARALLEL_ROWS_H
#define PAGEDSERVE_PARALLEL_ROWS_H

#include <stdint.h>

#define FOR_ROWS(r, rows, threads, STATEMENT)                                                 \
    do {                                                                                       \
        if ((threads) > 1) {                                                                   \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")                  \
            for (int64_t r = 0; r < (rows); r++) STATEMENT;                                    \
        } else {                                                                               \
            for (int64_t r = 0; r < (rows); r++) STATEMENT;                                    \
        }                                                                                      \
    } while (0)

#endif
