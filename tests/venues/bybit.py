"""A local Bybit V5 emulator: the unified trading account (UTA 2.0) trading USDT-settled linear
perpetuals (``category=linear``: BTCUSDT and ETHUSDT).

Follows Bybit's public V5 documentation (bybit-exchange.github.io/docs/v5: "Integration
Guidance" for authentication, "Error Codes", "Rate Limit Rules", market/time,
market/instrument, market/tickers, order/create-order, order/cancel-order, order/open-order,
order/order-list, position/position, position/position-mode, account/wallet-balance,
account/account-info, user/apikey-info, asset/coin-info) and, where the documentation names no
exact text, the bodies Bybit is seen sending.

Wire format
    Paths start at the root (``/v5/...``). Every answer is the envelope ``{"retCode", "retMsg",
    "result", "retExtInfo", "time"}``; errors are mostly HTTP 200 with a non-zero ``retCode``.
    Quantities, prices and money are strings (``"0.010"``, ``"60000.00"``); ``positionIdx``,
    ``triggerDirection`` are integers and ``reduceOnly`` is a boolean.

Authentication (private endpoints)
    Headers ``X-BAPI-API-KEY``, ``X-BAPI-TIMESTAMP``, ``X-BAPI-RECV-WINDOW`` (default 5000) and
    ``X-BAPI-SIGN`` = lowercase hex HMAC-SHA256 over ``timestamp + apiKey + recvWindow +
    payload``, the payload being the raw query string of a GET or the raw JSON body of a POST,
    exactly as received. Checked in Bybit's gateway order:

    * missing headers: 10001 ``empty value: apiTimestamp[..] apiKey[..] apiSignature[..]``;
    * ``server_time - recv_window <= timestamp < server_time + 1000`` else 10002 ``invalid
      request, please check your server timestamp or recv_window param. req_timestamp[..],
      server_timestamp[..],recv_window[..]``;
    * an unknown key: HTTP 401 with 10003 ``API key is invalid.``;
    * a wrong signature: 10004 ``error sign! origin_string[<payload>]``.

Endpoints
    Public: ``GET /v5/market/time``, ``GET /v5/market/instruments-info`` (``category``,
    ``symbol``, ``status`` (only ``Trading`` symbols exist; ``PreLaunch`` lists none),
    ``limit`` 1..1000 default 500, ``cursor``/``nextPageCursor``; spot, inverse and option
    answer empty lists), ``GET /v5/market/tickers``.
    Private: ``POST /v5/order/create``, ``POST /v5/order/cancel``, ``GET /v5/order/realtime``,
    ``GET /v5/order/history``, ``GET /v5/position/list``, ``POST /v5/position/switch-mode``,
    ``GET /v5/account/wallet-balance`` (``accountType=UNIFIED``), ``GET /v5/account/info``,
    ``GET /v5/user/query-api``, ``GET /v5/asset/coin/query-info``.

Orders (``orderType`` Market | Limit, ``qty`` a string)
    * A market order, or a limit order that is marketable at the set price, fills at once at
      the set price (``orderStatus`` Filled), unless ``fill_next_partially`` was called: then it
      fills only that fraction and stays ``PartiallyFilled`` (``New`` for a fraction of 0) until
      ``fill_resting``. A non-marketable limit order rests ``New`` and fills when ``set_price``
      makes it marketable. ``reject_next`` makes the next order acknowledged but ``Rejected``.
      Cancelling an open order gives ``Cancelled``. No trading fees are charged.
    * Refusals, checked in this order: ``category`` other than linear 10001; an unknown symbol
      10001 ``The requested symbol is invalid.``; a bad side / orderType 10001 ``params error:
      side invalid`` / ``params error: orderType invalid``; a malformed qty or one that is not a
      multiple of ``qtyStep`` 10001 ``Qty invalid``; below ``minOrderQty`` 10001 ``The number of
      contracts exceeds minimum limit allowed``; above ``maxOrderQty`` (``maxMktOrderQty`` for
      market orders) 10001 ``The number of contracts exceeds maximum limit allowed``; a reused
      ``orderLinkId`` 110072 ``OrderLinkedID is duplicate``; a ``positionIdx`` that does not fit
      the position mode (0 in one-way mode, 1 or 2 in hedge mode; absent means 0) 10001
      ``position idx not match position mode``; a reduce-only order with nothing to reduce
      110017 ``Reduce-only rule not satisfied`` (a larger reduce-only qty is cut to the
      position); an opening notional below ``minNotionalValue`` 110094 ``Order notional value
      below the lower limit``; an opening margin (notional / leverage 10) above the available
      balance 110007 ``ab not enough for new order``.
    * Hedge mode: positionIdx 1 is the long leg (Buy opens, Sell closes), 2 the short leg (Sell
      opens, Buy closes); a closing order needs no ``reduceOnly`` flag (ccxt omits it).
    * Lookups (realtime and history) honour Bybit's priority orderId > orderLinkId > symbol >
      settleCoin; ``realtime`` lists open orders only unless queried by orderId/orderLinkId or
      with ``openOnly=1``. An unknown order to cancel answers 110001 ``Order does not exist``.

Account
    USDT-margined unified wallet, leverage 10: ``equity = walletBalance + unrealisedPnl`` (mark
    = the set price), ``totalPositionIM = sum(size * avgPrice) / 10``, ``totalOrderIM`` = the
    opening margin of open orders' unfilled quantity, ``availableToWithdraw = equity -
    totalPositionIM - totalOrderIM`` (floored at 0). Closing realises PnL into the wallet.

Rate limiting
    Not enforced by itself; ``too_many_visits()`` (HTTP 200, retCode 10006 "Too many visits!"),
    ``system_busy()`` (HTTP 429) and ``ip_rate_limited()`` (HTTP 403 "access too frequent", the
    IP ban) build the answers for ``fault(..., Refuse)``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any

import attrs
from aiohttp import web

from venues.base import LocalVenue, PlacedOrder, Refuse, json_response

LEVERAGE = Decimal(10)
_ONE_WAY, _LONG, _SHORT = 0, 1, 2
_OPEN_STATUSES = ("New", "PartiallyFilled")
_COINS = ("USDT", "BTC", "ETH")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _plain(value: Decimal) -> str:
    """A decimal as Bybit prints free-form numbers: no exponent, no trailing zeros."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _places(step: Decimal) -> int:
    exponent = step.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _fixed(value: Decimal, step: Decimal) -> str:
    """A decimal with as many places as ``step`` (how Bybit prints qty and prices)."""
    return f"{value:.{_places(step)}f}"


