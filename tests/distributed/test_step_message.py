"""The step message survives its trip: packed into one byte tensor and unpacked, every field
and every tensor (dtype, shape, values) comes back, at any alignment."""

from __future__ import annotations

import torch

from pagedserve.server.engine.parallel.step_message import StepKind, StepMessage, pack, unpack
from pagedserve.server.engine.worker.model_input import ModelInput
from pagedserve.server.models.attention import AttentionMetadata


def message() -> StepMessage:
    # Three sequences of 3, 1 and 1 new tokens; odd lengths put later tensors off alignment.
    attn = AttentionMetadata(
        slot_mapping=torch.tensor([17, 18, 19, 40, 63], dtype=torch.int64),
        block_tables=torch.tensor([[1, 2], [5, 0], [7, 3]], dtype=torch.int32),
        seq_lens=torch.tensor([20, 9, 32], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 3, 4, 5], dtype=torch.int32),
        max_query_len=3,
        is_decode_only=False,
    )
    inp = ModelInput(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([17, 18, 19, 8, 31]), attn,
                     [0, 3, 4, 5])
    return StepMessage(StepKind.EXECUTE, inp, blocks_to_swap_out=[(4, 0)],
                       blocks_to_swap_in=[(1, 6)], blocks_to_copy=[(2, 9), (3, 10)],
                       logit_rows=[2, 3, 4])


def test_a_message_round_trips_exactly() -> None:
    sent = message()
    body, skeleton_len = pack(sent)
    assert body.dtype == torch.uint8 and body.dim() == 1
    got = unpack(body, skeleton_len, torch.device("cpu"))
    assert (got.kind, got.blocks_to_swap_out, got.blocks_to_swap_in, got.blocks_to_copy,
            got.logit_rows) == (StepKind.EXECUTE, [(4, 0)], [(1, 6)], [(2, 9), (3, 10)],
                                [2, 3, 4])
    a, b = sent.model_input, got.model_input
    assert b.query_start_loc == [0, 3, 4, 5]
    for name in ("input_ids", "positions"):
        assert getattr(b, name).dtype == torch.int64
        assert torch.equal(getattr(a, name), getattr(b, name))
    for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
        x, y = getattr(a.attn, name), getattr(b.attn, name)
        assert (y.dtype, y.shape) == (x.dtype, x.shape) and torch.equal(x, y), name
    assert (b.attn.max_query_len, b.attn.is_decode_only) == (3, False)


def test_a_message_without_a_batch() -> None:
    body, skeleton_len = pack(StepMessage(StepKind.SHUTDOWN))
    got = unpack(body, skeleton_len, torch.device("cpu"))
    assert got == StepMessage(StepKind.SHUTDOWN)
