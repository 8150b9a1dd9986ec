"""The sliding window and the plan rules."""

from __future__ import annotations

import bisect
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.identity import Plan
from tradecore.limits import (
    RATE_KEY_TTL_S,
    RATE_LIMIT_PER_MINUTE,
    RATE_WINDOW_S,
    PlanCaps,
    admit,
    daily_cap_reached,
    real_orders_allowed,
    start_of_utc_day,
)


def test_specified_numbers() -> None:
    assert (RATE_LIMIT_PER_MINUTE, RATE_WINDOW_S, RATE_KEY_TTL_S) == (60, 60, 65)


# --- Sliding window -------------------------------------------------------------------------


def test_admits_up_to_the_limit_then_refuses() -> None:
    entries: tuple[float, ...] = ()
    for i in range(3):
        decision = admit(entries, 100.0, 3, 60)
        assert decision.allowed
        assert decision.remaining == 2 - i
        entries = decision.kept
    refused = admit(entries, 100.0, 3, 60)
    assert not refused.allowed
    assert refused.remaining == 0
    assert refused.kept == entries  # a refused hit is not recorded


def test_retry_after_is_when_the_oldest_entry_leaves() -> None:
    decision = admit([10.0, 20.0, 30.0], 50.0, 3, 60)
    assert not decision.allowed
    assert decision.retry_after_s == pytest.approx(20.0)  # 10 + 60 - 50
    later = admit(decision.kept, 70.0, 3, 60)  # 10.0 is now exactly at the edge: gone
    assert later.allowed
    assert later.kept == (20.0, 30.0, 70.0)


def test_old_entries_leave_the_window() -> None:
    decision = admit([0.0, 1.0, 59.0], 60.5, 60, 60)
    assert decision.kept == (1.0, 59.0, 60.5)
    assert decision.remaining == 57


def test_zero_limit_refuses_everything() -> None:
    decision = admit([], 5.0, 0, 60)
    assert not decision.allowed
    assert decision.retry_after_s == 60


@pytest.mark.parametrize(
    ("now", "limit", "window", "reason"),
    [
        (1.0, -1, 60, "limit"),
        (1.0, 1, 0, "window"),
        (1.0, 1, -5, "window"),
        (1.0, 1, float("inf"), "window"),
        (float("nan"), 1, 60, "time"),
    ],
)
def test_nonsense_arguments_raise(now: float, limit: int, window: float, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        admit([], now, limit, window)


hit_times = st.lists(
    st.floats(min_value=0, max_value=500, allow_nan=False), min_size=1, max_size=200
).map(sorted)


@given(hit_times, st.integers(min_value=0, max_value=10), st.sampled_from([1.0, 5.0, 60.0]))
def test_never_more_than_limit_in_any_window(times: list[float], limit: int, window: float) -> None:
    entries: tuple[float, ...] = ()
    admitted: list[float] = []
    for now in times:
        decision = admit(entries, now, limit, window)
        entries = decision.kept
        if decision.allowed:
            admitted.append(now)
            assert decision.retry_after_s is None
        else:
            assert decision.retry_after_s is not None and decision.retry_after_s > 0
        assert 0 <= decision.remaining <= limit
    # Any half-open window (t - window, t] ending at an admitted hit holds at most `limit`.
    for t in admitted:
        inside = bisect.bisect_right(admitted, t) - bisect.bisect_right(admitted, t - window)
        assert inside <= limit


@given(hit_times, st.integers(min_value=1, max_value=10))
def test_a_refused_hit_would_be_admitted_after_retry_after(times: list[float], limit: int) -> None:
    entries: tuple[float, ...] = ()
    for now in times:
        decision = admit(entries, now, limit, 60.0)
        if not decision.allowed:
            assert decision.retry_after_s is not None
            assert admit(decision.kept, now + decision.retry_after_s + 1e-6, limit, 60.0).allowed
        entries = decision.kept


@given(hit_times, st.integers(min_value=1, max_value=10))
def test_a_hit_is_admitted_whenever_the_window_has_room(times: list[float], limit: int) -> None:
    entries: tuple[float, ...] = ()
    for now in times:
        room = sum(1 for e in entries if e > now - 60.0) < limit
        decision = admit(entries, now, limit, 60.0)
        assert decision.allowed is room
        entries = decision.kept


# --- Plans ----------------------------------------------------------------------------------


def test_default_caps_parse() -> None:
    caps = PlanCaps.parse("free=100,pro=1000")
    assert caps.cap(Plan.FREE) == 100
    assert caps.cap(Plan.PRO) == 1000
    assert caps.render() == "free=100,pro=1000"


def test_caps_tolerate_spaces_order_and_case() -> None:
    assert PlanCaps.parse(" PRO = 5 , free=0 ") == PlanCaps.parse("free=0,pro=5")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("free=100", "no cap for plan"),
        ("free=100,pro=1000,gold=5", "unknown plan 'gold'"),
        ("free=100,free=5,pro=1", "given twice"),
        ("free=-1,pro=1", "not of the form"),
        ("free=1.5,pro=1", "not of the form"),
        ("free=1_000,pro=1", "not of the form"),
        ("free=\u0663,pro=1", "not of the form"),  # an Arabic-Indic digit
        ("free=100,,pro=1", "not of the form"),
        ("free=100,pro=1,", "not of the form"),
        ("free:100,pro:1", "not of the form"),
        ("free=9999999999,pro=1", "not of the form"),
    ],
)
def test_nonsense_caps_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        PlanCaps.parse(text)


def test_free_plan_is_simulation_only() -> None:
    assert not real_orders_allowed(Plan.FREE)
    assert real_orders_allowed(Plan.PRO)


def test_daily_cap_counts_orders_already_placed() -> None:
    caps = PlanCaps.parse("free=2,pro=3")
    assert not daily_cap_reached(Plan.PRO, 2, caps)
    assert daily_cap_reached(Plan.PRO, 3, caps)
    assert daily_cap_reached(Plan.FREE, 2, caps)
    assert daily_cap_reached(Plan.FREE, 0, PlanCaps.parse("free=0,pro=3"))


def test_start_of_utc_day() -> None:
    now = datetime(2026, 1, 5, 14, 30, 7, 123, tzinfo=UTC)
    assert start_of_utc_day(now) == datetime(2026, 1, 5, tzinfo=UTC)
    # 01:00 at UTC+2 is still the previous day in UTC.
    east = datetime(2026, 1, 6, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert start_of_utc_day(east) == datetime(2026, 1, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match="aware"):
        start_of_utc_day(datetime(2026, 1, 5, 12, 0))


@given(st.datetimes(timezones=st.just(UTC)))
def test_start_of_day_is_at_most_a_day_before(now: datetime) -> None:
    start = start_of_utc_day(now)
    assert timedelta(0) <= now - start < timedelta(days=1)
    assert (start.hour, start.minute, start.second, start.microsecond) == (0, 0, 0, 0)
