"""The OpenAI-shaped client: one session, its resources, typed answers and streams, errors and
retries."""
