"""The sampler on a CUDA device: same processing as on CPU, seeds still batch-independent."""

from __future__ import annotations

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling import Sampler, SamplingMetadata, SamplingRow

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB = 128

ROWS = [
    SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=1.3, logprobs=3), [1, 2], [2]),
    SamplingRow(SamplingParams(temperature=0.8, top_k=5, logit_bias={3: 1.0}), [3], [4], seed=11),
    SamplingRow(SamplingParams(temperature=1.1, top_p=0.7, min_tokens=2), [5], [],
                eos_token_id=0),
    SamplingRow(SamplingParams(temperature=0.9, min_p=0.3, allowed_token_ids=[7, 8, 9]),
                [6], [], seed=12),
]


def test_cuda_processing_matches_cpu() -> None:
    logits = torch.randn(len(ROWS), VOCAB, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(seed=0)
    on_cpu = sampler.process_logits(logits, SamplingMetadata.build(ROWS, VOCAB, "cpu"))
    cuda_metadata = SamplingMetadata.build(ROWS, VOCAB, "cuda")
    on_cuda = sampler.process_logits(logits.cuda(), cuda_metadata).cpu()
    assert torch.equal(torch.isinf(on_cpu), torch.isinf(on_cuda))
    finite = torch.isfinite(on_cpu)
    torch.testing.assert_close(on_cuda[finite], on_cpu[finite], rtol=1e-5, atol=1e-5)
    output = sampler(logits.cuda(), cuda_metadata)
    assert output.sampled_token_ids.device.type == "cuda"
    assert output.sampled_token_ids[0].item() == on_cpu[0].argmax().item()
    tokens = output.sampled_token_ids.tolist()
    assert all(torch.isfinite(on_cpu[i, t]) for i, t in enumerate(tokens))


def test_cuda_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = torch.randn(len(ROWS), VOCAB, generator=torch.Generator().manual_seed(2)).cuda()
    batched = Sampler(seed=1)(logits, SamplingMetadata.build(ROWS, VOCAB, "cuda"))
    for i in (1, 3):
        alone = Sampler(seed=2)(logits[i : i + 1], SamplingMetadata.build([ROWS[i]], VOCAB, "cuda"))
        assert alone.sampled_token_ids.item() == batched.sampled_token_ids[i].item()
