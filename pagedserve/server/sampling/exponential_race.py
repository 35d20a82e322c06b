"""Random draws by the exponential race, with per-request reproducible noise.

If ``E_i ~ Exp(1)`` independently, ``argmax_i p_i / E_i`` is distributed as ``p``: each token
runs a race whose finishing time is exponential with rate ``p_i`` and the first to finish wins.
One division and one argmax per row, so a whole batch samples in a handful of kernels, and a
token with ``p_i = 0`` can never win.

A seeded row takes its noise from a generator seeded by ``(seed, output position)`` alone, so
its token does not depend on the batch around it, on other requests, or on whether the
sequence was preempted and recomputed. Unseeded rows share one generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    # The SplitMix64 finalizer: a bijection on 64-bit words whose every output bit depends on
    # every input bit, so nearby (seed, position) pairs give unrelated generator seeds.
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def generator_seed(seed: int, position: int) -> int:
    """The generator seed for the token at ``position`` of the output of a sample seeded ``seed``.

    Plain ``seed + position`` would not do: the engine seeds sample ``i`` of a request with
    ``seed + i``, so sample 1 at position 0 would replay sample 0 at position 1.
    """
    # Kept to 63 bits so every torch backend accepts it.
    return _splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 1


def exponential_noise(
    shape: tuple[int, int],
    device: torch.device,
    seeded_rows: Sequence[tuple[int, int]],
    shared_generator: torch.Generator | None,
) -> torch.Tensor:
    """Exp(1) noise ``[N, V]``: rows in ``seeded_rows`` (row, generator seed) from their own
    generator, every other row from ``shared_generator`` (or ones when it is ``None``, for a
    batch whose other rows do not sample at random)."""
    noise = torch.empty(shape, dtype=torch.float32, device=device)
    if shared_generator is None:
        noise.fill_(1.0)
    elif noise.device.type == "cpu":
        _inverse_cdf_exponential(noise, shared_generator)
    else:
        noise.exponential_(generator=shared_generator)
    for row, seed in seeded_rows:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        noise[row].exponential_(generator=generator)
    # A draw of exactly 0 would turn a zero probability into 0/0 = NaN, which argmax prefers.
    return noise.clamp_(min=torch.finfo(torch.float32).tiny)


def _inverse_cdf_exponential(noise: torch.Tensor, generator: torch.Generator) -> None:
    # Exp(1) as -log(1 - U) with U uniform on [0, 1): on CPU this is about 6x faster than
    # ``exponential_`` (which draws and transforms one element at a time), and with 64 rows of
    # an 8k vocabulary it was ~8 ms of every randomly sampled step on one core.
    noise.uniform_(generator=generator).neg_().log1p_().neg_()


def exponential_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Sample one token per row of ``probs`` [N, V]; returns long [N]."""
    return (probs / noise).argmax(dim=-1)
