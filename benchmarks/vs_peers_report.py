"""The table and the last-line JSON of ``vs_peers.py``: one row per workload, each server's
median over the rounds, and the ratios of those medians.

A round runs every server once over every workload, one after another; on a machine whose
speed drifts (a VM beside other tenants) a single round can put one server in a slow spell
and another in a fast one, so with several rounds each cell is that server's median round,
and the per-round ratios are listed beside it.
"""

from __future__ import annotations

import json
import os

SERVERS = ("pagedserve", "vllm_cpu", "llama_cpp")


def median_result(runs: list[dict]) -> dict:
    """The run of median throughput (the lower middle one of an even count), with every
    round's throughput beside it."""
    ordered = sorted(runs, key=lambda r: r["output_tok_s"])
    chosen = ordered[(len(ordered) - 1) // 2]
    return chosen | {"rounds_tok_s": [round(r["output_tok_s"], 1) for r in runs]}


def merge_rounds(rounds: list[dict[str, dict]], workload: str) -> dict[str, dict | None]:
    """{server: its median result on ``workload``, or None where no round has one}."""
    merged: dict[str, dict | None] = {}
    for server in SERVERS:
        runs = [r[server][workload] for r in rounds if workload in r.get(server, {})]
        merged[server] = median_result(runs) if runs else None
    return merged


def _ratio(ours: dict | None, theirs: dict | None) -> float | None:
    if ours is None or theirs is None or theirs["output_tok_s"] <= 0:
        return None
    return round(ours["output_tok_s"] / theirs["output_tok_s"], 3)


def round_ratios(rounds: list[dict[str, dict]], workload: str, peer: str) -> list[float]:
    """pagedserve over ``peer`` within each round that has both."""
    ratios = []
    for r in rounds:
        ours, theirs = r.get("pagedserve", {}).get(workload), r.get(peer, {}).get(workload)
        ratio = _ratio(ours, theirs)
        if ratio is not None:
            ratios.append(ratio)
    return ratios


def _cell(result: dict | None, width: int) -> str:
    return f"{result['output_tok_s']:{width}.1f}" if result else f"{'-':>{width}s}"


def _ratio_cell(ratio: float | None, width: int) -> str:
    return f"{ratio:{width}.2f}" if ratio is not None else f"{'-':>{width}s}"


def report(rounds: list[dict[str, dict]], workloads: list, skipped: dict, second: dict | None,
           kv_tokens: int, kv_gib: int, cache_type: str, kv_dtype: str = "float32") -> None:
    label = f"median of {len(rounds)} rounds, " if len(rounds) > 1 else ""
    print(f"\n{'workload':30s} {'pagedserve':>11s} {'vLLM CPU':>9s} {'llama.cpp':>10s} "
          f"{'vs vLLM':>8s} {'vs llama':>9s}   ({label}output tok/s, completed requests "
          "only)")
    rows = {}
    for w in workloads:
        merged = merge_rounds(rounds, w.name)
        ours, vllm, llama = merged["pagedserve"], merged["vllm_cpu"], merged["llama_cpp"]
        row = {"input_len": w.input_len, "output_len": w.output_len,
               "num_prompts": w.num_prompts, "max_concurrency": w.concurrency,
               "pagedserve": ours, "vllm_cpu": vllm, "llama_cpp": llama,
               "ratio_vs_vllm_cpu": _ratio(ours, vllm), "ratio_vs_llama_cpp": _ratio(ours, llama),
               "round_ratios_vs_vllm_cpu": round_ratios(rounds, w.name, "vllm_cpu"),
               "round_ratios_vs_llama_cpp": round_ratios(rounds, w.name, "llama_cpp")}
        rows[w.name] = row
        print(f"{w.name:30s} {_cell(ours, 11)} {_cell(vllm, 9)} {_cell(llama, 10)} "
              f"{_ratio_cell(row['ratio_vs_vllm_cpu'], 8)} "
              f"{_ratio_cell(row['ratio_vs_llama_cpp'], 9)}")
        if len(rounds) > 1:
            print(f"{'':30s} per round: vs vLLM {row['round_ratios_vs_vllm_cpu']}, vs llama "
                  f"{row['round_ratios_vs_llama_cpp']}")
    startup = {}
    for r in rounds:
        for server, results in r.items():
            startup.setdefault(server, round(results["startup_s"], 1))
    summary = {
        "benchmark": "vs_peers", "cores": os.cpu_count(),
        "load_average_end": [round(x, 2) for x in os.getloadavg()], "rounds": len(rounds),
        "kv_budget_gib": kv_gib, "kv_budget_tokens": kv_tokens, "kv_cache_dtype": kv_dtype,
        "llama_cache_type": cache_type,
        "startup_s": startup, "skipped": skipped, "second_opinion": second, "workloads": rows,
    }
    for peer in ("vllm_cpu", "llama_cpp"):
        ratios = [r[f"ratio_vs_{peer}"] for r in rows.values()
                  if r[f"ratio_vs_{peer}"] is not None]
        summary[f"min_ratio_vs_{peer}"] = min(ratios) if ratios else None
    print(json.dumps(summary))
