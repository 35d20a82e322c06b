"""Typed reads of a JSON request body, with OpenAI-style 400s for anything off.

Every read consumes its key, so after the endpoint has read what it knows ``finish()``
rejects the leftovers by name (as OpenAI does) instead of silently ignoring a typo.
JSON ``null`` counts as absent: the OpenAI API accepts null for every optional field.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import orjson

from pagedserve.common.engine_errors import InvalidRequestError

_MAX_SHOWN = 80


_BEYOND_64_BITS = 2.0**63  # orjson parses integers outside [-2**63, 2**64) as floats


def show(value: Any) -> str:
    """``value`` as JSON text, shortened for an error message."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_error(name: str, expected: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(f"{name} must be {expected}, got {show(value)}", param=name)


class Fields:
    """The members of one JSON object, read once each."""

    def __init__(self, body: Any, prefix: str = "") -> None:
        if not isinstance(body, dict):
            what = prefix.rstrip(".") or "the request body"
            raise InvalidRequestError(f"{what} must be a JSON object, got {show(body)}",
                                      param=prefix.rstrip(".") or None)
        self._body: dict[str, Any] = dict(body)
        # Errors name nested members by their path, e.g. ``stream_options.include_usage``.
        self._prefix = prefix

    def has(self, name: str) -> bool:
        return self._body.get(name) is not None

    def raw(self, name: str) -> Any:
        return self._body.pop(name, None)

    @overload
    def string(self, name: str, default: None = None, *, required: Literal[True],
               choices: tuple[str, ...] | None = None) -> str: ...

    @overload
    def string(self, name: str, default: str, *, required: bool = False,
               choices: tuple[str, ...] | None = None) -> str: ...

    @overload
    def string(self, name: str, default: None = None, *, required: bool = False,
               choices: tuple[str, ...] | None = None) -> str | None: ...

    def string(self, name: str, default: str | None = None, *, required: bool = False,
               choices: tuple[str, ...] | None = None) -> str | None:
        value = self._required(name) if required else self.raw(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise type_error(self._prefix + name, "a string", value)
        if choices is not None and value not in choices:
            raise type_error(self._prefix + name, "one of " + ", ".join(choices), value)
        return value

    def integer(self, name: str, default: int | None = None, *, minimum: int | None = None,
                maximum: int | None = None) -> int | None:
        value = self.raw(name)
        if value is None:
            return default
        if not is_int(value):
            if isinstance(value, float) and abs(value) >= _BEYOND_64_BITS:
                # JSON integers too large for 64 bits arrive as floats: out of range,
                # not of the wrong type.
                _check_range(self._prefix + name, value, minimum, maximum)
            raise type_error(self._prefix + name, "an integer", value)
        _check_range(self._prefix + name, value, minimum, maximum)
        return int(value)

    def number(self, name: str, default: float | None = None) -> float | None:
        """A float; ranges are SamplingParams' to check, so its messages stay the single
        source of truth for sampling limits."""
        value = self.raw(name)
        if value is None:
            return default
        if not is_number(value):
            raise type_error(self._prefix + name, "a number", value)
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise type_error(self._prefix + name, "a boolean", value)
        return value

    def strings(self, name: str) -> list[str] | None:
        """A string or a list of strings (OpenAI's ``stop``)."""
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise type_error(self._prefix + name, "a string or a list of strings", value)

    def integers(self, name: str) -> list[int] | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, list) and all(is_int(v) for v in value):
            return value
        raise type_error(self._prefix + name, "a list of integers", value)

    def object(self, name: str) -> Fields | None:
        value = self.raw(name)
        if value is None:
            return None
        return Fields(value, f"{self._prefix}{name}.")

    def ignore(self, *names: str) -> None:
        """Fields OpenAI defines that change nothing here (``user``, ``metadata``...)."""
        for name in names:
            self._body.pop(name, None)

    def reject(self, *names: str) -> None:
        """Fields OpenAI defines that this server does not implement: a clear 400."""
        for name in names:
            if self.raw(name) is not None:
                name = self._prefix + name
                raise InvalidRequestError(f"{name} is not supported by this server",
                                          param=name)

    def finish(self) -> None:
        for key in self._body:
            name = self._prefix + key
            raise InvalidRequestError(f"Unrecognized request argument supplied: {name}",
                                      param=name)

    def _required(self, name: str) -> Any:
        value = self.raw(name)
        if value is None:
            name = self._prefix + name
            raise InvalidRequestError(f"{name} is required", param=name)
        return value


def _check_range(name: str, value: float, minimum: int | None, maximum: int | None) -> None:
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"{name} must be at least {minimum}, got {show(value)}",
                                  param=name)
    if maximum is not None and value > maximum:
        raise InvalidRequestError(f"{name} must be at most {maximum}, got {show(value)}",
                                  param=name)
