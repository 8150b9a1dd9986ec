"""A local Alpaca Trading API v2 emulator (US equities, paper account semantics).

Follows Alpaca's public Trading API documentation (docs.alpaca.markets: "Placing Orders",
"Fractional Trading", the API reference for accounts, assets, clock, orders and positions) and,
where the documentation names no exact error text, the error bodies Alpaca is seen sending.

Wire format
    Paths under ``/v2``; every request is authenticated by the ``APCA-API-KEY-ID`` and
    ``APCA-API-SECRET-KEY`` headers (a missing or wrong pair answers 401
    ``{"code": 40110000, "message": "request is not authorized"}``). Errors are JSON
    ``{"code": <8 digits>, "message": "..."}`` whose code starts with the HTTP status.
    Money and quantities are strings (``"100000"``, ``"-5"``, ``"150.25"``); timestamps are
    RFC 3339.

Endpoints
    ``GET /v2/account``; ``GET /v2/assets`` (``status``, ``asset_class``, ``exchange``),
    ``GET /v2/assets/{symbol_or_id}`` (AAPL, MSFT, SPY; MSFT is not fractionable);
    ``GET /v2/clock``; ``POST /v2/orders``, ``GET /v2/orders`` (``status`` open|closed|all,
    ``limit``, ``direction``, ``symbols``), ``GET /v2/orders/{id}``,
    ``GET /v2/orders:by_client_order_id?client_order_id=...``, ``DELETE /v2/orders/{id}``;
    ``GET /v2/positions`` and ``GET /v2/positions/{symbol_or_id}``.

Orders (``type`` market|limit, ``time_in_force`` day|gtc, ``qty`` or ``notional``)
    * While the market is open a market order fills at once at the set price (status
      ``filled``), unless ``fill_next_partially`` was called: then it stays
      ``partially_filled`` until ``fill_resting``. A limit order fills at the set price when
      marketable, else rests as ``new`` and fills when ``set_price`` makes it marketable.
    * While the market is closed (``set_market_open(False)``) every order is accepted and
      queued with status ``accepted`` (Alpaca: "received by Alpaca, not yet routed", the usual
      state outside market hours; market orders execute at the next open).
      ``set_market_open(True)`` plays the open: queued market orders fill at the set price,
      queued limit orders fill or rest as ``new``. DAY orders do not expire here.
    * Refusals, checked in this order: a malformed body 400 ``40010000``; a missing or bad
      field 422 ``40010001``; a reused ``client_order_id`` 422
      ``{"code": 40010001, "message": "client_order_id must be unique"}``; an unknown symbol
      422 ``{"code": 42210000, "message": "asset \\"XYZ\\" not found"}``; a fractional qty or a
      notional order on a non-fractionable asset 403
      ``{"code": 40310000, "message": "asset \\"MSFT\\" is not fractionable"}`` (the body
      Alpaca is seen sending; its support pages only say the order is rejected as "requested
      asset is not fractionable"); selling more than the long
      position not held for other orders, buying more than the short position, or a fractional
      short 403 ``{"code": 40310000, "message": "insufficient qty available for order
      (requested: Q, available: A)", ...}`` (one order never flips a position); an opening
      order whose cost exceeds the buying power 403
      ``{"code": 40310000, "message": "insufficient buying power", ...}``.
    * Short sales of whole shares are allowed from a flat position (all three assets are
      shortable).

Account
    A cash-like account with ``multiplier`` "1": ``equity = cash + long_market_value +
    short_market_value`` (the short value is negative) and ``buying_power = equity -
    long_market_value + short_market_value - cost of open opening orders`` (a short's
    proceeds are held as its collateral).

Lookups
    An unknown order answers 404 ``{"code": 40410000, "message": "order not found"}``, an
    unknown asset 404 ``{"code": 40410000, "message": "asset not found for XYZ"}``, a flat
    position 404 ``{"code": 40410000, "message": "position does not exist"}``.

Faults
    The whole request is read before the base's faults apply, so a client that gives up on a
    ``Delay`` still leaves its order placed once the delay is over (as on a slow venue).
    Rate limiting is not enforced by itself; ``rate_limited()`` builds the 429 answer Alpaca sends
    (``{"code": 42910000, "message": "rate limit exceeded"}`` with the ``X-RateLimit-*``
    headers) for ``fault(..., rate_limited())``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from datetime import time as clock_time
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

import attrs
from aiohttp import web

from venues.base import LocalVenue, PlacedOrder, Refuse, json_response

NEW_YORK = ZoneInfo("America/New_York")
SESSION_OPEN = clock_time(9, 30)
SESSION_CLOSE = clock_time(16, 0)
QTY_STEP = Decimal("0.000000001")  # Alpaca: qty takes up to 9 decimals
PRICE_STEP = Decimal("0.0001")
OPEN_STATUSES = frozenset({"accepted", "new", "partially_filled"})

RATE_LIMIT_BODY = {"code": 42910000, "message": "rate limit exceeded"}


def rate_limited() -> Refuse:
    """The 429 answer Alpaca sends past its limit (200 requests a minute per account)."""
    reset = str(int(time.time()) + 60)
    headers = {"X-RateLimit-Limit": "200", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset}
    return Refuse(429, RATE_LIMIT_BODY, headers)


@attrs.frozen
class Asset:
    symbol: str
    asset_id: str
    name: str
    exchange: str
    fractionable: bool
    price: Decimal  # the price an emulator starts with

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.asset_id,
            "class": "us_equity",
            "exchange": self.exchange,
            "symbol": self.symbol,
            "name": self.name,
            "status": "active",
            "tradable": True,
            "marginable": True,
            "shortable": True,
            "easy_to_borrow": True,
            "fractionable": self.fractionable,
            "maintenance_margin_requirement": 30,
            "attributes": [],
        }


ASSETS: dict[str, Asset] = {
    asset.symbol: asset
    for asset in (
        Asset(
            "AAPL",
            "b0b6dd9d-8b9b-48a9-ba46-b9d54906e415",
            "Apple Inc. Common Stock",
            "NASDAQ",
            True,
            Decimal(190),
        ),
        Asset(
            "MSFT",
            "b6d1aa75-5c9c-4353-a305-9e2caa1925ab",
            "Microsoft Corporation Common Stock",
            "NASDAQ",
            False,
            Decimal(410),
        ),
        Asset(
            "SPY",
            "b28f4066-5c6d-479b-a2af-85dc1a8f16fb",
            "SPDR S&P 500 ETF Trust",
            "ARCA",
            True,
            Decimal(500),
        ),
    )
}


class AlpacaError(Exception):
    """An error answer: HTTP status, Alpaca's 8-digit code, message and extra body fields."""

    def __init__(self, status: int, code: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra

    def response(self) -> web.Response:
        return json_response(
            {"code": self.code, "message": self.message, **self.extra}, self.status
        )


def _invalid(message: str) -> AlpacaError:
    return AlpacaError(422, 40010001, message)


def _text(value: Decimal) -> str:
    """A decimal as Alpaca writes it: plain digits, no exponent, no trailing zeros."""
    return "0" if value == 0 else format(value.normalize(), "f")


def _optional_text(value: Decimal | None) -> str | None:
    return None if value is None else _text(value)


def _timestamp(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> datetime:
    return datetime.now(UTC)


def _is_whole(value: Decimal) -> bool:
    return value == value.to_integral_value()


@attrs.define
class _Order:
    id: str
    client_order_id: str
    symbol: str
    side: str
    type: str
    time_in_force: str
    qty: Decimal | None  # as ordered; None for a notional order
    notional: Decimal | None
    quantity: Decimal  # shares to trade (a notional order's shares at the submission price)
    limit_price: Decimal | None
    opening: bool  # opens or adds to a position (needs buying power) or closes one
    status: str
    created_at: datetime
    updated_at: datetime
    filled: Decimal = Decimal(0)
    filled_value: Decimal = Decimal(0)
    filled_at: datetime | None = None
    canceled_at: datetime | None = None

    @property
    def remaining(self) -> Decimal:
        return self.quantity - self.filled

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    def average_price(self) -> Decimal | None:
        if self.filled == 0:
            return None
        return (self.filled_value / self.filled).quantize(PRICE_STEP)

    def position_intent(self) -> str:
        return f"{self.side}_to_{'open' if self.opening else 'close'}"

    def to_json(self) -> dict[str, Any]:
        asset = ASSETS[self.symbol]
        return {
            "id": self.id,
            "client_order_id": self.client_order_id,
            "created_at": _timestamp(self.created_at),
            "updated_at": _timestamp(self.updated_at),
            "submitted_at": _timestamp(self.created_at),
            "filled_at": _timestamp(self.filled_at),
            "expired_at": None,
            "canceled_at": _timestamp(self.canceled_at),
            "failed_at": None,
            "replaced_at": None,
            "replaced_by": None,
            "replaces": None,
            "asset_id": asset.asset_id,
            "symbol": self.symbol,
            "asset_class": "us_equity",
            "notional": _optional_text(self.notional),
            "qty": _optional_text(self.qty),
            "filled_qty": _text(self.filled),
            "filled_avg_price": _optional_text(self.average_price()),
            "order_class": "simple",
            "order_type": self.type,
            "type": self.type,
            "side": self.side,
            "position_intent": self.position_intent(),
            "time_in_force": self.time_in_force,
            "limit_price": _optional_text(self.limit_price),
            "stop_price": None,
            "status": self.status,
            "extended_hours": False,
            "legs": None,
            "trail_percent": None,
            "trail_price": None,
            "hwm": None,
        }

    def placed(self) -> PlacedOrder:
        return PlacedOrder(
            client_order_id=self.client_order_id,
            symbol=self.symbol,
            side=self.side,
            quantity=self.quantity,
            filled=self.filled,
            reduce_only=False,  # Alpaca has no reduce-only flag
            status=self.status,
        )


@attrs.define
class _Position:
    quantity: Decimal = Decimal(0)  # signed: negative is short
    avg_entry_price: Decimal = Decimal(0)

    def apply(self, signed_quantity: Decimal, price: Decimal) -> None:
        """Trade ``signed_quantity`` at ``price`` (orders never flip a position's sign)."""
        new_quantity = self.quantity + signed_quantity
        if new_quantity == 0:
            self.avg_entry_price = Decimal(0)
        elif self.quantity == 0 or (self.quantity > 0) == (signed_quantity > 0):
            cost = self.quantity * self.avg_entry_price + signed_quantity * price
            self.avg_entry_price = (cost / new_quantity).quantize(PRICE_STEP)
        self.quantity = new_quantity


@attrs.define
class _Account:
    api_key: str
    api_secret: str
    cash: Decimal
    account_id: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    account_number: str = attrs.field(factory=lambda: f"PA{uuid.uuid4().int % 10**10:010d}")
    created_at: datetime = attrs.field(factory=_now)
    positions: dict[str, _Position] = attrs.field(factory=dict)
    orders: list[_Order] = attrs.field(factory=list)

    def position(self, symbol: str) -> _Position:
        return self.positions.setdefault(symbol, _Position())

    def open_orders(self) -> Iterable[_Order]:
        return (order for order in self.orders if order.is_open)

    def held_for_orders(self, symbol: str, side: str) -> Decimal:
        """Shares that open ``side`` orders on ``symbol`` still have to trade."""
        orders = self.open_orders()
        return sum(
            (o.remaining for o in orders if o.symbol == symbol and o.side == side), Decimal(0)
        )

    def order_by_id(self, order_id: str) -> _Order | None:
        return next((order for order in self.orders if order.id == order_id), None)

    def order_by_client_id(self, client_order_id: str) -> _Order | None:
        return next((o for o in self.orders if o.client_order_id == client_order_id), None)


Handler = Callable[[web.Request, _Account], Awaitable[web.Response]]


@attrs.define
class _OrderRequest:
    """A ``POST /v2/orders`` body after the field checks."""

    symbol: str
    side: str
    type: str
    time_in_force: str
    qty: Decimal | None
    notional: Decimal | None
    limit_price: Decimal | None
    client_order_id: str


class AlpacaVenue(LocalVenue):
    """Alpaca's Trading API v2 for US equities, with per-API-key accounts in memory."""

    def __init__(self) -> None:
        super().__init__()
        self._accounts: dict[str, _Account] = {}
        self._prices: dict[str, Decimal] = {s: a.price for s, a in ASSETS.items()}
        self._market_open = True
        self._next_partial: Decimal | None = None
        routes = [
            web.get("/v2/account", self._guard(self._get_account)),
            web.get("/v2/assets", self._guard(self._get_assets)),
            web.get("/v2/assets/{symbol}", self._guard(self._get_asset)),
            web.get("/v2/clock", self._guard(self._get_clock)),
            web.post("/v2/orders", self._guard(self._post_order)),
            web.get("/v2/orders", self._guard(self._get_orders)),
            web.get("/v2/orders:by_client_order_id", self._guard(self._get_order_by_client_id)),
            web.get("/v2/orders/{order_id}", self._guard(self._get_order)),
            web.delete("/v2/orders/{order_id}", self._guard(self._cancel_order)),
            web.get("/v2/positions", self._guard(self._get_positions)),
            web.get("/v2/positions/{symbol}", self._guard(self._get_position)),
        ]
        self.app.add_routes(routes)

    # ------------------------------------------------------------------ controls

    def add_account(
        self, api_key: str, api_secret: str, *, cash: Decimal = Decimal(100_000)
    ) -> None:
        self._accounts[api_key] = _Account(api_key, api_secret, Decimal(cash))

    def set_price(self, symbol: str, price: Decimal) -> None:
        """Set the price trades happen at; resting limit orders it makes marketable fill."""
        self._prices[symbol] = Decimal(price)
        if self._market_open:
            for account in self._accounts.values():
                for order in list(account.open_orders()):
                    if order.symbol == symbol and order.status == "new":
                        self._try_limit_fill(account, order)

    def set_position(self, api_key: str, symbol: str, quantity: Decimal) -> None:
        """Set a signed share position, entered at the current price; cash is left as it is."""
        position = self._accounts[api_key].position(symbol)
        position.quantity = Decimal(quantity)
        position.avg_entry_price = self._prices[symbol] if quantity else Decimal(0)

    def position(self, api_key: str, symbol: str) -> Decimal:
        held = self._accounts[api_key].positions.get(symbol)
        return held.quantity if held is not None else Decimal(0)

    def cash(self, api_key: str) -> Decimal:
        return self._accounts[api_key].cash

    def placed(self, api_key: str) -> list[PlacedOrder]:
        return [order.placed() for order in self._accounts[api_key].orders]

    def fill_next_partially(self, fraction: Decimal) -> None:
        """The next market order to execute fills only ``fraction`` and stays open."""
        self._next_partial = Decimal(fraction)

    def fill_resting(self) -> None:
        """Fill what partially filled orders left, at the current prices."""
        for account in self._accounts.values():
            for order in list(account.open_orders()):
                if order.status == "partially_filled":
                    self._fill(account, order, order.remaining)

    def set_market_open(self, is_open: bool) -> None:
        """Open or close the market; opening executes the orders queued while it was closed."""
        self._market_open = is_open
        if not is_open:
            return
        for account in self._accounts.values():
            for order in list(account.open_orders()):
                if order.status == "accepted":
                    self._execute(account, order)

    # ------------------------------------------------------------------ plumbing

    def _guard(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def guarded(request: web.Request) -> web.Response:
            try:
                return await handler(request, self._authenticate(request))
            except AlpacaError as error:
                return error.response()

        return guarded

    def _authenticate(self, request: web.Request) -> _Account:
        key = request.headers.get("APCA-API-KEY-ID", "")
        secret = request.headers.get("APCA-API-SECRET-KEY", "")
        account = self._accounts.get(key)
        if account is None or account.api_secret != secret:
            raise AlpacaError(401, 40110000, "request is not authorized")
        return account

    # ------------------------------------------------------------------ account, assets, clock

    async def _get_account(self, request: web.Request, account: _Account) -> web.Response:
        return json_response(self._account_json(account))

    def _account_json(self, account: _Account) -> dict[str, Any]:
        long_value, short_value = self._market_values(account)
        equity = account.cash + long_value + short_value
        buying_power = max(Decimal(0), self._buying_power(account))
        return {
            "id": account.account_id,
            "account_number": account.account_number,
            "status": "ACTIVE",
            "crypto_status": "ACTIVE",
            "currency": "USD",
            "cash": _text(account.cash),
            "portfolio_value": _text(equity),
            "equity": _text(equity),
            "last_equity": _text(equity),
            "buying_power": _text(buying_power),
            "regt_buying_power": _text(buying_power),
            "daytrading_buying_power": "0",
            "non_marginable_buying_power": _text(buying_power),
            "options_buying_power": _text(buying_power),
            "long_market_value": _text(long_value),
            "short_market_value": _text(short_value),
            "initial_margin": "0",
            "maintenance_margin": "0",
            "last_maintenance_margin": "0",
            "sma": "0",
            "multiplier": "1",
            "accrued_fees": "0",
            "pending_transfer_in": "0",
            "pending_transfer_out": "0",
            "pattern_day_trader": False,
            "trading_blocked": False,
            "transfers_blocked": False,
            "account_blocked": False,
            "trade_suspended_by_user": False,
            "shorting_enabled": True,
            "daytrade_count": 0,
            "options_approved_level": 0,
            "options_trading_level": 0,
            "created_at": _timestamp(account.created_at),
        }

    def _market_values(self, account: _Account) -> tuple[Decimal, Decimal]:
        values = [p.quantity * self._prices[s] for s, p in account.positions.items()]
        return sum((v for v in values if v > 0), Decimal(0)), sum(
            (v for v in values if v < 0), Decimal(0)
        )

    def _buying_power(self, account: _Account) -> Decimal:
        short_value = self._market_values(account)[1]
        reserved = sum(
            (o.remaining * self._reference_price(o) for o in account.open_orders() if o.opening),
            Decimal(0),
        )
        return account.cash + 2 * short_value - reserved

    def _reference_price(self, order: _Order) -> Decimal:
        if order.limit_price is not None and order.side == "buy":
            return order.limit_price
        return self._prices[order.symbol]

    async def _get_assets(self, request: web.Request, account: _Account) -> web.Response:
        query = request.query
        wanted = {
            "status": query.get("status", "active"),
            "class": query.get("asset_class", "us_equity"),
        }
        if "exchange" in query:
            wanted["exchange"] = query["exchange"]
        assets = [asset.to_json() for asset in ASSETS.values()]
        return json_response([a for a in assets if all(a[k] == v for k, v in wanted.items())])

    async def _get_asset(self, request: web.Request, account: _Account) -> web.Response:
        symbol = request.match_info["symbol"]
        asset = self._find_asset(symbol)
        if asset is None:
            raise AlpacaError(404, 40410000, f"asset not found for {symbol}")
        return json_response(asset.to_json())

    @staticmethod
    def _find_asset(symbol_or_id: str) -> Asset | None:
        by_symbol = ASSETS.get(symbol_or_id.upper())
        if by_symbol is not None:
            return by_symbol
        return next((a for a in ASSETS.values() if a.asset_id == symbol_or_id), None)

    async def _get_clock(self, request: web.Request, account: _Account) -> web.Response:
        now = datetime.now(NEW_YORK)
        if self._market_open:
            next_close = _next_weekday_at(now, SESSION_CLOSE)
            next_open = _next_weekday_at(next_close, SESSION_OPEN)
        else:
            next_open = _next_weekday_at(now, SESSION_OPEN)
            next_close = next_open.replace(hour=SESSION_CLOSE.hour, minute=SESSION_CLOSE.minute)
        return json_response(
            {
                "timestamp": now.isoformat(),
                "is_open": self._market_open,
                "next_open": next_open.isoformat(),
                "next_close": next_close.isoformat(),
            }
        )

    # ------------------------------------------------------------------ orders

    async def _post_order(self, request: web.Request, account: _Account) -> web.Response:
        try:
            body = json.loads(await request.text())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise AlpacaError(400, 40010000, "request body format is invalid")
        order_request = _parse_order(body)
        order = self._accept(account, order_request)
        if self._market_open:
            self._execute(account, order)
        return json_response(order.to_json())

    def _accept(self, account: _Account, req: _OrderRequest) -> _Order:
        if account.order_by_client_id(req.client_order_id) is not None:
            raise _invalid("client_order_id must be unique")
        asset = ASSETS.get(req.symbol)
        if asset is None:
            raise AlpacaError(422, 42210000, f'asset "{req.symbol}" not found')
        price = self._prices[asset.symbol]
        quantity = req.qty if req.qty is not None else _shares_for(req.notional, price)
        fractional = req.notional is not None or not _is_whole(quantity)
        if fractional and not asset.fractionable:
            raise AlpacaError(403, 40310000, f'asset "{asset.symbol}" is not fractionable')
        opening = self._check_quantity(account, asset.symbol, req.side, quantity, fractional)
        if opening:
            self._check_buying_power(account, req, quantity, price)
        now = _now()
        order = _Order(
            id=str(uuid.uuid4()),
            client_order_id=req.client_order_id,
            symbol=asset.symbol,
            side=req.side,
            type=req.type,
            time_in_force=req.time_in_force,
            qty=req.qty,
            notional=req.notional,
            quantity=quantity,
            limit_price=req.limit_price,
            opening=opening,
            status="accepted",
            created_at=now,
            updated_at=now,
        )
        account.orders.append(order)
        return order

    def _check_quantity(
        self, account: _Account, symbol: str, side: str, quantity: Decimal, fractional: bool
    ) -> bool:
        """Whether the order opens (or adds to) a position; refuse one that would flip it."""
        held = self.position(account.api_key, symbol)
        sign = Decimal(1) if side == "buy" else Decimal(-1)
        if held * sign >= 0 and not (held == 0 and side == "sell" and fractional):
            return True
        available = max(Decimal(0), abs(held) - account.held_for_orders(symbol, side))
        if quantity > available:
            raise AlpacaError(
                403,
                40310000,
                "insufficient qty available for order "
                f"(requested: {_text(quantity)}, available: {_text(available)})",
                available=_text(available),
                existing_qty=_text(abs(held)),
                held_for_orders=_text(abs(held) - available),
                related_orders=[],
                symbol=symbol,
            )
        return False

    def _check_buying_power(
        self, account: _Account, req: _OrderRequest, quantity: Decimal, price: Decimal
    ) -> None:
        if req.notional is not None:
            cost = req.notional
        elif req.limit_price is not None and req.side == "buy":
            cost = quantity * req.limit_price
        else:
            cost = quantity * price
        buying_power = self._buying_power(account)
        if cost > buying_power:
            raise AlpacaError(
                403,
                40310000,
                "insufficient buying power",
                buying_power=_text(max(Decimal(0), buying_power)),
                cost_basis=_text(cost),
                symbol=req.symbol,
            )

    def _execute(self, account: _Account, order: _Order) -> None:
        """Route an accepted order while the market is open."""
        if order.type == "limit":
            order.status = "new"
            order.updated_at = _now()
            self._try_limit_fill(account, order)
            return
        fraction, self._next_partial = self._next_partial, None
        quantity = order.remaining
        if fraction is not None:
            quantity = (order.remaining * fraction).quantize(QTY_STEP, rounding=ROUND_DOWN)
        self._fill(account, order, quantity)

    def _try_limit_fill(self, account: _Account, order: _Order) -> None:
        assert order.limit_price is not None
        price = self._prices[order.symbol]
        marketable = (
            price <= order.limit_price if order.side == "buy" else price >= order.limit_price
        )
        if marketable:
            self._fill(account, order, order.remaining)

    def _fill(self, account: _Account, order: _Order, quantity: Decimal) -> None:
        price = self._prices[order.symbol]
        signed = quantity if order.side == "buy" else -quantity
        account.position(order.symbol).apply(signed, price)
        account.cash -= signed * price
        order.filled += quantity
        order.filled_value += quantity * price
        order.updated_at = _now()
        if order.remaining > 0:
            order.status = "partially_filled"
        else:
            order.status = "filled"
            order.filled_at = order.updated_at

    async def _get_orders(self, request: web.Request, account: _Account) -> web.Response:
        query = request.query
        status = query.get("status", "open")
        symbols = set(filter(None, query.get("symbols", "").split(",")))
        orders = [
            o
            for o in account.orders
            if (status == "all" or (status == "open") == o.is_open)
            and (not symbols or o.symbol in symbols)
        ]
        if query.get("direction", "desc") == "desc":
            orders.reverse()
        limit = int(query.get("limit", "50"))
        return json_response([o.to_json() for o in orders[:limit]])

    async def _get_order(self, request: web.Request, account: _Account) -> web.Response:
        return json_response(_known(account.order_by_id(request.match_info["order_id"])).to_json())

    async def _get_order_by_client_id(
        self, request: web.Request, account: _Account
    ) -> web.Response:
        client_order_id = request.query.get("client_order_id", "")
        return json_response(_known(account.order_by_client_id(client_order_id)).to_json())

    async def _cancel_order(self, request: web.Request, account: _Account) -> web.Response:
        order = _known(account.order_by_id(request.match_info["order_id"]))
        if not order.is_open:
            raise AlpacaError(422, 42210000, "order is not cancelable")
        order.status = "canceled"
        order.canceled_at = order.updated_at = _now()
        return web.Response(status=204)

    # ------------------------------------------------------------------ positions

    async def _get_positions(self, request: web.Request, account: _Account) -> web.Response:
        held = [(s, p) for s, p in sorted(account.positions.items()) if p.quantity != 0]
        return json_response([self._position_json(account, s, p) for s, p in held])

    async def _get_position(self, request: web.Request, account: _Account) -> web.Response:
        asset = self._find_asset(request.match_info["symbol"])
        held = account.positions.get(asset.symbol) if asset is not None else None
        if asset is None or held is None or held.quantity == 0:
            raise AlpacaError(404, 40410000, "position does not exist")
        return json_response(self._position_json(account, asset.symbol, held))

    def _position_json(self, account: _Account, symbol: str, held: _Position) -> dict[str, Any]:
        asset = ASSETS[symbol]
        price = self._prices[symbol]
        market_value = held.quantity * price
        cost_basis = held.quantity * held.avg_entry_price
        pl = market_value - cost_basis
        plpc = (pl / abs(cost_basis)).quantize(PRICE_STEP) if cost_basis else Decimal(0)
        closing_side = "sell" if held.quantity > 0 else "buy"
        held_for_orders = account.held_for_orders(symbol, closing_side)
        available = max(Decimal(0), abs(held.quantity) - held_for_orders)
        return {
            "asset_id": asset.asset_id,
            "symbol": symbol,
            "exchange": asset.exchange,
            "asset_class": "us_equity",
            "asset_marginable": True,
            "qty": _text(held.quantity),
            "qty_available": _text(available if held.quantity > 0 else -available),
            "avg_entry_price": _text(held.avg_entry_price),
            "side": "long" if held.quantity > 0 else "short",
            "market_value": _text(market_value),
            "cost_basis": _text(cost_basis),
            "unrealized_pl": _text(pl),
            "unrealized_plpc": _text(plpc),
            "unrealized_intraday_pl": _text(pl),
            "unrealized_intraday_plpc": _text(plpc),
            "current_price": _text(price),
            "lastday_price": _text(price),
            "change_today": "0",
        }


def _known(order: _Order | None) -> _Order:
    if order is None:
        raise AlpacaError(404, 40410000, "order not found")
    return order


def _next_weekday_at(moment: datetime, at: clock_time) -> datetime:
    """The first weekday instant after ``moment`` whose New York wall time is ``at``."""
    candidate = moment.replace(hour=at.hour, minute=at.minute, second=0, microsecond=0)
    while candidate <= moment or candidate.weekday() >= 5:
        candidate += timedelta(days=1)
    return candidate


def _shares_for(notional: Decimal | None, price: Decimal) -> Decimal:
    assert notional is not None
    return (notional / price).quantize(QTY_STEP, rounding=ROUND_DOWN)


def _decimal_field(body: dict[str, Any], name: str) -> Decimal | None:
    """A number Alpaca takes as a JSON string or number; ``None`` when absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _invalid(f"invalid {name}")
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise _invalid(f"invalid {name}") from None
    if not number.is_finite():
        raise _invalid(f"invalid {name}")
    return number


def _choice(body: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = body.get(name)
    if value is None:
        raise _invalid(f"{name} is required")
    if value not in allowed:
        raise _invalid(f"invalid {name}")
    return str(value)


def _parse_order(body: dict[str, Any]) -> _OrderRequest:
    symbol = body.get("symbol")
    if not isinstance(symbol, str) or not symbol:
        raise _invalid("symbol is required")
    side = _choice(body, "side", ("buy", "sell"))
    order_type = _choice(body, "type", ("market", "limit"))
    time_in_force = _choice(body, "time_in_force", ("day", "gtc"))
    qty, notional = _decimal_field(body, "qty"), _decimal_field(body, "notional")
    if qty is None and notional is None:
        raise _invalid("qty or notional is required")
    if qty is not None and notional is not None:
        raise AlpacaError(400, 40010000, "only one of qty or notional can be specified")
    amount = qty if qty is not None else notional
    assert amount is not None
    if amount <= 0:
        raise AlpacaError(422, 42210000, f"{'qty' if qty is not None else 'notional'} must be > 0")
    fractional = notional is not None or not _is_whole(amount)
    if fractional and time_in_force != "day":
        raise _invalid("fractional orders must be DAY orders")
    limit_price = _decimal_field(body, "limit_price")
    if order_type == "limit" and (limit_price is None or limit_price <= 0):
        raise _invalid("limit_price is required for limit orders")
    if order_type == "market" and limit_price is not None:
        raise _invalid("limit_price must not be given for market orders")
    client_order_id = body.get("client_order_id") or str(uuid.uuid4())
    if not isinstance(client_order_id, str) or len(client_order_id) > 128:
        raise _invalid("client_order_id must be no more than 128 characters")
    return _OrderRequest(
        symbol=symbol.upper(),
        side=side,
        type=order_type,
        time_in_force=time_in_force,
        qty=qty,
        notional=notional,
        limit_price=limit_price,
        client_order_id=client_order_id,
    )
