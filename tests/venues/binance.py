"""A local Binance emulator: Binance SPOT (``/api/v3``) and USDⓈ-M futures (``/fapi/v1``,
``/fapi/v2``, ``/fapi/v3``) on one server, so ccxt's ``binance`` and ``binanceusdm`` both talk
to it once their API URLs point here (see ``point_ccxt_at``).

It follows Binance's public documentation (developers.binance.com: "binance-spot-api-docs"
REST API and errors; "derivatives/usds-margined-futures" REST API and error codes):

* general: ``GET /api/v3/time``, ``/fapi/v1/time``, ``exchangeInfo`` of both markets (BTCUSDT
  and ETHUSDT, status TRADING, filters PRICE_FILTER / LOT_SIZE / MARKET_LOT_SIZE and NOTIONAL
  on spot, MIN_NOTIONAL on futures; futures are PERPETUAL with margin asset USDT), tickers
  (``ticker/price``, ``ticker/24hr``);
* SIGNED endpoints: the key in ``X-MBX-APIKEY``; ``signature`` is the HMAC-SHA256 hex of
  totalParams (the query string concatenated with the request body, without the signature
  parameter), compared case-insensitively; ``timestamp`` must lie in
  ``[serverTime - recvWindow, serverTime + 1000)``, recvWindow defaults to 5000 and may not
  exceed 60000. Errors: -2014 / -2015 (HTTP 401), -1022, -1021, -1102 (HTTP 400);
* spot: ``GET /api/v3/account``, ``POST/GET/DELETE /api/v3/order``, ``GET /api/v3/openOrders``;
  market orders by ``quantity`` or ``quoteOrderQty``, ``newOrderRespType`` ACK / RESULT / FULL;
* futures: ``GET /fapi/v2|v3/account``, ``/fapi/v2|v3/balance``, ``/fapi/v2|v3/positionRisk``,
  ``/fapi/v1/leverageBracket``, ``GET/POST /fapi/v1/positionSide/dual``,
  ``POST/GET/DELETE /fapi/v1/order`` (``reduceOnly``, ``positionSide``), ``/fapi/v1/openOrders``.
  Cross margin with leverage 10 for every symbol.

Only MARKET orders are executed: they fill at once at the set price (no fees) unless a
partial fill is scheduled; other order types are answered -1116. A ``newClientOrderId`` must
be unique among the OPEN orders of the account, as Binance documents: it can be reused once
the earlier order is no longer open. State is in memory, per API key.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from decimal import ROUND_DOWN, Decimal
from typing import Any, Literal

import attrs
from aiohttp import web

from venues.base import LocalVenue, PlacedOrder, json_response

Market = Literal["spot", "usdm"]
Params = dict[str, str]
Json = dict[str, Any]

LEVERAGE = Decimal(10)
DEFAULT_RECV_WINDOW = 5000
MAX_RECV_WINDOW = 60000
OPEN_STATUSES = ("NEW", "PARTIALLY_FILLED")
_NUMBER = re.compile(r"^([0-9]{1,20})(\.[0-9]{1,20})?$")
_CLIENT_ID = re.compile(r"^[\.A-Z\:/a-z0-9_-]{1,36}$")


@attrs.frozen
class SymbolSpec:
    """One market of the exchange information (the values Binance uses for the pair)."""

    symbol: str
    base: str
    quote: str
    min_qty: Decimal
    max_qty: Decimal
    market_max_qty: Decimal
    step: Decimal
    tick: Decimal
    min_notional: Decimal

    @property
    def qty_precision(self) -> int:
        return _decimals(self.step)

    @property
    def price_precision(self) -> int:
        return _decimals(self.tick)


def _spec(symbol: str, base: str, step: str, tick: str, notional: str, qty: str) -> SymbolSpec:
    return SymbolSpec(
        symbol=symbol,
        base=base,
        quote="USDT",
        min_qty=Decimal(step),
        max_qty=Decimal(qty) * 10,
        market_max_qty=Decimal(qty),
        step=Decimal(step),
        tick=Decimal(tick),
        min_notional=Decimal(notional),
    )


SPOT_SYMBOLS = {
    "BTCUSDT": _spec("BTCUSDT", "BTC", "0.00001", "0.01", "5", "900"),
    "ETHUSDT": _spec("ETHUSDT", "ETH", "0.0001", "0.01", "5", "9000"),
}
USDM_SYMBOLS = {
    "BTCUSDT": _spec("BTCUSDT", "BTC", "0.001", "0.10", "100", "120"),
    "ETHUSDT": _spec("ETHUSDT", "ETH", "0.001", "0.01", "20", "2000"),
}
DEFAULT_PRICES = {"BTCUSDT": Decimal(50_000), "ETHUSDT": Decimal(3_000)}


class BinanceError(Exception):
    """A documented Binance error answer: ``{"code": code, "msg": msg}`` with ``status``."""

    def __init__(self, code: int, msg: str, status: int = 400) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.status = status


def _mandatory(name: str) -> BinanceError:
    return BinanceError(
        -1102, f"Mandatory parameter '{name}' was not sent, was empty/null, or malformed."
    )


@attrs.define
class _Order:
    market: Market
    order_id: int
    client_order_id: str
    symbol: str
    side: str  # BUY | SELL
    quantity: Decimal
    reduce_only: bool
    position_side: str
    created: int
    executed: Decimal = Decimal(0)
    cum_quote: Decimal = Decimal(0)
    status: str = "NEW"
    updated: int = 0
    quote_order_qty: Decimal = Decimal(0)

    @property
    def remaining(self) -> Decimal:
        return self.quantity - self.executed

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    @property
    def avg_price(self) -> Decimal:
        return self.cum_quote / self.executed if self.executed else Decimal(0)


@attrs.define
class _Position:
    amount: Decimal  # signed
    entry: Decimal
    updated: int


@attrs.define
class _Account:
    secret: str
    spot_free: dict[str, Decimal]
    spot_locked: dict[str, Decimal]
    wallet: Decimal
    positions: dict[tuple[str, str], _Position] = attrs.field(factory=dict)
    hedge: bool = False
    orders: list[_Order] = attrs.field(factory=list)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _plain(value: Decimal) -> str:
    """A decimal as Binance futures writes it: plain notation, no exponent."""
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fixed(value: Decimal, places: int) -> str:
    return f"{value.quantize(Decimal(1).scaleb(-places)):f}"


def _spot_num(value: Decimal) -> str:
    """Spot sends every amount with 8 decimals."""
    return _fixed(value, 8)


def _parse_decimal(params: Params, name: str) -> Decimal | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if not _NUMBER.match(raw):
        raise BinanceError(
            -1100,
            f"Illegal characters found in parameter '{name}'; legal range is "
            "'^([0-9]{1,20})(\\.[0-9]{1,20})?$'.",
        )
    return Decimal(raw)


def _parse_bool(params: Params, name: str) -> bool:
    raw = params.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise BinanceError(-1130, f"Data sent for parameter '{name}' is not valid.")
    return raw == "true"


def _decimals(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


class BinanceVenue(LocalVenue):
    """Binance spot and USDⓈ-M futures on one local server.

    ``default_market`` is the market the generic controls (``set_position``, ``position``)
    act on when no ``market`` is given: a broker test for ``binance`` spot builds the venue
    with ``default_market="spot"``.
    """

    def __init__(self, *, default_market: Market = "usdm") -> None:
        super().__init__()
        self.default_market: Market = default_market
        self._accounts: dict[str, _Account] = {}
        self._prices: dict[str, Decimal] = dict(DEFAULT_PRICES)
        self._ids = {"spot": itertools.count(1_000_001), "usdm": itertools.count(4_000_000_001)}
        self._partial_fraction: Decimal | None = None
        self._clock_offset_ms = 0
        self._locks: dict[int, tuple[str, Decimal]] = {}  # spot order id -> locked asset, amount
        self._generated_ids = itertools.count(1)
        # read the body before the base's faults: after a Delay the client may be gone, and
        # aiohttp then refuses to read a body it had already received
        self.app.middlewares.insert(0, _read_body_first)
        self._add_routes()

    # ----------------------------------------------------------------- controls

    def add_account(
        self, api_key: str, api_secret: str, *, cash: Decimal = Decimal(100_000)
    ) -> None:
        """A key with ``cash`` USDT in the spot wallet and ``cash`` USDT in the futures wallet."""
        self._accounts[api_key] = _Account(
            secret=api_secret, spot_free={"USDT": cash}, spot_locked={}, wallet=cash
        )

    def set_price(self, symbol: str, price: Decimal) -> None:
        """The price of ``symbol`` (e.g. BTCUSDT) on both markets (last, mark and fill price)."""
        self._prices[symbol] = price

    def set_position(
        self,
        api_key: str,
        symbol: str,
        quantity: Decimal,
        *,
        market: Market | None = None,
        entry_price: Decimal | None = None,
    ) -> None:
        """Futures: the signed position (hedge mode: LONG if > 0, SHORT if < 0), entered at
        ``entry_price`` (default: the set price). Spot: the free balance of the base asset."""
        account = self._accounts[api_key]
        if (market or self.default_market) == "spot":
            if quantity < 0:
                raise ValueError("a spot balance cannot be negative")
            account.spot_free[SPOT_SYMBOLS[symbol].base] = quantity
            return
        entry = entry_price if entry_price is not None else self._prices[symbol]
        for key in [k for k in account.positions if k[0] == symbol]:
            del account.positions[key]
        if quantity == 0:
            return
        side = ("LONG" if quantity > 0 else "SHORT") if account.hedge else "BOTH"
        account.positions[(symbol, side)] = _Position(quantity, entry, _now_ms())

    def position(self, api_key: str, symbol: str, *, market: Market | None = None) -> Decimal:
        """Futures: the net signed position; spot: the base asset balance (free + locked)."""
        account = self._accounts[api_key]
        if (market or self.default_market) == "spot":
            base = SPOT_SYMBOLS[symbol].base
            return account.spot_free.get(base, Decimal(0)) + account.spot_locked.get(
                base, Decimal(0)
            )
        return sum((p.amount for (s, _), p in account.positions.items() if s == symbol), Decimal(0))

    def set_hedge_mode(self, api_key: str, on: bool) -> None:
        """Futures position mode: hedge (dualSidePosition) or one-way."""
        self._accounts[api_key].hedge = on

    def set_clock_offset(self, milliseconds: int) -> None:
        """Move the venue's clock (serverTime and the timestamp check) by ``milliseconds``."""
        self._clock_offset_ms = milliseconds

    def placed(self, api_key: str, market: Market | None = None) -> list[PlacedOrder]:
        """Every order accepted for ``api_key`` (of ``market``, or of both), oldest first."""
        account = self._accounts[api_key]
        return [
            PlacedOrder(
                client_order_id=o.client_order_id,
                symbol=o.symbol,
                side=o.side.lower(),
                quantity=o.quantity,
                filled=o.executed,
                reduce_only=o.reduce_only,
                status=o.status,
            )
            for o in account.orders
            if market is None or o.market == market
        ]

    def fill_next_partially(self, fraction: Decimal) -> None:
        """The next market order (either market) fills only ``fraction``; it stays open."""
        self._partial_fraction = fraction

    def fill_resting(self) -> None:
        """Fill what partially filled orders left, at the current price."""
        for account in self._accounts.values():
            for order in account.orders:
                if order.is_open:
                    self._fill_rest(account, order)

    def _fill_rest(self, account: _Account, order: _Order) -> None:
        self._release(account, order)
        quantity = order.remaining
        if order.reduce_only:  # never beyond the position left to reduce
            closable = self._closable(account, order.symbol, order.side, order.position_side)
            quantity = min(quantity, closable)
        self._execute(account, order, quantity)
        if order.remaining:
            order.status = "EXPIRED"

    # ------------------------------------------------------------------ routes

    def _add_routes(self) -> None:
        public: list[tuple[str, str, Callable[[Params], Json | list[Json]]]] = [
            ("GET", "/api/v3/ping", lambda _: {}),
            ("GET", "/api/v3/time", self._time),
            ("GET", "/api/v3/exchangeInfo", self._spot_exchange_info),
            ("GET", "/api/v3/ticker/price", lambda p: self._ticker_price(p, "spot")),
            ("GET", "/api/v3/ticker/24hr", lambda p: self._ticker_24hr(p, "spot")),
            ("GET", "/fapi/v1/ping", lambda _: {}),
            ("GET", "/fapi/v1/time", self._time),
            ("GET", "/fapi/v1/exchangeInfo", self._usdm_exchange_info),
            ("GET", "/fapi/v1/ticker/price", lambda p: self._ticker_price(p, "usdm")),
            ("GET", "/fapi/v2/ticker/price", lambda p: self._ticker_price(p, "usdm")),
            ("GET", "/fapi/v1/ticker/24hr", lambda p: self._ticker_24hr(p, "usdm")),
        ]
        for method, path, public_handler in public:
            self.app.router.add_route(method, path, self._public(public_handler))
        signed: list[tuple[str, str, Market, Callable[[_Account, Params], Any]]] = [
            ("GET", "/api/v3/account", "spot", self._spot_account),
            ("POST", "/api/v3/order", "spot", self._spot_new_order),
            ("GET", "/api/v3/order", "spot", self._spot_query_order),
            ("DELETE", "/api/v3/order", "spot", self._spot_cancel_order),
            ("GET", "/api/v3/openOrders", "spot", self._spot_open_orders),
            ("GET", "/fapi/v2/account", "usdm", self._usdm_account),
            ("GET", "/fapi/v3/account", "usdm", self._usdm_account),
            ("GET", "/fapi/v2/balance", "usdm", self._usdm_balance),
            ("GET", "/fapi/v3/balance", "usdm", self._usdm_balance),
            ("GET", "/fapi/v2/positionRisk", "usdm", self._usdm_position_risk_v2),
            ("GET", "/fapi/v3/positionRisk", "usdm", self._usdm_position_risk_v3),
            ("GET", "/fapi/v1/leverageBracket", "usdm", self._usdm_leverage_bracket),
            ("GET", "/fapi/v1/positionSide/dual", "usdm", self._usdm_get_dual),
            ("POST", "/fapi/v1/positionSide/dual", "usdm", self._usdm_set_dual),
            ("POST", "/fapi/v1/order", "usdm", self._usdm_new_order),
            ("GET", "/fapi/v1/order", "usdm", self._usdm_query_order),
            ("DELETE", "/fapi/v1/order", "usdm", self._usdm_cancel_order),
            ("GET", "/fapi/v1/openOrders", "usdm", self._usdm_open_orders),
        ]
        for method, path, market, signed_handler in signed:
            self.app.router.add_route(method, path, self._signed(market, signed_handler))

    def _public(
        self, handler: Callable[[Params], Json | list[Json]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            try:
                return json_response(handler(dict(request.query)))
            except BinanceError as error:
                return _error_response(error)

        return route

    def _signed(
        self, market: Market, handler: Callable[[_Account, Params], Any]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            body = await request.text()
            try:
                account, params = self._authenticate(request, body, market)
                return json_response(handler(account, params))
            except BinanceError as error:
                return _error_response(error)

        return route

    # ---------------------------------------------------------- request security

    def _server_time(self) -> int:
        return _now_ms() + self._clock_offset_ms

    def _authenticate(
        self, request: web.Request, body: str, market: Market
    ) -> tuple[_Account, Params]:
        api_key = request.headers.get("X-MBX-APIKEY", "")
        if not api_key:
            raise BinanceError(-2014, "API-key format invalid.", 401)
        account = self._accounts.get(api_key)
        if account is None:
            message = "Invalid API-key, IP, or permissions for action"
            suffix = "." if market == "spot" else f", request ip: {request.remote}"
            raise BinanceError(-2015, message + suffix, 401)
        query = request.rel_url.raw_query_string
        params = _parse_params(body, query)
        self._check_timestamp(params)
        _check_signature(account.secret, query, body)
        return account, params

    def _check_timestamp(self, params: Params) -> None:
        if not params.get("timestamp", "").isdigit():
            raise _mandatory("timestamp")
        recv_window = _parse_decimal(params, "recvWindow") or Decimal(DEFAULT_RECV_WINDOW)
        if recv_window > MAX_RECV_WINDOW:
            raise BinanceError(-1131, "recvWindow must be less than 60000")
        timestamp, now = int(params["timestamp"]), self._server_time()
        if timestamp >= now + 1000:
            raise BinanceError(
                -1021, "Timestamp for this request was 1000ms ahead of the server's time."
            )
        if now - timestamp > recv_window:
            raise BinanceError(-1021, "Timestamp for this request is outside of the recvWindow.")

    # ------------------------------------------------------------ public data

    def _time(self, _: Params) -> Json:
        return {"serverTime": self._server_time()}

    def _price(self, symbol: str) -> Decimal:
        return self._prices[symbol]

    def _symbols(self, market: Market) -> dict[str, SymbolSpec]:
        return SPOT_SYMBOLS if market == "spot" else USDM_SYMBOLS

    def _spec(self, market: Market, params: Params) -> SymbolSpec:
        symbol = params.get("symbol")
        if not symbol:
            raise _mandatory("symbol")
        spec = self._symbols(market).get(symbol)
        if spec is None:
            raise BinanceError(-1121, "Invalid symbol.")
        return spec

    def _spot_exchange_info(self, _: Params) -> Json:
        return {
            "timezone": "UTC",
            "serverTime": self._server_time(),
            "rateLimits": [
                {
                    "rateLimitType": "REQUEST_WEIGHT",
                    "interval": "MINUTE",
                    "intervalNum": 1,
                    "limit": 6000,
                },
                {"rateLimitType": "ORDERS", "interval": "SECOND", "intervalNum": 10, "limit": 100},
            ],
            "exchangeFilters": [],
            "symbols": [_spot_symbol_info(spec) for spec in SPOT_SYMBOLS.values()],
        }

    def _usdm_exchange_info(self, _: Params) -> Json:
        return {
            "timezone": "UTC",
            "serverTime": self._server_time(),
            "futuresType": "U_MARGINED",
            "rateLimits": [
                {
                    "rateLimitType": "REQUEST_WEIGHT",
                    "interval": "MINUTE",
                    "intervalNum": 1,
                    "limit": 2400,
                },
                {"rateLimitType": "ORDERS", "interval": "MINUTE", "intervalNum": 1, "limit": 1200},
            ],
            "exchangeFilters": [],
            "assets": [{"asset": "USDT", "marginAvailable": True, "autoAssetExchange": "-10000"}],
            "symbols": [_usdm_symbol_info(spec) for spec in USDM_SYMBOLS.values()],
        }

    def _ticker_price(self, params: Params, market: Market) -> Json | list[Json]:
        def one(symbol: str) -> Json:
            price = self._price(symbol)
            if market == "spot":
                return {"symbol": symbol, "price": _spot_num(price)}
            return {"symbol": symbol, "price": _plain(price), "time": self._server_time()}

        if "symbol" in params:
            return one(self._spec(market, params).symbol)
        return [one(symbol) for symbol in self._symbols(market)]

    def _ticker_24hr(self, params: Params, market: Market) -> Json | list[Json]:
        if "symbol" in params:
            return self._ticker_24hr_one(self._spec(market, params).symbol, market)
        return [self._ticker_24hr_one(symbol, market) for symbol in self._symbols(market)]

    def _ticker_24hr_one(self, symbol: str, market: Market) -> Json:
        price = self._price(symbol)
        fmt = _spot_num if market == "spot" else _plain
        now = self._server_time()
        ticker: Json = {
            "symbol": symbol,
            "priceChange": fmt(Decimal(0)),
            "priceChangePercent": "0.000",
            "weightedAvgPrice": fmt(price),
            "lastPrice": fmt(price),
            "lastQty": fmt(Decimal(0)),
            "openPrice": fmt(price),
            "highPrice": fmt(price),
            "lowPrice": fmt(price),
            "volume": fmt(Decimal(0)),
            "quoteVolume": fmt(Decimal(0)),
            "openTime": now - 86_400_000,
            "closeTime": now,
            "firstId": -1,
            "lastId": -1,
            "count": 0,
        }
        if market == "spot":
            ticker |= {
                "prevClosePrice": fmt(price),
                "bidPrice": fmt(price),
                "bidQty": fmt(Decimal(0)),
                "askPrice": fmt(price),
                "askQty": fmt(Decimal(0)),
            }
        return ticker

    # ------------------------------------------------------------ spot account

    def _spot_account(self, account: _Account, params: Params) -> Json:
        assets = sorted(set(account.spot_free) | set(account.spot_locked))
        balances = [
            {
                "asset": asset,
                "free": _spot_num(account.spot_free.get(asset, Decimal(0))),
                "locked": _spot_num(account.spot_locked.get(asset, Decimal(0))),
            }
            for asset in assets
        ]
        if params.get("omitZeroBalances") == "true":
            balances = [b for b in balances if Decimal(b["free"]) or Decimal(b["locked"])]
        return {
            "makerCommission": 0,
            "takerCommission": 0,
            "buyerCommission": 0,
            "sellerCommission": 0,
            "commissionRates": {
                "maker": "0.00000000",
                "taker": "0.00000000",
                "buyer": "0.00000000",
                "seller": "0.00000000",
            },
            "canTrade": True,
            "canWithdraw": True,
            "canDeposit": True,
            "brokered": False,
            "requireSelfTradePrevention": False,
            "preventSor": False,
            "updateTime": self._server_time(),
            "accountType": "SPOT",
            "balances": balances,
            "permissions": ["SPOT"],
            "uid": 354937868,
        }

    # -------------------------------------------------------------- spot orders

    def _spot_new_order(self, account: _Account, params: Params) -> Json:
        spec = self._spec("spot", params)
        side = _side(params)
        _market_type_only(params)
        price = self._price(spec.symbol)
        quantity, quote_qty = self._spot_quantity(spec, params, price)
        client_id = _client_order_id(params, account, "spot", next(self._generated_ids))
        self._spot_check_funds(account, spec, side, quantity, price)
        order = self._new_order(account, "spot", spec.symbol, side, quantity, client_id)
        order.quote_order_qty = quote_qty
        self._run_market_order(account, order)
        return self._spot_order_answer(order, params.get("newOrderRespType", "FULL"))

    def _spot_quantity(
        self, spec: SymbolSpec, params: Params, price: Decimal
    ) -> tuple[Decimal, Decimal]:
        quantity = _parse_decimal(params, "quantity")
        quote_qty = _parse_decimal(params, "quoteOrderQty")
        if quantity is not None and quote_qty is not None:
            raise BinanceError(-1106, "Parameter 'quoteOrderQty' sent when not required.")
        if quantity is None and quote_qty is None:
            raise BinanceError(
                -1102, "Param 'quantity' or 'quoteOrderQty' must be sent, but both were empty/null!"
            )
        if quote_qty is not None:
            quantity = (quote_qty / price).quantize(spec.step, rounding=ROUND_DOWN)
        assert quantity is not None
        if _decimals(quantity) > 8:
            raise BinanceError(-1111, "Parameter 'quantity' has too much precision.")
        if quantity < spec.min_qty or quantity > spec.market_max_qty or quantity % spec.step != 0:
            raise BinanceError(-1013, "Filter failure: LOT_SIZE")
        if quantity * price < spec.min_notional:
            raise BinanceError(-1013, "Filter failure: NOTIONAL")
        return quantity, quote_qty or Decimal(0)

    def _spot_check_funds(
        self, account: _Account, spec: SymbolSpec, side: str, quantity: Decimal, price: Decimal
    ) -> None:
        asset, needed = (spec.quote, quantity * price) if side == "BUY" else (spec.base, quantity)
        if account.spot_free.get(asset, Decimal(0)) < needed:
            raise BinanceError(-2010, "Account has insufficient balance for requested action.")

    def _spot_order_answer(self, order: _Order, resp_type: str) -> Json:
        ack: Json = {
            "symbol": order.symbol,
            "orderId": order.order_id,
            "orderListId": -1,
            "clientOrderId": order.client_order_id,
            "transactTime": order.created,
        }
        if resp_type == "ACK":
            return ack
        result = ack | {
            "price": _spot_num(Decimal(0)),
            "origQty": _spot_num(order.quantity),
            "executedQty": _spot_num(order.executed),
            "origQuoteOrderQty": _spot_num(order.quote_order_qty),
            "cummulativeQuoteQty": _spot_num(order.cum_quote),
            "status": order.status,
            "timeInForce": "GTC",
            "type": "MARKET",
            "side": order.side,
            "workingTime": order.created,
            "selfTradePreventionMode": "EXPIRE_MAKER",
        }
        if resp_type == "FULL":
            fills = [] if not order.executed else [_spot_fill(order)]
            result["fills"] = fills
        return result

    def _spot_order_json(self, order: _Order) -> Json:
        return {
            "symbol": order.symbol,
            "orderId": order.order_id,
            "orderListId": -1,
            "clientOrderId": order.client_order_id,
            "price": _spot_num(Decimal(0)),
            "origQty": _spot_num(order.quantity),
            "executedQty": _spot_num(order.executed),
            "cummulativeQuoteQty": _spot_num(order.cum_quote),
            "status": order.status,
            "timeInForce": "GTC",
            "type": "MARKET",
            "side": order.side,
            "stopPrice": _spot_num(Decimal(0)),
            "icebergQty": _spot_num(Decimal(0)),
            "time": order.created,
            "updateTime": order.updated,
            "isWorking": True,
            "workingTime": order.created,
            "origQuoteOrderQty": _spot_num(order.quote_order_qty),
            "selfTradePreventionMode": "EXPIRE_MAKER",
        }

    def _spot_query_order(self, account: _Account, params: Params) -> Json:
        return self._spot_order_json(self._find_order(account, "spot", params, -2013))

    def _spot_cancel_order(self, account: _Account, params: Params) -> Json:
        order = self._find_order(account, "spot", params, -2011)
        self._cancel(account, order)
        return self._spot_order_json(order) | {
            "origClientOrderId": order.client_order_id,
            "transactTime": self._server_time(),
        }

    def _spot_open_orders(self, account: _Account, params: Params) -> list[Json]:
        orders = self._open_orders(account, "spot", params)
        return [self._spot_order_json(o) for o in orders]

    # ---------------------------------------------------------- futures account

    def _mark(self, symbol: str) -> Decimal:
        return self._prices[symbol]

    def _unrealized(self, position: _Position, symbol: str) -> Decimal:
        return (self._mark(symbol) - position.entry) * position.amount

    def _position_margin(self, account: _Account) -> Decimal:
        return sum(
            (abs(p.amount) * self._mark(s) / LEVERAGE for (s, _), p in account.positions.items()),
            Decimal(0),
        )

    def _open_order_margin(self, account: _Account) -> Decimal:
        return sum(
            (
                o.remaining * self._price(o.symbol) / LEVERAGE
                for o in account.orders
                if o.market == "usdm" and o.is_open and not o.reduce_only
            ),
            Decimal(0),
        )

    def _usdm_totals(self, account: _Account) -> dict[str, Decimal]:
        unrealized = sum(
            (self._unrealized(p, s) for (s, _), p in account.positions.items()), Decimal(0)
        )
        position_margin = self._position_margin(account)
        order_margin = self._open_order_margin(account)
        margin_balance = account.wallet + unrealized
        available = margin_balance - position_margin - order_margin
        return {
            "walletBalance": account.wallet,
            "unrealizedProfit": unrealized,
            "marginBalance": margin_balance,
            "maintMargin": position_margin / 25,
            "initialMargin": position_margin + order_margin,
            "positionInitialMargin": position_margin,
            "openOrderInitialMargin": order_margin,
            "crossWalletBalance": account.wallet,
            "crossUnPnl": unrealized,
            "availableBalance": available,
            "maxWithdrawAmount": max(available, Decimal(0)),
        }

    def _usdm_asset(self, account: _Account) -> Json:
        totals = self._usdm_totals(account)
        asset: Json = {"asset": "USDT"} | {k: _fixed(v, 8) for k, v in totals.items()}
        return asset | {"marginAvailable": True, "updateTime": self._server_time()}

    def _usdm_account(self, account: _Account, _: Params) -> Json:
        totals = {k: _fixed(v, 8) for k, v in self._usdm_totals(account).items()}
        return {
            "totalInitialMargin": totals["initialMargin"],
            "totalMaintMargin": totals["maintMargin"],
            "totalWalletBalance": totals["walletBalance"],
            "totalUnrealizedProfit": totals["unrealizedProfit"],
            "totalMarginBalance": totals["marginBalance"],
            "totalPositionInitialMargin": totals["positionInitialMargin"],
            "totalOpenOrderInitialMargin": totals["openOrderInitialMargin"],
            "totalCrossWalletBalance": totals["crossWalletBalance"],
            "totalCrossUnPnl": totals["crossUnPnl"],
            "availableBalance": totals["availableBalance"],
            "maxWithdrawAmount": totals["maxWithdrawAmount"],
            "assets": [self._usdm_asset(account)],
            "positions": [
                self._usdm_position_json(s, side, p, v3=True)
                for (s, side), p in account.positions.items()
            ],
        }

    def _usdm_balance(self, account: _Account, _: Params) -> list[Json]:
        asset = self._usdm_asset(account)
        return [
            {
                "accountAlias": "SgsR",
                "asset": "USDT",
                "balance": asset["walletBalance"],
                "crossWalletBalance": asset["crossWalletBalance"],
                "crossUnPnl": asset["crossUnPnl"],
                "availableBalance": asset["availableBalance"],
                "maxWithdrawAmount": asset["maxWithdrawAmount"],
                "marginAvailable": True,
                "updateTime": asset["updateTime"],
            }
        ]

    def _usdm_position_json(self, symbol: str, side: str, position: _Position, *, v3: bool) -> Json:
        mark = self._mark(symbol)
        spec = USDM_SYMBOLS[symbol]
        notional = position.amount * mark
        common: Json = {
            "symbol": symbol,
            "positionSide": side,
            "positionAmt": _fixed(position.amount, spec.qty_precision),
            "entryPrice": _plain(position.entry) if position.amount else "0.0",
            "breakEvenPrice": _plain(position.entry) if position.amount else "0.0",
            "markPrice": _fixed(mark, 8),
            "unRealizedProfit": _fixed(self._unrealized(position, symbol), 8),
            "liquidationPrice": "0",
            "isolatedMargin": "0",
            "notional": _plain(notional),
            "isolatedWallet": "0",
            "updateTime": position.updated,
        }
        if v3:
            margin = abs(notional) / LEVERAGE
            return common | {
                "marginAsset": "USDT",
                "initialMargin": _fixed(margin, 8),
                "maintMargin": _fixed(margin / 25, 8),
                "positionInitialMargin": _fixed(margin, 8),
                "openOrderInitialMargin": "0",
                "adl": 0,
                "bidNotional": "0",
                "askNotional": "0",
            }
        return common | {
            "leverage": str(LEVERAGE),
            "maxNotionalValue": "80000000",
            "marginType": "cross",
            "isAutoAddMargin": "false",
        }

    def _position_rows(self, account: _Account, params: Params) -> list[tuple[str, str, _Position]]:
        symbols = [self._spec("usdm", params).symbol] if "symbol" in params else list(USDM_SYMBOLS)
        sides = ("LONG", "SHORT") if account.hedge else ("BOTH",)
        flat = _Position(Decimal(0), Decimal(0), 0)
        return [
            (symbol, side, account.positions.get((symbol, side), flat))
            for symbol in symbols
            for side in sides
        ]

    def _usdm_position_risk_v2(self, account: _Account, params: Params) -> list[Json]:
        rows = self._position_rows(account, params)
        return [self._usdm_position_json(s, side, p, v3=False) for s, side, p in rows]

    def _usdm_position_risk_v3(self, account: _Account, params: Params) -> list[Json]:
        """v3 answers only the symbols with a position (or open orders)."""
        open_symbols = {o.symbol for o in account.orders if o.market == "usdm" and o.is_open}
        rows = self._position_rows(account, params)
        return [
            self._usdm_position_json(s, side, p, v3=True)
            for s, side, p in rows
            if p.amount or s in open_symbols
        ]

    def _usdm_leverage_bracket(self, _: _Account, params: Params) -> list[Json]:
        symbols = [self._spec("usdm", params).symbol] if "symbol" in params else list(USDM_SYMBOLS)
        bracket = {
            "bracket": 1,
            "initialLeverage": 125,
            "notionalCap": 50_000_000,
            "notionalFloor": 0,
            "maintMarginRatio": 0.004,
            "cum": 0.0,
        }
        return [{"symbol": symbol, "brackets": [bracket]} for symbol in symbols]

    def _usdm_get_dual(self, account: _Account, _: Params) -> Json:
        return {"dualSidePosition": account.hedge}

    def _usdm_set_dual(self, account: _Account, params: Params) -> Json:
        if "dualSidePosition" not in params:
            raise _mandatory("dualSidePosition")
        wanted = _parse_bool(params, "dualSidePosition")
        if wanted == account.hedge:
            raise BinanceError(-4059, "No need to change position side.")
        if any(o.market == "usdm" and o.is_open for o in account.orders):
            raise BinanceError(
                -4067, "Position side cannot be changed if there exists open orders."
            )
        if any(p.amount for p in account.positions.values()):
            raise BinanceError(-4068, "Position side cannot be changed if there exists position.")
        account.hedge = wanted
        account.positions.clear()
        return {"code": 200, "msg": "success"}

    # ----------------------------------------------------------- futures orders

    def _usdm_new_order(self, account: _Account, params: Params) -> Json:
        spec = self._spec("usdm", params)
        side = _side(params)
        _market_type_only(params)
        quantity = _usdm_quantity(spec, params)
        reduce_only = _parse_bool(params, "reduceOnly")
        position_side = _position_side(account, params, reduce_only)
        client_id = _client_order_id(params, account, "usdm", next(self._generated_ids))
        closing = self._usdm_check_order(account, spec, side, quantity, reduce_only, position_side)
        order = self._new_order(account, "usdm", spec.symbol, side, quantity, client_id)
        order.reduce_only, order.position_side = reduce_only, position_side
        before = self._usdm_order_json(order)
        self._run_market_order(account, order, cap=closing if reduce_only else None)
        if params.get("newOrderRespType", "ACK") == "ACK":
            return before
        return self._usdm_order_json(order)

    def _usdm_check_order(
        self,
        account: _Account,
        spec: SymbolSpec,
        side: str,
        quantity: Decimal,
        reduce_only: bool,
        position_side: str,
    ) -> Decimal:
        """Reduce-only, notional and margin rules; answers how much of the order closes."""
        closing = self._closable(account, spec.symbol, side, position_side)
        closes_hedged = _closes(side, position_side)  # SELL LONG / BUY SHORT only reduce
        if (reduce_only and closing == 0) or (closes_hedged and quantity > closing):
            raise BinanceError(-2022, "ReduceOnly Order is rejected.")
        price = self._price(spec.symbol)
        if not (reduce_only or closes_hedged) and quantity * price < spec.min_notional:
            raise BinanceError(
                -4164,
                f"Order's notional must be no smaller than {spec.min_notional} "
                "(unless you choose reduce only).",
            )
        opening = Decimal(0) if reduce_only else max(quantity - closing, Decimal(0))
        if opening * price / LEVERAGE > self._usdm_totals(account)["availableBalance"]:
            raise BinanceError(-2019, "Margin is insufficient.")
        return closing

    def _closable(self, account: _Account, symbol: str, side: str, position_side: str) -> Decimal:
        """How much of ``side`` would reduce the position it trades against."""
        position = account.positions.get((symbol, position_side))
        if position is None:
            return Decimal(0)
        if (side == "SELL" and position.amount > 0) or (side == "BUY" and position.amount < 0):
            return abs(position.amount)
        return Decimal(0)

    def _usdm_order_json(self, order: _Order) -> Json:
        spec = USDM_SYMBOLS[order.symbol]
        return {
            "orderId": order.order_id,
            "symbol": order.symbol,
            "status": order.status,
            "clientOrderId": order.client_order_id,
            "price": "0.00",
            "avgPrice": _plain(order.avg_price) if order.executed else "0.00",
            "origQty": _fixed(order.quantity, spec.qty_precision),
            "executedQty": _fixed(order.executed, spec.qty_precision),
            "cumQty": _fixed(order.executed, spec.qty_precision),
            "cumQuote": _fixed(order.cum_quote, 5),
            "timeInForce": "GTC",
            "type": "MARKET",
            "reduceOnly": order.reduce_only,
            "closePosition": False,
            "side": order.side,
            "positionSide": order.position_side,
            "stopPrice": "0.00",
            "workingType": "CONTRACT_PRICE",
            "priceProtect": False,
            "origType": "MARKET",
            "priceMatch": "NONE",
            "selfTradePreventionMode": "EXPIRE_MAKER",
            "goodTillDate": 0,
            "time": order.created,
            "updateTime": order.updated,
        }

    def _usdm_query_order(self, account: _Account, params: Params) -> Json:
        return self._usdm_order_json(self._find_order(account, "usdm", params, -2013))

    def _usdm_cancel_order(self, account: _Account, params: Params) -> Json:
        order = self._find_order(account, "usdm", params, -2011)
        self._cancel(account, order)
        return self._usdm_order_json(order)

    def _usdm_open_orders(self, account: _Account, params: Params) -> list[Json]:
        return [self._usdm_order_json(o) for o in self._open_orders(account, "usdm", params)]

    # ----------------------------------------------------------- order engine

    def _new_order(
        self,
        account: _Account,
        market: Market,
        symbol: str,
        side: str,
        quantity: Decimal,
        client_id: str,
    ) -> _Order:
        now = self._server_time()
        order = _Order(
            market=market,
            order_id=next(self._ids[market]),
            client_order_id=client_id,
            symbol=symbol,
            side=side,
            quantity=quantity,
            reduce_only=False,
            position_side="BOTH",
            created=now,
            updated=now,
        )
        account.orders.append(order)
        return order

    def _run_market_order(
        self, account: _Account, order: _Order, *, cap: Decimal | None = None
    ) -> None:
        """Fill ``order`` now (up to ``cap`` for reduce-only orders, the rest expires), or only
        the scheduled fraction, leaving the rest open."""
        fraction, self._partial_fraction = self._partial_fraction, None
        quantity = order.quantity if cap is None else min(order.quantity, cap)
        if fraction is not None:
            step = self._symbols(order.market)[order.symbol].step
            part = (quantity * fraction).quantize(step, rounding=ROUND_DOWN)
            self._execute(account, order, part)
            if order.remaining:
                order.status = "PARTIALLY_FILLED" if part else "NEW"
                self._lock(account, order)
            return
        self._execute(account, order, quantity)
        if order.remaining:
            order.status = "EXPIRED"

    def _execute(self, account: _Account, order: _Order, quantity: Decimal) -> None:
        if quantity <= 0:
            return
        price = self._price(order.symbol)
        if order.market == "spot":
            self._settle_spot(account, order, quantity, price)
        else:
            signed = quantity if order.side == "BUY" else -quantity
            self._settle_usdm(account, order.symbol, order.position_side, signed, price)
        order.executed += quantity
        order.cum_quote += quantity * price
        order.updated = self._server_time()
        order.status = "FILLED" if order.remaining == 0 else "PARTIALLY_FILLED"

    def _settle_spot(
        self, account: _Account, order: _Order, quantity: Decimal, price: Decimal
    ) -> None:
        spec = SPOT_SYMBOLS[order.symbol]
        sign = 1 if order.side == "BUY" else -1
        free = account.spot_free
        free[spec.base] = free.get(spec.base, Decimal(0)) + sign * quantity
        free[spec.quote] = free.get(spec.quote, Decimal(0)) - sign * quantity * price

    def _settle_usdm(
        self, account: _Account, symbol: str, side: str, signed: Decimal, price: Decimal
    ) -> None:
        key = (symbol, side)
        now = self._server_time()
        position = account.positions.get(key) or _Position(Decimal(0), Decimal(0), now)
        amount = position.amount
        if amount == 0 or (amount > 0) == (signed > 0):
            total = amount + signed
            entry = (abs(amount) * position.entry + abs(signed) * price) / abs(total)
            account.positions[key] = _Position(total, entry, now)
            return
        closed = min(abs(signed), abs(amount))
        account.wallet += closed * (price - position.entry) * (1 if amount > 0 else -1)
        total = amount + signed
        if total == 0:
            account.positions.pop(key, None)
        elif (total > 0) == (amount > 0):
            account.positions[key] = _Position(total, position.entry, now)
        else:
            account.positions[key] = _Position(total, price, now)

    def _lock(self, account: _Account, order: _Order) -> None:
        """Spot: what an open order may still spend is locked."""
        if order.market != "spot" or not order.is_open:
            return
        spec = SPOT_SYMBOLS[order.symbol]
        asset, amount = (
            (spec.quote, order.remaining * self._price(order.symbol))
            if order.side == "BUY"
            else (spec.base, order.remaining)
        )
        account.spot_free[asset] = account.spot_free.get(asset, Decimal(0)) - amount
        account.spot_locked[asset] = account.spot_locked.get(asset, Decimal(0)) + amount
        self._locks[order.order_id] = (asset, amount)

    def _release(self, account: _Account, order: _Order) -> None:
        lock = self._locks.pop(order.order_id, None)
        if lock is None:
            return
        asset, amount = lock
        account.spot_locked[asset] -= amount
        account.spot_free[asset] += amount

    def _cancel(self, account: _Account, order: _Order) -> None:
        if not order.is_open:
            raise BinanceError(-2011, "Unknown order sent.")
        self._release(account, order)
        order.status = "CANCELED"
        order.updated = self._server_time()

    def _find_order(self, account: _Account, market: Market, params: Params, code: int) -> _Order:
        symbol = self._spec(market, params).symbol
        order_id, client_id = params.get("orderId"), params.get("origClientOrderId")
        if not order_id and not client_id:
            raise BinanceError(
                -1102,
                "Param 'origClientOrderId' or 'orderId' must be sent, but both were empty/null!",
            )
        for order in reversed(account.orders):
            if order.market != market or order.symbol != symbol:
                continue
            if (order_id and str(order.order_id) == order_id) or (
                not order_id and order.client_order_id == client_id
            ):
                return order
        message = "Order does not exist." if code == -2013 else "Unknown order sent."
        raise BinanceError(code, message)

    def _open_orders(self, account: _Account, market: Market, params: Params) -> list[_Order]:
        symbol = self._spec(market, params).symbol if "symbol" in params else None
        return [
            o
            for o in account.orders
            if o.market == market and o.is_open and (symbol is None or o.symbol == symbol)
        ]


# --------------------------------------------------------------------- helpers


@web.middleware
async def _read_body_first(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    await request.read()  # cached by aiohttp for the handler's request.text()
    return await handler(request)


def _error_response(error: BinanceError) -> web.Response:
    return json_response({"code": error.code, "msg": error.msg}, status=error.status)


def _parse_params(body: str, query: str) -> Params:
    """Body parameters, overridden by the query string's (as Binance documents)."""
    params = dict(urllib.parse.parse_qsl(body, keep_blank_values=True))
    params.update(urllib.parse.parse_qsl(query, keep_blank_values=True))
    return params


def _without_signature(text: str) -> tuple[str, str | None]:
    """``text`` without its ``signature`` parameter, and the signature found."""
    parts = text.split("&") if text else []
    kept = [p for p in parts if not p.startswith("signature=")]
    found = [p.removeprefix("signature=") for p in parts if p.startswith("signature=")]
    return "&".join(kept), (found[0] if found else None)


def _check_signature(secret: str, query: str, body: str) -> None:
    query_rest, in_query = _without_signature(query)
    body_rest, in_body = _without_signature(body)
    signature = in_query or in_body
    if not signature:
        raise _mandatory("signature")
    total_params = query_rest + body_rest
    expected = hmac.new(secret.encode(), total_params.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature.lower()):
        raise BinanceError(-1022, "Signature for this request is not valid.")


def _side(params: Params) -> str:
    side = params.get("side")
    if not side:
        raise _mandatory("side")
    if side not in ("BUY", "SELL"):
        raise BinanceError(-1117, "Invalid side.")
    return side


def _market_type_only(params: Params) -> None:
    order_type = params.get("type")
    if not order_type:
        raise _mandatory("type")
    if order_type != "MARKET":
        raise BinanceError(-1116, "Invalid orderType.")


def _client_order_id(params: Params, account: _Account, market: Market, serial: int) -> str:
    client_id = params.get("newClientOrderId") or f"web_{serial}"
    if not _CLIENT_ID.match(client_id):
        raise BinanceError(-4015, "Client order id is not valid.")
    if any(
        o.market == market and o.is_open and o.client_order_id == client_id for o in account.orders
    ):
        if market == "spot":
            raise BinanceError(-2010, "Duplicate order sent.")
        raise BinanceError(-4116, "ClientOrderId is duplicated.")
    return client_id


def _usdm_quantity(spec: SymbolSpec, params: Params) -> Decimal:
    quantity = _parse_decimal(params, "quantity")
    if quantity is None:
        raise _mandatory("quantity")
    if quantity <= 0:
        raise BinanceError(-4003, "Quantity less than or equal to zero.")
    if _decimals(quantity) > spec.qty_precision:
        raise BinanceError(-1111, "Precision is over the maximum defined for this asset.")
    if quantity < spec.min_qty:
        raise BinanceError(-4004, "Quantity less than min quantity.")
    if quantity > spec.market_max_qty:
        raise BinanceError(-4005, "Quantity greater than max quantity.")
    if quantity % spec.step != 0:
        raise BinanceError(-4023, "Quantity not increased by step size.")
    return quantity


def _position_side(account: _Account, params: Params, reduce_only: bool) -> str:
    side = params.get("positionSide", "BOTH")
    if side not in ("BOTH", "LONG", "SHORT"):
        raise BinanceError(-4060, "Invalid position side.")
    if account.hedge and reduce_only:
        raise BinanceError(-1106, "Parameter 'reduceonly' sent when not required.")
    if (side == "BOTH") == account.hedge:
        raise BinanceError(-4061, "Order's position side does not match user's setting.")
    return side


def _closes(side: str, position_side: str) -> bool:
    """Hedge mode: SELL on LONG and BUY on SHORT close a position."""
    return (side, position_side) in (("SELL", "LONG"), ("BUY", "SHORT"))


def _spot_fill(order: _Order) -> Json:
    return {
        "price": _spot_num(order.avg_price),
        "qty": _spot_num(order.executed),
        "commission": _spot_num(Decimal(0)),
        "commissionAsset": SPOT_SYMBOLS[order.symbol].quote,
        "tradeId": order.order_id,
    }


def _filters_common(spec: SymbolSpec) -> list[Json]:
    return [
        {
            "filterType": "PRICE_FILTER",
            "minPrice": _plain(spec.tick),
            "maxPrice": "4529764",
            "tickSize": _plain(spec.tick),
        },
        {
            "filterType": "LOT_SIZE",
            "minQty": _plain(spec.min_qty),
            "maxQty": _plain(spec.max_qty),
            "stepSize": _plain(spec.step),
        },
        {
            "filterType": "MARKET_LOT_SIZE",
            "minQty": _plain(spec.min_qty),
            "maxQty": _plain(spec.market_max_qty),
            "stepSize": _plain(spec.step),
        },
    ]


def _spot_symbol_info(spec: SymbolSpec) -> Json:
    notional = {
        "filterType": "NOTIONAL",
        "minNotional": _spot_num(spec.min_notional),
        "applyMinToMarket": True,
        "maxNotional": "9000000.00000000",
        "applyMaxToMarket": False,
        "avgPriceMins": 5,
    }
    return {
        "symbol": spec.symbol,
        "status": "TRADING",
        "baseAsset": spec.base,
        "baseAssetPrecision": 8,
        "quoteAsset": spec.quote,
        "quotePrecision": 8,
        "quoteAssetPrecision": 8,
        "baseCommissionPrecision": 8,
        "quoteCommissionPrecision": 8,
        "orderTypes": [
            "LIMIT",
            "LIMIT_MAKER",
            "MARKET",
            "STOP_LOSS",
            "STOP_LOSS_LIMIT",
            "TAKE_PROFIT",
            "TAKE_PROFIT_LIMIT",
        ],
        "icebergAllowed": True,
        "ocoAllowed": True,
        "otoAllowed": True,
        "quoteOrderQtyMarketAllowed": True,
        "allowTrailingStop": True,
        "cancelReplaceAllowed": True,
        "isSpotTradingAllowed": True,
        "isMarginTradingAllowed": True,
        "filters": [*_filters_common(spec), notional],
        "permissions": [],
        "permissionSets": [["SPOT", "MARGIN"]],
        "defaultSelfTradePreventionMode": "EXPIRE_MAKER",
        "allowedSelfTradePreventionModes": ["EXPIRE_TAKER", "EXPIRE_MAKER", "EXPIRE_BOTH"],
    }


def _usdm_symbol_info(spec: SymbolSpec) -> Json:
    return {
        "symbol": spec.symbol,
        "pair": spec.symbol,
        "contractType": "PERPETUAL",
        "deliveryDate": 4133404800000,
        "onboardDate": 1569398400000,
        "status": "TRADING",
        "maintMarginPercent": "2.5000",
        "requiredMarginPercent": "5.0000",
        "baseAsset": spec.base,
        "quoteAsset": spec.quote,
        "marginAsset": "USDT",
        "pricePrecision": spec.price_precision,
        "quantityPrecision": spec.qty_precision,
        "baseAssetPrecision": 8,
        "quotePrecision": 8,
        "underlyingType": "COIN",
        "underlyingSubType": ["PoW"],
        "triggerProtect": "0.0500",
        "liquidationFee": "0.012500",
        "marketTakeBound": "0.05",
        "maxMoveOrderLimit": 10000,
        "filters": [
            *_filters_common(spec),
            {"filterType": "MAX_NUM_ORDERS", "limit": 200},
            {"filterType": "MAX_NUM_ALGO_ORDERS", "limit": 10},
            {"filterType": "MIN_NOTIONAL", "notional": _plain(spec.min_notional)},
            {
                "filterType": "PERCENT_PRICE",
                "multiplierUp": "1.0500",
                "multiplierDown": "0.9500",
                "multiplierDecimal": "4",
            },
        ],
        "orderTypes": [
            "LIMIT",
            "MARKET",
            "STOP",
            "STOP_MARKET",
            "TAKE_PROFIT",
            "TAKE_PROFIT_MARKET",
            "TRAILING_STOP_MARKET",
        ],
        "timeInForce": ["GTC", "IOC", "FOK", "GTX", "GTD"],
    }


def point_ccxt_at(exchange: Any, origin: str) -> None:
    """Send every API call of a ccxt Binance exchange to ``origin`` (keeping the paths).

    ccxt chooses its market-specific error tables ("spot", "linear") by the URL's host
    (``https://api.binance.com/``, ``https://fapi.binance.com/``); at a local origin only the
    common table applies, so e.g. -2019 "Margin is insufficient." would become a bare
    ExchangeError. The market's table is therefore merged into the common one here, as the
    real hosts would select it.
    """
    exchange.urls["api"] = {
        name: origin + urllib.parse.urlsplit(url).path
        for name, url in exchange.urls["api"].items()
        if isinstance(url, str)
    }
    market = "linear" if exchange.id == "binanceusdm" else "spot"
    tables = exchange.exceptions
    specific = tables.get(market, {})
    tables["exact"] = {**tables["exact"], **specific.get("exact", {})}
    # broad keys are tried in order, the market's first (as ccxt does for the real hosts)
    broad = specific.get("broad", {})
    tables["broad"] = broad | {k: v for k, v in tables["broad"].items() if k not in broad}
