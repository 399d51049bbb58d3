"""`tollgate republish`: every owner re-emits the current state of its topics from its Postgres,
each through its own use case (docs/architecture.md, "Kafka is transport")."""

from collections.abc import Awaitable, Callable, Collection, Sequence

from contracts.topics import ACCOUNTS, BILLING, KEYS, QUOTA, SERVICE_TOKENS, SESSIONS, USERS
from services.billing import operator_cli as billing
from services.keys import operator_cli as keys
from services.quota import operator_cli as quota
from services.runtime.platform.settings import Settings

Owner = Callable[[Settings, Collection[str]], Awaitable[dict[str, int]]]

# topic -> the owner that re-emits it, in the order they run (keys first: accounts before plans)
OWNERS: dict[str, Owner] = {
    ACCOUNTS.name: keys.republish,
    USERS.name: keys.republish,
    KEYS.name: keys.republish,
    SERVICE_TOKENS.name: keys.republish,
    SESSIONS.name: keys.republish,
    BILLING.name: billing.republish,
    QUOTA.name: quota.republish,
}


def unknown_topics(topics: Sequence[str]) -> list[str]:
    return [t for t in topics if t not in OWNERS]


async def republish(settings: Settings, topics: Sequence[str] = ()) -> dict[str, int]:
    """Re-emit `topics` (all of OWNERS when empty); how many states each got."""
    wanted = list(topics) or list(OWNERS)
    done: dict[str, int] = {}
    owners: list[Owner] = []
    for topic in OWNERS:  # each owner once, with all of its topics asked for
        owner = OWNERS[topic]
        if topic in wanted and owner not in owners:
            owners.append(owner)
    for owner in owners:
        mine = [t for t in OWNERS if OWNERS[t] is owner and t in wanted]
        done.update(await owner(settings, mine))
    return done
