"""The OpenAI-compatible HTTP API around the async engine (aiohttp).

Routes:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI's parameters plus vLLM's
  sampling extras; ``stream`` sends Server-Sent Events ending with ``data: [DONE]``. Chat
  prompts come from the model's chat template (``tokenizer_config.json``), or ChatML when
  it has none (``pagedserve.server.tokenizer.chat_template.DEFAULT_CHAT_TEMPLATE``).
- ``POST /v1/responses``: OpenAI's Responses API for text (``protocol/responses.py``); its
  stream sends typed events (``event: TYPE`` lines) and no ``[DONE]``.
- ``GET /v1/models``, ``GET /v1/models/{model}``
- ``POST /tokenize`` (``prompt`` or ``messages``) and ``POST /detokenize`` (``tokens``)
- ``GET /health`` (200 while the engine loop runs, 503 otherwise or while draining),
  ``GET /metrics`` (Prometheus, ``pagedserve:`` names), ``GET /version``, ``GET /load``.

Every response but a 401 carries the load-hint headers of ``pagedserve.common.load_hints``.
Limits on the work of one request or connection are in ``limits`` and ``connections``. Errors
have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``.
"""

from pagedserve.server.api.app import create_app, make_runner, make_site
from pagedserve.server.api.config.server_config import ServerConfig
from pagedserve.server.api.http.limits import ServerConfigError
from pagedserve.server.api.shutdown import drain

__all__ = ["ServerConfig", "ServerConfigError", "create_app", "drain", "make_runner",
           "make_site"]
