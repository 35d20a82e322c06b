"""Datasets: exact token lengths, ShareGPT parsing, shared prefixes, seeded reproducibility."""

from __future__ import annotations

import zlib
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest

from pagedserve.common.encoding import load_encoding
from pagedserve.loadgen.bench_errors import BenchConfigError, DatasetError
from pagedserve.loadgen.datasets import DatasetSpec, length_range, load_dataset
from pagedserve.loadgen.lengths import SYNTHETIC_WORKLOADS
from pagedserve.loadgen.sharegpt import read_sharegpt
from pagedserve.loadgen.tokenizers import ServerTokenCounter, TiktokenCounter

ENCODING = load_encoding("cl100k_base")


def _tokens(text: str) -> list[int]:
    return ENCODING.encode_ordinary(text)


async def test_random_prompts_have_exact_lengths_in_range() -> None:
    spec = DatasetSpec(name="random", random_input_len=40, random_output_len=10,
                       random_range_ratio=0.5, seed=3)
    samples = await load_dataset(spec, 50, TiktokenCounter())
    assert len(samples) == 50
    for s in samples:
        assert len(_tokens(s.prompt)) == s.prompt_len
        assert 20 <= s.prompt_len <= 60 and 5 <= s.expected_output_len <= 15
    assert len({s.prompt_len for s in samples}) > 10  # lengths really vary


async def test_same_seed_same_requests_other_seed_others() -> None:
    counter = TiktokenCounter()
    spec = DatasetSpec(name="random", random_input_len=16, random_output_len=4,
                       random_range_ratio=0.25, seed=11)
    again = DatasetSpec(name="random", random_input_len=16, random_output_len=4,
                        random_range_ratio=0.25, seed=11)
    other = DatasetSpec(name="random", random_input_len=16, random_output_len=4,
                        random_range_ratio=0.25, seed=12)
    first = await load_dataset(spec, 20, counter)
    assert first == await load_dataset(again, 20, counter)
    assert first != await load_dataset(other, 20, counter)


async def test_prefix_dataset_shares_each_prefix_exactly() -> None:
    spec = DatasetSpec(name="prefix", prefix_len=24, suffix_len=8, num_prefixes=3,
                       prefix_output_len=6)
    samples = await load_dataset(spec, 12, TiktokenCounter())
    prefixes = {tuple(_tokens(s.prompt)[:24]) for s in samples}
    assert len(prefixes) == 3
    groups = [tuple(_tokens(s.prompt)[:24]) for s in samples]
    assert sorted(groups.count(p) for p in prefixes) == [4, 4, 4]
    assert {s.prompt_len for s in samples} == {32}
    assert all(len(_tokens(s.prompt)) == 32 for s in samples)
    assert {s.expected_output_len for s in samples} == {6}
    assert len({s.prompt for s in samples}) == 12  # the suffixes differ


async def test_random_prefix_len_is_shared_by_every_prompt() -> None:
    spec = DatasetSpec(name="random", random_input_len=5, random_output_len=2,
                       random_prefix_len=16)
    samples = await load_dataset(spec, 6, TiktokenCounter())
    assert len({tuple(_tokens(s.prompt)[:16]) for s in samples}) == 1
    assert all(len(_tokens(s.prompt)) == s.prompt_len == 21 for s in samples)


async def test_synthetic_workloads_have_exact_lengths() -> None:
    spec = DatasetSpec(name="alpaca-like", seed=1)
    samples = await load_dataset(spec, 30, TiktokenCounter())
    assert all(len(_tokens(s.prompt)) == s.prompt_len for s in samples)
    assert all(2 <= s.expected_output_len <= 512 for s in samples)


@pytest.mark.parametrize(("name", "mean_in", "mean_out"),
                         [("sharegpt-like", 161, 338), ("alpaca-like", 19, 58)])
def test_synthetic_length_means_match_the_paper(name: str, mean_in: int, mean_out: int) -> None:
    workload = SYNTHETIC_WORKLOADS[name]
    inputs, outputs = map(np.array, workload.sample_pairs(np.random.default_rng(0), 20000))
    assert inputs.mean() == pytest.approx(mean_in, rel=0.03)
    assert outputs.mean() == pytest.approx(mean_out, rel=0.03)
    assert np.median(outputs) < outputs.mean()  # a right tail, as in the paper's histograms


def test_sharegpt_like_pairs_fit_a_2048_token_model() -> None:
    # As the ShareGPT loader drops pairs over 2,048 tokens in all, the synthetic shape draws
    # them again: each request fits a 2,048-token context (the means: the test above).
    workload = SYNTHETIC_WORKLOADS["sharegpt-like"]
    rng = np.random.default_rng(0)
    unfiltered = workload.input.sample(rng, 20000) + workload.output.sample(rng, 20000)
    assert (unfiltered > 2048).sum() > 100  # the filter has pairs to drop
    inputs, outputs = workload.sample_pairs(np.random.default_rng(0), 20000)
    assert len(inputs) == len(outputs) == 20000
    assert max(i + o for i, o in zip(inputs, outputs, strict=True)) <= 2048
    assert workload.sample_pairs(np.random.default_rng(5), 50) == \
        workload.sample_pairs(np.random.default_rng(5), 50)


async def test_server_tokenizer_lengths_count_its_bos(serve) -> None:
    server, url = serve()
    spec = DatasetSpec(name="random", random_input_len=12, random_output_len=3,
                       random_range_ratio=0.5)
    async with aiohttp.ClientSession() as session:
        counter = ServerTokenCounter(session, url, "tiny")
        samples = await load_dataset(spec, 8, counter)
        assert await counter.count([s.prompt for s in samples]) == [s.prompt_len for s in
                                                                     samples]
    # The fake server's tokenizer adds one BOS token to tiktoken's count.
    assert all(len(_tokens(s.prompt)) == s.prompt_len - 1 for s in samples)
    assert server.tokenize_calls >= 16


