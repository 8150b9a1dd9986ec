"""The account endpoints' broker calls (positions, credential checks) on a paper exchange."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from tradecore.accounts import TradingAccount
from tradecore.ports.broker import BrokerFactory


class PaperAccountBroker:
    """``AccountBroker`` (the HTTP layer's positions port) and ``CredentialVerifier`` over a
    broker factory: a short-lived connection per call, never the user's worker's."""

    def __init__(self, brokers: BrokerFactory) -> None:
        self._brokers = brokers

    async def positions(self, account: TradingAccount) -> Mapping[str, Decimal]:
        """Signed positions by symbol; raises when the broker cannot be reached."""
        broker = self._brokers.open(account.id, account.broker_name, simulation=False)
        await broker.connect()
        return await broker.positions()

    async def verify(self, account: TradingAccount, credentials: Mapping[str, str]) -> str | None:
        """None when the broker takes the connection (the paper broker needs no credentials
        and accepts any), else the reason to show."""
        try:
            broker = self._brokers.open(account.id, account.broker_name, simulation=False)
            await broker.connect()
        except Exception as e:
            return f"The broker refused the connection ({type(e).__name__})"
        return None
