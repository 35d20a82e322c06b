"""Tokenizers (Hugging Face ``tokenizer.json`` or tiktoken), streaming detokenization and
chat templates, behind one ``Tokenizer`` interface."""

from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer
from pagedserve.server.tokenizer.loader import load_tokenizer

__all__ = [
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerLoadError",
    "load_tokenizer",
]
