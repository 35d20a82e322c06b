"""Token sampling for the engine: per-request parameters, one vectorised pass per step."""

from pagedserve.server.sampling.metadata import SamplingMetadata
from pagedserve.server.sampling.sampler import Sampler, SamplerOutput
from pagedserve.server.sampling.sampling_row import SamplingRow
from pagedserve.server.sampling.stop_conditions import FinishReason, StopChecker, check_stop_token
from pagedserve.server.sampling.validation import validate_token_ids

__all__ = [
    "FinishReason",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingRow",
    "StopChecker",
    "check_stop_token",
    "validate_token_ids",
]
