"""The recording decorators: each applied change of an order row is recorded once, from the
row's own timestamps; a lost compare-and-set records nothing; labels stay in their closed
sets; security events count refused logins and attacks by class."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import attrs
import pytest
from metrics_support import sample
from support import queued_row

from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Executed,
    Expired,
    FillChecked,
    ReportedFill,
    Submitted,
)
from tradecore.orders import OrderError, OrderStatus, RejectionCode
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.repositories import MemoryAuditLog, MemoryOrderHistory
from tradecore_adapters.metrics import ProcessMetrics, RecordingAuditLog, RecordingOrderHistory
from tradecore_adapters.metrics.recorders import REQUEST_STARTED

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
STAGE = "tradecore_order_stage_duration_seconds"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def executed(
    status: OrderStatus, *, filled_at: datetime | None, error: OrderError | None
) -> Executed:
    return Executed(
        status=status,
        order_id="paper-1",
        client_order_id="o-1",
        broker_refs=("paper-1",),
        fill_price=None if filled_at is None else Decimal(100),
        fill_quantity=Decimal(0) if filled_at is None else Decimal(1),
        filled_at=filled_at,
        auto_exit=False,
        exit_quantity=Decimal(0),
        exit_order_result=None,
        error=error,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def metrics() -> ProcessMetrics:
    return ProcessMetrics(venues={"paper", "bybit"})


@pytest.fixture
def orders(metrics: ProcessMetrics, clock: FakeClock) -> RecordingOrderHistory:
    return RecordingOrderHistory(MemoryOrderHistory(), metrics, clock)


async def add_row(orders: RecordingOrderHistory, order_id: str = "o-1", broker: str = "paper"):
    row = attrs.evolve(
        queued_row(order_id, user_id="u1", account_id="a1", created_at=at(0)), broker_name=broker
    )
    await orders.add(row)
    return row


def stage_sum(metrics: ProcessMetrics, stage: str) -> float:
    return sample(metrics, STAGE + "_sum", stage=stage)


async def test_each_stage_is_measured_from_the_rows_timestamps(
    orders: RecordingOrderHistory, metrics: ProcessMetrics, clock: FakeClock
) -> None:
    await add_row(orders)
    await orders.transition("o-1", Submitted(at(2), Decimal(0)))
    clock.advance(5)  # the broker answered 3 s after the claim
    await orders.transition("o-1", executed(OrderStatus.PENDING, filled_at=None, error=None))
    await orders.transition(
        "o-1", FillChecked(OrderStatus.FILLED, ReportedFill(Decimal(1), None), at(9))
    )

    assert stage_sum(metrics, "queue") == 2
    assert stage_sum(metrics, "execution") == 3
    assert stage_sum(metrics, "fill") == 7
    assert sample(metrics, STAGE + "_count", stage="fill") == 1
    assert (
        sample(
            metrics,
            "tradecore_orders_settled_total",
            source="webhook",
            status="filled",
            code="none",
        )
        == 1
    )


async def test_a_claim_written_with_its_execution_measures_both_stages(
    orders: RecordingOrderHistory, metrics: ProcessMetrics, clock: FakeClock
) -> None:
    await add_row(orders)
    clock.advance(3)  # placed unclaimed 2 s after the intent; the answer 1 s later
    change = ClaimedAndExecuted(
        Submitted(at(2), Decimal(0)), executed(OrderStatus.FILLED, filled_at=at(3), error=None)
    )
    await orders.transition("o-1", change)

    assert stage_sum(metrics, "queue") == 2
    assert stage_sum(metrics, "execution") == 1
    assert stage_sum(metrics, "fill") == 1
    settled = {"source": "webhook", "status": "filled", "code": "none"}
    assert sample(metrics, "tradecore_orders_settled_total", **settled) == 1


async def test_the_admission_stage_needs_a_request(
    orders: RecordingOrderHistory, metrics: ProcessMetrics
) -> None:
    await add_row(orders, "o-1")
    assert sample(metrics, STAGE + "_count", stage="admission") == 0

    token = REQUEST_STARTED.set(0.0)  # a request that arrived at perf_counter 0
    try:
        await add_row(orders, "o-2")
    finally:
        REQUEST_STARTED.reset(token)

    assert sample(metrics, STAGE + "_count", stage="admission") == 1


async def test_a_lost_compare_and_set_records_nothing(
    orders: RecordingOrderHistory, metrics: ProcessMetrics
) -> None:
    await add_row(orders)
    await orders.transition("o-1", Submitted(at(1), Decimal(0)))

    assert await orders.transition("o-1", Submitted(at(2), Decimal(0))) is None
    assert await orders.transition("missing", Submitted(at(2), Decimal(0))) is None

    assert sample(metrics, STAGE + "_count", stage="queue") == 1


async def test_broker_errors_count_by_venue_and_code_and_an_expiry_is_not_one(
    orders: RecordingOrderHistory, metrics: ProcessMetrics
) -> None:
    margin = OrderError(RejectionCode.INSUFFICIENT_MARGIN, "not enough margin")
    await add_row(orders, "o-1", broker="bybit")
    await orders.transition("o-1", Submitted(at(1), Decimal(0)))
    await orders.transition("o-1", executed(OrderStatus.REJECTED, filled_at=None, error=margin))
    await add_row(orders, "o-2", broker="some-new-venue")
    await orders.transition(
        "o-2", ClaimFailed(OrderError(RejectionCode.BROKER_UNAVAILABLE, "down"))
    )
    await add_row(orders, "o-3")
    await orders.transition("o-3", Expired(OrderError(RejectionCode.ORDER_EXPIRED, "too old")))

    errors = "tradecore_broker_errors_total"
    assert sample(metrics, errors, venue="bybit", code="insufficient_margin") == 1
    assert sample(metrics, errors, venue="other", code="broker_unavailable") == 1
    assert sample(metrics, errors, venue="paper", code="order_expired") == 0
    settled = "tradecore_orders_settled_total"
    assert sample(metrics, settled, source="webhook", status="expired", code="order_expired") == 1
    assert (
        sample(metrics, settled, source="webhook", status="failed", code="broker_unavailable") == 1
    )


async def test_the_wrapped_store_keeps_its_own_helpers(metrics: ProcessMetrics) -> None:
    inner = MemoryAuditLog()
    audit = RecordingAuditLog(inner, metrics)

    assert audit.all() == inner.all() == []


async def test_security_events_count_refused_logins_and_attacks_by_class(
    metrics: ProcessMetrics,
) -> None:
    audit = RecordingAuditLog(MemoryAuditLog(), metrics)
    context = RequestContext("203.0.113.9", "test", "/auth/login", "POST")

    def entry(action: AuditAction, success: bool) -> AuditEntry:
        return AuditEntry(None, action, success, context, T0)

    await audit.append(entry(AuditAction.LOGIN, False))
    await audit.append(entry(AuditAction.LOGIN, True))
    await audit.append(entry(AuditAction.WEBHOOK_REPLAY_ATTACK, False))
    await audit.append(entry(AuditAction.LOGIN_CREDENTIAL_ATTACK, False))
    await audit.append(entry(AuditAction.API_KEY_CREATED, True))

    assert sample(metrics, "tradecore_login_failures_total") == 1
    assert sample(metrics, "tradecore_attacks_total", attack_class="webhook_replay_attack") == 1
    assert sample(metrics, "tradecore_attacks_total", attack_class="login_credential_attack") == 1
    assert len(await audit.chain()) == 5
