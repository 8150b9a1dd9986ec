"""The paper exchange's connections, and the disconnects a test schedules on them."""

from __future__ import annotations

import attrs

from tradecore.errors import BrokerDisconnected


@attrs.define
class _Drop:
    after_calls: int
    refuse_reconnects: int
    fired: bool = False


class Links:
    """Which accounts are connected. A scheduled drop lets ``after_calls`` more calls through,
    then disconnects its account (None: every account); every call then raises
    ``BrokerDisconnected`` until that account connects again, and the first
    ``refuse_reconnects`` connects are refused."""

    def __init__(self) -> None:
        self._connected: set[str] = set()
        self._drops: dict[str | None, _Drop] = {}

    def disconnect(self, account_id: str | None, after_calls: int, refuse_reconnects: int) -> None:
        drop = _Drop(after_calls, refuse_reconnects)
        self._drops[account_id] = drop
        if after_calls == 0:
            self._fire(account_id, drop)

    def connect(self, account_id: str) -> None:
        """Connect ``account_id`` (a no-op when connected), unless a fired drop refuses it."""
        for key in (account_id, None):
            drop = self._drops.get(key)
            if drop is not None and drop.fired:
                if drop.refuse_reconnects > 0:
                    drop.refuse_reconnects -= 1
                    raise BrokerDisconnected("paper broker: reconnect refused")
                del self._drops[key]
        self._connected.add(account_id)

    def check(self, account_id: str) -> None:
        """Count one call of ``account_id``; raise ``BrokerDisconnected`` unless connected."""
        for key in (account_id, None):
            drop = self._drops.get(key)
            if drop is None or drop.fired:
                continue
            if drop.after_calls > 0:
                drop.after_calls -= 1
            else:
                self._fire(key, drop)
        if account_id not in self._connected:
            raise BrokerDisconnected("paper broker: not connected")

    def _fire(self, account_id: str | None, drop: _Drop) -> None:
        drop.fired = True
        if account_id is None:
            self._connected.clear()
        else:
            self._connected.discard(account_id)
