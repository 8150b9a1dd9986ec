"""The webhook owner cache of the Postgres and Redis runtime, wired (docs/security.md,
"Webhook owner cache").

``cached_accounts`` is that set's ``TradingAccountRepository``: Postgres behind the
process's ``WebhookOwnerCache`` (WEBHOOK_OWNER_CACHE_SIZE, WEBHOOK_OWNER_CACHE_TTL_S), with
announcements on Redis. Its ``announcer`` is handed to the users and allowed-IP wrappers of
the same set, so every write of the owner data announces itself. The embedded runtime has no
cache (``tradecore_adapters.memory.owner_changes`` says why).
"""

from __future__ import annotations

from tradecore_adapters.owner_cache import CachedTradingAccounts, WebhookOwnerCache
from tradecore_adapters.postgres import PostgresTradingAccountRepository
from tradecore_adapters.redis.owner_changes import RedisOwnerChanges
from tradecore_entrypoints.connections import Connections, closed_with
from tradecore_entrypoints.settings import Settings


def cached_accounts(connections: Connections, settings: Settings) -> CachedTradingAccounts:
    """The accounts over ``connections``; the subscription stops before the clients close."""
    cache = WebhookOwnerCache(settings.webhook_owner_cache_size, settings.webhook_owner_cache_ttl_s)
    accounts = CachedTradingAccounts(
        PostgresTradingAccountRepository(connections.pool),
        RedisOwnerChanges(connections.redis.commands),
        cache,
    )
    return closed_with(connections, accounts)
