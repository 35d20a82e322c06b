"""Advanced decoding against transformers: beam search, penalties, logprobs; copy-on-write
parallel sampling; stop strings and min_tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server import LLM, BeamSearchParams, SamplingParams
from tests.checkpoints import load_hf_model

EOS = 2


@pytest.fixture(scope="module")
def llama(llama_case: tuple) -> tuple[Path, list[list[int]]]:
    model_dir, prompts, _ = llama_case
    return model_dir, prompts


@pytest.fixture(scope="module")
def llm(llama: tuple) -> LLM:
    return LLM(str(llama[0]), dtype="float32", kv_cache_dtype="float32", block_size=16)


@pytest.fixture(scope="module")
def hf_model(llama: tuple) -> torch.nn.Module:
    return load_hf_model(llama[0])


def _trim(tokens: list[int], pad: int) -> list[int]:
    """transformers pads beams that ended early; cut after the EOS."""
    return tokens[:tokens.index(EOS) + 1] if EOS in tokens else tokens


@pytest.mark.parametrize("width", [2, 4])
def test_beam_search_matches_transformers(llm: LLM, llama: tuple, hf_model, width: int) -> None:
    prompts = llama[1][1:6]
    params = BeamSearchParams(beam_width=width, max_tokens=12)
    ours = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, result in zip(prompts, ours):
        hf = hf_model.generate(torch.tensor([prompt]), num_beams=width,
                               num_return_sequences=width, do_sample=False, max_new_tokens=12,
                               length_penalty=1.0, early_stopping=False, pad_token_id=0,
                               output_scores=True, return_dict_in_generate=True)
        expected = [_trim(seq[len(prompt):].tolist(), 0) for seq in hf.sequences]
        got = [s.tokens[len(prompt):] for s in result.sequences]
        assert got == expected
        scores = [s.score for s in result.sequences]
        assert scores == pytest.approx(hf.sequences_scores.tolist(), abs=1e-4)
        assert scores == sorted(scores, reverse=True)
    assert llm.engine.stats().kv_cache_usage == 0.0


def test_beam_search_shares_blocks(llama: tuple) -> None:
    llm = LLM(str(llama[0]), dtype="float32", kv_cache_dtype="float32", block_size=8)
    engine = llm.engine
    engine.add_request("beams", llama[1][5], BeamSearchParams(4, 8).to_sampling_params())
    used = []
    while engine.has_unfinished_requests():
        engine.step()
        group = engine.scheduler.get_seq_group("beams")
        if group is not None and len(group.get_unfinished_seqs()) == 4:
            tables = [s.block_table for s in group.get_unfinished_seqs()]
            distinct = len({b for t in tables for b in t})
            used.append((distinct, sum(len(t) for t in tables)))
    assert used and all(distinct < total for distinct, total in used)


def test_repetition_penalty_and_min_tokens_match_generate(llm: LLM, llama: tuple,
                                                          hf_model) -> None:
    prompts = llama[1][:6]
    params = SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.5,
                            min_tokens=10)
    ours = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, result in zip(prompts, ours):
        hf = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24,
                               repetition_penalty=1.5, min_new_tokens=10, pad_token_id=0)
        assert result.outputs[0].token_ids == hf[0, len(prompt):].tolist()


def test_logprobs_match_transformers(llm: LLM, llama: tuple, hf_model) -> None:
    prompt = llama[1][4]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, prompt_logprobs=3)
    result = llm.generate({"prompt_token_ids": prompt}, params)[0]
    output = result.outputs[0]
    full = prompt + output.token_ids
    with torch.inference_mode():
        reference = torch.log_softmax(hf_model(torch.tensor([full])).logits[0].float(), -1)
    for i, (token, position) in enumerate(zip(output.token_ids, output.logprobs)):
        row = reference[len(prompt) - 1 + i]
        assert position[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert position[token].rank == 1  # greedy picks the most likely token
        top = row.topk(5)
        assert list(position)[:1] == [token]
        for tid, value in zip(top.indices.tolist(), top.values.tolist()):
            assert position[tid].logprob == pytest.approx(value, abs=1e-4)
    assert result.prompt_logprobs[0] is None
    assert len(result.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        entry = result.prompt_logprobs[p]
        row = reference[p - 1]
        assert entry[prompt[p]].logprob == pytest.approx(row[prompt[p]].item(), abs=1e-4)
        assert entry[prompt[p]].rank == int((row > row[prompt[p]]).sum()) + 1


def test_prompt_logprobs_with_prefix_caching(llama: tuple, hf_model) -> None:
    llm = LLM(str(llama[0]), dtype="float32", kv_cache_dtype="float32",
              enable_prefix_caching=True, block_size=8)
    prompt = llama[1][5]
    llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1))  # warm the cache
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    result = llm.generate({"prompt_token_ids": prompt}, params)[0]
    with torch.inference_mode():
        reference = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), -1)
    got = [result.prompt_logprobs[p][prompt[p]].logprob for p in range(1, len(prompt))]
    want = [reference[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
    assert got == pytest.approx(want, abs=1e-4)


def test_parallel_samples_equal_separate_seeded_requests(llm: LLM, llama: tuple) -> None:
    prompt = llama[1][3]  # 17 tokens: the last block of 16 holds one token, then is shared
    n, seed = 3, 1234
    together = llm.generate({"prompt_token_ids": prompt},
                            SamplingParams(n=n, seed=seed, temperature=1.0, max_tokens=20))[0]
    apart = [llm.generate({"prompt_token_ids": prompt},
                          SamplingParams(seed=seed + i, temperature=1.0, max_tokens=20))[0]
             for i in range(n)]
    assert [c.token_ids for c in together.outputs] == [a.outputs[0].token_ids for a in apart]
    assert len({tuple(c.token_ids) for c in together.outputs}) == n


def test_parallel_sampling_copy_on_write_block_counts(llama: tuple) -> None:
    llm = LLM(str(llama[0]), dtype="float32", kv_cache_dtype="float32", block_size=16)
    engine = llm.engine
    prompt = llama[1][3]  # 17 tokens: one full block and one holding a single token
    engine.add_request("cow", prompt, SamplingParams(n=3, seed=7, temperature=1.0,
                                                     max_tokens=4))
    engine.step()  # prefill, first token sampled three times, two forks
    usage = engine.scheduler.block_manager.usage().device
    assert usage.num_used_blocks == 2  # three samples, still one copy of the prompt
    engine.step()  # each sample writes into the shared partial block: copy-on-write
    usage = engine.scheduler.block_manager.usage().device
    assert usage.num_used_blocks == 1 + 3
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.block_manager.usage().device.num_used_blocks == 0


def test_stop_string_split_across_tokens(llm: LLM, llama: tuple) -> None:
    tokenizer = llm.get_tokenizer()
    prompt = llama[1][6]
    base = llm.generate({"prompt_token_ids": prompt},
                        SamplingParams(temperature=0.0, max_tokens=30))[0].outputs[0]
    text = base.text
    # Character offsets where one token's text ends and the next begins.
    bounds = [len(tokenizer.decode(base.token_ids[:i])) for i in range(1, len(base.token_ids))]
    # A two-character stop string straddling a token boundary (its first occurrence).
    start = next(b - 1 for b in bounds
                 if 0 < b < len(text) and text.index(text[b - 1:b + 1]) == b - 1)
    stop = text[start:start + 2]
    for include in (False, True):
        params = SamplingParams(temperature=0.0, max_tokens=30, stop=[stop],
                                include_stop_str_in_output=include)
        out = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop
        assert out.text == text[:start + (len(stop) if include else 0)]


def test_min_tokens_holds_back_an_early_eos(llm: LLM, llama: tuple) -> None:
    prompt = {"prompt_token_ids": llama[1][2]}
    forced = SamplingParams(temperature=0.0, max_tokens=20, logit_bias={EOS: 100.0})
    assert llm.generate(prompt, forced)[0].outputs[0].token_ids == [EOS]
    held = SamplingParams(temperature=0.0, max_tokens=20, logit_bias={EOS: 100.0}, min_tokens=5)
    out = llm.generate(prompt, held)[0].outputs[0]
    assert len(out.token_ids) == 6 and out.token_ids[-1] == EOS
    assert EOS not in out.token_ids[:5] and out.finish_reason == "stop"


def test_bad_words_are_never_generated(llm: LLM, llama: tuple) -> None:
    tokenizer = llm.get_tokenizer()
    prompt = {"prompt_token_ids": llama[1][6]}
    base = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16))[0].outputs[0]
    # A generated token whose text encodes back to exactly itself.
    first = next(t for t in base.token_ids if tokenizer.decode([t]).strip()
                 and tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False) == [t])
    banned = tokenizer.decode([first])
    params = SamplingParams(temperature=0.0, max_tokens=16, bad_words=[banned])
    out = llm.generate(prompt, params)[0].outputs[0]
    assert [first] in llm.engine.requests.bad_words_token_ids(params)
    assert first not in out.token_ids
    assert out.token_ids != base.token_ids


def test_bad_words_outside_the_vocabulary_are_refused_on_arrival(
        llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tokenizer larger than the model's vocabulary: the sampler does not check ids each
    # step, so the request must be refused before it is scheduled.
    vocab = llm.engine.model_config.vocab_size
    monkeypatch.setattr(llm.engine.requests, "bad_words_token_ids", lambda params: [[5, vocab]])
    params = SamplingParams(temperature=0.0, max_tokens=4, bad_words=["x"])
    with pytest.raises(InvalidRequestError,
                       match=rf"^bad_words must hold token ids in \[0, {vocab}\), got {vocab}$"):
        llm.engine.add_request("outside", [7, 8, 9], params)
    assert not llm.engine.has_unfinished_requests()
