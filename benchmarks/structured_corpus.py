"""How many structured outputs of a served model parse and validate: every schema of
json_schemas.json sent as a chat request with ``response_format`` json_schema, once whole and
once streamed, and the agent set (``agent_set``: 20 multi-turn conversations with tool calls
and results, and the rate of ``auto`` calls), against any OpenAI-compatible server (start
one first, e.g. ``pagedserve serve --model smollm2``).

Each reply is parsed with ``json.loads`` and checked with ``jsonschema``; a reply cut by
``max_tokens`` counts as invalid. Prints one line per failure, the share valid per mode, the
agent set's shares, and a JSON summary as its last line (``--set`` runs one set alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
from openai import AsyncOpenAI

from benchmarks.agent_set import run_agent_set

SCHEMAS = json.loads((Path(__file__).parent / "json_schemas.json").read_text("utf-8"))
PROMPT = "Reply with a JSON value that follows this JSON schema:\n{schema}"


async def _ask(client: AsyncOpenAI, model: str, schema: dict[str, Any], stream: bool,
               max_tokens: int) -> tuple[str, str | None]:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": 0,
            "messages": [{"role": "user", "content": PROMPT.format(schema=json.dumps(schema))}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "reply", "schema": schema, "strict": True}}}
    if not stream:
        result = await client.chat.completions.create(**body)
        return result.choices[0].message.content or "", result.choices[0].finish_reason
    text, reason = "", None
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return text, reason


def _problem(schema: dict[str, Any], text: str, reason: str | None) -> str | None:
    if reason != "stop":
        return f"finish_reason {reason}"
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0]
    return None


async def schema_set(client: AsyncOpenAI, model: str, max_tokens: int, concurrency: int
                     ) -> dict[str, Any]:
    """Every schema whole and streamed; prints each failure and the share valid."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, stream: bool) -> str | None:
        async with gate:
            text, reason = await _ask(client, model, SCHEMAS[i], stream, max_tokens)
        problem = _problem(SCHEMAS[i], text, reason)
        if problem is not None:
            print(f"schema {i} ({'streamed' if stream else 'whole'}): {problem}: {text!r:.120}")
        return problem

    summary: dict[str, Any] = {"schemas": len(SCHEMAS)}
    for stream in (False, True):
        problems = await asyncio.gather(*(one(i, stream) for i in range(len(SCHEMAS))))
        valid = sum(p is None for p in problems)
        mode = "streamed" if stream else "whole"
        print(f"{mode}: {valid}/{len(SCHEMAS)} valid ({100 * valid / len(SCHEMAS):.0f}%)")
        summary[f"{mode}_valid"] = valid
    return summary


async def agents(client: AsyncOpenAI, model: str, max_tokens: int) -> dict[str, Any]:
    """The agent set (``agent_set``); prints each problem and the shares."""
    summary, problems = await run_agent_set(client, model, max_tokens)
    for line in problems:
        print(f"agents: {line}")
    print(f"agents: {summary['accepted']}/{summary['turns']} turns accepted, "
          f"{summary['valid_calls']}/{summary['calls']} calls valid, "
          f"{summary['call_turns_called']}/{summary['call_turns']} required or named turns "
          f"called; auto: {summary['auto_called']}/{summary['auto_prompts']} prompts called "
          f"({summary['auto_right_tool']} the right tool)")
    return {f"agent_{key}": value for key, value in summary.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--agent-max-tokens", type=int, default=96,
                        help="max_tokens of each turn of the agent set")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--set", choices=["schemas", "agents", "all"], default="all")
    args = parser.parse_args()
    async with AsyncOpenAI(base_url=args.base_url, api_key="unused") as client:
        model = args.model or (await client.models.list()).data[0].id
        summary: dict[str, Any] = {"model": model}
        if args.set in ("schemas", "all"):
            summary |= await schema_set(client, model, args.max_tokens, args.concurrency)
        if args.set in ("agents", "all"):
            summary |= await agents(client, model, args.agent_max_tokens)
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