def _envelope(code: int, message: str, result: Any) -> dict[str, Any]:
    return {
        "retCode": code,
        "retMsg": message,
        "result": result,
        "retExtInfo": {},
        "time": _now_ms(),
    }


def _limit_headers(limit: int = 20) -> dict[str, str]:
    return {
        "X-Bapi-Limit": str(limit),
        "X-Bapi-Limit-Status": str(limit - 1),
        "X-Bapi-Limit-Reset-Timestamp": str(_now_ms()),
    }


def too_many_visits() -> Refuse:
    """The per-UID rate limit answer: HTTP 200, retCode 10006 (ccxt: RateLimitExceeded)."""
    headers = {
        "X-Bapi-Limit": "10",
        "X-Bapi-Limit-Status": "0",
        "X-Bapi-Limit-Reset-Timestamp": str(_now_ms() + 1000),
    }
    return Refuse(200, _envelope(10006, "Too many visits!", {}), headers)


def system_busy() -> Refuse:
    """HTTP 429, Bybit's system-level frequency protection, answered by the gateway without
    the retCode envelope (ccxt: RateLimitExceeded from the status; a JSON body with a non-zero
    retCode would take precedence in ccxt and become ExchangeError)."""
    return Refuse(429, "429 Too Many Requests")


def ip_rate_limited() -> Refuse:
    """HTTP 403 "access too frequent": the IP limit breached, a ban of about ten minutes (ccxt:
    RateLimitExceeded through its 403 mapping)."""
    return Refuse(403, "403 Forbidden: access too frequent")


class BybitError(Exception):
    """A refusal answered as ``{"retCode": code, "retMsg": message}``."""

    def __init__(self, code: int, message: str, *, status: int = 200) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.status = status


def _params_error(message: str) -> BybitError:
    return BybitError(10001, message)


@attrs.frozen
class _Instrument:
    symbol: str
    base: str
    price_scale: int
    tick: Decimal
    min_price: Decimal
    max_price: Decimal
    min_qty: Decimal
    qty_step: Decimal
    max_qty: Decimal
    max_mkt_qty: Decimal
    min_notional: Decimal
    launch_time: str

    def price(self, value: Decimal) -> str:
        return f"{value:.{self.price_scale}f}"

    def qty(self, value: Decimal) -> str:
        return _fixed(value, self.qty_step)

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "contractType": "LinearPerpetual",
            "status": "Trading",
            "baseCoin": self.base,
            "quoteCoin": "USDT",
            "symbolType": "",
            "launchTime": self.launch_time,
            "deliveryTime": "0",
            "deliveryFeeRate": "",
            "priceScale": str(self.price_scale),
            "leverageFilter": {"minLeverage": "1", "maxLeverage": "100.00", "leverageStep": "0.01"},
            "priceFilter": {
                "minPrice": self.price(self.min_price),
                "maxPrice": self.price(self.max_price),
                "tickSize": self.price(self.tick),
            },
            "lotSizeFilter": {
                "maxOrderQty": self.qty(self.max_qty),
                "minOrderQty": self.qty(self.min_qty),
                "qtyStep": self.qty(self.qty_step),
                "postOnlyMaxOrderQty": self.qty(self.max_qty),
                "maxMktOrderQty": self.qty(self.max_mkt_qty),
                "minNotionalValue": _plain(self.min_notional),
            },
            "unifiedMarginTrade": True,
            "fundingInterval": 480,
            "settleCoin": "USDT",
            "copyTrading": "both",
            "upperFundingRate": "0.005",
            "lowerFundingRate": "-0.005",
            "isPreListing": False,
            "preListingInfo": None,
            "displayName": "",
        }


_INSTRUMENTS = {
    "BTCUSDT": _Instrument(
        symbol="BTCUSDT",
        base="BTC",
        price_scale=2,
        tick=Decimal("0.10"),
        min_price=Decimal("0.10"),
        max_price=Decimal("1999999.80"),
        min_qty=Decimal("0.001"),
        qty_step=Decimal("0.001"),
        max_qty=Decimal("1190.000"),
        max_mkt_qty=Decimal("500.000"),
        min_notional=Decimal(5),
        launch_time="1585526400000",
    ),
    "ETHUSDT": _Instrument(
        symbol="ETHUSDT",
        base="ETH",
        price_scale=2,
        tick=Decimal("0.01"),
        min_price=Decimal("0.01"),
        max_price=Decimal("199999.98"),
        min_qty=Decimal("0.01"),
        qty_step=Decimal("0.01"),
        max_qty=Decimal("7240.00"),
        max_mkt_qty=Decimal("3620.00"),
        min_notional=Decimal(5),
        launch_time="1615766400000",
    ),
}
_DEFAULT_PRICES = {"BTCUSDT": Decimal(60000), "ETHUSDT": Decimal(3000)}


