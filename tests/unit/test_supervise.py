"""The supervisor of `serve --workers N`: a process that ends is started again; a first process
that cannot start stops them all (a bad setting); a replacement that cannot start (a dependency
down for a while) is tried again after a pause, while the others keep serving.

Real spawned processes: each job counts its runs in a folder and behaves as its run number says.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

from services.runtime.host.workers import STARTUP_FAILURE

REPO = Path(__file__).resolve().parents[2]


def run_number(folder: str) -> int:
    runs = Path(folder)
    n = len(list(runs.glob("run-*"))) + 1
    (runs / f"run-{n}").touch()
    return n


def serves_then_dies_then_cannot_start_twice(folder: str) -> None:
    n = run_number(folder)
    if n == 1:
        time.sleep(0.3)
        sys.exit(1)  # it served, then crashed
    if n in (2, 3):
        sys.exit(STARTUP_FAILURE)  # its dependency is still down
    (Path(folder) / "up").touch()
    time.sleep(60)


def never_starts(folder: str) -> None:
    run_number(folder)
    sys.exit(STARTUP_FAILURE)


def supervisor(job: str, folder: Path) -> subprocess.Popen[bytes]:
    code = (
        "import sys; from services.runtime.host.workers import supervise; "
        f"from tests.unit.test_supervise import {job}; "
        f"sys.exit(supervise([({job}, ({str(folder)!r},))]))"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO)


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} not there after {timeout} s"
        time.sleep(0.05)


def test_a_replacement_that_cannot_start_is_tried_again_after_a_pause(tmp_path: Path) -> None:
    proc = supervisor("serves_then_dies_then_cannot_start_twice", tmp_path)
    try:
        wait_for(tmp_path / "up", timeout=30)  # runs 2 and 3 failed: paused 1 s, then 2 s
        assert proc.poll() is None
        assert len(list(tmp_path.glob("run-*"))) == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_first_process_that_cannot_start_stops_the_supervisor(tmp_path: Path) -> None:
    proc = supervisor("never_starts", tmp_path)
    assert proc.wait(30) == STARTUP_FAILURE
    assert len(list(tmp_path.glob("run-*"))) == 1
