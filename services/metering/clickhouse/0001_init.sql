-- Metering's ClickHouse schema (see docs/clickhouse.md). `{db}` is the target database.
-- Raw tables: one row per event, partitioned by month of the event time, ordered for
-- per-account time-range reads. ReplacingMergeTree on (account_id, time, id): the sink already
-- drops known ids before inserting, and a merge removes any copy that slipped through.
-- The hourly rollup and the id index are PROJECTIONS, stored inside each part of the raw table:
-- an INSERT's raw rows, rollup rows and ids are committed together (one part per partition), so
-- a process killed mid-insert cannot leave ids recorded whose rollup rows are missing (as it
-- could with materialized views into separate tables). Merges that drop a copy rebuild them.

CREATE TABLE IF NOT EXISTS {db}.usage_events
(
    id            UUID,
    time          DateTime64(3, 'UTC'),
    account_id    UUID,
    resource      LowCardinality(String),
    quantity      Int64,
    provider      LowCardinality(String),
    model         LowCardinality(String),
    input_tokens  UInt64,
    output_tokens UInt64,
    total_tokens  UInt64,
    source        LowCardinality(String),
    ingested_at   DateTime64(3, 'UTC') DEFAULT now64(3),
    PROJECTION by_id (SELECT id ORDER BY id),
    PROJECTION hourly
    (
        SELECT account_id, toStartOfHour(time), resource, provider, model,
               count(), sum(quantity), sum(input_tokens), sum(output_tokens), sum(total_tokens)
        GROUP BY account_id, toStartOfHour(time), resource, provider, model
    )
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (account_id, time, id)
SETTINGS deduplicate_merge_projection_mode = 'rebuild';

CREATE TABLE IF NOT EXISTS {db}.call_events
(
    id          UUID,
    time        DateTime64(3, 'UTC'),
    account_id  UUID,
    api_key_id  UUID,
    method      LowCardinality(String),
    path        String,
    status      UInt16,
    ip          String,
    user_agent  String,
    latency_ms  Float64,
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3),
    PROJECTION by_id (SELECT id ORDER BY id),
    PROJECTION hourly
    (
        SELECT account_id, toStartOfHour(time), api_key_id, method, path, status, count(), sum(latency_ms)
        GROUP BY account_id, toStartOfHour(time), api_key_id, method, path, status
    )
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (account_id, time, id)
SETTINGS deduplicate_merge_projection_mode = 'rebuild';

-- The rollups analysts and the API read: account x UTC hour x resource x provider x model, and
-- account x UTC hour x key x method x path x status. Views over the raw tables whose GROUP BY is
-- the `hourly` projection's, so a filtered read is served from the projection (a few granules),
-- not from the raw rows. Always read them with sum() and GROUP BY.
CREATE VIEW IF NOT EXISTS {db}.usage_hourly AS
SELECT
    account_id,
    toStartOfHour(time) AS hour,
    resource,
    provider,
    model,
    count() AS events,
    sum(quantity) AS quantity,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(total_tokens) AS total_tokens
FROM {db}.usage_events
GROUP BY account_id, hour, resource, provider, model;

CREATE VIEW IF NOT EXISTS {db}.calls_hourly AS
SELECT
    account_id,
    toStartOfHour(time) AS hour,
    api_key_id,
    method,
    path,
    status,
    count() AS calls,
    sum(latency_ms) AS latency_ms_sum
FROM {db}.call_events
GROUP BY account_id, hour, api_key_id, method, path, status;
