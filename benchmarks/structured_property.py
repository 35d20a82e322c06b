"""Sampled constrained requests, checked for what a grammar promises, against a served model.

Each output that ends "stop" must be whole: a JSON schema's value parses and validates
(``jsonschema``), a regex's text matches it (``re.fullmatch``), a choice is one of the
choices, a grammar's text is a complete string of it. Each output cut at "length" must be a
prefix the grammar accepts. A seeded request gives the same texts streamed and whole.

The trials mix every kind of constraint (the JSON shapes of json_schemas.json and a few
open-ended ones, regular expressions, choices, EBNF grammars), streamed and not, ``n`` of 1
to 3, temperatures of 0.7 to 1.0, seeded and unseeded, and ``max_tokens`` budgets of which
some are too small, so that some outputs are cut; they run concurrently. Then each seeded
trial is sent streamed and whole, a few at a time, and the answers compared. With
``--serve`` the script starts its own server (``pagedserve serve``, the default model) with a
KV cache small enough to preempt under the first phase's load and prefix caching on, and
reports both from ``/metrics``. Prints one line per failure and a JSON summary as its last
line; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import xgrammar
from openai import AsyncOpenAI

from benchmarks import harness
from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.sampling.grammar import GrammarCompiler

CORPUS = json.loads((Path(__file__).parent / "json_schemas.json").read_text("utf-8"))
# Shapes a small model writes at length: unbounded strings, arrays of objects.
OPEN_SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["items"],
     "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
         "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
         "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}}}},
    {"type": "object", "required": ["ok", "why"],
     "properties": {"ok": {"type": "boolean"}, "why": {"type": "string"}}},
    {"type": "object", "required": ["p"], "properties": {"p": {
        "type": "object", "required": ["x", "y"],
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}}},
    {"type": "object", "required": ["title", "year"],
     "properties": {"title": {"type": "string"}, "year": {"type": "integer"}}},
]
REGEXES = [r"[A-Z]{3}-[0-9]{2,4}", r"(yes|no), because [a-z ]{1,30}\.",
           r"\d{4}-\d{2}-\d{2}", r"[a-z]+@[a-z]+\.(com|org)"]
CHOICES = [["red", "green", "blue"], ["Paris", "London", "Rome", "Madrid"],
           ["positive", "negative", "neutral"]]
# Each grammar with the Python regex that matches exactly its strings.
GRAMMARS = [
    ('root ::= "(" num (" " op " " num)* ")"\nnum ::= [1-9] [0-9]*\nop ::= "+" | "-" | "*"',
     r"\([1-9][0-9]*( [+*-] [1-9][0-9]*)*\)"),
    ('root ::= item ("," item)*\nitem ::= [a-z]+ "=" [0-9]+', r"[a-z]+=[0-9]+(,[a-z]+=[0-9]+)*"),
]
SYSTEM = ("You are a careful assistant that answers every request in exactly the format the "
          "user asks for, without any explanation before or after the answer.")


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint: the request fields that set it, how to tell a whole output, and the
    same constraint as the engine reads it (for the prefix check)."""

    name: str
    fields: dict[str, Any]
    spec: StructuredOutputsParams
    whole: Callable[[str], str | None]  # the problem with a finished output, or None
    ask: str  # the user's request, which shows the constraint
    brief: str  # the same in a few words


def _json_whole(schema: dict[str, Any]) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            return str(exc).splitlines()[0]
        return None
    return check


def _regex_whole(pattern: str) -> Callable[[str], str | None]:
    return lambda text: None if re.fullmatch(pattern, text) else f"does not match {pattern}"


def _choice_whole(choices: list[str]) -> Callable[[str], str | None]:
    return lambda text: None if text in choices else f"not one of {choices}"


