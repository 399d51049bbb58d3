"""The two halves of the process around the services.

- `platform/`, below the edge: settings, Kafka, Postgres, ClickHouse clients, the system clock.
- `host/`, above every service: the CLI, the local stack, the process host that mounts the
  services a `--target` names.
No arrow points up: platform imports only `contracts`; only `host` imports services.
"""
