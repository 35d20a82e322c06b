"""GGUF tensors → Hugging Face-named weights, one tensor at a time from the memory map.

``gguf_tensors`` is the per-tensor hook: each ``GGUFTensor`` carries the raw data still in its
GGUF type (quantized blocks included), the Hugging Face name and shape it stands for, and the
row order that undoes llama.cpp's rope permutation. ``load_weights`` hands each one, unread, to
its parameter's ``WeightSlot``: the default slot dequantizes it to float32 on the way in (so the
only full copy of the model is its parameters), and a quantized layer's slot (from its
``checkpoint_slots``) can take the raw blocks instead.

llama.cpp's converter reorders the rows of a Llama model's Q and K projections, within each
head, from the two rotated halves of Hugging Face's rotary layout to interleaved pairs (the
layout its own rope kernel reads). Row ``(head, i, half)`` of the file is row ``(head, half,
i)`` of the checkpoint (biases too); ``hf_row_order`` inverts it. Qwen2, Qwen3 and Phi-3
files are converted unpermuted. A family's stacked tensors (Phi-3's ``attn_qkv``, ``ffn_up``)
are split into their parts as rows of raw blocks (``fused_weights.py``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pagedserve.common.process_memory import drop_mapped_pages
from pagedserve.server.models.fused_weights import split_fused
from pagedserve.server.models.gguf_config import ROPE_TENSORS
from pagedserve.server.models.model_config import ModelConfig
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.registry import get_model_class

# llama.cpp tensor name (after "blk.N.") → Hugging Face name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "self_attn.qkv_proj",
}
# Where an architecture's file uses a name for another module: Phi-3's ffn_up stacks gate
# and up, as its checkpoint's gate_up_proj does.
_ARCH_LAYER_NAMES = {"Phi3ForCausalLM": {"ffn_up": "mlp.gate_up_proj"}}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_TOP = re.compile(r"(\w+)\.(weight|bias)")
# The architectures whose Q/K rows llama.cpp's converter permutes.
_ROPE_PERMUTED = frozenset({"LlamaForCausalLM"})


def hf_name(gguf_name: str, architecture: str = "") -> str:
    """The Hugging Face name of a llama.cpp tensor name; an unknown name comes back as is
    (and the loader reports it as unexpected)."""
    match = _LAYER.fullmatch(gguf_name)
    names = _LAYER_NAMES | _ARCH_LAYER_NAMES.get(architecture, {})
    if match and match.group(2) in names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{names[part]}.{kind}"
    match = _TOP.fullmatch(gguf_name)
    if match and match.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"
    return gguf_name


def hf_row_order(rows: int, num_heads: int) -> torch.Tensor:
    """``hf = gguf[order]`` for a rope-permuted projection of ``rows`` rows."""
    half = rows // num_heads // 2
    return torch.arange(rows).view(num_heads, half, 2).transpose(1, 2).reshape(-1)


class MappedPages:
    """The pages of the file map that loading keeps in the resident set: those of the last
    ``window`` tensors whose data was handed out (a projection reads up to three at once);
    an older tensor's whole pages are unmapped (``drop_mapped_pages``). Reading that tensor
    again maps them again from the page cache, so this bounds the memory, never what is read:
    without it every tensor read stays resident beside its repacked copy until the load ends,
    and the peak holds the file twice."""

    def __init__(self, window: int = 8) -> None:
        self.window = window
        self._recent: deque[np.ndarray] = deque()

    def handed_out(self, data: np.ndarray) -> None:
        if any(data is seen for seen in self._recent):
            return
        self._recent.append(data)
        while len(self._recent) > self.window:
            self.drop(self._recent.popleft())

    @staticmethod
    def drop(data: np.ndarray) -> None:
        drop_mapped_pages(data.ctypes.data, data.nbytes)


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor as the file stores it.

    ``data`` is the memory-mapped numpy array in ``tensor_type``'s layout (for a quantized
    type, ``uint8`` rows of blocks), handed out through ``pages`` where there is one;
    ``shape`` is the Hugging Face shape (rows first: the reverse of GGUF's); ``row_order``
    (or None) reorders rows into the Hugging Face layout, which works on rows of quantized
    blocks too."""

    name: str
    gguf_name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    mapped: np.ndarray
    shape: tuple[int, ...]
    row_order: torch.Tensor | None = None
    pages: MappedPages | None = None

    @property
    def data(self) -> np.ndarray:
        if self.pages is not None:
            self.pages.handed_out(self.mapped)
        return self.mapped

    def get_shape(self) -> tuple[int, ...]:
        return self.shape

    def rows(self, name: str, start: int, size: int) -> GGUFTensor:
        """Rows ``start : start + size`` under the Hugging Face ``name`` of the part they
        hold; rows of quantized blocks stay raw."""
        if self.row_order is not None:
            raise ModelLoadError(f"GGUF tensor {self.gguf_name!r} is stored rope-permuted and "
                                 f"cannot be split into {name!r}")
        return GGUFTensor(name, self.gguf_name, self.tensor_type,
                          self.mapped[start : start + size], (size, *self.shape[1:]),
                          pages=self.pages)

    def __getitem__(self, index: Any) -> torch.Tensor:
        # A TensorSource: a tensor-parallel rank slices the dequantized tensor.
        return self.dequantize()[index]

    def dequantize(self) -> torch.Tensor:
        """float32, Hugging Face layout."""
        from gguf.quants import dequantize

        try:
            values = dequantize(self.data, self.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise ModelLoadError(
                f"GGUF tensor {self.gguf_name!r} of type {self.tensor_type.name} cannot be "
                f"dequantized: {exc}"
            ) from exc
        values = np.asarray(values, dtype=np.float32)
        # Dequantized values are a fresh array to adopt; float32 data is a read-only view of
        # the memory map, to copy.
        tensor = torch.from_numpy(values) if values.flags.writeable else torch.tensor(values)
        tensor = tensor.reshape(self.shape)
        return tensor if self.row_order is None else tensor[self.row_order]


def _permuted_heads(config: ModelConfig, name: str) -> int | None:
    """The head count a Q/K tensor (weight or bias) was permuted with, else None."""
    if config.architecture not in _ROPE_PERMUTED:
        return None
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return config.num_attention_heads
    if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        return config.num_key_value_heads
    return None


def _dequantizes(kind: Any) -> bool:
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    _, size = GGML_QUANT_SIZES.get(kind, (1, 1))
    try:
        dequantize(np.zeros((1, size), dtype=np.uint8), kind)
    except (NotImplementedError, ValueError):
        return False
    return True


def check_tensor_types(reader: Any) -> None:
    """Refuses, before anything is loaded, a tensor type ``gguf`` cannot dequantize, naming
    the first tensor of that type and the types that load."""
    from gguf import GGMLQuantizationType

    checked: set[Any] = set()
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind in checked:
            continue
        if not _dequantizes(kind):
            readable = [t.name for t in GGMLQuantizationType if _dequantizes(t)]
            raise ModelLoadError(
                f"GGUF tensor {tensor.name!r} has type {kind.name}, which cannot be "
                f"dequantized; supported: {', '.join(readable)}"
            )
        checked.add(kind)


def _stored_tensors(reader: Any, config: ModelConfig,
                    pages: MappedPages) -> Iterator[tuple[str, GGUFTensor]]:
    for tensor in reader.tensors:
        if tensor.name in ROPE_TENSORS:
            continue  # read into the config's rope scaling
        name = hf_name(tensor.name, config.architecture)
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        heads = _permuted_heads(config, name)
        order = None
        if heads is not None and shape and shape[0] == heads * config.head_dim:
            order = hf_row_order(shape[0], heads)
        yield name, GGUFTensor(name, tensor.name, tensor.tensor_type, tensor.data, shape, order,
                               pages)


def gguf_tensors(reader: Any, config: ModelConfig,
                 pages: MappedPages | None = None) -> Iterator[GGUFTensor]:
    """Every weight of the file, unread, a fused one split into its parts: the hook a
    quantized loader takes raw blocks from. Their data is handed out through ``pages`` (the
    caller's, else one for this pass)."""
    fused = get_model_class(config.architecture).fused_tensors(config)
    pages = pages if pages is not None else MappedPages()
    parts = split_fused(_stored_tensors(reader, config, pages), fused, config.architecture,
                        cut=lambda name, tensor, start, size: tensor.rows(name, start, size))
    for _, tensor in parts:
        yield tensor


def gguf_weights(reader: Any, config: ModelConfig) -> Iterator[tuple[str, GGUFTensor]]:
    """(Hugging Face name, tensor) pairs for ``load_weights``: a tensor is dequantized only
    when its slot reads it, after its shape has been checked."""
    check_tensor_types(reader)
    for tensor in gguf_tensors(reader, config):
        yield tensor.name, tensor
