"""(v2) HTTP payloads of the operator's service-token routes (`/api/admin/service-tokens`)."""

from typing import Annotated
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from contracts.common import ServiceScope

TokenName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class ServiceTokenCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName
    scopes: list[ServiceScope] = Field(default_factory=lambda: [ServiceScope.USAGE_WRITE], min_length=1, max_length=8)


class ServiceTokenCreated(BaseModel):
    id: UUID
    name: str
    scopes: list[ServiceScope]
    token: str = Field(description="`st-...`: shown in this response only; only its SHA-256 hash is stored.")
    created_at: AwareDatetime


class ServiceTokenItem(BaseModel):
    id: UUID
    name: str
    scopes: list[ServiceScope]
    created_at: AwareDatetime
    last_used_at: AwareDatetime | None = Field(
        description="Approximate: written in batches, at most every few seconds, by processes that run the keys service."
    )
    revoked_at: AwareDatetime | None


class ServiceTokenList(BaseModel):
    items: list[ServiceTokenItem]
