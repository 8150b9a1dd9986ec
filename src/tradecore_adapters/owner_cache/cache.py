"""One API process's cache of webhook owners (``TradingAccountRepository.webhook_owner``).

Bounded three ways, so that a revoked token, a deleted account or a removed allowed IP stops
working everywhere soon (docs/security.md, "Webhook owner cache"):

* by age: an entry is served for at most ``ttl_s`` seconds after the lookup that filled it
  began, whatever else happens (announcements lost, a publisher that could not publish);
* by announcement: ``changed(user_id)`` drops every entry of that user at once, and a lookup
  that was reading the database while the announcement came does not store its answer, which
  may predate the change (each fill carries the ``ticket`` taken before its read);
* by subscription: until the listener is confirmed subscribed (``resubscribed``) and after it
  is lost (``interrupted``) the cache is bypassed: nothing is served and nothing is stored.

Only found owners are kept: an unknown token is not cached, so random tokens sprayed at the
webhook cannot push the real owners out (they cost one indexed probe each, as before).
Entries beyond ``max_entries`` go least recently used first. Not thread-safe: one event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import attrs

from tradecore.ports.repositories import WebhookOwner

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_TTL_S = 60.0
TRACKED_DROPS = 4096
"""Users whose latest drop is remembered to refuse stale fills; an older drop is summed up
by one floor generation (a fill that began before it is refused, which is only ever safe)."""


@attrs.frozen
class _Entry:
    owner: WebhookOwner
    born: float  # monotonic time the filling lookup began


class WebhookOwnerCache:
    """Token digest -> ``WebhookOwner`` (see the module docstring); an
    ``OwnerChangeListener``. ``monotonic`` is the clock of the ages (injected by tests)."""

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 0 or not ttl_s > 0:
            raise ValueError("a cache holds zero or more entries for a positive time")
        self._max = max_entries
        self._ttl_s = ttl_s
        self._monotonic = monotonic
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tokens_of: dict[str, set[str]] = {}
        self._generation = 0
        self._dropped_at: OrderedDict[str, int] = OrderedDict()
        self._floor = 0
        self._live = False

    @property
    def enabled(self) -> bool:
        """False when configured with no room (``max_entries`` 0): always bypassed."""
        return self._max > 0

    @property
    def live(self) -> bool:
        """True while announcements are known to arrive: only then is anything served."""
        return self._live

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token_hash: str) -> WebhookOwner | None:
        """The cached owner of ``token_hash`` while fresh and live; None otherwise (look it up,
        taking a ``ticket`` first). The answer is shared: never change it."""
        if not self._live:
            return None
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        age = self._monotonic() - entry.born
        if not 0 <= age < self._ttl_s:  # a clock that went back counts as expired too
            self._remove(token_hash)
            return None
        self._entries.move_to_end(token_hash)
        return entry.owner

    def ticket(self) -> tuple[int, float]:
        """Taken just before a database lookup, handed back to ``put`` with its answer."""
        return self._generation, self._monotonic()

    def put(self, token_hash: str, owner: WebhookOwner, ticket: tuple[int, float]) -> bool:
        """Keep ``owner`` (the lookup's answer) unless the cache is bypassed or the owner's
        user was dropped since ``ticket`` was taken (the answer may predate that change).
        True when kept."""
        generation, began = ticket
        user_id = owner.user.id
        if not (self._live and self._max > 0):
            return False
        if self._dropped_at.get(user_id, self._floor) > generation:
            return False
        self._remove(token_hash)
        self._entries[token_hash] = _Entry(owner, began)
        self._tokens_of.setdefault(user_id, set()).add(token_hash)
        while len(self._entries) > self._max:
            self._remove(next(iter(self._entries)))
        return True

    # --- OwnerChangeListener ----------------------------------------------------------------

    def changed(self, user_id: str) -> None:
        """Drop every entry of ``user_id`` and refuse fills that began before now."""
        self._generation += 1
        self._dropped_at[user_id] = self._generation
        self._dropped_at.move_to_end(user_id)
        while len(self._dropped_at) > TRACKED_DROPS:
            _, generation = self._dropped_at.popitem(last=False)
            self._floor = max(self._floor, generation)
        for token_hash in self._tokens_of.pop(user_id, set()):
            self._entries.pop(token_hash, None)

    def resubscribed(self) -> None:
        self._drop_all()
        self._live = True

    def interrupted(self) -> None:
        self._live = False
        self._drop_all()

    def _drop_all(self) -> None:
        self._generation += 1
        self._floor = self._generation
        self._dropped_at.clear()
        self._entries.clear()
        self._tokens_of.clear()

    def _remove(self, token_hash: str) -> None:
        entry = self._entries.pop(token_hash, None)
        if entry is None:
            return
        user_id = entry.owner.user.id
        tokens = self._tokens_of.get(user_id)
        if tokens is not None:
            tokens.discard(token_hash)
            if not tokens:
                del self._tokens_of[user_id]
