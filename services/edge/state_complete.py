"""Whether the owners of the edge's states have said that their topics are whole (state-complete.v1).

An edge cannot tell an empty topic from a new deployment. Each owner's state guard
(services/runtime/platform/state_guard.py) writes its record once its topics hold every state
of its Postgres, after republishing what Kafka lost; a wiped Kafka loses these records too. So
an edge is complete once it has read the record of every owner whose topics it projects, and
then its topics to their end as of that moment (an owner writes its record after its states, but
one consumer may read one partition ahead of another). Until then it is not ready: /readyz and
every credential answer 503, whether or not the process runs an owner itself.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable

from contracts.events import StateComplete
from contracts.topics import STATE_OWNERS

log = logging.getLogger(__name__)
RETRY_S = 1.0
SAY_WHY_AFTER_S = 10.0


def owners_of(topics: Iterable[str]) -> frozenset[str]:
    """The owners of these topics (names without the deployment prefix)."""
    names = set(topics)
    return frozenset(owner for owner, owned in STATE_OWNERS.items() if names & {t.name for t in owned})


class StateCompletion:
    """Fed state-complete.v1's records by the edge's follower; `complete` once every owner in
    `needed` has written one and the follower has read on to the end (`settle`)."""

    def __init__(self, needed: Iterable[str]) -> None:
        self.needed = frozenset(needed)
        self.complete = not self.needed
        self._seen: set[str] = set()
        self._all_seen = asyncio.Event()

    @property
    def missing(self) -> list[str]:
        return sorted(self.needed - self._seen)

    def apply(self, _key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return
        self._seen.add(StateComplete.model_validate(json.loads(value)).owner)
        if not self.missing:
            self._all_seen.set()

    async def settle(self, reach_end: Callable[[], Awaitable[None]]) -> None:
        """Wait for every owner's record, then for the projections to read to the topics' end."""
        try:
            await asyncio.wait_for(self._all_seen.wait(), SAY_WHY_AFTER_S)
        except TimeoutError:  # an operator reading /readyz's 503 learns what it waits for
            log.warning("not ready: no state-complete.v1 record yet from %s (not running, or rebuilding)", self.missing)
            await self._all_seen.wait()
        while True:
            try:
                await reach_end()
                break
            except Exception:  # Kafka away: the follower retries, and so does this
                log.warning("could not read the topics' end offsets; retrying", exc_info=True)
                await asyncio.sleep(RETRY_S)
        self.complete = True
        log.info("every owner's state is in Kafka (%s): the projections are whole", ", ".join(sorted(self.needed)))
