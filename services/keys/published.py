"""What the keys service's compacted topics hold, as an edge rebuilding from them would see it.

Postgres is the store of record and Kafka only carries its states (docs/architecture.md, "Kafka is
transport"), but a Postgres restored to an older point (docs/backup.md) is *behind* Kafka: the
topics still hold credentials made after the backup (a key, a member, a service token, an
account) and states newer than the restored rows (a key toggled off after the backup carries a
higher version than the backup's row). Every edge keeps the state with the highest version and
rebuilds from the topics, so republishing the rows alone would leave both in force. `Published`
folds the topics' records into what reconciling needs (services/keys/reconcile.py): per object,
its newest state (and whether it is live there: not deleted, removed or revoked, nor forgotten by
a tombstone), and the highest version any of its records carried; per
user, the newest end of its sessions any record carried (`UsersHeld.sessions_ended`), which a
restored row must not undo. Pure: the records are handed in (the operator CLI reads them with a
TopicFollower).
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from pydantic import ValidationError

from contracts.common import KeyStatus
from contracts.events import AccountState, KeyState, ServiceTokenState, UserState, order_of
from contracts.topics import ACCOUNTS, KEYS, SERVICE_TOKENS, USERS

log = logging.getLogger(__name__)

S = TypeVar("S", KeyState, AccountState, UserState, ServiceTokenState)

# The compacted topics whose objects Postgres may have lost (sessions.v1 only carries logouts:
# one made after the backup still ends its session, which is what a restore should keep).
RECONCILED_TOPICS: tuple[str, ...] = (ACCOUNTS.name, USERS.name, KEYS.name, SERVICE_TOKENS.name)


def _object_id(state: KeyState | AccountState | UserState | ServiceTokenState) -> UUID:
    if isinstance(state, KeyState):
        return state.key_id
    if isinstance(state, UserState):
        return state.user_id
    if isinstance(state, ServiceTokenState):
        return state.token_id
    return state.account_id


def _is_live(state: KeyState | AccountState | UserState | ServiceTokenState) -> bool:
    if isinstance(state, KeyState | AccountState):
        return not state.deleted
    if isinstance(state, UserState):
        return not state.removed
    return not state.revoked


@dataclass
class TopicHeld(Generic[S]):
    """One topic: per object id, its newest state, whether a tombstone forgot it since, and the
    highest version seen."""

    model: type[S]
    newest: dict[UUID, S] = field(default_factory=dict)
    forgotten: set[UUID] = field(default_factory=set)
    top: dict[UUID, int] = field(default_factory=dict)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: every edge forgets the object (keys, service tokens)
            if key is not None:
                self.forgotten.add(UUID(key.decode()))
            return
        state = self.model.model_validate_json(value)
        object_id = _object_id(state)
        self.top[object_id] = max(self.top.get(object_id, 0), state.version)
        self._seen(object_id, state)
        current = self.newest.get(object_id)
        if current is not None and order_of(current) > order_of(state):
            return  # an older state after a newer one: edges keep the newer
        self.newest[object_id] = state
        self.forgotten.discard(object_id)  # a state after the tombstone: edges hold it again

    def ended(self, object_id: UUID) -> bool:
        """Whether the object was ended: its newest state says so (deleted, removed, revoked), or
        a tombstone forgot it (a key or token compacted down to its tombstone)."""
        return self._ended_in_topic(object_id)

    def _ended_in_topic(self, object_id: UUID) -> bool:
        state = self.newest.get(object_id)
        return object_id in self.forgotten or (state is not None and not _is_live(state))

    @property
    def live(self) -> dict[UUID, S]:
        """Per object id, its newest state, of the objects the topic holds live (edges admit them)."""
        return {object_id: s for object_id, s in self.newest.items() if not self._ended_in_topic(object_id)}

    def _seen(self, object_id: UUID, state: S) -> None:
        """Each valid state, in the topic's order (before the newest is chosen)."""


@dataclass
class UsersHeld(TopicHeld[UserState]):
    """users.v1, and per user the latest instant before which any of its states ended its console
    sessions (a password change, a removal: `sessions_not_before`). A restore keeps those ends, as
    it keeps logouts: a session ended after the backup must not come back with it."""

    sessions_ended: dict[UUID, datetime] = field(default_factory=dict)

    def _seen(self, object_id: UUID, state: UserState) -> None:
        ended, known = state.sessions_not_before, self.sessions_ended.get(object_id)
        if ended is not None and (known is None or ended > known):
            self.sessions_ended[object_id] = ended


@dataclass
class KeysHeld(TopicHeld[KeyState]):
    """keys.v1, and the key revocations the shared limiter store holds (`revoked`: key id ->
    (version, "deleted" | "disabled" | "narrowed"), services/edge/rate_store.py): a second witness
    of a delete or disable after the backup, kept a week, where Kafka may have forgotten it (a
    tombstone compacted away, a cluster replaced). Their versions count as Kafka's (`top`), so a
    restored key moves past them too: no stale entry refuses it."""

    revoked: dict[UUID, tuple[int, str]] = field(default_factory=dict)

    def apply_revocations(self, revoked: dict[UUID, tuple[int, str]]) -> None:
        self.revoked.update(revoked)
        for key_id, (version, _how) in revoked.items():
            self.top[key_id] = max(self.top.get(key_id, 0), version)

    def ended(self, object_id: UUID) -> bool:
        entry = self.revoked.get(object_id)
        return super().ended(object_id) or (entry is not None and entry[1] == "deleted")

    def disabled(self, key_id: UUID) -> bool:
        """Whether the newest of the key's states and its revocation entry says disabled."""
        newest, entry = self.newest.get(key_id), self.revoked.get(key_id)
        if entry is not None and (newest is None or entry[0] > newest.version):
            return entry[1] == "disabled"
        return newest is not None and newest.status is KeyStatus.DISABLED


_AnyHeld = TopicHeld[KeyState] | TopicHeld[AccountState] | TopicHeld[UserState] | TopicHeld[ServiceTokenState]


class Published:
    """The four reconciled topics (by their names without the prefix), fed record by record."""

    def __init__(self) -> None:
        self.keys = KeysHeld(KeyState)
        self.accounts = TopicHeld(AccountState)
        self.users = UsersHeld(UserState)
        self.service_tokens = TopicHeld(ServiceTokenState)
        self._by_topic: dict[str, _AnyHeld] = {
            KEYS.name: self.keys,
            ACCOUNTS.name: self.accounts,
            USERS.name: self.users,
            SERVICE_TOKENS.name: self.service_tokens,
        }

    def apply(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        try:
            self._by_topic[topic].apply(key, value)
        except (ValidationError, ValueError):  # as the edge does: a bad record changes nothing
            log.warning("a record of %s that is no state was skipped", topic)

    def top_versions(self, topic: str) -> dict[UUID, int]:
        """object id -> the highest version its records in `topic` carried."""
        return dict(self._by_topic[topic].top)
