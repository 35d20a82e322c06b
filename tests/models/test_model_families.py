"""Each family's logits through the paged cache against transformers on the same checkpoint."""

from __future__ import annotations

import torch

from tests.models.paged_harness import PagedHarness, hf_logits

ATOL = 1e-4  # float32 end to end; the two implementations differ only in summation order


def _prompts(vocab_size: int) -> dict[int, list[int]]:
    gen = torch.Generator().manual_seed(7)
    # Lengths around the harness's block size of 4: 1, B-1, B, B+1 and several blocks.
    lengths = {0: 9, 1: 1, 2: 3, 3: 4, 4: 5, 5: 14}
    return {s: torch.randint(3, vocab_size, (n,), generator=gen).tolist() for s, n in
            lengths.items()}


def test_packed_prefill_matches_transformers_at_every_position(family_models):
    model, config, hf = family_models
    prompts = _prompts(config.vocab_size)
    harness = PagedHarness(model, config)

    logits = harness.step(list(prompts.items()))

    for (seq, prompt), ours in zip(prompts.items(), logits, strict=True):
        torch.testing.assert_close(ours, hf_logits(hf, prompt), atol=ATOL, rtol=0, msg=str(seq))


def test_greedy_decode_matches_transformers(family_models):
    model, config, hf = family_models
    prompts = _prompts(config.vocab_size)
    harness = PagedHarness(model, config, seed=1)
    last = [rows[-1] for rows in harness.step(list(prompts.items()))]
    sequences = {seq: list(prompt) for seq, prompt in prompts.items()}

    for _ in range(4):
        step = []
        for (seq, tokens), logits in zip(sequences.items(), last, strict=True):
            reference = hf_logits(hf, tokens)[-1]
            torch.testing.assert_close(logits, reference, atol=ATOL, rtol=0)
            token = int(logits.argmax())
            assert token == int(reference.argmax())
            tokens.append(token)
            step.append((seq, [token]))
        last = [rows[0] for rows in harness.step(step)]  # a decode-only step


def test_chunked_prefill_equals_one_shot(family_models):
    model, config, _ = family_models
    prompts = _prompts(config.vocab_size)
    long = prompts[5]
    one_shot = PagedHarness(model, config).step([(0, long)])[0]

    chunked = PagedHarness(model, config, seed=2)
    # The first chunk shares its step with another prompt, the second with a decode.
    first = chunked.step([(0, long[:6]), (1, prompts[0])])[0]
    chunked.step([(1, [5])])
    second = chunked.step([(1, [6]), (0, long[6:])])[1]

    torch.testing.assert_close(torch.cat([first, second]), one_shot, atol=1e-5, rtol=0)
