"""Service tokens' use cases, shared by the operator's HTTP routes and the `tollgate
service-token` CLI: each runs in the caller's transaction and queues its service-tokens.v1 state
in the keys outbox; the caller commits, then flushes the outbox (and applies the states to its
edge, if it has one) so a revocation is in force everywhere when it answers."""

from datetime import datetime
from uuid import UUID, uuid4

from contracts.audit import PLATFORM_ACCOUNT, AuditAction, AuditContext
from contracts.common import ServiceScope
from contracts.credentials import hash_secret, new_service_token
from contracts.events import ServiceTokenState
from contracts.topics import AUDIT, SERVICE_TOKENS
from services.keys import domain
from services.keys.store import KeysTx, Row


def _state(row: Row, now: datetime) -> ServiceTokenState:
    return domain.service_token_state(
        token_id=row["id"],
        name=row["name"],
        digest=row["hash"].strip(),
        scopes=[ServiceScope(s) for s in row["scopes"]],
        now=now,
        version=row["version"],
        revoked=row["revoked_at"] is not None,
    )


async def emit(tx: KeysTx, state: ServiceTokenState) -> None:
    key = str(state.token_id).encode()
    await tx.publish(SERVICE_TOKENS, key, state.model_dump_json().encode())
    if state.revoked:
        await tx.publish(SERVICE_TOKENS, key, None)  # tombstone: compaction forgets the token


async def _audit(tx: KeysTx, audit: AuditContext, now: datetime, action: AuditAction, row: Row) -> None:
    """The platform's own audit entry (service tokens belong to no account)."""
    entry = audit.entry(PLATFORM_ACCOUNT, now, action, "service_token", row["id"], name=row["name"], scopes=row["scopes"])
    await tx.publish(AUDIT, str(PLATFORM_ACCOUNT).encode(), entry.model_dump_json().encode())


async def create(
    tx: KeysTx, name: str, scopes: list[ServiceScope], now: datetime, audit: AuditContext
) -> tuple[Row, str, ServiceTokenState]:
    """The new row, the token (shown once, never stored) and the published state."""
    token = new_service_token()
    unique = [s.value for s in ServiceScope if s in scopes]
    row = await tx.insert_service_token(token_id=uuid4(), name=name, digest=hash_secret(token), scopes=unique, created_at=now)
    state = _state(row, now)
    await emit(tx, state)
    await _audit(tx, audit, now, AuditAction.SERVICE_TOKEN_CREATED, row)
    return row, token, state


async def revoke(tx: KeysTx, token_id: UUID, now: datetime, audit: AuditContext) -> ServiceTokenState | None:
    """The revoked state (published again if it already was: harmless), or None if unknown.
    Audited once: by the call that revoked it."""
    row = await tx.revoke_service_token(token_id, now)
    if row is None:
        return None
    state = _state(row, now)
    await emit(tx, state)
    if row["revoked_at"] == now:
        await _audit(tx, audit, now, AuditAction.SERVICE_TOKEN_REVOKED, row)
    return state


async def republish(tx: KeysTx, now: datetime) -> list[ServiceTokenState]:
    """Every live token's current state again (docs/architecture.md, "Kafka is transport");
    revoked ones are left out: on a topic that lost them they are unknown, hence refused."""
    states = [_state(row, now) for row in await tx.live_service_tokens()]
    for state in states:
        await emit(tx, state)
    return states
