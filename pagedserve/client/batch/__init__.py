"""Batches: items, JSONL files with resume, the runner, the endpoint pool and its progress
bar."""
