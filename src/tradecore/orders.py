"""Order vocabulary: alert actions, internal operations, requests, results and history rows.

The two mapping tables of the specification live here:

* Webhook action mapping: (alert action, order_type) -> internal operation.
* Internal actions: internal action (long_entry, ...) -> queue operation and broker method.

Quantities and prices are ``Decimal``; a position is a signed ``Decimal`` (positive long,
negative short). Every value here is frozen: requests, results and history rows are messages.
"""

from __future__ import annotations

import enum
from datetime import datetime
from decimal import Decimal

import attrs


class AlertAction(enum.StrEnum):
    """The ``action`` field of a webhook or dashboard order."""

    BUY = "buy"
    SELL = "sell"
    CLOSE_LONG = "close_long"
    CLOSE_SHORT = "close_short"


class OrderType(enum.StrEnum):
    """``entry`` (default) or ``exit``; it applies to buy and sell only."""

    ENTRY = "entry"
    EXIT = "exit"


class Side(enum.StrEnum):
    """The side of one broker order."""

    BUY = "buy"
    SELL = "sell"

    @property
    def opposite(self) -> Side:
        return Side.SELL if self is Side.BUY else Side.BUY

    @property
    def sign(self) -> int:
        """+1 for a buy, -1 for a sell: the effect of a fill on a signed position."""
        return 1 if self is Side.BUY else -1


class Direction(enum.StrEnum):
    """The side of a position."""

    LONG = "long"
    SHORT = "short"

    @property
    def closing_side(self) -> Side:
        """The order side that reduces a position of this direction."""
        return Side.SELL if self is Direction.LONG else Side.BUY


class Operation(enum.StrEnum):
    """Queue operations understood by the per-user worker."""

    PLACE_ENTRY_ORDER = "PLACE_ENTRY_ORDER"
    PLACE_EXIT_ORDER = "PLACE_EXIT_ORDER"
    CLOSE_POSITION = "CLOSE_POSITION"


class InternalAction(enum.StrEnum):
    """The specification's internal actions (its "Internal actions" table)."""

    LONG_ENTRY = "long_entry"
    LONG_EXIT = "long_exit"
    SHORT_ENTRY = "short_entry"
    SHORT_EXIT = "short_exit"
    CLOSE_POSITION = "close_position"


class BrokerMethod(enum.StrEnum):
    """The broker-side method that executes an operation."""

    PLACE_ENTRY_ORDER_WITH_REVERSAL = "place_entry_order_with_reversal"
    PLACE_EXIT_ORDER = "place_exit_order"
    CLOSE_POSITION = "close_position"


class Source(enum.StrEnum):
    """Where an order came from; stored in order history."""

    WEBHOOK = "webhook"
    DASHBOARD = "dashboard"


class OrderStatus(enum.StrEnum):
    """Status of an order-history row.

    ``queued`` is the durable intent written before the worker sees the order; ``submitted``
    means the worker claimed it and recorded its plan; the rest are outcomes. ``no_position``
    is the successful outcome of an exit or close with nothing to reduce.
    """

    QUEUED = "queued"
    SUBMITTED = "submitted"
    PENDING = "pending"
    PARTIALLY_FILLED = "partially_filled"
    FILLED = "filled"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    FAILED = "failed"
    EXPIRED = "expired"
    NO_POSITION = "no_position"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_STATUSES

    @property
    def is_settled(self) -> bool:
        """An execution recorded the order's outcome: neither ``queued`` nor ``submitted``."""
        return self not in (OrderStatus.QUEUED, OrderStatus.SUBMITTED)


_TERMINAL_STATUSES = frozenset(
    {
        OrderStatus.FILLED,
        OrderStatus.CANCELLED,
        OrderStatus.REJECTED,
        OrderStatus.FAILED,
        OrderStatus.EXPIRED,
        OrderStatus.NO_POSITION,
    }
)


@attrs.frozen
class Instruction:
    """What the worker must do: one internal operation with its parameters.

    ``side`` is set for PLACE_ENTRY_ORDER (the entry side); ``direction`` is set for
    PLACE_EXIT_ORDER and CLOSE_POSITION (the position side to reduce).
    """

    operation: Operation
    side: Side | None = None
    direction: Direction | None = None

    @property
    def internal_action(self) -> InternalAction:
        return _INTERNAL_ACTION[(self.operation, self.side, self.direction)]

    @property
    def broker_method(self) -> BrokerMethod:
        return _BROKER_METHOD[self.operation]


