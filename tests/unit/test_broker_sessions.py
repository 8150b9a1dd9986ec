"""A worker's broker connections (``BrokerSessions``): opened with the account's credentials,
renewed when an order names newer ones, dropped when the venue refuses them, never given
credentials for a simulation."""

from __future__ import annotations

from decimal import Decimal

import attrs
import pytest

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.ports.broker import Broker, BrokerAccount
from tradecore.ports.crypto import DecryptionFailed
from tradecore.services.execution.broker_sessions import (
    BROKER_RECONNECT_RETRIES,
    BrokerSessions,
    Route,
)
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory

ACCOUNT = "acct-1"


@attrs.define
class Stored:
    """The store's view of the account: its credentials change when the user rotates them."""

    account: BrokerAccount | None
    reads: int = 0
    unreadable: bool = False

    async def broker_account(self, trading_account_id: str) -> BrokerAccount | None:
        self.reads += 1
        if self.unreadable:
            raise DecryptionFailed("bad ciphertext")
        return self.account


class Recording:
    """A paper factory that remembers what each connection was opened for and closes."""

    def __init__(self) -> None:
        self.inner = PaperBrokerFactory(PaperExchange(), PaperExchange(), FakeClock())
        self.opened: list[tuple[BrokerAccount, bool]] = []
        self.closed = 0
        self.refuse = False

    def open(self, account: BrokerAccount, *, simulation: bool) -> Broker:
        self.opened.append((account, simulation))
        broker = self.inner.open(attrs.evolve(account, broker_name="paper"), simulation=simulation)
        factory = self

        class Tracked:
            name = broker.name

            async def connect(self) -> None:
                if factory.refuse:
                    raise CredentialsRejected("API-key format invalid.")
                await broker.connect()

            async def positions(self) -> dict[str, Decimal]:
                return dict(await broker.positions())

            async def close(self) -> None:
                factory.closed += 1

        return Tracked()  # type: ignore[return-value]

    def venues(self) -> frozenset[str]:
        return frozenset({"binanceusdm"})


def venue_account(key: str, ref: str) -> BrokerAccount:
    return BrokerAccount(ACCOUNT, "binanceusdm", False, {"api_key": key}, ref)


def sessions(stored: Stored, factory: Recording) -> BrokerSessions:
    return BrokerSessions(factory, stored, FakeSleeper(FakeClock()))


async def positions(s: BrokerSessions, route: Route) -> object:
    return await s.call(route, lambda broker: broker.positions())


async def test_a_connection_is_opened_once_with_the_stored_credentials() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    s = sessions(stored, factory)
    route = Route(ACCOUNT, "binanceusdm", False, "r1")
    await positions(s, route)
    await positions(s, route)
    await positions(s, Route(ACCOUNT, "binanceusdm", False, None))  # a fill check
    assert [(a.credentials["api_key"], sim) for a, sim in factory.opened] == [("k1", False)]
    assert stored.reads == 1


async def test_an_order_naming_newer_credentials_reconnects_with_them() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    s = sessions(stored, factory)
    await positions(s, Route(ACCOUNT, "binanceusdm", False, "r1"))
    stored.account = venue_account("k2", "r2")  # the user uploaded new keys
    await positions(s, Route(ACCOUNT, "binanceusdm", False, "r2"))
    assert [a.credentials["api_key"] for a, _ in factory.opened] == ["k1", "k2"]
    assert factory.closed == 1


async def test_refused_credentials_close_the_connection_and_are_read_again() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    s = sessions(stored, factory)
    factory.refuse = True
    route = Route(ACCOUNT, "binanceusdm", False, "r1")
    with pytest.raises(CredentialsRejected, match="API-key format invalid"):
        await positions(s, route)
    assert factory.closed == 1
    factory.refuse = False
    await positions(s, route)
    assert stored.reads == 2 and len(factory.opened) == 2


async def test_unreadable_stored_credentials_are_a_refusal_not_a_crash() -> None:
    stored, factory = Stored(venue_account("k1", "r1"), unreadable=True), Recording()
    with pytest.raises(CredentialsRejected, match="upload them again"):
        await positions(sessions(stored, factory), Route(ACCOUNT, "binanceusdm", False, "r1"))
    assert factory.opened == []


async def test_a_simulation_reads_no_credentials() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    await positions(sessions(stored, factory), Route(ACCOUNT, "paper", True, "r9"))
    [(account, simulation)] = factory.opened
    assert simulation and account.credentials == {} and stored.reads == 0


async def test_a_dropped_line_is_reopened_three_times_then_reported() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    s = sessions(stored, factory)
    calls = 0

    async def dropping(broker: Broker) -> None:
        nonlocal calls
        calls += 1
        raise BrokerDisconnected("line dropped")

    with pytest.raises(BrokerDisconnected):
        await s.call(Route(ACCOUNT, "binanceusdm", False, "r1"), dropping)
    assert calls == BROKER_RECONNECT_RETRIES + 1


async def test_close_closes_every_connection() -> None:
    stored, factory = Stored(venue_account("k1", "r1")), Recording()
    s = sessions(stored, factory)
    await positions(s, Route(ACCOUNT, "binanceusdm", False, "r1"))
    await positions(s, Route(ACCOUNT, "paper", True, None))
    await s.close()
    assert factory.closed == 2


def test_credentials_never_appear_in_a_repr() -> None:
    assert "k1" not in repr(venue_account("k1", "r1"))
