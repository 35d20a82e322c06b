"""The pagedserve client: an asyncio OpenAI-compatible client and a token-budgeted batch runner.

``AsyncClient`` talks to one server; ``BatchRunner`` (or ``run_batch`` / ``run_batch_file``)
fans many requests out over a pool of servers under a ``TokenBudget``. Nothing here imports
torch or the server.
"""

from pagedserve.client.adaptive import AdaptiveBudget, AdaptiveConfig
from pagedserve.client.batch import BatchRequest, BatchResult, BatchSummary, ItemError
from pagedserve.client.budget import Reservation, TokenBudget
from pagedserve.client.client import AsyncClient, Timeout
from pagedserve.client.errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APIStreamError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchInputError,
    BudgetExceededError,
    ClientError,
    ConflictError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTimeoutError,
    StreamInterruptedError,
    UnprocessableEntityError,
)
from pagedserve.client.jobs import RunOptions, run_batch, run_batch_file
from pagedserve.client.models import Model, ModelList
from pagedserve.client.pool import Endpoint, EndpointPool
from pagedserve.client.pool_config import PoolConfig, build_pool
from pagedserve.client.retry import RetryPolicy
from pagedserve.client.runner import BatchRunner
from pagedserve.client.streaming import Stream
from pagedserve.client.tokens import (
    CallableCounter,
    ServerTokenCounter,
    TiktokenCounter,
    TokenCounter,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APIStreamError",
    "APITimeoutError",
    "AdaptiveBudget",
    "AdaptiveConfig",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "BatchInputError",
    "BatchRequest",
    "BatchResult",
    "BatchRunner",
    "BatchSummary",
    "BudgetExceededError",
    "CallableCounter",
    "ClientError",
    "ConflictError",
    "Endpoint",
    "EndpointPool",
    "InternalServerError",
    "InvalidRequestError",
    "ItemError",
    "Model",
    "ModelList",
    "NotFoundError",
    "PermissionDeniedError",
    "PoolConfig",
    "RateLimitError",
    "RequestTimeoutError",
    "Reservation",
    "RetryPolicy",
    "RunOptions",
    "ServerTokenCounter",
    "Stream",
    "StreamInterruptedError",
    "TiktokenCounter",
    "Timeout",
    "TokenBudget",
    "TokenCounter",
    "UnprocessableEntityError",
    "build_pool",
    "run_batch",
    "run_batch_file",
]
