"""The router: an OpenAI-compatible gateway in front of pagedserve replicas.

It holds no model and imports no torch. Each request goes to a replica picked by a policy
(``prefix``: where its leading blocks are likely cached; ``least-load``; ``round-robin``),
is retried on another replica while nothing has been streamed yet, and is passed through as
it arrives; a stream that fails later ends with an error event, never silently. Replicas come
from flags or a DNS name; health checks and repeated failures eject them. The router listens
behind the server's own connection guard (``pagedserve.common.http``).
"""

from pagedserve.router.app import create_app, make_runner
from pagedserve.router.router_config import RouterConfig

__all__ = ["RouterConfig", "create_app", "make_runner"]
