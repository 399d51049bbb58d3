"""`Idempotency-Key` of order creation and payment (API.md v2).

A key is scoped per account and route. The first request with a key stores a digest of what it
asked (path + canonical body) and, in the same transaction as its effects, its response; a retry
with the same key and request gets that response back and changes nothing; the same key with
another request is 409 `idempotency_key_reused`. The row is inserted before anything else in the
use case's transaction: a concurrent retry waits on the unique key until the first commits (then
replays it) or rolls back (then runs itself). Only successes are remembered: a refused request
changed nothing, so a retry simply asks again. Rows are kept `RETENTION_SECONDS`.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

Conn = AsyncConnection[Any]  # dict rows
MAX_KEY_LENGTH = 255
RETENTION_SECONDS = 24 * 3600
HEADER_DESCRIPTION = (
    f"Optional, 1..{MAX_KEY_LENGTH} characters (422 otherwise). A retry with the same key and the same request "
    "returns the first successful response and charges nothing more; the same key with another request is 409 "
    "`idempotency_key_reused`. Keys are per account and route, kept 24 hours; a refused request is not remembered."
)


class KeyReused(Exception):
    """The key was used for another request (409 idempotency_key_reused)."""


@dataclass(frozen=True, slots=True)
class Idempotency:
    """One request's key: the scope (route), the key and the digest of what it asks."""

    route: str
    key: str
    fingerprint: str

    @classmethod
    def of(cls, key: str | None, route: str, path: str, body: Any = None) -> "Idempotency | None":
        if key is None:
            return None
        canonical = json.dumps({"path": path, "body": body}, sort_keys=True, separators=(",", ":"))
        return cls(route, key, hashlib.sha256(canonical.encode()).hexdigest())


async def claim(conn: Conn, account_id: UUID, request: Idempotency) -> dict[str, Any] | None:
    """The stored response of an earlier request with this key (None: this request runs, and
    `remember` must be called in the same transaction). 409 if the key was used for another request."""
    cur = await conn.execute(
        """
        SELECT fingerprint, status, response FROM billing.idempotency_keys
         WHERE account_id = %s AND route = %s AND key = %s FOR UPDATE
        """,
        (account_id, request.route, request.key),
    )
    row = await cur.fetchone()
    if row is None:
        # Take the key now: a concurrent request with it blocks here until this transaction ends.
        cur = await conn.execute(
            """
            INSERT INTO billing.idempotency_keys (account_id, route, key, fingerprint, status, response)
            VALUES (%s, %s, %s, %s, 0, 'null'::jsonb)
            ON CONFLICT (account_id, route, key) DO NOTHING RETURNING id
            """,
            (account_id, request.route, request.key, request.fingerprint),
        )
        if await cur.fetchone() is not None:
            return None
        return await claim(conn, account_id, request)  # a concurrent request committed it meanwhile
    if row["fingerprint"] != request.fingerprint:
        raise KeyReused(request.key)
    if row["status"] == 0:  # never committed without a response; defensive: run the request
        return None
    response: dict[str, Any] = row["response"]
    return response


async def remember(conn: Conn, account_id: UUID, request: Idempotency, status: int, response: dict[str, Any]) -> None:
    await conn.execute(
        """
        UPDATE billing.idempotency_keys SET status = %s, response = %s::jsonb
         WHERE account_id = %s AND route = %s AND key = %s
        """,
        (status, json.dumps(response), account_id, request.route, request.key),
    )
