"""Execution: per-user workers under leases in worker hosts, and fill verification."""
