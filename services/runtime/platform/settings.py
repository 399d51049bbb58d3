"""Connection and behaviour settings, read once from environment variables."""

from functools import cache
from zoneinfo import ZoneInfo

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.topics import SESSIONS_RETENTION_S

# SESSION_SECRET values anyone can read (this file's default, docker-compose's old fallback): with
# one of them anyone signs a console session of any account. `serve` refuses them off loopback.
DEV_SESSION_SECRET = "dev-only-session-secret-change-me"  # noqa: S105 (public on purpose: refused off loopback)
PUBLIC_SESSION_SECRETS = frozenset({DEV_SESSION_SECRET, "change-me-in-production"})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", frozen=True)

    kafka_bootstrap_servers: str = "127.0.0.1:19092"
    # Of the topics Tollgate creates: 1 on the one-node stack, 3 on a cluster (`stack up --kafka-nodes 3`
    # sets it); above 1, topics also get min.insync.replicas = a majority.
    kafka_replication_factor: int = Field(default=1, ge=1)
    database_url: str = "postgresql://tollgate@127.0.0.1:15432/tollgate"
    # A ClickHouse server over HTTP; `tollgate up` sets it to the local stack's (with its password).
    clickhouse_dsn: str = "http://tollgate@127.0.0.1:18123"
    clickhouse_database: str = "tollgate"
    # Prepended to every topic and consumer group; tests isolate themselves with it.
    topic_prefix: str = ""
    platform_timezone: str = "UTC"
    # Signs console sessions; every replica of every service needs the same value. The default is
    # for this machine only: `serve` off loopback refuses it (PUBLIC_SESSION_SECRETS).
    session_secret: SecretStr = SecretStr(DEV_SESSION_SECRET)
    # Also accepted, never used to sign: while SESSION_SECRET is rotated, the old (or the coming)
    # secret, so that no session ends when a replica's secret changes (docs/backup.md).
    session_secret_previous: SecretStr | None = None
    # At most sessions.v1's retention (7 days): a restarted edge reads only that far back, and must
    # still know the logout of every session alive (validated below).
    session_ttl_seconds: int = Field(default=8 * 3600, gt=0)
    # Protects the operator endpoints (/api/admin/...); unset disables them.
    admin_token: SecretStr | None = None
    redis_url: str | None = None
    # Client IPs are taken from X-Forwarded-For only when the peer is one of these (CIDRs).
    trusted_proxies: list[str] = Field(default_factory=list)
    console_url: str = "http://127.0.0.1:8080/console"
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 2525
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_starttls: bool = False
    mail_from: str = "Tollgate <alerts@tollgate.local>"
    sms_gateway_url: str | None = None
    sms_gateway_token: SecretStr | None = None
    # Lets alert webhooks reach loopback, private and link-local addresses (tests, closed networks).
    webhook_allow_private_targets: bool = False
    # Webhook retries: the first delay, doubling up to the cap, for the window from the firing on.
    webhook_retry_initial_seconds: float = Field(default=30.0, gt=0)
    webhook_retry_max_seconds: float = Field(default=3600.0, gt=0)
    webhook_retry_window_seconds: float = Field(default=24 * 3600.0, ge=0)
    # Alert messages that leave the platform (every channel but in-site: e-mail and SMS cost money
    # per message and a sender's reputation; webhooks, Slack and Teams hit outside hosts) per account
    # and calendar day of the platform time zone; beyond it a delivery is logged as not sent.
    alerts_outside_messages_per_day: int = Field(default=50, ge=0)
    # Alert rules one account may hold: bounds what one crossing fans out to.
    alerts_max_rules_per_account: int = Field(default=50, gt=0)
    log_level: str = "INFO"
    # A TOML price table that replaces the one shipped with metering (services/metering/data/prices.toml).
    metering_prices_file: str | None = None
    # Sent outbox rows are kept this long (what was published when: debugging, audit), then deleted.
    outbox_retention_seconds: int = Field(default=24 * 3600, ge=0)
    # POST /api/usage/events remembers the ids it accepted at least this long (its idempotency window).
    usage_idempotency_window_seconds: int = Field(default=7 * 24 * 3600, gt=0)
    # How often the outbox relays and metering delete what their retention lets go.
    prune_interval_seconds: float = Field(default=60, gt=0)
    # How often a process that runs consumers reads every group's lag from Kafka (consumer_lag.py).
    consumer_lag_interval_seconds: float = Field(default=15, gt=0)

    @field_validator("session_ttl_seconds")
    @classmethod
    def _sessions_outlive_no_logout(cls, ttl: int) -> int:
        if ttl > SESSIONS_RETENTION_S:
            raise ValueError(
                f"SESSION_TTL_SECONDS must be at most {SESSIONS_RETENTION_S} (7 days), the retention of sessions.v1: "
                "an edge restarted later would no longer know the logouts of sessions still alive"
            )
        return ttl

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.platform_timezone)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def group(self, name: str) -> str:
        return f"{self.topic_prefix}tollgate.{name}"


@cache
def get_settings() -> Settings:
    return Settings()
