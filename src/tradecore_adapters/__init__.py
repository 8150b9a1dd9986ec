"""Implementations of the core's ports: memory, brokers, and (later) Redis, Postgres, HTTP."""
