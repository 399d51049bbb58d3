"""api_calls admissions shared by every edge replica, in the rate limiter's Redis (`REDIS_URL`).

Each process alone would admit the whole remainder of an account's quota (N replicas: N times
it). Here an account's admissions of the period are one counter in Redis, beside the newest
quota state any replica has brought (watermark, used, reserved). `ADMIT_FN` judges and records a
call atomically, inside the rate limiter's script (rate_store.RedisStore: one round trip per
call), and only for a call the rate limit let through:
1. a replica whose projection lags is judged by the newest state Redis keeps (by watermark),
   against the total the calling replica knows: totals come from billing.v1 (quota_gate.py), which
   every replica applies within milliseconds of a payment, while a state keeps its watermark when
   only the total changes, so a state kept here could hold an old total;
2. admitted := max(admitted, used): calls quota counted without passing here (Redis was away,
   or its key was lost) take their places too;
3. admitted + reserved >= total refuses; otherwise admitted += 1.
Every call quota counts was admitted here first, so `admitted` is quota's count plus the calls
still in flight, whatever order their events arrive in: the replicas together admit exactly the
total. An admitted call that ends refused (a 401/403/429 of its handler) is not counted by quota,
so its admission is given back (`RELEASE`). A replica that dies between admitting a call and
sending its event holds that place for the rest of the period: it errs towards refusing early,
never towards admitting more than was paid for (docs/quota.md).

Redis unreachable: the edge falls back, loudly, to its in-process count (a log line and
`tollgate_edge_admission_store_errors_total`); documented in docs/quota.md.
"""

from datetime import datetime

from prometheus_client import Counter

from services.edge.quota_gate import CallsView

ADMISSION_STORE_ERRORS = Counter(
    "tollgate_edge_admission_store_errors_total",
    "Shared api_calls admissions that failed in Redis: judged by this process's own count, or not given back (unit: admissions)",
)

# room(key, argv, at): argv[at .. at + 5] = has a state (1/0), its watermark (us), used,
# reserved, the caller's total, the key's ttl (s). Brings the hash up to the newest state and
# returns its admissions, whether one more fits, and how many more fit (leases.py: a block).
# (v4) A call may need several admissions at once (its account's and its key's own api_calls
# limits): each is asked for room first, and all are taken only if every one has it.
ADMIT_FN = """
local function room(key, argv, at)
  local has = argv[at] == '1'
  local w, used, reserved, total = tonumber(argv[at + 1]), tonumber(argv[at + 2]), tonumber(argv[at + 3]), tonumber(argv[at + 4])
  local kept = redis.call('HMGET', key, 'w', 'used', 'reserved', 'admitted')
  if kept[1] and (not has or tonumber(kept[1]) > w) then
    used, reserved = tonumber(kept[2]), tonumber(kept[3])
  elseif has then
    redis.call('HSET', key, 'w', argv[at + 1], 'used', argv[at + 2], 'reserved', argv[at + 3])
  end
  local admitted = math.max(tonumber(kept[4] or '0'), used)
  redis.call('HSET', key, 'admitted', admitted)
  redis.call('EXPIRE', key, tonumber(argv[at + 5]))
  return admitted, admitted + reserved < total, total - reserved - admitted
end
"""

RELEASE = """
local admitted = tonumber(redis.call('HGET', KEYS[1], 'admitted') or '0')
if admitted > 0 then
  redis.call('HSET', KEYS[1], 'admitted', admitted - 1)
end
return admitted
"""

# Keys idle this long are dropped: any admission in them was counted long ago.
TTL_S = 2 * 24 * 3600


def micros(moment: datetime) -> int:
    """Microseconds since the epoch: exact in a Lua double (< 2^53), unlike float seconds."""
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def admission_key(prefix: str, view: CallsView) -> str:
    """The Redis hash of `view`'s account and period, or (v4) of a key's limit and window."""
    return f"{prefix}{view.subject or view.account_id}:{view.period}"


def admission_args(view: CallsView) -> list[int]:
    """ADMIT_FN's arguments for `view`, this process's projection (the newest state Redis keeps
    wins; the total is this process's). A state's `time` is stamped by quota from event times: the account's "no state" view
    (nothing counted this period) says so with has = 0 and keeps any newer state Redis has."""
    if view.watermark is None:
        return [0, -1, view.used, view.reserved, view.total, TTL_S]
    return [1, micros(view.watermark), view.used, view.reserved, view.total, TTL_S]