def constraints() -> list[Constraint]:
    """Every constraint the trials draw from."""
    found = []
    for i, schema in enumerate([*CORPUS, *OPEN_SCHEMAS]):
        found.append(Constraint(
            f"json{i}",
            {"response_format": {"type": "json_schema",
                                 "json_schema": {"name": "reply", "schema": schema,
                                                 "strict": True}}},
            StructuredOutputsParams(json=schema), _json_whole(schema),
            f"Reply with JSON that follows this schema: {json.dumps(schema)}", "Reply in JSON."))
    for i, pattern in enumerate(REGEXES):
        found.append(Constraint(f"regex{i}", {"structured_outputs": {"regex": pattern}},
                                StructuredOutputsParams(regex=pattern), _regex_whole(pattern),
                                f"Reply with text matching the regular expression {pattern}",
                                "Reply with a code."))
    for i, choice in enumerate(CHOICES):
        found.append(Constraint(f"choice{i}", {"structured_outputs": {"choice": choice}},
                                StructuredOutputsParams(choice=tuple(choice)),
                                _choice_whole(choice), f"Pick one of: {', '.join(choice)}.",
                                "Pick one."))
    for i, (grammar, pattern) in enumerate(GRAMMARS):
        found.append(Constraint(f"grammar{i}", {"structured_outputs": {"grammar": grammar}},
                                StructuredOutputsParams(grammar=grammar), _regex_whole(pattern),
                                f"Write a string of this grammar:\n{grammar}",
                                "Write a formula."))
    return found


class PrefixChecker:
    """Whether a text is a prefix of some string of a constraint's grammar: the grammar the
    engine compiles, over a vocabulary of the 256 bytes (so any text can be fed)."""

    def __init__(self) -> None:
        self._compiler = GrammarCompiler([bytes([b]) for b in range(256)] + [b""], [256])

    def accepts(self, spec: StructuredOutputsParams, text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(self._compiler.compile(spec))
        return not text or matcher.accept_string(text)


@dataclass(frozen=True, slots=True)
class Trial:
    constraint: Constraint
    stream: bool
    n: int
    temperature: float
    seed: int | None
    max_tokens: int
    brief: bool = False  # ask in a few words (for a model with a short context)

    def body(self, model: str) -> dict[str, Any]:
        body = {"model": model, "n": self.n, "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": self.constraint.brief if self.brief
                              else self.constraint.ask}],
                **self.constraint.fields}
        if self.seed is not None:
            body["seed"] = self.seed
        return body


def plan(count: int, seed: int, max_tokens: int = 96, brief: bool = False) -> list[Trial]:
    """``count`` trials drawn with ``seed``: one in four seeded, one in five on a budget too
    small for most answers; ``brief`` ones ask in a few words."""
    rng = random.Random(seed)
    pool = constraints()
    return [Trial(constraint=rng.choice(pool), stream=rng.random() < 0.5,
                  n=rng.choice((1, 1, 2, 3)), temperature=round(rng.uniform(0.7, 1.0), 2),
                  seed=rng.randrange(1 << 30) if rng.random() < 0.25 else None,
                  max_tokens=rng.randint(4, 16) if rng.random() < 0.2 else max_tokens,
                  brief=brief)
            for _ in range(count)]


@dataclass(slots=True)
class Counts:
    """What the trials found. ``failures`` lists one line per broken promise."""

    requests: int = 0
    outputs: int = 0
    stop: int = 0
    length: int = 0
    seeded_pairs: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "outputs": self.outputs, "stop": self.stop,
                "length": self.length, "seeded_pairs": self.seeded_pairs,
                "failures": len(self.failures)}


