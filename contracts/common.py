"""Enumerations and small value types used across events and API payloads."""

from enum import StrEnum


class Resource(StrEnum):
    AI_TOKENS = "ai_tokens"
    API_CALLS = "api_calls"
    GEO_PROJECTS = "geo_projects"
    STORAGE_BYTES = "storage_bytes"
    AI_CONVERSATIONS = "ai_conversations"
    CONTENT_PUBLISHES = "content_publishes"


# Stock resources are levels (they go down too) and carry over between periods;
# the others are monthly flows that start again at zero every period.
STOCK_RESOURCES: frozenset[Resource] = frozenset({Resource.GEO_PROJECTS, Resource.STORAGE_BYTES})


class Tier(StrEnum):
    FREE = "free"
    BASIC = "basic"
    PROFESSIONAL = "professional"
    ENTERPRISE = "enterprise"


class UserType(StrEnum):
    INDIVIDUAL = "individual"
    ENTERPRISE = "enterprise"


class Role(StrEnum):
    """(v2) A user's role in its account (API.md, "Members"): one per user."""

    OWNER = "owner"
    DEVELOPER = "developer"
    BILLING = "billing"
    VIEWER = "viewer"


class KeyStatus(StrEnum):
    ENABLED = "enabled"
    DISABLED = "disabled"


class ServiceScope(StrEnum):
    """(v2) What a service token (`st-...`) may do; never a user's permission."""

    USAGE_WRITE = "usage:write"
    KEYS_VERIFY = "keys:verify"  # (v3) admit a customer's key through the edge: verify, authorize


class Permission(StrEnum):
    KEYS_WRITE = "keys:write"
    USAGE_READ = "usage:read"
    QUOTA_READ = "quota:read"
    ALERTS_READ = "alerts:read"
    ALERTS_WRITE = "alerts:write"
    BILLING_READ = "billing:read"
    BILLING_WRITE = "billing:write"
    ACTIVITY_READ = "activity:read"
    PROJECTS_READ = "projects:read"
    PROJECTS_WRITE = "projects:write"
    MEMBERS_WRITE = "members:write"  # (v2)
    AUDIT_READ = "audit:read"  # (v2)


_READS = frozenset(p for p in Permission if p.value.endswith(":read"))
# API.md, "Members (v2)", exactly. A developer's keys:write covers only the keys it created
# (the keys service checks that); an owner's covers every key of the account.
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.OWNER: frozenset(Permission),
    Role.DEVELOPER: frozenset(
        {
            Permission.KEYS_WRITE,
            Permission.USAGE_READ,
            Permission.QUOTA_READ,
            Permission.ALERTS_READ,
            Permission.ALERTS_WRITE,
            Permission.ACTIVITY_READ,
            Permission.PROJECTS_READ,
            Permission.PROJECTS_WRITE,
            Permission.BILLING_READ,
        }
    ),
    Role.BILLING: _READS | {Permission.BILLING_WRITE},
    Role.VIEWER: _READS - {Permission.AUDIT_READ},
}


def permissions_of(roles: frozenset[Role] | set[Role] | list[Role]) -> frozenset[Permission]:
    granted: set[Permission] = set()
    for role in roles:
        granted |= ROLE_PERMISSIONS[role]
    return frozenset(granted)


class AlertMetric(StrEnum):
    TOTAL_TOKENS = "total_tokens"
    API_CALLS = "api_calls"
    STORAGE = "storage"


METRIC_RESOURCE: dict[AlertMetric, Resource] = {
    AlertMetric.TOTAL_TOKENS: Resource.AI_TOKENS,
    AlertMetric.API_CALLS: Resource.API_CALLS,
    AlertMetric.STORAGE: Resource.STORAGE_BYTES,
}
