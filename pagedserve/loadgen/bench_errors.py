"""Typed errors of the load generator; each names the offending value and its limit."""

from __future__ import annotations


class LoadgenError(Exception):
    """Base class of every error the load generator raises on purpose."""


class BenchConfigError(LoadgenError, ValueError):
    """An option value outside its allowed range, or options that cannot be combined."""

    def __init__(self, option: str, value: object, limit: str) -> None:
        super().__init__(f"{option} must be {limit}, got {value!r}")
        self.option = option
        self.value = value
        self.limit = limit


class DatasetError(LoadgenError, ValueError):
    """A dataset file that cannot be read, or prompts that cannot be built as asked."""


class TokenizerError(LoadgenError):
    """The server's /tokenize endpoint failed or answered in an unexpected shape."""


class BenchmarkAbortedError(LoadgenError):
    """The run cannot produce a meaningful result (e.g. every warm-up request failed)."""


class ResultFileError(LoadgenError, ValueError):
    """A result JSON (for ``compare``) that is missing or not a benchmark result."""
