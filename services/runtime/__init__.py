"""The process host and its plumbing (settings, Kafka, Postgres, ClickHouse, health, CLI).

Not a service: it mounts the services a `--target` names. Services may use its plumbing
modules; only `host.py` and `cli.py` import services.
"""
