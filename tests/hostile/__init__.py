"""Hostile input and security checks (issue 8, sections 3 and 4), on real Kafka, Postgres and ClickHouse."""
