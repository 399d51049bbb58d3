"""Below the edge: settings, Kafka, Postgres, ClickHouse, the system clock. Imports only contracts."""
