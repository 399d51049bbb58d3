"""HTTP routes of GEO projects, the example platform resource (API.md)."""

from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response
from pydantic import TypeAdapter

from contracts.common import Permission
from contracts.keys_api import GeoProject, GeoProjectCreate, GeoProjectList
from services.edge import FastRoute, Principal, Runtime
from services.geo.service import GeoService
from services.geo.store import ProjectRow

PROJECTS_PATH = "/api/geo/projects"


@dataclass(frozen=True, slots=True)
class _Listing:
    """GeoProjectList's JSON straight from the store's rows: one serialising pass, no model built
    or validated per row (tests/unit/test_geo_listing.py holds it to GeoProjectList's bytes)."""

    items: list[ProjectRow]


_LISTING = TypeAdapter(_Listing)


async def listing(service: GeoService, principal: Principal) -> Response:
    """The list route's answer, whichever way the call came (the route, or its fast route): returned as it
    is, so FastAPI neither revalidates nor serialises it again."""
    rows = await service.list_projects(principal.account_id)
    return Response(_LISTING.dump_json(_Listing(rows)), media_type="application/json")


def fast_routes(runtime: Runtime, service: GeoService) -> list[FastRoute]:
    """The list, answered before the router (services/edge/fast_routes.py): the hot metered call
    with the route's own dependency and answer, without FastAPI's dependency solving around them."""
    read = runtime.edge.requires(Permission.PROJECTS_READ)

    async def list_projects(request: Request) -> Response:
        return await listing(service, await read(request))

    return [FastRoute("GET", PROJECTS_PATH, list_projects)]


def build_router(runtime: Runtime, service: GeoService) -> APIRouter:
    api = APIRouter(tags=["geo"])
    read = runtime.edge.requires(Permission.PROJECTS_READ)
    # Creation is judged by the use case, not by the edge's gate: geo counts its own projects at write time.
    write = runtime.edge.requires(Permission.PROJECTS_WRITE)

    @api.get(PROJECTS_PATH, response_model=GeoProjectList, description="Needs `projects:read`.")
    async def list_projects(principal: Annotated[Principal, Depends(read)]) -> Response:
        return await listing(service, principal)

    @api.post(
        PROJECTS_PATH,
        status_code=201,
        description=(
            "Needs `projects:write`; consumes 1 `geo_projects` (usage.v1 +1 through an outbox). Exact: the account's "
            "creations are serialised in geo's Postgres transaction (on every replica) and the live projects are "
            "counted against the `geo_projects` total (plan + packages, from billing.v1: a payment is in force at "
            "once; the free plan for an account that never changed plan), so with any number of concurrent creators "
            "the account never holds more; the one past the total gets 403 insufficient_quota with resource, used, "
            "total, period_end and links."
        ),
    )
    async def create_project(body: GeoProjectCreate, principal: Annotated[Principal, Depends(write)]) -> GeoProject:
        row = await service.create_project(principal.account_id, body.name)
        return GeoProject.model_validate(row, from_attributes=True)

    @api.delete(
        "/api/geo/projects/{project_id}",
        status_code=204,
        response_class=Response,
        description="Needs `projects:write`; frees 1 `geo_projects` (usage.v1 -1).",
    )
    async def delete_project(project_id: UUID, principal: Annotated[Principal, Depends(write)]) -> Response:
        await service.delete_project(principal.account_id, project_id)
        return Response(status_code=204)

    return api
