"""The router: an OpenAI-compatible gateway in front of pagedserve replicas.

It holds no model and imports no torch. Each request goes to a replica picked by a policy
(``prefix``: where its leading blocks are likely cached; ``least-load``; ``round-robin``),
is retried on another replica while nothing has been streamed yet, and is passed through as
it arrives. Replicas come from flags or a DNS name; health checks eject the dead ones.
"""

from pagedserve.router.app import create_app, make_runner
from pagedserve.router.router_config import RouterConfig

__all__ = ["RouterConfig", "create_app", "make_runner"]