def _write_sharegpt(path: Path) -> Path:
    long_prompt = " word" * 1100
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": " one two three four five"},
                                      {"from": "gpt", "value": " six seven eight nine"}]},
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": " alpha beta gamma delta"},
                                      {"from": "gpt", "value": " eps zeta eta theta iota"}]},
        {"id": "short-reply", "conversations": [{"from": "human", "value": " a b c d e"},
                                                {"from": "gpt", "value": " ok"}]},
        {"id": "too-long", "conversations": [{"from": "human", "value": long_prompt},
                                             {"from": "gpt", "value": " fine fine fine fine"}]},
        {"id": "no-reply", "conversations": [{"from": "human", "value": " lonely"}]},
        {"id": "no-turns"},
    ]
    path.write_bytes(orjson.dumps(data))
    return path


async def test_sharegpt_file_first_human_turn_and_reply_length(tmp_path: Path) -> None:
    path = _write_sharegpt(tmp_path / "sg.json")
    pairs = read_sharegpt(path)
    assert [p.prompt for p in pairs] == [" one two three four five", " alpha beta gamma delta",
                                         " a b c d e", " word" * 1100]
    samples = await load_dataset(DatasetSpec(name="sharegpt", path=str(path)), 10,
                                 TiktokenCounter())
    # The short reply (1 token) and the 1100-token prompt are filtered out, as vLLM does.
    assert sorted((s.prompt, s.prompt_len, s.expected_output_len) for s in samples) == [
        (" alpha beta gamma delta", 4, len(_tokens(" eps zeta eta theta iota"))),
        (" one two three four five", 5, 4)]


async def test_sharegpt_fixed_output_len_keeps_short_replies(tmp_path: Path) -> None:
    path = _write_sharegpt(tmp_path / "sg.json")
    spec = DatasetSpec(name="sharegpt", path=str(path), sharegpt_output_len=7)
    samples = await load_dataset(spec, 10, TiktokenCounter())
    assert len(samples) == 3 and {s.expected_output_len for s in samples} == {7}


def test_sharegpt_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"cannot read ShareGPT file .*missing\.json"):
        read_sharegpt(tmp_path / "missing.json")
    (tmp_path / "obj.json").write_text('{"conversations": []}')
    with pytest.raises(DatasetError, match="must hold a JSON list of conversations, got dict"):
        read_sharegpt(tmp_path / "obj.json")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(DatasetError, match="no conversation with a human turn"):
        read_sharegpt(tmp_path / "empty.json")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"random_range_ratio": 1.0}, "--random-range-ratio must be in [0, 1), got 1.0"),
    ({"random_output_len": 1, "random_range_ratio": 0.5},
     "--random-output-len must be at least 1 at the low end of the range, got 1"),
    ({"name": "sharegpt"},
     "--dataset-path must be a ShareGPT JSON file with --dataset-name sharegpt, got None"),
    ({"name": "wiki"}, "--dataset-name must be one of ('random', 'sharegpt', "
                       "'sharegpt-like', 'alpaca-like', 'prefix', 'sonnet'), got 'wiki'"),
    ({"name": "sonnet", "sonnet_input_len": 100, "sonnet_prefix_len": 100},
     "--sonnet-input-len must be more than --sonnet-prefix-len (100), got 100"),
    ({"num_prefixes": 0}, "--prefix-repetition-num-prefixes must be at least 1, got 0"),
])
def test_bad_dataset_options(kwargs: dict, message: str) -> None:
    with pytest.raises(BenchConfigError) as info:
        DatasetSpec(**kwargs)
    assert str(info.value) == message


class _SplittingCounter:
    """A tokenizer that adds a BOS and splits one word in five into two or three tokens."""

    name = "splitting"

    async def count(self, texts: list[str]) -> list[int]:
        return [1 + sum(self._cost(word) for word in text.split()) for text in texts]

    @staticmethod
    def _cost(word: str) -> int:
        h = zlib.crc32(word.encode()) % 100
        return 1 if h < 80 else 2 if h < 95 else 3


async def test_prompts_are_exact_under_a_tokenizer_that_splits_words() -> None:
    counter = _SplittingCounter()
    spec = DatasetSpec(name="random", random_input_len=300, random_output_len=10,
                       random_range_ratio=0.9)
    samples = await load_dataset(spec, 40, counter)
    assert await counter.count([s.prompt for s in samples]) == [s.prompt_len for s in samples]


def test_length_range_is_vllms_with_float_artefacts_removed() -> None:
    assert length_range(100, 0.0) == (100, 100)
    assert length_range(10, 0.9) == (1, 19)
    assert length_range(7, 0.5) == (3, 11)


class _CharacterCounter:
    """A tokenizer with almost no merges: a word costs one token per two letters, plus BOS."""

    name = "characters"

    async def count(self, texts: list[str]) -> list[int]:
        return [1 + sum((len(word) + 1) // 2 for word in text.split()) for text in texts]


async def test_a_count_only_tokenizer_that_splits_nearly_every_word_is_refused_clearly(
) -> None:
    spec = DatasetSpec(name="random", random_input_len=32, random_output_len=4)
    with pytest.raises(DatasetError) as info:
        await load_dataset(spec, 4, _CharacterCounter())
    message = str(info.value)
    assert message.startswith("tokenizer 'characters' splits common English words: only 0 of "
                              "1024 probe words are single tokens (most cost ")
    assert message.endswith("(most cost 3), and it cannot split a text into its tokens to use "
                            "those instead; count with a tiktoken encoding (--tokenizer "
                            "cl100k_base) or the server's tokenizer (--tokenizer server)")
