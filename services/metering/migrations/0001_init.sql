-- Ids of usage events accepted by POST /api/usage/events: the idempotency record of the HTTP
-- ingestion (the sink has its own in ClickHouse). A primary key makes "first seen" atomic
-- across replicas (INSERT ... ON CONFLICT DO NOTHING RETURNING id).
CREATE SCHEMA IF NOT EXISTS metering;

CREATE TABLE IF NOT EXISTS metering.ingested_events (
    id          uuid PRIMARY KEY,
    account_id  uuid NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
