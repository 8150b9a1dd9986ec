"""The core's error hierarchy. Adapters translate library errors into these (``raise ... from e``).

Expected business outcomes (a broker rejection, a replay, a failed check) are results, not
exceptions; these are for effects that could not be carried out.
"""

from __future__ import annotations


class TradecoreError(Exception):
    """Base of every error the core raises or expects from a port."""


class StoreUnavailable(TradecoreError):
    """A durable store (database) or the key-value store could not be reached in time."""


class KeyValueStoreUnavailable(StoreUnavailable):
    """The key-value store (Redis) could not be reached: order paths answer 503."""


class DatabaseUnavailable(StoreUnavailable):
    """The relational store (Postgres) could not be reached: requests answer 503."""


class BrokerDisconnected(TradecoreError):
    """The broker connection dropped; the worker reconnects (up to 3 retries) and retries."""


class CredentialsRejected(TradecoreError):
    """The broker refused the account's credentials (wrong key, wrong secret, missing
    permission). The message is the broker's reason, safe to show to the account's owner: it
    never repeats a credential."""


class WorkerStartTimeout(TradecoreError):
    """The user's worker did not become active within the start timeout: 503."""


class IllegalTransition(TradecoreError):
    """A state machine was asked for a transition its table does not have."""

    def __init__(self, state: object, trigger: object) -> None:
        super().__init__(f"illegal transition from {state!s} on {trigger!s}")
        self.state = state
        self.trigger = trigger


class DuplicateOrder(TradecoreError):
    """An order-history row with the same replay fingerprint already exists for this user."""


class InvalidToken(TradecoreError):
    """A JWT failed verification (signature, expiry, type or required claims)."""
