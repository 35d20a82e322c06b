"""The ``sonnet`` dataset, with the semantics of vLLM's: prompts of poem lines under a
shared prefix, sized in tokens of the run's tokenizer.

Each prompt is an instruction followed by the first lines of the poem text (the shared
prefix, about ``prefix_len`` tokens) and then lines drawn at random with replacement, as many
as bring the prompt to about ``input_len`` tokens: line counts are the token budgets divided
by the mean tokens per line, rounded. The prompt is wrapped in the tokenizer's chat template
as one user message; its length is that of the formatted text, and a draw longer than
``input_len`` is drawn again. The completions endpoint is sent the formatted text, the chat
endpoint (which applies the template itself) the plain one. With a tokenizer that has no chat
template (a tiktoken encoding, the server's /tokenize) the plain text is the formatted one.

The default text, Shakespeare's sonnets (public domain), ships with the package.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from pagedserve.loadgen.bench_errors import DatasetError
from pagedserve.loadgen.tokenizers import TokenCounter

BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"
DEFAULT_INPUT_LEN = 550
DEFAULT_PREFIX_LEN = 200
DEFAULT_OUTPUT_LEN = 150
MAX_DRAWS_PER_PROMPT = 64


def read_poem_lines(path: str | None = None) -> list[str]:
    """The lines (with their newlines) of ``path``, or of the shipped sonnets."""
    try:
        if path is None:
            text = resources.files("pagedserve.loadgen").joinpath("sonnets.txt")
            content = text.read_text(encoding="utf-8")
        else:
            content = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the sonnet text {path!r}: {exc}") from exc
    lines = [line for line in content.splitlines(keepends=True) if line.strip()]
    if not lines:
        raise DatasetError(f"the sonnet text {path!r} has no lines")
    return lines


def chat_formatter(counter: TokenCounter) -> Callable[[str], str]:
    """The counter's chat template for one user message; the identity without one."""
    format_chat = getattr(counter, "format_chat", None)
    return format_chat if callable(format_chat) else (lambda text: text)


async def sample_sonnet(lines: list[str], num_prompts: int, rng: np.random.Generator,
                        counter: TokenCounter, input_len: int, prefix_len: int,
                        formatted: bool) -> list[tuple[str, int]]:
    """``num_prompts`` (prompt, prompt tokens) pairs; the prompt chat-formatted if asked."""
    fmt = chat_formatter(counter)
    counts = await counter.count(lines)
    avg_len = sum(counts) / len(counts)
    (base_offset,) = await counter.count([fmt(BASE_PROMPT)])
    if input_len <= base_offset:
        raise DatasetError(f"--sonnet-input-len must be more than the instruction's "
                           f"{base_offset} tokens, got {input_len}")
    num_input_lines = round((input_len - base_offset) / avg_len)
    num_prefix_lines = max(round((prefix_len - base_offset) / avg_len), 0)
    prefix = "".join(lines[:num_prefix_lines])
    num_drawn = max(num_input_lines - num_prefix_lines, 0)
    samples: list[tuple[str, int]] = []
    for _ in range(MAX_DRAWS_PER_PROMPT):
        want = num_prompts - len(samples)
        picks = rng.integers(0, len(lines), size=(want, num_drawn))
        prompts = [BASE_PROMPT + prefix + "".join(lines[i] for i in row) for row in picks]
        texts = [fmt(prompt) for prompt in prompts]
        for prompt, text, length in zip(prompts, texts, await counter.count(texts),
                                        strict=True):
            if length <= input_len:
                samples.append((text if formatted else prompt, length))
        if len(samples) == num_prompts:
            return samples
    raise DatasetError(f"no sonnet prompt of at most {input_len} tokens in "
                       f"{MAX_DRAWS_PER_PROMPT} draws; raise --sonnet-input-len")
