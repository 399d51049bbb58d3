"""The quota service's Postgres adapter (schema `quota`): ALL its SQL. A use case opens one
`transaction()` and calls the methods of the `QuotaTx` it yields, so counters, idempotency marks,
reservations and threshold marks commit together (or not at all)."""

import json
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from contracts.common import STOCK_RESOURCES, Resource, Tier
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.plans import catalogue
from services.quota.domain import EPOCH, Delta, KeyDelta
from services.runtime.platform.postgres import autocommit, try_xact_lock

Conn = AsyncConnection[Any]  # dict rows (see services/runtime/platform/postgres.py)
_STOCKS = [r.value for r in STOCK_RESOURCES]
# A month's packages past this are unlimited in effect: capped so that their sum (and a plan's quota
# on top) stays a bigint. Two of the largest orders billing takes would overflow it, and the
# failing billing.v1 event would be redelivered for ever, holding up every account behind it.
PACKAGES_CAP = 2**62


@dataclass(frozen=True, slots=True)
class Line:
    resource: Resource
    total: int
    used: int
    watermark: datetime


@dataclass(frozen=True, slots=True)
class KeyRulesRow:
    """What quota knows of one key (keys.v1): its account, limits, whether it was deleted, and its
    lineage (the counters its limits count in, shared with the keys it was rotated from)."""

    api_key_id: UUID
    account_id: UUID
    limits: list[KeyLimit]
    deleted: bool
    lineage_id: UUID


@dataclass(frozen=True, slots=True)
class KeyLine:
    """One key lineage's counter in one window of one of its limits."""

    used: int
    watermark: datetime
    mark: int  # the highest whole percent announced in this window


# one counter of a key lineage: (lineage, resource, limit period, window)
KeySlot = tuple[UUID, Resource, LimitPeriod, str]
Held = tuple[UUID, Resource, UUID | None]  # (account, resource, key lineage) a released reservation held room in


class QuotaStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["QuotaTx"]:
        async with self._pool.connection() as conn, conn.transaction():
            yield QuotaTx(conn)

    async def any_expired(self, now: datetime) -> bool:
        """Whether a reservation is past its expiry: one round trip, outside any transaction
        (the sweeper asks every second; a transaction and its lock only when there is work)."""
        async with autocommit(cast("AsyncConnectionPool[Conn]", self._pool)) as conn:  # dict rows
            cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM quota.reservations WHERE expires_at <= %s) AS due", (now,))
            row = await cur.fetchone()
        return row is not None and bool(row["due"])


