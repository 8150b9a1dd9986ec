"""Memory repositories where another request's change lands just before a save: the lost
read-modify-write races of the services, made deterministic."""

from __future__ import annotations

from collections.abc import Callable, Collection

from tradecore.accounts import TradingAccount
from tradecore.identity import User
from tradecore_adapters.memory.repositories import (
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)


class RacingUsers(MemoryUserRepository):
    """Before each save, the next of ``races`` (the other request: stored user -> what it
    stores) is applied to the stored user first. ``saves`` counts the saves asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.races: list[Callable[[User], User]] = []
        self.saves = 0

    async def save(self, user: User, *, previous: User, guard: Collection[str] = ()) -> User | None:
        self.saves += 1
        if self.races:
            current = self._by_id[previous.id]
            assert await super().save(self.races.pop(0)(current), previous=current)
        return await super().save(user, previous=previous, guard=guard)


class RacingAccounts(MemoryTradingAccountRepository):
    """Like ``RacingUsers``, for trading accounts."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.races: list[Callable[[TradingAccount], TradingAccount]] = []
        self.saves = 0

    async def save(
        self,
        account: TradingAccount,
        *,
        previous: TradingAccount,
        guard: Collection[str] = (),
    ) -> TradingAccount | None:
        self.saves += 1
        if self.races:
            current = self._accounts[previous.id]
            assert await super().save(self.races.pop(0)(current), previous=current)
        return await super().save(account, previous=previous, guard=guard)
