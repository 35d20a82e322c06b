"""What the random-sampling race noise costs per step on CPU: ``Tensor.exponential_`` against
the inverse-CDF draw the sampler uses, side by side, alternating, one thread.

A served batch of unseeded requests at temperature > 0 (the OpenAI default, and what
``vllm bench serve`` sends) draws one Exp(1) number per vocabulary entry per row every step.

    python -m benchmarks.sampling_noise [--rows 64] [--vocab 8192] [--repeats 200]

The last line is JSON: milliseconds per step for each draw and ``speedup`` (old / new).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from pagedserve.server.sampling.exponential_race import exponential_noise


def _old(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    return torch.empty(shape).exponential_(generator=generator).clamp_(
        min=torch.finfo(torch.float32).tiny)


def _new(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    return exponential_noise(shape, torch.device("cpu"), [], generator)


def _mean_ms(draw, shape: tuple[int, int], generator: torch.Generator, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        draw(shape, generator)
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the server's compute thread count on a 2-core machine
    shape = (args.rows, args.vocab)
    generator = torch.Generator().manual_seed(0)
    old_ms, new_ms = [], []
    for _ in range(args.rounds):  # alternating, best of each, so load bursts do not decide
        old_ms.append(_mean_ms(_old, shape, generator, args.repeats))
        new_ms.append(_mean_ms(_new, shape, generator, args.repeats))
    old, new = min(old_ms), min(new_ms)
    print(f"rows {args.rows} x vocab {args.vocab}: exponential_ {old:.2f} ms, "
          f"inverse CDF {new:.2f} ms per step")
    print(json.dumps({"exponential_ms": round(old, 3), "inverse_cdf_ms": round(new, 3),
                      "speedup": round(old / new, 2), "rows": args.rows,
                      "vocab": args.vocab}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
