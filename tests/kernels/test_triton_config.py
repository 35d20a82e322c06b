"""The launch heuristics: when decode splits the context, and how prefill tiles its rows."""

from __future__ import annotations

import pytest

from pagedserve.kernels.triton import (
    DecodeConfig,
    PrefillConfig,
    choose_decode_config,
    choose_prefill_config,
)
from pagedserve.kernels.triton.checks import AttentionShape

H200_SMS = 132


def _llama(block_size: int = 16, context: int = 8192, head_dim: int = 128) -> AttentionShape:
    return AttentionShape(num_heads=32, num_kv_heads=8, head_dim=head_dim,
                          block_size=block_size, max_blocks_per_seq=context // block_size)


@pytest.mark.parametrize(
    "num_seqs,context,expected",
    [
        # 8 programs on 132 SMs: split as far as the 256-token minimum allows.
        (1, 8192, DecodeConfig(kv_tile=64, partition_size=256)),
        (1, 512, DecodeConfig(kv_tile=64, partition_size=256)),
        # 64 programs want 9 splits of a 2k context; 8 is the most 256-token pieces allow.
        (8, 2048, DecodeConfig(kv_tile=64, partition_size=256)),
        # 512 programs fall just short of 4 per SM: two splits.
        (64, 8192, DecodeConfig(kv_tile=64, partition_size=4096)),
        # 2048 programs fill the device: no split, no reduce pass.
        (256, 8192, DecodeConfig(kv_tile=64)),
        # A context of one minimum partition is never split.
        (1, 256, DecodeConfig(kv_tile=64)),
    ],
)
def test_decode_splits_only_an_underfilled_device(num_seqs, context, expected):
    assert choose_decode_config(_llama(context=context), num_seqs, H200_SMS) == expected


def test_decode_partition_is_a_whole_number_of_tiles():
    # 5 sequences x 8 KV heads want 14 splits, but 3000 tokens hold only 12 pieces of 256;
    # 3000 / 12 = 250 tokens round up to 4 tiles of 64.
    shape = _llama(block_size=8, context=3000)
    config = choose_decode_config(shape, 5, H200_SMS)
    assert config == DecodeConfig(kv_tile=64, partition_size=256)
    assert config.num_splits(3000) == 12


def test_large_head_dims_take_smaller_tiles():
    assert choose_decode_config(_llama(head_dim=256), 256, H200_SMS).kv_tile == 32
    assert choose_prefill_config(_llama(head_dim=256)).kv_tile == 32
    assert choose_decode_config(_llama(head_dim=80), 256, H200_SMS).kv_tile == 64


def test_fp32_caches_shrink_the_tiles_to_fit_shared_memory():
    # Q + K + V tiles stay within 64 KiB: the KV tile shrinks first, then the query rows.
    gqa8_d256 = AttentionShape(8, 1, 256, 8, 64)
    assert choose_prefill_config(gqa8_d256, element_size=4) == PrefillConfig(block_q=4,
                                                                            kv_tile=16)
    assert choose_prefill_config(gqa8_d256, element_size=2) == PrefillConfig(block_q=8,
                                                                            kv_tile=32)
    assert choose_decode_config(_llama(head_dim=80), 256, H200_SMS, element_size=4).kv_tile == 32


@pytest.mark.parametrize("num_heads,num_kv_heads,block_q", [(32, 32, 64), (32, 8, 16),
                                                             (48, 8, 8), (128, 1, 1)])
def test_prefill_tile_rows_cover_the_group(num_heads, num_kv_heads, block_q):
    shape = AttentionShape(num_heads, num_kv_heads, 128, 16, 64)
    assert choose_prefill_config(shape) == PrefillConfig(block_q=block_q, kv_tile=64)


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: DecodeConfig(kv_tile=8), "kv_tile 8 must be a power of two >= 16"),
        (lambda: DecodeConfig(kv_tile=48), "kv_tile 48 must be a power of two >= 16"),
        (lambda: DecodeConfig(kv_tile=16, partition_size=0),
         "partition_size 0 must be a positive multiple of kv_tile 16"),
        (lambda: PrefillConfig(block_q=3, kv_tile=16), "block_q 3 must be a power of two >= 1"),
    ],
)
def test_bad_configs_are_rejected(build, message):
    with pytest.raises(ValueError, match=message):
        build()