@attrs.define
class _Leg:
    """One position: signed quantity (the short leg of hedge mode is negative)."""

    qty: Decimal = Decimal(0)
    avg: Decimal = Decimal(0)
    realised: Decimal = Decimal(0)
    created: int = attrs.field(factory=_now_ms)
    updated: int = attrs.field(factory=_now_ms)

    def apply(self, delta: Decimal, price: Decimal) -> Decimal:
        """Add a fill of signed ``delta`` at ``price``; returns the realised PnL."""
        self.updated = _now_ms()
        if self.qty == 0 or (self.qty > 0) == (delta > 0):
            total = self.qty + delta
            self.avg = (abs(self.qty) * self.avg + abs(delta) * price) / abs(total)
            self.qty = total
            return Decimal(0)
        closed = min(abs(delta), abs(self.qty))
        pnl = closed * (price - self.avg) * (1 if self.qty > 0 else -1)
        total = self.qty + delta
        if total == 0:
            self.avg = Decimal(0)
        elif (total > 0) != (self.qty > 0):
            self.avg = price
        self.qty = total
        self.realised += pnl
        return pnl


@attrs.define
class _Order:
    order_id: str
    link_id: str
    symbol: str
    side: str  # "Buy" | "Sell"
    order_type: str  # "Market" | "Limit"
    qty: Decimal
    price: Decimal | None
    position_idx: int
    reduce_only: bool
    status: str = "New"
    filled: Decimal = Decimal(0)
    value: Decimal = Decimal(0)
    reject_reason: str = "EC_NoError"
    cancel_type: str = "UNKNOWN"
    created: int = attrs.field(factory=_now_ms)
    updated: int = attrs.field(factory=_now_ms)

    @property
    def leaves(self) -> Decimal:
        return self.qty - self.filled if self.status in _OPEN_STATUSES else Decimal(0)

    @property
    def sign(self) -> int:
        return 1 if self.side == "Buy" else -1


@attrs.define
class _Account:
    api_key: str
    secret: str
    wallet: Decimal
    user_id: int
    hedge: bool = False
    orders: list[_Order] = attrs.field(factory=list)
    legs: dict[tuple[str, int], _Leg] = attrs.field(factory=dict)

    def leg(self, symbol: str, idx: int) -> _Leg:
        return self.legs.setdefault((symbol, idx), _Leg())


@attrs.frozen
class _Call:
    params: dict[str, Any]
    account: _Account | None


Action = Callable[[_Call], Any]


