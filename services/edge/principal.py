"""Who is calling: the account, its current roles, and the API key when the call used one."""

from dataclasses import dataclass
from uuid import UUID

from contracts.common import Permission, Role, permissions_of
from services.edge.key_rules import KeyGate


@dataclass(frozen=True, slots=True)
class Principal:
    account_id: UUID
    roles: frozenset[Role]
    api_key_id: UUID | None = None  # None for a console session
    session_id: str | None = None  # the console session's id (logout revokes it)
    # The user acting: the session's user, or the key's creator (None: a key from before members)
    user_id: UUID | None = None
    # (API key) the version of the key's state it was judged by: a revocation of a later version
    # in the shared store refuses it before this process has that state (key_revocations.KeyRevoked)
    key_version: int = 0
    # (v4) the key's own restrictions, parsed (None: it has none; a session never has any)
    gate: KeyGate | None = None
    # the version of the acting user's users.v1 state it was judged by (-1: none known): a removal
    # or role change of a later version in the shared store refuses it (user_revocations.py)
    user_version: int = -1
    # (console session) its issue time, unix seconds: a password change in the shared store ends it
    issued_at: float = 0.0

    @property
    def is_console(self) -> bool:
        return self.api_key_id is None

    def can(self, permission: Permission) -> bool:
        return permission in permissions_of(self.roles)
