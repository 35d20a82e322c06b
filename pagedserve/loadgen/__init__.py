"""Load generation for OpenAI-compatible servers: ``pagedserve bench`` (see README.md)."""
