"""The agent set of ``benchmarks.structured_corpus``: multi-turn conversations with tool calls
and their results, against any OpenAI-compatible server, as an agent loop drives it.

Each of the 20 conversations asks two questions that need a tool. A question's first turn
asks for a call (``tool_choice`` required, a named function, or auto, in turn; streamed every
other conversation; ``parallel_tool_calls`` off in half of them); the assistant message goes
back as the SDK returned it (or as its stream's deltas build it), a ``tool`` message carries
each call's result, and the next turn (``auto``) answers, or calls again, up to three calls
per question. Every turn must be accepted (a reply, not an error) and every call must name a
tool and carry arguments its parameters validate (``jsonschema``).

The auto rate: how many of the prompts that clearly ask for a tool get a call under
``tool_choice: "auto"`` (temperature 0, one sample each).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from openai import AsyncOpenAI, OpenAIError

CITY = {"type": "string", "minLength": 2, "maxLength": 30}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": CITY,
                                      "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": CITY}}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "additionalProperties": False,
                       "required": ["amount", "from", "to"],
                       "properties": {"amount": {"type": "number", "minimum": 0},
                                      "from": {"enum": ["USD", "EUR", "GBP", "JPY"]},
                                      "to": {"enum": ["USD", "EUR", "GBP", "JPY"]}}}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Flights between two airports on a date",
        "parameters": {"type": "object", "additionalProperties": False,
                       "required": ["origin", "destination", "date"],
                       "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                      "destination": {"type": "string",
                                                      "pattern": "^[A-Z]{3}$"},
                                      "date": {"type": "string",
                                               "pattern": "^2026-[01][0-9]-[0-3][0-9]$"}}}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# Questions that clearly need a tool, with the tool they need.
QUESTIONS = [
    ("What is the weather in Rome right now?", "get_weather"),
    ("Use the weather tool to tell me how warm it is in Oslo, in fahrenheit.", "get_weather"),
    ("Is it raining in London at the moment? Check the weather.", "get_weather"),
    ("What time is it in Tokyo now?", "get_time"),
    ("Look up the current local time in New York.", "get_time"),
    ("Convert 250 US dollars to euros.", "convert_currency"),
    ("How many yen is 40 pounds? Use the currency converter.", "convert_currency"),
    ("Find flights from JFK to LHR on 2026-03-14.", "search_flights"),
    ("Search for a flight from CDG to FCO on 2026-07-01.", "search_flights"),
    ("Check the weather in Lima for me.", "get_weather"),
]
CHOICES = ("required", "named", "auto")
MAX_CALLS_PER_QUESTION = 3


def tool_result(name: str, arguments: dict[str, Any]) -> str:
    """What the fake tools answer."""
    if name == "get_weather":
        return f"18 degrees {arguments.get('unit', 'celsius')}, sunny in {arguments['city']}"
    if name == "get_time":
        return f"It is 14:05 in {arguments['city']}"
    if name == "convert_currency":
        return f"{arguments['amount']} {arguments['from']} = 1.1 x that in {arguments['to']}"
    return f"2 flights {arguments['origin']}-{arguments['destination']} on {arguments['date']}"


@dataclass(slots=True)
class Conversation:
    questions: list[tuple[str, str]]
    choice: str  # the first turn's tool_choice for each question
    stream: bool
    parallel: bool


def conversations(count: int = 20) -> list[Conversation]:
    return [Conversation([QUESTIONS[i % len(QUESTIONS)], QUESTIONS[(i + 3) % len(QUESTIONS)]],
                         CHOICES[i % len(CHOICES)], stream=i % 2 == 1, parallel=i % 4 < 2)
            for i in range(count)]


@dataclass(slots=True)
class AgentCounts:
    turns: int = 0
    accepted: int = 0
    calls: int = 0
    valid_calls: int = 0
    call_turns: int = 0  # turns under required or a named function
    call_turns_called: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"turns": self.turns, "accepted": self.accepted, "calls": self.calls,
                "valid_calls": self.valid_calls, "call_turns": self.call_turns,
                "call_turns_called": self.call_turns_called}


async def _turn(client: AsyncOpenAI, body: dict[str, Any], stream: bool
                ) -> tuple[Any, list[tuple[str, str, str]], str | None]:
    """(the assistant message to send back, its calls as (id, name, arguments), finish)."""
    if not stream:
        reply = await client.chat.completions.create(**body)
        message = reply.choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message, calls, reply.choices[0].finish_reason
    content, calls, reason = "", {}, None
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, ["", "", ""])
                call[0] = delta.id or call[0]
                call[1] += delta.function.name or ""
                call[2] += delta.function.arguments or ""
            reason = choice.finish_reason or reason
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [{"id": i, "type": "function",
                                  "function": {"name": n, "arguments": a}}
                                 for i, n, a in (calls[k] for k in sorted(calls))]
    return message, [tuple(calls[k]) for k in sorted(calls)], reason


def _tool_choice(choice: str, tool: str) -> Any:
    return {"type": "function", "function": {"name": tool}} if choice == "named" else choice


async def run_conversation(client: AsyncOpenAI, model: str, conversation: Conversation,
                           counts: AgentCounts, max_tokens: int) -> None:
    """One conversation, counted into ``counts``."""
    messages: list[Any] = []
    for question, tool in conversation.questions:
        messages.append({"role": "user", "content": question})
        choice = conversation.choice
        for _ in range(MAX_CALLS_PER_QUESTION + 1):
            body = {"model": model, "messages": messages, "tools": TOOLS, "temperature": 0.0,
                    "max_tokens": max_tokens, "tool_choice": _tool_choice(choice, tool),
                    "parallel_tool_calls": conversation.parallel}
            counts.turns += 1
            counts.call_turns += choice in ("required", "named")
            try:
                message, calls, _ = await _turn(client, body, conversation.stream)
            except OpenAIError as exc:
                counts.problems.append(f"{question!r}: turn refused: {exc}")
                return
            counts.accepted += 1
            counts.call_turns_called += bool(calls) and choice in ("required", "named")
            messages.append(message)
            if not calls:
                break
            for call_id, name, arguments in calls:
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": _checked_result(name, arguments, counts)})
            choice = "auto"


def _checked_result(name: str, arguments: str, counts: AgentCounts) -> str:
    counts.calls += 1
    try:
        value = json.loads(arguments)
        jsonschema.validate(value, SCHEMAS[name])
    except (ValueError, KeyError, jsonschema.ValidationError) as exc:
        counts.problems.append(f"call {name}({arguments}): {str(exc).splitlines()[0]}")
        return "error: bad arguments"
    counts.valid_calls += 1
    return tool_result(name, value)


async def auto_rate(client: AsyncOpenAI, model: str, max_tokens: int) -> dict[str, Any]:
    """Calls under ``auto`` for the prompts that clearly ask for a tool."""
    called = right_tool = 0
    for question, tool in QUESTIONS:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], tools=TOOLS,
            temperature=0.0, max_tokens=max_tokens)
        calls = reply.choices[0].message.tool_calls or []
        called += bool(calls)
        right_tool += any(c.function.name == tool for c in calls)
    return {"auto_prompts": len(QUESTIONS), "auto_called": called,
            "auto_right_tool": right_tool}


async def run_agent_set(client: AsyncOpenAI, model: str, max_tokens: int = 96
                        ) -> tuple[dict[str, Any], list[str]]:
    """The set's summary and one line per problem."""
    counts = AgentCounts()
    for conversation in conversations():
        await run_conversation(client, model, conversation, counts, max_tokens)
    return {**counts.summary(), **await auto_rate(client, model, max_tokens)}, counts.problems
