"""ShareGPT-format conversation files: the first human turn is the prompt, the reply after
it sets the output length.

Filtering follows vLLM's ``bench serve`` so the two sample the same pairs: both sides at
least 4 tokens (the reply side unchecked when the output length is fixed), prompts at most
1024 tokens and prompt + reply at most 2048.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from pagedserve.loadgen.bench_errors import DatasetError
from pagedserve.loadgen.tokenizers import TokenCounter

HUMAN_ROLES = frozenset({"human", "user"})
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
_COUNT_BATCH = 256


@dataclass(frozen=True, slots=True)
class ConversationPair:
    prompt: str
    reply: str


def read_sharegpt(path: str | Path) -> list[ConversationPair]:
    """Every conversation's first human turn and the turn that answers it, in file order."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise DatasetError(f"cannot read ShareGPT file {str(path)!r}: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"ShareGPT file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise DatasetError(f"ShareGPT file {str(path)!r} must hold a JSON list of "
                           f"conversations, got {type(data).__name__}")
    pairs = [pair for entry in data if (pair := _first_exchange(entry)) is not None]
    if not pairs:
        raise DatasetError(f"ShareGPT file {str(path)!r} has no conversation with a human "
                           f"turn followed by a reply")
    return pairs


def _first_exchange(entry: object) -> ConversationPair | None:
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    for turn, reply in itertools.pairwise(turns):
        if not (isinstance(turn, dict) and isinstance(reply, dict)):
            return None
        if turn.get("from") in HUMAN_ROLES:
            prompt, answer = turn.get("value"), reply.get("value")
            if isinstance(prompt, str) and isinstance(answer, str) and prompt:
                return ConversationPair(prompt, answer)
            return None
    return None


def is_valid_pair(prompt_len: int, output_len: int, fixed_output: bool) -> bool:
    if prompt_len < MIN_LEN or (not fixed_output and output_len < MIN_LEN):
        return False
    return prompt_len <= MAX_PROMPT_LEN and prompt_len + output_len <= MAX_TOTAL_LEN


async def sample_sharegpt(pairs: list[ConversationPair], num_prompts: int,
                          rng: np.random.Generator, counter: TokenCounter,
                          fixed_output_len: int | None = None) -> list[tuple[str, int, int]]:
    """Up to ``num_prompts`` valid (prompt, prompt_len, output_len) in a seeded random order.

    Pairs are counted in batches as the shuffled order is walked, so a large file costs
    only as many counts as it takes to fill the sample.
    """
    order = rng.permutation(len(pairs))
    chosen: list[tuple[str, int, int]] = []
    for start in range(0, len(order), _COUNT_BATCH):
        batch = [pairs[i] for i in order[start:start + _COUNT_BATCH]]
        prompt_lens = await counter.count([p.prompt for p in batch])
        if fixed_output_len is None:
            output_lens = await counter.count([p.reply for p in batch])
        else:
            output_lens = [fixed_output_len] * len(batch)
        for pair, p_len, o_len in zip(batch, prompt_lens, output_lens, strict=True):
            if is_valid_pair(p_len, o_len, fixed_output_len is not None):
                chosen.append((pair.prompt, p_len, o_len))
                if len(chosen) == num_prompts:
                    return chosen
    if not chosen:
        raise DatasetError(f"no ShareGPT conversation passes the length filter (prompt "
                           f"{MIN_LEN}..{MAX_PROMPT_LEN} tokens, total <= {MAX_TOTAL_LEN})")
    return chosen
