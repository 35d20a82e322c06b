"""GGUF files written from tiny checkpoints: the same config and weights as the checkpoint, and
greedy tokens equal to transformers' float32 model loaded from the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.llm import LLM
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.source import load_config
from tests.checkpoints import make_checkpoint
from tests.gguf_files import write_gguf

PROMPTS, PROMPT_LEN, NEW_TOKENS = 20, 8, 32
# name → (family, qtype, tokenizer, random blocks, checkpoint overrides)
FILES = {
    "llama-f32": ("llama", "F32", "gpt2", False, {}),
    "llama-q8_0-tied": ("llama", "Q8_0", "spm", False, {"tie_word_embeddings": True}),
    "qwen2-q8_0": ("qwen2", "Q8_0", "gpt2", False, {}),
    # Q4_K blocks need rows of 256; gguf cannot quantize to it, so the blocks are random.
    "llama-q4_k": ("llama", "Q4_K", "spm", True,
                   {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1}),
}


@pytest.fixture
def one_thread():
    """The engine sets torch's thread count; one thread keeps these tiny models fast on a
    busy machine, and the suite's own count comes back afterwards."""
    threads = torch.get_num_threads()
    yield 1
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name → (checkpoint directory, GGUF file)."""
    root = tmp_path_factory.mktemp("gguf")
    made = {}
    for name, (family, qtype, tokenizer, random_blocks, overrides) in FILES.items():
        checkpoint = make_checkpoint(root / name, family, **overrides)
        made[name] = checkpoint, write_gguf(root / f"{name}.gguf", checkpoint, qtype=qtype,
                                            tokenizer=tokenizer, random_blocks=random_blocks)
    return made


def test_config_equals_the_checkpoints(files) -> None:
    for name, (checkpoint, gguf_file) in files.items():
        ours, reference = load_config(gguf_file), load_config(checkpoint)
        for field in ("architecture", "vocab_size", "hidden_size", "intermediate_size",
                      "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "head_dim", "max_position_embeddings", "rope_theta", "rope_scaling",
                      "tie_word_embeddings"):
            assert getattr(ours, field) == getattr(reference, field), (name, field)
        assert ours.norm_eps == pytest.approx(reference.norm_eps, rel=1e-6)  # stored as f32
        assert ours.eos_token_ids == (2,)


def test_rope_scaling_from_the_metadata(files, tmp_path: Path) -> None:
    checkpoint, _ = files["llama-f32"]
    linear = write_gguf(tmp_path / "linear.gguf", checkpoint, metadata={
        "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    assert load_config(linear).rope_scaling == {"rope_type": "linear", "factor": 4.0}
    yarn = write_gguf(tmp_path / "yarn.gguf", checkpoint, metadata={
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    with pytest.raises(ModelLoadError) as info:
        load_config(yarn)
    assert str(info.value) == (
        "GGUF rope scaling 'yarn' (factor 4.0) is not supported; supported: linear with a "
        "factor")


@pytest.mark.parametrize("biases", [False, True])
def test_float32_weights_equal_the_checkpoints_after_the_rope_permutation(
        files, tmp_path: Path, biases: bool) -> None:
    checkpoint, gguf_file = files["llama-f32"]
    if biases:  # Llama with projection biases: llama.cpp permutes the Q/K biases too
        checkpoint = make_checkpoint(tmp_path / "ckpt", "llama", attention_bias=True,
                                     mlp_bias=True)
        gguf_file = write_gguf(tmp_path / "bias.gguf", checkpoint)
    from_gguf, _ = load_model(gguf_file, dtype="float32")
    from_checkpoint, _ = load_model(checkpoint, dtype="float32")
    reference = from_checkpoint.state_dict()
    for name, value in from_gguf.state_dict().items():
        assert torch.equal(value, reference[name]), name


def test_raw_blocks_reorder_as_the_dequantized_rows(files) -> None:
    """The hook a quantized loader takes: raw Q8_0 rows, in the file's order, reordered by
    ``row_order`` before dequantizing give the same weight as the dequantized tensor."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from pagedserve.common.gguf_file import open_gguf
    from pagedserve.server.models.gguf_weights import gguf_tensors

    _, gguf_file = files["llama-q8_0-tied"]
    tensors = {t.name: t for t in gguf_tensors(open_gguf(gguf_file), load_config(gguf_file))}
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert (q.gguf_name, q.tensor_type, q.shape) == (
        "blk.0.attn_q.weight", GGMLQuantizationType.Q8_0, (64, 64))
    assert q.data.dtype == np.uint8 and q.row_order is not None
    raw_rows = q.data[q.row_order.numpy()]
    assert torch.equal(torch.from_numpy(dequantize(raw_rows, q.tensor_type)), q.dequantize())
    assert tensors["model.layers.0.self_attn.v_proj.weight"].row_order is None


def _transformers_greedy(gguf_file: Path, prompts: torch.Tensor) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32).eval()
    ids = prompts
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(ids).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompts.shape[1]:].tolist()


@pytest.mark.parametrize("name", sorted(FILES))
def test_greedy_tokens_equal_transformers_on_the_same_file(files, name: str,
                                                         one_thread: int) -> None:
    _, gguf_file = files[name]
    vocab = load_config(gguf_file).vocab_size
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, vocab, (PROMPTS, PROMPT_LEN), generator=gen)
    llm = LLM(str(gguf_file), dtype="float32", kernel_backend="torch", num_kv_blocks=256,
              cpu_threads=one_thread)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts.tolist()],
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outputs]
    assert ours == _transformers_greedy(gguf_file, prompts)
