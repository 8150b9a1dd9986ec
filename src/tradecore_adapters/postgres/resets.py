"""Password-reset tokens in Postgres (table ``password_reset_tokens``).

Matches the memory adapter: a user keeps at most ``max_per_user`` outstanding tokens (adding
one drops the oldest), and consuming a token also sweeps expired ones. ``consume`` is a single
``DELETE ... RETURNING`` that checks the expiry in the same statement, so of concurrent calls
for one digest at most one gets the user id.
"""

from __future__ import annotations

from datetime import datetime

from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import execute, fetch_one

_CONSUME = """
WITH taken AS (
    DELETE FROM password_reset_tokens WHERE token_hash = %(hash)s
    RETURNING user_id, expires_at
), swept AS (
    DELETE FROM password_reset_tokens WHERE token_hash IN (
        SELECT token_hash FROM password_reset_tokens
        WHERE expires_at <= %(now)s AND token_hash <> %(hash)s
        FOR UPDATE SKIP LOCKED
    )
)
SELECT user_id FROM taken WHERE %(now)s < expires_at
"""


class PostgresPasswordResetTokens:
    """PasswordResetTokens on table ``password_reset_tokens``."""

    def __init__(self, pool: Pool, max_per_user: int = 5) -> None:
        if max_per_user < 1:
            raise ValueError("max_per_user must be at least 1")
        self._pool = pool
        self._max_per_user = max_per_user

    async def add(self, token_hash: str, user_id: str, expires_at: datetime) -> None:
        with database_errors():
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(
                    "DELETE FROM password_reset_tokens WHERE token_hash = %s", (token_hash,)
                )
                await conn.execute(
                    "INSERT INTO password_reset_tokens (token_hash, user_id, expires_at)"
                    " VALUES (%s, %s, %s)",
                    (token_hash, user_id, expires_at),
                )
                await conn.execute(
                    "DELETE FROM password_reset_tokens WHERE user_id = %(user)s"
                    " AND token_hash NOT IN (SELECT token_hash FROM password_reset_tokens"
                    " WHERE user_id = %(user)s ORDER BY seq DESC LIMIT %(keep)s)",
                    {"user": user_id, "keep": self._max_per_user},
                )

    async def consume(self, token_hash: str, now: datetime) -> str | None:
        row = await fetch_one(self._pool, _CONSUME, {"hash": token_hash, "now": now})
        return None if row is None else str(row["user_id"])

    async def discard_for_user(self, user_id: str) -> int:
        return await execute(
            self._pool, "DELETE FROM password_reset_tokens WHERE user_id = %s", (user_id,)
        )
