"""Synthetic length distributions shaped like the paper's two workloads.

The vLLM paper (arXiv 2309.06180, Fig. 11) reports ShareGPT prompts averaging 161 tokens with
338-token replies, and Alpaca 19 and 58: long right tails, so each length is drawn from a
lognormal clipped to a range. The lognormal's location is solved so that the *clipped* mean
equals the paper's mean; the spread (``sigma``) sets how heavy the tail is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for ln X ~ N(mu, sigma²)."""
    alpha = (math.log(low) - mu) / sigma
    beta = (math.log(high) - mu) / sigma
    inside = math.exp(mu + sigma * sigma / 2.0) * (
        _normal_cdf(beta - sigma) - _normal_cdf(alpha - sigma))
    return low * _normal_cdf(alpha) + inside + high * (1.0 - _normal_cdf(beta))


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Integer lengths in ``[low, high]`` from a clipped lognormal with the given mean."""

    mean: float
    sigma: float
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.mean < self.high:
            raise ValueError(f"need 1 <= low < mean < high, got low={self.low}, "
                             f"mean={self.mean}, high={self.high}")

    @property
    def mu(self) -> float:
        """The location whose clipped mean is ``mean`` (bisection; the mean rises with mu)."""
        lo, hi = math.log(self.low) - 10.0 * self.sigma, math.log(self.high)
        for _ in range(100):
            mid = (lo + hi) / 2.0
            if clipped_lognormal_mean(mid, self.sigma, self.low, self.high) < self.mean:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2.0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        draws = rng.lognormal(mean=self.mu, sigma=self.sigma, size=size)
        return np.clip(np.rint(draws), self.low, self.high).astype(np.int64)


@dataclass(frozen=True, slots=True)
class WorkloadLengths:
    """Prompt and output lengths; a pair longer than ``max_total`` in all is drawn again, as
    the ShareGPT loader (and vLLM's) drops such pairs, so that a 2,048-token model takes
    every request."""

    input: LengthDistribution
    output: LengthDistribution
    max_total: int | None = None

    def sample_pairs(self, rng: np.random.Generator, size: int) -> tuple[list[int], list[int]]:
        inputs: list[int] = []
        outputs: list[int] = []
        while len(inputs) < size:
            need = size - len(inputs)
            drawn = zip(self.input.sample(rng, need).tolist(),
                        self.output.sample(rng, need).tolist(), strict=True)
            for prompt_len, output_len in drawn:
                if self.max_total is None or prompt_len + output_len <= self.max_total:
                    inputs.append(prompt_len)
                    outputs.append(output_len)
        return inputs, outputs


SYNTHETIC_WORKLOADS: dict[str, WorkloadLengths] = {
    "sharegpt-like": WorkloadLengths(
        input=LengthDistribution(mean=161.0, sigma=1.0, low=4, high=1024),
        # 358 before the 2,048-token filter, which drops the longest outputs: 338 after it.
        output=LengthDistribution(mean=358.0, sigma=0.9, low=4, high=2048),
        max_total=2048,
    ),
    "alpaca-like": WorkloadLengths(
        input=LengthDistribution(mean=19.0, sigma=0.6, low=2, high=256),
        output=LengthDistribution(mean=58.0, sigma=0.9, low=2, high=512),
    ),
}
