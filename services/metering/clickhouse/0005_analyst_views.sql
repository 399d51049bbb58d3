-- The names analysts query (docs/analysts.md): stable views over the internal tables, and the
-- price table. The internal tables may change shape, these views keep their columns.
-- After 0003 (the calls' outcome) and 0004 (usage per key): the views show those columns.

-- Prices as metering loads them (services/metering/data/prices.toml or METERING_PRICES_FILE),
-- written by the metering service at start. A row applies from `effective_from` (a UTC date)
-- until the next row of the same provider and model. Read with FINAL (or through usage_daily).
CREATE TABLE IF NOT EXISTS {db}.prices
(
    provider       LowCardinality(String),
    model          LowCardinality(String),
    effective_from Date,
    input_per_1m   Decimal(38, 9),
    output_per_1m  Decimal(38, 9),
    currency       LowCardinality(String),
    loaded_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY (provider, model, effective_from);

-- One row per usage event (usage.v1), de-duplicated by the sink on `event_id`.
CREATE VIEW IF NOT EXISTS {db}.usage AS
SELECT
    id AS event_id,
    time AS event_time,
    ingested_at,
    account_id,
    resource,
    quantity,
    provider,
    model,
    input_tokens,
    output_tokens,
    total_tokens,
    source,
    nullIf(api_key_id, toUUID('00000000-0000-0000-0000-000000000000')) AS api_key_id
FROM {db}.usage_events;

-- One row per API-key call (calls.v1): who called which route, how it ended, how long it took.
CREATE VIEW IF NOT EXISTS {db}.api_calls AS
SELECT
    id AS event_id,
    time AS event_time,
    ingested_at,
    account_id,
    api_key_id,
    method,
    path AS route,
    status,
    ip,
    user_agent,
    latency_ms,
    nullIf(error_code, '') AS error_code,
    count
FROM {db}.call_events;

-- Account x UTC day x resource x provider x model, priced with the price in force that day
-- (0 for a model without a price, as the API does). Served by the `hourly` projection.
CREATE VIEW IF NOT EXISTS {db}.usage_daily AS
SELECT
    u.account_id AS account_id,
    u.day AS day,
    u.resource AS resource,
    u.provider AS provider,
    u.model AS model,
    u.events AS events,
    u.quantity AS quantity,
    u.input_tokens AS input_tokens,
    u.output_tokens AS output_tokens,
    u.total_tokens AS total_tokens,
    (u.input_tokens * p.input_per_1m + u.output_tokens * p.output_per_1m) / 1000000 AS cost,
    p.effective_from > toDate(0) AS priced
FROM
(
    SELECT account_id, toDate(hour) AS day, resource, provider, model,
           sum(events) AS events, sum(quantity) AS quantity, sum(input_tokens) AS input_tokens,
           sum(output_tokens) AS output_tokens, sum(total_tokens) AS total_tokens
    FROM {db}.usage_hourly
    GROUP BY account_id, day, resource, provider, model
) AS u
ASOF LEFT JOIN (SELECT * FROM {db}.prices FINAL) AS p
    ON u.provider = p.provider AND u.model = p.model AND u.day >= p.effective_from
