"""Alpaca (US equities) through alpaca-py's ``TradingClient`` (Trading API v2).

What an ``AlpacaBroker`` (one account's connection, owned by its worker) does:

* alpaca-py is synchronous (``requests``): every call runs in a thread
  (``asyncio.to_thread``). alpaca-py sets no HTTP timeout, so every request of the client's
  session gets ``(timeout_s, timeout_s)`` (connect, read); its own 429 retry (three times,
  3 s apart, blocking the thread) is off: the worker reconnects and the core retries rate
  limits itself.
* ``connect`` makes an authenticated read (the account) every time, so refused keys surface
  as ``CredentialsRejected`` with Alpaca's reason; it loads the tradable active US-equity
  assets (symbol and whether it is fractionable) once per connection, never per order.
* Orders are market DAY orders under the client id ``client_ids.venue_client_id`` derives
  from the core's id (Alpaca takes 128 characters). Placing is idempotent: a caller that
  cannot rule out an earlier attempt (``fresh`` False) looks the id up first; Alpaca's own
  duplicate refusal (422 "client_order_id must be unique"), a timeout, a dropped line or a
  5xx during the placement is resolved by fetching the order by its client id, never by
  placing it again (when the lookup finds nothing the call raises ``BrokerDisconnected`` and
  the worker's retry looks it up once more before placing).
* Refused here, before anything is sent: an unknown symbol (``invalid_symbol``), a fractional
  quantity on a non-fractionable asset or more than Alpaca's 9 decimals
  (``invalid_quantity``), and a closed market (``market_closed``, the message says when it
  opens next). The market clock is read once and kept until its next close (open market) or
  next open (closed market), so an open market costs no request per order. Alpaca itself
  would queue an order placed outside market hours; tradecore refuses it instead, so that a
  signal never executes hours late. The market check comes after the lookup of an earlier
  placement: a recovered order placed before the close is still found.
* Alpaca has no reduce-only flag. A reduce-only order that would cross zero (sell more than
  the long position, buy more than the short) is refused by Alpaca's own rule, 403
  "insufficient qty available for order", answered ``insufficient_margin`` like a lack of
  buying power. Alpaca does not stop a reduce-only order from opening a position when flat:
  the core only sends reduce-only steps against a position it has read.
* Alpaca's refusals keep its own message as ``broker_message``: "insufficient buying power"
  and "insufficient qty" are ``insufficient_margin``, "asset ... not found"
  ``invalid_symbol``, "not fractionable" and quantity errors ``invalid_quantity``, a 429
  ``broker_rate_limited`` (the wait from ``Retry-After`` or ``X-RateLimit-Reset``, else 1 s),
  anything else ``broker_rejected``.

Credentials never appear in a repr, a log line or an exception message: errors carry Alpaca's
message or the name of the failure, and library exceptions (whose request holds the key
headers) are not chained.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import attrs
import requests
from alpaca.common.exceptions import APIError
from alpaca.trading.client import TradingClient
from alpaca.trading.enums import AssetClass, AssetStatus, OrderSide, PositionSide, TimeInForce
from alpaca.trading.models import Asset, Clock, Order, Position
from alpaca.trading.requests import GetAssetsRequest, MarketOrderRequest
from pydantic import BaseModel, ValidationError

from tradecore.errors import BrokerDisconnected, CredentialsRejected
from tradecore.orders import OrderError, RejectionCode, Side
from tradecore.ports.broker import BrokerAccount, BrokerOrder, BrokerOrderStatus
from tradecore_adapters.brokers.client_ids import venue_client_id
from tradecore_adapters.brokers.venue_errors import rejection, retry_after_s, venue_detail

NAME = "alpaca"
CLIENT_ID_LENGTH = 128
DEFAULT_TIMEOUT_S = 10.0
QTY_STEP = Decimal("0.000000001")  # Alpaca takes quantities with up to 9 decimals
NOT_LOADED = (
    "alpaca: the asset list is loaded with an account's credentials; verify an account first"
)
_MESSAGE_LIMIT = 300
_LINE_ERRORS = (requests.RequestException, ValidationError)
"""A failed or cut request, or an answer that is not what Alpaca documents."""

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class AlpacaVenue:
    """Alpaca as tradecore uses it: opens account connections and keeps, per environment
    (paper or live), the asset list the last successful ``AlpacaBroker.connect`` loaded.

    ``endpoint`` replaces Alpaca's base URL (a local emulator in tests, a proxy in
    production); None keeps Alpaca's paper or live URL. ``timeout_s`` bounds the connection
    and every read of each request."""

    def __init__(self, *, endpoint: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._listings: dict[bool, frozenset[str]] = {}

    @property
    def name(self) -> str:
        return NAME

    def client(self, credentials: Mapping[str, str], *, testnet: bool) -> TradingClient:
        """A ``TradingClient`` for ``credentials`` (``api_key``, ``api_secret``) on the paper
        environment when ``testnet``, with timeouts set and alpaca-py's retries off. Raises
        ``CredentialsRejected`` when a field is missing."""
        api_key, api_secret = credentials.get("api_key"), credentials.get("api_secret")
        if not api_key or not api_secret:
            raise CredentialsRejected("alpaca: the credentials need an API key and a secret key")
        client = TradingClient(
            api_key=api_key, secret_key=api_secret, paper=testnet, url_override=self._endpoint
        )
        client._retry = 0
        session = client._session
        timeout = (self._timeout_s, self._timeout_s)  # (connect, read)
        session.request = functools.partial(session.request, timeout=timeout)  # type: ignore[method-assign]
        return client

    def open(self, account: BrokerAccount) -> AlpacaBroker:
        return AlpacaBroker(self, account)

    async def symbols(self, *, testnet: bool) -> frozenset[str]:
        """The tradable active US-equity symbols of the environment.

        Alpaca lists assets only to an authenticated account, and the API has no account at
        hand for its order form. Kept simple: this answers the list the most recent successful
        ``AlpacaBroker.connect`` of that environment loaded (an account verification in the
        API, or a worker's connection in this process), and raises ``BrokerDisconnected``
        until one has."""
        listed = self._listings.get(testnet)
        if listed is None:
            raise BrokerDisconnected(NOT_LOADED)
        return listed

    def remember(self, *, testnet: bool, symbols: frozenset[str]) -> None:
        """Keep the asset list a connection of environment ``testnet`` loaded."""
        self._listings[testnet] = symbols


@attrs.frozen
class _Ask:
    """One ``place_order`` call: what the core asked for and the client id sent to Alpaca."""

    client_order_id: str
    venue_id: str
    symbol: str
    side: Side
    quantity: Decimal
    reduce_only: bool

    def refused(self, error: OrderError) -> BrokerOrder:
        return BrokerOrder.refused(
            self.client_order_id,
            self.symbol,
            self.side,
            self.quantity,
            error,
            reduce_only=self.reduce_only,
        )


class AlpacaBroker:
    """One account's connection to Alpaca (``tradecore.ports.broker.Broker``; see the module
    doc)."""

    def __init__(self, venue: AlpacaVenue, account: BrokerAccount) -> None:
        self._venue = venue
        self._account = account
        self._client: TradingClient | None = None
        self._fractionable: dict[str, bool] = {}
        self._clock: Clock | None = None

    def __repr__(self) -> str:
        return (
            f"AlpacaBroker(trading_account_id={self._account.trading_account_id!r}, "
            f"testnet={self._account.testnet})"
        )

    @property
    def name(self) -> str:
        return NAME

    @property
    def placements_wait_for_outcome(self) -> bool:
        return False

    async def connect(self) -> None:
        if self._client is None:
            self._client = self._venue.client(
                self._account.credentials, testnet=self._account.testnet
            )
        client = self._client
        await self._guarded(client.get_account)
        if not self._fractionable:
            request = GetAssetsRequest(status=AssetStatus.ACTIVE, asset_class=AssetClass.US_EQUITY)
            assets = _models(Asset, await self._guarded(client.get_all_assets, request))
            self._fractionable = {a.symbol: a.fractionable for a in assets if a.tradable}
        self._venue.remember(testnet=self._account.testnet, symbols=frozenset(self._fractionable))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            self._clock = None
            client._session.close()

    async def instruments(self) -> frozenset[str]:
        self._require()
        return frozenset(self._fractionable)

    async def positions(self) -> Mapping[str, Decimal]:
        client = self._require()
        held: dict[str, Decimal] = {}
        for position in _models(Position, await self._guarded(client.get_all_positions)):
            size = abs(_decimal(position.qty))
            if size != 0:
                held[position.symbol] = -size if position.side == PositionSide.SHORT else size
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
        client = self._require()
        venue_id = venue_client_id(client_order_id, CLIENT_ID_LENGTH)
        ask = _Ask(client_order_id, venue_id, symbol, side, quantity, reduce_only)
        fractionable = self._fractionable.get(symbol)
        if fractionable is None:
            return ask.refused(rejection(RejectionCode.INVALID_SYMBOL, None))
        problem = _quantity_problem(symbol, quantity, fractionable=fractionable)
        if problem is not None:
            return ask.refused(_ours(RejectionCode.INVALID_QUANTITY, problem))
        if not fresh:
            earlier = await self._find(venue_id, client_order_id, reduce_only, side)
            if earlier is not None:
                return earlier
        closed = await self._market_closed(client)
        if closed is not None:
            return ask.refused(closed)
        request = MarketOrderRequest(
            symbol=symbol,
            qty=float(quantity),
            side=OrderSide(side.value),
            time_in_force=TimeInForce.DAY,
            client_order_id=venue_id,
        )
        placed = await _submit(client, request)
        if isinstance(placed, APIError):
            return await self._refusal(ask, placed)
        if placed is None:
            return await self._unconfirmed(ask)  # a timeout or a dropped line: look it up
        return self._broker_order(placed, client_order_id, reduce_only, side)

    async def order_status(self, client_order_id: str, symbol: str) -> BrokerOrder | None:
        self._require()
        venue_id = venue_client_id(client_order_id, CLIENT_ID_LENGTH)
        return await self._find(venue_id, client_order_id, False, Side.BUY)

    # --- helpers ------------------------------------------------------------------------

    def _require(self) -> TradingClient:
        if self._client is None:
            raise BrokerDisconnected(f"{NAME}: not connected")
        return self._client

    async def _guarded(self, call: Callable[..., T], *args: Any) -> T:
        """Run an alpaca-py call outside order placement: refused keys (401, 403) are
        ``CredentialsRejected`` with Alpaca's reason, anything else the venue or the line did
        is ``BrokerDisconnected``."""
        try:
            return await asyncio.to_thread(call, *args)
        except APIError as e:
            status, message = _detail(e)
            if status in (401, 403):
                raise CredentialsRejected(message) from None
            raise BrokerDisconnected(f"{NAME}: HTTP {status}: {message}") from None
        except _LINE_ERRORS as e:
            raise BrokerDisconnected(f"{NAME}: {type(e).__name__}") from None

    async def _market_closed(self, client: TradingClient) -> OrderError | None:
        """``market_closed`` with the next open when the market is closed, from the clock
        kept until its next change."""
        clock = self._clock
        if clock is None or not _clock_current(clock, datetime.now(UTC)):
            clock = _model(Clock, await self._guarded(client.get_clock))
            self._clock = clock
        if clock.is_open:
            return None
        opens = clock.next_open.isoformat()
        return _ours(RejectionCode.MARKET_CLOSED, f"The market is closed; it opens next at {opens}")

    async def _refusal(self, ask: _Ask, error: APIError) -> BrokerOrder:
        """What Alpaca's error answer to a placement means."""
        status, message = _detail(error)
        if status == 401:
            raise CredentialsRejected(message)
        if status == 422 and "client_order_id must be unique" in message:
            found = await self._find(ask.venue_id, ask.client_order_id, ask.reduce_only, ask.side)
            if found is None:
                raise BrokerDisconnected(f"{NAME}: duplicate client order id not found")
            return found
        if status is None or status >= 500:
            return await self._unconfirmed(ask)  # a gateway may have passed the order on
        if status == 429:
            wait = _retry_after(error)
            return ask.refused(
                rejection(RejectionCode.BROKER_RATE_LIMITED, message, retry_after=wait)
            )
        return ask.refused(rejection(classify(status, message), message))

    async def _unconfirmed(self, ask: _Ask) -> BrokerOrder:
        found = await self._find(ask.venue_id, ask.client_order_id, ask.reduce_only, ask.side)
        if found is None:
            raise BrokerDisconnected(f"{NAME}: placement unconfirmed")
        return found

    async def _find(
        self, venue_id: str, client_order_id: str, reduce_only: bool, side: Side
    ) -> BrokerOrder | None:
        """The order Alpaca holds under ``venue_id``, None when it has none (404)."""
        client = self._require()
        try:
            raw = await asyncio.to_thread(client.get_order_by_client_id, venue_id)
        except APIError as e:
            status, message = _detail(e)
            if status == 404:
                return None
            if status in (401, 403):
                raise CredentialsRejected(message) from None
            raise BrokerDisconnected(f"{NAME}: order lookup failed: HTTP {status}") from None
        except _LINE_ERRORS as e:
            raise BrokerDisconnected(f"{NAME}: order lookup failed: {type(e).__name__}") from None
        return self._broker_order(_model(Order, raw), client_order_id, reduce_only, side)

    @staticmethod
    def _broker_order(
        order: Order, client_order_id: str, reduce_only: bool, side: Side
    ) -> BrokerOrder:
        """``order`` as the core sees it; ``side`` stands in when Alpaca names none."""
        filled = _decimal(order.filled_qty)
        status = broker_status(str(order.status.value), filled)
        average = _decimal(order.filled_avg_price) if filled > 0 else Decimal(0)
        return BrokerOrder(
            broker_order_id=str(order.id),
            client_order_id=client_order_id,
            symbol=order.symbol or "",
            side=side if order.side is None else Side(order.side.value),
            quantity=_decimal(order.qty, filled),
            status=status,
            filled_quantity=filled,
            average_price=average if average > 0 else None,
            reduce_only=reduce_only,
            rejection=(
                rejection(RejectionCode.BROKER_REJECTED, None)
                if status is BrokerOrderStatus.REJECTED
                else None
            ),
        )


