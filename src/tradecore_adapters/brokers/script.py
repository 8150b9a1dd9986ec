"""Scripted behaviour of the paper exchange: what happens to the next orders placed.

Each new placement (not an idempotent repeat of a known client order id) takes the next step
of the script, if any: a ``Reject`` refuses it with that code, a ``Fill`` decides how it fills.
Without a script an order that passes every check fills at once, in full.
"""

from __future__ import annotations

from decimal import Decimal

import attrs

from tradecore.orders import OrderError, RejectionCode

_DEFAULT_MESSAGES: dict[RejectionCode, str] = {
    RejectionCode.INSUFFICIENT_MARGIN: "insufficient margin",
    RejectionCode.MARKET_CLOSED: "market closed",
    RejectionCode.INVALID_SYMBOL: "symbol not found in broker contracts",
    RejectionCode.BROKER_RATE_LIMITED: "broker rate limit reached",
    RejectionCode.POSITION_MODE_MISMATCH: (
        "the account is in hedge position mode; switch it to one-way mode"
    ),
}


@attrs.frozen
class Reject:
    """Refuse the order with ``code``. A ``broker_rate_limited`` refusal is not recorded (the
    broker refused the request itself), so a retry with the same client order id is a new
    placement; every other rejection is recorded under its client order id."""

    code: RejectionCode
    message: str | None = None
    retry_after: float | None = None

    def error(self) -> OrderError:
        retry_after = self.retry_after
        if self.code is RejectionCode.BROKER_RATE_LIMITED and retry_after is None:
            retry_after = 1.0
        message = self.message or _DEFAULT_MESSAGES.get(self.code, self.code.value)
        if self.code is RejectionCode.BROKER_RATE_LIMITED and self.message is None:
            message = f"{message}; retry after {retry_after:g} s"
        return OrderError(self.code, message, retry_after)


@attrs.frozen
class Fill:
    """Fill ``now`` (a fraction in [0, 1]) of the order at placement; the rest fills once the
    order's status has been polled ``rest_after_polls`` times (None: never by itself)."""

    now: Decimal = Decimal(1)
    rest_after_polls: int | None = None

    def __attrs_post_init__(self) -> None:
        if not Decimal(0) <= self.now <= Decimal(1):
            raise ValueError("Fill.now is a fraction between 0 and 1")
        if self.rest_after_polls is not None and self.rest_after_polls < 1:
            raise ValueError("Fill.rest_after_polls is at least 1 (or None for never)")

    @classmethod
    def delayed(cls, polls: int | None) -> Fill:
        """Pending until polled ``polls`` times (None: pending forever)."""
        return cls(Decimal(0), polls)

    @classmethod
    def partial(cls, fraction: Decimal, rest_after_polls: int | None = None) -> Fill:
        return cls(fraction, rest_after_polls)


Step = Reject | Fill
