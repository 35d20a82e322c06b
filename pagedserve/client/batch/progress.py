"""The batch progress bar: done / failed, tokens per second and in-flight tokens."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

from pagedserve.client.batch.items import BatchSummary


class BatchProgress:
    """A tqdm bar fed one result at a time; disabled, it costs nothing."""

    def __init__(
        self,
        total: int | None,
        summary: BatchSummary,
        in_flight_tokens: Callable[[], int],
        *,
        enabled: bool = True,
        file: TextIO | None = None,
    ) -> None:
        self._summary = summary
        self._in_flight_tokens = in_flight_tokens
        self._bar = tqdm(
            total=total,
            unit="req",
            desc="batch",
            disable=not enabled,
            file=file or sys.stderr,
            dynamic_ncols=True,
        )

    def advance(self) -> None:
        """Count one finished item (the summary has already recorded it)."""
        if self._bar.disable:
            return
        self._bar.update(1)
        self._bar.set_postfix(
            {
                "ok": self._summary.succeeded,
                "failed": self._summary.failed,
                "tok/s": f"{self._summary.tokens_per_second:.0f}",
                "inflight_tok": self._in_flight_tokens(),
            },
            refresh=False,
        )

    def close(self) -> None:
        self._bar.close()
