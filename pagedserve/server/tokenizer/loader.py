"""Pick a checkpoint's tokenizer by the files in its directory."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.hf import TOKENIZER_FILE, HFTokenizer
from pagedserve.server.tokenizer.tiktoken_tokenizer import TIKTOKEN_FILE, TiktokenTokenizer


def load_tokenizer(model_dir: str | PathLike[str]) -> Tokenizer:
    """The tokenizer of ``model_dir``: ``tokenizer.json`` first, then ``tiktoken.json``.

    Raises TokenizerLoadError naming the directory when it holds neither.
    """
    path = Path(model_dir)
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
