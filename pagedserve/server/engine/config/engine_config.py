"""Configuration of the KV cache and the scheduler, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GiB = 1 << 30
MAX_BLOCK_SIZE = 256
# The KV cache's element type: auto is the model's dtype (engine/worker/kv_cache.py).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# Used on CPU when neither num_kv_blocks nor kv_cache_memory is given: enough for a small model
# without starving the weights. On CUDA the engine sizes the cache from gpu_memory_utilization
# instead (engine/worker/gpu_memory.py).
DEFAULT_KV_CACHE_MEMORY = 1 * GiB
# CPU swap space when none is asked for: vLLM's 4 GiB with an accelerator, whose KV cache is in
# device memory; none on the CPU, where the KV cache is in CPU memory already: a swap would
# copy blocks from CPU memory to CPU memory, and the same memory serves more requests as KV
# cache. Preemption then recomputes (engine/core/scheduler.py).
DEFAULT_SWAP_SPACE = {"cpu": 0.0}
ACCELERATOR_SWAP_SPACE = 4.0
# While more than one tenant is live, a step's prompt tokens are bounded by
# max_num_batched_tokens divided by this a tenant with prompts (unless max_shared_prefill_tokens
# says), and a tenant counts as live for this many seconds after its last request finished.
# Both chosen from docs/benchmarks.md, "Fairness between tenants".
SHARED_PREFILL_FRACTION = 16
DEFAULT_TENANT_LINGER_SECONDS = 5.0

KVAllocationName = Literal["paged", "contiguous"]
PreemptionModeName = Literal["auto", "recompute", "swap"]

KV_ALLOCATIONS: tuple[str, ...] = ("paged", "contiguous")
PREEMPTION_MODES: tuple[str, ...] = ("auto", "recompute", "swap")


def default_swap_space(device_type: str) -> float:
    """GiB of CPU swap space on a device of this type when ``swap_space`` is not given."""
    return DEFAULT_SWAP_SPACE.get(device_type, ACCELERATOR_SWAP_SPACE)


def _require(ok: bool, field: str, value: object, limit: str) -> None:
    if not ok:
        raise ValueError(f"{field} must be {limit}, got {value!r}")


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(slots=True)
class CacheConfig:
    """The paged KV cache: block geometry, how many blocks, CPU swap space, sharing policy.

    The number of device blocks depends on the model's bytes per block, which the engine only
    knows once the model is built: it then calls :meth:`resolve_num_blocks` and
    :meth:`num_cpu_blocks`. ``watermark`` is the fraction of device blocks kept free when
    admitting new requests, so that running ones can grow without being preempted at once.
    ``prefault`` writes the whole device pool once at start-up on the CPU (see ``KVCache``).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    swap_space: float = ACCELERATOR_SWAP_SPACE
    enable_prefix_caching: bool = False
    kv_allocation: KVAllocationName = "paged"
    watermark: float = 0.01
    prefault: bool = False

    def __post_init__(self) -> None:
        _require(
            isinstance(self.block_size, int) and _is_power_of_two(self.block_size)
            and self.block_size <= MAX_BLOCK_SIZE,
            "block_size", self.block_size, f"a power of two in [1, {MAX_BLOCK_SIZE}]",
        )
        _require(self.num_kv_blocks is None or self.num_kv_blocks >= 1,
                 "num_kv_blocks", self.num_kv_blocks, "at least 1")
        _require(self.kv_cache_memory is None or self.kv_cache_memory >= 1,
                 "kv_cache_memory", self.kv_cache_memory, "at least 1 byte")
        _require(self.num_kv_blocks is None or self.kv_cache_memory is None,
                 "kv_cache_memory", self.kv_cache_memory,
                 f"unset when num_kv_blocks is set (num_kv_blocks={self.num_kv_blocks})")
        _require(self.swap_space >= 0, "swap_space", self.swap_space, "non-negative (GiB)")
        _require(self.kv_allocation in KV_ALLOCATIONS, "kv_allocation", self.kv_allocation,
                 f"one of {', '.join(KV_ALLOCATIONS)}")
        _require(0.0 <= self.watermark < 1.0, "watermark", self.watermark, "in [0, 1)")
        # A contiguous reservation is private to its sequence, so there is nothing to share.
        _require(not (self.enable_prefix_caching and self.kv_allocation == "contiguous"),
                 "enable_prefix_caching", self.enable_prefix_caching,
                 "False with kv_allocation='contiguous'")

    @property
    def sized_by_memory_default(self) -> bool:
        """Neither a block count nor a memory size was given: the engine picks the size."""
        return self.num_kv_blocks is None and self.kv_cache_memory is None

    def resolve_num_blocks(self, bytes_per_block: int) -> int:
        """Device blocks: ``num_kv_blocks`` if set, else the KV memory budget over the block."""
        _require(bytes_per_block >= 1, "bytes_per_block", bytes_per_block, "at least 1")
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        memory = self.kv_cache_memory if self.kv_cache_memory is not None else (
            DEFAULT_KV_CACHE_MEMORY)
        num_blocks = memory // bytes_per_block
        _require(num_blocks >= 1, "kv_cache_memory", memory,
                 f"at least one block ({bytes_per_block} bytes)")
        return num_blocks

    def num_cpu_blocks(self, bytes_per_block: int) -> int:
        """Blocks of CPU swap space that ``swap_space`` GiB hold (0 disables swapping)."""
        _require(bytes_per_block >= 1, "bytes_per_block", bytes_per_block, "at least 1")
        return int(self.swap_space * GiB) // bytes_per_block


