"""Test support for tradecore and for services that build on it.

Hypothesis strategies (positions, signals, webhook payloads) and deterministic clocks. Importing
this package needs ``hypothesis`` (the ``test`` extra); the core itself never imports it.
"""
