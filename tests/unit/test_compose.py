"""docker-compose.yml cannot run here (no Docker engine); keep it correct by reading it."""

import json
import re
from pathlib import Path

import yaml

from services.runtime.host.app import SERVICES
from services.runtime.platform.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_every_service_runs_as_its_own_target_with_the_stack_settings():
    compose = _compose()["services"]
    assert {"kafka", "postgres", "clickhouse", "redis", "ingress"} <= compose.keys()
    settings_names = {name.upper() for name in Settings.model_fields}
    for name in SERVICES:
        service = compose[name]
        assert service["command"] == ["--target", name]
        env = service["environment"]
        assert set(env) <= settings_names, f"{name} sets unknown settings {set(env) - settings_names}"
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert env["CLICKHOUSE_DSN"].startswith("http://")
        assert env["REDIS_URL"] == "redis://redis:6379/0"  # rate limits and api_calls admissions shared by the replicas
        assert set(service["depends_on"]) == {"kafka", "postgres", "clickhouse", "redis"}
        trusted = Settings(trusted_proxies=json.loads(env["TRUSTED_PROXIES"])).trusted_proxies
        ingress = _compose()["services"]["ingress"]["networks"]["default"]["ipv4_address"]
        assert trusted == [f"{ingress}/32"]  # the ingress alone is believed, so the client IP is real


def test_the_ingress_routes_only_to_services_that_exist():
    conf = (REPO / "deploy" / "ingress.conf").read_text()
    proxied = set(re.findall(r"proxy_pass http://(\w+);", conf))
    servers = dict(re.findall(r"upstream (\w+)\s*\{\s*server (\w+):8080;", conf))
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in conf
    assert set(servers.values()) == set(SERVICES)  # every upstream is a service's replicas, every service has one
    assert proxied == set(servers)  # (edge: verify and authorize, served by any replica that mounts the edge)
    ingress = _compose()["services"]["ingress"]
    assert "./deploy/ingress.conf:/etc/nginx/nginx.conf:ro" in ingress["volumes"]


def test_the_image_entrypoint_is_the_tollgate_command():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["tollgate", "serve"' in dockerfile


def test_the_monitoring_profile_provisions_the_rules_and_the_dashboard():
    compose = _compose()["services"]
    prometheus, grafana = compose["prometheus"], compose["grafana"]
    assert prometheus["profiles"] == ["monitoring"] and grafana["profiles"] == ["monitoring"]
    mounts = {volume.split(":")[0]: volume.split(":")[1] for volume in prometheus["volumes"] + grafana["volumes"]}
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == [mounts["./deploy/prometheus/alerts.yml"]]
    assert mounts["./deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    (job,) = config["scrape_configs"]
    assert set(job["static_configs"][0]["targets"]) == {f"{name}:8080" for name in SERVICES}  # every service's /metrics
    assert job["job_name"] == "tollgate"  # what TollgateDown watches
    provisioning = REPO / "deploy" / "grafana" / "provisioning"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tollgate.yml").read_text())["providers"]
    assert mounts["./deploy/grafana/tollgate.json"] == f"{provider['options']['path']}/tollgate.json"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads((REPO / "deploy" / "grafana" / "tollgate.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
