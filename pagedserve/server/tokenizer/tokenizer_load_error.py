"""The error a checkpoint's tokenizer files raise when they cannot be used."""

from __future__ import annotations

from pagedserve.common.engine_errors import PagedServeError


class TokenizerLoadError(PagedServeError):
    """A checkpoint's tokenizer files are missing, malformed or of an unsupported kind."""
