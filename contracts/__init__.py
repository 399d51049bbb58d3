"""Tollgate's shared contract: event and API payload models, topics, error codes. No I/O."""
