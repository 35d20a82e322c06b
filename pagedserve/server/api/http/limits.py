"""Bounds on the work one request or one connection can make the server do, with their
``pagedserve serve`` flags.

Each has a default that a single replica can afford; a request over a limit gets an
OpenAI-shaped 400 (413 for a body announced too large), a connection over the cap a 503.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from pagedserve.server.api.http.api_errors import invalid_request


class ServerConfigError(ValueError):
    """A server setting outside its allowed range."""


@dataclass(slots=True, frozen=True)
class ServerLimits:
    """``max_prompts_per_request``: prompts in one completions request.
    ``max_completions_per_request``: prompts × best_of (which is n unless set) in one request.
    ``max_tokens_per_request``: prompt tokens in one request, all its prompts together.
    ``tokenizer_threads``: the pool that tokenizes large inputs and ``/tokenize`` off the
    event loop, so /health and streams keep answering meanwhile.
    ``timeout_keep_alive``: seconds an idle connection stays open after a response (also the
    bound on how long the next request's headers may take).
    ``timeout_header_read``: seconds a new connection gets to deliver its first request's
    headers (a client that trickles them is cut off), whatever ``timeout_keep_alive`` is.
    ``max_connections``: open connections; beyond it a new one gets 503 and is closed.
    ``max_connections_per_client``: open connections from one source address, and with one
    API key when keys are set (more: 429).
    ``max_requests_per_client``: requests in flight from one source address, and with one
    API key when keys are set (more: 429).
    """

    max_prompts_per_request: int = 1024
    max_completions_per_request: int = 1024
    max_tokens_per_request: int = 262144
    tokenizer_threads: int = 2
    timeout_keep_alive: float = 5.0
    timeout_header_read: float = 10.0
    max_connections: int = 2048
    max_connections_per_client: int = 1024
    max_requests_per_client: int = 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value <= 0:
                raise ServerConfigError(f"{f.name} must be positive, got {value}")


def check_prompts(limits: ServerLimits, num_prompts: int, best_of: int) -> None:
    """Raises a 400 for a completions request over either per-request limit."""
    if num_prompts > limits.max_prompts_per_request:
        raise invalid_request(
            f"the request has {num_prompts} prompts, more than the limit of "
            f"{limits.max_prompts_per_request} (--max-prompts-per-request)", param="prompt")
    completions = num_prompts * best_of
    if completions > limits.max_completions_per_request:
        raise invalid_request(
            f"the request asks for {completions} completions ({num_prompts} prompts × "
            f"{best_of} each, n / best_of), more than the limit of "
            f"{limits.max_completions_per_request} (--max-completions-per-request)",
            param="n")


def check_prompt_tokens(limits: ServerLimits, num_tokens: int, param: str) -> None:
    """Raises a 400 for a request whose prompts hold more tokens in all than the limit: one
    request must not be able to hold the engine for minutes."""
    if num_tokens > limits.max_tokens_per_request:
        raise invalid_request(
            f"the request's prompts have {num_tokens} tokens in all, more than the limit of "
            f"{limits.max_tokens_per_request} (--max-tokens-per-request)", param=param)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    d = ServerLimits()
    g = parser.add_argument_group("limits per request and per connection")
    g.add_argument("--max-prompts-per-request", type=int, default=d.max_prompts_per_request,
                   help="prompts in one completions request (more: 400)")
    g.add_argument("--max-completions-per-request", type=int,
                   default=d.max_completions_per_request,
                   help="prompts × n (or best_of) in one request (more: 400)")
    g.add_argument("--max-tokens-per-request", type=int, default=d.max_tokens_per_request,
                   help="prompt tokens in one request, all its prompts together (more: 400)")
    g.add_argument("--tokenizer-threads", type=int, default=d.tokenizer_threads,
                   help="threads that tokenize large inputs and /tokenize off the event loop")
    g.add_argument("--timeout-keep-alive", type=float, default=d.timeout_keep_alive,
                   help="seconds before an idle connection is closed")
    g.add_argument("--timeout-header-read", type=float, default=d.timeout_header_read,
                   help="seconds a new connection gets to send its request headers")
    g.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="open connections; more are answered 503 and closed (a few more "
                        "are kept for /health and /metrics)")
    g.add_argument("--max-connections-per-client", type=int,
                   default=d.max_connections_per_client,
                   help="open connections from one source address, and with one API key "
                        "(a connection counts for the key of its first request); more are "
                        "answered 429")
    g.add_argument("--max-requests-per-client", type=int, default=d.max_requests_per_client,
                   help="requests in flight from one source address, and with one API key; "
                        "more are answered 429")


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits)})
