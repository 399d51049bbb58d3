"""API keys and service tokens: their format, mask and the hash that is their only stored form."""

import hashlib
import secrets
from datetime import datetime, timedelta

API_KEY_PREFIX = "sk-"
SERVICE_TOKEN_PREFIX = "st-"  # noqa: S105 - a platform service's token prefix, not a secret
# A key older than this is due for rotation (the seed's advice: rotate every 90 days).
ROTATION_AGE = timedelta(days=90)
SECRET_BYTES = 36  # token_urlsafe(36): 48 URL-safe characters, 288 bits from the OS CSPRNG


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_service_token() -> str:
    """`st-` + 48 URL-safe characters (288 bits), like an API key's secret."""
    return SERVICE_TOKEN_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def mask(secret: str) -> str:
    """`sk-` + first 4 + `...` + last 4 characters of the secret part."""
    body = secret.removeprefix(API_KEY_PREFIX)
    return f"{API_KEY_PREFIX}{body[:4]}...{body[-4:]}"


def hash_secret(secret: str) -> str:
    """The only form in which an API key or a service token is stored, logged or published."""
    return hashlib.sha256(secret.encode()).hexdigest()


def rotation_due(created_at: datetime | None, now: datetime) -> bool:
    """A key older than 90 days is due for rotation (a key of unknown age never is)."""
    return created_at is not None and now - created_at > ROTATION_AGE
