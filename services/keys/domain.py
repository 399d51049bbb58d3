"""Pure rules of accounts and API keys: states, rotation, listing, and the keys service's domain
errors. No I/O. Secrets, masks and hashes come from contracts/credentials.py."""

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from contracts import keyset_cursor
from contracts.audit import AuditAction, AuditItem, AuditTarget, KeyActorOut, OperatorActorOut, UserActorOut
from contracts.common import KeyStatus, Role, ServiceScope, UserType
from contracts.domain_errors import Conflict, Forbidden, Invalid, Unauthenticated
from contracts.errors import ErrorCode
from contracts.events import AccountState, KeyState, ServiceTokenState, UserState
from contracts.key_limits import KeyRules
from contracts.keys_api import KeyListStatus
from contracts.rate_limit import RateLimit

OWNER_ROLES: tuple[Role, ...] = (Role.OWNER,)


# ---- domain errors (services/edge/errors.py maps each base to its status) ------------------------
class InvalidCredentials(Unauthenticated):
    def __init__(self) -> None:
        super().__init__("The e-mail or the password is wrong.", code=ErrorCode.INVALID_CREDENTIALS)


class EmailTaken(Conflict):
    def __init__(self) -> None:
        super().__init__("An account with this e-mail already exists.")


class WrongCurrentPassword(Forbidden):
    def __init__(self) -> None:
        super().__init__("The current password is wrong.")


class UserTypePlanMismatch(Conflict):
    def __init__(self) -> None:
        super().__init__(
            "An individual user cannot be on the enterprise plan; change the plan first.",
            code=ErrorCode.USER_TYPE_PLAN_MISMATCH,
        )


class MemberEmailTaken(Conflict):
    def __init__(self) -> None:
        super().__init__("A user with this e-mail already exists.")


class LastOwner(Conflict):
    def __init__(self) -> None:
        super().__init__("The account's last owner cannot be demoted or removed.", code=ErrorCode.LAST_OWNER)


class NotYourKey(Forbidden):
    def __init__(self) -> None:
        super().__init__("A developer may change only the API keys it created.")


class AlreadyRotated(Conflict):
    """A key in the grace period of its rotation already has its successor: rotating it again would
    give a second permanent key of the same lineage, outliving the one the owner meant to retire."""

    def __init__(self, ends_at: datetime) -> None:
        super().__init__(
            f"This key was already rotated and stops working at {ends_at.isoformat()}: rotate its successor"
            " (the newer key of the same name) instead, or delete this one to end its grace period now."
        )


class InvalidField(Invalid):
    """One field breaks a rule: the same body as a request that fails validation."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__("The request is not valid.", details=[{"field": field, "message": message, "type": "value_error"}])


# ---- rules --------------------------------------------------------------------------------------
def normalize_email(email: str) -> str:
    return email.strip().lower()


def toggled(status: KeyStatus) -> KeyStatus:
    return KeyStatus.DISABLED if status == KeyStatus.ENABLED else KeyStatus.ENABLED


def listed_status(status: KeyStatus, expires_at: datetime | None, now: datetime) -> KeyListStatus:
    """`expired` once now >= expires_at, whatever the stored enabled/disabled state."""
    if expires_at is not None and now >= expires_at:
        return KeyListStatus.EXPIRED
    return KeyListStatus(status.value)


def check_not_rotated(delete_at: datetime | None) -> None:
    """A key may be rotated once: `delete_at` (the end of its grace, set only by a rotation) marks
    one already replaced."""
    if delete_at is not None:
        raise AlreadyRotated(delete_at)


def rotation_expiry(current: datetime | None, now: datetime, grace_seconds: int) -> datetime:
    """The old key's new expiry: the end of the grace period, never later than it already was."""
    end = now + timedelta(seconds=grace_seconds)
    return end if current is None else min(current, end)


