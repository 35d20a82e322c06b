"""The options of ``pagedserve bench`` (vLLM's ``bench serve`` names where the meaning is the
same) and their translation into validated settings."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import orjson

from pagedserve.loadgen.bench import BenchSettings
from pagedserve.loadgen.bench_config import (
    ARRIVALS,
    BACKEND_ENDPOINTS,
    ENDPOINT_PATHS,
    LATENCY_METRICS,
    RAMP_UP_STRATEGIES,
    LoadShape,
    MetricSpec,
    RequestSpec,
    endpoint_kind,
    parse_csv_floats,
    parse_csv_names,
    parse_goodput,
)
from pagedserve.loadgen.bench_errors import BenchConfigError
from pagedserve.loadgen.datasets import DATASET_NAMES, DatasetSpec
from pagedserve.loadgen.hf_tokenizer import is_tokenizer_dir
from pagedserve.loadgen.sonnet import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, DEFAULT_PREFIX_LEN

TOKENIZER_MODES = ("auto", "slow", "mistral", "custom")
DEFAULT_TOKENIZER = "cl100k_base"


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of one benchmark run (``bench`` and each point of ``bench sweep``)."""
    _server_options(parser.add_argument_group("server"))
    _dataset_options(parser.add_argument_group("dataset"))
    _sampling_options(parser.add_argument_group("sampling"))
    _load_options(parser.add_argument_group("load shape"))
    _metric_options(parser.add_argument_group("metrics"))
    _output_options(parser.add_argument_group("output"))


def _server_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--backend", choices=sorted(BACKEND_ENDPOINTS), default="openai",
                       help="vLLM's client flavours: openai and vllm send /v1/completions, "
                            "openai-chat /v1/chat/completions (default: %(default)s)")
    group.add_argument("--base-url", default=None,
                       help="server URL, with or without /v1 (default: http://HOST:PORT)")
    group.add_argument("--host", default="127.0.0.1",
                       help="server host when --base-url is not given (default: %(default)s)")
    group.add_argument("--port", type=int, default=8000,
                       help="server port when --base-url is not given (default: %(default)s)")
    group.add_argument("--endpoint", default=None,
                       help="'completions', 'chat', or a path such as /v1/completions "
                            "(default: the --backend's endpoint)")
    group.add_argument("--model", help="model name sent in every request (required); a local "
                                       "model directory also serves as --tokenizer")
    group.add_argument("--served-model-name",
                       help="name sent in requests when it differs from --model")
    group.add_argument("--header", nargs="+", metavar="KEY=VALUE",
                       help="extra HTTP headers; OPENAI_API_KEY in the environment is sent "
                            "as a bearer token")
    group.add_argument("--request-timeout", type=float, default=6 * 60 * 60.0,
                       help="seconds one request may take in all (default: 6 hours)")


def _dataset_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    group.add_argument("--dataset-path",
                       help="ShareGPT-format JSON for sharegpt; a text file of lines for "
                            "sonnet (default there: Shakespeare's sonnets, shipped)")
    group.add_argument("--num-prompts", type=int, default=1000,
                       help="requests to send; with --duration, the distinct prompts cycled")
    group.add_argument("--tokenizer", default=None,
                       help="counts prompt lengths: a tiktoken encoding, a local Hugging Face "
                            "tokenizer directory, or 'server' for the server's POST /tokenize "
                            f"(default: --model if it is such a directory, else "
                            f"{DEFAULT_TOKENIZER})")
    group.add_argument("--tokenizer-mode", choices=TOKENIZER_MODES, default="auto",
                       help="accepted for vLLM command lines; tokenizer.json is read the same "
                            "way in every mode")
    group.add_argument("--trust-remote-code", action="store_true",
                       help="accepted for vLLM command lines; no code is ever loaded")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--random-input-len", type=int, default=1024)
    group.add_argument("--random-output-len", type=int, default=128)
    group.add_argument("--random-range-ratio", type=float, default=0.0,
                       help="lengths uniform in [L·(1−r), L·(1+r)], r in [0, 1)")
    group.add_argument("--random-prefix-len", type=int, default=0,
                       help="a prefix shared by every random prompt, in tokens")
    group.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    group.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    group.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    group.add_argument("--prefix-repetition-output-len", type=int, default=128)
    group.add_argument("--sharegpt-output-len", type=int,
                       help="fixed output length instead of each reply's length")
    group.add_argument("--sonnet-input-len", type=int, default=DEFAULT_INPUT_LEN,
                       help="most tokens of a sonnet prompt, chat template included")
    group.add_argument("--sonnet-output-len", type=int, default=DEFAULT_OUTPUT_LEN)
    group.add_argument("--sonnet-prefix-len", type=int, default=DEFAULT_PREFIX_LEN,
                       help="tokens of poem lines every sonnet prompt shares")


