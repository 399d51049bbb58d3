"""Billing's HTTP routes (API.md, "Billing and plans")."""

from datetime import UTC
from pathlib import Path
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from contracts.billing_api import (
    Invoice,
    Order,
    OrderIn,
    OrderList,
    PackageList,
    PackageOrderIn,
    PlanList,
    PlanOut,
    PlanUpgradeOrderIn,
    Subscription,
    SwitchIn,
)
from contracts.common import Permission
from contracts.errors import ErrorBody
from contracts.plans import TIER_ORDER, catalogue
from services.billing.domain import HEADER_DESCRIPTION, MAX_KEY_LENGTH, MAX_PAGE, Idempotency
from services.billing.service import BillingService
from services.edge import Principal, Runtime

PRORATION = (
    "Upgrade amount = (new monthly price - current monthly price) x (period end - now) / (period end - period start), "
    "computed in exact decimals on microseconds and rounded once, half up, to cents. Downgrades cost and refund nothing."
)
RULE = "An individual account cannot order or switch to the enterprise tier: 409 user_type_plan_mismatch."
CONSOLE = "Console only: an API key gets 403 console_session_required (a leaked key cannot spend money). Needs `billing:write`."
READ_CONSOLE = "Console only: an API key gets 403 console_session_required. Needs `billing:read`; another account's order is 404."
TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(enabled_extensions=("html", "html.j2")),
    undefined=StrictUndefined,
)
IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", min_length=1, max_length=MAX_KEY_LENGTH, description=HEADER_DESCRIPTION)
]


