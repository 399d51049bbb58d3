"""Quota's HTTP routes: the same report under the two paths of API.md."""

from fastapi import APIRouter, Depends

from contracts.common import Permission
from contracts.quota_api import QuotaReport
from services.edge.principal import Principal
from services.quota.service import QuotaService
from services.runtime.component import Runtime

DESCRIPTION = (
    "Every resource of the caller's account in the current period (calendar month of the platform "
    "time zone, [start, end)). total = plan quota + quota packages bought for this period. Flows "
    "count this period's use; stocks (geo_projects, storage_bytes) show the current level. "
    "usage_rate = used / total in percent, 2 decimals, half up (100 when total is 0); band: "
    "< 70 green, 70..90 yellow, > 90 red; status exhausted when used >= total."
)


def build_router(runtime: Runtime, service: QuotaService) -> APIRouter:
    router = APIRouter(tags=["quota"])
    reader = Depends(runtime.edge.requires(Permission.QUOTA_READ))

    async def report(principal: Principal = reader) -> QuotaReport:
        return await service.report(principal.account_id)

    router.add_api_route("/api/billing/check-quota", report, methods=["GET"], description=DESCRIPTION, response_model=QuotaReport)
    router.add_api_route("/api/ai/usage/quota", report, methods=["GET"], description=DESCRIPTION, response_model=QuotaReport)
    return router
