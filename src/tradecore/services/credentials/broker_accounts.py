"""The broker account of a trading account as a worker opens it: venue, environment and the
credentials in clear (``BrokerAccountSource``).

Read from the trading-account store on demand, never cached here: the worker asks again when
an order names a newer ``credentials_ref`` than its open connection uses, so a rotated or
re-uploaded credential reaches a running worker without a restart.
"""

from __future__ import annotations

from tradecore.accounts import TradingAccount
from tradecore.ports.broker import BrokerAccount
from tradecore.ports.repositories import TradingAccountRepository
from tradecore.services.credentials.credential_vault import CredentialVault


class StoredBrokerAccounts:
    """``BrokerAccountSource`` over the trading-account store and the credential vault."""

    def __init__(self, accounts: TradingAccountRepository, vault: CredentialVault) -> None:
        self._accounts = accounts
        self._vault = vault

    async def broker_account(self, trading_account_id: str) -> BrokerAccount | None:
        account = await self._accounts.get(trading_account_id)
        if account is None:
            return None
        return await self.of(account)

    async def of(self, account: TradingAccount) -> BrokerAccount:
        """``account``'s broker account. Raises ``DecryptionFailed`` when its stored
        credentials do not open."""
        return BrokerAccount(
            trading_account_id=account.id,
            broker_name=account.broker_name,
            testnet=account.testnet,
            credentials=await self._vault.open(account),
            credentials_ref=account.credentials_ref,
        )
