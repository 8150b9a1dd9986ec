"""Layer 2 (the timestamp window) and the replay key's lifetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.testing.clock import EPOCH
from tradecore.webhooks.checks import (
    replay_ttl_seconds,
    request_age_seconds,
    timestamp_within_window,
)

NOW = EPOCH
US = timedelta(microseconds=1)
MAX_AGE = 300


@pytest.mark.parametrize(
    ("offset", "inside"),
    [
        (timedelta(0), True),
        (timedelta(seconds=MAX_AGE), True),  # exactly max_age old: inside
        (timedelta(seconds=MAX_AGE) + US, False),
        (-timedelta(seconds=MAX_AGE), True),  # exactly max_age ahead: inside (abs)
        (-timedelta(seconds=MAX_AGE) - US, False),
        (timedelta(seconds=299, microseconds=999_999), True),
        (-timedelta(seconds=299), True),  # a sender clock running ahead is tolerated
        (timedelta(days=1), False),
        (-timedelta(days=1), False),
    ],
)
def test_window_boundary(offset: timedelta, inside: bool) -> None:
    assert timestamp_within_window(NOW, NOW - offset, MAX_AGE) is inside


@given(
    st.integers(-(10**9), 10**9).map(lambda us: timedelta(microseconds=us)),
    st.integers(0, 3600),
)
def test_window_is_the_absolute_age(offset: timedelta, max_age: int) -> None:
    ts = NOW - offset
    expected = abs(offset) <= timedelta(seconds=max_age)
    assert timestamp_within_window(NOW, ts, max_age) is expected


def test_naive_and_offset_times_are_the_same_instant() -> None:
    naive = datetime(2026, 1, 5, 14, 30)
    plus_two = datetime(2026, 1, 5, 16, 30, tzinfo=timezone(timedelta(hours=2)))
    now = datetime(2026, 1, 5, 14, 35, tzinfo=UTC)
    assert request_age_seconds(now, naive) == request_age_seconds(now, plus_two) == 300.0
    assert timestamp_within_window(now, naive, 300)
    assert timestamp_within_window(now, plus_two, 300)
    assert not timestamp_within_window(now, naive, 299)
    assert not timestamp_within_window(now, plus_two, 299)
    # a naive ``now`` is UTC as well
    assert timestamp_within_window(now.replace(tzinfo=None), plus_two, 300)


def test_request_age_is_negative_for_a_future_timestamp() -> None:
    assert request_age_seconds(NOW, NOW + timedelta(seconds=12.5)) == -12.5
    assert request_age_seconds(NOW, NOW - timedelta(seconds=7)) == 7.0


def test_a_negative_window_admits_nothing() -> None:
    assert not timestamp_within_window(NOW, NOW, -1)


def test_zero_window_admits_only_the_same_microsecond() -> None:
    assert timestamp_within_window(NOW, NOW, 0)
    assert not timestamp_within_window(NOW, NOW + US, 0)


def test_huge_window_does_not_overflow() -> None:
    far = datetime(1, 1, 1, tzinfo=UTC)
    assert timestamp_within_window(NOW, far, 10**15)
    assert not timestamp_within_window(NOW, far, 10**9)


def test_extreme_instants_do_not_raise() -> None:
    earliest = datetime.min.replace(tzinfo=UTC)
    latest = datetime.max.replace(tzinfo=UTC)
    assert not timestamp_within_window(earliest, latest, MAX_AGE)
    assert replay_ttl_seconds(earliest, latest, MAX_AGE) > MAX_AGE


# --- replay TTL --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (None, MAX_AGE),  # simulation without a timestamp
        (NOW, MAX_AGE),
        (NOW - timedelta(seconds=100), MAX_AGE),  # past: the window is the lifetime
        (NOW - timedelta(seconds=MAX_AGE), MAX_AGE),
        (NOW + timedelta(seconds=299), MAX_AGE + 299),  # future: valid until ts + max_age
        (NOW + timedelta(seconds=299, microseconds=1), MAX_AGE + 300),  # rounded up
        (NOW + US, MAX_AGE + 1),
    ],
)
def test_replay_ttl(ts: datetime | None, expected: int) -> None:
    assert replay_ttl_seconds(NOW, ts, MAX_AGE) == expected


def test_replay_ttl_is_at_least_one_second() -> None:
    assert replay_ttl_seconds(NOW, None, 0) == 1
    assert replay_ttl_seconds(NOW, NOW - timedelta(seconds=5), 0) == 1


@given(
    st.integers(-(MAX_AGE * 10**6), MAX_AGE * 10**6).map(lambda us: timedelta(microseconds=us)),
    st.integers(1, 86_400),
)
def test_replay_key_outlives_the_timestamps_validity(ahead: timedelta, max_age: int) -> None:
    """Once the key expires, the same timestamp can no longer pass the window."""
    ts = NOW + ahead
    ttl = replay_ttl_seconds(NOW, ts, max_age)
    assert ttl >= max_age
    expiry = NOW + timedelta(seconds=ttl)
    assert not timestamp_within_window(expiry + US, ts, max_age)
    # and it is not longer than needed by more than the one-second rounding
    assert timestamp_within_window(expiry - timedelta(seconds=1), ts, max_age) or ahead <= -US
