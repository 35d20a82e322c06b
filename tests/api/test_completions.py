"""``/v1/completions`` through the official openai SDK, checked token for token against the
offline engine on the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

PROMPT = "The paged KV cache"
OTHER_PROMPT = "Blocks of sixteen tokens"


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=64)


def reference(offline: LLM, prompt: str | list[int], **params: object) -> RequestOutput:
    item = prompt if isinstance(prompt, str) else {"prompt_token_ids": prompt}
    return offline.generate([item], SamplingParams(**params))[0]


async def tokenize(server: LiveServer, prompt: str) -> list[int]:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/tokenize", json={"model": MODEL, "prompt": prompt}
    ) as response:
        return (await response.json())["tokens"]


async def test_greedy_completion_matches_offline_engine(
    client: AsyncOpenAI, offline: LLM, server: LiveServer
) -> None:
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                             temperature=0)
    expected = reference(offline, PROMPT, temperature=0, max_tokens=8)
    (choice,) = result.choices
    assert choice.text == expected.outputs[0].text
    assert choice.finish_reason == expected.outputs[0].finish_reason
    assert (result.object, result.model) == ("text_completion", MODEL)
    assert result.id.startswith("cmpl-")
    assert result.system_fingerprint.startswith("fp_pagedserve_")
    prompt_ids = await tokenize(server, PROMPT)
    assert prompt_ids == expected.prompt_token_ids
    assert result.usage.prompt_tokens == len(prompt_ids)
    assert result.usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert result.usage.total_tokens == len(prompt_ids) + len(expected.outputs[0].token_ids)


async def test_default_max_tokens_fills_the_context(client: AsyncOpenAI,
                                                    server: LiveServer) -> None:
    prompt = (await tokenize(server, PROMPT)) * 200
    prompt = prompt[: server.engine.max_model_len - 6]
    result = await client.completions.create(model=MODEL, prompt=prompt, temperature=0,
                                             extra_body={"ignore_eos": True})
    assert result.usage.completion_tokens == 6
    assert result.choices[0].finish_reason == "length"


async def test_stream_sends_one_chunk_per_token_and_usage_last(client: AsyncOpenAI,
                                                               offline: LLM) -> None:
    expected = reference(offline, PROMPT, temperature=0, max_tokens=6, ignore_eos=True)
    stream = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    *token_chunks, usage_chunk = chunks
    assert len(token_chunks) == 6
    assert all(len(c.choices) == 1 and c.choices[0].index == 0 for c in token_chunks)
    assert all(c.usage is None for c in token_chunks)
    assert "".join(c.choices[0].text for c in token_chunks) == expected.outputs[0].text
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 5 + ["length"]
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (
        len(expected.prompt_token_ids), 6)
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_stats_put_each_choices_usage_on_every_chunk(
        server: LiveServer, path: str) -> None:
    # vLLM's stream option, which gateways and benchmark clients set (a 400 before).
    body = {"model": MODEL, "max_tokens": 3, "n": 2, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"prompt": [PROMPT, OTHER_PROMPT]} if "chat" not in path else
                {"messages": [{"role": "user", "content": PROMPT}]})
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + path, json=body
    ) as response:
        assert response.status == 200
        events = [json.loads(line[6:]) for line in (await response.text()).splitlines()
                  if line.startswith("data: {")]
    *token_chunks, last = events
    prompt_tokens = last["usage"]["prompt_tokens"]
    seen: dict[int, int] = {}
    for chunk in token_chunks:
        (choice,) = chunk["choices"]
        seen[choice["index"]] = seen.get(choice["index"], 0) + 1
        assert chunk["usage"]["completion_tokens"] == seen[choice["index"]]
        assert chunk["usage"]["total_tokens"] == (chunk["usage"]["prompt_tokens"]
                                                  + seen[choice["index"]])
    assert seen == {i: 3 for i in range(len(seen))}
    assert (last["choices"], last["usage"]["completion_tokens"]) == ([], 3 * len(seen))
    if "chat" in path:
        assert {c["usage"]["prompt_tokens"] for c in token_chunks} == {prompt_tokens}
    else:
        by_prompt = {c["choices"][0]["index"] // 2: c["usage"]["prompt_tokens"]
                     for c in token_chunks}
        assert sum(by_prompt.values()) == prompt_tokens and len(by_prompt) == 2


async def test_prompt_lists_and_token_ids_give_one_choice_per_prompt(
    client: AsyncOpenAI, offline: LLM
) -> None:
    first = reference(offline, PROMPT, temperature=0, max_tokens=5)
    second = reference(offline, OTHER_PROMPT, temperature=0, max_tokens=5)
    by_text = await client.completions.create(model=MODEL, prompt=[PROMPT, OTHER_PROMPT],
                                              max_tokens=5, temperature=0)
    by_ids = await client.completions.create(
        model=MODEL, prompt=[first.prompt_token_ids, second.prompt_token_ids], max_tokens=5,
        temperature=0,
    )
    for result in (by_text, by_ids):
        assert [c.index for c in result.choices] == [0, 1]
        assert [c.text for c in result.choices] == [first.outputs[0].text,
                                                    second.outputs[0].text]
        assert result.usage.prompt_tokens == (len(first.prompt_token_ids)
                                              + len(second.prompt_token_ids))


async def test_seeded_parallel_samples_are_reproducible(client: AsyncOpenAI,
                                                        offline: LLM) -> None:
    params = {"n": 3, "temperature": 1.0, "seed": 1234, "max_tokens": 6}
    expected = reference(offline, PROMPT, **params)
    runs = [await client.completions.create(model=MODEL, prompt=PROMPT, **params)
            for _ in range(2)]
    for result in runs:
        assert [c.index for c in result.choices] == [0, 1, 2]
        assert [c.text for c in result.choices] == [o.text for o in expected.outputs]
        assert result.usage.completion_tokens == sum(len(o.token_ids)
                                                     for o in expected.outputs)
    other_seed = await client.completions.create(model=MODEL, prompt=PROMPT,
                                                 **{**params, "seed": 99})
    assert [c.text for c in other_seed.choices] != [c.text for c in runs[0].choices]


async def test_streamed_parallel_samples_keep_their_indices(client: AsyncOpenAI,
                                                            offline: LLM) -> None:
    params = {"n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 4}
    expected = reference(offline, PROMPT, **params, ignore_eos=True)
    stream = await client.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                             extra_body={"ignore_eos": True}, **params)
    texts = {0: "", 1: ""}
    finishes = {}
    async for chunk in stream:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finishes[choice.index] = choice.finish_reason
    assert texts == {o.index: o.text for o in expected.outputs}
    assert finishes == {0: "length", 1: "length"}


async def test_logprobs_in_completions_shape(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, PROMPT, temperature=0, max_tokens=5, logprobs=2,
                         ignore_eos=True)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                             temperature=0, logprobs=2,
                                             extra_body={"ignore_eos": True})
    logprobs = result.choices[0].logprobs
    want = expected.outputs[0]
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert len(logprobs.top_logprobs) == len(logprobs.text_offset) == 5
    for i, token_id in enumerate(want.token_ids):
        position = want.logprobs[i]
        assert logprobs.token_logprobs[i] == pytest.approx(position[token_id].logprob)
        assert len(logprobs.top_logprobs[i]) <= 3  # the top 2 and the chosen token
        # Greedy: the chosen token is the most likely one.
        assert logprobs.token_logprobs[i] == pytest.approx(max(logprobs.top_logprobs[i].values()))
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)


async def test_echo_prepends_the_prompt(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, PROMPT, temperature=0, max_tokens=3)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3,
                                             temperature=0, echo=True)
    assert result.choices[0].text == PROMPT + expected.outputs[0].text


async def test_stop_string_ends_the_text_before_it(client: AsyncOpenAI, offline: LLM) -> None:
    full = reference(offline, PROMPT, temperature=0, max_tokens=16, ignore_eos=True)
    text = full.outputs[0].text
    stop = next(text[i:i + 2] for i in range(1, len(text) - 1)
                if text[i:i + 2].strip() and text.index(text[i:i + 2]) == i)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16,
                                             temperature=0, stop=[stop],
                                             extra_body={"ignore_eos": True})
    (choice,) = result.choices
    assert choice.text == text[: text.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop


async def test_echo_with_logprobs_covers_the_prompt(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, PROMPT, temperature=0, max_tokens=2, logprobs=1,
                         prompt_logprobs=1, ignore_eos=True)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                             temperature=0, logprobs=1, echo=True,
                                             extra_body={"ignore_eos": True})
    logprobs = result.choices[0].logprobs
    prompt_ids = expected.prompt_token_ids
    assert len(logprobs.tokens) == len(prompt_ids) + 2
    assert logprobs.token_logprobs[0] is None  # nothing precedes the first token
    assert logprobs.top_logprobs[0] is None
    for i, token_id in enumerate(prompt_ids[1:], start=1):
        want = expected.prompt_logprobs[i][token_id].logprob
        assert logprobs.token_logprobs[i] == pytest.approx(want)
    tokenizer = offline.get_tokenizer()
    assert logprobs.text_offset[len(prompt_ids)] == len(tokenizer.decode(prompt_ids))
    assert result.choices[0].text.startswith(PROMPT)


async def test_prompt_logprobs_extra(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, PROMPT, temperature=0, max_tokens=1, prompt_logprobs=2)
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1,
                                             temperature=0, extra_body={"prompt_logprobs": 2})
    got = result.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None
    assert len(got) == len(expected.prompt_token_ids)
    for position, want in zip(got[1:], expected.prompt_logprobs[1:], strict=True):
        assert {int(k) for k in position} == set(want)
        for token_id, lp in want.items():
            assert position[str(token_id)]["logprob"] == pytest.approx(lp.logprob)
            assert position[str(token_id)]["rank"] == lp.rank


@pytest.mark.parametrize("params", [
    {"use_beam_search": True, "best_of": 3, "n": 2},
    {"best_of": 3, "n": 1, "temperature": 1.0, "seed": 11},
])
async def test_beam_search_and_best_of_match_offline(client: AsyncOpenAI, offline: LLM,
                                                     params: dict[str, object]) -> None:
    # The server defaults beam search to temperature 0; the engine itself insists on it.
    defaults = {"temperature": 0.0} if params.get("use_beam_search") else {}
    expected = reference(offline, PROMPT, max_tokens=4, **{**defaults, **params})
    n = params["n"]
    result = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, n=n, best_of=params["best_of"],
        extra_body={k: v for k, v in params.items() if k not in ("n", "best_of")},
    )
    assert [c.index for c in result.choices] == list(range(n))
    assert [c.text for c in result.choices] == [o.text for o in expected.outputs]
