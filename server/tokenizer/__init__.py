"""Tokenizers (Hugging Face ``tokenizer.json`` or tiktoken), streaming detokenization, stop
strings and chat templates, behind one ``Tokenizer`` interface."""

from pagedserve.server.tokenizer.base import Tokenizer, TokenizerLoadError
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer
from pagedserve.server.tokenizer.loader import load_tokenizer
from pagedserve.server.tokenizer.stop_checker import StopChecker

__all__ = [
    "IncrementalDetokenizer",
    "StopChecker",
    "Tokenizer",
    "TokenizerLoadError",
    "load_tokenizer",
]
