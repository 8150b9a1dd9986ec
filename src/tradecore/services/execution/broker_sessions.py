"""One worker's broker connections: at most one per (trading account, simulation), opened on
first use with the account's credentials and kept for the worker's life.

* A route that names a ``credentials_ref`` other than the open connection's (the user
  rotated or re-uploaded the credentials since) closes that connection and opens a new one
  with the credentials stored now: a rotated credential reaches a running worker without a
  restart. The API puts the ref of the account it checked into every order request.
* A dropped connection is re-opened up to ``BROKER_RECONNECT_RETRIES`` times (specification:
  "automatic reconnect, up to 3 retries"), with a growing pause, before ``BrokerDisconnected``
  reaches the caller.
* Credentials the venue refuses (``CredentialsRejected``) close the connection, so the next
  call reads the stored credentials again (the user may have fixed them meanwhile); the
  error reaches the caller at once: retrying refused keys only risks a ban.
* A simulation always goes to the paper broker, which needs no credentials: none are read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.ports.broker import Broker, BrokerAccount, BrokerAccountSource, BrokerFactory
from tradecore.ports.crypto import DecryptionFailed
from tradecore.ports.runtime import Sleeper

log = logging.getLogger(__name__)

BROKER_RECONNECT_RETRIES = 3
RECONNECT_BACKOFF_S = 0.2
CREDENTIALS_UNREADABLE = "The stored broker credentials cannot be read; upload them again"

T = TypeVar("T")


@attrs.frozen
class Route:
    """The connection an order or a fill check goes through. ``credentials_ref`` is the
    version of the credentials the caller expects (None: whatever the open connection uses)."""

    trading_account_id: str
    broker_name: str
    simulation: bool
    credentials_ref: str | None = None


@attrs.define
class _Session:
    broker: Broker
    credentials_ref: str  # the version of the credentials it was opened with
    connected: bool = False


class BrokerSessions:
    """The broker connections of one user's worker (see the module doc)."""

    def __init__(
        self, brokers: BrokerFactory, accounts: BrokerAccountSource, sleeper: Sleeper
    ) -> None:
        self._brokers = brokers
        self._accounts = accounts
        self._sleeper = sleeper
        self._open: dict[tuple[str, bool], _Session] = {}

    async def call(self, route: Route, call: Callable[[Broker], Awaitable[T]]) -> T:
        """Run ``call`` on the route's connection, opening (or re-opening) it as the module
        doc says. Raises ``BrokerDisconnected`` after the last reconnect failed,
        ``CredentialsRejected`` when the venue refuses the credentials, ``StoreUnavailable``
        when the credentials could not be read."""
        key = (route.trading_account_id, route.simulation)
        session = await self._session(key, route)
        for attempt in range(BROKER_RECONNECT_RETRIES + 1):
            try:
                if attempt:
                    await self._sleeper.sleep(RECONNECT_BACKOFF_S * attempt)
                if attempt or not session.connected:
                    await session.broker.connect()
                    session.connected = True
                return await call(session.broker)
            except BrokerDisconnected:
                session.connected = False
                if attempt == BROKER_RECONNECT_RETRIES:
                    raise
                log.warning("broker disconnected (account %s); reconnecting", key[0])
            except CredentialsRejected:
                await self._close(key)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close every connection (the worker stops)."""
        for key in list(self._open):
            await self._close(key)

    async def _session(self, key: tuple[str, bool], route: Route) -> _Session:
        session = self._open.get(key)
        wanted = None if route.simulation else route.credentials_ref
        if session is not None and (wanted is None or wanted == session.credentials_ref):
            return session
        if session is not None:
            log.info("credentials of account %s changed; reconnecting with them", key[0])
            await self._close(key)
        account = await self._account(route)
        opened = self._brokers.open(account, simulation=route.simulation)
        session = _Session(opened, account.credentials_ref)
        self._open[key] = session
        return session

    async def _account(self, route: Route) -> BrokerAccount:
        """What the connection is opened for: the stored account, credentials in clear (none
        for a simulation, or for an account no longer stored: the venue refuses it then)."""
        bare = BrokerAccount(route.trading_account_id, route.broker_name)
        if route.simulation:
            return bare
        try:
            stored = await self._accounts.broker_account(route.trading_account_id)
        except DecryptionFailed:
            raise CredentialsRejected(CREDENTIALS_UNREADABLE) from None
        return stored if stored is not None else bare

    async def _close(self, key: tuple[str, bool]) -> None:
        session = self._open.pop(key, None)
        if session is None:
            return
        try:
            await session.broker.close()
        except Exception:
            log.warning("closing the broker connection of account %s failed", key[0])
