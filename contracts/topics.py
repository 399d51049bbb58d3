"""Kafka topics: names, partitions and configs. Versioned in the name; one schema per topic."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    # Not hashed (a dict cannot be): topics key mappings, e.g. Subscriber.batches' readings.
    config: dict[str, str] = field(default_factory=dict, hash=False)

    def prefixed(self, prefix: str) -> str:
        """The topic's name under a deployment prefix (tests isolate themselves this way)."""
        return f"{prefix}{self.name}"


COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": "3600000"}

# The metered facts are kept by size, never by time. Kafka's time retention counts from each
# record's own timestamp, and a backfill of history is stamped with its history's time (the usage
# rules judge an event against its record's timestamp): a partition holding only such records
# would be deleted at the broker's next retention check, perhaps before a lagging consumer read
# it, and a consumer reset to the earliest offset would skip it without a word.
METERED = {"retention.ms": "-1", "retention.bytes": str(8 * 1024**3)}  # per partition
USAGE = Topic("usage.v1", partitions=6, config=METERED)
CALLS = Topic("calls.v1", partitions=6, config=METERED)
KEYS = Topic("keys.v1", partitions=3, config=COMPACTED)
ACCOUNTS = Topic("accounts.v1", partitions=3, config=COMPACTED)
QUOTA = Topic("quota.v1", partitions=6, config=COMPACTED)
QUOTA_THRESHOLDS = Topic("quota-thresholds.v1", partitions=6)
# Kept forever: every edge rebuilds each account's plan (its rate limits) by replaying it from
# the start, and the topic holds a few events per account per month. (Compaction cannot serve:
# one account's plan_changed and package_purchased events share the key.)
BILLING = Topic("billing.v1", partitions=3, config={"retention.ms": "-1"})

# (v2) The edge projects these like keys.v1. A revoked session only needs remembering until it
# would have expired anyway (SESSION_TTL_SECONDS, 8 h by default, which the settings bound by this
# retention: an edge restarted later must still read every logout of a session alive): kept 7
# days, then deleted.
SESSIONS_RETENTION_S = 7 * 24 * 3600
SERVICE_TOKENS = Topic("service-tokens.v1", partitions=1, config=COMPACTED)
USERS = Topic("users.v1", partitions=3, config=COMPACTED)
SESSIONS = Topic("sessions.v1", partitions=3, config={"retention.ms": str(SESSIONS_RETENTION_S * 1000)})
# (v2) One audit entry per event (contracts/audit.py), from every service's outbox to the keys
# service's table; keyed by account, so one account's entries stay in order.
AUDIT = Topic("audit.v1", partitions=3)

# The owners of the edge's states, and the topics each owns (services/runtime/platform/state_guard.py).
STATE_OWNERS: dict[str, tuple[Topic, ...]] = {
    "keys": (ACCOUNTS, USERS, KEYS, SERVICE_TOKENS, SESSIONS),
    "billing": (BILLING,),
    "quota": (QUOTA,),
}
# One record per owner (key = its name, contracts/events.py StateComplete): its check found every
# state of its Postgres in its topics. A wiped Kafka loses these too, so an edge that reads them
# knows the topics are whole again, whichever process rebuilt them.
STATE_COMPLETE = Topic("state-complete.v1", partitions=1, config=COMPACTED)

ALL_TOPICS: tuple[Topic, ...] = (
    USAGE,
    CALLS,
    KEYS,
    ACCOUNTS,
    QUOTA,
    QUOTA_THRESHOLDS,
    BILLING,
    SERVICE_TOKENS,
    USERS,
    SESSIONS,
    AUDIT,
    STATE_COMPLETE,
)


def dead_letter(topic: Topic) -> Topic:
    """Where a consumer of `topic` puts messages it cannot parse, with the error in headers."""
    return Topic(f"{topic.name}.dlq", partitions=1)


ALL_DEAD_LETTER_TOPICS: tuple[Topic, ...] = tuple(dead_letter(t) for t in ALL_TOPICS)
