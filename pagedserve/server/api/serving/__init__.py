"""The handlers: one pipeline from a request body to the engine and back, each route's protocol
on top."""
