"""(v4) A key's own restrictions, as the edge judges them on every call of the key (pure, no I/O).

keys.v1 carries the rules as text (contracts/key_limits.py); `KeyGate.of` parses them once per
key state, so a call pays a few comparisons, and a key without rules pays nothing (no gate).
Where the edge decides (its own routes, verify, authorize), after status and expiry, in this
order: the caller's address, the route, the model (API.md, "Per-key limits and restrictions").
"""

import ipaddress
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote

from contracts.errors import ErrorCode
from contracts.key_limits import KeyRules, model_allowed
from contracts.rate_limit import RateLimit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def narrower(plan: RateLimit, own: RateLimit | None) -> RateLimit:
    """The key's rate limit as enforced: each number the smaller of its own and its plan's (a
    key's own limit was at most the plan's when set, but the plan may have shrunk since)."""
    if own is None:
        return plan
    return RateLimit(
        per_second=min(plan.per_second, own.per_second),
        burst=min(plan.burst, own.burst),
        per_minute=min(plan.per_minute, own.per_minute),
    )


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    path: str  # the whole path, or (prefix) what a matching path starts with
    prefix: bool

    def matches(self, method: str, path: str) -> bool:
        if method != self.method:
            return False
        return path.startswith(self.path) if self.prefix else path == self.path


@dataclass(frozen=True, slots=True)
class KeyGate:
    """A key's restrictions, parsed. An empty tuple allows everything (the contract's empty list)."""

    networks: tuple[Network, ...]
    routes: tuple[_Route, ...]
    models: tuple[str, ...]  # the allowed models' patterns: `provider/model` or `provider/*`
    rate_limit: RateLimit | None

    @classmethod
    def of(cls, rules: KeyRules) -> "KeyGate | None":
        """The gate of `rules`; None when they restrict nothing the edge judges per call."""
        if not (rules.allowed_ips or rules.allowed_routes or rules.allowed_models or rules.rate_limit):
            return None
        routes = []
        for pattern in rules.allowed_routes:
            method, _, path = pattern.partition(" ")
            prefix = path.endswith("*")
            routes.append(_Route(method, path[:-1] if prefix else path, prefix))
        return cls(
            networks=tuple(ipaddress.ip_network(cidr) for cidr in rules.allowed_ips),
            routes=tuple(routes),
            models=tuple(rules.allowed_models),
            rate_limit=rules.rate_limit,
        )

    def refusal(self, ip: str, method: str, path: str, model: str | None, *, judges_model: bool) -> tuple[ErrorCode, str] | None:
        """The 403's code and message for the first rule this call breaks (address, route, model), or None.
        `judges_model`: the caller says which model the call uses (verify, authorize); a key with
        allowed models is then refused a call that names none (fail closed: an unnamed model
        might be any). Tollgate's own routes call no model and are not judged by it."""
        if self.networks and not self._allows_ip(ip):
            return ErrorCode.IP_NOT_ALLOWED, "This API key may not be used from this address."
        if self.routes and not self._allows_route(method, path):
            return ErrorCode.ROUTE_NOT_ALLOWED, f"This API key may not call {method} {path}."
        if judges_model and self.models and not (model and model_allowed(self.models, model)):
            named = f"the model {model}" if model else "a call that names no model"
            return ErrorCode.MODEL_NOT_ALLOWED, f"This API key may not use {named}."
        return None

    def _allows_ip(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False  # no address to judge: not one of the allowed ones
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:198.51.100.7 is 198.51.100.7 (a dual-stack socket)
        return any(address in network for network in self.networks)

    def _allows_route(self, method: str, path: str) -> bool:
        if _leaves_its_prefix(path):
            return False
        return any(route.matches(method, path) for route in self.routes)


def _leaves_its_prefix(path: str) -> bool:
    """`/v1/../admin` starts with `/v1/` but is not under it: a path with a dot segment never
    matches, whatever the upstream makes of it. So the segments are read as the most lenient
    upstream reads them: percent-decoded as often as it decodes (`%2e`, `%252e` for one that
    decodes twice; `%2f` a separator), `\\` a separator (IIS), a segment's `;parameters` dropped
    (Tomcat, Jetty: `..;/` is `../`), cut at a NUL (C), compatibility characters folded (NFKC:
    the fullwidth full stop U+FF0E is `.`, U+2025 is `..`), and dots or spaces only, as Windows trims
    them (`...`, `.. `), a dot segment too. Decoding and folding are applied in turn until neither
    changes anything: the fullwidth percent sign, two and e (U+FF05 U+FF12 U+FF45) fold to `%2e`,
    which one more decoding makes `.`."""
    decoded = path
    for _ in range(_MAX_DECODINGS):
        once = unicodedata.normalize("NFKC", unquote(decoded))
        if once == decoded:
            break
        decoded = once
    else:
        return True  # still encoded after that many decodings: no upstream reads it as meant
    decoded = decoded.replace("\\", "/")
    for segment in decoded.split("/"):
        name = segment.partition(";")[0].partition("\x00")[0]
        if "." in name and not name.strip(". "):
            return True
    return False


_MAX_DECODINGS = 4  # more layers of percent-encoding than any chain of upstreams decodes
