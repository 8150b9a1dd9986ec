"""Users, sessions, API keys and allowed IPs in Postgres.

Semantics match the memory adapters: e-mails are unique case-insensitively (``str.casefold``,
computed here and kept in ``users.email_key``), listings are oldest first with insertion order
breaking ties, and every conditional change is one compare-and-set statement. ``save`` of a
user (and of a trading account, ``accounts.py``) is one ``UPDATE ... WHERE id = ... AND
<column> IS NOT DISTINCT FROM <previous value>`` over the compared columns, writing only the
changed ones.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from tradecore.identity import AllowedIp, ApiKey, Plan, Session, User
from tradecore.ports.repositories import save_fields
from tradecore.sessions import RefreshRotation
from tradecore_adapters.postgres.errors import database_errors
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import (
    Row,
    compare_and_set_params,
    compare_and_set_query,
    execute,
    fetch_all,
    fetch_one,
    utc,
    utc_or_none,
)

USER_COLUMNS = (
    "id",
    "email",
    "password_hash",
    "plan",
    "created_at",
    "disabled",
    "subscription_expires_at",
    "accepted_terms_version",
    "is_admin",
)


def user_from_row(row: Row, prefix: str = "") -> User:
    """The User of a ``users`` row (columns read as ``prefix + name``)."""

    def col(name: str) -> Any:
        return row[prefix + name]

    return User(
        id=col("id"),
        email=col("email"),
        password_hash=col("password_hash"),
        plan=Plan(col("plan")),
        created_at=utc(col("created_at")),
        disabled=col("disabled"),
        subscription_expires_at=utc_or_none(col("subscription_expires_at")),
        accepted_terms_version=col("accepted_terms_version"),
        is_admin=col("is_admin"),
    )


def _user_params(user: User) -> dict[str, Any]:
    return {
        "id": user.id,
        "email": user.email,
        "email_key": user.email.casefold(),
        "password_hash": user.password_hash,
        "plan": user.plan.value,
        "created_at": user.created_at,
        "disabled": user.disabled,
        "subscription_expires_at": user.subscription_expires_at,
        "accepted_terms_version": user.accepted_terms_version,
        "is_admin": user.is_admin,
    }


_USER_VALUES = (
    "%(id)s, %(email)s, %(email_key)s, %(password_hash)s, %(plan)s, %(created_at)s,"
    " %(disabled)s, %(subscription_expires_at)s, %(accepted_terms_version)s, %(is_admin)s"
)
_INSERT_INTO_USERS = (
    "INSERT INTO users (id, email, email_key, password_hash, plan, created_at, disabled,"
    " subscription_expires_at, accepted_terms_version, is_admin)"
)
_INSERT_USER = f"{_INSERT_INTO_USERS} VALUES ({_USER_VALUES})"


class PostgresUserRepository:
    """UserRepository on table ``users``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, user: User) -> bool:
        row = await fetch_one(
            self._pool,
            _INSERT_USER + " ON CONFLICT (email_key) DO NOTHING RETURNING id",
            _user_params(user),
        )
        return row is not None

    async def add_first(self, user: User) -> bool:
        """The lock mode conflicts with itself and with the ROW EXCLUSIVE lock every INSERT
        takes, but not with readers: while the check and the insert run, no other insert into
        ``users`` can start or be in flight, so "no user yet" still holds when the row lands
        (a plain ``INSERT ... WHERE NOT EXISTS`` would let two concurrent ones both see an
        empty table). The first-run setup happens once, so the brief lock costs nothing."""
        with database_errors():
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("LOCK TABLE users IN SHARE ROW EXCLUSIVE MODE")
                cursor = await conn.execute("SELECT EXISTS (SELECT 1 FROM users)")
                found = await cursor.fetchone()
                if found is None or found[0]:
                    return False
                await conn.execute(_INSERT_USER, _user_params(user))
                return True

    async def any_exist(self) -> bool:
        row = await fetch_one(self._pool, "SELECT EXISTS (SELECT 1 FROM users) AS found")
        return row is not None and bool(row["found"])

    async def get(self, user_id: str) -> User | None:
        row = await fetch_one(self._pool, "SELECT * FROM users WHERE id = %s", (user_id,))
        return None if row is None else user_from_row(row)

    async def by_email(self, email: str) -> User | None:
        row = await fetch_one(
            self._pool, "SELECT * FROM users WHERE email_key = %s", (email.casefold(),)
        )
        return None if row is None else user_from_row(row)

    async def save(self, user: User, *, previous: User, guard: Collection[str] = ()) -> User | None:
        changed, compared = save_fields(user, previous, guard)
        # email_key follows email (the case-insensitive unique key)
        written = (*changed, "email_key") if "email" in changed else changed
        params = compare_and_set_params(
            _user_params(user), _user_params(previous), written, compared
        )
        row = await fetch_one(self._pool, compare_and_set_query("users", written, compared), params)
        return None if row is None else user_from_row(row)


def session_from_row(row: Row) -> Session:
    return Session(
        id=row["id"],
        user_id=row["user_id"],
        csrf_token=row["csrf_token"],
        ip_address=str(row["ip_address"]),
        user_agent=row["user_agent"],
        created_at=utc(row["created_at"]),
        is_active=row["is_active"],
        refresh_jti=row["refresh_jti"],
        revoked_at=utc_or_none(row["revoked_at"]),
    )


