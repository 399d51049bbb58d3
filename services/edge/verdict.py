"""(v3) A call that another service received, and the edge's verdict on it (verify, authorize).

The call is described to the edge as the ASGI scope of the request the service received, so the
edge decides it with the very code that guards its own routes (`Edge.decide`)."""

from dataclasses import dataclass
from typing import Any

from contracts.common import Permission, Resource, Tier
from services.edge.errors import ApiError
from services.edge.principal import Principal


@dataclass(frozen=True, slots=True)
class _Template:
    """What routing would put in the scope: the route template (the call's path, the metrics' label)."""

    path: str


@dataclass(frozen=True, slots=True)
class ServiceCall:
    """A customer's call to a platform service, as that service (or its ingress) describes it."""

    key: str  # the `sk-` key it carried ("" if none)
    method: str
    path: str  # the service's route template
    ip: str  # the customer's address
    user_agent: str
    service: str  # the verifying service token's name, for calls.v1 and the activity log
    resource: Resource | None = None
    cost: int = 0
    permission: Permission | None = None
    model: str | None = None  # (v4) `provider/model` the service will call (allowed_models)

    def scope(self) -> dict[str, Any]:
        return {
            "type": "http",
            "method": self.method,
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "headers": [(b"user-agent", self.user_agent.encode("latin-1", "replace"))],
            "client": (self.ip, 0),
            "route": _Template(self.path),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    principal: Principal | None  # the key's caller, once the key authenticated
    refusal: ApiError | None  # None: admitted (and metered)
    headers: dict[str, str]  # what a protected route would answer with: X-RateLimit-*, Retry-After...
    plan: Tier | None

    @property
    def status(self) -> int:
        return 200 if self.refusal is None else self.refusal.status
