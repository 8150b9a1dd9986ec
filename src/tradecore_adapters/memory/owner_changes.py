"""``OwnerChanges`` within one process: every announcement reaches every listener at once.

The embedded runtime does not cache webhook owners (its lookup is already a read of this
process's dictionaries, and there is no other process to tell), so this serves the caches of
several simulated API processes in one test, and is the reference the Redis adapter's
contract test compares with. A listener is live from ``subscribe`` until ``aclose``.
"""

from __future__ import annotations

from tradecore.ports.owner_changes import OwnerChangeListener


class MemoryOwnerChanges:
    """Synchronous fan-out to the subscribed listeners."""

    def __init__(self) -> None:
        self._listeners: list[OwnerChangeListener] = []
        self.published: list[str] = []
        """Every user id announced, oldest first (for tests)."""

    async def publish(self, user_id: str) -> None:
        self.published.append(user_id)
        for listener in self._listeners:
            listener.changed(user_id)

    def subscribe(self, listener: OwnerChangeListener) -> None:
        self._listeners.append(listener)
        listener.resubscribed()

    async def aclose(self) -> None:
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.interrupted()
