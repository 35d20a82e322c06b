"""Random add / step / fork / abort / finish / drop / swap sequences against the invariants.

After every operation the scheduler's queues, the sequences' block tables and both pools'
ref counts must agree exactly (``check_integrity``), and every step's computed context must
read back the sequence's own tokens from the fake KV cache. At the end every request has
been reported finished once and every block is free.
"""

from __future__ import annotations

from engine_fakes import FakeRunner, make_group
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedserve.common.engine_errors import InvalidRequestError, QueueFullError
from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.kv_allocation import cdiv
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.sequence import SequenceStatus

MAX_MODEL_LEN = 16
MAX_WAITING = 6
# Shared prompt prefixes, so that prefix-cache hits (and their evictions) happen often.
BASES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9, 5, 5, 5, 5],
         [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]


def brute_force_occupancy(seqs: list, block_size: int) -> tuple[int, int]:
    filled: dict[int, int] = {}
    for seq in seqs:
        for index, block_id in enumerate(seq.block_table):
            in_block = min(max(seq.num_tokens - index * block_size, 0), block_size)
            filled[block_id] = max(filled.get(block_id, 0), in_block)
    return len(filled) * block_size, sum(filled.values())


class EngineCoreMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_token_slots=st.integers(6, 32),
        num_cpu_blocks=st.integers(0, 16),
        policy=st.sampled_from(["paged", "paged+prefix-caching", "contiguous"]),
        mode=st.sampled_from(["auto", "recompute", "swap"]),
        max_num_seqs=st.integers(1, 8),
        max_num_batched_tokens=st.integers(1, 16),
        watermark=st.sampled_from([0.0, 0.1]),
        max_shared_prefill_tokens=st.sampled_from([None, 1, 3]),
        tenant_linger_seconds=st.sampled_from([0.0, 60.0]),
    )
    def setup(self, block_size: int, num_token_slots: int, num_cpu_blocks: int, policy: str,
              mode: str, max_num_seqs: int, max_num_batched_tokens: int,
              watermark: float, max_shared_prefill_tokens: int | None,
              tenant_linger_seconds: float) -> None:
        cache = CacheConfig(block_size=block_size, watermark=watermark,
                            enable_prefix_caching=policy == "paged+prefix-caching",
                            kv_allocation="contiguous" if policy == "contiguous" else "paged")
        config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 max_model_len=MAX_MODEL_LEN, preemption_mode=mode,
                                 max_waiting_requests=MAX_WAITING,
                                 max_shared_prefill_tokens=max_shared_prefill_tokens,
                                 tenant_linger_seconds=tenant_linger_seconds)
        self.scheduler = Scheduler(config, cache, num_token_slots // block_size, num_cpu_blocks)
        self.runner = FakeRunner(self.scheduler)
        self.contiguous = policy == "contiguous"
        self.added: list[str] = []
        self.num_requests = 0

    @rule(base=st.integers(0, 2), prefix_len=st.integers(0, 12),
          extra=st.lists(st.integers(0, 5), max_size=8), best_of=st.integers(1, 3),
          max_tokens=st.integers(1, 6), salt=st.sampled_from([None, "tenant"]),
          tenant=st.sampled_from([None, "a", "b"]))
    def add_request(self, base: int, prefix_len: int, extra: list[int], best_of: int,
                    max_tokens: int, salt: str | None, tenant: str | None) -> None:
        prompt = BASES[base][:prefix_len] + extra or [7]
        self.num_requests += 1
        request_id = f"r{self.num_requests}"
        group = make_group(request_id, prompt, self.scheduler.new_seq_id(),
                           self.scheduler.block_manager.block_size, best_of=best_of,
                           cache_salt=salt, tenant=tenant)
        was_full = self.scheduler.num_waiting >= MAX_WAITING
        try:
            self.scheduler.add_seq_group(group)
        except InvalidRequestError as error:
            assert error.message == error.args[0]
            assert self._never_fits(len(prompt), best_of), error.message
            return
        except QueueFullError:
            assert was_full
            return
        assert not self._never_fits(len(prompt), best_of) and not was_full
        self.runner.max_tokens[request_id] = max_tokens
        self.added.append(request_id)

    def _never_fits(self, prompt_len: int, best_of: int) -> bool:
        config = self.scheduler.config
        manager = self.scheduler.block_manager
        size = manager.block_size
        blocks = cdiv(prompt_len, size)
        if self.contiguous:
            blocks = cdiv(MAX_MODEL_LEN, size) * best_of
        capacity = manager.device_pool.num_blocks - manager.watermark_blocks
        return (prompt_len >= MAX_MODEL_LEN or best_of > config.max_num_seqs
                or best_of > config.max_num_batched_tokens or blocks > capacity)

    @rule(num_steps=st.integers(1, 3))
    def step(self, num_steps: int) -> None:
        for _ in range(num_steps):
            self.runner.step()

    @precondition(lambda self: self.scheduler.has_unfinished_requests())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.scheduler._groups)))
        assert self.scheduler.abort(request_id) is not None
        assert self.scheduler.abort(request_id) is None

    @precondition(lambda self: self.scheduler.num_running > 0)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        seq_group = data.draw(st.sampled_from(self.scheduler.running))
        seq = data.draw(st.sampled_from(seq_group.get_seqs(SequenceStatus.RUNNING)))
        self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)

    @precondition(lambda self: any(g.num_unfinished_seqs() > 1 for g in self._live_groups()))
    @rule(data=st.data())
    def drop_beam(self, data: st.DataObject) -> None:
        groups = [g for g in self._live_groups() if g.num_unfinished_seqs() > 1]
        seq_group = data.draw(st.sampled_from(groups))
        self.scheduler.free_seq(data.draw(st.sampled_from(seq_group.get_unfinished_seqs())))

    def _live_groups(self) -> list:
        return self.scheduler.running + self.scheduler.swapped

    @invariant()
    def integrity(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        self.scheduler.check_integrity()
        stats = self.scheduler.stats()
        seqs = [seq for group in self.scheduler.running
                for seq in group.get_seqs(SequenceStatus.RUNNING)]
        assert (stats.occupancy.num_token_slots, stats.occupancy.num_real_tokens) == (
            brute_force_occupancy(seqs, self.scheduler.block_manager.block_size))
        assert stats.kv.device.num_used_blocks * stats.kv.block_size == (
            stats.occupancy.num_token_slots)

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        self.runner.run_until_done(max_steps=2_000)
        assert sorted(self.runner.finished) == sorted(self.added)
        manager = self.scheduler.block_manager
        assert manager.device_pool.num_free_blocks == manager.device_pool.num_blocks
        assert manager.cpu_pool.num_free_blocks == manager.cpu_pool.num_blocks
        manager.check_integrity([], [])


EngineCoreMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestEngineCore = EngineCoreMachine.TestCase
