"""The repositories of the webhook owner data, wrapped so that the lookup can be cached.

``CachedTradingAccounts`` answers ``webhook_owner`` from the process's ``WebhookOwnerCache``
and reads the wrapped repository on a miss. Every write of what that lookup returns goes
through one of the three wrappers here, which announce the owner's user id after the write
(``announce``): this process's cache drops the user at once, and ``OwnerChanges`` tells every
other process. The writes are wrapped rather than the services that make them, so no path
(a service, the admin commands, a worker) can change an owner without the announcement.

An announcement follows every attempted write, even one that failed or was refused: a write
whose answer was lost (a timeout after the commit) may still have landed, and a needless
drop costs one lookup. ``UserRepository.add``/``add_first`` announce nothing: a new user owns
no account yet, so no lookup can have returned it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from tradecore.accounts import TradingAccount
from tradecore.errors import StoreUnavailable
from tradecore.identity import AllowedIp, User
from tradecore.ports.owner_changes import OwnerChanges
from tradecore.ports.repositories import (
    AllowedIpRepository,
    TradingAccountRepository,
    UserRepository,
    WebhookOwner,
)
from tradecore_adapters.owner_cache.cache import WebhookOwnerCache

log = logging.getLogger(__name__)


class OwnerAnnouncer:
    """Drops a user from this process's cache, then announces it to the others."""

    def __init__(self, cache: WebhookOwnerCache, changes: OwnerChanges) -> None:
        self._cache = cache
        self._changes = changes

    async def announce(self, user_id: str) -> None:
        """Never raises for an unsent announcement (the write it follows is done; the other
        processes' entries then expire by age, the stated bound): it logs a warning. The
        sending is shielded, so a cancelled request still announces its write."""
        self._cache.changed(user_id)
        try:
            await asyncio.shield(self._changes.publish(user_id))
        except StoreUnavailable as e:
            ttl_s = self._cache.ttl_s
            log.warning("owner change not announced (%s); other APIs drop it within %g s", e, ttl_s)


class CachedTradingAccounts:
    """A ``TradingAccountRepository`` whose ``webhook_owner`` is cached (see the module
    docstring); ``aclose`` ends the subscription (a listener of the process's stores)."""

    def __init__(
        self,
        accounts: TradingAccountRepository,
        changes: OwnerChanges,
        cache: WebhookOwnerCache,
    ) -> None:
        self._accounts = accounts
        self._changes = changes
        self._cache = cache
        self._subscribed = False
        self.announcer = OwnerAnnouncer(cache, changes)

    @property
    def cache(self) -> WebhookOwnerCache:
        return self._cache

    async def webhook_owner(self, token_hash: str) -> WebhookOwner | None:
        """From the cache when it holds a fresh entry (no database read); else the wrapped
        lookup, kept for the next time when found. The first call subscribes to the
        announcements; the cache serves nothing until the subscription is confirmed."""
        cache = self._cache
        if not cache.enabled:
            return await self._accounts.webhook_owner(token_hash)
        if not self._subscribed:
            self._subscribed = True
            self._changes.subscribe(cache)
        found = cache.get(token_hash)
        if found is not None:
            return found
        ticket = cache.ticket()
        found = await self._accounts.webhook_owner(token_hash)
        if found is not None:
            cache.put(token_hash, found, ticket)
        return found

    async def add(self, account: TradingAccount) -> None:
        try:
            await self._accounts.add(account)
        finally:
            await self.announcer.announce(account.user_id)

    async def get(self, account_id: str) -> TradingAccount | None:
        return await self._accounts.get(account_id)

    async def list_for_user(self, user_id: str) -> list[TradingAccount]:
        return await self._accounts.list_for_user(user_id)

    async def save(
        self,
        account: TradingAccount,
        *,
        previous: TradingAccount,
        guard: Collection[str] = (),
    ) -> TradingAccount | None:
        try:
            return await self._accounts.save(account, previous=previous, guard=guard)
        finally:
            await self.announcer.announce(previous.user_id)
            if account.user_id != previous.user_id:
                await self.announcer.announce(account.user_id)

    async def aclose(self) -> None:
        """Stop the subscription (the cache is bypassed from then on)."""
        await self._changes.aclose()


class AnnouncingUsers:
    """A ``UserRepository`` that announces every ``save`` (see the module docstring)."""

    def __init__(self, users: UserRepository, announcer: OwnerAnnouncer) -> None:
        self._users = users
        self._announcer = announcer

    async def add(self, user: User) -> bool:
        return await self._users.add(user)

    async def add_first(self, user: User) -> bool:
        return await self._users.add_first(user)

    async def any_exist(self) -> bool:
        return await self._users.any_exist()

    async def get(self, user_id: str) -> User | None:
        return await self._users.get(user_id)

    async def by_email(self, email: str) -> User | None:
        return await self._users.by_email(email)

    async def save(self, user: User, *, previous: User, guard: Collection[str] = ()) -> User | None:
        try:
            return await self._users.save(user, previous=previous, guard=guard)
        finally:
            await self._announcer.announce(previous.id)


class AnnouncingAllowedIps:
    """An ``AllowedIpRepository`` that announces every ``add`` and ``remove``."""

    def __init__(self, allowed_ips: AllowedIpRepository, announcer: OwnerAnnouncer) -> None:
        self._allowed_ips = allowed_ips
        self._announcer = announcer

    async def add(self, entry: AllowedIp) -> bool:
        try:
            return await self._allowed_ips.add(entry)
        finally:
            await self._announcer.announce(entry.user_id)

    async def list_for_user(self, user_id: str) -> list[AllowedIp]:
        return await self._allowed_ips.list_for_user(user_id)

    async def remove(self, entry_id: str, user_id: str) -> bool:
        try:
            return await self._allowed_ips.remove(entry_id, user_id)
        finally:
            await self._announcer.announce(user_id)
