"""Sizing the KV cache on CUDA from ``gpu_memory_utilization``, with vLLM's meaning.

The instance may use ``gpu_memory_utilization × total`` bytes of the GPU. Weights, the peak
activations of the largest step the scheduler can build, and memory outside torch's
allocator (CUDA context, cuBLAS workspaces) are measured; the KV cache gets the rest. Other
processes' memory is not subtracted, but the device must have the requested bytes free when
the engine starts, or it refuses to start rather than fail later with an out-of-memory error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.config.engine_config import CacheConfig, GiB, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_input import prepare_model_input
from pagedserve.server.models.model_config import ModelConfig


@dataclass(slots=True, frozen=True)
class MemorySnapshot:
    free: int
    total: int

    @classmethod
    def of(cls, device: torch.device) -> MemorySnapshot:
        free, total = torch.cuda.mem_get_info(device)
        return cls(free=free, total=total)


def kv_cache_budget(utilization: float, baseline: MemorySnapshot, non_kv_bytes: int) -> int:
    """Bytes for the KV cache: the instance's share of the device minus what it needs besides.

    ``baseline`` is the device before the model loaded; ``non_kv_bytes`` what the instance
    has taken since, at its peak (weights, activations, non-torch memory)."""
    requested = int(utilization * baseline.total)
    if baseline.free < requested:
        raise ValueError(
            f"gpu_memory_utilization {utilization} asks for {requested / GiB:.2f} GiB of the "
            f"device's {baseline.total / GiB:.2f} GiB, but only {baseline.free / GiB:.2f} GiB "
            f"are free (other processes use the rest): lower gpu_memory_utilization")
    budget = requested - non_kv_bytes
    if budget <= 0:
        raise ValueError(
            f"weights and activations take {non_kv_bytes / GiB:.2f} GiB, all of the "
            f"{requested / GiB:.2f} GiB that gpu_memory_utilization {utilization} allows: "
            f"raise gpu_memory_utilization or lower max_num_batched_tokens")
    return budget


def gpu_kv_cache_memory(model: torch.nn.Module, model_config: ModelConfig,
                        scheduler_config: SchedulerConfig, block_size: int,
                        utilization: float, baseline: MemorySnapshot) -> int:
    """Runs the largest step once and returns the KV budget it leaves (see module doc)."""
    device = next(model.parameters()).device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    scratch_kv = profile_step(model, model_config, scheduler_config, block_size)
    torch.cuda.synchronize(device)
    free_now, _ = torch.cuda.mem_get_info(device)
    # Segments the allocator returned after the peak were the instance's at the peak.
    released = torch.cuda.max_memory_reserved(device) - torch.cuda.memory_reserved(device)
    # The profile's scratch cache is KV memory: the real cache takes its place.
    non_kv = baseline.free - free_now + released - scratch_kv
    torch.cuda.empty_cache()
    return kv_cache_budget(utilization, baseline, non_kv)


@torch.inference_mode()
def profile_step(model: torch.nn.Module, model_config: ModelConfig,
                 scheduler_config: SchedulerConfig, block_size: int) -> int:
    """One forward pass of ``max_num_batched_tokens`` prompt tokens (packed into sequences of
    at most ``max_model_len``) and the sampler's work on ``max_num_seqs`` rows of logits:
    the most activation memory a step can take. Returns the bytes of its scratch KV cache."""
    device = next(model.parameters()).device
    num_tokens = scheduler_config.max_num_batched_tokens
    seq_len = min(num_tokens, scheduler_config.max_model_len)
    lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len
                                                   else [])
    width = math.ceil(seq_len / block_size)
    cache = KVCache(model_config, block_size, width * len(lens), 0, model.dtype, device,
                    model.kernel_ops)
    inp = prepare_model_input(_profile_batch(lens, scheduler_config, block_size,
                                             cache.num_device_blocks), block_size, device)
    hidden = model(inp.input_ids, inp.positions, inp.attn, cache.device_caches)
    rows = min(scheduler_config.max_num_seqs, num_tokens)
    logits = model.compute_logits(hidden[-rows:])
    if logits is not None:  # under tensor parallelism only rank 0 gets logits and samples
        # The sampler's heaviest tensors: probabilities and a sorted copy (top-p / top-k).
        torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
    return cache.num_device_blocks * cache.bytes_per_block


def _profile_batch(lens: list[int], scheduler_config: SchedulerConfig, block_size: int,
                   num_blocks: int) -> SchedulerOutput:
    """The scheduler's first step over prompts of ``lens`` tokens: one sequence each, all of
    them in one batch (the profile may batch more sequences than max_num_seqs)."""
    # A prompt may fill max_model_len here: no token is ever sampled after it.
    config = replace(scheduler_config, max_num_seqs=max(len(lens), scheduler_config.max_num_seqs),
                     max_model_len=max(lens) + 1, max_waiting_requests=None)
    scheduler = Scheduler(config, CacheConfig(block_size=block_size, watermark=0.0),
                          num_blocks, 0)
    for index, num_tokens in enumerate(lens):
        seq = Sequence(scheduler.new_seq_id(), [0] * num_tokens, block_size)
        scheduler.add_seq_group(SequenceGroup(f"profile-{index}", [seq],
                                              SamplingParams(max_tokens=1), 0.0))
    out = scheduler.schedule()
    if out.num_batched_tokens != sum(lens):
        raise RuntimeError(f"the profile batch holds {out.num_batched_tokens} tokens, "
                           f"expected {sum(lens)}")
    return out
