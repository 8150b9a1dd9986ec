"""Broker adapters. ``paper`` is a simulated exchange for simulation mode, the embedded
runtime and tests; its scripted behaviour produces every broker rejection on demand."""
