"""Trading accounts in Postgres; the webhook token lookup is one indexed join with the owner
(and, for ``webhook_owner``, the owner's allowed IPs in the same statement).

Broker credentials are stored as the ciphertext the core hands over (``bytea``), never opened
here. ``save`` is one compare-and-set statement on the changed and compared columns (see
``rows.compare_and_set_query``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tradecore.accounts import TradingAccount
from tradecore.ports.repositories import WebhookOwner, save_fields
from tradecore_adapters.postgres.identity import USER_COLUMNS, user_from_row
from tradecore_adapters.postgres.json_values import jsonb
from tradecore_adapters.postgres.pool import Pool
from tradecore_adapters.postgres.rows import (
    Row,
    compare_and_set_params,
    compare_and_set_query,
    execute,
    fetch_all,
    fetch_one,
    utc,
)

_OWNER = ", ".join(f"u.{c} AS owner_{c}" for c in USER_COLUMNS)
# The token probe (one indexed join with the owner), plus the owner's allowed IPs
# (user_allowed_ips_unique, led by user_id): the subquery runs only for the one matching row.
_WEBHOOK_OWNER = (
    f"SELECT a.*, {_OWNER},"  # noqa: S608 - constant column names
    " ARRAY(SELECT ip.ip_address FROM user_allowed_ips ip WHERE ip.user_id = a.user_id"
    " ORDER BY ip.created_at, ip.seq) AS webhook_allowed_ips"
    " FROM trading_accounts a JOIN users u ON u.id = a.user_id"
    " WHERE a.webhook_token_hash = %(token_hash)s AND NOT a.deleted"
)


def account_from_row(row: Row) -> TradingAccount:
    return TradingAccount(
        id=row["id"],
        user_id=row["user_id"],
        name=row["name"],
        broker_name=row["broker_name"],
        webhook_token_hash=row["webhook_token_hash"],
        webhook_secret_hash=row["webhook_secret_hash"],
        created_at=utc(row["created_at"]),
        max_request_age=row["max_request_age"],
        allowed_symbols=frozenset(row["allowed_symbols"]),
        max_quantity=row["max_quantity"],
        credentials_verified=row["credentials_verified"],
        deleted=row["deleted"],
        encrypted_credentials=_bytes_or_none(row["encrypted_credentials"]),
        testnet=row["testnet"],
        symbol_map=dict(row["symbol_map"]),
    )


def _bytes_or_none(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def _params(account: TradingAccount) -> dict[str, Any]:
    return {
        "id": account.id,
        "user_id": account.user_id,
        "name": account.name,
        "broker_name": account.broker_name,
        "webhook_token_hash": account.webhook_token_hash,
        "webhook_secret_hash": account.webhook_secret_hash,
        "created_at": account.created_at,
        "max_request_age": account.max_request_age,
        "allowed_symbols": sorted(account.allowed_symbols),
        "max_quantity": account.max_quantity,
        "credentials_verified": account.credentials_verified,
        "deleted": account.deleted,
        "encrypted_credentials": account.encrypted_credentials,
        "testnet": account.testnet,
        "symbol_map": jsonb(dict(account.symbol_map)),
    }


class PostgresTradingAccountRepository:
    """TradingAccountRepository on table ``trading_accounts``; deleted accounts stay as rows
    (``deleted`` true) and are invisible to every lookup."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, account: TradingAccount) -> None:
        await execute(
            self._pool,
            "INSERT INTO trading_accounts (id, user_id, name, broker_name, webhook_token_hash,"
            " webhook_secret_hash, created_at, max_request_age, allowed_symbols, max_quantity,"
            " credentials_verified, deleted, encrypted_credentials, testnet, symbol_map)"
            " VALUES (%(id)s,"
            " %(user_id)s, %(name)s, %(broker_name)s, %(webhook_token_hash)s,"
            " %(webhook_secret_hash)s, %(created_at)s, %(max_request_age)s,"
            " %(allowed_symbols)s, %(max_quantity)s, %(credentials_verified)s, %(deleted)s,"
            " %(encrypted_credentials)s, %(testnet)s, %(symbol_map)s)",
            _params(account),
        )

    async def get(self, account_id: str) -> TradingAccount | None:
        row = await fetch_one(
            self._pool,
            "SELECT * FROM trading_accounts WHERE id = %s AND NOT deleted",
            (account_id,),
        )
        return None if row is None else account_from_row(row)

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        row = await fetch_one(self._pool, _WEBHOOK_OWNER, {"token_hash": token_hash})
        if row is None:
            return None
        return WebhookOwner(
            account=account_from_row(row),
            user=user_from_row(row, "owner_"),
            allowed_ips=tuple(str(ip) for ip in row["webhook_allowed_ips"]),
        )

    async def list_for_user(self, user_id: str) -> list[TradingAccount]:
        rows = await fetch_all(
            self._pool,
            "SELECT * FROM trading_accounts WHERE user_id = %s AND NOT deleted"
            " ORDER BY created_at, seq",
            (user_id,),
        )
        return [account_from_row(r) for r in rows]

    async def save(
        self,
        account: TradingAccount,
        *,
        previous: TradingAccount,
        guard: Collection[str] = (),
    ) -> TradingAccount | None:
        changed, compared = save_fields(account, previous, guard)
        params = compare_and_set_params(_params(account), _params(previous), changed, compared)
        query = compare_and_set_query("trading_accounts", changed, compared)
        row = await fetch_one(self._pool, query, params)
        return None if row is None else account_from_row(row)