def _wants_html(accept: str) -> bool:
    """HTML when the client names text/html before (or without) application/json."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if "text/html" not in kinds:
        return False
    return "application/json" not in kinds or kinds.index("text/html") < kinds.index("application/json")


def build_router(runtime: Runtime, service: BillingService) -> APIRouter:
    router = APIRouter(tags=["billing"])
    edge = runtime.edge
    reader = Depends(runtime.edge.requires(Permission.BILLING_READ))
    writer = Depends(runtime.edge.requires(Permission.BILLING_WRITE, console_only=True))
    console_reader = Depends(runtime.edge.requires(Permission.BILLING_READ, console_only=True))

    @router.get("/api/billing/plans", description="The public price list; needs no credentials (an extension: API.md is silent).")
    async def plans() -> PlanList:
        table = catalogue()
        return PlanList(items=[PlanOut.model_validate(table[t].model_dump()) for t in TIER_ORDER])

    @router.get(
        "/api/billing/packages",
        description="(v2) The public catalogue of quota packages (services/billing/packages.toml); needs no credentials. "
        "A package order's `amount` is a whole multiple of `unit` and costs amount / unit x unit_price.",
    )
    async def packages() -> PackageList:
        return service.packages()

    @router.get(
        "/api/billing/orders",
        description=f"(v2) The account's orders, newest first; `next_cursor` (null on the last page) fetches the next "
        f"page. An unknown cursor is 422. {READ_CONSOLE}",
    )
    async def list_orders(
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
        principal: Principal = console_reader,
    ) -> OrderList:
        return await service.list_orders(principal.account_id, limit, cursor)

    @router.get("/api/billing/orders/{order_id}", description=f"(v2) One order. {READ_CONSOLE}")
    async def get_order(order_id: UUID, principal: Principal = console_reader) -> Order:
        return await service.get_order(principal.account_id, order_id)

    @router.get(
        "/api/billing/orders/{order_id}/invoice",
        description=(
            "(v2) The invoice of a paid order (409 conflict while it is pending). Numbers are gapless per seller: "
            "taken from the seller's counter row in the payment's own transaction, so a rolled-back payment leaves "
            "no gap. `Accept: text/html` answers a printable HTML page instead of JSON. "
            f"{READ_CONSOLE}"
        ),
        response_model=Invoice,
        responses={200: {"content": {"text/html": {}}, "description": "The invoice (JSON, or HTML on Accept: text/html)"}},
    )
    async def invoice(order_id: UUID, request: Request, principal: Principal = console_reader) -> Invoice | HTMLResponse:
        found = await service.invoice(principal.account_id, order_id)
        if _wants_html(request.headers.get("accept", "")):
            page = TEMPLATES.get_template("invoice.html.j2").render(invoice=found, issued=found.issued_at.astimezone(UTC))
            return HTMLResponse(page)
        return found

    @router.get("/api/billing/subscription", description="The account's plan, user type and current period (default: free).")
    async def subscription(principal: Principal = reader) -> Subscription:
        return await service.subscription(principal.account_id)

    @router.post(
        "/api/billing/orders",
        status_code=201,
        description=(
            f"{PRORATION} Quota packages: `amount` must be a whole multiple of the resource's package unit "
            f"(422 otherwise); price = amount / unit x unit price (services/billing/packages.toml); valid this period. "
            f"A plan_upgrade to a plan that is not more expensive answers 409 conflict (use switch). {RULE} {CONSOLE}"
        ),
    )
    async def create_order(
        body: Annotated[OrderIn, Body()], request: Request, idempotency_key: IdempotencyKey = None, principal: Principal = writer
    ) -> Order:
        assert isinstance(body, PlanUpgradeOrderIn | PackageOrderIn)
        idem = Idempotency.of(idempotency_key, "POST /api/billing/orders", "/api/billing/orders", body.model_dump(mode="json"))
        return await service.create_order(principal.account_id, body, idem, audit=edge.audit_context(request, principal))

    @router.post(
        "/api/billing/orders/{order_id}/pay",
        description=(
            "Pays the order through the payment provider (an order of 0.00 is paid without a charge); effects are "
            "immediate (the billing.v1 event is in Kafka "
            "and applied by this process when this returns: the next call is judged by the new totals; other "
            "replicas apply it within milliseconds). 503 service_unavailable if Kafka does not acknowledge in time: "
            "the payment is made and in force shortly. Paying a paid order returns it unchanged. 409 conflict when "
            "the plan changed since the order, the order's period is over, or (a renewal) its grace ended unpaid, or "
            "it was declined with no grace and the account has left free since. Paying a renewal declined with no "
            "grace (the account was put on free for it) puts its plan back. 402 "
            "payment_required (details.order: the order, still pending) when the payer's card or bank declines the "
            "charge. The payment provider is called with the "
            f"order id as its idempotency key, so a retried payment never charges twice. {RULE} {CONSOLE}"
        ),
    )
    async def pay(
        order_id: UUID, request: Request, idempotency_key: IdempotencyKey = None, principal: Principal = writer
    ) -> Order:
        path = f"/api/billing/orders/{order_id}/pay"
        idem = Idempotency.of(idempotency_key, "POST /api/billing/orders/{order_id}/pay", path)
        return await service.pay(principal.account_id, order_id, idem, audit=edge.audit_context(request, principal))

    @router.post(
        "/api/billing/subscription/switch",
        description=(
            "200 with the subscription for downgrades and changes that cost nothing now (applied at once); for an "
            "upgrade, 402 payment_required with the pending order in error.details.order (pay it with "
            "POST /api/billing/orders/{id}/pay). An upgrade whose prorated amount rounds to 0.00 (the last minutes "
            "of a period) answers 200 too, and is still an order: made and paid at once (0.00, no provider charge), "
            "invoiced, and in the audit log as order.created and order.paid, like a paid upgrade. "
            f"{PRORATION} {RULE} {CONSOLE}"
        ),
        responses={402: {"model": ErrorBody, "description": "An upgrade: pay the order in error.details.order"}},
    )
    async def switch(body: SwitchIn, request: Request, principal: Principal = writer) -> Subscription:
        return await service.switch(principal.account_id, body.plan, audit=edge.audit_context(request, principal))

    return router
