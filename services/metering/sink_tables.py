"""How the events of one topic become rows of one ClickHouse table, in the engine's own SQL.

The sink hands the engine the events' JSON as it came from Kafka (the engine parses it off the
event loop and off the GIL). `fields` is an event's fields as they appear in that JSON; `select`
derives the stored columns from them. The derived values are the only rules stated here:
provider and model default to `unknown`, and `total_tokens` is input + output when the event
splits its tokens, else its quantity (never negative), and an event without `api_key_id` stores the
zero UUID. (v4) `model_not_allowed` is the sink's own judgment, never the event's: the ids it
flagged travel with the INSERT as the parameter `flagged` (a field of that name in an event's JSON
is not read).
"""

from dataclasses import dataclass

from services.metering.domain import NO_KEY, UNKNOWN


@dataclass(frozen=True, slots=True)
class SinkTable:
    table: str
    fields: str  # the event's fields as they appear in its JSON (the external table `batch`'s structure)
    columns: str
    select: str


USAGE = SinkTable(
    table="usage_events",
    fields=(
        "id UUID, time DateTime64(3, 'UTC'), account_id UUID, resource String, quantity Int64, "
        "provider Nullable(String), model Nullable(String), input_tokens Nullable(UInt64), "
        "output_tokens Nullable(UInt64), source String, api_key_id Nullable(UUID)"
    ),
    columns=(
        "id, time, account_id, resource, quantity, provider, model, input_tokens, output_tokens, total_tokens, source, "
        "api_key_id, model_not_allowed"
    ),
    select=(
        f"id, time, account_id, resource, quantity, ifNull(provider, '{UNKNOWN}'), ifNull(model, '{UNKNOWN}'), "
        "ifNull(input_tokens, 0), ifNull(output_tokens, 0), "
        "if(input_tokens IS NULL AND output_tokens IS NULL, toUInt64(greatest(quantity, 0)), "
        "ifNull(input_tokens, 0) + ifNull(output_tokens, 0)), source, "
        f"ifNull(api_key_id, toUUID('{NO_KEY}')), has({{flagged:Array(UUID)}}, id)"
    ),
)

CALLS = SinkTable(
    table="call_events",
    fields=(
        "id UUID, time DateTime64(3, 'UTC'), account_id UUID, api_key_id UUID, method String, path String, "
        "status UInt16, ip String, user_agent String, latency_ms Float64, error_code Nullable(String), count Nullable(UInt32), "
        "service Nullable(String)"
    ),
    columns="id, time, account_id, api_key_id, method, path, status, ip, user_agent, latency_ms, error_code, count, service",
    # (v2) an admitted call has no error_code (stored ''); an event without `count` is one call;
    # (v3) a call no service verified has no service (stored '')
    select=(
        "id, time, account_id, api_key_id, method, path, status, ip, user_agent, latency_ms, "
        "ifNull(error_code, ''), ifNull(count, 1), ifNull(service, '')"
    ),
)

# How the engine reads the events' JSON. Unknown keys (`type`, fields added later) are skipped;
# RFC 3339 times with any offset are read as the contract reads them; a key given twice is an
# error (by default the engine would keep the first and pydantic the last). One parsing thread:
# a batch is a few MB, and splitting it costs more than it gains (BENCHMARKS.md, metering round 3).
JSON_INPUT = {
    "input_format_skip_unknown_fields": 1,
    "date_time_input_format": "best_effort",
    "input_format_json_ignore_unnecessary_fields": 0,
    "input_format_parallel_parsing": 0,
}
