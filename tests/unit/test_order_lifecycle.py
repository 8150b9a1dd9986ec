"""The order lifecycle table: which change may leave which status, and where it leads."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import attrs
from hypothesis import given
from hypothesis import strategies as st

from tradecore.errors import IllegalTransition
from tradecore.order_lifecycle import (
    CHECK_OUTCOMES,
    EXECUTION_OUTCOMES,
    TRANSITIONS,
    ClaimedAndExecuted,
    ClaimFailed,
    Executed,
    Expired,
    FillChecked,
    FillRecorded,
    Interrupted,
    OrderChange,
    PlacementKept,
    ReportedFill,
    Step,
    Submitted,
    Withdrawn,
    next_status,
    placement_kept,
    sources,
)
from tradecore.orders import OrderError, OrderHistoryRecord, OrderStatus, RejectionCode

_OS = OrderStatus
AT = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)
ERROR = OrderError(RejectionCode.BROKER_UNAVAILABLE, "Broker unreachable after 3 reconnects")
CHECKED = frozenset({_OS.SUBMITTED, _OS.PENDING, _OS.PARTIALLY_FILLED, _OS.FILLED})
FILLED = Executed(
    _OS.FILLED, "paper-1", "o-entry", ("paper-1",), Decimal(10), Decimal(1), AT, False,
    Decimal(0), None, None,
)  # fmt: skip

statuses = st.sampled_from(list(OrderStatus))
amounts = st.decimals(min_value=0, max_value=10**6, places=4)
fills = st.builds(ReportedFill, amounts, st.none() | amounts)
times = st.none() | st.just(AT)

claims = st.builds(Submitted, st.just(AT), amounts)
executions = st.builds(
    Executed,
    status=statuses,
    order_id=st.none() | st.just("paper-1"),
    client_order_id=st.none() | st.just("o-entry"),
    broker_refs=st.just(("paper-1",)),
    fill_price=st.none() | amounts,
    fill_quantity=amounts,
    filled_at=times,
    auto_exit=st.booleans(),
    exit_quantity=amounts,
    exit_order_result=st.none() | st.just({"status": "filled"}),
    error=st.none() | st.just(ERROR),
)

# Every kind of change, with any status where the change carries one.
changes: st.SearchStrategy[OrderChange] = st.one_of(
    claims,
    st.builds(Expired, st.just(ERROR)),
    st.builds(Withdrawn),
    st.builds(ClaimFailed, st.just(ERROR)),
    st.builds(Interrupted, st.just(ERROR)),
    executions,
    st.builds(ClaimedAndExecuted, claims, executions),
    st.builds(FillChecked, statuses, st.none() | fills, times),
    st.builds(FillRecorded, fills),
)
# The intent: what the order is, fixed when the row is written; no change may touch it.
INTENT = frozenset(
    {
        "id",
        "user_id",
        "trading_account_id",
        "broker_name",
        "symbol",
        "action",
        "quantity",
        "order_type",
        "source",
        "simulation",
        "created_at",
        "request_id",
    }
)
RECORD_FIELDS = frozenset(f.name for f in attrs.fields(OrderHistoryRecord))


def legal(status: OrderStatus, change: OrderChange) -> bool:
    target = status if change.status is None else change.status
    return target in TRANSITIONS.get((status, change.step), frozenset())


def message(status: OrderStatus | None, change: OrderChange) -> str:
    """The IllegalTransition message of ``change`` from ``status`` (None: of ``sources``)."""
    try:
        if status is None:
            sources(change)
        else:
            next_status(status, change)
    except IllegalTransition as e:
        return str(e)
    raise AssertionError(f"{change!r} from {status} raised nothing")


@given(statuses, changes)
def test_a_move_outside_the_table_raises_naming_both_states(
    status: OrderStatus, change: OrderChange
) -> None:
    if legal(status, change):
        following = next_status(status, change)
        assert following is (status if change.status is None else change.status)
        return
    text = message(status, change)
    assert f"from {status} on {change.step}" in text
    if change.status is not None:
        assert text.endswith(f"to {change.status}")


@given(changes)
def test_sources_are_every_status_the_change_may_leave(change: OrderChange) -> None:
    leaves = frozenset(s for s in OrderStatus if legal(s, change))
    if not leaves:
        assert message(None, change).endswith(f" on {change.step} to {change.status}")
        return
    assert sources(change) == leaves


@given(changes)
def test_a_change_writes_record_fields_and_its_status_only_when_it_sets_one(
    change: OrderChange,
) -> None:
    written = change.fields()
    assert set(written) <= RECORD_FIELDS
    assert not set(written) & INTENT
    assert written.get("status") == change.status
    assert ("status" in written) is (change.status is not None)


def test_the_callers_compare_and_set_is_what_it_was() -> None:
    """The statuses each caller's write may leave, as the services passed them before the
    table existed: the worker's claim, expiry and failed claim and the API's withdrawal
    only from queued; the execution's outcome and interruption only from submitted; fill
    checks from submitted, pending, partially filled and filled."""
    assert sources(Submitted(AT, Decimal(0))) == {_OS.QUEUED}
    assert sources(Expired(ERROR)) == {_OS.QUEUED}
    assert sources(ClaimFailed(ERROR)) == {_OS.QUEUED}
    assert sources(Withdrawn()) == {_OS.QUEUED}
    assert sources(Interrupted(ERROR)) == {_OS.SUBMITTED}
    for outcome in EXECUTION_OUTCOMES:
        executed = Executed(
            outcome, None, None, (), None, Decimal(0), None, False, Decimal(0), None, None
        )
        assert sources(executed) == {_OS.SUBMITTED}
        # the claim and the execution in one write leave what the claim leaves
        assert sources(ClaimedAndExecuted(Submitted(AT, Decimal(0)), executed)) == {_OS.QUEUED}
    fill = ReportedFill(Decimal(1), None)
    for outcome in CHECK_OUTCOMES:
        assert sources(FillChecked(outcome, fill)) == CHECKED
    assert sources(FillRecorded(fill)) == CHECKED


def test_a_claim_with_its_execution_writes_both_and_settles_in_the_executions_status() -> None:
    claim = Submitted(AT, Decimal(3))
    executed = FILLED
    both = ClaimedAndExecuted(claim, executed)
    assert both.status is _OS.FILLED
    assert both.fields() == {**executed.fields(), "submitted_at": AT, "position_before": 3}
    assert next_status(_OS.QUEUED, both) is _OS.FILLED
    assert message(_OS.SUBMITTED, both) == (
        "illegal transition from submitted on claim_and_execute to filled"
    )


def test_the_outcomes_are_the_statuses_after_submitted() -> None:
    after_submitted = set(OrderStatus) - {_OS.QUEUED, _OS.SUBMITTED, _OS.EXPIRED}
    assert after_submitted == EXECUTION_OUTCOMES
    assert CHECK_OUTCOMES | {_OS.NO_POSITION} == EXECUTION_OUTCOMES


def test_terminal_statuses_have_no_way_out_but_a_fill_check_over_filled() -> None:
    for status in OrderStatus:
        steps = {step for (source, step) in TRANSITIONS if source is status}
        if status is _OS.FILLED:
            assert steps == {Step.CHECK_FILL, Step.RECORD_FILL}
        elif status.is_terminal:
            assert steps == set(), status


def test_no_move_leads_back_to_queued_and_only_the_claim_enters_submitted() -> None:
    for (source, step), targets in TRANSITIONS.items():
        assert _OS.QUEUED not in targets
        if _OS.SUBMITTED in targets and source is not _OS.SUBMITTED:
            assert (source, step) == (_OS.QUEUED, Step.CLAIM)
    # The one way to stay submitted is a fill check that records a fill and keeps the status.
    assert {
        step for (s, step), t in TRANSITIONS.items() if s is _OS.SUBMITTED and _OS.SUBMITTED in t
    } == {Step.RECORD_FILL}


def test_every_status_is_reachable_from_queued() -> None:
    reached = {_OS.QUEUED}
    frontier = [_OS.QUEUED]
    while frontier:
        status = frontier.pop()
        for (source, _), targets in TRANSITIONS.items():
            if source is status:
                frontier.extend(targets - reached)
                reached |= targets
    assert reached == set(OrderStatus)


def test_every_step_is_in_the_table_and_leads_to_one_status_or_keeps_it() -> None:
    """The Postgres adapter writes a change in one statement: it sets the status the change
    names, the same from every source, or leaves the status as it is."""
    for step in Step:
        entries = {source: t for (source, s), t in TRANSITIONS.items() if s is step}
        assert entries, step
        keeps = all(targets == {source} for source, targets in entries.items())
        same = len(set(entries.values())) == 1
        assert keeps or same, step


def test_the_message_names_the_status_and_the_change() -> None:
    assert (
        message(_OS.FILLED, Submitted(AT, Decimal(0)))
        == "illegal transition from filled on claim to submitted"
    )
    assert (
        message(_OS.QUEUED, FillRecorded(ReportedFill(Decimal(1), None)))
        == "illegal transition from queued on record_fill"
    )
    assert message(None, FillChecked(_OS.NO_POSITION)) == (
        "illegal transition from submitted, pending, partially_filled or filled"
        " on check_fill to no_position"
    )


def test_a_placement_is_kept_whatever_the_cas_finds_only_after_a_claim() -> None:
    claim = Submitted(AT, Decimal(0))
    executed = FILLED
    assert placement_kept(executed) is PlacementKept.ALWAYS
    assert placement_kept(Interrupted(ERROR)) is PlacementKept.ALWAYS
    assert placement_kept(ClaimedAndExecuted(claim, executed)) is PlacementKept.IF_APPLIED
    for other in (claim, ClaimFailed(ERROR), Expired(ERROR), Withdrawn()):
        assert placement_kept(other) is PlacementKept.NEVER, other
