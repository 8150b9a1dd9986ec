"""A cache of the webhook owner lookup per API process, kept right across processes by
announcements of every change (``tradecore.ports.owner_changes``).

``WebhookOwnerCache`` is the cache; ``CachedTradingAccounts`` answers the lookup from it, and
it and the two other repository wrappers announce every write of the owner data. Technology
free: the announcements travel through whichever ``OwnerChanges`` the wiring gives.
"""

from __future__ import annotations

from tradecore_adapters.owner_cache.cache import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_TTL_S,
    WebhookOwnerCache,
)
from tradecore_adapters.owner_cache.repositories import (
    AnnouncingAllowedIps,
    AnnouncingUsers,
    CachedTradingAccounts,
    OwnerAnnouncer,
)

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_S",
    "AnnouncingAllowedIps",
    "AnnouncingUsers",
    "CachedTradingAccounts",
    "OwnerAnnouncer",
    "WebhookOwnerCache",
]
