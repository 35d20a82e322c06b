"""The plot of one workload shape (``cotuning.py --plots``): throughput against the fixed
budget, ``auto``'s and ``cold``'s operating points, and the held-out runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.cotuning_runs import AUTOS


def plot(shape: str, data: dict[str, Any], directory: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = [r for r in data["runs"] if r["budget"] not in AUTOS]
    autos = {r["budget"]: r for r in data["runs"] if r["budget"] in AUTOS}
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot([int(r["budget"]) for r in fixed], [r["tokens_per_s"] for r in fixed], "o-",
            label="fixed budget")
    for name, marker in (("auto", "r*"), ("cold", "kx")):
        if name in autos:
            ax.plot([autos[name]["mean_inflight_tokens"]], [autos[name]["tokens_per_s"]],
                    marker, markersize=14 if name == "auto" else 10,
                    label=f"{name} (mean tokens in flight)")
    held = {r["budget"]: r for r in data.get("confirmation", [])}
    if held:
        winner = held[str(data["best_fixed_budget"])]
        ax.plot([int(winner["budget"])], [winner["tokens_per_s"]], "o", mfc="none",
                markersize=11, color="tab:blue", label="best fixed, held out")
        if "auto" in held:
            ax.plot([held["auto"]["mean_inflight_tokens"]], [held["auto"]["tokens_per_s"]],
                    "*", mfc="none", markersize=14, color="tab:red", label="auto, held out")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("in-flight token budget")
    ax.set_ylabel("output tokens / s")
    held_out = "" if "confirmation" not in data else ", held out"
    ax.set_title(f"{shape}: auto at {data['auto_vs_best_fixed']:.0%} of the best fixed "
                 f"budget{held_out}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"cotuning_{shape}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
