"""Event models, one schema per topic (API.md, "Events").

Every event has `id` (the idempotency key), `type`, `time` and `account_id`. Consumers are
idempotent on `id`: a redelivered or republished event changes nothing.
"""

from datetime import datetime
from typing import Annotated, Literal, Protocol
from uuid import UUID, uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from contracts.common import KeyStatus, Resource, Role, ServiceScope, Tier, UserType
from contracts.key_limits import KeyRules, LimitPeriod
from contracts.rate_limit import RateLimit

Period = Annotated[str, Field(pattern=r"^\d{4}-(0[1-9]|1[0-2])$", examples=["2026-11"])]
"""A quota period: the calendar month `YYYY-MM` in the platform time zone."""

# Quantities are stored as 64-bit integers (Postgres bigint, ClickHouse Int64): a larger number
# is refused where it enters, not wrapped around where it is stored.
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: UUID = Field(default_factory=uuid4)
    time: AwareDatetime
    account_id: UUID


MISSING_ID = "id: Field required (the idempotency key: without it every redelivery would be a new event)"


def has_id(event: Event) -> bool:
    """Whether a consumed event carried its id. The model invents one for code that builds events,
    so an event read from a topic without one would get a new id at every redelivery."""
    return "id" in event.__pydantic_fields_set__


# ---- the order of one object's states ----------------------------------------------------------
# The owning service numbers each state of an object (a key, an account, a user, a service token,
# an account's plan) under the object's row lock, in the transaction that publishes it: states
# made one after the other by racing requests or by replicas whose clocks disagree still get
# increasing versions, where their `time`s (read from a clock before the lock) may not.
Version = Annotated[int, Field(ge=0, le=2**63 - 1)]
"""0: published before versions existed (then `time` alone orders them, as it used to)."""


class Versioned(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def time(self) -> datetime: ...


def order_of(state: Versioned) -> tuple[int, datetime]:
    """How a consumer orders one object's states: the higher version is the newer state; `time`
    decides only between equal versions (states from before versions existed are all 0)."""
    return state.version, state.time


# ---- usage.v1 -------------------------------------------------------------------------------
class UsageEvent(Event):
    """A platform service used `quantity` of `resource` (a signed delta for stock resources)."""

    type: Literal["usage"] = "usage"
    resource: Resource
    quantity: Int64
    provider: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=128)
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    source: str = Field(min_length=1, max_length=64)
    # (v2) the API key whose call caused this usage, passed on by the platform service
    api_key_id: UUID | None = None
    # (v2) settles this reservation (POST /api/quota/reservations): the quantity is the actual amount
    reservation_id: UUID | None = None


# ---- calls.v1 -------------------------------------------------------------------------------
class CallEvent(Event):
    """One API-key call seen by the edge. `path` is the route template, not the raw URL. Its
    `time` keeps the usage rules' window around the record's timestamp (contracts/usage_rules.py)."""

    type: Literal["call"] = "call"
    api_key_id: UUID
    method: str = Field(max_length=16)
    path: str = Field(max_length=512)
    status: int = Field(ge=100, le=599)
    ip: str = Field(max_length=64)
    user_agent: str = Field(default="", max_length=512)
    latency_ms: float = Field(ge=0)
    # (v2) present exactly on refused calls (401 of a known key, 403, 429): the contract's error code
    error_code: str | None = Field(default=None, max_length=64)
    # (v2) refused calls folded into one event per (key, error_code, second) when their lane is full
    count: int = Field(default=1, ge=1, le=2**31 - 1)
    # (v3) the platform service whose call this is (its service token's name, through verify or
    # authorize); None on Tollgate's own routes
    service: str | None = Field(default=None, max_length=200)


# ---- keys.v1 (compacted, key = key id; tombstone on delete) ----------------------------------
class KeyState(Event, KeyRules):
    """The full state of one API key. `hash` is the hex SHA-256 of the whole `sk-...` secret.
    (v4) It carries the key's own rules (KeyRules: limits, allowed models, routes, addresses,
    rate limit); a state published before them allows everything, as an empty rule does."""

    type: Literal["key_state"] = "key_state"
    key_id: UUID
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    status: KeyStatus
    expires_at: AwareDatetime | None = None
    deleted: bool = False
    roles: list[Role]
    # Added for metering's activity log: `sk-` + first 4 + `...` + last 4 of the secret (API.md).
    masked_key: str | None = Field(default=None, max_length=64)
    # (v2) When the key was made (alerts' rotation reminder: older than 90 days) and the user who
    # made it: the key acts with that user's current users.v1 role and dies with its removal.
    # None in states published before these existed.
    created_at: AwareDatetime | None = None
    created_by: UUID | None = None
    version: Version = 0  # order_of(): the key row's version
    # (v4) The key's lineage: its own id for a key made by POST, its predecessor's lineage for a key
    # made by rotation. A key's own limits count the spending of its whole lineage, so rotating a
    # secret never refills them. None in states published before lineages: the key's own id.
    lineage_id: UUID | None = None

    @property
    def lineage(self) -> UUID:
        """The id the key's own limits are counted under (quota.key_counters, quota.v1's standings)."""
        return self.lineage_id or self.key_id


# ---- accounts.v1 (compacted, key = account id) -- an extension: API.md is silent here ---------
class AccountState(Event):
    """An account's current roles and user type, so every edge judges console sessions with the
    owner's *current* roles and a role change takes effect at once."""

    type: Literal["account_state"] = "account_state"
    roles: list[Role]
    user_type: UserType
    deleted: bool = False
    version: Version = 0  # order_of(): the account row's version


