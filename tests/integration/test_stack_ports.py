"""A part of the local stack that is not running must find its ports free: a process this stack did
not start (another checkout's stack, a leftover of a killed test run) is named as the cause, not
left to fail the start obscurely or to answer in the stack's place."""

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.host import stack
from tests.support.apps import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.parametrize("part", ["redis", "postgres", "clickhouse"])
def test_a_part_whose_port_another_process_holds_is_not_started(part: str, listening: int, tmp_path: Path) -> None:
    ports = {"redis": "redis_port", "postgres": "postgres_port", "clickhouse": "clickhouse_http_port"}
    cfg = stack.StackConfig(state_dir=tmp_path, clickhouse_tcp_port=free_port(), **{ports[part]: listening})
    start = {"redis": stack.redis_up, "postgres": stack.postgres_up, "clickhouse": stack.clickhouse_up}[part]
    with pytest.raises(SystemExit, match=rf"{part}: port {listening} on 127.0.0.1 is already in use"):
        start(cfg)
    assert not any(tmp_path.iterdir())  # nothing was started or created


def test_kafka_names_the_taken_controller_port(listening: int, tmp_path: Path) -> None:
    cfg = stack.StackConfig(state_dir=tmp_path, kafka_port=free_port(), controller_port=listening)
    with pytest.raises(SystemExit, match=rf"kafka node 1: port {listening} on 127.0.0.1"):
        stack.kafka_up(cfg)
