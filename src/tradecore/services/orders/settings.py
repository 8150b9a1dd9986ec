"""Tunable numbers of the order flows (their environment names are in docs/configuration.md)."""

from __future__ import annotations

import attrs

from tradecore.limits import RATE_LIMIT_PER_MINUTE, RATE_WINDOW_S, PlanCaps


@attrs.frozen
class OrderSettings:
    """Limits and waits of the order paths.

    ``webhook_wait_s`` is shorter than ``order_wait_s`` because TradingView cancels a webhook
    after 3 s; the order is durable and executes either way. ``max_queue_age_s`` is how long a
    queued order may wait for its worker before it expires instead of executing late.
    """

    plan_caps: PlanCaps = attrs.field(factory=lambda: PlanCaps.parse("free=100,pro=1000"))
    rate_limit_per_minute: int = RATE_LIMIT_PER_MINUTE
    rate_window_s: float = float(RATE_WINDOW_S)
    terms_version: str = "1"
    webhook_wait_s: float = 2.5
    order_wait_s: float = 30.0
    worker_start_timeout_s: float = 60.0
    max_queue_age_s: float = 60.0
