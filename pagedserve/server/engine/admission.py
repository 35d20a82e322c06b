"""Whether a request can ever run under the scheduler's limits and the device pool."""

from __future__ import annotations

from pagedserve.server.engine.block_manager import BlockManager
from pagedserve.server.engine.config import SchedulerConfig
from pagedserve.server.engine.sequence import SequenceGroup
from pagedserve.server.errors import InvalidRequestError


def check_admissible(seq_group: SequenceGroup, config: SchedulerConfig,
                     block_manager: BlockManager) -> None:
    """Raise InvalidRequestError (naming the value and the limit) for a request that could
    wait forever: a queue that admits it would never be able to run it."""
    num_tokens = len(seq_group.prompt_token_ids)
    if num_tokens == 0:
        raise InvalidRequestError("the prompt must contain at least 1 token", param="prompt")
    if num_tokens > config.max_model_len:
        raise InvalidRequestError(
            f"the prompt has {num_tokens} tokens, more than max_model_len "
            f"({config.max_model_len})", param="prompt")
    width = seq_group.max_num_running_seqs()
    params = seq_group.sampling_params
    # Name the field the client set: best_of when it widens the request, else n.
    param = "best_of" if params.best_of > params.n else "n"
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
