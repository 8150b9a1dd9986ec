"""The replay fingerprint: the specification's hash over canonical forms."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tradecore.orders import AlertAction
from tradecore.testing.valid_webhooks import (
    encodings_of,
    quantities,
    symbols,
    timestamps,
    to_json,
    valid_payloads,
)
from tradecore.webhooks.canonical import canonical_quantity, canonical_symbol, canonical_timestamp
from tradecore.webhooks.checks import replay_fingerprint
from tradecore.webhooks.payload import WebhookPayload, parse_webhook_body

TS = datetime(2026, 1, 5, 14, 30, tzinfo=UTC)


def fingerprint_of(raw: bytes, user_id: str = "user-1", *, simulation: bool = False) -> str:
    payload = parse_webhook_body(raw, simulation=simulation)
    assert isinstance(payload, WebhookPayload), payload
    return replay_fingerprint(
        user_id,
        payload.action,
        payload.symbol,
        payload.quantity,
        payload.timestamp,
        payload.secret,
    )


def test_known_vector() -> None:
    source = "user-42:buy:ES1!:1.5:2026-01-05T14:30:00Z:s3cret"
    expected = hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]
    got = replay_fingerprint("user-42", AlertAction.BUY, "ES1!", Decimal("1.5"), TS, "s3cret")
    assert got == expected
    assert len(got) == 32
    assert all(c in "0123456789abcdef" for c in got)


def test_known_vector_from_a_body_in_another_spelling() -> None:
    raw = (
        b'{"secret": "s3cret", "quantity": 1.50, "symbol": " es1! ",'
        b' "timestamp": "2026-01-05T16:30:00+02:00", "action": "BUY"}'
    )
    source = "user-42:buy:ES1!:1.5:2026-01-05T14:30:00Z:s3cret"
    assert fingerprint_of(raw, "user-42") == hashlib.sha256(source.encode()).hexdigest()[:32]


def test_simulation_without_timestamp_and_secret_hashes_empty_parts() -> None:
    source = "u:close_long:BTCUSDT:0.25::"
    expected = hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]
    got = replay_fingerprint("u", AlertAction.CLOSE_LONG, "btcusdt", Decimal("0.250"), None, None)
    assert got == expected


def test_non_ascii_secret_is_hashed_as_utf8() -> None:
    source = "u:sell:ES:2:2026-01-05T14:30:00Z:clé-秘密"
    expected = hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]
    assert replay_fingerprint("u", AlertAction.SELL, "ES", Decimal(2), TS, "clé-秘密") == expected


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        (Decimal("1"), "1"),
        (Decimal("1.0"), "1"),
        (Decimal("1.00"), "1"),
        (Decimal("1E+2"), "100"),
        (Decimal("100"), "100"),
        (Decimal("0.5"), "0.5"),
        (Decimal("0.50"), "0.5"),
        (Decimal("5E-1"), "0.5"),
        (Decimal("1E-10"), "0.0000000001"),
        (Decimal("123456789.0123456789"), "123456789.0123456789"),
        (Decimal("1000000000"), "1000000000"),
        (Decimal("-0.0"), "0"),
    ],
)
def test_canonical_quantity(quantity: Decimal, expected: str) -> None:
    assert canonical_quantity(quantity) == expected


@pytest.mark.parametrize("bad", [Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")])
def test_canonical_quantity_refuses_non_finite(bad: Decimal) -> None:
    with pytest.raises(ValueError, match="finite"):
        canonical_quantity(bad)


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (TS, "2026-01-05T14:30:00Z"),
        (datetime(2026, 1, 5, 16, 30, tzinfo=timezone(timedelta(hours=2))), "2026-01-05T14:30:00Z"),
        (datetime(2026, 1, 5, 14, 30), "2026-01-05T14:30:00Z"),  # naive is UTC
        (TS.replace(microsecond=120), "2026-01-05T14:30:00.000120Z"),
    ],
)
def test_canonical_timestamp(ts: datetime, expected: str) -> None:
    assert canonical_timestamp(ts) == expected


def test_canonical_symbol() -> None:
    assert canonical_symbol("  binance:btcusdt\t") == "BINANCE:BTCUSDT"


@given(valid_payloads(), st.data())
def test_fingerprint_is_equal_for_every_encoding_of_one_order(
    payload: dict[str, Any], data: st.DataObject
) -> None:
    reference = fingerprint_of(to_json(payload))
    for _ in range(3):
        assert fingerprint_of(data.draw(encodings_of(payload))) == reference


@given(valid_payloads(simulation=True), st.data())
def test_fingerprint_is_equal_for_every_encoding_in_simulation(
    payload: dict[str, Any], data: st.DataObject
) -> None:
    reference = fingerprint_of(to_json(payload), simulation=True)
    encoded = data.draw(encodings_of(payload))
    assert fingerprint_of(encoded, simulation=True) == reference


VARIANTS: dict[str, st.SearchStrategy[Any]] = {
    "user_id": st.text(min_size=1, max_size=36),
    "action": st.sampled_from(list(AlertAction)),
    "symbol": symbols(),
    "quantity": quantities(),
    "timestamp": st.one_of(st.none(), timestamps()),
    "secret": st.one_of(st.none(), st.text(st.characters(codec="utf-8"), min_size=1)),
}
ORDER = st.fixed_dictionaries(VARIANTS)


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "symbol":
        return bool(canonical_symbol(a) == canonical_symbol(b))
    return bool(a == b)  # Decimal and aware datetime compare by value


@given(ORDER, st.sampled_from(sorted(VARIANTS)), st.data())
def test_fingerprint_differs_when_any_one_part_differs(
    order: dict[str, Any], field: str, data: st.DataObject
) -> None:
    other = data.draw(VARIANTS[field], label=field)
    assume(not _same(field, order[field], other))
    changed = {**order, field: other}
    assert replay_fingerprint(**changed) != replay_fingerprint(**order)


@pytest.mark.parametrize(
    "change",
    [
        {"user_id": "user-2"},
        {"action": AlertAction.SELL},
        {"symbol": "MES"},
        {"quantity": Decimal("1.0000000001")},
        {"timestamp": TS + timedelta(microseconds=1)},
        {"timestamp": None},
        {"secret": "s3creT"},
        {"secret": None},
    ],
)
def test_each_single_change_gives_another_fingerprint(change: dict[str, Any]) -> None:
    order: dict[str, Any] = {
        "user_id": "user-1",
        "action": AlertAction.BUY,
        "symbol": "ES",
        "quantity": Decimal(1),
        "timestamp": TS,
        "secret": "s3cret",
    }
    assert replay_fingerprint(**{**order, **change}) != replay_fingerprint(**order)
