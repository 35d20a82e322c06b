"""Structured output under tensor parallelism: the grammar lives with the sampler on rank 0,
so two ranks give one rank's constrained tokens, and every output validates."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server import LLM, SamplingParams
from tests.live_model import write_live_model
from tests.structured.schemas import SCHEMAS

ENGINE = dict(dtype="float32", num_kv_blocks=64, max_model_len=256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("tp-structured"))


def test_two_ranks_give_one_ranks_constrained_tokens(model_dir: Path) -> None:
    schemas = SCHEMAS[:8]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=120,
                             structured_outputs=StructuredOutputsParams(json=schema))
              for i, schema in enumerate(schemas)]
    prompts = [f"Record {i}:" for i in range(len(schemas))]
    outputs = []
    for size in (1, 2):
        llm = LLM(str(model_dir), tensor_parallel_size=size, **ENGINE)
        try:
            outputs.append([r.outputs[0].token_ids for r in llm.generate(prompts, params)])
            texts = [llm.get_tokenizer().decode(ids) for ids in outputs[-1]]
        finally:
            llm.engine.shutdown()
        for schema, text in zip(schemas, texts, strict=True):
            jsonschema.validate(json.loads(text), schema)
    assert outputs[0] == outputs[1]