class QuotaTx:
    """The statements of one transaction (the account rows it locks stay locked until its end)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def mark_processed(self, event_ids: list[UUID]) -> set[UUID]:
        """Record event ids; returns those not seen before (the ones to count). A batch's thousand
        ids go and come back in binary and as plain tuples: no text to parse, no dict per row."""
        if not event_ids:
            return set()
        async with self.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(
                """
                INSERT INTO quota.processed_events (event_id) SELECT unnest(%b::uuid[])
                ON CONFLICT DO NOTHING RETURNING event_id
                """,
                (event_ids,),
                binary=True,
            )
            return {event_id for (event_id,) in await cur.fetchall()}

    async def lock_accounts(self, account_ids: Iterable[UUID]) -> None:
        """Serialise writers per account (in id order, so two batches never deadlock)."""
        ordered = sorted(set(account_ids))
        if not ordered:
            return
        await self.conn.execute(
            "INSERT INTO quota.accounts (account_id) SELECT unnest(%s::uuid[]) ON CONFLICT DO NOTHING", (ordered,)
        )
        await self.conn.execute(
            "SELECT account_id FROM quota.accounts WHERE account_id = ANY(%s) ORDER BY account_id FOR UPDATE", (ordered,)
        )

    async def known_accounts(self, after: UUID | None, limit: int) -> list[UUID]:
        """Accounts quota has published states of (every account it ever locked), in id order."""
        cur = await self.conn.execute(
            "SELECT account_id FROM quota.accounts WHERE %s::uuid IS NULL OR account_id > %s ORDER BY account_id LIMIT %s",
            (after, after, limit),
        )
        return [row["account_id"] for row in await cur.fetchall()]

    async def count_accounts(self) -> int:
        cur = await self.conn.execute("SELECT count(*) AS n FROM quota.accounts")
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])

    async def add_deltas(self, deltas: list[Delta]) -> None:
        if not deltas:
            return
        ordered = sorted(deltas, key=lambda d: (d.account_id, d.resource, d.period))
        await self.conn.execute(
            """
            INSERT INTO quota.counters (account_id, resource, period, used, last_event_time)
            SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bigint[], %s::timestamptz[])
            ON CONFLICT (account_id, resource, period) DO UPDATE
               SET used = quota.counters.used + EXCLUDED.used,
                   last_event_time = GREATEST(quota.counters.last_event_time, EXCLUDED.last_event_time)
            """,
            (
                [d.account_id for d in ordered],
                [d.resource.value for d in ordered],
                [d.period for d in ordered],
                [d.quantity for d in ordered],
                [d.last_time for d in ordered],
            ),
        )

    async def set_plan(self, account_id: UUID, plan: Tier, quotas: Mapping[Resource, int], time: datetime, version: int) -> bool:
        """Apply a plan change unless a later one is already in place (events may come reordered,
        and billing's version orders them before their times: contracts/events.py, order_of)."""
        cur = await self.conn.execute(
            """
            UPDATE quota.accounts SET plan = %s, quotas = %s, plan_time = %s, plan_version = %s
             WHERE account_id = %s AND (plan_time IS NULL OR (plan_version, plan_time) < (%s, %s))
            """,
            (plan.value, json.dumps({r.value: n for r, n in quotas.items()}), time, version, account_id, version, time),
        )
        return cur.rowcount > 0

    async def add_package(self, order_id: UUID, account_id: UUID, resource: Resource, period: str, amount: int) -> bool:
        cur = await self.conn.execute(
            """
            INSERT INTO quota.packages (order_id, account_id, resource, period, amount) VALUES (%s, %s, %s, %s, %s)
            ON CONFLICT (order_id) DO NOTHING
            """,
            (order_id, account_id, resource.value, period, amount),
        )
        return cur.rowcount > 0

    async def lines(self, account_ids: Collection[UUID], period: str) -> dict[UUID, dict[Resource, Line]]:
        """Total and used of every resource in `period` of each account: flows count that period,
        stocks their level. One query per kind (plan, packages, counters) for all the accounts: a
        batch touching many accounts reads them in three round trips, not three per account."""
        ids = sorted(set(account_ids))
        if not ids:
            return {}
        cur = await self.conn.execute("SELECT account_id, quotas FROM quota.accounts WHERE account_id = ANY(%s)", (ids,))
        plans: dict[UUID, Mapping[str, int]] = {r["account_id"]: r["quotas"] for r in await cur.fetchall() if r["quotas"]}
        cur = await self.conn.execute(
            """
            SELECT account_id, resource, least(sum(amount), %s)::bigint AS amount FROM quota.packages
             WHERE account_id = ANY(%s) AND period = %s GROUP BY account_id, resource
            """,
            (PACKAGES_CAP, ids, period),
        )
        packages = {(r["account_id"], r["resource"]): int(r["amount"]) for r in await cur.fetchall()}
        cur = await self.conn.execute(
            """
            SELECT account_id, resource, sum(used)::bigint AS used, max(last_event_time) AS watermark FROM quota.counters
             WHERE account_id = ANY(%s) AND (period = %s OR (resource = ANY(%s) AND period <= %s))
             GROUP BY account_id, resource
            """,
            (ids, period, _STOCKS, period),
        )
        counted = {(r["account_id"], r["resource"]): (int(r["used"]), r["watermark"]) for r in await cur.fetchall()}
        free = {r.value: n for r, n in catalogue()[Tier.FREE].quotas.items()}
        result: dict[UUID, dict[Resource, Line]] = {}
        for account_id in ids:
            plan_quotas = plans.get(account_id, free)
            lines = result[account_id] = {}
            for resource in Resource:
                used, watermark = counted.get((account_id, resource.value), (0, EPOCH))
                total = int(plan_quotas.get(resource.value, 0)) + packages.get((account_id, resource.value), 0)
                lines[resource] = Line(resource, total, max(used, 0), watermark)
        return result

    async def marks(self, account_ids: Collection[UUID], period: str) -> dict[UUID, dict[Resource, int]]:
        """The highest whole percent announced of each resource in `period`, per account (none: 0)."""
        found: dict[UUID, dict[Resource, int]] = {account_id: {} for account_id in account_ids}
        if not found:
            return found
        cur = await self.conn.execute(
            "SELECT account_id, resource, pct FROM quota.threshold_marks WHERE account_id = ANY(%s) AND period = %s",
            (sorted(found), period),
        )
        for r in await cur.fetchall():
            found[r["account_id"]][Resource(r["resource"])] = int(r["pct"])
        return found

    async def set_marks(self, marks: Iterable[tuple[UUID, Resource, str, int]]) -> None:
        """Move threshold marks ((account, resource, period, pct), each key at most once), in one statement."""
        ordered = sorted(marks, key=lambda m: (m[0], m[1].value, m[2]))
        if not ordered:
            return
        await self.conn.execute(
            """
            INSERT INTO quota.threshold_marks (account_id, resource, period, pct)
            SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::smallint[])
            ON CONFLICT (account_id, resource, period) DO UPDATE SET pct = EXCLUDED.pct
            """,
            ([m[0] for m in ordered], [m[1].value for m in ordered], [m[2] for m in ordered], [m[3] for m in ordered]),
        )

    # ---- reservations (v2) ----
    async def reserved(self, account_ids: Collection[UUID], now: datetime) -> dict[UUID, dict[Resource, int]]:
        """Open reservations per resource of each account: those not yet expired at `now` (the
        sweeper deletes the expired ones soon after, but they stop counting at their expiry, not at
        the sweep)."""
        found = {account_id: dict.fromkeys(Resource, 0) for account_id in account_ids}
        if not found:
            return found
        cur = await self.conn.execute(
            """
            SELECT account_id, resource, sum(amount)::bigint AS amount FROM quota.reservations
             WHERE account_id = ANY(%s) AND expires_at > %s GROUP BY account_id, resource
            """,
            (sorted(found), now),
        )
        for r in await cur.fetchall():
            found[r["account_id"]][Resource(r["resource"])] = int(r["amount"])
        return found

    async def add_reservation(
        self,
        reservation_id: UUID,
        account_id: UUID,
        resource: Resource,
        amount: int,
        owner_id: UUID | None,
        created_at: datetime,
        expires_at: datetime,
        api_key_id: UUID | None = None,
        lineage_id: UUID | None = None,
    ) -> None:
        """`lineage_id`: the key lineage whose limits the reservation holds room in (None: none)."""
        await self.conn.execute(
            """
            INSERT INTO quota.reservations
                   (id, account_id, resource, amount, owner_id, created_at, expires_at, api_key_id, lineage_id)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (reservation_id, account_id, resource.value, amount, owner_id, created_at, expires_at, api_key_id, lineage_id),
        )

    async def reservation_account(self, reservation_id: UUID, owner_id: UUID | None, now: datetime) -> UUID | None:
        """The account of an open reservation made by `owner_id` (None: unknown, another owner's, or
        expired at `now`: it stopped counting at its expiry, swept or not)."""
        cur = await self.conn.execute(
            """
            SELECT account_id FROM quota.reservations
             WHERE id = %s AND owner_id IS NOT DISTINCT FROM %s::uuid AND expires_at > %s
            """,
            (reservation_id, owner_id, now),
        )
        row = await cur.fetchone()
        return None if row is None else UUID(str(row["account_id"]))

    async def delete_reservation(
        self, reservation_id: UUID, owner_id: UUID | None, now: datetime
    ) -> tuple[Resource, UUID | None] | None:
        """The released reservation's resource and key lineage (None: there was no open one of this
        owner; an expired one is left to the sweeper, which publishes what it frees)."""
        cur = await self.conn.execute(
            """
            DELETE FROM quota.reservations WHERE id = %s AND owner_id IS NOT DISTINCT FROM %s::uuid AND expires_at > %s
            RETURNING resource, lineage_id
            """,
            (reservation_id, owner_id, now),
        )
        row = await cur.fetchone()
        return None if row is None else (Resource(row["resource"]), row["lineage_id"])

    async def settle_reservations(self, settled: Iterable[tuple[UUID, UUID, Resource]]) -> set[Held]:
        """Release the reservations named by counted usage events ((reservation id, account id,
        resource) triples: an event settles only a reservation of its own account and resource, the
        usage it held room for). Unknown or expired ids are ignored."""
        triples = sorted(set(settled))
        if not triples:
            return set()
        cur = await self.conn.execute(
            """
            DELETE FROM quota.reservations r USING unnest(%s::uuid[], %s::uuid[], %s::text[]) AS s(id, account_id, resource)
             WHERE r.id = s.id AND r.account_id = s.account_id AND r.resource = s.resource
            RETURNING r.account_id, r.resource, r.lineage_id
            """,
            ([t[0] for t in triples], [t[1] for t in triples], [t[2].value for t in triples]),
        )
        return {(UUID(str(r["account_id"])), Resource(r["resource"]), r["lineage_id"]) for r in await cur.fetchall()}

    async def expired_accounts(self, now: datetime, limit: int) -> list[UUID]:
        cur = await self.conn.execute(
            "SELECT DISTINCT account_id FROM quota.reservations WHERE expires_at <= %s LIMIT %s", (now, limit)
        )
        return sorted(UUID(str(r["account_id"])) for r in await cur.fetchall())

    async def delete_expired(self, account_ids: list[UUID], now: datetime) -> set[Held]:
        cur = await self.conn.execute(
            """
            DELETE FROM quota.reservations WHERE account_id = ANY(%s) AND expires_at <= %s
            RETURNING account_id, resource, lineage_id
            """,
            (account_ids, now),
        )
        return {(UUID(str(r["account_id"])), Resource(r["resource"]), r["lineage_id"]) for r in await cur.fetchall()}

    # ---- (v4) limits per key, counted per key lineage ----
    @staticmethod
    def _key_rules_row(row: dict[str, Any]) -> KeyRulesRow:
        limits = [KeyLimit.model_validate(x) for x in row["limits"]]
        return KeyRulesRow(row["api_key_id"], row["account_id"], limits, row["deleted"], row["lineage_id"])

    async def key_rules(self, key_ids: Iterable[UUID]) -> dict[UUID, KeyRulesRow]:
        ids = sorted(set(key_ids))
        if not ids:
            return {}
        cur = await self.conn.execute(
            "SELECT api_key_id, account_id, limits, deleted, lineage_id FROM quota.key_rules WHERE api_key_id = ANY(%s)",
            (ids,),
        )
        return {row["api_key_id"]: self._key_rules_row(row) for row in await cur.fetchall()}

    async def lineage_rules(self, lineage_ids: Iterable[UUID]) -> dict[UUID, list[KeyRulesRow]]:
        """Every key quota knows of each lineage (deleted ones too), oldest key id first."""
        ids = sorted(set(lineage_ids))
        if not ids:
            return {}
        cur = await self.conn.execute(
            """
            SELECT api_key_id, account_id, limits, deleted, lineage_id FROM quota.key_rules
             WHERE lineage_id = ANY(%s) ORDER BY api_key_id
            """,
            (ids,),
        )
        found: dict[UUID, list[KeyRulesRow]] = {}
        for row in await cur.fetchall():
            found.setdefault(row["lineage_id"], []).append(self._key_rules_row(row))
        return found

    async def set_key_rules(
        self,
        api_key_id: UUID,
        account_id: UUID,
        limits: list[KeyLimit],
        deleted: bool,
        version: int,
        time: datetime,
        lineage_id: UUID,
    ) -> bool:
        """Keep a key's limits and lineage unless a newer state of it is already kept (keys.v1 may
        redeliver or reorder: contracts/events.py, order_of). True when this state was newer."""
        cur = await self.conn.execute(
            """
            INSERT INTO quota.key_rules AS k (api_key_id, account_id, limits, deleted, rules_version, rules_time, lineage_id)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (api_key_id) DO UPDATE
               SET limits = EXCLUDED.limits, deleted = EXCLUDED.deleted,
                   rules_version = EXCLUDED.rules_version, rules_time = EXCLUDED.rules_time, lineage_id = EXCLUDED.lineage_id
             WHERE (k.rules_version, k.rules_time) < (EXCLUDED.rules_version, EXCLUDED.rules_time)
               AND k.account_id = EXCLUDED.account_id
            """,
            (api_key_id, account_id, json.dumps([x.model_dump(mode="json") for x in limits]), deleted, version, time, lineage_id),
        )
        return cur.rowcount > 0

    async def limited_lineages(self, account_ids: Iterable[UUID]) -> list[UUID]:
        """The lineages of these accounts with a live key that has limits (republishing, window changes)."""
        cur = await self.conn.execute(
            """
            SELECT DISTINCT lineage_id FROM quota.key_rules
             WHERE account_id = ANY(%s) AND NOT deleted AND limits <> '[]'::jsonb ORDER BY lineage_id
            """,
            (sorted(set(account_ids)),),
        )
        return [row["lineage_id"] for row in await cur.fetchall()]

    async def add_key_deltas(self, deltas: list[KeyDelta]) -> None:
        if not deltas:
            return
        ordered = sorted(deltas, key=lambda d: (d.lineage_id, d.resource, d.period, d.window))
        await self.conn.execute(
            """
            INSERT INTO quota.key_counters (lineage_id, resource, period, time_window, used, last_event_time)
            SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::timestamptz[])
            ON CONFLICT (lineage_id, resource, period, time_window) DO UPDATE
               SET used = quota.key_counters.used + EXCLUDED.used,
                   last_event_time = GREATEST(quota.key_counters.last_event_time, EXCLUDED.last_event_time)
            """,
            (
                [d.lineage_id for d in ordered],
                [d.resource.value for d in ordered],
                [d.period.value for d in ordered],
                [d.window for d in ordered],
                [d.quantity for d in ordered],
                [d.last_time for d in ordered],
            ),
        )

    async def key_lines(self, wanted: Iterable[KeySlot]) -> dict[KeySlot, KeyLine]:
        """Each (lineage, resource, period, window) counter asked for, in one read for them all
        (a batch touching many keys reads them in one round trip, not one per key and limit);
        one never counted in stands at 0."""
        slots = sorted(set(wanted), key=lambda s: (s[0], s[1].value, s[2].value, s[3]))
        found = dict.fromkeys(slots, KeyLine(0, EPOCH, 0))
        if not slots:
            return found
        cur = await self.conn.execute(
            """
            SELECT c.lineage_id, c.resource, c.period, c.time_window, c.used, c.last_event_time, c.pct
              FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[]) AS w(lineage_id, resource, period, time_window)
              JOIN quota.key_counters c USING (lineage_id, resource, period, time_window)
            """,
            ([s[0] for s in slots], [s[1].value for s in slots], [s[2].value for s in slots], [s[3] for s in slots]),
        )
        for r in await cur.fetchall():
            slot = (r["lineage_id"], Resource(r["resource"]), LimitPeriod(r["period"]), r["time_window"])
            found[slot] = KeyLine(max(int(r["used"]), 0), r["last_event_time"], int(r["pct"]))
        return found

    async def set_key_marks(self, marks: Iterable[tuple[UUID, Resource, LimitPeriod, str, int]]) -> None:
        """Move the marks of key counters ((lineage, resource, period, window, pct), each counter at
        most once), in one statement."""
        ordered = sorted(marks, key=lambda m: (m[0], m[1].value, m[2].value, m[3]))
        if not ordered:
            return
        await self.conn.execute(
            """
            INSERT INTO quota.key_counters (lineage_id, resource, period, time_window, last_event_time, pct)
            SELECT m.lineage_id, m.resource, m.period, m.time_window, %s, m.pct
              FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::smallint[])
                   AS m(lineage_id, resource, period, time_window, pct)
            ON CONFLICT (lineage_id, resource, period, time_window) DO UPDATE SET pct = EXCLUDED.pct
            """,
            (
                EPOCH,
                [m[0] for m in ordered],
                [m[1].value for m in ordered],
                [m[2].value for m in ordered],
                [m[3] for m in ordered],
                [m[4] for m in ordered],
            ),
        )

    async def key_reserved(self, lineage_ids: Collection[UUID], now: datetime) -> dict[UUID, dict[Resource, int]]:
        """Open reservations made for the calls of each lineage's keys, per resource (unexpired at
        `now`), in one read for all the lineages."""
        found = {lineage_id: dict.fromkeys(Resource, 0) for lineage_id in lineage_ids}
        if not found:
            return found
        cur = await self.conn.execute(
            """
            SELECT lineage_id, resource, sum(amount)::bigint AS amount FROM quota.reservations
             WHERE lineage_id = ANY(%s) AND expires_at > %s GROUP BY lineage_id, resource
            """,
            (sorted(found), now),
        )
        for r in await cur.fetchall():
            found[r["lineage_id"]][Resource(r["resource"])] = int(r["amount"])
        return found

    async def next_key_state_versions(self, lineage_ids: Iterable[UUID]) -> dict[UUID, int]:
        """The version of each lineage's next published states: one more than its last (under the
        accounts' locks, so states computed one after the other get increasing versions), in one
        statement for all the lineages."""
        ids = sorted(set(lineage_ids))
        if not ids:
            return {}
        cur = await self.conn.execute(
            """
            INSERT INTO quota.key_lineages AS l (lineage_id, state_version) SELECT unnest(%s::uuid[]), 1
            ON CONFLICT (lineage_id) DO UPDATE SET state_version = l.state_version + 1
            RETURNING lineage_id, state_version
            """,
            (ids,),
        )
        return {r["lineage_id"]: int(r["state_version"]) for r in await cur.fetchall()}

    async def try_lock(self, name: str) -> bool:
        """A transaction-scoped advisory try-lock: False when another replica holds it."""
        return await try_xact_lock(self.conn, name)
