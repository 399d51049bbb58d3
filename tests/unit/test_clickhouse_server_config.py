"""The local ClickHouse server's users.xml: the rules of docs (clickhouse-server recipe) that keep
the host safe, checked on the rendered file (the integration tests check the server obeys it)."""

import re
import xml.etree.ElementTree as ET

from services.runtime.host.chserver import BACKUPS_DIR, CONST_SETTINGS, ServerSpec, config_xml, sha256_hex, users_xml

SPEC = ServerSpec(18123, 19000, "m", "ctl-pw", sha256_hex("app-pw"), sha256_hex("an-pw"), extra_database_patterns=("t_*",))


def _users() -> ET.Element:
    return ET.fromstring(users_xml(SPEC))


def test_listens_on_loopback_only_and_reads_the_users_file():
    config = ET.fromstring(config_xml(SPEC))
    assert [e.text for e in config.findall("listen_host")] == ["127.0.0.1"]
    assert config.findtext("users_config") == "users.xml"
    assert (config.findtext("http_port"), config.findtext("tcp_port")) == ("18123", "19000")
    # BACKUP/RESTORE ... File(...) (tollgate backup/restore) reach one folder under the data path, nothing else
    assert [e.text for e in config.findall("backups/allowed_path")] == [f"{BACKUPS_DIR}/"]
    assert config.find("backups/allowed_disk") is None


def test_every_profile_makes_the_host_path_settings_constant():
    profiles = _users().find("profiles")
    assert profiles is not None and len(profiles) == 2
    for profile in profiles:
        constraints = profile.find("constraints")
        assert constraints is not None
        assert {c.tag for c in constraints if c.find("const") is not None} == set(CONST_SETTINGS)


def test_grants_are_listed_never_all_and_table_engines_by_name():
    users = _users().find("users")
    grants = {u.tag: [q.text or "" for q in u.iter("query")] for u in users}
    assert grants["default"] == ["GRANT SYSTEM LISTEN ON *.*", "GRANT SELECT ON system.numbers"]
    assert users.find("default").findtext("password") in ("", None)
    app = grants["tollgate"]
    assert grants["ctl"][:3] == ["GRANT SELECT ON system.processes", "GRANT KILL QUERY ON *.*", "GRANT READ, WRITE ON FILE"]
    # ctl also backs up and restores (tollgate backup/restore): Tollgate's database and the copy a
    # restore sets aside, listed privileges, table engines by name
    ctl_backup = grants["ctl"][3:]
    assert all(not re.search(r"\bALL\b", g) and "DICTIONARY" not in g for g in ctl_backup)
    on = {g.rsplit(" ON ", 1)[1] for g in ctl_backup if "TABLE ENGINE" not in g}
    assert on == {"tollgate.*", "tollgate_replaced_*.*"}
    assert {g.removeprefix("GRANT TABLE ENGINE ON ") for g in ctl_backup if "TABLE ENGINE" in g} == {
        g.removeprefix("GRANT TABLE ENGINE ON ") for g in app if "TABLE ENGINE" in g
    }
    assert grants["analyst"] == ["GRANT SHOW TABLES, SHOW COLUMNS, SELECT ON tollgate.*"]
    assert all(not re.search(r"\bALL\b", g) and not g.endswith(" ON *.*") and "DICTIONARY" not in g for g in app)
    assert any(g.endswith(" ON tollgate.*") for g in app) and any(g.endswith(" ON t_*.*") for g in app)
    engines = [g.removeprefix("GRANT TABLE ENGINE ON ") for g in app if "TABLE ENGINE" in g]
    assert "*" not in engines and "File" not in engines and "URL" not in engines and "MergeTree" in engines
    for name in ("ctl", "tollgate", "analyst"):
        assert users.find(name).findtext("password_sha256_hex") not in ("", None)
    assert "app-pw" not in users_xml(SPEC) and "ctl-pw" not in users_xml(SPEC)


def test_the_analyst_profile_is_readonly_and_limited():
    analyst = _users().find("profiles/analyst")
    assert analyst.findtext("readonly") == "1"
    assert int(analyst.findtext("max_execution_time")) > 0 and int(analyst.findtext("max_memory_usage")) > 0


def test_the_analysts_queries_together_are_bounded_not_only_each_one():
    """Limits per query alone let N concurrent analyst queries hold N x 2 GB and starve Tollgate's
    own queries of the server's memory: the analyst's total and concurrency are capped too."""
    analyst = _users().find("profiles/analyst")
    per_query = int(analyst.findtext("max_memory_usage"))
    assert 0 < int(analyst.findtext("max_memory_usage_for_user") or 0) <= per_query
    assert 0 < int(analyst.findtext("max_concurrent_queries_for_user") or 0) <= 8
