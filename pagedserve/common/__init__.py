"""Types shared by every part of pagedserve: the load-hint wire format, the prefix cache's block
hash (which the router's prefix policy uses too), the OpenTelemetry plumbing and the offline
tiktoken encodings. Leaf modules: they import nothing else of pagedserve, so the server, the
client, the router and the load generator can all depend on them. This file stays empty of
imports so that importing one leaf loads nothing more.
"""
