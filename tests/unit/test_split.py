"""The split shape's plan and its ingress: deploy/ingress.conf with local upstreams, checked by nginx."""

import re
import subprocess
from pathlib import Path

import pytest

from services.runtime.host import split
from services.runtime.host.app import SERVICES


def test_every_service_has_replicas_in_the_apps_order():
    assert split.SERVICES == SERVICES
    assert all(n >= 1 for n in split.REPLICAS.values())


def test_replicas_get_consecutive_ports(tmp_path: Path):
    shape = split.shape(tmp_path, 8090, 8091)
    assert [r.port for r in shape.replicas] == list(range(8091, 8091 + sum(split.REPLICAS.values())))
    assert [r.name for r in shape.of("geo")] == ["geo-1", "geo-2"]


def test_the_ingress_is_the_compose_one_with_local_upstreams(tmp_path: Path):
    shape = split.shape(tmp_path, 8090, 8091)
    conf = split.render_ingress(shape)
    compose_conf = split.INGRESS_CONF.read_text()
    # the same routes, byte for byte
    assert re.findall(r"location .*", conf) == re.findall(r"location .*", compose_conf)
    assert "listen 127.0.0.1:8090;" in conf
    geo = re.search(r"upstream geo\s*\{([^}]*)\}", conf)
    assert geo is not None
    assert re.findall(r"server 127\.0\.0\.1:(\d+);", geo.group(1)) == [str(r.port) for r in shape.of("geo")]
    assert not re.search(r"^\s*upstream.*server \w+:8080;", conf, re.M)


@pytest.mark.skipif(split.shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="no nginx")
def test_nginx_accepts_the_rendered_ingress(tmp_path: Path):
    shape = split.shape(tmp_path, 8090, 8091)
    (tmp_path / "logs").mkdir()
    (tmp_path / "nginx-temp").mkdir()
    conf = tmp_path / "ingress.conf"
    conf.write_text(split.render_ingress(shape))
    check = subprocess.run(split._nginx_cmd(shape, conf, "-t", "-q"), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
