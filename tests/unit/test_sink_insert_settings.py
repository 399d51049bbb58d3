"""The settings of the sink's INSERT: a small batch (a trickle's few events) is written by one
thread, a large one with the engine's default; both read the events' JSON alike."""

from services.metering import sink_tables
from services.metering.sink_tables import JSON_INPUT, ONE_THREAD_BELOW, insert_settings


def test_a_small_batch_is_written_by_one_thread() -> None:
    assert insert_settings(1) == {**JSON_INPUT, "max_threads": 1}
    assert insert_settings(ONE_THREAD_BELOW - 1)["max_threads"] == 1


def test_a_large_batch_keeps_the_engines_threads() -> None:
    assert insert_settings(ONE_THREAD_BELOW) == JSON_INPUT
    assert "max_threads" not in insert_settings(50_000)


def test_the_json_settings_are_not_changed_by_asking() -> None:
    insert_settings(1)["max_threads"] = 4
    assert "max_threads" not in sink_tables.JSON_INPUT
