"""In-memory password-reset tokens (one process, one event loop).

Each method runs without an ``await`` between its read and its write, so ``consume`` is atomic
with respect to every other coroutine on the loop. Storage is bounded by the number of users:
a user keeps at most ``max_per_user`` outstanding tokens (adding one drops the oldest), and
expired tokens are swept whenever a token is consumed.
"""

from __future__ import annotations

from datetime import datetime

import attrs


@attrs.frozen
class _Outstanding:
    user_id: str
    expires_at: datetime


class MemoryPasswordResetTokens:
    """PasswordResetTokens in a dictionary (insertion order is issue order)."""

    def __init__(self, max_per_user: int = 5) -> None:
        if max_per_user < 1:
            raise ValueError("max_per_user must be at least 1")
        self._max_per_user = max_per_user
        self._tokens: dict[str, _Outstanding] = {}

    async def add(self, token_hash: str, user_id: str, expires_at: datetime) -> None:
        self._tokens.pop(token_hash, None)
        self._tokens[token_hash] = _Outstanding(user_id, expires_at)
        mine = [h for h, t in self._tokens.items() if t.user_id == user_id]
        for old in mine[: -self._max_per_user]:
            del self._tokens[old]

    async def consume(self, token_hash: str, now: datetime) -> str | None:
        token = self._tokens.pop(token_hash, None)
        self._tokens = {h: t for h, t in self._tokens.items() if t.expires_at > now}
        if token is None or now >= token.expires_at:
            return None
        return token.user_id

    async def discard_for_user(self, user_id: str) -> int:
        mine = [h for h, t in self._tokens.items() if t.user_id == user_id]
        for token_hash in mine:
            del self._tokens[token_hash]
        return len(mine)

    def __len__(self) -> int:
        return len(self._tokens)