def key_state(
    *,
    key_id: UUID,
    account_id: UUID,
    digest: str,
    status: KeyStatus,
    expires_at: datetime | None,
    roles: list[Role],
    now: datetime,
    masked_key: str | None = None,
    deleted: bool = False,
    created_at: datetime | None = None,
    created_by: UUID | None = None,
    version: int = 0,
    rules: KeyRules | None = None,
    lineage_id: UUID | None = None,
) -> KeyState:
    return KeyState(
        **dict(rules or KeyRules()),
        time=now,
        account_id=account_id,
        key_id=key_id,
        hash=digest,
        status=status,
        expires_at=expires_at,
        roles=roles,
        masked_key=masked_key,
        deleted=deleted,
        created_at=created_at,
        created_by=created_by,
        version=version,
        lineage_id=lineage_id,
    )


def check_within_plan(rate_limit: RateLimit | None, plan: RateLimit) -> None:
    """(v4) A key's own rate limit may only narrow its plan's: each of its three numbers at most the plan's."""
    if rate_limit is None:
        return
    above = [f for f in ("per_second", "burst", "per_minute") if getattr(rate_limit, f) > getattr(plan, f)]
    if above:
        wanted = ", ".join(f"{f} <= {getattr(plan, f)}" for f in above)
        raise InvalidField("rate_limit", f"must not exceed the plan's rate limit ({wanted})")


def account_state(*, account_id: UUID, roles: list[Role], user_type: UserType, now: datetime, version: int) -> AccountState:
    return AccountState(time=now, account_id=account_id, roles=roles, user_type=user_type, version=version)


def service_token_state(
    *, token_id: UUID, name: str, digest: str, scopes: list[ServiceScope], now: datetime, version: int, revoked: bool = False
) -> ServiceTokenState:
    return ServiceTokenState(time=now, token_id=token_id, name=name, hash=digest, scopes=scopes, revoked=revoked, version=version)


def writes_any_key(roles: frozenset[Role]) -> bool:
    """An owner writes every key of the account; a developer only the keys it created."""
    return Role.OWNER in roles


def user_role(account_roles: list[Role]) -> Role:
    """The one role of the account's registering user (users.v1 carries one role per user):
    owner if the account has it, else its first role."""
    return Role.OWNER if Role.OWNER in account_roles else account_roles[0]


def user_state(user: dict[str, Any], now: datetime) -> UserState:
    """A keys.users row as its users.v1 state."""
    return UserState(
        time=now,
        account_id=user["account_id"],
        user_id=user["id"],
        role=Role(user["role"]),
        removed=user["removed_at"] is not None,
        sessions_not_before=user["sessions_not_before"],
        version=user["version"],
    )


def check_keeps_an_owner(member: dict[str, Any], roles: list[Role], new_role: Role | None) -> None:
    """LastOwner if demoting (new_role) or removing (None) `member` would leave the account,
    whose live users have `roles`, without an owner."""
    if member["role"] != Role.OWNER.value or new_role == Role.OWNER:
        return
    if sum(1 for r in roles if r == Role.OWNER) <= 1:
        raise LastOwner()


# ---- the audit log (v2) --------------------------------------------------------------------------
AUDIT_PAGE_MAX = 200


def decode_audit_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        return keyset_cursor.decode(cursor)
    except ValueError as exc:
        raise InvalidField("cursor", "is not one this API gave; start again without it") from exc


def check_audit_range(start: datetime | None, end: datetime | None) -> None:
    if start is not None and end is not None and start >= end:
        raise InvalidField("start", "must be before end")


def audit_item(row: dict[str, Any]) -> AuditItem:
    """A stored entry as the API shows it: the operator, a user's API key, or a user's session."""
    actor: KeyActorOut | UserActorOut | OperatorActorOut
    if row["actor_operator"] or row["actor_user_id"] is None:
        actor = OperatorActorOut()
    elif row["actor_api_key_id"] is not None:
        actor = KeyActorOut(user_id=row["actor_user_id"], email=row["actor_email"], api_key_id=row["actor_api_key_id"])
    else:
        actor = UserActorOut(user_id=row["actor_user_id"], email=row["actor_email"])
    return AuditItem(
        time=row["time"],
        actor=actor,
        action=AuditAction(row["action"]),
        target=AuditTarget(type=row["target_type"], id=row["target_id"]),
        ip=row["ip"],
        user_agent=row["user_agent"],
        details=row["details"],
    )
