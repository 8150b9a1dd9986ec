"""Every Postgres repository adapter, importable from one place.

They share one ``AsyncConnectionPool`` (see ``pool.open_pool``) over a schema created by
``migrate``; each implements its port in ``tradecore.ports`` with the memory adapter's semantics.
"""

from __future__ import annotations

from tradecore_adapters.postgres.accounts import PostgresTradingAccountRepository
from tradecore_adapters.postgres.audit import PostgresAuditLog
from tradecore_adapters.postgres.identity import (
    PostgresAllowedIpRepository,
    PostgresApiKeyRepository,
    PostgresSessionRepository,
    PostgresUserRepository,
)
from tradecore_adapters.postgres.orders import PostgresOrderHistory
from tradecore_adapters.postgres.resets import PostgresPasswordResetTokens

__all__ = [
    "PostgresAllowedIpRepository",
    "PostgresApiKeyRepository",
    "PostgresAuditLog",
    "PostgresOrderHistory",
    "PostgresPasswordResetTokens",
    "PostgresSessionRepository",
    "PostgresTradingAccountRepository",
    "PostgresUserRepository",
]
