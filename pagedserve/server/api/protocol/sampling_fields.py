"""The sampling fields that completions and chat share: OpenAI's plus vLLM's extras.

Only types are checked here; ranges are checked once, by ``SamplingParams``, whose
InvalidRequestError names the parameter.
"""

from __future__ import annotations

from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.fields import Fields, is_number, show, type_error
from pagedserve.server.api.protocol.structured import read_structured_outputs

_FLOATS = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
    "repetition_penalty",
    "length_penalty",
)
_INTS = ("n", "best_of", "top_k", "min_tokens", "prompt_logprobs")
_BOOLS = (
    "ignore_eos",
    "use_beam_search",
    "include_stop_str_in_output",
    "skip_special_tokens",
)
# torch generators take seeds up to 2**64 - 1 and the engine offsets a request's seed by
# the sample index, so seeds stay well inside that.
MAX_SEED = 2**63 - 1


def read_sampling_fields(fields: Fields, *, response_format: bool = True) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for the sampling members present in the body;
    ``response_format`` is read unless the endpoint names its format otherwise."""
    kwargs: dict[str, Any] = {}
    for name in _FLOATS:
        kwargs[name] = fields.number(name)
    for name in _INTS:
        kwargs[name] = fields.integer(name)
    for name in _BOOLS:
        if fields.has(name):
            kwargs[name] = fields.boolean(name, False)
    kwargs["seed"] = fields.integer("seed", minimum=0, maximum=MAX_SEED)
    kwargs["stop"] = fields.strings("stop")
    kwargs["stop_token_ids"] = fields.integers("stop_token_ids")
    kwargs["allowed_token_ids"] = fields.integers("allowed_token_ids")
    kwargs["bad_words"] = fields.strings("bad_words")
    kwargs["logit_bias"] = read_logit_bias(fields.raw("logit_bias"))
    kwargs["structured_outputs"] = read_structured_outputs(fields,
                                                           response_format=response_format)
    # vLLM's detokenizer for fast tokenizers has no use for this one either.
    fields.boolean("spaces_between_special_tokens", True)
    _read_priority(fields)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if kwargs.get("use_beam_search") and "temperature" not in kwargs:
        kwargs["temperature"] = 0.0  # beam search is deterministic; spare clients saying so
    return kwargs


def _read_priority(fields: Fields) -> None:
    """vLLM's ``priority`` matters only to its priority scheduler; under first-come,
    first-served (vLLM's default, and the only policy here) it must be 0, as there."""
    priority = fields.integer("priority", 0)
    if priority != 0:
        raise InvalidRequestError(
            f"priority {priority} needs priority scheduling, which this server does not run "
            "(requests are served first come, first served); send priority 0 or leave it out",
            param="priority")


def read_logit_bias(value: Any) -> dict[int, float] | None:
    """OpenAI's ``{"token id as a string": bias}`` map, keys parsed to ints."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise type_error("logit_bias", "an object mapping token ids to numbers", value)
    bias: dict[int, float] = {}
    for key, weight in value.items():
        if not (key.isascii() and key.isdigit()):
            raise InvalidRequestError(
                f"logit_bias keys must be token ids (non-negative integers), got {show(key)}",
                param="logit_bias",
            )
        if not is_number(weight):
            raise type_error("logit_bias", "an object mapping token ids to numbers",
                             {key: weight})
        bias[int(key)] = float(weight)
    return bias
