from __future__ import annotations

import os

import pytest

from tests.checkpoints import make_checkpoint
from tests.gguf_files import write_gguf


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_step_reads_every_weight_once_and_the_mean_context(import_benchmark,
                                                                     tmp_path, tied):
    single_stream = import_benchmark("single_stream")
    checkpoint = make_checkpoint(tmp_path / "hf", "llama", tie_word_embeddings=tied,
                                 vocab_size=300, hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2)
    model = write_gguf(tmp_path / "m.gguf", checkpoint, qtype="Q8_0")
    import gguf

    tensors = gguf.GGUFReader(model).tensors
    weights = sum(int(t.n_bytes) for t in tensors)
    if not tied:  # the embedding is only looked up: one row a token, not the whole table
        weights -= next(int(t.n_bytes) for t in tensors if t.name == "token_embd.weight")
    # K and V: 2 layers x 2 KV heads x 16 dims x 2 bytes, 100 positions.
    kv = 2 * 2 * 2 * 16 * 2 * 100
    assert single_stream.bytes_per_token(model, context=100) == weights + kv


def _run(tok_s: float, ttft: float, tpot: float) -> dict:
    return {"output_tok_s": tok_s, "mean_ttft_ms": ttft, "mean_tpot_ms": tpot, "completed": 2}


def test_the_summary_takes_medians_ratios_and_the_roofline_share(import_benchmark, tmp_path,
                                                                  monkeypatch):
    single_stream = import_benchmark("single_stream")
    monkeypatch.setattr(single_stream, "bytes_per_token", lambda model, context: 500_000_000)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 1024)
    workloads = [single_stream.Workload("c1", 128, 128, 2, 1),
                 single_stream.Workload("c8", 128, 128, 16, 8)]
    def memory(startup: float, peak: int) -> dict:
        return {"startup_s": startup, "rss_ready": 1, "rss_decoding": 2, "rss_peak": peak,
                "kv_bytes": 2048}

    runs = {
        "pagedserve": [
            {"c1": _run(40, 90, 25.0), "c8": _run(100, 300, 70), "memory": memory(9.0, 5)},
            {"c1": _run(50, 80, 20.0), "c8": _run(120, 310, 60), "memory": memory(5.0, 3)},
            {"c1": _run(45, 85, 22.0), "c8": _run(110, 305, 65), "memory": memory(6.0, 4)}],
        "llama_cpp": [{"c1": _run(30, 100, 30.0), "c8": _run(40, 400, 180),
                       "memory": {"startup_s": 2.0, "rss_ready": 1, "rss_decoding": 1,
                                  "rss_peak": 1, "kv_bytes": None}}],
    }
    summary = single_stream.summarize(model, runs, workloads, bandwidth=50.0, context=192)
    ours = summary["servers"]["pagedserve"]
    assert ours["c1"] == {"output_tok_s": 45, "mean_ttft_ms": 85, "mean_tpot_ms": 22.0}
    assert ours["vs_llama_cpp"] == {"c1": 1.5, "c8": 110 / 40}
    # 500 MB in 22 ms = 22.7 GB/s, of 50 GB/s.
    assert ours["roofline_share"] == pytest.approx(500e6 / 0.022 / 50e9)
    # Start-up and memory are medians over the rounds too; the first start is kept beside.
    assert ours["startup_vs_llama_cpp"] == 3.0
    assert ours["memory"]["startup_s"] == 6.0 and ours["memory"]["rss_peak"] == 4
    assert ours["memory"]["startup_first_s"] == 9.0
    assert ours["memory"]["rss_goal"] == 1024 + 2048 + 400 * 2**20
    assert "rss_goal" not in summary["servers"]["llama_cpp"]["memory"]


def test_the_memory_watch_reads_this_process(import_benchmark):
    single_stream = import_benchmark("single_stream")
    watch = single_stream.MemoryWatch(os.getpid(), interval_s=0.01)
    try:
        rss, peak = watch.status("VmRSS"), watch.status("VmHWM")
    finally:
        watch.close()
    assert 0 < rss <= peak
    assert watch.peak_since(0) > 0
