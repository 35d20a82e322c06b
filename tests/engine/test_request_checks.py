"""A request is checked once, in one place: ``LLMEngine.prepare_request`` settles its final
parameters (the max_tokens default, bad words as ids). Both doors go through it: the
synchronous engine's ``add_requests`` checks every request before it adds any, and the async
engine's ``generate`` checks in the caller's thread (or a worker thread for a long prompt)
and its loop thread adds the prepared request without checking it again."""

from __future__ import annotations

import pytest

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine import async_engine as async_engine_module
from pagedserve.server.engine.async_engine import AsyncEngine
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.core import request_preparation
from pagedserve.server.engine.core.request_preparation import EngineRequest
from pagedserve.server.engine.llm_engine import LLMEngine
from tests.checkpoints import make_checkpoint

MAX_MODEL_LEN = 64
VOCAB = 128


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    model_dir = make_checkpoint(tmp_path_factory.mktemp("checks-llama"), "llama",
                                vocab_size=VOCAB, hidden_size=32, num_attention_heads=2,
                                num_key_value_heads=1, num_hidden_layers=1,
                                max_position_embeddings=MAX_MODEL_LEN)
    return LLMEngine(EngineArgs(model=str(model_dir), dtype="float32", kernel_backend="torch",
                                skip_tokenizer_init=True, num_kv_blocks=32, block_size=4))


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[SamplingParams]:
    """The params of every ``validate_token_ids`` call the engine makes."""
    calls: list[SamplingParams] = []
    check = request_preparation.validate_token_ids

    def counted(params: SamplingParams, *args: object) -> None:
        calls.append(params)
        check(params, *args)

    monkeypatch.setattr(request_preparation, "validate_token_ids", counted)
    return calls


def test_max_tokens_defaults_to_the_room_the_prompt_leaves(engine: LLMEngine) -> None:
    given = SamplingParams(max_tokens=None)
    prepared = engine.prepare_request([1, 2, 3], given)
    assert prepared.params.max_tokens == MAX_MODEL_LEN - 3
    assert given.max_tokens is None  # the caller's params are left as given
    assert engine.prepare_request([1, 2, 3], SamplingParams(max_tokens=5)).params.max_tokens == 5


def test_the_context_rule_is_the_schedulers(engine: LLMEngine) -> None:
    with pytest.raises(InvalidRequestError) as info:
        engine.prepare_request(list(range(MAX_MODEL_LEN)), SamplingParams(max_tokens=None))
    assert (info.value.param, info.value.message) == (
        "prompt", f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, "
        f"the prompt has {MAX_MODEL_LEN} tokens, which leaves no room for a completion. "
        f"Please reduce the prompt.")
    with pytest.raises(InvalidRequestError) as info:
        engine.prepare_request([], SamplingParams())
    assert (info.value.param, info.value.message) == (
        "prompt", "the prompt must contain at least 1 token")
    with pytest.raises(InvalidRequestError) as info:
        engine.prepare_request([1, VOCAB], SamplingParams())
    assert info.value.message == f"prompt token id {VOCAB} is out of range for a vocabulary " \
                                 f"of {VOCAB}"


def test_add_request_checks_once(engine: LLMEngine, validations: list[SamplingParams]) -> None:
    engine.add_request("once", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))
    assert [p.max_tokens for p in validations] == [2]
    while engine.has_unfinished_requests():
        engine.step()


def test_a_bad_request_leaves_none_of_its_batch_behind(engine: LLMEngine) -> None:
    good = EngineRequest("good", [1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="at least 1 token"):
        engine.add_requests([good, EngineRequest("empty", [], SamplingParams())])
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("off_loop", [False, True], ids=["inline", "worker-thread"])
async def test_the_async_engine_checks_once_before_its_loop_adds(
        engine: LLMEngine, validations: list[SamplingParams], off_loop: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if off_loop:
        monkeypatch.setattr(async_engine_module, "PREPARE_OFF_LOOP_TOKENS", 0)
    async_engine = AsyncEngine(engine)
    await async_engine.start()
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0)
        (stream,) = await async_engine.generate([EngineRequest("async", [4, 5], params)])
        outputs = [output async for output in stream]
        assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 3
        assert [p.max_tokens for p in validations] == [3]
        with pytest.raises(InvalidRequestError, match="at least 1 token"):
            await async_engine.generate([EngineRequest("kept", [4], params),
                                         EngineRequest("empty", [], SamplingParams())])
        assert not engine.has_unfinished_requests()
    finally:
        await async_engine.shutdown()
