"""PostgreSQL adapters (psycopg 3, async, pooled): every repository port, the document store,
schema migrations, and the pool they share. Driver errors surface as ``DatabaseUnavailable``."""

from __future__ import annotations

from tradecore_adapters.postgres.documents import PostgresDocumentStore
from tradecore_adapters.postgres.migrate import migrate
from tradecore_adapters.postgres.pool import Pool, make_pool, open_pool
from tradecore_adapters.postgres.repositories import (
    PostgresAllowedIpRepository,
    PostgresApiKeyRepository,
    PostgresAuditLog,
    PostgresOrderHistory,
    PostgresPasswordResetTokens,
    PostgresSessionRepository,
    PostgresTradingAccountRepository,
    PostgresUserRepository,
)

__all__ = [
    "Pool",
    "PostgresAllowedIpRepository",
    "PostgresApiKeyRepository",
    "PostgresAuditLog",
    "PostgresDocumentStore",
    "PostgresOrderHistory",
    "PostgresPasswordResetTokens",
    "PostgresSessionRepository",
    "PostgresTradingAccountRepository",
    "PostgresUserRepository",
    "make_pool",
    "migrate",
    "open_pool",
]
