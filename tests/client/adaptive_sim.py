"""A fake server for the adaptive budget's tests: step time as a function of the running
count, a KV cache that can be squeezed into preempting, and a client loop that drives
``AdaptiveBudget`` with the load hints such a server would publish."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pagedserve.client import AdaptiveBudget, AdaptiveConfig, TokenBudget
from pagedserve.client.adaptive.adaptive_budget import plan_budget
from pagedserve.client.api.types import ServerLoad
from pagedserve.client.budget.token_budget import Reservation
from pagedserve.common.load_hints import LoadHints


@dataclass
class Request:
    reservation: Reservation
    length: int
    sent_at: float
    epoch: int
    remaining: int = 0

    def __post_init__(self) -> None:
        self.remaining = self.length


class FakeEngine:
    """Every step gives each running request one token and takes ``base + c·n²`` ms (±3%
    noise), so tokens per second, ``n / step``, peak at ``n* = sqrt(base / c)``. KV holds
    ``kv_tokens``; ``squeeze`` of them can be taken away (another tenant) to force
    preemption."""

    def __init__(self, base_ms: float, c_ms: float, kv_tokens: int = 100_000,
                 max_num_seqs: int = 256) -> None:
        self.base_ms, self.c_ms = base_ms, c_ms
        self.kv_tokens, self.max_num_seqs = kv_tokens, max_num_seqs
        self.squeeze = 0
        self.preemptions = 0
        self.generated = 0
        self.rng = random.Random(0)

    @property
    def peak(self) -> float:
        return math.sqrt(self.base_ms / self.c_ms)

    def step_ms(self, n: int) -> float:
        return (self.base_ms + self.c_ms * n * n) * self.rng.uniform(0.97, 1.03)

    def load(self) -> ServerLoad:
        return ServerLoad(0.0, 0, 0, self.kv_tokens, 0, max_num_seqs=self.max_num_seqs,
                          max_num_batched_tokens=2048, total_kv_tokens=self.kv_tokens)


class Simulation:
    """One client with an endless backlog of requests (10 prompt + 50 output tokens).

    With ``admit_per_step`` the server queues what it is sent and starts at most that many
    requests a step, each adding ``prefill_ms`` to the step that prefills it: a burst of
    arrivals makes slow steps for a while, a cost the running count's steady state lacks.
    With ``vary_output`` answers are 25 to 50 tokens long, so they do not finish in cohorts.
    With ``shared_prefix`` every prompt is ``shared_prefix`` tokens of one cached prefix plus
    its own 10: the cache holds the prefix once, while each reservation counts it. With
    ``project`` the hints carry the server's projected KV peak (every request held run to
    its end, the prefix once)."""

    PROMPT, OUTPUT = 10, 50

    def __init__(self, engine: FakeEngine, config: AdaptiveConfig | None = None,
                 admit_per_step: int | None = None, prefill_ms: float = 0.0,
                 vary_output: bool = False, shared_prefix: int = 0,
                 project: bool = False) -> None:
        self.engine = engine
        self.project = project
        self.shared_prefix = shared_prefix
        self.lengths = random.Random(1) if vary_output else None
        self.admit_per_step, self.prefill_ms = admit_per_step, prefill_ms
        self.queue: list[Request] = []
        self.now = 0.0
        config = config or AdaptiveConfig()
        plan = plan_budget(config, engine.load(), 10_000, None)
        self.budget = TokenBudget(plan.initial_tokens, hard_limit=plan.max_tokens,
                                  clock=lambda: self.now)
        self.controller = AdaptiveBudget(self.budget, plan, config, now=0.0)
        self.running: list[Request] = []
        self.trace: list[tuple[float, int, float]] = []  # (time, running, tokens/s)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.step()

    def step(self) -> None:
        size = self.shared_prefix + self.PROMPT + self.OUTPUT
        while (reservation := self.budget.try_acquire(size)) is not None:
            length = self.OUTPUT if self.lengths is None else self.lengths.randint(
                self.OUTPUT // 2, self.OUTPUT)
            self.queue.append(Request(reservation, length, self.now, self.controller.epoch))
        room = self.engine.max_num_seqs - len(self.running)
        started = self.queue[:room if self.admit_per_step is None
                             else min(room, self.admit_per_step)]
        del self.queue[:len(started)]
        self.running += started
        n = len(self.running)
        step_s = (self.engine.step_ms(n) + self.prefill_ms * len(started)) / 1000.0
        self.now += step_s
        self.engine.generated += n
        self.trace.append((self.now, n, n / step_s))
        used = sum(self.PROMPT + r.length - r.remaining for r in self.running)
        used += self.shared_prefix if self.running else 0
        if used > self.engine.kv_tokens - self.engine.squeeze:
            self.engine.preemptions += 1
        hints = LoadHints(min(1.0, used / self.engine.kv_tokens), len(self.queue), n,
                          self.engine.kv_tokens - used, self.engine.preemptions,
                          step_s * 1000.0, self.engine.generated,
                          self.projected_peak() / self.engine.kv_tokens if self.project
                          else None)
        self.controller.observe(hints, self.now)
        for request in self.running:
            request.remaining -= 1
        for request in [r for r in self.running if r.remaining == 0]:
            self.running.remove(request)
            request.reservation.settle(size)
            self.controller.on_success(request.epoch, size, hints, now=self.now,
                                       sent_at=request.sent_at,
                                       completion_tokens=request.length)

    def projected_peak(self) -> int:
        """The most tokens the requests held (running after this step's token, or queued)
        will hold at once, if each runs to its end."""
        demands = sorted(((self.PROMPT + r.length - r.remaining + 1, r.remaining - 1)
                          for r in self.running if r.remaining > 1), key=lambda d: -d[1])
        demands += [(self.PROMPT, r.length) for r in self.queue]
        demands.sort(key=lambda d: -d[1])
        peak, held, live = 0, 0, 0
        for tokens, remaining in demands:  # at step ``remaining`` these are still live
            held, live = held + tokens, live + 1
            peak = max(peak, held + live * remaining)
        prefix = self.shared_prefix if demands else 0
        return prefix + max(peak, sum(tokens for tokens, _ in demands))

    def mean_since(self, start: float) -> tuple[float, float]:
        """Mean running count and tokens per second over the trace since ``start``."""
        tail = [(n, rate) for t, n, rate in self.trace if t >= start]
        return (sum(n for n, _ in tail) / len(tail), sum(r for _, r in tail) / len(tail))


def best_rate(engine: FakeEngine) -> float:
    n = engine.peak
    return 1000.0 * n / (engine.base_ms + engine.c_ms * n * n)


class GentleEngine(FakeEngine):
    """Step time ``base + c·n`` (plus ``quad_ms·n²``, none unless set): throughput rises ever
    more gently, with no peak short of the client's limit (2,048 here), as a server's does
    when each sequence added costs less than the one before."""

    quad_ms = 0.0

    def step_ms(self, n: int) -> float:
        step = self.base_ms + self.c_ms * n + self.quad_ms * n * n
        return step * self.rng.uniform(0.97, 1.03)