class PostgresSessionRepository:
    """SessionRepository on table ``user_sessions``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, session: Session) -> None:
        await execute(
            self._pool,
            "INSERT INTO user_sessions (id, user_id, csrf_token, ip_address, user_agent,"
            " created_at, is_active, refresh_jti, revoked_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                session.id,
                session.user_id,
                session.csrf_token,
                session.ip_address,
                session.user_agent,
                session.created_at,
                session.is_active,
                session.refresh_jti,
                session.revoked_at,
            ),
        )

    async def get(self, session_id: str) -> Session | None:
        row = await fetch_one(
            self._pool, "SELECT * FROM user_sessions WHERE id = %s", (session_id,)
        )
        return None if row is None else session_from_row(row)

    async def rotate_refresh(
        self, session_id: str, expected_jti: str, new_jti: str, *, at: datetime
    ) -> bool:
        changed = await execute(
            self._pool,
            "UPDATE user_sessions SET refresh_jti = %s, previous_refresh_jti = refresh_jti,"
            " refresh_rotated_at = %s"
            " WHERE id = %s AND is_active AND refresh_jti = %s",
            (new_jti, at, session_id, expected_jti),
        )
        return changed == 1

    async def last_rotation(self, session_id: str) -> RefreshRotation | None:
        row = await fetch_one(
            self._pool,
            "SELECT previous_refresh_jti, refresh_rotated_at FROM user_sessions WHERE id = %s",
            (session_id,),
        )
        if row is None or row["previous_refresh_jti"] is None:
            return None
        return RefreshRotation(
            retired_jti=row["previous_refresh_jti"], rotated_at=utc(row["refresh_rotated_at"])
        )

    async def deactivate(self, session_id: str, at: datetime) -> bool:
        changed = await execute(
            self._pool,
            "UPDATE user_sessions SET is_active = false, revoked_at = %s"
            " WHERE id = %s AND is_active",
            (at, session_id),
        )
        return changed == 1

    async def deactivate_all(self, user_id: str, at: datetime) -> int:
        return await execute(
            self._pool,
            "UPDATE user_sessions SET is_active = false, revoked_at = %s"
            " WHERE user_id = %s AND is_active",
            (at, user_id),
        )


def api_key_from_row(row: Row) -> ApiKey:
    return ApiKey(
        id=row["id"],
        user_id=row["user_id"],
        name=row["name"],
        key_hash=row["key_hash"],
        prefix=row["prefix"],
        created_at=utc(row["created_at"]),
        expires_at=utc_or_none(row["expires_at"]),
        last_used_at=utc_or_none(row["last_used_at"]),
        revoked_at=utc_or_none(row["revoked_at"]),
    )


class PostgresApiKeyRepository:
    """ApiKeyRepository on table ``api_keys`` (``key_hash`` unique)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, key: ApiKey) -> None:
        await execute(
            self._pool,
            "INSERT INTO api_keys (id, user_id, name, key_hash, prefix, created_at, expires_at,"
            " last_used_at, revoked_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                key.id,
                key.user_id,
                key.name,
                key.key_hash,
                key.prefix,
                key.created_at,
                key.expires_at,
                key.last_used_at,
                key.revoked_at,
            ),
        )

    async def by_hash(self, key_hash: str) -> ApiKey | None:
        row = await fetch_one(self._pool, "SELECT * FROM api_keys WHERE key_hash = %s", (key_hash,))
        return None if row is None else api_key_from_row(row)

    async def list_for_user(self, user_id: str) -> list[ApiKey]:
        rows = await fetch_all(
            self._pool,
            "SELECT * FROM api_keys WHERE user_id = %s ORDER BY created_at, seq",
            (user_id,),
        )
        return [api_key_from_row(r) for r in rows]

    async def revoke(self, key_id: str, user_id: str, at: datetime) -> bool:
        changed = await execute(
            self._pool,
            "UPDATE api_keys SET revoked_at = %s"
            " WHERE id = %s AND user_id = %s AND revoked_at IS NULL",
            (at, key_id, user_id),
        )
        return changed == 1

    async def touch(self, key_id: str, at: datetime) -> None:
        await execute(
            self._pool, "UPDATE api_keys SET last_used_at = %s WHERE id = %s", (at, key_id)
        )


def allowed_ip_from_row(row: Row) -> AllowedIp:
    return AllowedIp(
        id=row["id"],
        user_id=row["user_id"],
        ip_address=str(row["ip_address"]),
        created_at=utc(row["created_at"]),
    )


class PostgresAllowedIpRepository:
    """AllowedIpRepository on table ``user_allowed_ips`` (unique per user and address)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, entry: AllowedIp) -> bool:
        row = await fetch_one(
            self._pool,
            "INSERT INTO user_allowed_ips (id, user_id, ip_address, created_at)"
            " VALUES (%s, %s, %s, %s)"
            " ON CONFLICT ON CONSTRAINT user_allowed_ips_unique DO NOTHING RETURNING id",
            (entry.id, entry.user_id, entry.ip_address, entry.created_at),
        )
        return row is not None

    async def list_for_user(self, user_id: str) -> list[AllowedIp]:
        rows = await fetch_all(
            self._pool,
            "SELECT * FROM user_allowed_ips WHERE user_id = %s ORDER BY created_at, seq",
            (user_id,),
        )
        return [allowed_ip_from_row(r) for r in rows]

    async def remove(self, entry_id: str, user_id: str) -> bool:
        removed = await execute(
            self._pool,
            "DELETE FROM user_allowed_ips WHERE id = %s AND user_id = %s",
            (entry_id, user_id),
        )
        return removed == 1
