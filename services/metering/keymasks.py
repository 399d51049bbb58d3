"""The keys metering knows from keys.v1: each key's mask (so the activity log can show which key
called) and (v4) its account, own limits (the by-key view's usage against each limit), its lineage
(the keys it was rotated from, whose usage its limits go on counting) and allowed models (the
sink flags usage of a model its key does not allow).

keys.v1 carries `masked_key` (never the secret). A deleted key keeps its mask here: the log
of its past calls should still say which key it was. Unknown keys show null, and so does another
account's key: a platform service's usage event may name any key id, and its mask is not the
reporting account's to see.
"""

import json
from dataclasses import dataclass, replace
from uuid import UUID

from contracts.events import KeyState
from contracts.key_limits import KeyLimit


@dataclass(frozen=True, slots=True)
class KnownKey:
    key_id: UUID
    account_id: UUID
    masked_key: str | None
    limits: tuple[KeyLimit, ...]
    allowed_models: tuple[str, ...] = ()
    # (v4) every key of its lineage metering has seen, itself and the lineage's first key included
    lineage_keys: tuple[UUID, ...] = ()

    @property
    def counted_keys(self) -> tuple[UUID, ...]:
        """The keys whose usage its limits count: its lineage's (none known: itself alone)."""
        return self.lineage_keys or (self.key_id,)


class KeyMasks:
    def __init__(self) -> None:
        self._masks: dict[UUID, tuple[UUID, str]] = {}  # key -> its account, its mask
        self._live: dict[UUID, dict[UUID, KnownKey]] = {}  # account -> its live keys
        # (v4) lineage -> the keys of it seen; kept after a deletion, as masks are: a rotated key's
        # limits go on counting its predecessors' usage
        self._lineages: dict[UUID, set[UUID]] = {}
        self._lineage_of: dict[UUID, UUID] = {}  # key -> its lineage

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: keep the mask for the history, forget the key's limits
            if key is not None:
                self._forget(key.decode())
            return
        state = KeyState.model_validate(json.loads(value))
        if state.masked_key:
            self._masks[state.key_id] = (state.account_id, state.masked_key)
        self._lineages.setdefault(state.lineage, {state.lineage}).add(state.key_id)
        self._lineage_of[state.key_id] = state.lineage
        keys = self._live.setdefault(state.account_id, {})
        if state.deleted:
            keys.pop(state.key_id, None)
        else:
            keys[state.key_id] = KnownKey(
                state.key_id,
                state.account_id,
                state.masked_key or self.mask(state.account_id, state.key_id),
                tuple(state.limits),
                tuple(state.allowed_models),
            )

    def _forget(self, key_id: str) -> None:
        try:
            gone = UUID(key_id)
        except ValueError:
            return
        for keys in self._live.values():
            keys.pop(gone, None)

    def mask(self, account_id: UUID, key_id: UUID) -> str | None:
        """The key's mask if it is a key of `account_id` (deleted ones too), else None."""
        known = self._masks.get(key_id)
        return known[1] if known is not None and known[0] == account_id else None

    def allowed_models(self, account_id: UUID, key_id: UUID) -> tuple[str, ...]:
        """The key's allowed_models as keys.v1 last said; () (every model) for a key that is not a
        live key of `account_id`: a deleted or unknown key has no rules left to judge by."""
        key = self._live.get(account_id, {}).get(key_id)
        return key.allowed_models if key is not None else ()

    def keys_of(self, account_id: UUID) -> list[KnownKey]:
        """The account's live keys, as keys.v1 last said (never another account's), each with the
        keys of its lineage seen so far."""
        return [
            replace(key, lineage_keys=tuple(sorted(self._lineages[self._lineage_of[key.key_id]])))
            for key in self._live.get(account_id, {}).values()
        ]