# Webhook action mapping (specification, "Webhook action mapping").
# Note the surprising rows: "buy" + exit closes a SHORT and "sell" + exit closes a LONG.
_MAPPING: dict[tuple[AlertAction, OrderType], Instruction] = {
    (AlertAction.BUY, OrderType.ENTRY): Instruction(Operation.PLACE_ENTRY_ORDER, side=Side.BUY),
    (AlertAction.SELL, OrderType.ENTRY): Instruction(Operation.PLACE_ENTRY_ORDER, side=Side.SELL),
    (AlertAction.BUY, OrderType.EXIT): Instruction(
        Operation.PLACE_EXIT_ORDER, direction=Direction.SHORT
    ),
    (AlertAction.SELL, OrderType.EXIT): Instruction(
        Operation.PLACE_EXIT_ORDER, direction=Direction.LONG
    ),
}

_INTERNAL_ACTION: dict[tuple[Operation, Side | None, Direction | None], InternalAction] = {
    (Operation.PLACE_ENTRY_ORDER, Side.BUY, None): InternalAction.LONG_ENTRY,
    (Operation.PLACE_ENTRY_ORDER, Side.SELL, None): InternalAction.SHORT_ENTRY,
    (Operation.PLACE_EXIT_ORDER, None, Direction.LONG): InternalAction.LONG_EXIT,
    (Operation.PLACE_EXIT_ORDER, None, Direction.SHORT): InternalAction.SHORT_EXIT,
    (Operation.CLOSE_POSITION, None, Direction.LONG): InternalAction.CLOSE_POSITION,
    (Operation.CLOSE_POSITION, None, Direction.SHORT): InternalAction.CLOSE_POSITION,
}

_BROKER_METHOD: dict[Operation, BrokerMethod] = {
    Operation.PLACE_ENTRY_ORDER: BrokerMethod.PLACE_ENTRY_ORDER_WITH_REVERSAL,
    Operation.PLACE_EXIT_ORDER: BrokerMethod.PLACE_EXIT_ORDER,
    Operation.CLOSE_POSITION: BrokerMethod.CLOSE_POSITION,
}


_CLOSE_ACTIONS = frozenset({AlertAction.CLOSE_LONG, AlertAction.CLOSE_SHORT})


def to_instruction(
    action: AlertAction, order_type: OrderType | None = OrderType.ENTRY
) -> Instruction:
    """Map an alert action and order type to the worker instruction.

    ``order_type`` is ignored for ``close_long`` / ``close_short`` (the table says n/a): they
    close the whole position on their side. For ``buy`` and ``sell`` None means the default,
    ``entry``.
    """
    if action is AlertAction.CLOSE_LONG:
        return Instruction(Operation.CLOSE_POSITION, direction=Direction.LONG)
    if action is AlertAction.CLOSE_SHORT:
        return Instruction(Operation.CLOSE_POSITION, direction=Direction.SHORT)
    return _MAPPING[(action, order_type or OrderType.ENTRY)]


def recorded_order_type(action: AlertAction, order_type: OrderType) -> OrderType | None:
    """The order type an order is stored and shown with: None for ``close_long`` and
    ``close_short``, which have none (the mapping table's n/a: they close the whole position,
    whatever ``order_type`` the alert named); the requested type for ``buy`` and ``sell``."""
    return None if action in _CLOSE_ACTIONS else order_type


class RejectionCode(enum.StrEnum):
    """Error codes of OrderResult.error (docs/api.md, "Bodies")."""

    INSUFFICIENT_MARGIN = "insufficient_margin"
    MARKET_CLOSED = "market_closed"
    INVALID_SYMBOL = "invalid_symbol"
    BROKER_RATE_LIMITED = "broker_rate_limited"
    POSITION_MODE_MISMATCH = "position_mode_mismatch"
    REVERSAL_TIMEOUT = "reversal_timeout"
    REVERSAL_CLOSE_FAILED = "reversal_close_failed"
    BROKER_UNAVAILABLE = "broker_unavailable"
    ORDER_EXPIRED = "order_expired"
    INVALID_QUANTITY = "invalid_quantity"
    CREDENTIALS_REJECTED = "credentials_rejected"
    BROKER_REJECTED = "broker_rejected"


@attrs.frozen
class OrderError:
    """The error carried by an OrderResult: a stable code and a human-readable message.

    ``retry_after`` (seconds) is set for ``broker_rate_limited``. ``broker_message`` is the
    venue's own words for a rejection it made (kept beside our code and message so a user can
    look it up at the venue); None for refusals of our own.
    """

    code: RejectionCode
    message: str
    retry_after: float | None = None
    broker_message: str | None = None


