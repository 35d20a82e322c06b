"""Running counts pooled into buckets, for curves measured against the batch size.

A count of running sequences is its own bucket up to 16; above, buckets are about 6% wide,
so that samples pool where they are sparse and a curve over a few hundred sequences keeps a
few dozen points.
"""

from __future__ import annotations

import math

EXACT_UP_TO = 16
_WIDTH = 0.06  # log-width of a bucket above EXACT_UP_TO


def running_bucket(num_running: int) -> int:
    """The bucket of ``num_running`` (at least 1)."""
    if num_running <= EXACT_UP_TO:
        return num_running
    return EXACT_UP_TO + round(math.log(num_running / EXACT_UP_TO) / _WIDTH)
