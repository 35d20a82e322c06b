"""``pagedserve:step_phase_seconds``: one observation per phase for every engine step."""

from __future__ import annotations

from openai import AsyncOpenAI

from pagedserve.server.engine.worker.step_timing import STEP_PHASES
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer
from tests.api.test_metrics import scrape

COUNT = "pagedserve:step_phase_seconds_count"


def _counts(samples: dict) -> dict[str, float]:
    labels = {phase: (("engine", "0"), ("model_name", MODEL), ("phase", phase))
              for phase in STEP_PHASES}
    return {phase: samples.get((COUNT, labels[phase]), 0.0) for phase in STEP_PHASES}


async def test_each_step_observes_every_phase(server: LiveServer, client: AsyncOpenAI) -> None:
    server.wait_until(lambda s: s.num_running == 0)
    before = await scrape(server)
    await client.completions.create(model=MODEL, prompt="time these steps", max_tokens=5,
                                    temperature=0, extra_body={"ignore_eos": True})
    after = await scrape(server)

    assert after[("type", "pagedserve:step_phase_seconds")] == "histogram"
    # Alone on the server, 5 tokens take 5 steps: the prompt's (which samples the first
    # token) and 4 decodes.
    grown = {phase: after_count - _counts(before)[phase]
             for phase, after_count in _counts(after).items()}
    assert grown == dict.fromkeys(STEP_PHASES, 5.0)
