"""Whether a request can ever run: within the model's context, under the scheduler's limits
and in the device pool. The engine checks a request's context length here before the
scheduler sees it; the scheduler checks the whole when the request is added."""

from __future__ import annotations

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.engine.config.engine_config import SchedulerConfig
from pagedserve.server.engine.core.block_manager import BlockManager
from pagedserve.server.engine.core.sequence import SequenceGroup


def check_context_length(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Raise InvalidRequestError unless the prompt holds a token and leaves room for
    ``max_tokens`` more (at least one) within ``max_model_len``."""
    if num_prompt_tokens == 0:
        raise InvalidRequestError("the prompt must contain at least 1 token", param="prompt")
    if num_prompt_tokens >= max_model_len:
        # The prompt alone leaves no room: blame it, not a max_tokens the client may never
        # have sent (the default fills in at least 1).
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, the "
            f"prompt has {num_prompt_tokens} tokens, which leaves no room for a completion. "
            f"Please reduce the prompt.", param="prompt")
    if num_prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"prompt, {max_tokens} for the completion). Please reduce the prompt or "
            f"max_tokens.", param="max_tokens")


def check_admissible(seq_group: SequenceGroup, config: SchedulerConfig,
                     block_manager: BlockManager) -> None:
    """Raise InvalidRequestError (naming the value and the limit) for a request that could
    wait forever: a queue that admits it would never be able to run it."""
    check_context_length(len(seq_group.prompt_token_ids), 0, config.max_model_len)
    width = seq_group.max_num_running_seqs()
    params = seq_group.sampling_params
    # Name the field the client set: best_of when it widens the request, else n.
    param = "best_of" if params.num_samples > params.n else "n"
    # Samples or beams of one request are scheduled together, one token each at least.
    for name, limit in (("max_num_seqs", config.max_num_seqs),
                        ("max_num_batched_tokens", config.max_num_batched_tokens)):
        if width > limit:
            raise InvalidRequestError(
                f"the request runs {width} sequences at once (n / best_of), more than "
                f"{name} ({limit})", param=param)
    required = block_manager.num_required_blocks(seq_group)
    if required > block_manager.admission_capacity:
        raise InvalidRequestError(
            f"the prompt needs {required} KV cache blocks of {block_manager.block_size} "
            f"tokens, more than the {block_manager.admission_capacity} the device pool can "
            f"hold ({block_manager.device_pool.num_blocks} blocks, "
            f"{block_manager.watermark_blocks} kept free)", param="prompt")
