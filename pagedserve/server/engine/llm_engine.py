"""The synchronous engine: add_request, abort_request, step.

One step: schedule → run the model → sample → the scheduler applies the tokens (append, fork,
finish, free) → the output processor detokenizes, matches stop strings and builds the outputs
→ the scheduler finishes what it reported. The loop around it (offline ``LLM`` or the
server's ``AsyncEngine``) decides when to call ``step``; docs/internals.md draws who owns
what.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

import torch

from pagedserve.common.gguf_file import forget_gguf_readers
from pagedserve.common.sampling_params import SamplingParams, StructuredOutputsParams
from pagedserve.kernels.weight_arena import ARENA
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.config.engine_config import CacheConfig
from pagedserve.server.engine.core.beam_search import BeamState
from pagedserve.server.engine.core.kv_projection import CachedProjection
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.request_preparation import (
    EngineRequest,
    PreparedRequest,
    RequestPreparer,
)
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SampledBatch, SchedulerOutput
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.engine_stats import EngineStats, ParallelInfo, StepStats
from pagedserve.server.engine.logits.sampling_plan import SamplingPlan, TokenSampler
from pagedserve.server.engine.output_processor import OutputProcessor
from pagedserve.server.engine.parallel.launcher import WorkerGroup
from pagedserve.server.engine.worker.gpu_memory import MemorySnapshot, gpu_kv_cache_memory
from pagedserve.server.engine.worker.kv_cache import KVCache, resolve_kv_cache_dtype
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.engine.worker.step_timing import StepTimer
from pagedserve.server.models.attention import warm_up_attention
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_path import resolve_model
from pagedserve.server.models.parallel_layers import shard_config
from pagedserve.server.sampling.grammar import GrammarState
from pagedserve.server.sampling.sampler import Sampler
from pagedserve.server.tokenizer.loader import load_tokenizer

logger = logging.getLogger(__name__)
T = TypeVar("T")


class LLMEngine:
    """Assembles the model, KV cache, scheduler, runner, sampler, output processor and
    request preparer, and steps them."""

    def __init__(self, args: EngineArgs) -> None:
        started = time.perf_counter()
        self.args = args
        _configure_torch(args)
        self.model_dir = resolve_model(args.model)
        # The tokenizer loads in a thread while the weights load here: their repack runs
        # in C without the GIL (0.3 s of a 1B file's), the tokenizer's build in Python.
        tokenizer = None if args.skip_tokenizer_init else _in_thread(load_tokenizer,
                                                                     self.model_dir)
        # Tensor parallelism: ranks 1..N-1 start here and load their shards meanwhile.
        self.workers = WorkerGroup.start(args, self.model_dir)
        self.device = self.workers.device
        # The device before the weights load: what gpu_memory_utilization is measured against.
        baseline = MemorySnapshot.of(self.device) if self.device.type == "cuda" else None
        try:
            self.model, self.model_config = load_model(
                self.model_dir, dtype=args.dtype, device=self.device,
                backend=args.kernel_backend, group=self.workers.group,
                quantization=args.quantization,
                quantized_activations=args.quantized_activations,
            )
        finally:
            # The tokenizer's error comes first, as when the two loaded in turn.
            self.tokenizer = None if tokenizer is None else tokenizer.result()
        forget_gguf_readers()  # the model and the tokenizer have read the header
        self.max_model_len = self._max_model_len(args.max_model_len)
        self.scheduler_config = args.scheduler_config(self.max_model_len)
        self.cache_config = self._sized_cache_config(baseline)
        self._fit_max_model_len()
        # The kernels load before the KV cache: its pages are made resident in a thread,
        # which holds the address space's lock that each library's mapping waits for.
        self.compile_seconds = warm_up_attention(self.model, self.cache_config.block_size,
                                                 self.model.dtype)
        # The packed weights move onto huge pages once the engine is up and its KV cache is
        # resident (weight_arena.py), from a thread started before the KV cache's prefault:
        # started while the prefault holds the address space's lock, it took 0.15 s.
        self._up, self._came_up = threading.Event(), False
        ARENA.move_to_huge_pages(after=self._wait_until_up)
        try:
            self._assemble(args)
            self._came_up = True
        finally:
            self._up.set()
        self.startup_seconds = time.perf_counter() - started
        logger.info("engine ready in %.1f s (kernel compilation %.1f s; --kernel-backend torch "
                    "skips it)", self.startup_seconds, self.compile_seconds)

    def _assemble(self, args: EngineArgs) -> None:
        """The KV cache and the parts that step the engine over it."""
        self.kv_cache = self._create_kv_cache()
        self.workers.finish_startup(self.kv_cache)
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config,
                                   num_device_blocks=self.kv_cache.num_device_blocks,
                                   num_cpu_blocks=self.kv_cache.num_cpu_blocks)
        self.runner = self.workers.wrap(ModelRunner(
            self.model, self.kv_cache, self.cache_config.block_size, self.device))
        self.sampler = self._create_sampler()
        self.outputs = OutputProcessor(self.tokenizer)
        self.requests = RequestPreparer(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids,
            self.max_model_len, args.grammar_cache_size)
        self.kv_projection = CachedProjection(self.scheduler)
        self._observers: list[Callable[[StepStats], None]] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def _wait_until_up(self) -> bool:
        """Waits for the engine to be up and its KV cache resident; whether it came up."""
        self._up.wait()
        if self._came_up:
            self.kv_cache.wait_prefault()
        return self._came_up

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    # -- construction steps ---------------------------------------------------------------

    def _max_model_len(self, requested: int | None) -> int:
        limit = self.model_config.max_model_len
        if requested is None:
            return limit
        if requested > limit:
            raise ValueError(f"max_model_len {requested} exceeds the model's limit of {limit} "
                             f"positions")
        return requested

    def _fit_max_model_len(self) -> None:
        """Without a ``max_model_len`` asked for, one that the KV cache cannot hold for a single
        sequence (a Llama 3 file's 131,072 positions beside the CPU's default 1 GiB) becomes
        what it holds, with a warning, as llama.cpp sizes its context; an asked-for one is
        refused by the KV cache instead."""
        if self.args.max_model_len is not None:
            return
        dtype = resolve_kv_cache_dtype(self.args.kv_cache_dtype, self.model.dtype,
                                       self.model.kernel_ops)
        bytes_per_block = shard_config(self.model_config, self.workers.size).bytes_per_block(
            self.cache_config.block_size, dtype)
        capacity = (self.cache_config.resolve_num_blocks(bytes_per_block)
                    * self.cache_config.block_size)
        if capacity >= self.max_model_len:
            return
        logger.warning("max_model_len %d (the model's) does not fit the KV cache, which holds "
                       "%d tokens: serving up to %d tokens a request; pass --max-model-len, or "
                       "more --kv-cache-memory", self.max_model_len, capacity, capacity)
        self.max_model_len = capacity
        self.scheduler_config = self.args.scheduler_config(capacity)

    def _sized_cache_config(self, baseline: MemorySnapshot | None) -> CacheConfig:
        """The cache config, its KV memory measured when it is sized by the default share
        of a GPU: every rank profiles its shard in step (the pass all-reduces); the least
        wins."""
        config, args = self.args.cache_config(self.device.type), self.args
        if baseline is None or not config.sized_by_memory_default:
            return config
        memory = self.workers.agree_kv_memory(
            lambda: gpu_kv_cache_memory(
                self.model, shard_config(self.model_config, self.workers.size),
                self.scheduler_config, config.block_size, args.gpu_memory_utilization,
                baseline),
            self.scheduler_config, config.block_size, args.gpu_memory_utilization)
        return replace(config, kv_cache_memory=memory)

    def _create_kv_cache(self) -> KVCache:
        kernel_ops = self.model.kernel_ops
        dtype = resolve_kv_cache_dtype(self.args.kv_cache_dtype, self.model.dtype, kernel_ops)
        return KVCache.create(shard_config(self.model_config, self.workers.size),
                              self.cache_config, self.max_model_len, dtype, self.device,
                              kernel_ops)

    def _create_sampler(self) -> TokenSampler:
        # One sampler, seeded from --seed, so unseeded requests repeat on a fresh engine.
        ops = self.model.kernel_ops
        return TokenSampler(
            Sampler(seed=self.args.seed, cpu_race=ops.exponential_race, cpu_argmax=ops.argmax,
                    top_k_top_p=ops.top_k_top_p),
            self.model_config.vocab_size)

    # -- the engine's parts ---------------------------------------------------------------

    def check_health(self) -> None:
        """Raises WorkerFailedError once a tensor-parallel worker is known to be gone."""
        self.workers.check_health()

    def parallel_info(self) -> ParallelInfo:
        return ParallelInfo(
            tensor_parallel_size=self.workers.size,
            kv_blocks_per_rank=self.kv_cache.num_device_blocks,
            kv_bytes_per_rank=self.kv_cache.num_device_blocks * self.kv_cache.bytes_per_block,
            cpu_kv_blocks_per_rank=self.kv_cache.num_cpu_blocks,
        )

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers, if any. Idempotent."""
        self.workers.shutdown()

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams, prompt: str | None = None,
                    arrival_time: float | None = None, cache_salt: str | None = None,
                    tenant: str | None = None) -> None:
        """One request through :meth:`add_requests`."""
        request = EngineRequest(request_id, prompt_token_ids, params, prompt, tenant,
                                cache_salt)
        self.add_requests([request], arrival_time)

    def add_requests(self, requests: Iterable[EngineRequest],
                     arrival_time: float | None = None) -> None:
        """The door of the synchronous engine (the offline ``LLM``'s): every request is
        checked and its grammar compiled (cached) before any is added, so an
        InvalidRequestError leaves none of them behind."""
        requests = list(requests)
        prepared = [self.with_grammar(self.prepare_request(r.prompt_token_ids, r.params))
                    for r in requests]
        for request, ready in zip(requests, prepared):
            self.add_prepared(request, ready, arrival_time)

    def prepare_request(self, prompt_token_ids: list[int],
                        params: SamplingParams) -> PreparedRequest:
        """The request checked once, with its final parameters (``RequestPreparer``);
        InvalidRequestError for one this engine can never serve. Thread-safe."""
        return self.requests.prepare(prompt_token_ids, params)

    def with_grammar(self, prepared: PreparedRequest) -> PreparedRequest:
        """``prepared`` with its structured output's grammar compiled (cached)."""
        spec = prepared.params.structured_outputs
        return prepared if spec is None else replace(prepared,
                                                     grammar=self.compile_grammar(spec))

    def compile_grammar(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of a structured-output constraint (cached); thread-safe."""
        return self.requests.compile_grammar(spec)

    def check_queue_room(self, num_arriving: int = 0) -> None:
        """QueueFullError unless one more request fits the waiting queue, counting
        ``num_arriving`` requests accepted but not yet added."""
        self.scheduler.check_queue_room(num_arriving)

    def add_prepared(self, request: EngineRequest, prepared: PreparedRequest,
                     arrival_time: float | None = None) -> None:
        """Adds a request a door prepared (checked, its grammar compiled) to the
        scheduler, without checking it again."""
        params, prompt_token_ids = prepared.params, prepared.prompt_token_ids
        grammar, cache_salt = prepared.grammar, request.cache_salt
        if params.prompt_logprobs is not None:
            # Every prompt position must be computed to report its logprob: no cache hits.
            cache_salt = f"prompt-logprobs:{request.request_id}:{cache_salt or ''}"
        eos = self.requests.eos_token_id
        seq = Sequence(self.scheduler.new_seq_id(), prompt_token_ids, self.cache_config.block_size,
                       text=self.outputs.text_state(prompt_token_ids, params),
                       grammar=None if grammar is None else GrammarState.start(grammar))
        group = SequenceGroup(
            request.request_id, [seq], params, arrival_time=arrival_time or time.monotonic(),
            cache_salt=cache_salt, prompt=request.prompt, eos_token_id=eos,
            bad_words_token_ids=prepared.bad_words_token_ids, tenant=request.tenant,
            beam=BeamState.for_request(params, eos, self.max_model_len - len(prompt_token_ids)),
        )
        self.scheduler.add_seq_group(group)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Frees the request's blocks at once; returns its final output (None if unknown)."""
        group = self.scheduler.abort(request_id)
        if group is None:
            return None
        return self.outputs.final_output(group)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self, with_projection: bool = False) -> EngineStats:
        """The engine's snapshot; ``with_projection`` adds the KV cache its work will need at
        most (``CachedProjection``)."""
        return EngineStats.of(
            self.scheduler.stats(with_occupancy=False),
            kv_projected_usage=self.kv_projection.usage() if with_projection else None,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
        )

    # -- the step -------------------------------------------------------------------------

    def add_step_observer(self, observer: Callable[[StepStats], None]) -> None:
        """``observer(StepStats)`` runs after every step that did work."""
        self._observers.append(observer)

    def step(self) -> list[RequestOutput]:
        """One step; raises only when the step itself fails (the forward pass, the scheduler's
        state). A request whose post-processing raises ends alone, its output saying why."""
        timer = StepTimer()
        out = self.scheduler.schedule()
        timer.mark("schedule")
        sampled = SampledBatch()
        if not out.is_empty:
            plan = SamplingPlan.of(out)
            logits = self.runner.execute(out, plan.logit_rows(), timer)
            sampled = self.sampler.sample(plan, logits)
            timer.mark("sample")
        update = self.scheduler.update_from_output(out, sampled)
        made = self.outputs.make(update)
        self.scheduler.finish_stopped(made.stopped)
        self.scheduler.finish_failed(made.failed)
        timer.mark("output")
        self._record(out, sampled.num_tokens, timer, made.results)
        return made.results

    def _record(self, out: SchedulerOutput, num_sampled: int, timer: StepTimer,
                results: list[RequestOutput]) -> None:
        self.prompt_tokens_total += out.num_prompt_tokens
        self.generation_tokens_total += num_sampled
        if not self._observers or out.is_empty:
            return
        stats = StepStats(
            num_prefill_tokens=out.num_prompt_tokens,
            num_decode_tokens=num_sampled,
            duration_s=timer.elapsed,
            phase_seconds=timer.phases,
            num_preempted=len(out.preempted),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            finished=[r for r in results if r.finished],
        )
        for observer in self._observers:
            observer(stats)


def _in_thread(fn: Callable[..., T], *args: Any) -> Future[T]:
    """``fn(*args)`` run in a daemon thread; its result or exception in the future."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"pagedserve-{fn.__name__}", daemon=True).start()
    return future


def _configure_torch(args: EngineArgs) -> None:
    torch.manual_seed(args.seed)
    if args.cpu_threads is not None:
        if args.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {args.cpu_threads}")
        torch.set_num_threads(args.cpu_threads)
