"""A rate limit: a plan's, or (v4) a key's own, narrower one."""

from pydantic import BaseModel, ConfigDict, Field


class RateLimit(BaseModel):
    """A plan's limits. Bounded so that the limiter's arithmetic stays finite (a refill of
    5e-324 a second, or an infinite one, would overflow a wait or a TTL on every call)."""

    model_config = ConfigDict(frozen=True)

    per_second: float = Field(ge=1e-6, le=1e9, allow_inf_nan=False)
    burst: int = Field(gt=0, le=10**9)
    per_minute: int = Field(gt=0, le=10**9)
