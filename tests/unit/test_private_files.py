"""Secret files are owner-only after every write, not only when first created (review: up.json and
demo-service-token.json kept a mode an older version or an umask had given them)."""

import stat
from pathlib import Path

from services.runtime.host.private_files import write_private


def test_a_file_readable_by_others_is_owner_only_after_a_write(tmp_path: Path) -> None:
    secret = tmp_path / "up.json"
    secret.write_text("old")
    secret.chmod(0o644)
    write_private(secret, '{"token": "st-..."}')
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == '{"token": "st-..."}'
    assert [p.name for p in tmp_path.iterdir()] == ["up.json"]  # no temporary file left


def test_a_new_file_is_owner_only(tmp_path: Path) -> None:
    write_private(tmp_path / "clickhouse-passwords.json", "{}")
    assert stat.S_IMODE((tmp_path / "clickhouse-passwords.json").stat().st_mode) == 0o600
