"""Errors raised while reading a model's config and weights."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model directory cannot be served as given: a bad config, an unsupported
    architecture, missing or unexpected weights. The message names the offending value."""
