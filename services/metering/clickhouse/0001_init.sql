-- Metering's ClickHouse schema (see docs/clickhouse.md). `{db}` is the target database.
-- Raw tables: one row per event, partitioned by month of the event time, ordered for
-- per-account time-range reads. ReplacingMergeTree on (account_id, time, id): the sink already
-- drops known ids before inserting, and a merge removes any copy that slipped through.

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
    ingested_at   DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (account_id, time, id);

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
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (account_id, time, id);

-- Every event id the sink has written, ordered by id. The sink's duplicate check is a primary-key
-- lookup here instead of a scan of the raw tables.
CREATE TABLE IF NOT EXISTS {db}.event_ids
(
    id    UUID,
    topic LowCardinality(String),
    time  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY id;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_event_ids_mv TO {db}.event_ids AS
SELECT id, 'usage' AS topic, time FROM {db}.usage_events;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.call_event_ids_mv TO {db}.event_ids AS
SELECT id, 'calls' AS topic, time FROM {db}.call_events;

-- Rollup: account x hour (UTC) x resource x provider x model. The API reads only this table
-- for overview, trend and by-provider. Rows are summed by merges: always read with sum().
CREATE TABLE IF NOT EXISTS {db}.usage_hourly
(
    account_id    UUID,
    hour          DateTime('UTC'),
    resource      LowCardinality(String),
    provider      LowCardinality(String),
    model         LowCardinality(String),
    events        UInt64,
    quantity      Int64,
    input_tokens  UInt64,
    output_tokens UInt64,
    total_tokens  UInt64
)
ENGINE = SummingMergeTree((events, quantity, input_tokens, output_tokens, total_tokens))
PARTITION BY toYYYYMM(hour)
ORDER BY (account_id, hour, resource, provider, model);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_hourly_mv TO {db}.usage_hourly AS
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

-- Rollup of API calls for analysts: account x hour x key x method x path x status.
CREATE TABLE IF NOT EXISTS {db}.calls_hourly
(
    account_id     UUID,
    hour           DateTime('UTC'),
    api_key_id     UUID,
    method         LowCardinality(String),
    path           String,
    status         UInt16,
    calls          UInt64,
    latency_ms_sum Float64
)
ENGINE = SummingMergeTree((calls, latency_ms_sum))
PARTITION BY toYYYYMM(hour)
ORDER BY (account_id, hour, api_key_id, method, path, status);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.calls_hourly_mv TO {db}.calls_hourly AS
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