async def _submit(client: TradingClient, request: MarketOrderRequest) -> Order | APIError | None:
    """Alpaca's answer to a placement: the order, its error answer, or None when the line
    failed (timeout, dropped connection, an answer that is no order)."""
    try:
        placed = await asyncio.to_thread(client.submit_order, request)
    except APIError as e:
        return e
    except _LINE_ERRORS:
        return None
    return placed if isinstance(placed, Order) else None


_STATUSES: dict[str, BrokerOrderStatus] = {
    "filled": BrokerOrderStatus.FILLED,
    "partially_filled": BrokerOrderStatus.PARTIALLY_FILLED,
    "new": BrokerOrderStatus.PENDING,
    "accepted": BrokerOrderStatus.PENDING,
    "pending_new": BrokerOrderStatus.PENDING,
    "accepted_for_bidding": BrokerOrderStatus.PENDING,
    "held": BrokerOrderStatus.PENDING,
    "canceled": BrokerOrderStatus.CANCELLED,
    "expired": BrokerOrderStatus.CANCELLED,
    "done_for_day": BrokerOrderStatus.CANCELLED,
    "replaced": BrokerOrderStatus.CANCELLED,
    "rejected": BrokerOrderStatus.REJECTED,
    "suspended": BrokerOrderStatus.REJECTED,
}


