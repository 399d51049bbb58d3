"""Billing's use cases. Each runs in one transaction holding the account's row lock; the rules
come from services/billing/domain.py and every change is written to the outbox in the same
transaction. A payment or a plan switch answers only once its billing.v1 event is in Kafka and
applied to this process's edge (`LocalEdge.deliver`), as a key toggle does: the caller's next
call is judged by the new totals. The store, the outbox, the edge, the clock and the payment
provider are injected (tests/unit/fakes.py has in-memory ones)."""

import logging
from collections.abc import Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

from prometheus_client import Counter

from contracts import keyset_cursor
from contracts.audit import AuditAction, AuditContext
from contracts.billing_api import (
    Invoice,
    Order,
    OrderList,
    Package,
    PackageItem,
    PackageList,
    PackageOrderIn,
    Party,
    PlanUpgradeOrderIn,
    Subscription,
)
from contracts.clock import Clock
from contracts.common import Tier, UserType
from contracts.domain_errors import Conflict, NotFound
from contracts.events import AccountState, PackagePurchased, PlanChanged, UserTypeChanged, order_of
from contracts.period import bounds_of, period_bounds, period_of
from contracts.plans import catalogue
from contracts.quota_api import PeriodRange
from contracts.topics import AUDIT, BILLING, Topic
from services.billing import domain
from services.billing.domain import BillingConflict, Idempotency, OrderToPay, SwitchKind
from services.billing.payments import PaymentDeclined, PaymentProvider
from services.billing.store import AccountRow, InvoiceRow, OrderRow, PlanRow

# What a payment or a switch publishes and this process's edge applies before the answer.
BillingFact = PlanChanged | PackagePurchased
# The payment reference of an order of 0.00, which no provider is asked to charge.
NO_CHARGE = "no-charge"
# The actor of the renewal job's writes in the audit log: the platform, as the operator's are.
RENEWAL_JOB = AuditContext(operator=True, user_agent="tollgate-billing-renewal")
log = logging.getLogger(__name__)
RENEWALS = Counter(
    "tollgate_billing_renewals_total",
    "Charge attempts of period renewals, by outcome: paid, declined or provider_failed (tried again later), "
    "lapsed (declined at the grace's end: the account put on free), no_grace (declined with no grace earned: "
    "the account put on free at once) (unit: attempts)",
    ["outcome"],
)
for _outcome in ("paid", "declined", "provider_failed", "lapsed", "no_grace"):  # on /metrics at 0 from the start
    RENEWALS.labels(_outcome)


class Tx(Protocol):
    """What the use cases do inside one transaction (store.BillingTx; a fake in the unit tests)."""

    @property
    def conn(self) -> Any: ...
    async def lock_account(
        self, account_id: UUID, default_user_type: UserType, default_time: datetime | None, default_version: int
    ) -> AccountRow: ...
    async def set_user_type(self, account_id: UUID, user_type: UserType, time: datetime, version: int) -> None: ...
    async def mark_account_deleted(self, account_id: UUID, user_type: UserType, time: datetime) -> None: ...
    async def lock_user_type(self, account_id: UUID) -> UserType | None: ...
    async def record_plan(self, account_id: UUID, plan: Tier, time: datetime, version: int) -> None: ...
    async def set_plan(self, account_id: UUID, plan: Tier, now: datetime, period: str) -> int: ...
    async def insert_order(self, order: OrderRow) -> None: ...
    async def lock_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None: ...
    async def mark_paid(self, order_id: UUID, now: datetime, reference: str) -> None: ...
    async def list_orders(self, account_id: UUID, limit: int, before: tuple[datetime, UUID] | None) -> list[OrderRow]: ...
    async def get_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None: ...
    async def take_invoice_number(self, seller: str) -> int: ...
    async def insert_invoice(self, invoice: InvoiceRow) -> None: ...
    async def get_invoice(self, order_id: UUID) -> InvoiceRow | None: ...
    async def claim_key(self, account_id: UUID, request: Idempotency) -> dict[str, Any] | None: ...
    async def remember_key(self, account_id: UUID, request: Idempotency, status: int, response: dict[str, Any]) -> None: ...
    async def renewal_candidates(self, period: str) -> list[UUID]: ...
    async def start_plan(self, account_id: UUID, period: str, start: datetime) -> Tier | None: ...
    async def insert_renewal(self, order: OrderRow) -> bool: ...
    async def due_renewals(self, now: datetime) -> list[tuple[UUID, UUID]]: ...
    async def record_attempt(self, order_id: UUID, next_attempt_at: datetime) -> None: ...
    async def paid_renewal_plan(self, account_id: UUID, period: str) -> Tier | None: ...
    async def drop_renewal(self, order_id: UUID, now: datetime) -> None: ...
    async def lapse_renewals(self, account_id: UUID, now: datetime) -> None: ...
    async def current_plans(self) -> list[PlanRow]: ...
    async def paid_packages(self, period: str) -> list[OrderRow]: ...
    async def count_facts(self, period: str) -> int: ...


