"""Announcements that a webhook owner changed, for the API processes' caches of the lookup.

Each API process may keep the answers of ``TradingAccountRepository.webhook_owner`` (the live
account of a token digest, its owner, the owner's allowed IPs) for a short time. Whatever
changes one of those (a token rotated, an account deleted or edited, a user disabled or
edited, an allowed IP added or removed) is announced by the owner's user id after the write,
and every process drops what it holds of that user. Delivery is best effort: a process that
misses announcements (disconnected) must know it, and its entries still expire on their own
(docs/security.md, "Webhook owner cache").
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class OwnerChangeListener(Protocol):
    """What a subscription drives: a process's cache of webhook owners."""

    def changed(self, user_id: str) -> None:
        """What the lookup returns for ``user_id``'s tokens may have changed: drop it."""
        ...

    def resubscribed(self) -> None:
        """The subscription is confirmed (at first, or again after an interruption):
        announcements made before may have been missed, so drop everything; from now on
        announcements arrive."""
        ...

    def interrupted(self) -> None:
        """The subscription is lost (or closed): announcements will be missed until the next
        ``resubscribed``, so drop everything and keep nothing meanwhile."""
        ...


@runtime_checkable
class OwnerChanges(Protocol):
    """The channel of those announcements, shared by every process of a deployment."""

    async def publish(self, user_id: str) -> None:
        """Announce a change of ``user_id``'s owner data to every subscribed process (this
        one included), after the write committed. Raises ``KeyValueStoreUnavailable`` when
        the announcement could not be sent."""
        ...

    def subscribe(self, listener: OwnerChangeListener) -> None:
        """Deliver this channel's announcements to ``listener`` from now on (it hears
        ``resubscribed`` once they flow); called from within the event loop."""
        ...

    async def aclose(self) -> None:
        """Stop delivering; every listener hears ``interrupted``."""
        ...
