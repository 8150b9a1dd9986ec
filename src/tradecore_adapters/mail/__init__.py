"""Outgoing mail adapters: a logging outbox for the embedded default (SMTP arrives later)."""
