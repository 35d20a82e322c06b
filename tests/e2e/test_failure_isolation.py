"""One request's failure is that request's failure: an exception while post-processing one
sequence ends that request (finish_reason "error", blocks freed), while a concurrent request
completes with transformers' exact tokens and the engine serves the next one."""

from __future__ import annotations

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.tokenizer.detokenizer import IncrementalDetokenizer


class FailingDetokenizer:
    """Delegates to a real detokenizer and raises on its ``fail_at``-th call."""

    def __init__(self, inner: IncrementalDetokenizer, fail_at: int) -> None:
        self.inner = inner
        self.calls = 0
        self.fail_at = fail_at

    def add_tokens(self, token_ids: list[int]) -> str:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("detokenizer exploded")
        return self.inner.add_tokens(token_ids)

    def flush(self) -> str:
        return self.inner.flush()

    def fork(self) -> FailingDetokenizer:
        child = FailingDetokenizer(self.inner.fork(), self.fail_at)
        child.calls = self.calls
        return child


def run(llm: LLM) -> dict[str, RequestOutput]:
    finals = {}
    while llm.engine.has_unfinished_requests():
        for output in llm.engine.step():
            assert output.request_id not in finals, "an output after the final one"
            if output.finished:
                finals[output.request_id] = output
    return finals


def test_a_failing_request_ends_alone(llama_case: tuple) -> None:
    model_dir, prompts, expected = llama_case
    llm = LLM(str(model_dir), dtype="float32", block_size=8)
    engine = llm.engine
    free_before = engine.stats().free_token_capacity
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    engine.add_request("bad", prompts[5], SamplingParams(temperature=0.0, max_tokens=16, n=2))
    engine.add_request("good", prompts[6], greedy)
    bad = engine.scheduler.get_seq_group("bad")
    text = bad.seqs[0].text
    text.detokenizer = FailingDetokenizer(text.detokenizer, fail_at=3)

    finals = run(llm)

    failed = finals["bad"]
    assert failed.error == ("processing the request's output failed "
                            "(RuntimeError: detokenizer exploded)")
    assert [(c.finish_reason, len(c.token_ids)) for c in failed.outputs] == [("error", 3)] * 2
    assert finals["good"].error is None
    assert finals["good"].outputs[0].token_ids == expected[6][:16]
    assert finals["good"].outputs[0].finish_reason == "length"
    assert engine.stats().free_token_capacity == free_before
    engine.scheduler.check_integrity()

    # The engine goes on: the next request is served exactly.
    after = llm.generate({"prompt_token_ids": prompts[4]}, greedy)[0]
    assert after.error is None and after.outputs[0].token_ids == expected[4][:16]
    assert engine.stats().free_token_capacity == free_before
