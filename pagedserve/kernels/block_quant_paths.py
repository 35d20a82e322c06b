"""Which dot-product path the block-quant kernel runs on this CPU, chosen once per process.

The CPU's flags name the candidates: AVX-512 VNNI (with BW and VL), AVX-VNNI (the same dot
product on 256-bit registers, on cores without AVX-512: Intel's since Alder Lake, AMD's
since Zen 5), AVX2 with FMA and F16C, and portable C, which every machine has. A short
timing at the first load (a 2048 x 2048 Q4_1 weight at 1 and 8 rows on one thread, the
candidates in turn for a few rounds, best of each) checks them against each other and
against torch's int4 weight-only op, the kernel that runs these weights otherwise: the
fastest wins. Where torch's op wins, the kernel leaves it the 4-bit weights it runs
(``int4_to_torch``) and keeps the fastest C path for every other type, so that no weight
falls back to float for it. Two times within ``TIE`` of each other count as even (a machine
shared with other work times the same code 10% apart from one call to the next), and the
flags' order breaks the tie: AVX-512 VNNI, AVX-VNNI, AVX2, portable, then torch's op.
float32 ``F.linear`` on the same shape is timed and logged beside them. The choice and its
reason are logged once.

A timed choice is kept beside the built library (``keep`` / ``kept``), keyed by the library
(whose build key names the source, the flags, the compiler and the processor) and torch's
version: later processes on the machine read it instead of timing again, about 0.3 s of every
start-up. Deleting the file times again.

``PAGEDSERVE_BLOCK_QUANT`` (read once, at that first load): ``vnni``, ``avxvnni``, ``avx2``
or ``portable`` forces a path (one this CPU lacks is refused with a warning, and the timing
chooses); ``off`` turns the kernel off; unset or ``auto``, the timing chooses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ENV = "PAGEDSERVE_BLOCK_QUANT"
# In the C kernel's order (enum bq_path).
PATHS = ("portable", "avx2", "avxvnni", "vnni")
LABELS = {"vnni": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avx2": "AVX2", "portable": "portable C"}
PROBE_SHAPE = (2048, 2048)
PROBE_ROWS = (1, 8)
PROBE_CALLS = 5
PROBE_ROUNDS = 3
TIE = 1.1


@dataclass(frozen=True, slots=True)
class PathChoice:
    """``path`` is None where the kernel declines every weight; ``int4_to_torch``: it declines
    the weights torch's int4 op runs, which timed faster."""

    path: str | None
    reason: str
    int4_to_torch: bool = False


def kept(file: Path, torch_version: str) -> PathChoice | None:
    """The choice ``keep`` wrote for this torch, else None (no file, another torch, or a file
    that does not read as one)."""
    try:
        data = json.loads(file.read_text())
        if data.pop("torch") != torch_version or data["path"] not in (*PATHS, None):
            return None
        timed = data.pop("timed")
        choice = PathChoice(**data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return dataclasses.replace(choice, reason=f"{choice.reason}; timed {timed}, kept in {file}")


def keep(file: Path, choice: PathChoice, torch_version: str) -> None:
    """Writes ``choice`` for ``kept`` (atomically; a failure to write only costs the next
    process a timing)."""
    data = {**dataclasses.asdict(choice), "torch": torch_version,
            "timed": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False) as out:
            json.dump(data, out)
        os.replace(out.name, file)
    except OSError as exc:
        logger.debug("could not keep the block-quant path choice in %s: %s", file, exc)


def cpu_paths(mask: int) -> tuple[str, ...]:
    """The paths a ``bq_paths()`` bit mask names, fastest first."""
    return tuple(p for i, p in reversed(list(enumerate(PATHS))) if mask >> i & 1)


def best_seconds(call: Callable[[], object], calls: int = PROBE_CALLS) -> float:
    call()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def choose(setting: str, available: tuple[str, ...], time_path: Callable[[str], float],
           time_others: Callable[[], dict[str, float]]) -> PathChoice:
    """The path for ``setting`` (the variable's value) among the ``available`` ones;
    ``time_path(path)`` and ``time_others()`` (name -> seconds: torch's int4 op first where
    this torch has it, then float32) time the probe, one round each call."""
    setting = setting.strip().lower() or "auto"
    if setting == "off":
        return PathChoice(None, f"{ENV}=off")
    if setting in PATHS:
        if setting in available:
            return PathChoice(setting, f"forced by {ENV}={setting}")
        logger.warning("%s=%s: this CPU has no %s (it has %s); choosing by timing", ENV,
                       setting, LABELS[setting], ", ".join(LABELS[p] for p in available))
    elif setting != "auto":
        logger.warning("%s=%r is not one of off, auto, %s; choosing by timing", ENV, setting,
                       ", ".join(PATHS))
    times = dict.fromkeys([LABELS[p] for p in available], float("inf"))
    others: dict[str, float] = {}
    for _ in range(PROBE_ROUNDS):  # in turn, so that a busy moment does not hit one alone
        for p in available:
            times[LABELS[p]] = min(times[LABELS[p]], time_path(p))
        for name, seconds in time_others().items():
            others[name] = min(others.get(name, float("inf")), seconds)
    best = min(times.values())
    fastest = next(p for p in available if times[LABELS[p]] <= TIE * best)
    measured = ", ".join(f"{name} {seconds * 1e6:.0f} us" for name, seconds in
                         [*times.items(), *others.items()])
    flags = f"CPU flags allow {', '.join(LABELS[p] for p in available)}"
    torch_name, torch_seconds = next(iter(others.items()))
    if torch_name != "float32" and TIE * torch_seconds < times[LABELS[fastest]]:
        return PathChoice(fastest, f"{flags}; {torch_name} timed faster ({measured}): it runs "
                          f"the 4-bit weights it takes, {LABELS[fastest]} the rest", True)
    return PathChoice(fastest, f"{flags}; timed fastest ({measured})")
