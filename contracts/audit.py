"""(v2) The audit log (API.md, "Audit log (v2)"): who did what to which object, from where.

Every console and operator write emits one `AuditRecorded` event on audit.v1 through its
service's outbox, in the transaction of the write; the keys service stores and serves them.
`AuditContext` is how a route hands the caller and its address to a use case (no HTTP objects):
the edge builds it from the request (services/edge/edge.py, `Edge.audit_context`).
"""

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from contracts.events import Event

# The account of the platform's own entries (the operator's service-token writes): no account
# has this id, so no account ever reads them through the API.
PLATFORM_ACCOUNT = UUID(int=0)


class AuditAction(StrEnum):
    API_KEY_CREATED = "api_key.created"
    API_KEY_TOGGLED = "api_key.toggled"
    API_KEY_DELETED = "api_key.deleted"
    API_KEY_ROTATED = "api_key.rotated"
    API_KEY_UPDATED = "api_key.updated"  # (v4) PATCH: its details are the changed fields' new values
    MEMBER_ADDED = "member.added"
    MEMBER_ROLE_CHANGED = "member.role_changed"
    MEMBER_REMOVED = "member.removed"
    SESSION_LOGOUT = "session.logout"
    ORDER_CREATED = "order.created"
    ORDER_PAID = "order.paid"
    PLAN_SWITCHED = "plan.switched"
    USER_TYPE_CHANGED = "user_type.changed"
    PASSWORD_CHANGED = "password.changed"  # noqa: S105 - an action name, not a secret
    ALERT_RULE_CREATED = "alert_rule.created"
    ALERT_RULE_DELETED = "alert_rule.deleted"
    SERVICE_TOKEN_CREATED = "service_token.created"  # noqa: S105 - an action name
    SERVICE_TOKEN_REVOKED = "service_token.revoked"  # noqa: S105 - an action name
    # Beyond the contract's list, which says every operator write is recorded: the operator's
    # PUT /api/admin/accounts/{id}/roles, in that account's own log.
    ACCOUNT_ROLES_CHANGED = "account.roles_changed"
    # An account a restore kept deleted (docs/backup.md, "Reconciling Kafka"), the operator's.
    ACCOUNT_DELETED = "account.deleted"


class AuditActor(BaseModel):
    """Who acted, as the event carries it: a user (with the API key it used, if any) or the operator."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    user_id: UUID | None = None
    api_key_id: UUID | None = None
    operator: bool = False


class AuditTarget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str = Field(max_length=64, examples=["api_key"])
    id: str = Field(max_length=128)


# ---- audit.v1 ---------------------------------------------------------------------------------
class AuditRecorded(Event):
    """One audit entry. The keys service adds the acting user's e-mail when it stores it."""

    type: Literal["audit_entry"] = "audit_entry"
    actor: AuditActor
    action: AuditAction
    target: AuditTarget
    ip: str = Field(default="", max_length=64)
    user_agent: str = Field(default="", max_length=512)
    details: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuditContext:
    """The caller of a write and where it came from, handed by the route to the use case."""

    user_id: UUID | None = None
    api_key_id: UUID | None = None
    operator: bool = False
    ip: str = ""
    user_agent: str = ""

    def entry(
        self,
        account_id: UUID,
        time: datetime,
        action: AuditAction,
        target_type: str,
        target_id: UUID | str,
        **details: Any,
    ) -> AuditRecorded:
        return AuditRecorded(
            time=time,
            account_id=account_id,
            actor=AuditActor(user_id=self.user_id, api_key_id=self.api_key_id, operator=self.operator),
            action=action,
            target=AuditTarget(type=target_type, id=str(target_id)),
            ip=self.ip[:64],
            user_agent=self.user_agent[:512],
            details=details,
        )


OPERATOR_CLI = AuditContext(operator=True, user_agent="tollgate-cli")


# ---- GET /api/audit-log -------------------------------------------------------------------------
class UserActorOut(BaseModel):
    user_id: UUID
    email: str | None


class KeyActorOut(BaseModel):
    user_id: UUID
    email: str | None
    api_key_id: UUID


class OperatorActorOut(BaseModel):
    operator: Literal[True] = True


class AuditItem(BaseModel):
    time: AwareDatetime
    actor: KeyActorOut | UserActorOut | OperatorActorOut = Field(
        description="`{user_id, email}` for a console session, `{user_id, email, api_key_id}` for an API key "
        "(the key's creator), `{operator: true}` for the operator."
    )
    action: AuditAction
    target: AuditTarget
    ip: str
    user_agent: str
    details: dict[str, Any]


class AuditLog(BaseModel):
    items: list[AuditItem] = Field(description="Newest first.")
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page; null on the last page.")
