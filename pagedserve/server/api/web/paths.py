"""Where the page lives, for the routes and for the key check."""

from __future__ import annotations

from pagedserve.common.http.static_page import STATIC_PREFIX

STATE_PATH = "/engine/state"


def is_page_path(path: str) -> bool:
    """Whether ``path`` is the page or one of its files, which need no API key."""
    return path == "/" or path.startswith(STATIC_PREFIX)