@dataclass(slots=True)
class SchedulerConfig:
    """Limits of one scheduling step and of the request queue.

    ``max_num_seqs`` bounds the sequences in the running batch, ``max_num_batched_tokens`` the
    tokens computed in one step (longer prompts are prefilled in chunks), ``max_model_len`` the
    tokens of one sequence. ``max_waiting_requests`` (None: unbounded) turns a full queue into
    ``QueueFullError`` instead of unbounded latency. While more than one tenant is live, a
    step's prompt tokens are bounded by ``max_shared_prefill_tokens`` (None: a sixteenth of
    ``max_num_batched_tokens``) a tenant with prompts to compute, so that one tenant's long
    prompts do not make every step long for the others; a tenant still counts as live for
    ``tenant_linger_seconds`` after its last request finished (``step_shares.py`` has the
    rule, ``tenant_activity.py`` the liveness).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    preemption_mode: PreemptionModeName = "auto"
    max_waiting_requests: int | None = None
    max_shared_prefill_tokens: int | None = None
    tenant_linger_seconds: float = DEFAULT_TENANT_LINGER_SECONDS

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "at least 1")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
                 self.max_num_batched_tokens, "at least 1")
        _require(self.max_model_len >= 1, "max_model_len", self.max_model_len, "at least 1")
        _require(self.preemption_mode in PREEMPTION_MODES, "preemption_mode",
                 self.preemption_mode, f"one of {', '.join(PREEMPTION_MODES)}")
        _require(self.max_waiting_requests is None or self.max_waiting_requests >= 1,
                 "max_waiting_requests", self.max_waiting_requests, "None or at least 1")
        _require(self.max_shared_prefill_tokens is None or self.max_shared_prefill_tokens >= 1,
                 "max_shared_prefill_tokens", self.max_shared_prefill_tokens,
                 "None or at least 1")
        if self.max_shared_prefill_tokens is None:
            self.max_shared_prefill_tokens = max(
                1, self.max_num_batched_tokens // SHARED_PREFILL_FRACTION)
        _require(self.tenant_linger_seconds >= 0, "tenant_linger_seconds",
                 self.tenant_linger_seconds, "at least 0")
