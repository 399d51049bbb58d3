"""A page's keyset cursor: the (time, id) of its last item, opaque to clients (base64 of both).

Billing's order history and the audit log page this way, newest first, so new items never shift
a page."""

import base64
from datetime import datetime
from uuid import UUID


def encode(time: datetime, item_id: UUID) -> str:
    raw = f"{time.isoformat()}|{item_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, UUID]:
    """ValueError for a cursor this API did not give (binascii.Error and UnicodeDecodeError are ValueErrors too)."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    moment, item_id = raw.split("|")
    time = datetime.fromisoformat(moment)
    if time.tzinfo is None:
        raise ValueError("naive")
    return time, UUID(item_id)