@attrs.frozen
class OrderRequest:
    """One order handed to a user's worker through the request queue.

    ``order_id`` is the order-history row id and doubles as the broker's client order id, so
    executing the same request twice never places a second order. ``expires_at`` bounds how
    late the worker may still execute it. ``broker_name`` is the row's ``broker_name`` (the
    broker the worker opens); with it the worker claims the row without reading it first.
    None in payloads queued before the field existed: the worker then reads the row.
    ``credentials_ref`` is the version of the account's broker credentials the API saw
    (``TradingAccount.credentials_ref``): a worker whose connection uses older ones opens a
    new one. None in older payloads and for simulations. ``log_request_id`` is the id of the
    API request that queued the order (its X-Request-ID), so the worker's log lines carry it;
    None in older payloads and where no request id was bound. ``reply_to`` names where the
    worker announces the reply (the waiting API process's reply channel, filled in by the
    queue adapter at push time); it is an address, not part of the order, so two requests
    that differ only in it are equal. None in older payloads: the reply is still written and
    found by the waiter's own look at the reply list.
    """

    request_id: str
    order_id: str
    user_id: str
    trading_account_id: str
    symbol: str
    action: AlertAction
    order_type: OrderType | None  # None for close actions (recorded_order_type)
    quantity: Decimal
    source: Source
    simulation: bool
    created_at: datetime
    expires_at: datetime
    broker_name: str | None = None
    credentials_ref: str | None = None
    log_request_id: str | None = None
    reply_to: str | None = attrs.field(default=None, eq=False)

    @property
    def instruction(self) -> Instruction:
        return to_instruction(self.action, self.order_type)


@attrs.frozen
class OrderResult:
    """What an order endpoint returns (docs/api.md lists the fields)."""

    order_id: str
    request_id: str
    status: OrderStatus
    symbol: str
    action: AlertAction
    quantity: Decimal
    filled_quantity: Decimal = Decimal(0)
    fill_price: Decimal | None = None
    auto_exit: bool = False
    exit_quantity: Decimal = Decimal(0)
    position_before: Decimal = Decimal(0)
    simulation: bool = False
    error: OrderError | None = None
    broker_refs: tuple[str, ...] = ()


@attrs.frozen
class OrderHistoryRecord:
    """One row of order_history, with the specification's field names plus id and created_at.

    ``fingerprint`` is the webhook replay fingerprint (None for dashboard orders); the store
    keeps it unique per user so a replay never becomes a second order even if the replay store
    lost its key. ``order_id`` is the broker's id of the order's main (last) broker order and
    ``client_order_id`` the id we gave it; ``position_before`` is recorded when the worker claims
    the row, and the broker steps are a pure function of it, so a crashed execution is re-run
    with the same client order ids and the broker deduplicates them.
    """

    id: str
    user_id: str
    trading_account_id: str
    broker_name: str
    symbol: str
    action: AlertAction
    quantity: Decimal
    order_type: OrderType | None  # None for close actions (recorded_order_type)
    source: Source
    simulation: bool
    status: OrderStatus
    created_at: datetime
    request_id: str
    fingerprint: str | None = None
    order_id: str | None = None
    client_order_id: str | None = None
    broker_refs: tuple[str, ...] = ()
    submitted_at: datetime | None = None
    fill_price: Decimal | None = None
    fill_quantity: Decimal = Decimal(0)
    filled_at: datetime | None = None
    auto_exit: bool = False
    exit_quantity: Decimal = Decimal(0)
    position_before: Decimal | None = None
    exit_order_result: dict[str, str] | None = None
    error: OrderError | None = None
    admitted_at: datetime | None = None
    placed_at: datetime | None = None

    def to_request(
        self,
        *,
        expires_at: datetime,
        credentials_ref: str | None = None,
        log_request_id: str | None = None,
    ) -> OrderRequest:
        """The request that hands this queued row to its user's worker: what the API pushes
        after writing the row, and what a worker host pushes again for a row whose API died
        before its push (``QueuedRecovery``)."""
        return OrderRequest(
            request_id=self.request_id,
            order_id=self.id,
            user_id=self.user_id,
            trading_account_id=self.trading_account_id,
            symbol=self.symbol,
            action=self.action,
            order_type=self.order_type,
            quantity=self.quantity,
            source=self.source,
            simulation=self.simulation,
            created_at=self.created_at,
            expires_at=expires_at,
            broker_name=self.broker_name,
            credentials_ref=credentials_ref,
            log_request_id=log_request_id,
        )

    def to_result(self) -> OrderResult:
        """The OrderResult this row stands for."""
        return OrderResult(
            order_id=self.id,
            request_id=self.request_id,
            status=self.status,
            symbol=self.symbol,
            action=self.action,
            quantity=self.quantity,
            filled_quantity=self.fill_quantity,
            fill_price=self.fill_price,
            auto_exit=self.auto_exit,
            exit_quantity=self.exit_quantity,
            position_before=self.position_before or Decimal(0),
            simulation=self.simulation,
            error=self.error,
            broker_refs=self.broker_refs,
        )
