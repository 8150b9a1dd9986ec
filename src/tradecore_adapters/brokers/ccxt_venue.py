"""Crypto venues through ccxt (``ccxt.async_support``): Binance USDⓈ-M futures (``binanceusdm``),
Binance spot (``binance``) and Bybit linear perpetuals (``bybit``).

What a ``CcxtBroker`` (one account's connection, owned by its worker) does:

* ``connect`` loads the venue's markets once per connection (never per order) and makes an
  authenticated read (the balance), so refused keys surface as ``CredentialsRejected`` at
  once.
* Orders are market orders under the venue client id ``client_ids.venue_client_id`` derives
  from the core's id. Placing is idempotent: a caller that cannot rule out an earlier attempt
  (``fresh`` False) looks the id up first; a duplicate-id refusal, a timeout or a dropped line
  during the placement is resolved by fetching the order by its client id, never by placing
  it again (when the lookup finds nothing the call raises ``BrokerDisconnected`` and the
  worker's retry looks it up once more before placing).
* Exits and closes are reduce-only on derivatives. tradecore keeps one signed position per
  symbol, so it trades one-way accounts: a hedge-mode (two-way) account's order is refused by
  the venue itself (Binance -4061, Bybit "position idx not match position mode") and
  answered ``position_mode_mismatch``, which tells the user to switch to one-way mode.
  The mode is not read up front: Binance's position-mode query weighs 30, and ccxt's rate
  limiter would hold the next call of a fresh connection back by 1.5 s.
* A quantity the venue's step does not divide, or below its minimum, is refused here with
  ``invalid_quantity`` rather than rounded: a trader gets exactly the size the alert sent.
* ccxt's rate limiter is on, over a rolling minute (``RATE_LIMITER``); a venue's 429/418
  becomes ``broker_rate_limited`` with the venue's ``Retry-After``.

Symbols are the venue's ids (``BTCUSDT``); ccxt's unified names stay inside this module.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import attrs
import ccxt.async_support as ccxt_async
from ccxt.base import errors as ccxt_errors

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.orders import OrderError, RejectionCode, Side
from tradecore.ports.broker import BrokerAccount, BrokerOrder, BrokerOrderStatus
from tradecore_adapters.brokers.client_ids import venue_client_id
from tradecore_adapters.brokers.venue_errors import (
    coded,
    rejection,
    retry_after_s,
    venue_detail,
)


class _NoWireDumps(logging.Filter):
    """ccxt logs every request's headers (the API key among them) and body at DEBUG level:
    such records are dropped, whatever level an operator sets, so no credential reaches a
    log (found by tests/http/test_http_venues.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG


logging.getLogger("ccxt.base.exchange").addFilter(_NoWireDumps())

RATE_LIMITER = {"rateLimiterAlgorithm": "rollingWindow", "rollingWindowSize": 60_000}
"""ccxt's rate limiter, counting each venue's request weights over a rolling minute (the budget
is ccxt's ``rateLimit`` per weight unit: 1,200 per minute on Binance) instead of its default
leaky bucket. That bucket refills only while a request waits (ccxt 4.5.90), so every call
waited the previous call's weight times ``rateLimit`` however long ago it was: 50-200 ms per
Binance call and 100-150 ms per Bybit call even with orders a second apart, plus CPU spent
polling (bench/venue_adapter.py, docs/performance.md)."""

MARKETS_TTL_S = 3600.0
"""How long the API keeps a venue's public market list before loading it again."""
DEFAULT_TIMEOUT_MS = 10_000


@attrs.frozen
class CcxtDialect:
    """How tradecore uses one ccxt exchange: the markets it trades (``market_type`` swap
    (linear) or spot), the options that keep ``load_markets`` to those, the venue family
    (error codes, order lookup) and the client-id length the venue takes."""

    exchange_id: str
    family: str
    market_type: str
    options: Mapping[str, Any]
    client_id_length: int = 36
    error_table: str | None = None
    """ccxt's market-specific error table, which ccxt picks by the venue's host name; with
    ``endpoint`` set it is merged into the common table so the same refusals map the same."""
    test_environment: str = "sandbox"
    """How the venue's test environment is reached: ``sandbox`` (its testnet URLs) or
    ``demo`` (Binance futures: the testnet is retired in favour of demo trading)."""

    @property
    def derivatives(self) -> bool:
        return self.market_type == "swap"


DIALECTS: dict[str, CcxtDialect] = {
    "binanceusdm": CcxtDialect(
        "binanceusdm",
        "binance",
        "swap",
        {"defaultType": "future", "fetchCurrencies": False},
        error_table="linear",
        test_environment="demo",
    ),
    "binance": CcxtDialect(
        "binance",
        "binance",
        "spot",
        {
            "defaultType": "spot",
            "fetchCurrencies": False,
            "fetchMargins": False,
            "fetchMarkets": {"types": ["spot"]},
        },
        error_table="spot",
    ),
    "bybit": CcxtDialect(
        "bybit",
        "bybit",
        "swap",
        {
            "defaultType": "swap",
            "defaultSubType": "linear",
            "fetchCurrencies": False,
            "fetchMarkets": {"types": ["linear"]},
            "enableUnifiedAccount": True,
            "enableUnifiedMargin": False,
        },
    ),
}


def _decimal(value: object, default: Decimal = Decimal(0)) -> Decimal:
    if value is None or value == "":
        return default
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return default


class CcxtVenue:
    """One ccxt exchange as tradecore uses it: opens account connections and keeps the
    public market lists (per environment) for the API.

    ``endpoint`` replaces the scheme and host of every URL ccxt would call (a local venue
    emulator in tests, a proxy in production); None keeps the venue's own. ``config`` adds
    ccxt settings (tests shorten ccxt's pacing with ``rateLimit`` and ``timeout_on_exit``)."""

    def __init__(
        self,
        dialect: CcxtDialect,
        *,
        endpoint: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.dialect = dialect
        self._endpoint = endpoint
        self._timeout_ms = timeout_ms
        self._config = dict(config or {})
        self._listings: dict[bool, tuple[float, frozenset[str]]] = {}
        self._listing_lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.dialect.exchange_id

    def exchange(self, credentials: Mapping[str, str], *, testnet: bool) -> Any:
        """A new ccxt exchange for ``credentials`` (``api_key``, ``api_secret``, and
        ``password`` for venues that need a passphrase), in the venue's test environment when
        ``testnet``. Raises ``ValueError`` when the venue has none."""
        config: dict[str, Any] = {
            "enableRateLimit": True,
            **RATE_LIMITER,
            "timeout": self._timeout_ms,
            "options": dict(self.dialect.options),
            **self._config,
        }
        if credentials.get("api_key"):
            config["apiKey"] = credentials["api_key"]
        if credentials.get("api_secret"):
            config["secret"] = credentials["api_secret"]
        if credentials.get("password"):
            config["password"] = credentials["password"]
        exchange = getattr(ccxt_async, self.dialect.exchange_id)(config)
        exchange.has["fetchCurrencies"] = False  # markets suffice; currencies cost signed calls
        if testnet:
            try:
                if self.dialect.test_environment == "demo":
                    exchange.enable_demo_trading(True)
                else:
                    exchange.set_sandbox_mode(True)
            except ccxt_errors.NotSupported as e:
                raise ValueError(f"{self.name} has no test environment") from e
        if self._endpoint is not None:
            exchange.urls["api"] = _rebased(exchange.urls["api"], self._endpoint)
            _merge_error_table(exchange, self.dialect.error_table)
        return exchange

    def open(self, account: BrokerAccount) -> CcxtBroker:
        return CcxtBroker(self, account)

    async def symbols(self, *, testnet: bool) -> frozenset[str]:
        """The venue's tradable ids (public markets), loaded at most every ``MARKETS_TTL_S``.
        Raises ``BrokerDisconnected`` when they cannot be loaded."""
        cached = self._listings.get(testnet)
        if cached is not None and time.monotonic() - cached[0] < MARKETS_TTL_S:
            return cached[1]
        async with self._listing_lock:
            cached = self._listings.get(testnet)
            if cached is not None and time.monotonic() - cached[0] < MARKETS_TTL_S:
                return cached[1]
            exchange = self.exchange({}, testnet=testnet)
            try:
                markets = await exchange.load_markets()
            except ccxt_errors.BaseError as e:
                raise BrokerDisconnected(f"{self.name}: markets could not be loaded") from e
            finally:
                await exchange.close()
            listed = frozenset(tradable(self.dialect, markets.values()))
            self._listings[testnet] = (time.monotonic(), listed)
            return listed


def _rebased(urls: Any, endpoint: str) -> Any:
    """ccxt's URL table with every URL's scheme and host replaced by ``endpoint``'s."""
    if isinstance(urls, str):
        parts = urllib.parse.urlsplit(urls)
        return endpoint.rstrip("/") + parts.path
    if isinstance(urls, dict):
        return {key: _rebased(value, endpoint) for key, value in urls.items()}
    return urls


def _merge_error_table(exchange: Any, table: str | None) -> None:
    """Merge ccxt's market-specific error table into its common one (ccxt chooses it by the
    venue's host, which an endpoint override replaces); the market's broad keys first."""
    tables = exchange.exceptions
    specific = tables.get(table, {}) if table is not None else {}
    if not specific:
        return
    tables["exact"] = {**tables["exact"], **specific.get("exact", {})}
    broad = specific.get("broad", {})
    tables["broad"] = broad | {k: v for k, v in tables["broad"].items() if k not in broad}


def tradable(dialect: CcxtDialect, markets: Any) -> dict[str, dict[str, Any]]:
    """The active markets of the dialect's type (linear perpetuals or spot), by venue id."""
    found: dict[str, dict[str, Any]] = {}
    for market in markets:
        if market.get("active") is False or market.get("type") != dialect.market_type:
            continue
        if dialect.derivatives and not market.get("linear"):
            continue
        found[str(market["id"])] = market
    return found


class CcxtBroker:
    """One account's connection to a ccxt venue (``tradecore.ports.broker.Broker``; see the
    module doc)."""

    def __init__(self, venue: CcxtVenue, account: BrokerAccount) -> None:
        self._venue = venue
        self._dialect = venue.dialect
        self._account = account
        self._exchange: Any = None
        self._markets: dict[str, dict[str, Any]] = {}

    @property
    def name(self) -> str:
        return self._dialect.exchange_id

    @property
    def placements_wait_for_outcome(self) -> bool:
        return False

    async def connect(self) -> None:
        if self._exchange is None:
            try:
                self._exchange = self._venue.exchange(
                    self._account.credentials, testnet=self._account.testnet
                )
            except ValueError as e:
                raise CredentialsRejected(str(e)) from None
        exchange = self._exchange
        await self._guarded(self._load_markets())
        await self._guarded(exchange.fetch_balance())

    async def close(self) -> None:
        if self._exchange is not None:
            exchange, self._exchange = self._exchange, None
            await exchange.close()

    async def instruments(self) -> frozenset[str]:
        self._require()
        return frozenset(self._markets)

    async def positions(self) -> Mapping[str, Decimal]:
        exchange = self._require()
        held: dict[str, Decimal] = {}
        if self._dialect.derivatives:
            for position in await self._guarded(exchange.fetch_positions()):
                market_id = self._id_of(position.get("symbol"))
                contracts = _decimal(position.get("contracts"))
                if market_id is None or contracts == 0:
                    continue
                signed = -contracts if position.get("side") == "short" else contracts
                held[market_id] = held.get(market_id, Decimal(0)) + signed
            return held
        totals = (await self._guarded(exchange.fetch_balance())).get("total", {})
        for market_id, market in self._markets.items():
            amount = _decimal(totals.get(market["base"]))
            if amount != 0:
                held[market_id] = amount
        return held

    async def place_order(
        self,
        client_order_id: str,
        symbol: str,
        side: Side,
        quantity: Decimal,
        *,
        reduce_only: bool = False,
        fresh: bool = False,
    ) -> BrokerOrder:
        exchange = self._require()

        def refused(error: OrderError) -> BrokerOrder:
            return BrokerOrder.refused(
                client_order_id, symbol, side, quantity, error, reduce_only=reduce_only
            )

        market = self._markets.get(symbol)
        if market is None:
            return refused(rejection(RejectionCode.INVALID_SYMBOL, None))
        problem = self._quantity_problem(market, quantity)
        if problem is not None:
            return refused(rejection(RejectionCode.INVALID_QUANTITY, problem))
        venue_id = venue_client_id(client_order_id, self._dialect.client_id_length)
        if not fresh:
            earlier = await self._find(venue_id, client_order_id, market, reduce_only)
            if earlier is not None:
                return earlier
        params: dict[str, Any] = {"clientOrderId": venue_id}
        if reduce_only and self._dialect.derivatives:
            params["reduceOnly"] = True
        if self._dialect.family == "binance":
            params["newOrderRespType"] = "RESULT"
        try:
            placed = await exchange.create_order(
                market["symbol"], "market", side.value, float(quantity), None, params
            )
        except ccxt_errors.AuthenticationError as e:
            raise CredentialsRejected(venue_detail(e)[1]) from None
        except ccxt_errors.DuplicateOrderId:
            found = await self._find(venue_id, client_order_id, market, reduce_only)
            if found is None:
                raise BrokerDisconnected(f"{self.name}: duplicate client id not found") from None
            return found
        except (ccxt_errors.RateLimitExceeded, ccxt_errors.DDoSProtection) as e:
            wait = retry_after_s(exchange.last_response_headers)
            return refused(
                rejection(RejectionCode.BROKER_RATE_LIMITED, venue_detail(e)[1], retry_after=wait)
            )
        except ccxt_errors.NetworkError:
            # A timeout or a dropped line: the venue may have taken the order.
            found = await self._find(venue_id, client_order_id, market, reduce_only)
            if found is None:
                raise BrokerDisconnected(f"{self.name}: placement unconfirmed") from None
            return found
        except ccxt_errors.ExchangeError as e:
            venue_code, message = venue_detail(e)
            if venue_code is not None and _is_duplicate(self._dialect.family, venue_code):
                found = await self._find(venue_id, client_order_id, market, reduce_only)
                if found is not None:
                    return found
            return refused(rejection(_classify(self._dialect.family, e), message))
        if placed.get("status") is None or placed.get("status") == "open":
            # Some venues acknowledge only (Bybit answers ids): read what happened.
            found = await self._find(venue_id, client_order_id, market, reduce_only)
            if found is not None:
                return found
        return self._broker_order(placed, client_order_id, market, reduce_only)

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        self._require()
        market = self._markets.get(symbol)
        if market is None:
            return None
        venue_id = venue_client_id(client_order_id, self._dialect.client_id_length)
        return await self._find(venue_id, client_order_id, market, None)

    # --- helpers ------------------------------------------------------------------------

    def _require(self) -> Any:
        if self._exchange is None:
            raise BrokerDisconnected(f"{self.name}: not connected")
        return self._exchange

    async def _load_markets(self) -> None:
        if not self._markets:
            markets = await self._exchange.load_markets()
            self._markets = tradable(self._dialect, markets.values())

    async def _guarded(self, call: Any) -> Any:
        """Await a ccxt call outside order placement: refused keys are
        ``CredentialsRejected``, anything else the venue or the line did is
        ``BrokerDisconnected``."""
        try:
            return await call
        except ccxt_errors.AuthenticationError as e:
            raise CredentialsRejected(venue_detail(e)[1]) from None
        except ccxt_errors.BaseError as e:
            raise BrokerDisconnected(f"{self.name}: {type(e).__name__}") from None

    def _id_of(self, unified: object) -> str | None:
        for market_id, market in self._markets.items():
            if market["symbol"] == unified:
                return market_id
        return None

    def _quantity_problem(self, market: Mapping[str, Any], quantity: Decimal) -> str | None:
        """Why the venue would refuse ``quantity`` (minimum, step), None when it fits."""
        minimum = _decimal(market.get("limits", {}).get("amount", {}).get("min"))
        if quantity < minimum:
            return f"quantity below the venue's minimum of {minimum.normalize():f}"
        precise = self._exchange.amount_to_precision(market["symbol"], float(quantity))
        if _decimal(precise) != quantity:
            return f"quantity not a multiple of the venue's step (would be {precise})"
        return None

    async def _find(
        self,
        venue_id: str,
        client_order_id: str,
        market: Mapping[str, Any],
        reduce_only: bool | None,
    ) -> BrokerOrder | None:
        """The order the venue holds under ``venue_id``, None when it has none."""
        exchange = self._exchange
        try:
            if self._dialect.family == "bybit":
                raw = await self._bybit_order(venue_id, market)
            else:
                raw = await exchange.fetch_order(
                    "", market["symbol"], {"origClientOrderId": venue_id}
                )
        except ccxt_errors.OrderNotFound:
            return None
        except ccxt_errors.AuthenticationError as e:
            raise CredentialsRejected(venue_detail(e)[1]) from None
        except ccxt_errors.BaseError as e:
            if _not_found(self._dialect.family, e):
                return None
            raise BrokerDisconnected(f"{self.name}: order lookup failed") from None
        if raw is None:
            return None
        return self._broker_order(raw, client_order_id, market, reduce_only)

    async def _bybit_order(self, venue_id: str, market: Mapping[str, Any]) -> Any:
        """Bybit's order by ``orderLinkId``: recent orders first, then the history."""
        exchange = self._exchange
        request = {"category": "linear", "symbol": market["id"], "orderLinkId": venue_id}
        for endpoint in (exchange.privateGetV5OrderRealtime, exchange.privateGetV5OrderHistory):
            response = await endpoint(request)
            found = (response.get("result") or {}).get("list") or []
            if found:
                return exchange.parse_order(found[0], market)
        return None

    def _broker_order(
        self,
        raw: Mapping[str, Any],
        client_order_id: str,
        market: Mapping[str, Any],
        reduce_only: bool | None,
    ) -> BrokerOrder:
        filled = _decimal(raw.get("filled"))
        amount = _decimal(raw.get("amount"), filled)
        status = _STATUSES.get(str(raw.get("status")), BrokerOrderStatus.PENDING)
        if status is BrokerOrderStatus.PENDING and filled > 0:
            status = BrokerOrderStatus.PARTIALLY_FILLED
        average = raw.get("average")
        rejected = None
        if status is BrokerOrderStatus.REJECTED:
            rejected = rejection(RejectionCode.BROKER_REJECTED, None)
        return BrokerOrder(
            broker_order_id=str(raw.get("id") or ""),
            client_order_id=client_order_id,
            symbol=str(market["id"]),
            side=Side(str(raw.get("side") or "buy")),
            quantity=amount,
            status=status,
            filled_quantity=filled,
            average_price=None if average is None or filled == 0 else _decimal(average),
            reduce_only=bool(raw.get("reduceOnly")) if reduce_only is None else reduce_only,
            rejection=rejected,
        )


_STATUSES = {
    "open": BrokerOrderStatus.PENDING,
    "closed": BrokerOrderStatus.FILLED,
    "canceled": BrokerOrderStatus.CANCELLED,
    "expired": BrokerOrderStatus.CANCELLED,
    "rejected": BrokerOrderStatus.REJECTED,
}
_DUPLICATE_CODES = {"binance": {"-4116", "-2010"}, "bybit": {"110072"}}
_NOT_FOUND_CODES = {"binance": {"-2013"}, "bybit": {"110001"}}


def _is_duplicate(family: str, venue_code: str) -> bool:
    return venue_code in _DUPLICATE_CODES.get(family, set())


def _not_found(family: str, exc: BaseException) -> bool:
    venue_code, _ = venue_detail(exc)
    return venue_code is not None and venue_code in _NOT_FOUND_CODES.get(family, set())


def _classify(family: str, exc: ccxt_errors.BaseError) -> RejectionCode:
    """The rejection code of a venue's refusal of an order."""
    venue_code, message = venue_detail(exc)
    by_venue = coded(family, venue_code, message)
    if by_venue is not None:
        return by_venue
    if isinstance(exc, ccxt_errors.InsufficientFunds):
        return RejectionCode.INSUFFICIENT_MARGIN
    if isinstance(exc, ccxt_errors.BadSymbol):
        return RejectionCode.INVALID_SYMBOL
    if isinstance(exc, ccxt_errors.MarketClosed):
        return RejectionCode.MARKET_CLOSED
    return RejectionCode.BROKER_REJECTED
