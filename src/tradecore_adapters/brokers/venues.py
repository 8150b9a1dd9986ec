"""Every venue behind the core's ``BrokerFactory`` and ``InstrumentDirectory``: the paper
broker, the ccxt venues (``binanceusdm``, ``binance``, ``bybit``) and Alpaca (``alpaca``).

A simulation always trades on the paper broker, whatever venue the account names; real
orders go to the account's venue. Which venues exist is configuration (``VENUES`` in the
composition root); the paper broker is always there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tradecore.ports.broker import Broker, BrokerAccount, BrokerFactory, InstrumentDirectory
from tradecore_adapters.brokers.registry import PAPER


class VenueConnector(Protocol):
    """One real venue: opens account connections and lists the venue's instruments."""

    @property
    def name(self) -> str: ...

    def open(self, account: BrokerAccount) -> Broker: ...

    async def symbols(self, *, testnet: bool) -> frozenset[str]: ...


class VenueBrokerFactory:
    """``BrokerFactory`` routing by the account's venue; simulations and paper accounts go
    to ``paper``."""

    def __init__(self, paper: BrokerFactory, connectors: Mapping[str, VenueConnector]) -> None:
        self._paper = paper
        self._connectors = dict(connectors)

    def open(self, account: BrokerAccount, *, simulation: bool) -> Broker:
        if simulation or account.broker_name == PAPER:
            return self._paper.open(account, simulation=simulation)
        connector = self._connectors.get(account.broker_name)
        if connector is None:
            raise ValueError(f"unknown broker {account.broker_name!r}")
        return connector.open(account)

    def venues(self) -> frozenset[str]:
        return self._paper.venues() | frozenset(self._connectors)


class VenueInstrumentDirectory:
    """``InstrumentDirectory`` over the paper catalogue and each venue's market list."""

    def __init__(
        self, paper: InstrumentDirectory, connectors: Mapping[str, VenueConnector]
    ) -> None:
        self._paper = paper
        self._connectors = dict(connectors)

    def venues(self) -> frozenset[str]:
        return self._paper.venues() | frozenset(self._connectors)

    async def symbols(self, broker_name: str, *, testnet: bool = False) -> frozenset[str]:
        connector = self._connectors.get(broker_name)
        if connector is None:
            return await self._paper.symbols(broker_name, testnet=testnet)
        return await connector.symbols(testnet=testnet)
