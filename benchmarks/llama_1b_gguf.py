"""Random Llama-3.2-1B-shaped GGUF files made by llama.cpp's own tools, as a user gets them.

The checkpoint has Llama 3.2 1B's shape (hidden 2048, 16 layers, 32 query and 8 KV heads,
intermediate 8192, tied embeddings, llama3 rope scaling) on SmolLM2's vocabulary (49,152 ids,
its tokenizer exported from the ``smollm2`` GGUF file), with seeded random weights (normal,
std 0.02; norms 1) written as bfloat16 safetensors. llama.cpp's ``convert_hf_to_gguf.py``
turns it into a BF16 GGUF file, and ``llama-quantize`` into each asked type (Q4_K_M, Q8_0).

The converter writes llama3 rope scaling as a ``rope_freqs.weight`` tensor; with
``--no-rope-freqs`` (the default while the loader refuses that tensor) the BF16 file is
rewritten without it before quantizing. Rope scaling changes no step's cost, only which
frequencies the rotary tables hold.

    python -m benchmarks.llama_1b_gguf --llama-server PATH [--out DIR] [--types Q4_K_M,Q8_0]

Files are reused when present: ``DIR/llama-1b-random-{TYPE}.gguf``. Prints their paths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.vs_peers import find_tool

if TYPE_CHECKING:
    import torch

SHAPE = {
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 8192, "head_dim": 64,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
DEFAULT_DIR = Path.home() / ".cache" / "pagedserve-peers" / "llama-1b-random"
ROPE_FREQS = "rope_freqs.weight"
INIT_STD = 0.02


def write_checkpoint(out: Path, seed: int = 0) -> Path:
    """The random checkpoint with SmolLM2's tokenizer, as a Hugging Face directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    from pagedserve.server.models.model_path import smollm2_path

    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    smollm2 = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    tokenizer.save_pretrained(out)
    config = LlamaConfig(**SHAPE, vocab_size=len(tokenizer), torch_dtype="bfloat16",
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    generator = torch.Generator().manual_seed(seed)
    tensors = {"model.embed_tokens.weight": _normal(config.vocab_size, config.hidden_size,
                                                     generator),
               "model.norm.weight": torch.ones(config.hidden_size, dtype=torch.bfloat16)}
    for layer in range(config.num_hidden_layers):
        tensors.update(_layer(config, layer, generator))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _normal(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    return (torch.randn(rows, cols, generator=generator) * INIT_STD).to(torch.bfloat16)


def _layer(config: Any, layer: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    prefix = f"model.layers.{layer}."
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
              "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q),
              "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    tensors = {f"{prefix}{name}.weight": _normal(*shape, generator)
               for name, shape in shapes.items()}
    for norm in ("input_layernorm", "post_attention_layernorm"):
        tensors[f"{prefix}{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    return tensors


def llama_cpp_source(llama_server: Path) -> Path:
    """The llama.cpp source tree that built ``llama_server`` (``src/build/bin/...``)."""
    return llama_server.resolve().parents[2]


def convert(checkpoint: Path, out: Path, src: Path) -> Path:
    """llama.cpp's converter: the checkpoint as a BF16 GGUF file."""
    if not out.is_file():
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(checkpoint),
                        "--outtype", "bf16", "--outfile", str(out)], check=True,
                       env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
    return out


def drop_tensor(source: Path, out: Path, name: str, src: Path) -> Path:
    """``source`` rewritten without tensor ``name`` (metadata and other tensors as they are),
    with the gguf package of llama.cpp's tree."""
    if out.is_file():
        return out
    script = _DROP_TENSOR.format(source=str(source), out=str(out), name=name)
    subprocess.run([sys.executable, "-c", script], check=True,
                   env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
    return out


_DROP_TENSOR = """
import gguf
reader = gguf.GGUFReader({source!r})
arch = reader.fields["general.architecture"].contents()
writer = gguf.GGUFWriter({out!r}, arch=arch)
for field in reader.fields.values():
    if field.name == "general.architecture" or field.name.startswith("GGUF."):
        continue
    kind = field.types[0]
    sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
for t in reader.tensors:
    if t.name != {name!r}:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
"""


def quantize(source: Path, out: Path, kind: str, quantizer: Path) -> Path:
    if not out.is_file():
        subprocess.run([str(quantizer), str(source), str(out), kind], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def build_files(llama_server: Path, out_dir: Path = DEFAULT_DIR,
                types: tuple[str, ...] = ("Q4_K_M", "Q8_0"),
                keep_rope_freqs: bool = False) -> dict[str, Path]:
    """The GGUF file of each type in ``types`` (made once, then reused)."""
    src = llama_cpp_source(llama_server)
    checkpoint = write_checkpoint(out_dir / "hf")
    bf16 = convert(checkpoint, out_dir / "llama-1b-random-BF16-rope-freqs.gguf", src)
    if not keep_rope_freqs:
        bf16 = drop_tensor(bf16, out_dir / "llama-1b-random-BF16.gguf", ROPE_FREQS, src)
    suffix = "-rope-freqs" if keep_rope_freqs else ""
    quantizer = llama_server.resolve().with_name("llama-quantize")
    return {kind: quantize(bf16, out_dir / f"llama-1b-random-{kind}{suffix}.gguf", kind,
                           quantizer)
            for kind in types}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", help="llama.cpp's llama-server; llama-quantize and "
                                               "the converter are taken from its tree")
    parser.add_argument("--out", default=str(DEFAULT_DIR))
    parser.add_argument("--types", default="Q4_K_M,Q8_0")
    parser.add_argument("--keep-rope-freqs", action="store_true",
                        help="keep the converter's rope_freqs.weight tensor")
    args = parser.parse_args(argv)
    llama, why = find_tool(args.llama_server, "llama-server")
    if llama is None:
        parser.error(f"llama-server: {why}")
    files = build_files(llama, Path(args.out), tuple(args.types.split(",")),
                        args.keep_rope_freqs)
    print(json.dumps({kind: str(path) for kind, path in files.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
