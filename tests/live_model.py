"""The checkpoint the live-server tests serve: a tiny seeded Llama with a trained byte-level
BPE tokenizer and a ChatML template, under the served name ``MODEL``.

``write_live_model(tmp_dir) -> Path`` writes it; each test folder wraps it in its own
session fixture (tests/api/conftest.py, tests/integration/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import make_checkpoint
from tests.tokenizer_files import write_hf_tokenizer

VOCAB_SIZE = 384
# Long enough that a generation is still running when a test disconnects or drains.
MAX_MODEL_LEN = 1024
MODEL = "tiny-test"


def write_live_model(tmp_dir: Path) -> Path:
    """The checkpoint and its tokenizer files in ``tmp_dir``; returns it."""
    path = make_checkpoint(tmp_dir, "llama", vocab_size=VOCAB_SIZE,
                           max_position_embeddings=MAX_MODEL_LEN)
    write_hf_tokenizer(path, VOCAB_SIZE)
    return path
