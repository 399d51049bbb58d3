"""HTTP payloads of the keys service (accounts, console sessions, API keys) and GEO projects."""

from enum import StrEnum
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from contracts.common import KeyStatus, Resource, Role, Tier, UserType
from contracts.key_limits import (
    MAX_LIST,
    Cidr,
    KeyLimit,
    KeyLimitUsage,
    KeyRules,
    LimitPeriod,
    ModelPattern,
    RoutePattern,
    one_per_resource_and_period,
)
from contracts.rate_limit import RateLimit

Email = Annotated[str, StringConstraints(strip_whitespace=True, max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
MAX_GRACE_SECONDS = 7 * 24 * 3600
KeyUsage = Annotated[
    list[KeyLimitUsage],
    Field(
        description="(v4) The key's standing against each of its own limits, in the window that holds now. `used` "
        "is what was counted, without open reservations; `remaining` = amount - used - reserved, at least 0."
    ),
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- accounts and console sessions ------------------------------------------------------------
class RegisterRequest(_In):
    email: Email
    password: str = Field(min_length=8, max_length=1024)
    name: Name
    user_type: UserType


class Account(BaseModel):
    id: UUID
    email: str
    name: str
    user_type: UserType
    roles: list[Role]
    plan: Tier
    # (v2) The calling user's role (`roles` is `[role]` then, for v1 clients); absent on the
    # operator's roles call, which answers for the account.
    role: Role | None = None


class LoginRequest(_In):
    email: str = Field(max_length=254)
    password: str = Field(max_length=1024)


class LoginResponse(BaseModel):
    access_token: str
    token_type: Literal["bearer"] = "bearer"  # noqa: S105 - the scheme, not a secret
    expires_in: int


class PasswordChangeRequest(_In):
    """(v2) `new_password` follows the registration rule (8..1024 characters) and must differ."""

    current_password: str = Field(max_length=1024)
    new_password: str = Field(min_length=8, max_length=1024)


class UserTypeRequest(_In):
    user_type: UserType


class RolesRequest(_In):
    roles: list[Role] = Field(min_length=1, max_length=len(Role))


# ---- API keys -----------------------------------------------------------------------------------
KeyName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]


class KeyCreateRequest(_In, KeyRules):
    """(v4) The key's own rules (KeyRules), all optional: absent, it is as narrow as its account."""

    name: KeyName
    expires_at: AwareDatetime | None = None


class KeyUpdateRequest(_In):
    """(v4) PATCH /api/api-keys/{id}: an absent field is unchanged, `null` clears it (an empty
    list, or the plan's rate limit). Each field is checked as at creation."""

    name: KeyName | None = None
    limits: list[KeyLimit] | None = Field(default=None, max_length=len(Resource) * len(LimitPeriod))
    allowed_models: list[ModelPattern] | None = Field(default=None, max_length=MAX_LIST)
    allowed_routes: list[RoutePattern] | None = Field(default=None, max_length=MAX_LIST)
    allowed_ips: list[Cidr] | None = Field(default=None, max_length=MAX_LIST)
    rate_limit: RateLimit | None = None

    @field_validator("limits")
    @classmethod
    def _one_limit_per_resource_and_period(cls, limits: list[KeyLimit] | None) -> list[KeyLimit] | None:
        return None if limits is None else one_per_resource_and_period(limits)  # as KeyRules at creation

    @field_validator("name")
    @classmethod
    def _name_is_not_cleared(cls, name: str | None) -> str:
        if name is None:
            raise ValueError("a key keeps a name: send one, or leave `name` out")
        return name

    def rules_given(self) -> dict[str, object]:
        """The rule fields the request names, `null` ones as their cleared value."""
        given = self.model_fields_set - {"name"}
        cleared = KeyRules()
        return {f: getattr(self, f) if getattr(self, f) is not None else getattr(cleared, f) for f in given}


class KeyCreated(KeyRules):
    id: UUID
    name: str
    key: str = Field(description="The full secret. It appears in this response only.")
    masked_key: str
    status: KeyStatus
    expires_at: AwareDatetime | None
    created_at: AwareDatetime
    usage: KeyUsage = Field(default_factory=list)


class KeyListStatus(StrEnum):
    """(v2) A listed key's status: `expired` is computed (now >= expires_at), never stored or
    published (keys.v1 carries contracts.common.KeyStatus)."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    EXPIRED = "expired"


class KeyItem(KeyRules):
    """A key as listed (v4: with its own rules; empty lists and a null rate limit: none)."""

    id: UUID
    name: str
    masked_key: str
    status: KeyListStatus
    expires_at: AwareDatetime | None
    created_at: AwareDatetime
    last_used_at: AwareDatetime | None
    created_by: UUID | None = None  # (v2) the user who created it
    rotation_due: bool = Field(default=False, description="(v2) Older than 90 days: rotate it (create a new key, move, delete).")
    rotated: bool = Field(
        default=False,
        description="Extension: the key was rotated and is in its grace period (it ends at `expires_at`); it has its "
        "successor and cannot be rotated again (409 `conflict`): rotate the successor.",
    )
    usage: KeyUsage = Field(default_factory=list)


class KeyList(BaseModel):
    items: list[KeyItem]


class KeyToggled(BaseModel):
    id: UUID
    status: KeyStatus


class RotateRequest(_In):
    grace_seconds: int = Field(ge=0, le=MAX_GRACE_SECONDS)


# ---- members (v2) -----------------------------------------------------------------------------
class Member(BaseModel):
    id: UUID
    email: str
    name: str
    role: Role
    created_at: AwareDatetime


class MemberList(BaseModel):
    items: list[Member]


class MemberCreateRequest(_In):
    email: Email
    name: Name
    password: str = Field(min_length=8, max_length=1024)
    role: Role


class MemberRoleRequest(_In):
    role: Role


# ---- GEO projects ---------------------------------------------------------------------------------
class GeoProjectCreate(_In):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class GeoProject(BaseModel):
    id: UUID
    name: str
    created_at: AwareDatetime


class GeoProjectList(BaseModel):
    items: list[GeoProject]
