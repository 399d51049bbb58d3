"""Quota's HTTP routes: the same report under the two paths of API.md, and reservations (v2)."""

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Response

from contracts.common import Permission, ServiceScope
from contracts.domain_errors import NotFound
from contracts.quota_api import QuotaReport, ReservationCreate, ReservationCreated
from services.edge import Principal, Runtime, ServicePrincipal
from services.quota.service import QuotaService

DESCRIPTION = (
    "Every resource of the caller's account in the current period (calendar month of the platform "
    "time zone, [start, end)). total = plan quota + quota packages bought for this period. Flows "
    "count this period's use; stocks (geo_projects, storage_bytes) show the current level. "
    "usage_rate = used / total in percent, 2 decimals, half up (100 when total is 0); band: "
    "< 70 green, 70..90 yellow, > 90 red; status exhausted when used >= total."
)
RESERVE_DESCRIPTION = (
    "**Service** endpoint (service token `st-...` with `usage:write`; an API key or console session is "
    "403 permission_denied). Holds `amount` of `resource` for the account before the platform service "
    "spends it (a streamed LLM answer, a file upload): 201 `{id, expires_at}`, or 403 insufficient_quota "
    "when used + reserved + amount > total (judged under the account's lock in Postgres, so concurrent "
    "reservations on any replica never exceed the total). The reservation counts against the quota at once "
    "(quota.v1 `reserved`; `blocked` = used + reserved >= total) until a usage event carrying its id as "
    "`reservation_id` settles it (the actual quantity is counted, the hold released), DELETE releases it, "
    "or it expires after `ttl_seconds` (1..3600). It counts against whatever period is current while open. "
    "(v4) With `api_key_id` (verify's answer) it must also fit each of the key's own limits on the resource "
    "(used in the limit's current window + the key's open reservations + amount <= the limit's amount), judged "
    "first, under the same lock: a refusal is 403 insufficient_quota with `details.scope` `api_key` (total = the "
    "limit's amount, period_end = when it resets, null for `once`) or `account`. A key that is not the account's "
    "is 404, the same whether it is another account's or unknown; a key created a moment ago is reserved at once "
    "(quota takes its keys.v1 state from its process's edge, and waits up to 1 s for news of an id nobody has heard of)."
)
RELEASE_DESCRIPTION = (
    "**Service** endpoint (`usage:write`). Releases an open reservation early: 204. An unknown, already "
    "settled or expired id, or one made with another service token, is 404."
)


def build_router(runtime: Runtime, service: QuotaService) -> APIRouter:
    router = APIRouter(tags=["quota"])
    reader = Depends(runtime.edge.requires(Permission.QUOTA_READ))
    usage_writer = runtime.edge.requires_service(ServiceScope.USAGE_WRITE)

    async def report(principal: Principal = reader) -> QuotaReport:
        return await service.report(principal.account_id)

    router.add_api_route("/api/billing/check-quota", report, methods=["GET"], description=DESCRIPTION, response_model=QuotaReport)
    router.add_api_route("/api/ai/usage/quota", report, methods=["GET"], description=DESCRIPTION, response_model=QuotaReport)

    @router.post("/api/quota/reservations", status_code=201, description=RESERVE_DESCRIPTION)
    async def reserve(body: ReservationCreate, caller: Annotated[ServicePrincipal, Depends(usage_writer)]) -> ReservationCreated:
        made = await service.reserve(
            body.account_id, body.resource, body.amount, body.ttl_seconds, caller.token_id, body.api_key_id
        )
        return ReservationCreated(id=made.id, expires_at=made.expires_at)

    @router.delete(
        "/api/quota/reservations/{reservation_id}", status_code=204, response_class=Response, description=RELEASE_DESCRIPTION
    )
    async def release(reservation_id: UUID, caller: Annotated[ServicePrincipal, Depends(usage_writer)]) -> Response:
        if not await service.release(reservation_id, caller.token_id):
            raise NotFound("reservation")
        return Response(status_code=204)

    return router
