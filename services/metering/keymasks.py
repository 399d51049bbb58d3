"""key id -> masked key, followed from keys.v1 so the activity log can show which key called.

keys.v1 carries `masked_key` (never the secret). A deleted key keeps its mask here: the log
of its past calls should still say which key it was. Unknown keys show null.
"""

import json
from uuid import UUID

from contracts.events import KeyState


class KeyMasks:
    def __init__(self) -> None:
        self._masks: dict[UUID, str] = {}

    def apply(self, _key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: keep the mask for the history
            return
        state = KeyState.model_validate(json.loads(value))
        if state.masked_key:
            self._masks[state.key_id] = state.masked_key

    def get(self, key_id: UUID) -> str | None:
        return self._masks.get(key_id)
