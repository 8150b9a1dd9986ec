"""The metrics of one process, in a registry of its own (never prometheus-client's global one,
so two processes built in one test never share a counter).

Every label takes its value from a closed set: an enum of the core (order status, rejection
code, audit action), a route template, an HTTP method, or a venue name the process knows.
Anything else becomes ``other``, so no user id, e-mail, symbol or raw path can ever become a
label value (docs/metrics.md lists the sets).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram

from tradecore.attacks import ATTACK_POLICIES
from tradecore.audit import AuditAction
from tradecore.orders import OrderError, OrderStatus, RejectionCode, Source

OTHER: Final = "other"
NONE: Final = "none"
"""The ``code`` of an outcome without an error."""

STAGE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""From milliseconds (an admission) to ten minutes (a fill that waits for the market)."""
HTTP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Up to the dashboard order's 30 s wait."""

STAGES: Final = ("admission", "queue", "execution", "fill")
"""The spans ``tradecore_order_stage_duration_seconds`` measures (docs/metrics.md)."""
ORDER_OUTCOMES: Final = ("executed", "queued", "refused", "failed")
"""How the API answered an order: 200 with the worker's result, 202, 4xx, 5xx."""
HTTP_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

_CODE = re.compile(r"[a-z][a-z0-9_]{0,47}")
"""A problem code as the API writes them (``urn:tradecore:problem:<code>``)."""
_SOURCES = frozenset(s.value for s in Source)
_STATUSES = frozenset(s.value for s in OrderStatus)
_ERROR_CODES = frozenset(c.value for c in RejectionCode)
_ATTACK_CLASSES = frozenset(a.value for a in ATTACK_POLICIES)


def bounded(value: str | None, allowed: Collection[str], *, missing: str = NONE) -> str:
    """``value`` if it is one of ``allowed``, ``missing`` for None, else ``other``."""
    if value is None:
        return missing
    return value if value in allowed else OTHER


def problem_code(value: object, status: int) -> str:
    """A refusal's label: its problem code when it has the shape of one, ``http_<status>``
    for a plain HTTP error (no code). The API's codes are a closed set of the core; the
    shape check keeps a label bounded should a body ever carry something else."""
    if isinstance(value, str) and _CODE.fullmatch(value):
        return value
    return f"http_{status}" if value is None else OTHER


class ProcessMetrics:
    """The counters and histograms of one tradecore process (the gauges read at scrape time
    are ``gauges.StateGauges``, registered here by the composition root).

    ``venues`` are the broker names this process may meet (the paper broker and the real
    venues); a row naming another counts as ``other``.
    """

    def __init__(self, venues: Collection[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._venues = frozenset(venues)
        r = self.registry
        self.orders = Counter(
            "tradecore_orders_total",
            "Orders answered by the API, by source, outcome and error or problem code.",
            ("source", "outcome", "code"),
            registry=r,
        )
        self.orders_settled = Counter(
            "tradecore_orders_settled_total",
            "Orders that reached a final status (worker, fill checks, expiry), by source, "
            "status and error code.",
            ("source", "status", "code"),
            registry=r,
        )
        self.stage_duration = Histogram(
            "tradecore_order_stage_duration_seconds",
            "Time an order spent in each stage: admission (request received to durable "
            "intent), queue (intent to the worker's claim), execution (claim to the broker's "
            "answer), fill (claim to the recorded fill).",
            ("stage",),
            buckets=STAGE_BUCKETS_S,
            registry=r,
        )
        self.broker_errors = Counter(
            "tradecore_broker_errors_total",
            "Orders the broker side failed or refused, by venue and error code.",
            ("venue", "code"),
            registry=r,
        )
        self.login_failures = Counter(
            "tradecore_login_failures_total",
            "Refused logins and password grants (wrong password, unknown address, bad "
            "request, disabled user).",
            registry=r,
        )
        self.attacks = Counter(
            "tradecore_attacks_total",
            "Security events classed as attacks, by class (the audit action).",
            ("attack_class",),
            registry=r,
        )
        self.http_requests = Counter(
            "tradecore_http_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
            registry=r,
        )
        self.http_duration = Histogram(
            "tradecore_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template and method.",
            ("route", "method"),
            buckets=HTTP_BUCKETS_S,
            registry=r,
        )

    # --- orders -----------------------------------------------------------------------------

    def order_answered(self, source: str, outcome: str, code: str) -> None:
        """One answer of the order routes (``outcome`` one of ``ORDER_OUTCOMES``)."""
        self.orders.labels(bounded(source, _SOURCES), bounded(outcome, ORDER_OUTCOMES), code).inc()

    def stage(self, stage: str, seconds: float) -> None:
        """One order's time in ``stage`` (negative spans, from clocks of two hosts, are 0)."""
        self.stage_duration.labels(bounded(stage, STAGES)).observe(max(seconds, 0.0))

    def order_settled(self, source: str, status: OrderStatus, error: OrderError | None) -> None:
        code = bounded(None if error is None else error.code.value, _ERROR_CODES)
        self.orders_settled.labels(
            bounded(source, _SOURCES), bounded(status.value, _STATUSES), code
        ).inc()

    def broker_error(self, venue: str, error: OrderError) -> None:
        self.broker_errors.labels(
            bounded(venue, self._venues), bounded(error.code.value, _ERROR_CODES)
        ).inc()

    # --- security events --------------------------------------------------------------------

    def security_event(self, action: AuditAction, success: bool) -> None:
        """One audit entry: a refused login counts as a login failure, an attack class as an
        attack; every other entry is not counted here."""
        if action is AuditAction.LOGIN and not success:
            self.login_failures.inc()
        elif action.value in _ATTACK_CLASSES:
            self.attacks.labels(action.value).inc()

    # --- HTTP -------------------------------------------------------------------------------

    def http_answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """``route`` is the route's template (``/webhook/{token}/order``), never the path."""
        verb = bounded(method, HTTP_METHODS)
        self.http_requests.labels(route, verb, str(status)).inc()
        self.http_duration.labels(route, verb).observe(max(seconds, 0.0))