async def complete(client: AsyncOpenAI, body: dict[str, Any], stream: bool
                   ) -> list[tuple[str, str | None]]:
    """(text, finish_reason) per choice, in index order."""
    if not stream:
        reply = await client.chat.completions.create(**_sdk_args(body))
        return [(c.message.content or "", c.finish_reason)
                for c in sorted(reply.choices, key=lambda c: c.index)]
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    async for chunk in await client.chat.completions.create(**_sdk_args(body), stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    return [(texts.get(i, ""), reasons.get(i)) for i in range(body["n"])]


def _sdk_args(body: dict[str, Any]) -> dict[str, Any]:
    extra = {k: body[k] for k in ("structured_outputs",) if k in body}
    return {**{k: v for k, v in body.items() if k not in extra}, "extra_body": extra}


def check_outputs(trial: Trial, outputs: list[tuple[str, str | None]], prefixes: PrefixChecker,
                  counts: Counts) -> None:
    """Count ``outputs`` and record each broken promise."""
    name = f"{trial.constraint.name} n={trial.n} stream={trial.stream} seed={trial.seed}"
    counts.requests += 1
    for index, (text, reason) in enumerate(outputs):
        counts.outputs += 1
        if reason == "stop":
            counts.stop += 1
            problem = trial.constraint.whole(text)
        elif reason == "length":
            counts.length += 1
            problem = (None if prefixes.accepts(trial.constraint.spec, text)
                       else "cut at length, but not a prefix the grammar accepts")
        else:
            problem = f"finish_reason {reason}"
        if problem is not None:
            counts.failures.append(f"{name} [{index}] {reason}: {problem}: {text!r:.160}")


async def run(client: AsyncOpenAI, model: str, trials: list[Trial], concurrency: int,
              counts: Counts | None = None) -> Counts:
    """Every trial once, ``concurrency`` at a time, each output checked."""
    counts = Counts() if counts is None else counts
    prefixes = PrefixChecker()
    gate = asyncio.Semaphore(concurrency)

    async def one(trial: Trial) -> None:
        async with gate:
            outputs = await complete(client, trial.body(model), trial.stream)
        check_outputs(trial, outputs, prefixes, counts)

    await asyncio.gather(*(one(trial) for trial in trials))
    return counts


async def run_pairs(client: AsyncOpenAI, model: str, trials: list[Trial], concurrency: int,
                    counts: Counts | None = None, warm: bool = True) -> Counts:
    """Each seeded trial streamed and whole, its two answers compared. Run these where
    nothing is preempted: a recomputed prompt's logits differ in their last bits from the
    ones decoded step by step, so a seeded sample may take another token after preemption
    whichever way it is sent. For the same reason each pair's prompt is sent once first
    (answer unused), so that both of its requests find the same blocks in the prefix cache:
    a prompt computed whole and one whose prefix came from the cache can also differ in
    their last bits (``--no-warm-pairs`` measures that too)."""
    counts = Counts() if counts is None else counts
    gate = asyncio.Semaphore(concurrency)

    async def pair(trial: Trial) -> None:
        async with gate:
            if warm:
                await complete(client, trial.body(model), False)
            streamed = await complete(client, trial.body(model), True)
            whole = await complete(client, trial.body(model), False)
        counts.seeded_pairs += 1
        if streamed != whole:
            counts.failures.append(f"{trial.constraint.name} n={trial.n} seed={trial.seed}: "
                                   f"streamed and whole differ: {streamed!r:.160} vs "
                                   f"{whole!r:.160}")

    await asyncio.gather(*(pair(trial) for trial in trials if trial.seed is not None))
    return counts


def engine_counters(base_url: str) -> dict[str, float]:
    """Preemptions and prefix-cache hit tokens so far, from the server's /metrics."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = {"vllm:num_preemptions_total": "preemptions",
              "vllm:prefix_cache_hits_total": "prefix_cache_hit_tokens"}
    found = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            found[wanted[name]] = found.get(wanted[name], 0.0) + float(line.rsplit(" ", 1)[1])
    return found


SERVE_FLAGS = ["--num-kv-blocks", "64", "--max-num-seqs", "16", "--enable-prefix-caching",
               "--max-model-len", "768", "--disable-access-log"]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--serve", action="store_true",
                        help="start a server on the default model: "
                             + " ".join(SERVE_FLAGS))
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=12,
                        help="requests in flight while checking outputs")
    parser.add_argument("--pair-concurrency", type=int, default=1,
                        help="seeded pairs in flight (few enough that nothing is preempted)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warm-pairs", dest="warm_pairs", action="store_false",
                        help="send each pair without first sending its prompt once")
    parser.add_argument("--pairs-only", action="store_true",
                        help="skip the checking phase: the seeded pairs alone")
    args = parser.parse_args()
    process = None
    if args.serve:
        process, base = harness.launch_pagedserve(SERVE_FLAGS, timeout_s=600)
        args.base_url = base + "/v1"
    try:
        async with AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0,
                               timeout=600) as client:
            model = args.model or (await client.models.list()).data[0].id
            trials = plan(args.requests, args.seed)
            counts = (Counts() if args.pairs_only
                      else await run(client, model, trials, args.concurrency))
            before = engine_counters(args.base_url)
            await run_pairs(client, model, trials, args.pair_concurrency, counts,
                            args.warm_pairs)
            after = engine_counters(args.base_url)
        summary = {"model": model, **counts.summary(), **before,
                   "preemptions_during_pairs": after["preemptions"] - before["preemptions"]}
    finally:
        if process is not None:
            harness.stop(process)
    for line in counts.failures:
        print(line)
    print(json.dumps(summary))
    return 1 if counts.failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
