"""Service tokens' use cases, shared by the operator's HTTP routes and the `tollgate
service-token` CLI: each runs in the caller's transaction and queues its service-tokens.v1 state
in the keys outbox; the caller commits, then flushes the outbox (and applies the states to its
edge, if it has one) so a revocation is in force everywhere when it answers."""

from datetime import datetime
from uuid import UUID, uuid4

from contracts.common import ServiceScope
from contracts.events import ServiceTokenState
from contracts.topics import SERVICE_TOKENS
from services.keys import domain, store
from services.runtime.platform.outbox_relay import OutboxRelay


def _state(row: store.Row, now: datetime) -> ServiceTokenState:
    return domain.service_token_state(
        token_id=row["id"],
        name=row["name"],
        digest=row["hash"].strip(),
        scopes=[ServiceScope(s) for s in row["scopes"]],
        now=now,
        revoked=row["revoked_at"] is not None,
    )


async def _emit(conn: store.Conn, relay: OutboxRelay, state: ServiceTokenState) -> None:
    key = str(state.token_id).encode()
    await relay.add(conn, SERVICE_TOKENS, key, state.model_dump_json().encode())
    if state.revoked:
        await relay.add(conn, SERVICE_TOKENS, key, None)  # tombstone: compaction forgets the token


async def create(
    conn: store.Conn, relay: OutboxRelay, name: str, scopes: list[ServiceScope], now: datetime
) -> tuple[store.Row, str, ServiceTokenState]:
    """The new row, the token (shown once, never stored) and the published state."""
    token = domain.new_service_token()
    unique = [s.value for s in ServiceScope if s in scopes]
    row = await store.insert_service_token(
        conn, token_id=uuid4(), name=name, digest=domain.digest(token), scopes=unique, created_at=now
    )
    state = _state(row, now)
    await _emit(conn, relay, state)
    return row, token, state


async def revoke(conn: store.Conn, relay: OutboxRelay, token_id: UUID, now: datetime) -> ServiceTokenState | None:
    """The revoked state (published again if it already was: harmless), or None if unknown."""
    row = await store.revoke_service_token(conn, token_id, now)
    if row is None:
        return None
    state = _state(row, now)
    await _emit(conn, relay, state)
    return state


async def list_all(conn: store.Conn) -> list[store.Row]:
    return await store.list_service_tokens(conn)
