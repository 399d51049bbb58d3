"""Which webhook targets may be reached, free of I/O: the URL's form and the address rule.

Webhooks must not become a way into the platform's own network. A URL is http(s) with a host;
the addresses its host resolves to must all be global unicast ones. Hosts are never parsed as
numbers here: "2130706433" or "0177.0.0.1" go to the resolver like any name, and the address
it answers (127.0.0.1) is what this rule judges.
"""

import ipaddress
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Ranges Python's `is_global` does not exclude but no webhook receiver lives in.
_ALSO_REFUSED = (
    ipaddress.ip_network("100.64.0.0/10"),  # carrier-grade NAT (shared address space)
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64
)


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class Target:
    """A webhook URL split into what a sender needs: where to connect and what to ask for."""

    scheme: str
    host: str  # a name, or an address without brackets
    port: int
    url: SplitResult

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def url_for(self, address: IPAddress) -> str:
        """The same URL with the host replaced by one resolved address (what is connected to)."""
        host = f"[{address}]" if address.version == 6 else str(address)
        netloc = f"{host}:{self.port}"
        return self.url._replace(netloc=netloc, fragment="").geturl()


class TargetError(ValueError):
    """The URL is not one a webhook may have (not http(s), no host, credentials in it...)."""


def parse_target(url: str) -> Target:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"The URL is not valid: {exc}.") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TargetError("A webhook URL must be http or https.")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetError("A webhook URL needs a host.")
    # The name as DNS and HTTP carry it: an internationalised one in its `xn--` form (the Host
    # header and TLS SNI are ASCII; sent as given, the request could not even be written). The
    # resolver encodes it so too, and raises for a label it cannot (empty, or over 63 characters):
    # such a name is refused here, as a URL, rather than by an exception out of the resolver.
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise TargetError(f"The URL's host is not a valid domain name: {exc}.") from exc
    if parts.username is not None or parts.password is not None:
        raise TargetError("A webhook URL must not carry credentials; the signature authenticates the sender.")
    return Target(scheme, host, port or (443 if scheme == "https" else 80), parts)


def _nat64(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a well-known-prefix NAT64 address stands for (a gateway would reach it)."""
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: IPAddress) -> str | None:
    """Why a webhook may not connect to `address`, or None when it may (a global unicast one)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or _nat64(address)
        if embedded is not None:
            inner = refusal(embedded)
            return None if inner is None else f"{address} embeds {embedded}: {inner}"
        if address.teredo is not None:
            return f"{address} is a Teredo address"
    for name in ("loopback", "unspecified", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{name}"):
            return f"{address} is a {name.replace('_', '-')} address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return f"{address} is a site-local address"
    if any(address in network for network in _ALSO_REFUSED):
        return f"{address} is not a global address"
    if not address.is_global:
        return f"{address} is not a global address"
    return None


def refusal_of_all(addresses: list[IPAddress]) -> str | None:
    """A name is refused when any of its addresses is: the connection could land on that one."""
    for address in addresses:
        reason = refusal(address)
        if reason is not None:
            return reason
    return None