def broker_status(alpaca_status: str, filled: Decimal) -> BrokerOrderStatus:
    """The core's status for Alpaca's; the transitional ones (pending_cancel, stopped,
    calculated...) are PENDING, or PARTIALLY_FILLED once something filled."""
    status = _STATUSES.get(alpaca_status, BrokerOrderStatus.PENDING)
    if status is BrokerOrderStatus.PENDING and filled > 0:
        return BrokerOrderStatus.PARTIALLY_FILLED
    return status


_INSUFFICIENT = re.compile(r"insufficient (\w+ )*(buying power|qty)", re.IGNORECASE)
_NOT_FRACTIONABLE = re.compile(r"not fractionable", re.IGNORECASE)
_ASSET_NOT_FOUND = re.compile(r"\basset\b.*\bnot found\b", re.IGNORECASE)
_QUANTITY = re.compile(r"\bqty\b|\bfractional\b", re.IGNORECASE)


def classify(status: int, message: str) -> RejectionCode:
    """The rejection code of Alpaca's refusal of an order (HTTP ``status``, its message)."""
    if _INSUFFICIENT.search(message):
        return RejectionCode.INSUFFICIENT_MARGIN
    if _NOT_FRACTIONABLE.search(message):
        return RejectionCode.INVALID_QUANTITY
    if status in (404, 422) and _ASSET_NOT_FOUND.search(message):
        return RejectionCode.INVALID_SYMBOL
    if status == 422 and _QUANTITY.search(message):
        return RejectionCode.INVALID_QUANTITY
    return RejectionCode.BROKER_REJECTED


