"""HTTP routes of GEO projects, the example platform resource (API.md)."""

from datetime import UTC, datetime
from typing import Annotated, cast
from uuid import UUID, uuid4

from fastapi import APIRouter, Depends, Response
from psycopg_pool import AsyncConnectionPool

from contracts.common import Permission, Resource
from contracts.keys_api import GeoProject, GeoProjectCreate, GeoProjectList
from contracts.topics import USAGE
from services.edge.edge import Edge
from services.edge.errors import not_found
from services.edge.principal import Principal
from services.geo import domain, store
from services.runtime.platform.outbox_relay import OutboxRelay


def router(pool: AsyncConnectionPool, edge: Edge, relay: OutboxRelay) -> APIRouter:
    api = APIRouter(tags=["geo"])
    db = cast("AsyncConnectionPool[store.Conn]", pool)  # the host opens it with dict rows
    read = edge.requires(Permission.PROJECTS_READ)
    # Creation is judged here, not by the edge's gate: geo counts its own projects at write time.
    write = edge.requires(Permission.PROJECTS_WRITE)

    async def _emit(conn: store.Conn, account_id: UUID, delta: int, now: datetime) -> None:
        event = domain.usage_delta(account_id, delta, now)
        await relay.add(conn, USAGE, str(account_id).encode(), event.model_dump_json().encode())

    @api.get("/api/geo/projects", description="Needs `projects:read`.")
    async def list_projects(principal: Annotated[Principal, Depends(read)]) -> GeoProjectList:
        async with db.connection() as conn:
            rows = await store.list_projects(conn, principal.account_id)
        return GeoProjectList(items=[GeoProject.model_validate(r) for r in rows])

    @api.post(
        "/api/geo/projects",
        status_code=201,
        description=(
            "Needs `projects:write`; consumes 1 `geo_projects` (usage.v1 +1 through an outbox). Exact: the account's "
            "creations are serialised in geo's Postgres transaction (on every replica) and the live projects are "
            "counted against the `geo_projects` total (plan + packages, from quota.v1; free plan until the account "
            "has a quota state), so with any number of concurrent creators the account never holds more; the one "
            "past the total gets 403 insufficient_quota with resource, used, total, period_end and links."
        ),
    )
    async def create_project(body: GeoProjectCreate, principal: Annotated[Principal, Depends(write)]) -> GeoProject:
        now = datetime.now(UTC)
        account_id = principal.account_id
        _, total = edge.quota.standing(account_id, Resource.GEO_PROJECTS, now)
        async with db.connection() as conn, conn.transaction():
            await store.lock_account(conn, account_id)
            live = await store.count_projects(conn, account_id)
            if live >= total:
                raise edge.insufficient_quota(account_id, Resource.GEO_PROJECTS, now, used=live, total=total)
            row = await store.insert_project(conn, uuid4(), account_id, body.name, now)
            await _emit(conn, account_id, +1, now)
        relay.wake()
        return GeoProject.model_validate(row)

    @api.delete(
        "/api/geo/projects/{project_id}",
        status_code=204,
        response_class=Response,
        description="Needs `projects:write`; frees 1 `geo_projects` (usage.v1 -1).",
    )
    async def delete_project(project_id: UUID, principal: Annotated[Principal, Depends(write)]) -> Response:
        async with db.connection() as conn:
            if not await store.delete_project(conn, principal.account_id, project_id):
                raise not_found("project")
            await _emit(conn, principal.account_id, -1, datetime.now(UTC))
        relay.wake()
        return Response(status_code=204)

    return api
