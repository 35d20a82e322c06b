from __future__ import annotations


def test_every_decode_step_is_split_into_the_models_parts(import_benchmark):
    decode_profile = import_benchmark("decode_profile")
    result = decode_profile.profile("tiny", output_len=4, input_len=8,
                                    engine_args={"max_model_len": 32}, clock="thread")
    assert result["decode_steps"] == 3  # the first token comes from the prefill step
    ms = result["median_ms"]
    assert set(decode_profile.PARTS) <= set(ms)
    for part in ("matmul", "lm_head", "norm", "rope", "cache_write", "attention",
                 "silu_and_mul", "embedding"):
        assert ms[part] > 0, part
    assert ms["python"] >= 0
    assert ms["forward"] <= ms["step"]


def test_profile_wraps_each_part_once_per_call(import_benchmark):
    decode_profile = import_benchmark("decode_profile")
    from pagedserve.server import LLM

    llm = LLM(model="tiny", skip_tokenizer_init=True, max_model_len=32)
    timer = decode_profile.PartTimer()
    decode_profile.instrument(llm.engine.runner.model, timer)
    config = llm.engine.model_config
    llm.generate([{"prompt_token_ids": [1, 2, 3]}])
    layers = config.num_hidden_layers
    # One prefill step and then decode steps, each: per layer two norms, one rotary, one KV
    # write and four projections; the final norm; one embedding; one LM head row.
    steps = timer.calls["embedding"]
    assert steps >= 2
    assert timer.calls["norm"] == steps * (2 * layers + 1)
    assert timer.calls["rope"] == steps * layers
    assert timer.calls["cache_write"] == steps * layers
    assert timer.calls["matmul"] == steps * 4 * layers
    assert timer.calls["lm_head"] == steps
