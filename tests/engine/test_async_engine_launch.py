"""AsyncEngine.launch: the engine is built in the thread that steps it, a failed build raises
to the caller, and a launch cancelled mid-build shuts the engine down once it is built."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import ClassVar

import pytest

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine import async_engine
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.core.request_preparation import EngineRequest
from pagedserve.server.engine.llm_engine import LLMEngine
from pagedserve.server.models.model_load_error import ModelLoadError
from tests.checkpoints import make_checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_checkpoint(tmp_path_factory.mktemp("launch"), "llama"))


def _args(model_dir: str) -> EngineArgs:
    return EngineArgs(model=model_dir, dtype="float32", skip_tokenizer_init=True,
                      num_kv_blocks=32, max_model_len=128)


class _RecordingEngine(LLMEngine):
    built_in: ClassVar[list[int]] = []
    shut_down: ClassVar[threading.Event]

    def __init__(self, args: EngineArgs) -> None:
        type(self).built_in.append(threading.get_ident())
        super().__init__(args)

    def shutdown(self) -> None:
        super().shutdown()
        type(self).shut_down.set()


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> type[_RecordingEngine]:
    _RecordingEngine.built_in = []
    _RecordingEngine.shut_down = threading.Event()
    monkeypatch.setattr(async_engine, "LLMEngine", _RecordingEngine)
    return _RecordingEngine


async def test_the_engine_is_built_in_the_thread_that_steps_it(
        model_dir: str, recording: type[_RecordingEngine]) -> None:
    engine = await async_engine.AsyncEngine.launch(_args(model_dir))
    stepped_in: set[int] = set()
    engine.add_step_observer(lambda _stats: stepped_in.add(threading.get_ident()))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        (stream,) = await engine.generate([EngineRequest("r0", [1, 2, 3], params)])
        outputs = [out async for out in stream]
    finally:
        await engine.shutdown()
    assert outputs[-1].finished
    assert len(outputs[-1].outputs[0].token_ids) == 4
    assert stepped_in == set(recording.built_in)
    assert recording.built_in[0] != threading.get_ident()
    assert recording.shut_down.is_set()


async def test_a_failed_build_raises_to_the_caller(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match=re.escape("is not a directory with a config.json")):
        await async_engine.AsyncEngine.launch(EngineArgs(model=str(tmp_path / "missing")))


async def test_a_launch_cancelled_while_building_shuts_the_engine_down(
        model_dir: str, recording: type[_RecordingEngine]) -> None:
    task = asyncio.create_task(async_engine.AsyncEngine.launch(_args(model_dir)))
    while not recording.built_in:  # the build has started
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(recording.shut_down.wait, 60)
