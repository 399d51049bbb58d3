"""moved_leaders: an offset lookup that meets a moved leader refreshes the consumer's metadata."""

import inspect
from dataclasses import dataclass, field
from typing import Any

from aiokafka.consumer.fetcher import Fetcher
from aiokafka.errors import NotLeaderForPartitionError, RequestTimedOutError

from services.runtime.platform.moved_leaders import follow_moved_leaders


@dataclass
class FakeClient:
    refreshes: int = 0

    def force_metadata_update(self) -> None:
        self.refreshes += 1


@dataclass
class FakeFetcher:
    answer: Any  # what the broker answers: offsets, or an error to raise
    _client: FakeClient = field(default_factory=FakeClient)

    async def _proc_offset_request(self, node_id: int, topic_data: Any) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@dataclass
class FakeConsumer:
    _fetcher: FakeFetcher


async def ask(answer: Any) -> tuple[FakeFetcher, Any]:
    fetcher = FakeFetcher(answer)
    follow_moved_leaders(FakeConsumer(fetcher))  # type: ignore[arg-type]
    try:
        return fetcher, await fetcher._proc_offset_request(3, {"t": [(0, -2)]})
    except Exception as exc:
        return fetcher, exc


async def test_a_moved_leader_refreshes_the_metadata_and_the_fetcher_still_sees_its_error() -> None:
    fetcher, outcome = await ask(NotLeaderForPartitionError())
    assert isinstance(outcome, NotLeaderForPartitionError)  # the fetcher logs it and asks again after its backoff
    assert fetcher._client.refreshes == 1


async def test_an_answer_or_another_error_refreshes_nothing() -> None:
    fetcher, outcome = await ask({"t-0": (0, None)})
    assert outcome == {"t-0": (0, None)} and fetcher._client.refreshes == 0
    fetcher, outcome = await ask(RequestTimedOutError())  # says nothing of where the leader is
    assert isinstance(outcome, RequestTimedOutError)
    assert fetcher._client.refreshes == 0


def test_aiokafkas_fetcher_still_resets_positions_through_the_wrapped_request() -> None:
    assert "self._proc_offset_request(node_id, topic_data)" in inspect.getsource(Fetcher._update_fetch_positions)
    assert list(inspect.signature(Fetcher._proc_offset_request).parameters) == ["self", "node_id", "topic_data"]