def _ours(code: RejectionCode, message: str) -> OrderError:
    """A refusal of our own (nothing sent): our message, no broker message."""
    return attrs.evolve(rejection(code, None), message=message)


def _quantity_problem(symbol: str, quantity: Decimal, *, fractionable: bool) -> str | None:
    """Why Alpaca would refuse ``quantity`` of ``symbol`` (or could not receive it exactly
    as a JSON number), None when it fits."""
    if not quantity.is_finite() or quantity <= 0:
        return "The quantity must be a positive number"
    if quantity != quantity.to_integral_value() and not fractionable:
        return f"{symbol} is not fractionable at Alpaca: order whole shares"
    try:
        exact = quantity == quantity.quantize(QTY_STEP)
    except InvalidOperation:
        exact = False
    if not exact or Decimal(repr(float(quantity))) != quantity:
        return "Alpaca takes quantities with at most 9 decimals"
    return None


def _clock_current(clock: Clock, now: datetime) -> bool:
    """Whether ``clock`` still tells the market's state: before its next close when open,
    before its next open when closed."""
    until = clock.next_close if clock.is_open else clock.next_open
    return until.tzinfo is not None and now < until


def _detail(error: APIError) -> tuple[int | None, str]:
    """The HTTP status and Alpaca's message of an error answer (its body's ``message``, or
    the start of a body that is not Alpaca's JSON)."""
    status = error.status_code
    _, message = venue_detail(error)
    message = message.strip()[:_MESSAGE_LIMIT] or f"HTTP {status}"
    return (status if isinstance(status, int) else None), message


def _retry_after(error: APIError) -> float | None:
    """Seconds to wait after a 429: ``Retry-After``, else until ``X-RateLimit-Reset`` (Unix
    seconds), else None (the core's default)."""
    response = error.response
    headers = getattr(response, "headers", None)
    wait = retry_after_s(headers)
    if wait is not None or not headers:
        return wait
    try:
        reset = float(headers.get("X-RateLimit-Reset"))
    except (TypeError, ValueError):
        return None
    return max(0.0, round(reset - time.time(), 3))


def _model(kind: type[M], value: object) -> M:
    if not isinstance(value, kind):
        raise BrokerDisconnected(f"{NAME}: unexpected answer (no {kind.__name__})")
    return value


def _models(kind: type[M], value: object) -> list[M]:
    if not isinstance(value, list):
        raise BrokerDisconnected(f"{NAME}: unexpected answer (no list of {kind.__name__})")
    return [_model(kind, item) for item in value]


def _decimal(value: object, default: Decimal = Decimal(0)) -> Decimal:
    if value is None or value == "":
        return default
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return default
