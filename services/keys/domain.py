"""Pure rules of accounts and API keys: secrets, masks, states, rotation. No I/O."""

import secrets
from datetime import datetime, timedelta
from uuid import UUID

from contracts.common import KeyStatus, Role, ServiceScope, UserType
from contracts.credentials import API_KEY_PREFIX, SERVICE_TOKEN_PREFIX, hash_secret
from contracts.events import AccountState, KeyState, ServiceTokenState, UserState

SECRET_BYTES = 36  # token_urlsafe(36): 48 URL-safe characters, 288 bits from the OS CSPRNG
OWNER_ROLES: tuple[Role, ...] = (Role.OWNER,)


def new_secret() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_service_token() -> str:
    """`st-` + 48 URL-safe characters (288 bits), like an API key's secret."""
    return SERVICE_TOKEN_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def mask(secret: str) -> str:
    """`sk-` + first 4 + `...` + last 4 characters of the secret part."""
    body = secret.removeprefix(API_KEY_PREFIX)
    return f"{API_KEY_PREFIX}{body[:4]}...{body[-4:]}"


def digest(secret: str) -> str:
    return hash_secret(secret)


def normalize_email(email: str) -> str:
    return email.strip().lower()


def toggled(status: KeyStatus) -> KeyStatus:
    return KeyStatus.DISABLED if status == KeyStatus.ENABLED else KeyStatus.ENABLED


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
) -> KeyState:
    return KeyState(
        time=now,
        account_id=account_id,
        key_id=key_id,
        hash=digest,
        status=status,
        expires_at=expires_at,
        roles=roles,
        masked_key=masked_key,
        deleted=deleted,
    )


def account_state(*, account_id: UUID, roles: list[Role], user_type: UserType, now: datetime) -> AccountState:
    return AccountState(time=now, account_id=account_id, roles=roles, user_type=user_type)


def service_token_state(
    *, token_id: UUID, name: str, digest: str, scopes: list[ServiceScope], now: datetime, revoked: bool = False
) -> ServiceTokenState:
    return ServiceTokenState(time=now, token_id=token_id, name=name, hash=digest, scopes=scopes, revoked=revoked)


def user_role(account_roles: list[Role]) -> Role:
    """The one role of the account's registering user (users.v1 carries one role per user):
    owner if the account has it, else its first role."""
    return Role.OWNER if Role.OWNER in account_roles else account_roles[0]


def user_state(*, account_id: UUID, roles: list[Role], sessions_not_before: datetime | None, now: datetime) -> UserState:
    """Until members exist (a later issue) an account has one user, its registering owner, whose
    user id is the account id."""
    return UserState(
        time=now, account_id=account_id, user_id=account_id, role=user_role(roles), sessions_not_before=sessions_not_before
    )
