"""Checkpoint tensors → model parameters: safetensors files (sharded through
``model.safetensors.index.json`` or not), and the placement of each tensor, packed
projections and tensor-parallel shards included: a rank reads only its own part of each
tensor. A missing, unexpected, duplicated or misshapen weight is an error that names it."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from pagedserve.server.models.base import CausalLM
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.weight_slot import TensorSource, WeightSlot, source_shape

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files to read: the index's shards if there is an index, else every
    ``*.safetensors`` in the directory."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} has no valid 'weight_map': {exc!r}") from exc
        files = sorted({model_dir / name for name in weight_map.values()})
        for path in files:
            if not path.is_file():
                raise ModelLoadError(f"{index} names shard {path.name!r}, which is missing")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors weights in {model_dir} (only safetensors checkpoints load)"
        )
    return files


def iterate_weights(files: Iterable[Path]) -> Iterator[tuple[str, TensorSource]]:
    """(name, unread slice) for every tensor of every file. The caller reads only the part it
    needs (a tensor-parallel rank its shard) before asking for the next tensor: the file stays
    open only until then."""
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                yield name, handle.get_slice(name)


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def weight_slots(model: nn.Module) -> tuple[dict[str, WeightSlot], set[str]]:
    """Checkpoint name → slot, plus the names that alias an already-listed parameter (tied
    embeddings), which a checkpoint may carry and which need no loading."""
    slots: dict[str, WeightSlot] = {}
    aliases: set[str] = set()
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                aliases.add(_join(module_name, param_name))
                continue
            seen.add(id(param))
            if hasattr(module, "checkpoint_slots"):
                slots.update(module.checkpoint_slots(module_name, param_name))
            else:
                slots[_join(module_name, param_name)] = WeightSlot(param)
    return slots, aliases


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_weights(
    model: CausalLM, weights: Iterable[tuple[str, torch.Tensor | TensorSource]], source: str
) -> None:
    """Every check ``load_weights`` makes, reading no tensor: run on the model built on the
    meta device, it refuses a bad checkpoint before any memory is allocated."""
    _place(model, weights, source, load=False)


def load_weights(
    model: CausalLM, weights: Iterable[tuple[str, torch.Tensor | TensorSource]], source: str,
    placed: Collection[str] = (),
) -> None:
    """Copies every checkpoint tensor, or the part of it this rank holds, into its slot
    (casting to the parameter's dtype). Names in ``placed`` were put in place by another
    loader (a quantized projection built from the file's blocks) and are skipped."""
    _place(model, weights, source, load=True, placed=placed)


def released(model: nn.Module, slots: dict[str, WeightSlot]) -> frozenset[str]:
    """The checkpoint names among ``slots`` whose parameters ``model`` no longer holds (a
    projection or embedding that a quantized loader replaced)."""
    held = {id(p) for p in model.parameters()}
    return frozenset(name for name, slot in slots.items() if id(slot.param) not in held)


def _place(
    model: CausalLM, weights: Iterable[tuple[str, torch.Tensor | TensorSource]], source: str,
    load: bool, placed: Collection[str] = (),
) -> None:
    slots, aliases = weight_slots(model)
    architecture = type(model).__name__
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in weights:
        target = model.map_checkpoint_name(name)
        if target is None or target in aliases or target in placed:
            continue
        slot = slots.get(target)
        if slot is None:
            unexpected.append(name)
            continue
        if target in loaded:
            raise ModelLoadError(f"checkpoint {source} holds weight {name!r} twice")
        shape = source_shape(tensor)
        if shape != slot.shape():
            raise ModelLoadError(
                f"checkpoint {source} weight {name!r} has shape {list(shape)}, "
                f"{architecture} expects {list(slot.shape())}"
            )
        if load:
            slot.load(tensor)
        loaded.add(target)
    if unexpected:
        raise ModelLoadError(
            f"checkpoint {source} has {_count(len(unexpected), 'unexpected weight')} for "
            f"{architecture}: {_names(sorted(unexpected))}"
        )
    missing = sorted(set(slots) - loaded)
    if missing:
        raise ModelLoadError(
            f"checkpoint {source} is missing {_count(len(missing), 'weight')} of "
            f"{architecture}: {_names(missing)}"
        )
