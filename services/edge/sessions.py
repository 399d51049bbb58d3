"""Console session tokens: stateless, HMAC-signed, expiring; never start with `sk-`.

`tg1.<payload>.<signature>` where payload is base64url JSON `{sub, uid, sid, iat, exp}` (`uid`, the
user, since members: absent in older tokens, where the user is the account's registering one, whose
id is the account id). Any replica of
any service verifies them with the shared secret; no network hop. Roles are not in the token:
the edge takes the user's *current* role from its users.v1 projection (edge.acting_roles). `iat` (issue time,
unix seconds with microseconds) lets the edge refuse sessions issued before a password change
(users.v1 `sessions_not_before`); a token without it (issued before v2) is refused as malformed:
the edge could not tell whether a password change ended it (its holder just logs in again).
"""

import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

PREFIX = "tg1"


@dataclass(frozen=True, slots=True)
class SessionClaims:
    account_id: UUID
    session_id: str
    expires_at: int  # unix seconds
    # unix seconds, microsecond precision (a login right after a password change is not "before" it);
    # 0 = "long ago": refused by any sessions_not_before
    issued_at: float = 0.0
    user_id: UUID | None = None  # None: the account's registering user (user id = account id)

    @property
    def user(self) -> UUID:
        return self.user_id or self.account_id


class InvalidSession(Exception):
    pass


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def issue(secret: bytes, claims: SessionClaims) -> str:
    body = {"sub": str(claims.account_id), "sid": claims.session_id, "iat": round(claims.issued_at, 6), "exp": claims.expires_at}
    if claims.user_id is not None:
        body["uid"] = str(claims.user_id)
    payload = _b64(json.dumps(body).encode())
    return f"{PREFIX}.{payload}.{_sign(secret, payload)}"


def verify(
    secret: bytes, token: str, now: datetime, *, max_lifetime_s: int | None = None, also_accepted: Sequence[bytes] = ()
) -> SessionClaims:
    """The claims of a genuine, unexpired token; InvalidSession otherwise. Genuine: signed with
    `secret` or one of `also_accepted` (SESSION_SECRET_PREVIOUS, while the secret is rotated:
    docs/backup.md, "Rotating SESSION_SECRET"). With `max_lifetime_s`
    (the current SESSION_TTL_SECONDS) a token is also over that long after its issue, whatever its
    own `exp` says: one issued under a longer TTL ends when the shortened one says, and so no
    session outlives the edge's memory of its logout (session_revocations.py)."""
    # A genuine token is ASCII (base64url): anything else is refused before hmac.compare_digest,
    # which raises TypeError on a str that is not (a header's bytes arrive decoded as latin-1).
    parts = token.split(".") if token.isascii() else []
    if len(parts) != 3 or parts[0] != PREFIX:
        raise InvalidSession("malformed session token")
    payload, signature = parts[1], parts[2]
    if not any(hmac.compare_digest(_sign(key, payload), signature) for key in (secret, *also_accepted)):
        raise InvalidSession("bad signature")
    try:
        body = json.loads(_unb64(payload))
        account_id = UUID(body["sub"])
        user_id = UUID(body["uid"]) if "uid" in body else None
        claims = SessionClaims(account_id, str(body["sid"]), int(body["exp"]), float(body["iat"]), user_id)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidSession("malformed session payload") from exc
    if now.timestamp() >= claims.expires_at:
        raise InvalidSession("session expired")
    if max_lifetime_s is not None and now.timestamp() >= claims.issued_at + max_lifetime_s:
        raise InvalidSession("session older than the session lifetime")
    return claims
