"""Billing's use cases. Each runs in one transaction holding the account's row lock; the rules
come from services/billing/domain.py and every change is written to the outbox in the same
transaction, then relayed to billing.v1 before the call returns."""

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID, uuid4

from aiokafka.errors import KafkaTimeoutError
from psycopg_pool import AsyncConnectionPool

from contracts.billing_api import Order, Package, PackageOrderIn, PlanUpgradeOrderIn, Subscription
from contracts.common import Tier, UserType
from contracts.events import AccountState, PackagePurchased, PlanChanged, UserTypeChanged
from contracts.period import period_of
from contracts.plans import catalogue
from contracts.quota_api import PeriodRange
from contracts.topics import BILLING
from services.billing import domain, idempotency, store
from services.billing.domain import BillingRuleError, SwitchKind
from services.billing.idempotency import Idempotency
from services.billing.payments import PaymentProvider
from services.edge.projections import AccountProjection
from services.runtime.platform.kafka import within_publish_timeout
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


class NotFound(Exception):
    pass


class PaymentRequired(Exception):
    def __init__(self, order: Order) -> None:
        super().__init__("payment required")
        self.order = order


class BillingService:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        relay: OutboxRelay,
        settings: Settings,
        accounts: AccountProjection,
        provider: PaymentProvider,
        clock: Clock = system_clock,
    ) -> None:
        self.pool = pool
        self.relay = relay
        self.settings = settings
        self.accounts = accounts  # the edge's accounts.v1 projection: user type before billing saw it
        self.provider = provider
        self.clock = clock  # swappable: tests fix "now" to check proration

    def _period(self, now: datetime) -> tuple[str, datetime, datetime]:
        period = period_of(now, self.settings.tz)
        year, month = (int(p) for p in period.split("-"))
        tz = self.settings.tz
        start = datetime(year, month, 1, tzinfo=tz)
        end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=tz)
        return period, start, end

    async def _lock(self, conn: store.Conn, account_id: UUID) -> store.AccountRow:
        known = self.accounts.get(account_id)
        if known is None:
            return await store.lock_account(conn, account_id, UserType.INDIVIDUAL, None)
        row = await store.lock_account(conn, account_id, known.user_type, known.time)
        if row.user_type_time is None or row.user_type_time < known.time:
            # The edge already follows a newer accounts.v1 fact than billing's consumer: use it.
            await store.set_user_type(conn, account_id, known.user_type, known.time)
            row = store.AccountRow(account_id, row.plan, known.user_type, known.time)
        return row

    # ---- queries --------------------------------------------------------------------------------
    async def subscription(self, account_id: UUID) -> Subscription:
        _, start, end = self._period(self.clock())
        async with self.pool.connection() as conn, conn.transaction():
            row = await self._lock(conn, account_id)
        return Subscription(plan=row.plan, user_type=row.user_type, period=PeriodRange(start=start, end=end))

    # ---- commands -------------------------------------------------------------------------------
    async def create_order(
        self, account_id: UUID, body: PlanUpgradeOrderIn | PackageOrderIn, idem: Idempotency | None = None
    ) -> Order:
        now = self.clock()
        period, start, end = self._period(now)
        plans = catalogue()
        async with self.pool.connection() as conn, conn.transaction():
            if idem is not None and (stored := await idempotency.claim(conn, account_id, idem)) is not None:
                return Order.model_validate(stored)  # a retry: the first answer, no second order
            account = await self._lock(conn, account_id)
            if isinstance(body, PlanUpgradeOrderIn):
                domain.ensure_plan_allowed(account.user_type, body.plan)
                current, target = plans[account.plan], plans[body.plan]
                domain.ensure_upgrade(current, target)
                amount = domain.prorate(current.monthly_price, target.monthly_price, now, start, end)
                row = self._new_order(account_id, "plan_upgrade", amount, period, now, plan=body.plan, previous=account.plan)
            else:
                amount = domain.package_amount(body.package.resource, body.package.amount)
                row = self._new_order(account_id, "quota_package", amount, period, now, package=body.package)
            await store.insert_order(conn, row)
            out = self._out(row)
            if idem is not None:
                await idempotency.remember(conn, account_id, idem, 201, out.model_dump(mode="json"))
        return out

    def _new_order(
        self,
        account_id: UUID,
        kind: str,
        amount: Decimal,
        period: str,
        now: datetime,
        *,
        plan: Tier | None = None,
        previous: Tier | None = None,
        package: Package | None = None,
    ) -> store.OrderRow:
        return store.OrderRow(
            id=uuid4(),
            account_id=account_id,
            kind=kind,
            status="pending",
            amount=amount,
            currency=catalogue()[Tier.FREE].currency,
            plan=plan,
            previous_plan=previous,
            resource=package.resource if package else None,
            quantity=package.amount if package else None,
            period=period,
            created_at=now,
            paid_at=None,
        )

    async def pay(self, account_id: UUID, order_id: UUID, idem: Idempotency | None = None) -> Order:
        async with self.pool.connection() as conn, conn.transaction():
            if idem is not None and (stored := await idempotency.claim(conn, account_id, idem)) is not None:
                return Order.model_validate(stored)  # a retry: the first answer, nothing charged
            paid, charged = await self._pay(conn, account_id, order_id)
            if idem is not None:
                await idempotency.remember(conn, account_id, idem, 200, paid.model_dump(mode="json"))
        if charged:
            await self._deliver()
        return paid

    async def _pay(self, conn: store.Conn, account_id: UUID, order_id: UUID) -> tuple[Order, bool]:
        """The paid order, and whether this call charged it (False: it was paid already)."""
        now = self.clock()
        period, _, _ = self._period(now)
        account = await self._lock(conn, account_id)
        order = await store.lock_order(conn, order_id, account_id)
        if order is None:
            raise NotFound("order")
        if order.status == "paid":
            return self._out(order), False  # paying twice is harmless: the same paid order, one charge
        if order.period != period:
            raise BillingRuleError("conflict", "The order was for an earlier period; create a new order.")
        if order.kind == "plan_upgrade":
            assert order.plan is not None
            domain.ensure_plan_allowed(account.user_type, order.plan)  # the user type may have changed since
            if order.previous_plan is not account.plan:
                raise BillingRuleError("conflict", "The plan changed since this order was made; create a new order.")
        charge = await self.provider.charge(order.id, account_id, order.amount, order.currency)
        await store.mark_paid(conn, order.id, now, charge.reference)
        if order.kind == "plan_upgrade":
            assert order.plan is not None
            await self._change_plan(conn, account_id, account.plan, order.plan, now)
        else:
            assert order.resource is not None and order.quantity is not None
            event = PackagePurchased(
                time=now,
                account_id=account_id,
                resource=order.resource,
                amount=order.quantity,
                period=order.period,
                order_id=order.id,
            )
            await self.relay.add(conn, BILLING, str(account_id).encode(), event.model_dump_json().encode())
        paid = await store.lock_order(conn, order_id, account_id)
        assert paid is not None
        return self._out(paid), True

    async def switch(self, account_id: UUID, tier: Tier) -> Subscription:
        now = self.clock()
        period, start, end = self._period(now)
        plans = catalogue()
        order: store.OrderRow | None = None
        async with self.pool.connection() as conn, conn.transaction():
            account = await self._lock(conn, account_id)
            current, target = plans[account.plan], plans[tier]
            amount = domain.prorate(current.monthly_price, target.monthly_price, now, start, end)
            kind = domain.classify_switch(account.user_type, current, target, amount)
            if kind is SwitchKind.IMMEDIATE:
                await self._change_plan(conn, account_id, account.plan, tier, now)
            elif kind is SwitchKind.NEEDS_PAYMENT:
                order = self._new_order(account_id, "plan_upgrade", amount, period, now, plan=tier, previous=account.plan)
                await store.insert_order(conn, order)
            user_type = account.user_type
        if order is not None:
            raise PaymentRequired(self._out(order))
        await self._deliver()
        return Subscription(plan=tier, user_type=user_type, period=PeriodRange(start=start, end=end))

    async def _deliver(self) -> None:
        """Publish the committed change now; if Kafka is away the payment or switch still stands
        (it is committed) and the relay publishes it as soon as Kafka is back."""
        try:
            await within_publish_timeout(self.relay.flush())
        except KafkaTimeoutError:
            log.warning("billing.v1 delivery delayed; the outbox relay will publish it")

    async def _change_plan(self, conn: store.Conn, account_id: UUID, old: Tier, new: Tier, now: datetime) -> None:
        plan = catalogue()[new]
        await store.set_plan(conn, account_id, new, now)
        event = PlanChanged(
            time=now, account_id=account_id, plan=new, previous_plan=old, quotas=dict(plan.quotas), rate_limit=plan.rate_limit
        )
        await self.relay.add(conn, BILLING, str(account_id).encode(), event.model_dump_json().encode())

    # ---- facts from other services ---------------------------------------------------------------
    async def apply_user_type(self, event: UserTypeChanged | AccountState) -> None:
        if isinstance(event, AccountState) and event.deleted:
            return
        async with self.pool.connection() as conn, conn.transaction():
            await store.set_user_type(conn, event.account_id, event.user_type, event.time)

    def _out(self, row: store.OrderRow) -> Order:
        _, start, end = self._period_bounds(row.period)
        return Order(
            id=row.id,
            kind=row.kind,
            status=row.status,
            amount=row.amount,
            currency=row.currency,
            plan=row.plan,
            previous_plan=row.previous_plan,
            package=Package(resource=row.resource, amount=row.quantity) if row.resource and row.quantity else None,
            period=PeriodRange(start=start, end=end),
            created_at=row.created_at,
            paid_at=row.paid_at,
        )

    def _period_bounds(self, period: str) -> tuple[str, datetime, datetime]:
        year, month = (int(p) for p in period.split("-"))
        return self._period(datetime(year, month, 15, tzinfo=self.settings.tz))
