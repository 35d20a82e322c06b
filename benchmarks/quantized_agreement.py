"""Greedy agreement with llama.cpp on the same GGUF file: for each of N prompts (lines of the
sonnets the load generator ships), how many leading tokens pagedserve's greedy continuation
(``--quantization gguf`` by default, offline engine) shares with llama-server's (temperature 0,
its default settings, one slot). Both get the same prompt token ids (the file's tokenizer) and
both are compared by the token ids they generated (llama.cpp's ``/completion`` with
``return_tokens``), so that no tokenizer difference and no re-tokenization of text counts as
disagreement. ``--compare text`` is the older measure: the
prompt sent as text and llama.cpp's text re-tokenized.

    python -m benchmarks.quantized_agreement --llama-server PATH [--gguf FILE] [--prompts 50]
        [--tokens 32] [--variants gguf,gguf:int16,none] [--dtype auto] [--threads N]

The median of 50 prompts moves a lot with the draw of prompts (each count is 32 or stops at the
first differing token): each line gives a 95% bootstrap interval of the median, and
``--prompts 400`` narrows it. Last line: JSON with each variant's median, its interval and each
prompt's count of leading tokens in common.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.harness import free_port, stop, wait_ready
from benchmarks.vs_peers import Server

ROOT = Path(__file__).resolve().parents[1]
SONNETS = ROOT / "pagedserve" / "loadgen" / "sonnets.txt"


def prompts(count: int) -> list[str]:
    lines = [line.strip() for line in SONNETS.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if len(line.split()) >= 5][:count]


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(),
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def llama_greedy(binary: Path, model: Path, prompts_: list[str] | list[list[int]], tokens: int,
                 threads: int, work: Path) -> list[str] | list[list[int]]:
    """llama.cpp's greedy continuation of each prompt: its text for a text prompt, its token
    ids for a prompt of token ids."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = Server("llama_cpp", [str(binary), "-m", str(model), "--host", "127.0.0.1",
                                  "--port", str(port), "-np", "1", "-t", str(threads)],
                    {}, work / "llama-agreement.log")
    proc = server.start()
    try:
        wait_ready(base, proc, 300)
        out = []
        for prompt in prompts_:
            if isinstance(prompt, str):
                body = _post(base + "/v1/completions", {
                    "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True})
                out.append(body["choices"][0]["text"])
            else:
                body = _post(base + "/completion", {
                    "prompt": prompt, "n_predict": tokens, "temperature": 0,
                    "ignore_eos": True, "return_tokens": True, "cache_prompt": False})
                out.append(body["tokens"])
        return out
    finally:
        stop(proc)


def leading_common(mine: list[int], other: list[int]) -> int:
    same = 0
    while same < min(len(mine), len(other)) and mine[same] == other[same]:
        same += 1
    return same


def median_interval(counts: list[int], draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median: how far another draw of prompts could move it."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(counts, k=len(counts)))
                     for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def ours_greedy(model: Path, variant: str, args: argparse.Namespace,
                prompts_: list[str] | list[dict]) -> list[list[int]]:
    from pagedserve.server import LLM, SamplingParams

    quantization, _, activations = variant.partition(":")
    llm = LLM(str(model), quantization=quantization, dtype=args.dtype,
              quantized_activations=activations or "int8", cpu_threads=args.threads,
              max_model_len=512)
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts_, params)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--gguf", default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--variants", default="gguf",
                        help="comma-separated --quantization values, each optionally with "
                             "--quantized-activations: gguf,gguf:int16,none")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--compare", choices=("ids", "text"), default="ids")
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "agreement"))
    args = parser.parse_args(argv)
    from pagedserve.server.models.model_path import resolve_model
    from pagedserve.server.tokenizer import load_tokenizer

    model = resolve_model(args.gguf or "smollm2")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.prompts)
    tokenizer = load_tokenizer(str(model))
    sent = [tokenizer.encode(t) for t in texts] if args.compare == "ids" else texts
    # In ids mode both engines get the very same prompt ids.
    ours_prompts = [{"prompt_token_ids": ids} for ids in sent] if args.compare == "ids" else texts
    theirs = llama_greedy(Path(args.llama_server), model, sent, args.tokens, args.threads, work)
    if args.compare == "text":
        theirs = [tokenizer.encode(t, add_special_tokens=False) for t in theirs]
    results = {}
    for variant in args.variants.split(","):
        ours = ours_greedy(model, variant, args, ours_prompts)
        common = [leading_common(a, b) for a, b in zip(ours, theirs, strict=True)]
        median, (low, high) = statistics.median(common), median_interval(common)
        print(f"{variant} ({args.dtype}): {len(texts)} prompts, {args.tokens} tokens each: median "
              f"{median} leading tokens in common with llama.cpp (95% interval {low}-{high}; "
              f"mean {statistics.mean(common):.1f}; {sum(c == args.tokens for c in common)} "
              "identical)", flush=True)
        results[variant] = {"median_common_tokens": median, "median_interval": [low, high],
                            "common_tokens": common}
    print(json.dumps({"dtype": args.dtype, "compare": args.compare, "variants": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
