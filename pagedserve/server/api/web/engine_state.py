"""The body of ``GET /engine/state``: the engine's latest snapshot (``EngineSnapshot``).

The handler only reads the snapshot the step loop published; it never waits for a step. The
block grid comes as one digit per cell (``BlockState``: 0 free, 1 cached and evictable,
2 used, 3 shared); past ``MAX_CELLS`` blocks, each cell stands for ``blocks_per_cell``
consecutive blocks and shows the largest state among them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pagedserve.server.engine.engine_snapshot import BlockState

if TYPE_CHECKING:
    from pagedserve.server.engine.engine_snapshot import EngineSnapshot

MAX_CELLS = 4096
_DIGITS = bytes.maketrans(bytes(range(4)), b"0123")


def state_body(snapshot: EngineSnapshot, model: str) -> dict[str, Any]:
    counts = {state.name.lower(): snapshot.count(state) for state in BlockState}
    step_s = snapshot.step_time_s
    held = counts["used"] + counts["shared"]
    return {
        "object": "engine.state",
        "model": model,
        "num_steps": snapshot.num_steps,
        "num_running": snapshot.num_running,
        "num_waiting": snapshot.num_waiting,
        "num_swapped": snapshot.num_swapped,
        "num_preemptions": snapshot.num_preemptions,
        "step_ms": None if step_s is None else round(step_s * 1000.0, 3),
        "generation_tokens_per_s": round(snapshot.generation_tokens_per_s, 1),
        "prompt_tokens_per_s": round(snapshot.prompt_tokens_per_s, 1),
        "prefix_cache_hit_rate": snapshot.prefix_cache_hit_rate,
        "kv_cache_usage": held / snapshot.num_blocks if snapshot.num_blocks else 0.0,
        "blocks": {
            "block_size": snapshot.block_size,
            "num_blocks": snapshot.num_blocks,
            **counts,
            **grid_cells(snapshot.block_states, snapshot.num_blocks),
        },
    }


def grid_cells(states: bytes, num_blocks: int, max_cells: int = MAX_CELLS) -> dict[str, Any]:
    """The grid: ``cells`` (one digit each) and ``blocks_per_cell``."""
    per_cell = max(1, -(-num_blocks // max_cells))
    num_cells = -(-num_blocks // per_cell)
    padded = np.zeros(num_cells * per_cell, dtype=np.uint8)
    padded[:len(states)] = np.frombuffer(states, dtype=np.uint8)
    cells = padded.reshape(num_cells, per_cell).max(axis=1)
    return {"blocks_per_cell": per_cell, "cells": cells.tobytes().translate(_DIGITS).decode()}
