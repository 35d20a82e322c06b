"""``client.models``: ``GET /v1/models`` and ``GET /v1/models/{model}``, as in the OpenAI SDK."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagedserve.client.api.client_errors import APIResponseValidationError
from pagedserve.client.api.types import parse_response

if TYPE_CHECKING:
    from pagedserve.client.api.client import AsyncClient

MODELS_PATH = "/v1/models"


@dataclass(slots=True, frozen=True)
class Model:
    """One served model; ``raw`` keeps every field the server sent (vLLM adds
    ``max_model_len``, ``root``, ``permission``...)."""

    id: str
    created: int = 0
    owned_by: str = ""
    object: str = "model"
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Model:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise APIResponseValidationError("a model has no string 'id'", body=data)
        return cls(
            id=data["id"],
            created=int(data.get("created") or 0),
            owned_by=str(data.get("owned_by") or ""),
            object=str(data.get("object") or "model"),
            raw=data,
        )


@dataclass(slots=True, frozen=True)
class ModelList:
    """The answer of ``GET /v1/models``; iterating it yields the models."""

    data: list[Model]
    object: str = "list"

    def __iter__(self) -> Iterator[Model]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelList:
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise APIResponseValidationError(f"{MODELS_PATH} has no 'data' list", body=data)
        return cls([Model.from_dict(item) for item in items])


class Models:
    """``await client.models.list()`` and ``await client.models.retrieve("name")``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> ModelList:
        response = await self._client.request_json("GET", MODELS_PATH)
        return parse_response(ModelList.from_dict, response.data)

    async def retrieve(self, model: str) -> Model:
        """The model named ``model``; ``NotFoundError`` when the server does not serve it."""
        if not model:
            raise ValueError("model must be a non-empty model name")
        response = await self._client.request_json("GET", f"{MODELS_PATH}/{model}")
        return parse_response(Model.from_dict, response.data)
