"""docker-compose's services believe X-Forwarded-For only from the ingress itself. They trusted
every private range (10/8, 172.16/12, 192.168/16): a client whose own address is private (the
Docker bridge's gateway, as every client looks through docker-proxy or rootless Docker; a
VPN; a load balancer in a VPC) was skipped as "a proxy", and the address it wrote in its own
X-Forwarded-For was taken as its address: IP allowlists of keys, login and sign-up throttles
and the activity log's `ip` all chose by the client."""

import ipaddress
import json

import pytest

from services.edge.calls import client_ip
from services.runtime.host.app import SERVICES
from services.runtime.platform.settings import Settings
from tests.unit.test_compose import _compose

SPOOFED = "6.6.6.6"


def _ingress_address() -> str:
    """The ingress's fixed address on the compose network (without one, an address Docker could
    give it on a bridge network)."""
    compose = _compose()
    if "networks" not in compose["services"]["ingress"]:
        return "172.18.0.5"
    (subnet,) = (c["subnet"] for c in compose["networks"]["default"]["ipam"]["config"])
    address = compose["services"]["ingress"]["networks"]["default"]["ipv4_address"]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(subnet)
    return address


@pytest.mark.parametrize("client", ["172.31.240.1", "172.17.0.1", "10.0.0.5", "192.168.1.20", "203.0.113.9"])
def test_a_client_cannot_choose_its_address_through_the_compose_ingress(client: str) -> None:
    ingress = _ingress_address()
    for name in SERVICES:
        env = _compose()["services"][name]["environment"]
        trusted = Settings(trusted_proxies=json.loads(env["TRUSTED_PROXIES"])).trusted_proxies
        networks = tuple(ipaddress.ip_network(t) for t in trusted)
        # nginx appends the peer it saw to what the client sent
        seen = client_ip(ingress, f"{SPOOFED}, {client}", networks)
        assert seen == client, f"{name}: a client at {client} passed itself off as {seen}"
