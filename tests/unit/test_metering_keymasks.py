"""(v4) Metering's projection of keys.v1 gives the sink each live key's allowed models, and only to
the key's own account; a deleted key (or its tombstone) has no rules left."""

import hashlib
import uuid
from datetime import UTC, datetime

from contracts.common import KeyStatus, Role
from contracts.events import KeyState
from services.metering.keymasks import KeyMasks

ACCOUNT, OTHER, KEY = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def state(*, deleted: bool = False, models: list[str] | None = None) -> bytes:
    return (
        KeyState(
            time=datetime(2026, 11, 26, tzinfo=UTC),
            account_id=ACCOUNT,
            key_id=KEY,
            hash=hashlib.sha256(b"k").hexdigest(),
            status=KeyStatus.ENABLED,
            roles=[Role.OWNER],
            deleted=deleted,
            allowed_models=models or [],
        )
        .model_dump_json()
        .encode()
    )


def test_a_live_keys_allowed_models_are_known_to_its_account_only():
    masks = KeyMasks()
    masks.apply(str(KEY).encode(), state(models=["openai/*"]))
    assert masks.allowed_models(ACCOUNT, KEY) == ("openai/*",)
    assert masks.allowed_models(OTHER, KEY) == ()  # an event of another account naming this key
    masks.apply(str(KEY).encode(), state(deleted=True, models=["openai/*"]))
    assert masks.allowed_models(ACCOUNT, KEY) == ()
    masks.apply(str(KEY).encode(), state(models=["openai/*"]))
    masks.apply(str(KEY).encode(), None)  # compacted away
    assert masks.allowed_models(ACCOUNT, KEY) == ()


def test_a_keys_lineage_keeps_its_deleted_predecessors():
    """(v4) keys_of gives each live key the keys of its lineage seen, deleted ones included (their
    usage still counts against the rotated key's limits)."""
    masks = KeyMasks()
    new = uuid.uuid4()
    masks.apply(str(KEY).encode(), state())
    rotated = KeyState.model_validate_json(state()).model_copy(update={"key_id": new, "lineage_id": KEY})
    masks.apply(str(new).encode(), rotated.model_dump_json().encode())
    masks.apply(str(KEY).encode(), state(deleted=True))
    masks.apply(str(KEY).encode(), None)
    [known] = masks.keys_of(ACCOUNT)
    assert known.key_id == new and set(known.lineage_keys) == {KEY, new}


def test_a_keys_mask_is_shown_to_its_own_account_only():
    """A platform service's usage event for another account may name this key (review): that
    account's by-provider view and activity log must not show this account's mask."""
    masks = KeyMasks()
    masked = KeyState.model_validate_json(state()).model_copy(update={"masked_key": "sk-ab...cdef"})
    masks.apply(str(KEY).encode(), masked.model_dump_json().encode())
    assert masks.mask(ACCOUNT, KEY) == "sk-ab...cdef"
    assert masks.mask(OTHER, KEY) is None
    masks.apply(str(KEY).encode(), masked.model_copy(update={"deleted": True}).model_dump_json().encode())
    assert masks.mask(ACCOUNT, KEY) == "sk-ab...cdef"  # a deleted key keeps its mask for its history
    assert masks.mask(OTHER, KEY) is None
