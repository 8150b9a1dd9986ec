"""What an order endpoint answers, independent of HTTP.

The HTTP adapter maps ``Rejected`` to an ``application/problem+json`` response with the same
status, ``Accepted`` to 200 with the OrderResult and ``Queued`` to 202 with the poll link.
"""

from __future__ import annotations

import attrs

from tradecore.orders import OrderResult
from tradecore.services.vocabulary import Rejected


@attrs.frozen
class Accepted:
    """The worker answered in time: 200 with the result."""

    result: OrderResult


@attrs.frozen
class Queued:
    """The order is durable but the worker's answer did not arrive in time: 202."""

    order_id: str
    request_id: str

    @property
    def poll(self) -> str:
        return f"/trading/orders/{self.order_id}"


OrderOutcome = Rejected | Accepted | Queued
