"""Load generation for OpenAI-compatible servers: ``pagedserve bench`` (see README.md).

From Python, one benchmark is ``await bench(BenchSettings(RequestSpec(base_url, model),
LoadShape(...), DatasetSpec(...)))``; its ``BenchOutput`` holds the result fields
(``result``, the JSON ``--result-json`` writes) and the ``BenchmarkMetrics``.
"""

from pagedserve.loadgen.bench import BenchOutput, BenchSettings, bench
from pagedserve.loadgen.bench_config import LoadShape, MetricSpec, RequestSpec
from pagedserve.loadgen.bench_errors import BenchConfigError, LoadgenError
from pagedserve.loadgen.datasets import DatasetSpec
from pagedserve.loadgen.metrics import BenchmarkMetrics, Distribution
from pagedserve.loadgen.sweep import sweep

__all__ = [
    "BenchConfigError",
    "BenchOutput",
    "BenchSettings",
    "BenchmarkMetrics",
    "DatasetSpec",
    "Distribution",
    "LoadShape",
    "LoadgenError",
    "MetricSpec",
    "RequestSpec",
    "bench",
    "sweep",
]
