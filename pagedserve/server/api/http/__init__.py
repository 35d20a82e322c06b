"""HTTP plumbing: admission, connections, per-client limits, forwarded addresses, JSON and SSE,
OpenAI-shaped errors."""
