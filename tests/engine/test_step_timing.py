"""StepTimer books the time between marks to phases that add up to the step."""

from __future__ import annotations

import itertools

from pagedserve.server.engine.worker import step_timing
from pagedserve.server.engine.worker.step_timing import STEP_PHASES, StepTimer, add_phases


def test_marks_book_the_time_since_the_previous_mark(monkeypatch):
    clock = itertools.count(start=10.0, step=0.5)
    monkeypatch.setattr(step_timing.time, "perf_counter", lambda: next(clock))
    timer = StepTimer()  # t = 10.0
    timer.mark("schedule")  # 10.5
    timer.mark("prepare")  # 11.0
    timer.mark("forward")  # 11.5
    timer.mark("forward")  # 12.0: a phase marked twice (logits after the model) adds up
    timer.mark("output")  # 12.5
    assert timer.phases == {"schedule": 0.5, "prepare": 0.5, "forward": 1.0, "sample": 0.0,
                            "output": 0.5}
    assert tuple(timer.phases) == STEP_PHASES
    assert timer.elapsed == sum(timer.phases.values()) == 2.5

    totals: dict[str, float] = {}
    add_phases(totals, timer.phases)
    add_phases(totals, {"forward": 2.0})
    assert totals["forward"] == 3.0 and totals["schedule"] == 0.5
