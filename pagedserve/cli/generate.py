"""``pagedserve generate PROMPT...``: offline generation with the engine."""

from __future__ import annotations

import argparse
import sys

from pagedserve.server.engine.config.engine_args import EngineArgs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.description = "Generate completions offline (no server) and print them."
    parser.add_argument("prompts", nargs="*", default=None,
                        help="prompts; None: read one per line from stdin")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=32,
                          help="most tokens to generate per completion")
    sampling.add_argument("--temperature", type=float, default=0.0,
                          help="sampling temperature; 0: greedy")
    sampling.add_argument("--top-p", type=float, default=1.0,
                          help="nucleus sampling: keep the smallest set of tokens whose "
                               "probability reaches this")
    sampling.add_argument("--top-k", type=int, default=-1,
                          help="keep the k most likely tokens; -1: all")
    sampling.add_argument("--n", type=int, default=1, help="completions per prompt")
    sampling.add_argument("--sampling-seed", type=int, default=None,
                          help="per-request sampling seed; None: the engine's generator")
    sampling.add_argument("--ignore-eos", action="store_true",
                          help="keep generating past the end-of-sequence token")
    EngineArgs.add_cli_args(parser)


def run(args: argparse.Namespace) -> int:
    from pagedserve.common.engine_errors import PagedServeError
    from pagedserve.common.sampling_params import SamplingParams
    from pagedserve.server.engine.parallel.rendezvous import launched_rank
    from pagedserve.server.llm import LLM

    if launched_rank():  # a rank > 0 under torchrun serves rank 0's steps
        from pagedserve.server.engine.parallel.worker import run_launched_worker

        return run_launched_worker()
    prompts = args.prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        print("pagedserve generate: no prompt given", file=sys.stderr)
        return 2
    try:
        params = SamplingParams(
            n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            max_tokens=args.max_tokens, seed=args.sampling_seed, ignore_eos=args.ignore_eos,
        )
        llm = LLM.from_engine_args(EngineArgs.from_cli_args(args))
    except (PagedServeError, ValueError) as exc:
        print(f"pagedserve generate: {exc}", file=sys.stderr)
        return 2
    try:
        results = llm.generate(prompts, params)
    except (PagedServeError, ValueError) as exc:
        print(f"pagedserve generate: {exc}", file=sys.stderr)
        return 2
    finally:
        llm.engine.shutdown()
    for result in results:
        for output in result.outputs:
            print(f"{result.prompt!r} -> {output.text!r} "
                  f"[{len(output.token_ids)} tokens, finish_reason={output.finish_reason}]")
    return 0

