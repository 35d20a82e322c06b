"""Pick a checkpoint's tokenizer by the files in its directory, or a GGUF file's own."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from pagedserve.common.gguf_file import is_gguf_file
from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.gguf_tokenizer import load_gguf_tokenizer
from pagedserve.server.tokenizer.hf import TOKENIZER_FILE, HFTokenizer
from pagedserve.server.tokenizer.tiktoken_tokenizer import TIKTOKEN_FILE, TiktokenTokenizer


def load_tokenizer(model_dir: str | PathLike[str]) -> Tokenizer:
    """The tokenizer of ``model_dir``: ``tokenizer.json`` first, then ``tiktoken.json``; for
    a GGUF file, the tokenizer in its metadata.

    Raises TokenizerLoadError naming the directory when it holds neither.
    """
    path = Path(model_dir)
    if is_gguf_file(path):
        return load_gguf_tokenizer(path)
    if not path.is_dir():
        raise TokenizerLoadError(f"model directory {str(path)!r} does not exist")
    if (path / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_dir(path)
    if (path / TIKTOKEN_FILE).is_file():
        return TiktokenTokenizer.from_dir(path)
    raise TokenizerLoadError(
        f"no tokenizer in {str(path)!r}: expected {TOKENIZER_FILE} (Hugging Face) or "
        f"{TIKTOKEN_FILE} (tiktoken)"
    )