class BybitVenue(LocalVenue):
    """Bybit V5 (unified account, linear perpetuals) on 127.0.0.1; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._accounts: dict[str, _Account] = {}
        self._prices: dict[str, Decimal] = dict(_DEFAULT_PRICES)
        self._partial: Decimal | None = None
        self._reject_next: str | None = None
        public: dict[str, Action] = {
            "/v5/market/time": self._market_time,
            "/v5/market/instruments-info": self._instruments_info,
            "/v5/market/tickers": self._tickers,
        }
        private_get: dict[str, Action] = {
            "/v5/order/realtime": self._order_realtime,
            "/v5/order/history": self._order_history,
            "/v5/position/list": self._position_list,
            "/v5/account/wallet-balance": self._wallet_balance,
            "/v5/account/info": self._account_info,
            "/v5/user/query-api": self._query_api,
            "/v5/asset/coin/query-info": self._coin_info,
        }
        private_post: dict[str, Action] = {
            "/v5/order/create": self._order_create,
            "/v5/order/cancel": self._order_cancel,
            "/v5/position/switch-mode": self._switch_mode,
        }
        for path, action in public.items():
            self.app.router.add_get(path, self._endpoint(action, private=False))
        for path, action in private_get.items():
            self.app.router.add_get(path, self._endpoint(action, private=True))
        for path, action in private_post.items():
            self.app.router.add_post(path, self._endpoint(action, private=True))

    # ----------------------------------------------------------------- controls

    def add_account(
        self, api_key: str, api_secret: str, *, cash: Decimal = Decimal(100_000)
    ) -> None:
        """A unified account holding ``cash`` USDT, one-way position mode."""
        user_id = 100_000 + len(self._accounts) + 1
        self._accounts[api_key] = _Account(api_key, api_secret, Decimal(cash), user_id)

    def set_price(self, symbol: str, price: Decimal) -> None:
        """Last, mark and index price of ``symbol``; resting limit orders that become
        marketable fill."""
        self._instrument(symbol)
        self._prices[symbol] = Decimal(price)
        for account in self._accounts.values():
            for order in account.orders:
                resting = order.order_type == "Limit" and order.status in _OPEN_STATUSES
                if order.symbol == symbol and resting and self._marketable(order):
                    self._fill(account, order, order.leaves)

    def set_position(self, api_key: str, symbol: str, quantity: Decimal) -> None:
        """Replace the position with signed ``quantity`` entered at the set price (hedge mode:
        the long leg for a positive, the short leg for a negative quantity)."""
        account = self._accounts[api_key]
        self._instrument(symbol)
        for idx in (_ONE_WAY, _LONG, _SHORT):
            account.legs.pop((symbol, idx), None)
        quantity = Decimal(quantity)
        if quantity == 0:
            return
        idx = _ONE_WAY if not account.hedge else (_LONG if quantity > 0 else _SHORT)
        account.legs[(symbol, idx)] = _Leg(qty=quantity, avg=self._prices[symbol])

    def position(self, api_key: str, symbol: str) -> Decimal:
        """Signed net position (long minus short), 0 when flat."""
        account = self._accounts[api_key]
        return sum((leg.qty for (sym, _), leg in account.legs.items() if sym == symbol), Decimal(0))

    def placed(self, api_key: str) -> list[PlacedOrder]:
        """Every order the venue acknowledged for this key, oldest first."""
        return [
            PlacedOrder(
                client_order_id=order.link_id,
                symbol=order.symbol,
                side=order.side.lower(),
                quantity=order.qty,
                filled=order.filled,
                reduce_only=order.reduce_only,
                status=order.status,
            )
            for order in self._accounts[api_key].orders
        ]

    def fill_next_partially(self, fraction: Decimal) -> None:
        """The next order that executes on arrival fills only ``fraction`` (rounded down to
        the qty step) and stays open until ``fill_resting``."""
        self._partial = Decimal(fraction)

    def fill_resting(self) -> None:
        """Fill, at the set price, what partially filled market orders (and marketable limit
        orders) left open."""
        for account in self._accounts.values():
            for order in account.orders:
                if order.status in _OPEN_STATUSES and self._marketable(order):
                    self._fill(account, order, order.leaves)

    def set_hedge_mode(self, api_key: str, on: bool) -> None:
        """Both-side (hedge) position mode for every USDT perpetual of this account; open
        positions move to the matching leg (a symbol held both long and short cannot go back to
        one-way mode)."""
        account = self._accounts[api_key]
        moved: dict[tuple[str, int], _Leg] = {}
        for (symbol, _), leg in account.legs.items():
            if leg.qty == 0:
                continue
            idx = (_LONG if leg.qty > 0 else _SHORT) if on else _ONE_WAY
            if (symbol, idx) in moved:
                raise ValueError(f"{symbol} is held long and short: close one side first")
            moved[(symbol, idx)] = leg
        account.legs, account.hedge = moved, on

    def reject_next(self, reason: str = "EC_NoImmediateQtyToFill") -> None:
        """The next order is acknowledged by ``/v5/order/create`` but ends ``Rejected``."""
        self._reject_next = reason

    # ----------------------------------------------------------------- plumbing

    def _endpoint(
        self, action: Action, *, private: bool
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            headers = _limit_headers() if private else None
            try:
                call = await self._read(request, private=private)
                result = action(call)
            except BybitError as error:
                body = _envelope(error.code, error.message, {})
                return json_response(body, status=error.status, headers=headers)
            return json_response(_envelope(0, "OK", result), headers=headers)

        return handle

    async def _read(self, request: web.Request, *, private: bool) -> _Call:
        if request.method == "GET":
            payload = request.rel_url.raw_query_string
            params: dict[str, Any] = dict(request.query)
        else:
            payload = await request.text()
            params = self._json_body(payload)
        account = self._authenticate(request, payload) if private else None
        return _Call(params, account)

    @staticmethod
    def _json_body(payload: str) -> dict[str, Any]:
        try:
            body = json.loads(payload) if payload else {}
        except ValueError:
            raise _params_error("body not json") from None
        if not isinstance(body, dict):
            raise _params_error("body not json")
        return body

    def _authenticate(self, request: web.Request, payload: str) -> _Account:
        key = request.headers.get("X-BAPI-API-KEY", "")
        timestamp = request.headers.get("X-BAPI-TIMESTAMP", "")
        signature = request.headers.get("X-BAPI-SIGN", "")
        window = request.headers.get("X-BAPI-RECV-WINDOW", "")
        if not (key and timestamp and signature):
            raise _params_error(
                f"empty value: apiTimestamp[{timestamp}] apiKey[{key}] apiSignature[{signature}]"
            )
        self._check_timestamp(timestamp, window)
        account = self._accounts.get(key)
        if account is None:
            raise BybitError(10003, "API key is invalid.", status=401)
        origin = timestamp + key + window + payload
        expected = hmac.new(account.secret.encode(), origin.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            raise BybitError(10004, f"error sign! origin_string[{origin}]")
        return account

    @staticmethod
    def _check_timestamp(timestamp: str, window: str) -> None:
        try:
            sent = int(timestamp)
        except ValueError:
            raise _params_error("openapi params error! req_timestamp invalid") from None
        try:
            recv_window = int(window) if window else 5000
        except ValueError:
            raise _params_error("openapi params error! recv_window invalid") from None
        now = _now_ms()
        if sent >= now + 1000 or sent < now - recv_window:
            raise BybitError(
                10002,
                "invalid request, please check your server timestamp or recv_window param. "
                f"req_timestamp[{sent}],server_timestamp[{now}],recv_window[{recv_window}]",
            )

    @staticmethod
    def _instrument(symbol: str) -> _Instrument:
        instrument = _INSTRUMENTS.get(symbol)
        if instrument is None:
            raise ValueError(f"the emulator lists only {sorted(_INSTRUMENTS)}, not {symbol!r}")
        return instrument

    @staticmethod
    def _linear(params: dict[str, Any]) -> None:
        if params.get("category") != "linear":
            raise _params_error("Illegal category")

    @staticmethod
    def _account(call: _Call) -> _Account:
        assert call.account is not None  # private endpoints always authenticate
        return call.account

    # ----------------------------------------------------------------- market data

    def _market_time(self, call: _Call) -> dict[str, Any]:
        nanos = time.time_ns()
        return {"timeSecond": str(nanos // 1_000_000_000), "timeNano": str(nanos)}

    def _instruments_info(self, call: _Call) -> dict[str, Any]:
        params = call.params
        category = params.get("category")
        if category not in ("spot", "linear", "inverse", "option"):
            raise _params_error("Illegal category")
        rows: list[dict[str, Any]] = []
        if category == "linear" and params.get("status", "Trading") == "Trading":
            rows = [
                instrument.to_json()
                for instrument in _INSTRUMENTS.values()
                if params.get("symbol") in (None, instrument.symbol)
                and params.get("baseCoin") in (None, instrument.base)
            ]
        limit = self._int_param(params, "limit", 500, 1, 1000)
        start = self._int_param(params, "cursor", 0, 0, len(rows))
        page = rows[start : start + limit]
        more = start + limit < len(rows)
        result: dict[str, Any] = {"category": category, "list": page}
        if category != "spot":
            result["nextPageCursor"] = str(start + limit) if more else ""
        return result

    @staticmethod
    def _int_param(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
        raw = params.get(name)
        if raw in (None, ""):
            return default
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise _params_error(f"params error: {name} invalid") from None
        if not low <= value <= max(low, high):
            raise _params_error(f"params error: {name} invalid")
        return value

    def _tickers(self, call: _Call) -> dict[str, Any]:
        self._linear(call.params)
        symbol = call.params.get("symbol")
        if symbol is not None and symbol not in _INSTRUMENTS:
            raise _params_error("Not supported symbols")
        symbols = [symbol] if symbol else list(_INSTRUMENTS)
        return {"category": "linear", "list": [self._ticker(s) for s in symbols]}

    def _ticker(self, symbol: str) -> dict[str, Any]:
        instrument = _INSTRUMENTS[symbol]
        price = instrument.price(self._prices[symbol])
        return {
            "symbol": symbol,
            "lastPrice": price,
            "indexPrice": price,
            "markPrice": price,
            "prevPrice24h": price,
            "price24hPcnt": "0",
            "highPrice24h": price,
            "lowPrice24h": price,
            "prevPrice1h": price,
            "openInterest": "0",
            "openInterestValue": "0",
            "turnover24h": "0",
            "volume24h": "0",
            "fundingRate": "0.0001",
            "nextFundingTime": str((_now_ms() // 28_800_000 + 1) * 28_800_000),
            "predictedDeliveryPrice": "",
            "basisRate": "",
            "deliveryFeeRate": "",
            "deliveryTime": "0",
            "ask1Size": "1",
            "bid1Price": price,
            "ask1Price": price,
            "bid1Size": "1",
            "basis": "",
        }

    # ----------------------------------------------------------------- orders

    def _order_create(self, call: _Call) -> dict[str, str]:
        account = self._account(call)
        order = self._new_order(account, call.params)
        account.orders.append(order)
        if self._reject_next is not None:
            order.status, order.reject_reason = "Rejected", self._reject_next
            self._reject_next = None
        elif order.order_type == "Market" or self._marketable(order):
            self._execute_on_arrival(account, order)
        return {"orderId": order.order_id, "orderLinkId": order.link_id}

    def _new_order(self, account: _Account, params: dict[str, Any]) -> _Order:
        self._linear(params)
        instrument = _INSTRUMENTS.get(str(params.get("symbol", "")))
        if instrument is None:
            raise _params_error("The requested symbol is invalid.")
        side, order_type = params.get("side"), params.get("orderType")
        if side not in ("Buy", "Sell"):
            raise _params_error("params error: side invalid")
        if order_type not in ("Market", "Limit"):
            raise _params_error("params error: orderType invalid")
        qty = self._quantity(instrument, params.get("qty"), market=order_type == "Market")
        price = (
            self._limit_price(instrument, params.get("price")) if order_type == "Limit" else None
        )
        link_id = self._link_id(account, params.get("orderLinkId"))
        idx = self._position_idx(account, params.get("positionIdx"))
        order = _Order(
            order_id=str(uuid.uuid4()),
            link_id=link_id,
            symbol=instrument.symbol,
            side=side,
            order_type=order_type,
            qty=qty,
            price=price,
            position_idx=idx,
            reduce_only=self._flag(params.get("reduceOnly")),
        )
        self._check_reduce(account, order)
        self._check_margin(account, order, instrument)
        return order

    @staticmethod
    def _quantity(instrument: _Instrument, raw: Any, *, market: bool) -> Decimal:
        try:
            qty = Decimal(str(raw)) if isinstance(raw, str | int | float) else None
        except InvalidOperation:
            qty = None
        if qty is None or not qty.is_finite() or qty <= 0:
            raise _params_error("Qty invalid")
        if qty < instrument.min_qty:
            raise _params_error("The number of contracts exceeds minimum limit allowed")
        if qty % instrument.qty_step != 0:
            raise _params_error("Qty invalid")
        if qty > (instrument.max_mkt_qty if market else instrument.max_qty):
            raise _params_error("The number of contracts exceeds maximum limit allowed")
        return qty

    @staticmethod
    def _limit_price(instrument: _Instrument, raw: Any) -> Decimal:
        try:
            price = Decimal(str(raw)) if isinstance(raw, str | int | float) else None
        except InvalidOperation:
            price = None
        if (
            price is None
            or not price.is_finite()
            or not instrument.min_price <= price <= instrument.max_price
            or price % instrument.tick != 0
        ):
            raise _params_error("params error: price invalid")
        return price

    @staticmethod
    def _link_id(account: _Account, raw: Any) -> str:
        if raw in (None, ""):
            return ""
        link_id = str(raw)
        allowed = all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in link_id)
        if len(link_id) > 36 or not allowed:
            raise _params_error("params error: orderLinkId invalid")
        if any(order.link_id == link_id for order in account.orders):
            raise BybitError(110072, "OrderLinkedID is duplicate")
        return link_id

    @staticmethod
    def _position_idx(account: _Account, raw: Any) -> int:
        try:
            idx = int(raw) if raw not in (None, "") else _ONE_WAY
        except (TypeError, ValueError):
            raise _params_error("params error: positionIdx invalid") from None
        if idx not in (_ONE_WAY, _LONG, _SHORT):
            raise _params_error("params error: positionIdx invalid")
        if (idx != _ONE_WAY) != account.hedge:
            raise _params_error("position idx not match position mode")
        return idx

    @staticmethod
    def _flag(raw: Any) -> bool:
        return raw is True or (isinstance(raw, str) and raw.lower() == "true")

    def _reducible(self, account: _Account, order: _Order) -> Decimal:
        """How much position ``order`` could reduce on its leg (0 if it would add to it)."""
        if (order.position_idx, order.side) in ((_LONG, "Buy"), (_SHORT, "Sell")):
            return Decimal(0)
        leg = account.legs.get((order.symbol, order.position_idx))
        held = leg.qty if leg is not None else Decimal(0)
        if held == 0 or (held > 0) == (order.sign > 0):
            return Decimal(0)
        return abs(held)

    def _is_closing(self, order: _Order) -> bool:
        """Hedge mode: Sell on the long leg and Buy on the short leg close it."""
        return (order.position_idx, order.side) in ((_LONG, "Sell"), (_SHORT, "Buy"))

    def _check_reduce(self, account: _Account, order: _Order) -> None:
        if not (order.reduce_only or self._is_closing(order)):
            return
        reducible = self._reducible(account, order)
        if reducible == 0:
            raise BybitError(110017, "Reduce-only rule not satisfied")
        order.qty = min(order.qty, reducible)

    def _opening_qty(self, account: _Account, order: _Order, qty: Decimal) -> Decimal:
        if order.reduce_only or self._is_closing(order):
            return Decimal(0)
        if order.position_idx != _ONE_WAY:
            return qty
        leg = account.legs.get((order.symbol, _ONE_WAY))
        held = leg.qty if leg is not None else Decimal(0)
        if held == 0 or (held > 0) == (order.sign > 0):
            return qty
        return max(Decimal(0), qty - abs(held))

    def _check_margin(self, account: _Account, order: _Order, instrument: _Instrument) -> None:
        opening = self._opening_qty(account, order, order.qty)
        if opening == 0:
            return
        price = self._order_price(order)
        if opening * price < instrument.min_notional:
            raise BybitError(110094, "Order notional value below the lower limit")
        if opening * price / LEVERAGE > self._available(account):
            raise BybitError(110007, "ab not enough for new order")

    def _order_price(self, order: _Order) -> Decimal:
        return order.price if order.price is not None else self._prices[order.symbol]

    def _marketable(self, order: _Order) -> bool:
        if order.price is None:
            return True
        mark = self._prices[order.symbol]
        return mark <= order.price if order.side == "Buy" else mark >= order.price

    def _execute_on_arrival(self, account: _Account, order: _Order) -> None:
        qty = order.qty
        if self._partial is not None:
            step = _INSTRUMENTS[order.symbol].qty_step
            qty = (order.qty * self._partial / step).to_integral_value(ROUND_DOWN) * step
            self._partial = None
        self._fill(account, order, qty)

    def _fill(self, account: _Account, order: _Order, qty: Decimal) -> None:
        reducing = order.reduce_only or self._is_closing(order)
        if reducing:
            qty = min(qty, self._reducible(account, order))
        if qty > 0:
            price = self._prices[order.symbol]
            leg = account.leg(order.symbol, order.position_idx)
            account.wallet += leg.apply(order.sign * qty, price)
            order.filled += qty
            order.value += qty * price
            order.updated = _now_ms()
            order.status = "Filled" if order.filled == order.qty else "PartiallyFilled"
        if reducing and order.leaves and self._reducible(account, order) == 0:
            order.status, order.cancel_type = "Cancelled", "CancelByReduceOnly"
            order.updated = _now_ms()

    def _order_cancel(self, call: _Call) -> dict[str, str]:
        account = self._account(call)
        self._linear(call.params)
        found = self._select(account.orders, call.params)
        if not found or found[0].status not in _OPEN_STATUSES:
            raise BybitError(110001, "Order does not exist")
        order = found[0]
        order.status, order.cancel_type, order.updated = "Cancelled", "CancelByUser", _now_ms()
        return {"orderId": order.order_id, "orderLinkId": order.link_id}

    @staticmethod
    def _select(orders: list[_Order], params: dict[str, Any]) -> list[_Order]:
        """Bybit's lookup priority: orderId > orderLinkId > symbol > baseCoin > settleCoin."""
        if params.get("orderId"):
            chosen = [o for o in orders if o.order_id == params["orderId"]]
        elif params.get("orderLinkId"):
            chosen = [o for o in orders if o.link_id == params["orderLinkId"]]
        elif params.get("symbol"):
            chosen = [o for o in orders if o.symbol == params["symbol"]]
        elif params.get("baseCoin"):
            chosen = [o for o in orders if _INSTRUMENTS[o.symbol].base == params["baseCoin"]]
        elif params.get("settleCoin") not in (None, "USDT"):
            chosen = []
        else:
            chosen = list(orders)
        return chosen[::-1]  # newest first, as Bybit sorts by createdTime

    def _order_realtime(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        params = call.params
        self._linear(params)
        keys = ("symbol", "baseCoin", "settleCoin", "orderId", "orderLinkId")
        if not any(params.get(k) for k in keys):
            raise _params_error("Missing some parameters that must be filled in")
        orders = self._select(account.orders, params)
        by_id = bool(params.get("orderId") or params.get("orderLinkId"))
        if not by_id and str(params.get("openOnly", "0")) == "0":
            orders = [o for o in orders if o.status in _OPEN_STATUSES]
        return self._order_page(orders, params)

    def _order_history(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        params = call.params
        self._linear(params)
        orders = self._select(account.orders, params)
        if params.get("orderStatus"):
            orders = [o for o in orders if o.status == params["orderStatus"]]
        return self._order_page(orders, params)

    def _order_page(self, orders: list[_Order], params: dict[str, Any]) -> dict[str, Any]:
        limit = self._int_param(params, "limit", 20, 1, 50)
        start = self._int_param(params, "cursor", 0, 0, len(orders))
        page = orders[start : start + limit]
        more = start + limit < len(orders)
        return {
            "category": "linear",
            "list": [self._order_json(o) for o in page],
            "nextPageCursor": str(start + limit) if more else "",
        }

    def _order_json(self, order: _Order) -> dict[str, Any]:
        instrument = _INSTRUMENTS[order.symbol]
        average = order.value / order.filled if order.filled else None
        leaves = order.leaves
        return {
            "orderId": order.order_id,
            "orderLinkId": order.link_id,
            "blockTradeId": "",
            "symbol": order.symbol,
            "price": instrument.price(order.price) if order.price is not None else "0",
            "qty": instrument.qty(order.qty),
            "side": order.side,
            "isLeverage": "",
            "positionIdx": order.position_idx,
            "orderStatus": order.status,
            "createType": "CreateByUser",
            "cancelType": order.cancel_type,
            "rejectReason": order.reject_reason,
            "avgPrice": _plain(average) if average is not None else "",
            "leavesQty": instrument.qty(leaves),
            "leavesValue": _plain(leaves * self._order_price(order)),
            "cumExecQty": instrument.qty(order.filled),
            "cumExecValue": _plain(order.value),
            "cumExecFee": "0",
            "timeInForce": "IOC" if order.order_type == "Market" else "GTC",
            "orderType": order.order_type,
            "stopOrderType": "",
            "orderIv": "",
            "triggerPrice": "",
            "takeProfit": "",
            "stopLoss": "",
            "tpTriggerBy": "",
            "slTriggerBy": "",
            "triggerDirection": 0,
            "triggerBy": "",
            "lastPriceOnCreated": instrument.price(self._prices[order.symbol]),
            "reduceOnly": order.reduce_only,
            "closeOnTrigger": False,
            "placeType": "",
            "smpType": "None",
            "smpGroup": 0,
            "smpOrderId": "",
            "tpslMode": "",
            "tpLimitPrice": "",
            "slLimitPrice": "",
            "createdTime": str(order.created),
            "updatedTime": str(order.updated),
        }

    # ----------------------------------------------------------------- positions

    def _position_list(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        params = call.params
        self._linear(params)
        symbol = params.get("symbol")
        if symbol:
            if symbol not in _INSTRUMENTS:
                raise _params_error("The requested symbol is invalid.")
            rows = [self._position_json(account, symbol, idx) for idx in self._indexes(account)]
        elif params.get("settleCoin") == "USDT" or params.get("baseCoin"):
            rows = [
                self._position_json(account, sym, idx)
                for (sym, idx), leg in sorted(account.legs.items())
                if leg.qty != 0 and params.get("baseCoin") in (None, _INSTRUMENTS[sym].base)
            ]
        else:
            raise _params_error("Missing some parameters that must be filled in")
        return {"category": "linear", "list": rows, "nextPageCursor": ""}

    @staticmethod
    def _indexes(account: _Account) -> tuple[int, ...]:
        return (_LONG, _SHORT) if account.hedge else (_ONE_WAY,)

    def _position_json(self, account: _Account, symbol: str, idx: int) -> dict[str, Any]:
        instrument = _INSTRUMENTS[symbol]
        leg = account.legs.get((symbol, idx), _Leg())
        mark = self._prices[symbol]
        size = abs(leg.qty)
        value = size * leg.avg
        side = "" if leg.qty == 0 else ("Buy" if leg.qty > 0 else "Sell")
        return {
            "positionIdx": idx,
            "riskId": 1,
            "riskLimitValue": "2000000",
            "symbol": symbol,
            "side": side,
            "size": instrument.qty(size),
            "avgPrice": _plain(leg.avg),
            "positionValue": _plain(value),
            "tradeMode": 0,
            "autoAddMargin": 0,
            "positionStatus": "Normal",
            "leverage": _plain(LEVERAGE),
            "markPrice": instrument.price(mark),
            "liqPrice": "",
            "bustPrice": "",
            "positionIM": _plain(value / LEVERAGE),
            "positionMM": _plain(value / LEVERAGE / 20),
            "positionBalance": _plain(value / LEVERAGE),
            "tpslMode": "Full",
            "takeProfit": "",
            "stopLoss": "",
            "trailingStop": "0",
            "unrealisedPnl": _plain((mark - leg.avg) * leg.qty),
            "curRealisedPnl": _plain(leg.realised),
            "cumRealisedPnl": _plain(leg.realised),
            "adlRankIndicator": 2 if size else 0,
            "isReduceOnly": False,
            "mmrSysUpdatedTime": "",
            "leverageSysUpdatedTime": "",
            "createdTime": str(leg.created),
            "updatedTime": str(leg.updated),
            "seq": -1,
        }

    def _switch_mode(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        params = call.params
        self._linear(params)
        if not (params.get("symbol") or params.get("coin")):
            raise _params_error("Missing some parameters that must be filled in")
        if str(params.get("mode")) not in ("0", "3"):
            raise _params_error("params error: mode invalid")
        hedge = str(params["mode"]) == "3"
        if hedge == account.hedge:
            raise BybitError(110025, "Position mode is not modified")
        if any(leg.qty for leg in account.legs.values()):
            raise BybitError(
                110024, "You have an existing position, so the position mode cannot be switched."
            )
        if any(o.status in _OPEN_STATUSES for o in account.orders):
            raise BybitError(
                110028, "You have existing open orders, so the position mode cannot be switched."
            )
        account.hedge = hedge
        return {}

    # ----------------------------------------------------------------- account

    def _upl(self, account: _Account) -> Decimal:
        return sum(
            ((self._prices[sym] - leg.avg) * leg.qty for (sym, _), leg in account.legs.items()),
            Decimal(0),
        )

    @staticmethod
    def _position_im(account: _Account) -> Decimal:
        return sum((abs(leg.qty) * leg.avg for leg in account.legs.values()), Decimal(0)) / LEVERAGE

    def _order_im(self, account: _Account) -> Decimal:
        total = Decimal(0)
        for order in account.orders:
            if order.status in _OPEN_STATUSES:
                opening = self._opening_qty(account, order, order.leaves)
                total += opening * self._order_price(order) / LEVERAGE
        return total

    def _available(self, account: _Account) -> Decimal:
        free = account.wallet + self._upl(account)
        return free - self._position_im(account) - self._order_im(account)

    def _wallet_balance(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        if call.params.get("accountType") != "UNIFIED":
            raise _params_error("accountType only support UNIFIED.")
        upl, position_im = self._upl(account), self._position_im(account)
        order_im = self._order_im(account)
        equity = account.wallet + upl
        available = max(Decimal(0), equity - position_im - order_im)
        wanted = str(call.params.get("coin") or "").split(",")
        coins = []
        if (account.wallet or upl) and (wanted == [""] or "USDT" in wanted):
            coins.append(self._coin_json(account, equity, available, upl, position_im, order_im))
        return {
            "list": [
                {
                    "accountType": "UNIFIED",
                    "accountIMRate": _plain(self._rate(position_im + order_im, equity)),
                    "accountMMRate": _plain(self._rate(position_im / 20, equity)),
                    "totalEquity": _plain(equity),
                    "totalWalletBalance": _plain(account.wallet),
                    "totalMarginBalance": _plain(equity),
                    "totalAvailableBalance": _plain(available),
                    "totalPerpUPL": _plain(upl),
                    "totalInitialMargin": _plain(position_im + order_im),
                    "totalMaintenanceMargin": _plain(position_im / 20),
                    "coin": coins,
                }
            ]
        }

    @staticmethod
    def _rate(part: Decimal, whole: Decimal) -> Decimal:
        return (part / whole).quantize(Decimal("0.0001")) if whole > 0 else Decimal(0)

    @staticmethod
    def _coin_json(
        account: _Account,
        equity: Decimal,
        available: Decimal,
        upl: Decimal,
        position_im: Decimal,
        order_im: Decimal,
    ) -> dict[str, Any]:
        realised = sum((leg.realised for leg in account.legs.values()), Decimal(0))
        return {
            "coin": "USDT",
            "equity": _plain(equity),
            "usdValue": _plain(equity),
            "walletBalance": _plain(account.wallet),
            "locked": "0",
            "spotHedgingQty": "0",
            "borrowAmount": "0",
            "availableToBorrow": "",
            "availableToWithdraw": _plain(available),
            "accruedInterest": "0",
            "totalOrderIM": _plain(order_im),
            "totalPositionIM": _plain(position_im),
            "totalPositionMM": _plain(position_im / 20),
            "unrealisedPnl": _plain(upl),
            "cumRealisedPnl": _plain(realised),
            "bonus": "0",
            "marginCollateral": True,
            "collateralSwitch": True,
        }

    def _account_info(self, call: _Call) -> dict[str, Any]:
        return {
            "unifiedMarginStatus": 5,  # 5: UTA 2.0
            "marginMode": "REGULAR_MARGIN",
            "isMasterTrader": False,
            "spotHedgingStatus": "OFF",
            "updatedTime": "1700000000000",
            "dcpStatus": "OFF",
            "timeWindow": 10,
            "smpGroup": 0,
        }

    def _query_api(self, call: _Call) -> dict[str, Any]:
        account = self._account(call)
        return {
            "id": str(account.user_id * 10),
            "note": "tradecore",
            "apiKey": account.api_key,
            "readOnly": 0,
            "secret": "",
            "permissions": {
                "ContractTrade": ["Order", "Position"],
                "Spot": ["SpotTrade"],
                "Wallet": ["AccountTransfer"],
                "Options": ["OptionsTrade"],
                "Derivatives": [],
                "CopyTrading": [],
                "BlockTrade": [],
                "Exchange": [],
                "NFT": [],
                "Affiliate": [],
                "Earn": [],
            },
            "ips": ["*"],
            "type": 1,
            "deadlineDay": -1,
            "expiredAt": "",
            "createdAt": "2024-01-01T00:00:00Z",
            "unified": 0,
            "uta": 1,
            "userID": account.user_id,
            "inviterID": 0,
            "vipLevel": "No VIP",
            "mktMakerLevel": "0",
            "affiliateID": 0,
            "rsaPublicKey": "",
            "isMaster": True,
            "parentUid": "0",
            "kycLevel": "LEVEL_DEFAULT",
            "kycRegion": "",
        }

    def _coin_info(self, call: _Call) -> dict[str, Any]:
        wanted = call.params.get("coin")
        rows = [self._coin_row(coin) for coin in _COINS if wanted in (None, "", coin)]
        return {"rows": rows}

    @staticmethod
    def _coin_row(coin: str) -> dict[str, Any]:
        chain = {"USDT": "ETH", "BTC": "BTC", "ETH": "ETH"}[coin]
        return {
            "name": coin,
            "coin": coin,
            "remainAmount": "1000000",
            "chains": [
                {
                    "chainType": chain,
                    "confirmation": "6",
                    "withdrawFee": "0.0005" if coin != "USDT" else "1",
                    "depositMin": "0",
                    "withdrawMin": "0.001" if coin != "USDT" else "10",
                    "chain": chain,
                    "chainDeposit": "1",
                    "chainWithdraw": "1",
                    "minAccuracy": "8" if coin != "USDT" else "4",
                    "withdrawPercentageFee": "0",
                    "contractAddress": "",
                    "safeConfirmNumber": "6",
                }
            ],
        }
