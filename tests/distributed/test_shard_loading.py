"""Each rank loads exactly its shard: put back together, the shards are the checkpoint. Built
in one process (a group of two ranks without process groups describes a shard), no workers."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pagedserve.server import LLM
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import check_tensor_parallel, shard_config
from pagedserve.server.models.weights import load_weights

WORLD = 2


def params(path: Path, rank: int | None) -> dict[str, torch.Tensor]:
    group = None if rank is None else TensorParallelGroup(rank=rank, world_size=WORLD)
    model, _ = load_model(path, dtype="float32", group=group)
    return {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}


def kv_heads_of(rank: int, num_kv_heads: int) -> list[int]:
    """The KV heads a rank holds: its share, or the one its query heads use."""
    if num_kv_heads >= WORLD:
        per = num_kv_heads // WORLD
        return list(range(rank * per, (rank + 1) * per))
    return [rank * num_kv_heads // WORLD]


def expected_qkv(full: torch.Tensor, config: ModelConfig, rank: int) -> torch.Tensor:
    d, heads, kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    q, k, v = full.split([heads * d, kv_heads * d, kv_heads * d])
    q_rows = q.chunk(WORLD)[rank]
    mine = kv_heads_of(rank, kv_heads)
    k_rows = torch.cat([k[h * d:(h + 1) * d] for h in mine])
    v_rows = torch.cat([v[h * d:(h + 1) * d] for h in mine])
    return torch.cat([q_rows, k_rows, v_rows])


def expected_shard(name: str, full: torch.Tensor, config: ModelConfig, rank: int
                   ) -> torch.Tensor:
    if "qkv_proj" in name:
        return expected_qkv(full, config, rank)
    if "gate_up_proj" in name:
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(WORLD)[rank], up.chunk(WORLD)[rank]])
    if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "fc2.weight")):
        return full.chunk(WORLD, dim=1)[rank]
    if "fc1." in name:
        return full.chunk(WORLD)[rank]
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        per_rank = -(-config.vocab_size // WORLD)
        padded = torch.cat([full, full.new_zeros(per_rank * WORLD - full.shape[0],
                                                 full.shape[1])])
        return padded.chunk(WORLD)[rank]
    return full  # norms, positions, OPT's projections, row-parallel biases: every rank


@pytest.mark.parametrize("name", ["llama", "llama_kv1", "qwen2", "opt"])
def test_each_rank_holds_its_part_of_every_weight(tp_checkpoints: dict[str, Path],
                                                  name: str) -> None:
    path = tp_checkpoints[name]
    config = ModelConfig.from_pretrained(path)
    full = params(path, None)
    for rank in range(WORLD):
        shard = params(path, rank)
        assert shard.keys() == full.keys()
        for param_name, tensor in full.items():
            assert torch.equal(shard[param_name],
                               expected_shard(param_name, tensor, config, rank)), param_name


class CountingSource:
    """A checkpoint tensor that counts the elements read from it."""

    def __init__(self, tensor: torch.Tensor, counter: list[int]) -> None:
        self.tensor, self.counter = tensor, counter

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index) -> torch.Tensor:
        part = self.tensor[index]
        self.counter[0] += part.numel()
        return part


def test_a_rank_reads_only_what_it_holds(tp_checkpoints: dict[str, Path]) -> None:
    path = tp_checkpoints["llama"]
    tensors = load_file(path / "model.safetensors")
    model, _ = load_model(path, dtype="float32",
                          group=TensorParallelGroup(rank=1, world_size=WORLD))
    read = [0]
    load_weights(model, [(name, CountingSource(t, read)) for name, t in tensors.items()], "x")
    held = sum(p.numel() for p in model.parameters())
    assert read[0] == held
    assert held < sum(t.numel() for t in tensors.values())


def test_vocabulary_padding_rows_are_zero(tp_checkpoints: dict[str, Path]) -> None:
    # 383 ids over 2 ranks: 192 rows each, the last row of rank 1 is padding.
    shard = params(tp_checkpoints["llama_kv1"], 1)
    embed = shard["model.embed_tokens.weight"]
    assert embed.shape[0] == 192
    assert torch.equal(embed[191], torch.zeros_like(embed[191]))
    assert shard["lm_head.weight"].data_ptr() == embed.data_ptr()  # still tied


def test_a_rank_caches_its_kv_heads_only(tp_checkpoints: dict[str, Path]) -> None:
    llama = ModelConfig.from_pretrained(tp_checkpoints["llama"])
    kv1 = ModelConfig.from_pretrained(tp_checkpoints["llama_kv1"])
    assert (shard_config(llama, 2).num_attention_heads,
            shard_config(llama, 2).num_key_value_heads) == (2, 1)
    assert shard_config(kv1, 2).num_key_value_heads == 1  # replicated, not split
    assert shard_config(llama, 2).bytes_per_block(16, "float32") * 2 == (
        llama.bytes_per_block(16, "float32"))


def _config(heads: int, kv_heads: int, intermediate: int = 64) -> ModelConfig:
    return ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 96,
        "intermediate_size": intermediate, "num_hidden_layers": 1, "head_dim": 8,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "max_position_embeddings": 64,
    })


@pytest.mark.parametrize(("heads", "kv_heads", "intermediate", "size", "message"), [
    (4, 2, 64, 3, "num_attention_heads 4 is not divisible by tensor_parallel_size 3"),
    (12, 6, 64, 4, "num_key_value_heads 6 is not divisible by tensor_parallel_size 4"),
    (12, 2, 66, 3, "tensor_parallel_size 3 is not a multiple of num_key_value_heads 2 (with "
                   "fewer KV heads than ranks, each KV head is replicated on an equal number "
                   "of ranks)"),
    (8, 8, 100, 8, "intermediate_size 100 is not divisible by tensor_parallel_size 8"),
])
def test_a_split_the_shape_does_not_allow_names_the_numbers(
        heads: int, kv_heads: int, intermediate: int, size: int, message: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        check_tensor_parallel(_config(heads, kv_heads, intermediate), size)
    assert str(info.value) == message


def test_the_engine_refuses_a_bad_split_before_starting_workers(
        tp_checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ModelLoadError) as info:
        LLM(str(tp_checkpoints["llama"]), tensor_parallel_size=3, skip_tokenizer_init=True)
    assert str(info.value) == "num_attention_heads 4 is not divisible by tensor_parallel_size 3"
    assert multiprocessing.active_children() == []


def test_tensor_parallel_size_must_be_positive() -> None:
    with pytest.raises(ValueError) as info:
        EngineArgs(tensor_parallel_size=0)
    assert str(info.value) == "tensor_parallel_size must be a positive integer, got 0"
