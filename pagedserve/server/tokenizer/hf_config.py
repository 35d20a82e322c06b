"""What a Hugging Face checkpoint says about its tokenizer besides ``tokenizer.json``.

Read from ``tokenizer_config.json`` (named special tokens as strings or AddedToken objects,
``split_special_tokens``, ``chat_template``), with ``special_tokens_map.json`` filling named
tokens the config leaves out and a ``chat_template.jinja`` file taking precedence over the
config's template, the order transformers loads them in.

``add_bos_token`` / ``add_eos_token`` are not read: when ``tokenizer.json`` exists transformers
ignores them too, and its post-processor alone decides what encoding adds (transformers writes
the two consistently when it saves a tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedserve.server.tokenizer.chat_template import checked_chat_template
from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

SPECIAL_TOKEN_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)


@dataclass(frozen=True, slots=True)
class HFTokenizerConfig:
    """The tokenizer settings of one checkpoint directory."""

    special_tokens: Mapping[str, str] = field(default_factory=dict)
    split_special_tokens: bool = False
    chat_template: str | None = None


def read_hf_tokenizer_config(model_dir: Path) -> HFTokenizerConfig:
    """The settings in ``model_dir``; files that are absent contribute nothing."""
    config = _read_json(model_dir / CONFIG_FILE)
    tokens_map = _read_json(model_dir / SPECIAL_TOKENS_MAP_FILE)
    special_tokens = {}
    for key in SPECIAL_TOKEN_KEYS:
        text = _token_text(config.get(key), CONFIG_FILE, key)
        if text is None and key not in config:
            text = _token_text(tokens_map.get(key), SPECIAL_TOKENS_MAP_FILE, key)
        if text is not None:
            special_tokens[key] = text
    return HFTokenizerConfig(
        special_tokens=special_tokens,
        split_special_tokens=_bool(config, "split_special_tokens"),
        chat_template=checked_chat_template(_chat_template(model_dir, config), str(model_dir)),
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: object, source: str, key: str) -> str | None:
    # transformers saves a named token either as its text or as an AddedToken object.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerLoadError(
        f"{source}: {key} must be a string or an AddedToken object, got {value!r}"
    )


def _bool(config: Mapping[str, Any], key: str) -> bool:
    value = config.get(key, False)
    if isinstance(value, bool):
        return value
    raise TokenizerLoadError(f"{CONFIG_FILE}: {key} must be true or false, got {value!r}")


def _chat_template(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    template_file = model_dir / CHAT_TEMPLATE_FILE
    if template_file.is_file():
        return template_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    # A list of named templates: the one called "default" is the chat template.
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise TokenizerLoadError(
        f"{CONFIG_FILE}: chat_template must be a string or a list of named templates with a "
        f"'default' one, got {type(template).__name__}"
    )
