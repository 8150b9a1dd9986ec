"""Price sources of the paper broker (``tradecore.ports.prices.PriceSource``).

* ``StaticPrices``: the catalogue's reference prices, which never move (the default, for tests
  and ``make run``: no network).
* ``CcxtTickerPrices``: the last price of a ccxt venue's public ticker (no credentials), for
  the paper catalogue's crypto perpetuals (BTCUSDT, ETHUSDT): the venue's tradable market with
  the same id (the linear perpetual on ``binanceusdm`` and ``bybit``, the spot pair on
  ``binance``). Every other symbol (ES, MES, EURUSD, AAPL) gets None, so it keeps its static
  price. Each price is kept ``ttl_s`` (2 s): a burst of orders makes one ticker request, and
  concurrent askers of one symbol share it. A venue that cannot answer is asked again only
  after ``ttl_s``; meanwhile, and then, the last price it gave is answered (with a warning
  logged), or None before it ever gave one.

Each refresh opens its own ccxt exchange and closes it when done (the venue's market list is
loaded once an hour and handed to each), so nothing stays open between orders and the
source works on whichever event loop asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import attrs
from ccxt.base import errors as ccxt_errors

from tradecore_adapters.brokers.catalogue import Instrument, InstrumentKind, default_catalogue
from tradecore_adapters.brokers.ccxt_venue import (
    DEFAULT_TIMEOUT_MS,
    DIALECTS,
    MARKETS_TTL_S,
    CcxtVenue,
    tradable,
)

log = logging.getLogger(__name__)

DEFAULT_PRICE_VENUE = "binanceusdm"
PRICE_TTL_S = 2.0
"""How long a ticker price is used before the venue is asked again."""


class StaticPrices:
    """The catalogue's reference prices: what paper orders filled at before prices moved."""

    def __init__(self, catalogue: Mapping[str, Instrument] | None = None) -> None:
        instruments = catalogue if catalogue is not None else default_catalogue()
        self._prices = {symbol: i.reference_price for symbol, i in instruments.items()}

    async def price(self, symbol: str) -> Decimal | None:
        return self._prices.get(symbol)


def crypto_perpetuals(catalogue: Mapping[str, Instrument] | None = None) -> frozenset[str]:
    """The catalogue's symbols a crypto venue quotes: its crypto perpetuals."""
    instruments = catalogue if catalogue is not None else default_catalogue()
    return frozenset(s for s, i in instruments.items() if i.kind is InstrumentKind.CRYPTO_PERP)


class UnusableTicker(Exception):
    """The venue answered a ticker without a usable last price."""


@attrs.define
class _Quote:
    """The last price read for a symbol (None: none yet) and when the venue was last asked."""

    price: Decimal | None
    asked_at: float


class CcxtTickerPrices:
    """Prices from a ccxt venue's public ticker (see the module doc).

    ``endpoint`` replaces the scheme and host of the venue's URLs (a proxy, a local venue
    emulator in tests), as ``CcxtVenue``'s does; ``config`` adds ccxt settings; ``clock`` is
    the monotonic clock the cache runs on."""

    def __init__(
        self,
        exchange_id: str = DEFAULT_PRICE_VENUE,
        *,
        endpoint: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        ttl_s: float = PRICE_TTL_S,
        symbols: Iterable[str] | None = None,
        config: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        dialect = DIALECTS.get(exchange_id)
        if dialect is None:
            raise ValueError(f"no ccxt venue {exchange_id!r}; known: {', '.join(DIALECTS)}")
        # closing an exchange after each refresh need not wait for its TLS shutdown: the
        # loop goes on running (ccxt's pause is for a loop about to stop)
        settings = {"timeout_on_exit": 0, **(config or {})}
        self._venue = CcxtVenue(dialect, endpoint=endpoint, timeout_ms=timeout_ms, config=settings)
        self._ttl_s = ttl_s
        self._symbols = frozenset(crypto_perpetuals() if symbols is None else symbols)
        self._clock = clock
        self._quotes: dict[str, _Quote] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._markets: tuple[float, dict[str, dict[str, Any]]] | None = None
        self._markets_lock = asyncio.Lock()

    @property
    def venue(self) -> str:
        return self._venue.name

    async def price(self, symbol: str) -> Decimal | None:
        if symbol not in self._symbols:
            return None
        quote = self._fresh(symbol)
        if quote is not None:
            return quote.price
        lock = self._locks.setdefault(symbol, asyncio.Lock())
        async with lock:
            quote = self._fresh(symbol)  # another asker may have refreshed it meanwhile
            if quote is not None:
                return quote.price
            return await self._refresh(symbol)

    async def close(self) -> None:
        """Nothing to release: each refresh closes its own exchange."""

    def _fresh(self, symbol: str) -> _Quote | None:
        quote = self._quotes.get(symbol)
        if quote is not None and self._clock() - quote.asked_at < self._ttl_s:
            return quote
        return None

    async def _refresh(self, symbol: str) -> Decimal | None:
        """Ask the venue; on failure keep (and answer) the last price, logging why."""
        previous = self._quotes.get(symbol)
        last = previous.price if previous is not None else None
        asked_at = self._clock()
        try:
            price = await self._ticker(symbol)
        except (ccxt_errors.BaseError, UnusableTicker) as e:
            kept = "no price yet" if last is None else f"keeping {last:f}"
            log.warning(
                "paper prices: %s ticker of %s unavailable (%s); %s",
                self.venue,
                symbol,
                type(e).__name__,
                kept,
            )
            price = last
        self._quotes[symbol] = _Quote(price, asked_at)
        return price

    async def _ticker(self, symbol: str) -> Decimal | None:
        """The venue's last price of ``symbol``; None when the venue has no such market.
        Raises ccxt's errors, or UnusableTicker for an answer without a usable price."""
        exchange = self._venue.exchange({}, testnet=False)
        try:
            market = (await self._load_markets(exchange)).get(symbol)
            if market is None:
                return None
            if exchange.markets is None:
                exchange.set_markets([market])
            ticker = await exchange.fetch_ticker(market["symbol"])
        finally:
            await exchange.close()
        return _positive(ticker.get("last"))

    async def _load_markets(self, exchange: Any) -> dict[str, dict[str, Any]]:
        """The venue's tradable markets by id, loaded through ``exchange`` at most once per
        ``MARKETS_TTL_S``."""
        async with self._markets_lock:  # two symbols refreshing at once load them once
            if self._markets is not None and self._clock() - self._markets[0] < MARKETS_TTL_S:
                return self._markets[1]
            markets = await exchange.load_markets()
            found = tradable(self._venue.dialect, markets.values())
            self._markets = (self._clock(), found)
            return found


def _positive(value: object) -> Decimal:
    """``value`` as a finite decimal above zero; UnusableTicker otherwise."""
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise UnusableTicker(f"not a price: {value!r}") from None
    if not price.is_finite() or price <= 0:
        raise UnusableTicker(f"not a price: {value!r}")
    return price