class Store(Protocol):
    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...


class Outbox(Protocol):
    """The outbox relay: rows written in the caller's transaction, published after commit."""

    async def add(self, conn: Any, topic: Topic, key: bytes, value: bytes | None) -> int: ...


class LocalEdge(Protocol):
    """This process's edge, as the use cases see it (services/billing/delivery.py)."""

    async def deliver(self, facts: list[BillingFact]) -> None:
        """Wait for Kafka's ack of every committed outbox row, then make this process judge by
        `facts` (503 if Kafka does not acknowledge in time: the change stands, in force shortly)."""


class Accounts(Protocol):
    """The edge's accounts.v1 projection: the user type before billing's consumer saw it."""

    def get(self, account_id: UUID) -> AccountState | None: ...


class BillingService:
    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        accounts: Accounts,
        provider: PaymentProvider,
        clock: Clock,
        tz: ZoneInfo,
        *,
        edge: LocalEdge,
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.edge = edge
        self.accounts = accounts
        self.provider = provider
        self.clock = clock
        self.tz = tz

    async def _lock(self, tx: Tx, account_id: UUID) -> AccountRow:
        known = self.accounts.get(account_id)
        if known is None:
            return await tx.lock_account(account_id, UserType.INDIVIDUAL, None, 0)
        row = await tx.lock_account(account_id, known.user_type, known.time, known.version)
        if row.user_type_time is None or (row.user_type_version, row.user_type_time) < order_of(known):
            # The edge already follows a newer accounts.v1 fact than billing's consumer: use it.
            await tx.set_user_type(account_id, known.user_type, known.time, known.version)
            row = replace(row, user_type=known.user_type, user_type_time=known.time, user_type_version=known.version)
        return row

    async def _lock_for_plan(self, tx: Tx, account_id: UUID) -> AccountRow:
        """`_lock`, and the keys row of the account too, judged by the user type of record. Keys
        owns the user type and billing the plan; each judging by its copy of the other's fact (a
        consumer behind), a user-type change to individual and an enterprise payment at the same
        instant both passed. Both now serialise on the keys row (keys migration
        0011_plan_hold.sql): a change waits for this decision and the plan it records, or this
        decision waits for the change. Always in this order, billing row then keys row: keys'
        transactions never take billing's, so no cycle."""
        row = await self._lock(tx, account_id)
        of_record = await tx.lock_user_type(account_id)
        if of_record is None or of_record is row.user_type:
            return row  # None: no keys account (only accounts.v1 has it, as in some tests)
        return replace(row, user_type=of_record)

    # ---- queries --------------------------------------------------------------------------------
    async def subscription(self, account_id: UUID) -> Subscription:
        _, start, end = bounds_of(self.clock(), self.tz)
        async with self.store.transaction() as tx:
            row = await self._lock(tx, account_id)
        return Subscription(plan=row.plan, user_type=row.user_type, period=PeriodRange(start=start, end=end))

    @staticmethod
    def packages() -> PackageList:
        items = [PackageItem(resource=r, unit=p.unit, unit_price=p.unit_price) for r, p in domain.package_prices().items()]
        return PackageList(currency=domain.package_currency(), items=items)

    async def list_orders(self, account_id: UUID, limit: int, cursor: str | None) -> OrderList:
        """The account's orders, newest first, `limit` a page (keyset cursor: stable under inserts)."""
        before = domain.decode_cursor(cursor) if cursor else None
        async with self.store.transaction() as tx:
            rows = await tx.list_orders(account_id, limit + 1, before)
        page = rows[:limit]
        more = len(rows) > limit
        return OrderList(
            items=[self._out(r) for r in page],
            next_cursor=keyset_cursor.encode(page[-1].created_at, page[-1].id) if more else None,
        )

    async def get_order(self, account_id: UUID, order_id: UUID) -> Order:
        async with self.store.transaction() as tx:
            row = await tx.get_order(order_id, account_id)
        if row is None:
            raise NotFound("order")
        return self._out(row)

    async def invoice(self, account_id: UUID, order_id: UUID) -> Invoice:
        async with self.store.transaction() as tx:
            row = await tx.get_order(order_id, account_id)
            invoice = await tx.get_invoice(order_id) if row is not None else None
        if row is None:
            raise NotFound("order")
        if invoice is None:
            raise Conflict("The order is not paid yet: an invoice exists once it is paid.")
        order = self._out(row)
        issuer = domain.seller()
        return Invoice(
            number=domain.invoice_number(issuer.prefix, invoice.number),
            order_id=order.id,
            issued_at=invoice.issued_at,
            seller=Party(name=issuer.name, address=issuer.address, email=issuer.email, tax_id=issuer.tax_id),
            buyer=Party(name=f"Account {invoice.buyer['account_id']}", **invoice.buyer),
            lines=domain.invoice_lines(order),
            total=order.amount,
            currency=order.currency,
        )

    # ---- commands -------------------------------------------------------------------------------
    async def _audit(self, tx: Tx, audit: AuditContext, order: OrderRow, now: datetime, action: AuditAction) -> None:
        """The write's audit.v1 entry, in its transaction (the keys service stores it)."""
        details: dict[str, Any] = {"kind": order.kind, "amount": str(order.amount), "currency": order.currency}
        if order.plan is not None:
            details["plan"] = order.plan.value
        if order.resource is not None:
            details["package"] = {"resource": order.resource.value, "amount": order.quantity}
        entry = audit.entry(order.account_id, now, action, "order", order.id, **details)
        await self.outbox.add(tx.conn, AUDIT, str(order.account_id).encode(), entry.model_dump_json().encode())

    async def create_order(
        self,
        account_id: UUID,
        body: PlanUpgradeOrderIn | PackageOrderIn,
        idem: Idempotency | None = None,
        *,
        audit: AuditContext,
    ) -> Order:
        now = self.clock()
        period, start, end = bounds_of(now, self.tz)
        plans = catalogue()
        async with self.store.transaction() as tx:
            if idem is not None and (stored := await tx.claim_key(account_id, idem)) is not None:
                return Order.model_validate(stored)  # a retry: the first answer, no second order
            account = await self._lock_for_plan(tx, account_id)
            if isinstance(body, PlanUpgradeOrderIn):
                domain.ensure_plan_allowed(account.user_type, body.plan)
                current, target = plans[account.plan], plans[body.plan]
                domain.ensure_upgrade(current, target)
                amount = domain.prorate(current.monthly_price, target.monthly_price, now, start, end)
                row = self._new_order(account_id, "plan_upgrade", amount, period, now, plan=body.plan, previous=account.plan)
            else:
                amount = domain.package_amount(body.package.resource, body.package.amount)
                row = self._new_order(account_id, "quota_package", amount, period, now, package=body.package)
            await tx.insert_order(row)
            await self._audit(tx, audit, row, now, AuditAction.ORDER_CREATED)
            out = self._out(row)
            if idem is not None:
                await tx.remember_key(account_id, idem, 201, out.model_dump(mode="json"))
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
    ) -> OrderRow:
        return OrderRow(
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

    async def pay(self, account_id: UUID, order_id: UUID, idem: Idempotency | None = None, *, audit: AuditContext) -> Order:
        facts: list[BillingFact] = []
        async with self.store.transaction() as tx:
            if idem is not None and (stored := await tx.claim_key(account_id, idem)) is not None:
                paid = Order.model_validate(stored)  # a retry: the first answer, nothing charged
            else:
                paid, facts = await self._pay(tx, account_id, order_id, audit)
                if idem is not None:
                    await tx.remember_key(account_id, idem, 200, paid.model_dump(mode="json"))
        # Also for a retry (an order paid already): its event may still wait in the outbox (the
        # first answer was a 503), and a 200 says the payment is in force.
        await self.edge.deliver(facts)
        return paid

    async def _pay(self, tx: Tx, account_id: UUID, order_id: UUID, audit: AuditContext) -> tuple[Order, list[BillingFact]]:
        """The paid order and the billing.v1 events this call published (none: it was paid already)."""
        now = self.clock()
        period, _, _ = bounds_of(now, self.tz)
        account = await self._lock_for_plan(tx, account_id)
        order = await tx.lock_order(order_id, account_id)
        if order is None:
            raise NotFound("order")
        if order.status == "paid":
            return self._out(order), []  # paying twice is harmless: the same paid order, one charge
        if order.period != period:
            raise BillingConflict("The order was for an earlier period; create a new order.")
        if order.lapsed_at is not None:
            raise BillingConflict("This renewal's grace period ended unpaid and the plan went to free; order the plan again.")
        if order.kind == "plan_upgrade":
            assert order.plan is not None
            domain.ensure_plan_allowed(account.user_type, order.plan)  # the user type may have changed since
            if order.previous_plan is not account.plan:
                raise BillingConflict("The plan changed since this order was made; create a new order.")
        if domain.restores_plan(order):  # declined with no grace: the account was put on free for it
            assert order.plan is not None
            domain.ensure_plan_allowed(account.user_type, order.plan)
            if account.plan is not Tier.FREE:
                raise BillingConflict(
                    "The plan changed since this renewal was declined and the account put on free; "
                    "order the plan you want instead."
                )
        try:
            fact = await self._settle(tx, account, order, now, audit)
        except PaymentDeclined as exc:  # raised before anything was written: the order stays pending
            raise domain.ChargeDeclined(self._out(order)) from exc
        paid = await tx.lock_order(order_id, account_id)
        assert paid is not None
        return self._out(paid), [fact] if fact is not None else []

    async def _charge(self, order: OrderRow) -> str:
        """The provider's reference of the order's charge (PaymentDeclined: the payer refused).
        Nothing to charge: no call to the provider (a real one refuses a zero charge); the order
        is paid all the same, so the change keeps its order, invoice and audit entries."""
        if order.amount <= 0:
            return NO_CHARGE
        return (await self.provider.charge(order.id, order.account_id, order.amount, order.currency)).reference

    async def _settle(
        self, tx: Tx, account: AccountRow, order: OrderRow, now: datetime, audit: AuditContext, reference: str | None = None
    ) -> BillingFact | None:
        """Charge a pending order (unless the caller did: `reference`), mark it paid, invoice it and
        apply its effect: its billing.v1 fact (none for a renewal: the plan stays; but a renewal
        whose decline put the account on free puts its plan back)."""
        account_id = order.account_id
        if reference is None:
            reference = await self._charge(order)
        await tx.mark_paid(order.id, now, reference)
        await self._audit(tx, audit, order, now, AuditAction.ORDER_PAID)
        await self._issue_invoice(tx, order.id, account, now)
        if domain.restores_plan(order):
            assert order.plan is not None
            return await self._change_plan(tx, account_id, account.plan, order.plan, now)
        if order.kind == "plan_renewal":
            return None
        if order.kind == "plan_upgrade":
            assert order.plan is not None
            return await self._change_plan(tx, account_id, account.plan, order.plan, now)
        assert order.resource is not None and order.quantity is not None
        fact = PackagePurchased(
            time=now,
            account_id=account_id,
            resource=order.resource,
            amount=order.quantity,
            period=order.period,
            order_id=order.id,
        )
        await self.outbox.add(tx.conn, BILLING, str(account_id).encode(), fact.model_dump_json().encode())
        return fact

    async def _issue_invoice(self, tx: Tx, order_id: UUID, account: AccountRow, now: datetime) -> None:
        """The invoice, numbered in the payment's transaction (a rollback takes the number back)."""
        issuer = domain.seller()
        buyer = {"account_id": str(account.account_id), "user_type": account.user_type.value}
        number = await tx.take_invoice_number(issuer.id)
        await tx.insert_invoice(InvoiceRow(order_id, issuer.id, number, now, buyer))

    async def switch(self, account_id: UUID, tier: Tier, *, audit: AuditContext) -> Subscription:
        now = self.clock()
        period, start, end = bounds_of(now, self.tz)
        plans = catalogue()
        to_pay: OrderRow | None = None
        facts: list[BillingFact] = []
        async with self.store.transaction() as tx:
            account = await self._lock_for_plan(tx, account_id)
            current, target = plans[account.plan], plans[tier]
            amount = domain.prorate(current.monthly_price, target.monthly_price, now, start, end)
            kind = domain.classify_switch(account.user_type, current, target, amount)
            if kind is SwitchKind.IMMEDIATE:
                facts.append(await self._change_plan(tx, account_id, account.plan, tier, now))
                entry = audit.entry(
                    account_id,
                    now,
                    AuditAction.PLAN_SWITCHED,
                    "account",
                    account_id,
                    plan=tier.value,
                    previous_plan=account.plan.value,
                )
                await self.outbox.add(tx.conn, AUDIT, str(account_id).encode(), entry.model_dump_json().encode())
            elif kind in (SwitchKind.FREE_UPGRADE, SwitchKind.NEEDS_PAYMENT):
                upgrade = self._new_order(account_id, "plan_upgrade", amount, period, now, plan=tier, previous=account.plan)
                await tx.insert_order(upgrade)
                await self._audit(tx, audit, upgrade, now, AuditAction.ORDER_CREATED)
                if kind is SwitchKind.FREE_UPGRADE:  # 0.00: paid at once, as its payment would
                    fact = await self._settle(tx, account, upgrade, now, audit)
                    facts.extend([fact] if fact is not None else [])
                else:
                    to_pay = upgrade
            user_type = account.user_type
        if to_pay is not None:
            raise OrderToPay(self._out(to_pay))
        await self.edge.deliver(facts)
        return Subscription(plan=tier, user_type=user_type, period=PeriodRange(start=start, end=end))

    async def _change_plan(self, tx: Tx, account_id: UUID, old: Tier, new: Tier, now: datetime) -> PlanChanged:
        plan = catalogue()[new]
        # under the account's row lock: the order consumers keep
        version = await tx.set_plan(account_id, new, now, period_of(now, self.tz))
        await tx.record_plan(account_id, new, now, version)  # in keys' row, before its lock is let go
        event = PlanChanged(
            time=now,
            account_id=account_id,
            plan=new,
            previous_plan=old,
            quotas=dict(plan.quotas),
            rate_limit=plan.rate_limit,
            version=version,
        )
        await self.outbox.add(tx.conn, BILLING, str(account_id).encode(), event.model_dump_json().encode())
        return event

    # ---- renewals (an addition beyond the contract: docs/api.md, "Renewals") ---------------------
    async def renew_all(self) -> int:
        """The renewal job's pass (every replica's, services/billing/app.py): the current period's
        renewal for every account that held a paid plan at its start (only the current period's: a
        period the job missed entirely is not charged afterwards), then a charge of every renewal
        due. Returns how many renewals were paid. Several replicas may run it at once: one renewal
        per account and period (a unique index), each attempt under the account's and the order's
        row locks, re-judged once they are held."""
        now = self.clock()
        period, start, _ = bounds_of(now, self.tz)
        async with self.store.transaction() as tx:
            candidates = await tx.renewal_candidates(period)
        for account_id in candidates:
            try:
                await self._open_renewal(account_id, period, start, now)
            except Exception:  # one account's trouble holds up no other's renewal
                log.warning("opening the renewal of account %s failed; trying again next pass", account_id, exc_info=True)
        async with self.store.transaction() as tx:
            due = await tx.due_renewals(now)
        paid = 0
        for order_id, account_id in due:
            try:
                paid += await self._attempt_renewal(order_id, account_id)
            except Exception:
                log.warning("charging renewal %s failed; trying again next pass", order_id, exc_info=True)
        return paid

    async def _open_renewal(self, account_id: UUID, period: str, start: datetime, now: datetime) -> None:
        async with self.store.transaction() as tx:
            account = await self._lock(tx, account_id)  # after any plan change in flight: the plan at the start is settled
            if account.deleted_at is not None:  # ended (accounts.v1): never charged again
                return
            tier = await tx.start_plan(account_id, period, start)
            if tier is None or tier is Tier.FREE:
                return
            price = catalogue()[tier].monthly_price
            row = replace(self._new_order(account_id, "plan_renewal", price, period, now, plan=tier), next_attempt_at=now)
            if await tx.insert_renewal(row):
                await self._audit(tx, RENEWAL_JOB, row, now, AuditAction.ORDER_CREATED)

    async def _attempt_renewal(self, order_id: UUID, account_id: UUID) -> int:
        """One charge of a due renewal: paid (1), or declined (0) and tried again later, or, its
        grace over or never earned (`domain.grace_earned`), the account switched to free like a
        downgrade."""
        facts: list[BillingFact] = []
        async with self.store.transaction() as tx:
            account = await self._lock(tx, account_id)
            order = await tx.lock_order(order_id, account_id)
            now = self.clock()
            if order is None or not domain.renewal_due(order, now):
                return 0  # another replica charged it meanwhile, or the customer paid it
            if account.deleted_at is not None:  # the account ended during the grace: nothing more is charged
                await tx.lapse_renewals(account_id, now)
                return 0
            try:
                reference = await self._charge(order)
            except PaymentDeclined:
                declined = True
            except Exception:  # the provider failing, not the payer: tried again, the plan kept
                log.warning("charging renewal %s failed; trying again later", order_id, exc_info=True)
                declined = False
            else:
                await self._settle(tx, account, order, now, RENEWAL_JOB, reference)
                RENEWALS.labels("paid").inc()
                return 1
            if declined and not await self._grace_earned(tx, order):
                RENEWALS.labels("no_grace").inc()
                await tx.drop_renewal(order_id, now)  # pending still: paying it puts the plan back
                facts.extend(await self._renewal_unpaid(tx, account, order_id, now))
            elif declined and domain.grace_over(order, now):
                RENEWALS.labels("lapsed").inc()
                await tx.lapse_renewals(account_id, now)
                facts.extend(await self._renewal_unpaid(tx, account, order_id, now))
            else:
                RENEWALS.labels("declined" if declined else "provider_failed").inc()
                await tx.record_attempt(order_id, domain.next_attempt(order, now))
        if facts:
            await self.edge.deliver(facts)
        return 0

    async def _grace_earned(self, tx: Tx, order: OrderRow) -> bool:
        """The account paid a renewal of this plan or a dearer one for the period before this one's."""
        assert order.plan is not None
        before = await tx.paid_renewal_plan(order.account_id, domain.previous_period(order.period))
        plans = catalogue()
        return domain.grace_earned(plans[order.plan], plans[before] if before is not None else None)

    async def _renewal_unpaid(self, tx: Tx, account: AccountRow, order_id: UUID, now: datetime) -> list[BillingFact]:
        """The account put on free for a renewal left unpaid, audited as the operator's switch."""
        if account.plan is Tier.FREE:
            return []
        fact = await self._change_plan(tx, account.account_id, account.plan, Tier.FREE, now)
        entry = RENEWAL_JOB.entry(
            account.account_id,
            now,
            AuditAction.PLAN_SWITCHED,
            "account",
            account.account_id,
            plan=Tier.FREE.value,
            previous_plan=account.plan.value,
            reason="renewal_unpaid",
            order_id=str(order_id),
        )
        await self.outbox.add(tx.conn, AUDIT, str(account.account_id).encode(), entry.model_dump_json().encode())
        return [fact]

    # ---- republishing (docs/architecture.md, "Kafka is transport") ------------------------------
    async def republish(self, topics: Collection[str] = (BILLING.name,)) -> dict[str, int]:
        """billing.v1 again from Postgres: every account's current plan (`plan_changed` with its
        plan version and time, so a consumer that has it changes nothing) and the quota packages
        paid this period (each under its order id, which quota and the edge count once)."""
        unknown = sorted(set(topics) - {BILLING.name})
        if unknown:
            raise ValueError(f"the billing service does not own {unknown}")
        if not topics:
            return {}
        period, _, _ = bounds_of(self.clock(), self.tz)
        plans = catalogue()
        facts: list[BillingFact] = []
        async with self.store.transaction() as tx:
            for row in await tx.current_plans():
                plan = plans[row.plan]
                facts.append(
                    PlanChanged(
                        time=row.changed_at,
                        account_id=row.account_id,
                        plan=row.plan,
                        quotas=dict(plan.quotas),
                        rate_limit=plan.rate_limit,
                        version=row.version,
                    )
                )
            for order in await tx.paid_packages(period):
                assert order.resource is not None and order.quantity is not None and order.paid_at is not None
                facts.append(
                    PackagePurchased(
                        time=order.paid_at,
                        account_id=order.account_id,
                        resource=order.resource,
                        amount=order.quantity,
                        period=order.period,
                        order_id=order.id,
                    )
                )
            for fact in facts:
                await self.outbox.add(tx.conn, BILLING, str(fact.account_id).encode(), fact.model_dump_json().encode())
        await self.edge.deliver(facts)
        return {BILLING.name: len(facts)}

    async def held_states(self) -> dict[str, int]:
        """How many facts billing.v1 should hold at least (services/runtime/platform/state_guard.py)."""
        period, _, _ = bounds_of(self.clock(), self.tz)
        async with self.store.transaction() as tx:
            return {BILLING.name: await tx.count_facts(period)}

    # ---- facts from other services ---------------------------------------------------------------
    async def apply_user_type(self, event: UserTypeChanged | AccountState) -> None:
        """A user type from keys; an account's end (accounts.v1 `deleted`) is kept, so the renewal
        job never charges the account again."""
        if isinstance(event, AccountState) and event.deleted:
            async with self.store.transaction() as tx:
                await tx.mark_account_deleted(event.account_id, event.user_type, event.time)
            return
        async with self.store.transaction() as tx:
            await tx.set_user_type(event.account_id, event.user_type, event.time, event.version)

    def _out(self, row: OrderRow) -> Order:
        start, end = period_bounds(row.period, self.tz)
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
