"""The ingress library every service mounts: errors, request ids, auth, limits, quota gate.

Services use only what is exported here; everything else in this package is the edge's own.
"""

from services.edge.calls import client_ip, forwarded_for, parse_networks
from services.edge.component import Component, Overrides, Runtime
from services.edge.edge import Edge
from services.edge.errors import ApiError, not_found
from services.edge.fast_routes import FastRoute
from services.edge.key_revocations import shared_revocations
from services.edge.openapi_security import accepts
from services.edge.principal import Principal
from services.edge.projections import AccountProjection
from services.edge.service_tokens import ServicePrincipal
from services.edge.token_revocations import share_token_revocation

__all__ = [
    "AccountProjection",
    "ApiError",
    "Component",
    "Edge",
    "FastRoute",
    "Overrides",
    "Principal",
    "Runtime",
    "ServicePrincipal",
    "accepts",
    "client_ip",
    "forwarded_for",
    "not_found",
    "parse_networks",
    "share_token_revocation",
    "shared_revocations",
]
