"""The benchmarks: each module prints its ratios, its last line one JSON object.

Run one from the repository root as ``python -m benchmarks.NAME`` (``--help`` lists its
options); docs/benchmarks.md gives each command and its latest figures. ``harness`` starts
servers (pagedserve and its peers) and clients for the ones that measure a served endpoint.
"""