# ---- quota.v1 (compacted, key = account:resource) --------------------------------------------
class QuotaState(Event):
    """`blocked` means used + reserved >= total (v2: `reserved`, open reservations' amounts)."""

    type: Literal["quota_state"] = "quota_state"
    resource: Resource
    period: Period
    total: int
    used: int
    blocked: bool
    reserved: int = 0


class KeyQuotaState(Event):
    """(v4) One key lineage's standing against one of its own limits (quota.v1 record key
    `key:<api_key_id>:<resource>:<period>`). `api_key_id` is the lineage's id (KeyState.lineage:
    the id of the key its rotations started from, the key's own id if never rotated): every key of
    the lineage is judged by it, so a rotated key carries on its predecessor's spending. `window`
    names the window it counts in (day `2026-11-26`, ISO week `2026-W48`, month `2026-11`, or
    `once`); `blocked` means used + reserved >= amount. `removed`: no live key of the lineage has
    the limit any more (cleared), the edge forgets it."""

    type: Literal["key_quota_state"] = "key_quota_state"
    api_key_id: UUID
    resource: Resource
    period: LimitPeriod
    window: str = Field(max_length=16)
    amount: int
    used: int
    reserved: int = 0
    blocked: bool
    resets_at: AwareDatetime | None = None  # None for `once`
    removed: bool = False
    version: Version = 0  # order_of(): the counter row's version


QuotaRecord = Annotated[QuotaState | KeyQuotaState, Field(discriminator="type")]

# Parses one quota.v1 record into its type (v4: an account's state or one key's); built once.
QUOTA_RECORDS: TypeAdapter[QuotaState | KeyQuotaState] = TypeAdapter(QuotaRecord)


# ---- quota-thresholds.v1 ---------------------------------------------------------------------
class QuotaThresholdCrossed(Event):
    """Usage of `resource` rose across whole percent `threshold_pct` (the highest one crossed)."""

    type: Literal["quota_threshold"] = "quota_threshold"
    resource: Resource
    period: Period
    threshold_pct: int = Field(ge=1, le=100)
    used: int
    total: int
    # (v4) set when the crossing is of one key's own limit (`total` is the limit's amount): fired
    # once per (rule, threshold, window) by rules whose scope names that key
    api_key_id: UUID | None = None
    limit_period: LimitPeriod | None = None
    window: str | None = Field(default=None, max_length=16)


# ---- billing.v1 ------------------------------------------------------------------------------
class PlanChanged(Event):
    """The account's plan is now `plan`, with these quotas and rate limits, from `time` on."""

    type: Literal["plan_changed"] = "plan_changed"
    plan: Tier
    previous_plan: Tier | None = None
    quotas: dict[Resource, int]
    rate_limit: RateLimit
    version: Version = 0  # order_of(): the account's plan version in billing


class PackagePurchased(Event):
    type: Literal["package_purchased"] = "package_purchased"
    resource: Resource
    amount: int = Field(gt=0)
    period: Period
    order_id: UUID


class UserTypeChanged(Event):
    type: Literal["user_type_changed"] = "user_type_changed"
    user_type: UserType
    version: Version = 0  # order_of(): the account row's version, as in the accounts.v1 state of the change


BillingEvent = Annotated[PlanChanged | PackagePurchased | UserTypeChanged, Field(discriminator="type")]

# Parses one billing.v1 message into its type; built once, since adapters are costly to build.
BILLING_EVENTS: TypeAdapter[PlanChanged | PackagePurchased | UserTypeChanged] = TypeAdapter(BillingEvent)


# ---- service-tokens.v1 (v2; compacted, key = token id) ----------------------------------------
class ServiceTokenState(BaseModel):
    """A platform service's token (`st-...`): only its SHA-256 `hash` travels. Not an account's
    event (service tokens belong to the platform), so it has no `account_id`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: UUID = Field(default_factory=uuid4)
    type: Literal["service_token_state"] = "service_token_state"
    time: AwareDatetime
    token_id: UUID
    name: str = Field(max_length=200)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    scopes: list[ServiceScope]
    revoked: bool = False
    version: Version = 0  # order_of(): the token row's version


# ---- users.v1 (v2; compacted, key = user id) ---------------------------------------------------
class UserState(Event):
    """A user of an account: its current role, whether removed, and the instant before which
    its console sessions are refused (a password change moves it to now)."""

    type: Literal["user_state"] = "user_state"
    user_id: UUID
    role: Role
    removed: bool = False
    sessions_not_before: AwareDatetime | None = None
    version: Version = 0  # order_of(): the user row's version


# ---- sessions.v1 (v2; key = session id) ----------------------------------------------------------
class SessionRevoked(Event):
    """A console session ended by logout: refused everywhere from now on."""

    type: Literal["session_revoked"] = "session_revoked"
    session_id: str = Field(max_length=64)
    user_id: UUID
    revoked_at: AwareDatetime


# ---- state-complete.v1 (compacted, key = owner) -------------------------------------------------
class StateComplete(BaseModel):
    """An owner of compacted state (keys, billing, quota) found, at `time`, that each of its topics
    holds at least as many records as its Postgres holds live states (`held`, per topic): what
    Kafka lost has been given again. An edge is ready only once it has every owner's record
    (services/runtime/platform/state_guard.py). Not an account's event: no `account_id`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: UUID = Field(default_factory=uuid4)
    type: Literal["state_complete"] = "state_complete"
    time: AwareDatetime
    owner: str = Field(min_length=1, max_length=32)
    held: dict[str, Count]
