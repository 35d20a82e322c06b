"""Two tensor-parallel ranks as threads of the test process, for model-level checks.

Each rank gets its own gloo process group over a shared in-memory store, loads its shard,
allocates its KV shard and runs ``run_step`` on the messages this module's driver hands it,
so the collectives inside the model are real while no process is started. The engine's own
path (processes, the broadcast, failures) is tested in test_tp_engine.py and
test_tp_server.py.

``greedy_on_ranks(path, prompts, max_new_tokens, world_size)`` returns the greedy
continuation of each prompt, all prompts decoded in one batch.
"""

from __future__ import annotations

import math
import queue
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pagedserve.server.engine.parallel.step_message import StepMessage, run_step
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_input import ModelInput
from pagedserve.server.engine.worker.model_runner import ModelRunner
from pagedserve.server.models.attention import AttentionMetadata
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import shard_config

BLOCK_SIZE = 8
_TIMEOUT = timedelta(seconds=60)


class Rank(threading.Thread):
    def __init__(self, path: Path, rank: int, world_size: int, store: dist.Store,
                 num_blocks: int, quantization: str | None = None) -> None:
        super().__init__(daemon=True, name=f"rank-{rank}")
        self.args = (path, rank, world_size, store, num_blocks)
        self.quantization = quantization
        self.inbox: queue.Queue[StepMessage | None] = queue.Queue()
        self.outbox: queue.Queue[torch.Tensor | BaseException | None] = queue.Queue()

    def run(self) -> None:
        path, rank, world_size, store, num_blocks = self.args
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("tp", store), rank, world_size,
                                       _TIMEOUT)
            group = TensorParallelGroup(rank, world_size, pg, pg)
            model, config = load_model(path, dtype="float32", group=group,
                                       quantization=self.quantization)
            cache = KVCache(shard_config(config, world_size), BLOCK_SIZE, num_blocks, 0,
                            model.dtype, "cpu", model.kernel_ops)
            runner = ModelRunner(model, cache, BLOCK_SIZE, torch.device("cpu"))
            while (message := self.inbox.get()) is not None:
                self.outbox.put(run_step(runner, message))
        except BaseException as exc:  # reported to the driver, which re-raises it
            self.outbox.put(exc)


def _message(tables: list[list[int]], chunks: list[list[int]], done: list[int]
             ) -> StepMessage:
    """One step: each sequence computes ``chunks[s]`` after its ``done[s]`` cached tokens."""
    ids, positions, slots, starts = [], [], [], [0]
    for table, chunk, start in zip(tables, chunks, done, strict=True):
        span = range(start, start + len(chunk))
        ids += chunk
        positions += span
        slots += [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in span]
        starts.append(starts[-1] + len(chunk))
    width = max(len(t) for t in tables)
    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                  dtype=torch.int32),
        seq_lens=torch.tensor([d + len(c) for d, c in zip(done, chunks)], dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        max_query_len=max(len(c) for c in chunks),
        is_decode_only=all(len(c) == 1 for c in chunks),
    )
    inp = ModelInput(torch.tensor(ids), torch.tensor(positions), attn, starts)
    return StepMessage(model_input=inp, logit_rows=[end - 1 for end in starts[1:]])


def greedy_on_ranks(path: Path, prompts: list[list[int]], max_new_tokens: int,
                    world_size: int, quantization: str | None = None) -> list[list[int]]:
    """Each prompt's greedy continuation computed by ``world_size`` ranks (each quantizing
    its own shard with ``quantization``)."""
    per_seq = math.ceil((max(map(len, prompts)) + max_new_tokens) / BLOCK_SIZE)
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(len(prompts))]
    store = dist.HashStore()
    ranks = [Rank(path, r, world_size, store, per_seq * len(prompts), quantization)
             for r in range(world_size)]
    for rank in ranks:
        rank.start()
    try:
        outputs: list[list[int]] = [[] for _ in prompts]
        chunks, done = [list(p) for p in prompts], [0] * len(prompts)
        for _ in range(max_new_tokens):
            message = _message(tables, chunks, done)
            for rank in ranks:
                rank.inbox.put(message)
            results = [rank.outbox.get(timeout=_TIMEOUT.total_seconds()) for rank in ranks]
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            next_ids = results[0].argmax(dim=-1).tolist()
            done = [d + len(c) for d, c in zip(done, chunks)]
            chunks = [[t] for t in next_ids]
            for out, token in zip(outputs, next_ids):
                out.append(token)
        return outputs
    finally:
        for rank in ranks:
            rank.inbox.put(None)
        for rank in ranks:
            rank.join(timeout=_TIMEOUT.total_seconds())