def _sampling_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--n", type=int, default=1, help="parallel samples per request")
    group.add_argument("--best-of", type=int,
                       help="candidates per request (beam width); above --n the requests "
                            "are sent unstreamed and TTFT, TPOT and ITL do not apply")
    group.add_argument("--use-beam-search", action="store_true",
                       help="beam search, sent unstreamed (TTFT, TPOT and ITL do not apply)")
    group.add_argument("--temperature", type=float,
                       help="default 0 (greedy), or 1.0 with --n > 1 without beam search")
    group.add_argument("--top-p", type=float)
    group.add_argument("--top-k", type=int, help="-1 for no limit (a vLLM extension)")
    group.add_argument("--min-p", type=float, help="a vLLM extension")
    group.add_argument("--logprobs", type=int,
                       help="logprobs per token to return (chat: top_logprobs)")
    group.add_argument("--ignore-eos", action="store_true",
                       help="generate exactly max_tokens (a vLLM extension)")
    group.add_argument("--extra-body", help="JSON object merged into every request body")
    group.add_argument("--response-format", metavar="json_object|SCHEMA.json",
                       help="constrain every output: json_object, or a file holding a JSON "
                            "schema (sent as response_format json_schema, strict)")


def _load_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--request-rate", type=float, default=math.inf,
                       help="requests per second (default: inf, all at once)")
    group.add_argument("--burstiness", type=float, default=1.0,
                       help="gamma shape of the gaps: 1 = Poisson, <1 burstier, >1 smoother")
    group.add_argument("--arrival", choices=ARRIVALS, default="gamma",
                       help="random (gamma) gaps or constant 1/rate gaps")
    group.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    group.add_argument("--duration", type=float,
                       help="send for this many seconds instead of --num-prompts requests")
    group.add_argument("--ramp-up-strategy", choices=RAMP_UP_STRATEGIES)
    group.add_argument("--ramp-up-start-rps", type=float)
    group.add_argument("--ramp-up-end-rps", type=float)
    group.add_argument("--num-warmups", type=int, default=0,
                       help="untimed requests sent before the run")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's own options; exactly one is required."""
    group = parser.add_argument_group("sweep (exactly one)")
    group.add_argument("--sweep-request-rates", type=_csv_floats("--sweep-request-rates"),
                       dest="sweep_request_rate", metavar="R1,R2,...",
                       help="one run per request rate, e.g. 1,2,4,8,inf")
    group.add_argument("--sweep-max-concurrency", type=_csv_floats("--sweep-max-concurrency"),
                       dest="sweep_max_concurrency", metavar="C1,C2,...",
                       help="one run per concurrency cap, e.g. 1,4,16,64")


def _metric_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--percentile-metrics", default=",".join(LATENCY_METRICS),
                       help="comma-separated subset of %(default)s")
    group.add_argument("--metric-percentiles", default="50,90,99")
    group.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                       help="SLOs, e.g. ttft:200 tpot:50 e2el:5000")


def _output_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--disable-tqdm", action="store_true")
    group.add_argument("--save-result", action="store_true")
    group.add_argument("--save-detailed", action="store_true",
                       help="include per-request lists in the result JSON")
    group.add_argument("--result-dir")
    group.add_argument("--result-filename")
    group.add_argument("--result-json", help="write the result JSON to this path")
    group.add_argument("--per-request-jsonl", help="write one JSON line per request")
    group.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR")
    group.add_argument("--label", help="a name for this run, kept in the result")
    group.add_argument("--metadata", nargs="*", metavar="KEY=VALUE",
                       help="extra fields recorded in the result JSON")


