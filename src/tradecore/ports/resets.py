"""Password-reset tokens: single use, expiring, stored only as SHA-256 digests."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class PasswordResetTokens(Protocol):
    """Outstanding reset tokens, keyed by the SHA-256 hex digest of the token.

    The plaintext token never reaches the store. A token is usable until it is consumed, its
    expiry passes, or its user's tokens are discarded. Every method may raise
    ``DatabaseUnavailable``.
    """

    async def add(self, token_hash: str, user_id: str, expires_at: datetime) -> None:
        """Store a new token of ``user_id``, usable strictly before ``expires_at``. An adapter
        may drop the user's oldest outstanding tokens to bound storage (never the new one)."""
        ...

    async def consume(self, token_hash: str, now: datetime) -> str | None:
        """Atomically take the token: its user id when it is stored and ``now`` is before its
        expiry, else None. A token is consumed at most once: of concurrent calls for one
        digest, at most one gets the user id; every later call gets None."""
        ...

    async def discard_for_user(self, user_id: str) -> int:
        """Remove every outstanding token of ``user_id``; the number removed. Idempotent."""
        ...
