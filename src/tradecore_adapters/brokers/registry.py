"""The paper broker behind the core's ``BrokerFactory`` and ``InstrumentDirectory`` ports.

Real orders of paper accounts trade on one exchange, simulated orders (``?simulation=true``)
on another, so a simulation never moves the real book.
"""

from __future__ import annotations

from tradecore.ports.broker import BrokerAccount
from tradecore.ports.prices import PriceSource
from tradecore.ports.runtime import Clock, Sleeper
from tradecore_adapters.brokers.paper import PaperBroker, PaperConditions, PaperExchange

PAPER = "paper"


class PaperBrokerFactory:
    """Opens paper connections: ``simulation`` always uses the simulation exchange. With
    ``prices`` both exchanges take each new order's price from that source (None: the
    exchanges' own prices, the catalogue's until a test sets one)."""

    def __init__(
        self,
        exchange: PaperExchange,
        simulation_exchange: PaperExchange,
        clock: Clock,
        *,
        conditions: PaperConditions | None = None,
        sleeper: Sleeper | None = None,
        prices: PriceSource | None = None,
    ) -> None:
        self._exchange = exchange
        self._simulation_exchange = simulation_exchange
        self._clock = clock
        self._conditions = conditions
        self._sleeper = sleeper
        self._prices = prices

    def open(self, account: BrokerAccount, *, simulation: bool) -> PaperBroker:
        """A new, not yet connected broker for the account; raises ValueError for a broker
        name other than ``paper`` on a real order (the venue factory routes the others)."""
        exchange = self._simulation_exchange if simulation else self._exchange
        if not simulation and account.broker_name != PAPER:
            raise ValueError(f"unknown broker {account.broker_name!r}")
        return PaperBroker(
            exchange,
            account.trading_account_id,
            self._clock,
            conditions=self._conditions,
            sleeper=self._sleeper,
            prices=self._prices,
        )

    def venues(self) -> frozenset[str]:
        return frozenset({PAPER})


class PaperInstrumentDirectory:
    """The paper catalogue's symbols for ``paper``; nothing for any other broker."""

    def __init__(self, exchange: PaperExchange) -> None:
        self._exchange = exchange

    def venues(self) -> frozenset[str]:
        return frozenset({PAPER})

    async def symbols(self, broker_name: str, *, testnet: bool = False) -> frozenset[str]:
        return self._exchange.symbols() if broker_name == PAPER else frozenset()
