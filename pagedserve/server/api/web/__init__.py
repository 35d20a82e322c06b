"""The built-in web page: a chat with the served model and a live view of the KV cache.

``GET /`` serves ``static/index.html``, ``/ui/`` its script and style (``page``), and
``GET /engine/state`` the engine's latest snapshot as JSON (``engine_state``). The page holds
no secret, so it loads without a key (``paths``); the state endpoint follows the API's key
rule.
"""
