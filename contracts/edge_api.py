"""(v3) HTTP payloads of verify (`POST /api/edge/verify`): the edge's decision for a call that a
platform service outside Tollgate received. authorize answers the same decision in headers."""

import functools
import ipaddress
from typing import Annotated
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from contracts.common import Permission, Resource, Role, Tier
from contracts.errors import ErrorBody
from contracts.key_limits import LimitPeriod

MAX_COST = 10**12
# The protected service's own request: an HTTP method token and an absolute path (its route
# template), printable ASCII without spaces, as they go into calls.v1 and the activity log.
Method = Annotated[str, StringConstraints(pattern=r"^[A-Z]{1,16}$")]
Path = Annotated[str, StringConstraints(pattern=r"^/[\x21-\x7e]{0,511}$")]


@functools.lru_cache(maxsize=4096)  # pure, and dear (ipaddress parses in Python): a service's callers repeat
def _address(value: str) -> str:
    return str(ipaddress.ip_address(value))  # ValueError: a 422 naming the field (a refusal is not cached)


IpAddress = Annotated[str, AfterValidator(_address)]
# (v4) `provider/model`, printable ASCII without spaces, as allowed_models names them.
Model = Annotated[str, StringConstraints(max_length=200, pattern=r"^[\x21-\x2e\x30-\x7e]+/[\x21-\x7e]+$")]


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(max_length=512, description="The caller's API key (`sk-...`) as it was sent to the service.")
    method: Method
    path: Path = Field(description="The service's route template, e.g. `/v1/chat/completions`.")
    ip: IpAddress = Field(description="The caller's address, as the service sees it.")
    user_agent: str = Field(default="", max_length=512)
    resource: Resource | None = Field(
        default=None, description="Gate on this resource too (nothing is counted: usage events count)."
    )
    cost: int = Field(default=0, ge=0, le=MAX_COST, description="For a flow: refused when used + reserved + cost > total.")
    permission: Permission | None = Field(default=None, description="A permission the key's user must hold.")
    model: Model | None = Field(
        default=None,
        description="(v4) The `provider/model` the service will actually call (not what its caller asked for). A key "
        "with `allowed_models` is refused 403 `model_not_allowed` for a model outside them, and for a call without a "
        "model (fail closed).",
    )


class VerifiedRateLimit(BaseModel):
    limit: int
    remaining: int
    reset: int = Field(description="Seconds until the binding limit has room again.")


class VerifiedQuota(BaseModel):
    resource: Resource
    total: int
    used: int
    reserved: int
    remaining: int
    status: str = Field(description="`available` or `exhausted`.")


class VerifiedKeyLimit(BaseModel):
    """(v4) What is left of one of the key's own limits in its current window."""

    resource: Resource
    period: LimitPeriod
    remaining: int


class VerifyAnswer(BaseModel):
    """200 for every decision: `valid`, or the code and status a protected route would answer."""

    valid: bool
    code: str = Field(description="`valid`, or the contract's error code a protected route would answer.")
    status: int = Field(description="The HTTP status a protected route would answer (200 when valid).")
    account_id: UUID | None
    api_key_id: UUID | None
    user_id: UUID | None
    role: Role | None
    plan: Tier | None
    rate_limit: VerifiedRateLimit | None
    retry_after: int | None
    quota: VerifiedQuota | None
    error: ErrorBody | None = Field(description="The error body a protected route would answer; null when valid.")
    key_limits: list[VerifiedKeyLimit] = Field(
        default_factory=list,
        description="(v4) The key's own limits: what remains of each in its current window (amount - used - reserved); "
        "empty when the key has none (or is unknown).",
    )
