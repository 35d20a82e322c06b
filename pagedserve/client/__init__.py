"""The pagedserve client: an asyncio OpenAI-compatible client and a token-budgeted batch runner.

``AsyncClient`` talks to one server; ``BatchRunner`` (or ``run_batch`` / ``run_batch_file``)
fans many requests out over a pool of servers under a ``TokenBudget``. Nothing here imports
torch or the server.
"""

from pagedserve.client.adaptive.adaptive_budget import AdaptiveBudget, AdaptiveConfig
from pagedserve.client.api.client import AsyncClient, Timeout
from pagedserve.client.api.client_errors import (
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
from pagedserve.client.api.models import Model, ModelList
from pagedserve.client.api.retry import RetryPolicy
from pagedserve.client.api.streaming import Stream
from pagedserve.client.batch.items import BatchRequest, BatchResult, BatchSummary, ItemError
from pagedserve.client.batch.jobs import RunOptions, run_batch, run_batch_file
from pagedserve.client.batch.pool import Endpoint, EndpointPool
from pagedserve.client.batch.pool_config import PoolConfig, build_pool
from pagedserve.client.batch.runner import BatchRunner
from pagedserve.client.budget.token_budget import Reservation, TokenBudget
from pagedserve.client.budget.tokens import (
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
