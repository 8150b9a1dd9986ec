"""The strict webhook parser: what it accepts, what it refuses (400), and that it never raises."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.orders import AlertAction, OrderType
from tradecore.testing.hostile_webhooks import hostile_bodies
from tradecore.testing.valid_webhooks import RawJson, encodings_of, to_json, valid_payloads
from tradecore.webhooks.canonical import canonical_quantity
from tradecore.webhooks.payload import (
    MAX_WEBHOOK_BODY_BYTES,
    UNUSABLE_SECRET,
    PayloadInvalid,
    WebhookPayload,
    parse_webhook_body,
)

SECRET = "tOp-SeCrEt-0123456789abcdefghijklmnopqrstuvw"
BASE: dict[str, Any] = {
    "action": "buy",
    "symbol": "ES1!",
    "quantity": 2,
    "timestamp": "2026-01-05T14:30:00Z",
    "secret": SECRET,
}


def body(**changes: Any) -> bytes:
    payload = {**BASE, **changes}
    return to_json({k: v for k, v in payload.items() if v is not _DROP})


_DROP = object()


def parsed(raw: bytes, *, simulation: bool = False) -> WebhookPayload:
    result = parse_webhook_body(raw, simulation=simulation)
    assert isinstance(result, WebhookPayload), result
    return result


def refused(raw: bytes, *, simulation: bool = False) -> PayloadInvalid:
    result = parse_webhook_body(raw, simulation=simulation)
    assert isinstance(result, PayloadInvalid), result
    assert "\n" not in result.reason
    assert result.errors
    return result


# --- accepted bodies ---------------------------------------------------------------------------


def test_a_real_order_parses_into_canonical_fields() -> None:
    payload = parsed(body())
    assert payload == WebhookPayload(
        action=AlertAction.BUY,
        symbol="ES1!",
        quantity=Decimal(2),
        order_type=OrderType.ENTRY,
        timestamp=datetime(2026, 1, 5, 14, 30, tzinfo=UTC),
        secret=SECRET,
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("buy", AlertAction.BUY),
        ("  SELL\t", AlertAction.SELL),
        ("Close_Long", AlertAction.CLOSE_LONG),
        ("\nclose_short ", AlertAction.CLOSE_SHORT),
    ],
)
def test_action_ignores_case_and_surrounding_whitespace(raw: str, expected: AlertAction) -> None:
    assert parsed(body(action=raw)).action is expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("entry", OrderType.ENTRY), (" EXIT ", OrderType.EXIT), ("Exit", OrderType.EXIT)],
)
def test_order_type_ignores_case(raw: str, expected: OrderType) -> None:
    assert parsed(body(order_type=raw)).order_type is expected


def test_order_type_defaults_to_entry() -> None:
    assert parsed(body()).order_type is OrderType.ENTRY


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("es1!", "ES1!"),
        ("  binance:btcusdt ", "BINANCE:BTCUSDT"),
        ("eur/usd", "EUR/USD"),
        ("brk.b", "BRK.B"),
        ("es\n", "ES"),
        ("A" * 40, "A" * 40),
    ],
)
def test_symbol_is_stripped_and_upper_cased(raw: str, expected: str) -> None:
    assert parsed(body(symbol=raw)).symbol == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (RawJson("0.1"), "0.1"),
        (RawJson("1.50"), "1.5"),
        (RawJson("1E2"), "100"),
        (RawJson("2.5e-1"), "0.25"),
        (RawJson("0.0000000001"), "0.0000000001"),
        (RawJson("1.000000000000000"), "1"),  # trailing zeros are not decimal places
        (RawJson("1000000000"), "1000000000"),
        (RawJson("1E9"), "1000000000"),
        ("0.5", "0.5"),  # a quoted TradingView placeholder is the same number
        ("2", "2"),
        ("1.50", "1.5"),
    ],
)
def test_quantity_is_exact_and_normalized(raw: RawJson, expected: str) -> None:
    quantity = parsed(body(quantity=raw)).quantity
    assert quantity.as_tuple() == Decimal(expected).as_tuple()  # value and exponent
    assert canonical_quantity(quantity) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "2026-01-05T14:30:00Z",
        "2026-01-05T14:30:00+00:00",
        "2026-01-05T16:30:00+02:00",
        "2026-01-05T09:00:00-05:30",
        "2026-01-05T14:30:00",  # no zone: UTC
        "2026-01-05 14:30:00Z",
        "20260105T143000Z",
        "2026-01-05T14:30:00.000Z",
    ],
)
def test_timestamp_spellings_of_one_instant_agree(raw: str) -> None:
    ts = parsed(body(timestamp=raw)).timestamp
    assert ts == datetime(2026, 1, 5, 14, 30, tzinfo=UTC)
    assert ts is not None
    assert ts.utcoffset() is not None
    assert ts.tzinfo is UTC


def test_unknown_fields_are_ignored_and_never_applied() -> None:
    extra = {
        "strategy": "my strat",
        "comment": {"nested": [1, 2, {"x": None}]},
        "leverage": 100,
        "Action": "sell",
        "QUANTITY": 99,
        "price": 1.5,
    }
    assert parsed(body(**extra)) == parsed(body())


def test_simulation_allows_missing_timestamp_and_secret() -> None:
    payload = parsed(body(timestamp=_DROP, secret=_DROP), simulation=True)
    assert payload.timestamp is None
    assert payload.secret is None


def test_simulation_still_uses_a_timestamp_and_secret_when_sent() -> None:
    payload = parsed(body(), simulation=True)
    assert payload.timestamp == datetime(2026, 1, 5, 14, 30, tzinfo=UTC)
    assert payload.secret == SECRET


@pytest.mark.parametrize("value", [None, 1, "", [], {}])
def test_simulation_still_refuses_an_ill_typed_timestamp(value: Any) -> None:
    result = refused(body(timestamp=value), simulation=True)
    assert any(error.endswith("@ $.timestamp") for error in result.errors)


@pytest.mark.parametrize(
    "value", [None, 12345, True, "", "x" * 257, [], {}, RawJson('"\\ud800"')], ids=repr
)
@pytest.mark.parametrize("simulation", [False, True])
def test_a_secret_that_cannot_be_one_is_an_unusable_secret_not_a_bad_body(
    value: Any, simulation: bool
) -> None:
    """It is then answered as a wrong secret (401, a credential attack), never 400."""
    assert parsed(body(secret=value), simulation=simulation).secret == UNUSABLE_SECRET


@pytest.mark.parametrize("field", ["timestamp", "secret"])
def test_real_orders_require_timestamp_and_secret(field: str) -> None:
    result = refused(body(**{field: _DROP}))
    assert result.errors == (f"required field missing @ $.{field}",)


def test_non_ascii_secret_is_accepted() -> None:
    assert parsed(body(secret="pässwörd-秘密-🔑")).secret == "pässwörd-秘密-🔑"


def test_secret_is_not_in_the_payload_repr() -> None:
    assert SECRET not in repr(parsed(body()))


def test_body_at_the_size_limit_is_accepted() -> None:
    raw = body()
    raw = raw + b" " * (MAX_WEBHOOK_BODY_BYTES - len(raw))
    assert len(raw) == MAX_WEBHOOK_BODY_BYTES
    parsed(raw)


def test_text_plain_style_body_with_surrounding_whitespace_parses() -> None:
    parsed(b"\n  " + body() + b"\r\n")


# --- refused bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (body(quantity=RawJson("NaN")), None),
        (body(quantity=RawJson("Infinity")), None),
        (body(quantity=RawJson("-Infinity")), None),
        (body(extra=RawJson("[1, NaN]")), None),
        (body(quantity=True), "quantity"),
        (body(quantity=False), "quantity"),
        (body(quantity="1e3"), "quantity"),  # a quoted quantity is a plain decimal only
        (body(quantity=" 1"), "quantity"),
        (body(quantity="+1"), "quantity"),
        (body(quantity="-1"), "quantity"),
        (body(quantity=".5"), "quantity"),
        (body(quantity="1."), "quantity"),
        (body(quantity="0"), "quantity"),
        (body(quantity="\u0661"), "quantity"),  # an Arabic-Indic digit one
        (body(quantity=None), "quantity"),
        (body(quantity=[1]), "quantity"),
        (body(quantity=0), "quantity"),
        (body(quantity=RawJson("-0.0")), "quantity"),
        (body(quantity=-1), "quantity"),
        (body(quantity=RawJson("1000000000.0000000001")), "quantity"),
        (body(quantity=RawJson("1e-11")), "quantity"),
        (body(quantity=RawJson("0.00000000001")), "quantity"),
        (body(quantity=RawJson("1e999999999")), "quantity"),
        (body(action="long"), "action"),
        (body(action=1), "action"),
        (body(action=None), "action"),
        (body(action="b\u0075y\u200b"), "action"),
        (body(symbol=""), "symbol"),
        (body(symbol="A" * 41), "symbol"),
        (body(symbol="BTC USDT"), "symbol"),
        (body(symbol="-ES"), "symbol"),
        (body(symbol="\u00c4APL"), "symbol"),
        (body(symbol="\ufb01"), "symbol"),  # upper-cases to the ASCII "FI"
        (body(symbol=7), "symbol"),
        (body(order_type="market"), "order_type"),
        (body(order_type=None), "order_type"),
        (body(timestamp="NaN"), "timestamp"),
        (body(timestamp="Infinity"), "timestamp"),
        (body(timestamp=""), "timestamp"),
        (body(timestamp=1767623400), "timestamp"),
        (body(timestamp="2026-01-05"), "timestamp"),
        (body(timestamp="2026-02-30T10:00:00Z"), "timestamp"),
        (body(timestamp="9999-12-31T23:59:59-01:00"), "timestamp"),
        (body(timestamp="0001-01-01T00:00:00+01:00"), "timestamp"),
        (body(timestamp="2026-01-05T14:30:00+24:00"), "timestamp"),
    ],
)
def test_each_rule_violation_is_refused(raw: bytes, field: str | None) -> None:
    result = refused(raw)
    if field is not None:
        assert any(error.endswith(f"@ $.{field}") for error in result.errors), result.errors


def test_a_secret_of_256_characters_is_accepted() -> None:
    assert parsed(body(secret="x" * 256)).secret == "x" * 256


@pytest.mark.parametrize("field", ["action", "symbol", "quantity"])
@pytest.mark.parametrize("simulation", [False, True])
def test_order_fields_are_always_required(field: str, simulation: bool) -> None:
    result = refused(body(**{field: _DROP}), simulation=simulation)
    assert result.errors == (f"required field missing @ $.{field}",)


def test_oversized_body_is_refused() -> None:
    raw = body()
    refused(raw + b" " * (MAX_WEBHOOK_BODY_BYTES + 1 - len(raw)))


@pytest.mark.parametrize("raw", [b"\xff", b'{"action":"\xc3\x28"}', b'{"a":"\xed\xa0\x80"}'])
def test_invalid_utf8_is_refused(raw: bytes) -> None:
    assert refused(raw).errors == ("body is not UTF-8",)


@pytest.mark.parametrize(
    "raw", [b"", b"{", b'{"action":"buy",}', b"{'a': 1}", b'{"a":1}{"b":2}', b"\xef\xbb\xbf{}"]
)
def test_not_json_is_refused(raw: bytes) -> None:
    refused(raw)


@pytest.mark.parametrize("raw", [b"[]", b"null", b"1", b'"buy"', b"true", b"[" + body() + b"]"])
def test_top_level_must_be_an_object(raw: bytes) -> None:
    assert refused(raw).errors == ("body must be a JSON object",)


@pytest.mark.parametrize(
    "raw",
    [
        body()[:-1] + b',"quantity":3}',
        body()[:-1] + b',"unknown":1,"unknown":2}',
        body(meta=RawJson('{"a":{"k":1,"k":1}}')),
    ],
)
def test_duplicate_keys_at_any_level_are_refused(raw: bytes) -> None:
    assert "duplicate key" in refused(raw).reason


@pytest.mark.parametrize("depth", [32, 999, 5000])
def test_deep_nesting_is_refused(depth: int) -> None:
    refused(body(nested=RawJson("[" * depth + "]" * depth)))


def test_moderate_nesting_in_unknown_fields_is_accepted() -> None:
    parsed(body(nested=RawJson("[" * 30 + "]" * 30)))


def test_nesting_limit_is_fixed_not_the_interpreters() -> None:
    # 900 levels parse without a RecursionError; the parser's own limit still refuses them
    assert sys.getrecursionlimit() > 900
    result = refused(body(nested=RawJson("[" * 900 + "]" * 900)))
    assert result.errors == ("JSON nested deeper than 32 levels",)


@pytest.mark.parametrize("digits", [65, 4301, 10_000])
def test_huge_integers_are_refused_anywhere(digits: int) -> None:
    refused(body(quantity=RawJson("9" * digits)))
    refused(body(big=RawJson("9" * digits)))


def test_errors_list_every_faulty_field() -> None:
    result = refused(body(action="x", symbol="", quantity="1e0", timestamp=""))
    fields = sorted(error.rsplit("$.", 1)[1] for error in result.errors)
    assert fields == ["action", "quantity", "symbol", "timestamp"]


def test_no_message_repeats_a_value_from_the_body() -> None:
    marker = "LEAKED-VALUE-7f3a"
    raw = body(
        action=marker,
        symbol=marker + " !x y",
        quantity=marker,
        order_type=marker,
        timestamp=marker,
        secret=marker * 30,
    )
    result = refused(raw)
    assert marker not in result.reason
    assert not any(marker in error for error in result.errors)


# --- properties --------------------------------------------------------------------------------


@given(valid_payloads())
def test_every_valid_real_payload_parses(payload: dict[str, Any]) -> None:
    parsed(to_json(payload))


@given(valid_payloads(simulation=True))
def test_every_valid_simulation_payload_parses(payload: dict[str, Any]) -> None:
    result = parsed(to_json(payload), simulation=True)
    assert (result.timestamp is None) == ("timestamp" not in payload)
    assert (result.secret is None) == ("secret" not in payload)


@given(valid_payloads(), st.data())
def test_every_encoding_parses_to_the_same_payload(payload: dict[str, Any], data: Any) -> None:
    encoded = data.draw(encodings_of(payload))
    assert parsed(encoded) == parsed(to_json(payload))


@given(hostile_bodies())
def test_hostile_bodies_are_refused(raw: bytes) -> None:
    refused(raw)


@given(hostile_bodies(simulation=True))
def test_hostile_bodies_are_refused_in_simulation(raw: bytes) -> None:
    refused(raw, simulation=True)


@given(st.binary(max_size=2 * MAX_WEBHOOK_BODY_BYTES), st.booleans())
def test_parse_never_raises_on_arbitrary_bytes(raw: bytes, simulation: bool) -> None:
    result = parse_webhook_body(raw, simulation=simulation)
    assert isinstance(result, WebhookPayload | PayloadInvalid)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        name: _JSON_VALUES
        for name in ("action", "symbol", "quantity", "order_type", "timestamp", "secret")
    },
)


@given(st.one_of(_JSON_VALUES, _FIELD_VALUES), st.booleans())
def test_parse_never_raises_on_arbitrary_json(value: object, simulation: bool) -> None:
    raw = json.dumps(value).encode("utf-8", "surrogatepass")
    result = parse_webhook_body(raw, simulation=simulation)
    assert isinstance(result, WebhookPayload | PayloadInvalid)
    if isinstance(result, PayloadInvalid):
        assert "\n" not in result.reason


_FIELD_NAMES = ("action", "symbol", "quantity", "order_type", "timestamp", "secret")
_ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["buy", " SELL ", "exit", "ES1!", "2026-01-05T14:30:00Z", "2026-01-05"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=4,
)


@given(
    valid_payloads(simulation=True),
    st.dictionaries(st.sampled_from(_FIELD_NAMES), _ANY_JSON, max_size=2),
    st.sets(st.sampled_from(_FIELD_NAMES), max_size=2),
    st.booleans(),
)
def test_the_direct_path_and_the_converter_agree(
    payload: dict[str, Any], replaced: dict[str, Any], dropped: set[str], simulation: bool
) -> None:
    """A valid body is structured by calling the field rules directly; anything else goes to
    cattrs, which names every fault. Both must accept exactly the same documents, alike."""
    from tradecore.webhooks import payload as parsing

    document = {k: v for k, v in {**payload, **replaced}.items() if k not in dropped}
    try:
        expected: WebhookPayload | None = parsing._converter.structure(document, WebhookPayload)
    except Exception:
        expected = None
    if not simulation and not {"timestamp", "secret"} <= document.keys():
        expected = None

    assert parsing._structure_valid(document, simulation) == expected


def test_a_body_using_another_platforms_field_names_is_told_ours() -> None:
    raw = json.dumps(
        {"side": "buy", "ticker": "BTCUSDT", "qty": 1, "timestamp": "2026-01-05T14:30:00Z",
         "secret": SECRET}
    ).encode()  # fmt: skip
    result = refused(raw)
    assert set(result.errors) == {
        "required field missing @ $.action (the body names 'side': send it as 'action')",
        "required field missing @ $.symbol (the body names 'ticker': send it as 'symbol')",
        "required field missing @ $.quantity (the body names 'qty': send it as 'quantity')",
    }


def test_an_unknown_action_is_told_the_actions() -> None:
    result = refused(body(action="long"))
    assert result.errors == ("must be one of buy, sell, close_long, close_short @ $.action",)
