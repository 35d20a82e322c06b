"""Weight loading: errors that name the weight, shards, tied embeddings, dtypes, kernel ops."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.kernels.dispatch import TORCH_OPS
from pagedserve.server.models.loader import load_model, resolve_dtype
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from tests.checkpoints import load_hf_model, make_checkpoint
from tests.models.paged_harness import PagedHarness, hf_logits

PROMPT = [5, 17, 3, 99, 42, 7, 250]


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "ckpt"))


def _rewrite_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, {"format": "pt"})


def _logits(path: Path, **kwargs) -> torch.Tensor:
    model, config = load_model(path, **kwargs)
    return PagedHarness(model, config).step([(0, PROMPT)])[0]


def test_unknown_architecture_names_the_supported_ones(llama_checkpoint, tmp_path):
    path = _copy(llama_checkpoint, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        "unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM, "
        "MistralForCausalLM, OPTForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"
    )


def test_missing_weight_is_named(llama_checkpoint, tmp_path):
    path = _copy(llama_checkpoint, tmp_path)
    _rewrite_weights(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        f"checkpoint {path} is missing 1 weight of LlamaForCausalLM: "
        "'model.layers.1.mlp.up_proj.weight'"
    )


def test_unexpected_weight_is_named_and_rotary_tables_are_skipped(llama_checkpoint, tmp_path):
    path = _copy(llama_checkpoint, tmp_path)

    def edit(tensors):
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        tensors["model.layers.0.mlp.extra.weight"] = torch.ones(2)

    _rewrite_weights(path, edit)
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        f"checkpoint {path} has 1 unexpected weight for LlamaForCausalLM: "
        "'model.layers.0.mlp.extra.weight'"
    )


def test_misshapen_weight_is_named(qwen2_checkpoint, tmp_path):
    path = _copy(qwen2_checkpoint, tmp_path)
    _rewrite_weights(path, lambda t: t.update({"model.layers.0.self_attn.k_proj.bias":
                                               torch.zeros(32)}))
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        f"checkpoint {path} weight 'model.layers.0.self_attn.k_proj.bias' has shape [32], "
        "Qwen2ForCausalLM expects [16]"
    )


def test_directory_without_safetensors_is_refused(llama_checkpoint, tmp_path):
    path = _copy(llama_checkpoint, tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        f"no *.safetensors weights in {path} (only safetensors checkpoints load)"
    )
    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "absent")
    assert str(info.value) == f"model directory {str(tmp_path / 'absent')!r} does not exist"


def test_sharded_checkpoint_with_index_loads(llama_checkpoint, tmp_path):
    sharded = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1

    assert torch.equal(_logits(sharded, dtype="float32"), _logits(llama_checkpoint,
                                                                   dtype="float32"))

    first_shard = sorted(set(index["weight_map"].values()))[0]
    (sharded / first_shard).unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(sharded)
    assert str(info.value) == (
        f"{sharded / 'model.safetensors.index.json'} names shard {first_shard!r}, "
        "which is missing"
    )


def test_tied_embeddings_share_one_tensor_and_match_transformers(tmp_path):
    path = make_checkpoint(tmp_path / "tied", "llama", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")
    model, config = load_model(path, dtype="float32")
    assert model.lm_head.weight is model.model.embed_tokens.weight

    ours = PagedHarness(model, config).step([(0, PROMPT)])[0]
    torch.testing.assert_close(ours, hf_logits(load_hf_model(path), PROMPT), atol=1e-4, rtol=0)

    # A tied checkpoint that still ships the output matrix loads (the copy is the same tensor).
    embed = load_file(path / "model.safetensors")["model.embed_tokens.weight"]
    _rewrite_weights(path, lambda t: t.update({"lm_head.weight": embed.clone()}))
    assert torch.equal(_logits(path, dtype="float32"), ours)


def test_untied_model_needs_its_output_matrix(llama_checkpoint, tmp_path):
    model, _ = load_model(llama_checkpoint)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    path = _copy(llama_checkpoint, tmp_path)
    _rewrite_weights(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        f"checkpoint {path} is missing 1 weight of LlamaForCausalLM: 'lm_head.weight'"
    )


def test_opt_names_without_model_prefix_load(opt_checkpoint, tmp_path):
    path = _copy(opt_checkpoint, tmp_path)
    _rewrite_weights(path, lambda t: t.update(
        {k.removeprefix("model."): t.pop(k) for k in list(t) if k.startswith("model.")}
    ))
    assert torch.equal(_logits(path, dtype="float32"), _logits(opt_checkpoint,
                                                               dtype="float32"))


def test_explicit_dtype_applies_to_parameters_not_rope_tables(llama_checkpoint):
    model, _ = load_model(llama_checkpoint, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert not any(p.requires_grad for p in model.parameters())


def test_auto_dtype_on_accelerators_follows_the_checkpoint(monkeypatch):
    config = dataclasses.replace(
        ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
                               "hidden_size": 8, "intermediate_size": 8,
                               "num_hidden_layers": 1, "num_attention_heads": 2,
                               "max_position_embeddings": 8}),
        torch_dtype="bfloat16",
    )
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", config, cuda) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", config, cuda) == torch.float16
    assert resolve_dtype("auto", dataclasses.replace(config, torch_dtype=None), cuda) == (
        torch.float32
    )
    assert resolve_dtype("float16", config, torch.device("cpu")) == torch.float16
    assert resolve_dtype("auto", config, torch.device("cpu")) in (torch.bfloat16, torch.float32)


def _recording_ops(calls: list[str]):
    def wrap(name):
        real = getattr(TORCH_OPS, name)

        def op(*args):
            calls.append(name)
            return real(*args)

        return op

    names = ("reshape_and_cache", "paged_attention_decode", "paged_attention_prefill",
             "copy_blocks", "swap_blocks")
    return dataclasses.replace(TORCH_OPS, name="recording", **{n: wrap(n) for n in names})


def test_model_calls_the_kernel_ops_it_was_given(llama_checkpoint):
    calls: list[str] = []
    model, config = load_model(llama_checkpoint, dtype="float32",
                               kernel_ops=_recording_ops(calls))
    assert model.kernel_ops.name == "recording"
    harness = PagedHarness(model, config)

    harness.step([(0, [1, 2, 3]), (1, [4])])
    assert calls == ["reshape_and_cache", "paged_attention_prefill"] * 2
    calls.clear()
    harness.step([(0, [5]), (1, [6])])
    assert calls == ["reshape_and_cache", "paged_attention_decode"] * 2

    assert load_model(llama_checkpoint, backend="torch")[0].kernel_ops is TORCH_OPS


def test_unsupported_activation_is_named(llama_checkpoint, tmp_path):
    path = _copy(llama_checkpoint, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "hidden_act": "quick_gelu"}))
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert str(info.value) == (
        "unsupported activation 'quick_gelu'; supported: gelu, gelu_new, gelu_pytorch_tanh, "
        "relu, silu, swish"
    )
