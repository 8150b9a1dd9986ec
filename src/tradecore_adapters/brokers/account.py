"""The account endpoints' broker calls (positions, the credential check), each on a short-lived
connection of its own, never the user's worker's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from decimal import Decimal

from tradecore.accounts import TradingAccount
from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.ports.broker import Broker, BrokerAccount, BrokerAccountSource, BrokerFactory

VENUE_CALL_TIMEOUT_S = 10.0
"""How long a credential check or a positions read may take before the venue counts as
unreachable (503): a person is waiting for the answer."""
REFUSED = "The broker refused the credentials"


class VenueAccountBroker:
    """``AccountBroker`` (the HTTP layer's positions port) and ``CredentialVerifier`` over a
    broker factory. A venue slower than ``timeout_s`` raises ``BrokerDisconnected``."""

    def __init__(
        self,
        brokers: BrokerFactory,
        accounts: BrokerAccountSource,
        *,
        timeout_s: float = VENUE_CALL_TIMEOUT_S,
    ) -> None:
        self._brokers = brokers
        self._accounts = accounts
        self._timeout_s = timeout_s

    async def positions(self, account: TradingAccount) -> Mapping[str, Decimal]:
        """Signed positions by symbol, with the account's stored credentials. Raises
        ``BrokerDisconnected`` (unreachable or too slow) or ``CredentialsRejected``."""
        stored = await self._accounts.broker_account(account.id)
        target = stored or BrokerAccount(account.id, account.broker_name, account.testnet)
        async with self._connected(target) as broker:
            return await broker.positions()

    async def verify(self, account: TradingAccount, credentials: Mapping[str, str]) -> str | None:
        """None when the venue accepts ``credentials`` (its connect makes an authenticated
        read), else the venue's reason. Raises ``BrokerDisconnected`` when the venue cannot
        be reached in time: that is no verdict on the credentials."""
        target = BrokerAccount(
            account.id,
            account.broker_name,
            account.testnet,
            credentials,
            account.credentials_ref,
        )
        try:
            async with self._connected(target):
                return None
        except CredentialsRejected as e:
            return str(e) or REFUSED
        except ValueError:
            return f"The broker {account.broker_name!r} is not supported"

    @asynccontextmanager
    async def _connected(self, account: BrokerAccount) -> AsyncIterator[Broker]:
        broker = self._brokers.open(account, simulation=False)
        try:
            async with asyncio.timeout(self._timeout_s):
                await broker.connect()
                yield broker
        except TimeoutError:
            raise BrokerDisconnected("the broker did not answer in time") from None
        finally:
            await broker.close()