def _csv_floats(option: str) -> Any:
    def parse(text: str) -> tuple[float, ...]:
        try:
            return parse_csv_floats(option, text)
        except BenchConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Validated settings; raises :class:`BenchConfigError` naming the first bad option."""
    if not args.model:
        raise BenchConfigError("--model", args.model, "given (the model name to request)")
    request = _request_spec(args)
    goodput = parse_goodput(args.goodput)
    if not request.streams and set(goodput) - {"e2el"}:
        raise BenchConfigError("--goodput", args.goodput,
                               "e2el only with unstreamed requests (--best-of above --n, "
                               "--use-beam-search), which have no TTFT or TPOT")
    return BenchSettings(
        request=request,
        shape=_load_shape(args),
        dataset=_dataset_spec(args),
        metrics=MetricSpec(
            percentile_metrics=parse_csv_names("--percentile-metrics", args.percentile_metrics),
            metric_percentiles=parse_csv_floats("--metric-percentiles", args.metric_percentiles),
            goodput=goodput,
        ),
        tokenizer=_tokenizer(args),
        backend="openai-chat" if request.endpoint == "chat" else args.backend,
        show_progress=not args.disable_tqdm,
        save_detailed=args.save_detailed,
        label=args.label,
        api_key=os.environ.get("OPENAI_API_KEY") or None,
        metadata=parse_pairs("--metadata", args.metadata, "="),
    )


def _tokenizer(args: argparse.Namespace) -> str:
    if args.tokenizer:
        return str(args.tokenizer)
    return str(args.model) if is_tokenizer_dir(args.model) else DEFAULT_TOKENIZER


def _endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """(endpoint kind, explicit path or None) from --endpoint and --backend."""
    given = args.endpoint
    if given is None:
        return BACKEND_ENDPOINTS[args.backend], None
    if given in ENDPOINT_PATHS:
        kind, path = given, None
    else:
        kind, path = endpoint_kind(given), given
        if kind is None or not given.startswith("/"):
            raise BenchConfigError("--endpoint", given, "'completions', 'chat' or a path "
                                   "such as /v1/completions or /v1/chat/completions")
    if args.backend == "openai-chat" and kind != "chat":
        raise BenchConfigError("--endpoint", given,
                               "a chat completions endpoint with --backend openai-chat")
    return kind, path


def _request_spec(args: argparse.Namespace) -> RequestSpec:
    endpoint, path = _endpoint(args)
    return RequestSpec(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        model=args.served_model_name or args.model, endpoint=endpoint, path=path, n=args.n,
        best_of=args.best_of, use_beam_search=args.use_beam_search,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        logprobs=args.logprobs, ignore_eos=args.ignore_eos,
        extra_body={**parse_json_object("--extra-body", args.extra_body),
                    **response_format(args.response_format)},
        headers=parse_pairs("--header", args.header, "="),
        request_timeout=args.request_timeout,
    )


def _load_shape(args: argparse.Namespace) -> LoadShape:
    return LoadShape(
        num_prompts=args.num_prompts, request_rate=args.request_rate,
        burstiness=args.burstiness, arrival=args.arrival,
        max_concurrency=args.max_concurrency, duration=args.duration,
        ramp_up_strategy=args.ramp_up_strategy, ramp_up_start_rps=args.ramp_up_start_rps,
        ramp_up_end_rps=args.ramp_up_end_rps, num_warmups=args.num_warmups,
    )


def _dataset_spec(args: argparse.Namespace) -> DatasetSpec:
    return DatasetSpec(
        name=args.dataset_name, path=args.dataset_path,
        random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio, random_prefix_len=args.random_prefix_len,
        prefix_len=args.prefix_repetition_prefix_len,
        suffix_len=args.prefix_repetition_suffix_len,
        num_prefixes=args.prefix_repetition_num_prefixes,
        prefix_output_len=args.prefix_repetition_output_len,
        sharegpt_output_len=args.sharegpt_output_len,
        sonnet_input_len=args.sonnet_input_len, sonnet_output_len=args.sonnet_output_len,
        sonnet_prefix_len=args.sonnet_prefix_len, seed=args.seed,
    )


def parse_pairs(option: str, items: list[str] | None, sep: str) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` → dict; the key must be non-empty."""
    pairs = {}
    for item in items or []:
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise BenchConfigError(option, item, f"KEY{sep}VALUE")
        pairs[key.strip()] = value
    return pairs


def response_format(value: str | None) -> dict[str, Any]:
    """The ``response_format`` member ``--response-format`` asks for ({} when not given)."""
    if value is None:
        return {}
    if value == "json_object":
        return {"response_format": {"type": "json_object"}}
    try:
        text = Path(value).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchConfigError("--response-format", value,
                               f"json_object or a readable JSON schema file ({exc})") from None
    schema = parse_json_object("--response-format", text)
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": Path(value).stem or "schema", "schema": schema, "strict": True}}}


def parse_json_object(option: str, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise BenchConfigError(option, text, "a JSON object") from None
    if not isinstance(value, dict):
        raise BenchConfigError(option, text, "a JSON object")
    return value
