"""`tollgate restore` checks a backup against its manifest before it starts or writes anything
(services/runtime/host/backup.py): an interrupted, incomplete, damaged or foreign backup is
refused with what is wrong. Files in a temporary folder only."""

import json
from pathlib import Path

import pytest

from services.runtime.host import backup, stack


def _backup(folder: Path, **manifest: object) -> Path:
    (folder / "clickhouse").mkdir(parents=True)
    (folder / "postgres.dump").write_bytes(b"PGDMP...")
    (folder / "clickhouse" / ".backup").write_text("<config/>")
    files = {name: backup._sha256(folder / name) for name in ("postgres.dump", "clickhouse/.backup")}
    (folder / backup.MANIFEST).write_text(json.dumps({"format": backup.FORMAT, "files": files, **manifest}))
    return folder


def test_a_folder_without_a_manifest_is_not_a_backup(tmp_path: Path) -> None:
    with pytest.raises(backup.BackupError, match="not a Tollgate backup"):
        backup._checked_manifest(tmp_path)


def test_another_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(backup.BackupError, match="format 99"):
        backup._checked_manifest(_backup(tmp_path, format=99))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    (_backup(tmp_path) / "clickhouse" / ".backup").unlink()
    with pytest.raises(backup.BackupError, match=r"incomplete: clickhouse/\.backup is missing"):
        backup._checked_manifest(tmp_path)


def test_a_changed_file_is_refused(tmp_path: Path) -> None:
    (_backup(tmp_path) / "postgres.dump").write_bytes(b"PGDMP.!.")
    with pytest.raises(backup.BackupError, match=r"damaged: postgres\.dump"):
        backup._checked_manifest(tmp_path)


def test_a_manifest_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / backup.MANIFEST).write_text("{")
    with pytest.raises(backup.BackupError, match="not valid JSON"):
        backup._checked_manifest(tmp_path)


def test_backing_up_into_a_folder_that_holds_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kept").write_text("x")
    cfg = stack.StackConfig(state_dir=tmp_path / "state")
    with pytest.raises(backup.BackupError, match="not an empty folder"):
        backup.backup(cfg, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
