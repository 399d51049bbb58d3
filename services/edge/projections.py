"""In-memory projections the edge reads on the request path: O(1) dict lookups, no I/O."""

from uuid import UUID

from contracts.common import Tier
from contracts.events import AccountState, KeyState, PlanChanged, order_of
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit


class AccountProjection:
    """account id -> current state, from accounts.v1."""

    def __init__(self) -> None:
        self._accounts: dict[UUID, AccountState] = {}

    def apply(self, state: AccountState) -> None:
        current = self._accounts.get(state.account_id)
        if current is not None and order_of(current) > order_of(state):
            return  # an older state, redelivered or delivered here after a newer one
        self._accounts[state.account_id] = state

    def get(self, account_id: UUID) -> AccountState | None:
        state = self._accounts.get(account_id)
        return None if state is None or state.deleted else state


class KeyProjection:
    """SHA-256 hex of the secret -> current key state, from keys.v1 (tombstones remove).

    Deleted keys are remembered (their last state, the newest `max_deleted`) so that a call with
    one can be attributed to its account in the activity log; they never authenticate."""

    def __init__(self, max_deleted: int = 100_000) -> None:
        self._by_hash: dict[str, KeyState] = {}
        self._hash_by_id: dict[UUID, str] = {}
        self._deleted: dict[str, KeyState] = {}  # insertion order: the oldest is forgotten first
        self._max_deleted = max_deleted

    def apply(self, state: KeyState) -> None:
        # the key's newest state: live, or deleted (an older state must not bring it back)
        current = self._by_hash.get(state.hash) or self._deleted.get(state.hash)
        if current is not None and order_of(current) > order_of(state):
            return
        if state.deleted:
            self.remove(state.key_id)
            self._remember_deleted(state)
            return
        self._deleted.pop(state.hash, None)
        self._by_hash[state.hash] = state
        self._hash_by_id[state.key_id] = state.hash

    def remove(self, key_id: UUID) -> None:
        digest = self._hash_by_id.pop(key_id, None)
        if digest is not None:
            state = self._by_hash.pop(digest, None)
            if state is not None:
                self._remember_deleted(state)

    def _remember_deleted(self, state: KeyState) -> None:
        self._deleted.pop(state.hash, None)
        if len(self._deleted) >= self._max_deleted:
            del self._deleted[next(iter(self._deleted))]
        self._deleted[state.hash] = state

    def get(self, digest: str) -> KeyState | None:
        return self._by_hash.get(digest)

    def by_id(self, key_id: UUID) -> KeyState | None:
        """A live key's state by its id (v4: its limits, for the quota gate)."""
        digest = self._hash_by_id.get(key_id)
        return None if digest is None else self._by_hash.get(digest)

    def deleted(self, digest: str) -> KeyState | None:
        """The last state of a deleted key with this secret's hash, if still remembered."""
        return self._deleted.get(digest)

    def __len__(self) -> int:
        return len(self._by_hash)


class PlanLimits:
    """account id -> the rate limits of its current plan, from billing.v1 `plan_changed`;
    accounts that never changed plan are on free."""

    def __init__(self) -> None:
        self._by_account: dict[UUID, PlanChanged] = {}
        self.default: RateLimit = catalogue()[Tier.FREE].rate_limit

    def apply(self, event: PlanChanged) -> None:
        current = self._by_account.get(event.account_id)
        if current is None or order_of(current) <= order_of(event):
            self._by_account[event.account_id] = event

    def rate_limit(self, account_id: UUID) -> RateLimit:
        event = self._by_account.get(account_id)
        return self.default if event is None else event.rate_limit

    def plan(self, account_id: UUID) -> Tier:
        event = self._by_account.get(account_id)
        return Tier.FREE if event is None else event.plan

    def latest(self, account_id: UUID) -> PlanChanged | None:
        """The account's newest plan change (its quotas too), None if it never changed plan."""
        return self._by_account.get(account_id)
