"""config.json parsing, KV bytes per block, and Llama-3 rope scaling against transformers."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.server.models.layers import rope_inv_freq
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_config import ModelConfig, parse_dtype
from pagedserve.server.models.model_load_error import ModelLoadError
from tests.checkpoints import load_hf_model, make_checkpoint
from tests.models.paged_harness import PagedHarness, hf_logits

LLAMA3 = {
    "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
LLAMA_JSON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}


def test_llama_fields_and_derived_head_dim():
    config = ModelConfig.from_dict(LLAMA_JSON, {"eos_token_id": [2, 7]})
    assert (config.architecture, config.model_type) == ("LlamaForCausalLM", "llama")
    assert config.head_dim == 32
    assert (config.num_attention_heads, config.num_key_value_heads) == (8, 2)
    assert config.norm_eps == 1e-6
    assert config.rope_theta == 10000.0 and config.rope_scaling is None
    assert config.tie_word_embeddings is False
    assert config.torch_dtype == "bfloat16"
    assert config.bos_token_id == 1
    # generation_config.json adds end-of-turn ids without repeating config.json's.
    assert config.eos_token_ids == (2, 7) and config.eos_token_id == 2
    assert config.max_model_len == 4096


def test_old_and_new_rope_spellings_agree():
    old = {**LLAMA_JSON, "rope_theta": 500000.0,
           "rope_scaling": {**{k: v for k, v in LLAMA3.items() if k != "rope_type"},
                            "type": "llama3"}}
    new = {**LLAMA_JSON, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}
    for raw in (old, new):
        config = ModelConfig.from_dict(raw)
        assert config.rope_theta == 500000.0
        assert config.rope_scaling == LLAMA3


def test_unsupported_rope_type_is_named():
    raw = {**LLAMA_JSON, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict(raw)
    assert str(info.value) == (
        "unsupported rope_scaling type 'yarn'; supported: default, linear, llama3, longrope"
    )


def test_longrope_fills_in_its_cos_sin_scale_and_caps_the_context():
    phi3 = {**LLAMA_JSON, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "su", "short_factor": [1.0] * 16,
                             "long_factor": [2.0] * 16}}
    config = ModelConfig.from_dict(phi3)
    assert config.rope_scaling["rope_type"] == "longrope"
    assert config.rope_scaling["attention_factor"] == math.sqrt(1 + math.log(32) / math.log(4096))
    assert config.max_model_len == 4096


def test_partial_rotary_embeddings_are_refused():
    phi4_mini = {**LLAMA_JSON, "rope_parameters": {"rope_type": "default",
                                                   "partial_rotary_factor": 0.75}}
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict(phi4_mini)
    assert str(info.value) == (
        "partial rotary embeddings (partial_rotary_factor 0.75) are not supported; supported: "
        "rotary embeddings over the whole head")


def test_opt_fields_and_default_tied_embeddings():
    raw = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 50272,
           "hidden_size": 768, "ffn_dim": 3072, "num_hidden_layers": 12,
           "num_attention_heads": 12, "max_position_embeddings": 2048,
           "activation_function": "relu"}
    config = ModelConfig.from_dict(raw)
    assert config.intermediate_size == 3072
    assert config.num_key_value_heads == 12 and config.head_dim == 64
    assert config.hidden_act == "relu" and config.norm_eps == 1e-5
    assert config.tie_word_embeddings is True


def test_sliding_window_caps_max_model_len():
    mistral = {**LLAMA_JSON, "architectures": ["MistralForCausalLM"], "sliding_window": 1024}
    assert ModelConfig.from_dict(mistral).max_model_len == 1024
    qwen2 = {**mistral, "use_sliding_window": False}
    assert ModelConfig.from_dict(qwen2).max_model_len == 4096


def test_bytes_per_block():
    config = ModelConfig.from_dict(LLAMA_JSON)
    # K and V x 3 layers x 2 KV heads x 32 dims x 16 tokens x 2 bytes.
    assert config.bytes_per_block(16, "bfloat16") == 2 * 3 * 2 * 32 * 16 * 2
    assert config.bytes_per_block(16, torch.float32) == 2 * 3 * 2 * 32 * 16 * 4


def test_bad_shapes_and_dtypes_are_named():
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict({**LLAMA_JSON, "num_key_value_heads": 3})
    assert str(info.value) == (
        "num_attention_heads 8 must be a multiple of num_key_value_heads 3"
    )
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict({**LLAMA_JSON, "num_hidden_layers": 0})
    assert str(info.value) == "config num_hidden_layers must be a positive integer, got 0"
    with pytest.raises(ModelLoadError) as info:
        parse_dtype("float8")
    assert str(info.value) == (
        "unsupported dtype 'float8'; choose one of float32, bfloat16, float16"
    )


def test_missing_config_json_is_named(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_pretrained(tmp_path)
    assert str(info.value) == f"no config.json in {tmp_path}"
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json is not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)


def test_llama3_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = LlamaConfig(hidden_size=256, num_attention_heads=8, rope_scaling=dict(LLAMA3))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    plain = rope_inv_freq(32, 10000.0, None)
    ours = rope_inv_freq(32, 10000.0, LLAMA3)

    torch.testing.assert_close(ours, expected.float())
    wavelen = 2 * math.pi / plain
    # The config reaches all three regimes: kept, divided by the factor, interpolated.
    assert torch.equal(ours[wavelen < 8], plain[wavelen < 8])
    assert torch.equal(ours[wavelen > 32], plain[wavelen > 32] / 4.0)
    between = (wavelen >= 8) & (wavelen <= 32)
    assert between.any() and not torch.isclose(ours[between], plain[between]).any()


def test_llama3_scaled_model_matches_transformers_past_original_length(tmp_path):
    path = make_checkpoint(tmp_path, "llama", rope_scaling=dict(LLAMA3), rope_theta=10000.0)
    model, config = load_model(path, dtype="float32")
    assert config.rope_scaling == LLAMA3
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, config.vocab_size, (48,), generator=gen).tolist()

    ours = PagedHarness(model, config).step([(0, prompt)])[0]

    torch.testing.assert_close(ours, hf_logits(load_hf_model(path), prompt), atol=1e-4, rtol=0)
