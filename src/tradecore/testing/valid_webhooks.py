"""Hypothesis strategies for webhook bodies, for tradecore's tests and services built on it.

``valid_payloads(simulation=False, *, around=EPOCH, spread_s=300)``
    Dicts that ``parse_webhook_body`` accepts: every action, case and surrounding whitespace
    varied; TradingView-style symbols; quantities as ``int`` or ``Decimal`` (up to 10 places,
    up to 1e9); timestamps within ``spread_s`` of ``around`` written with ``Z``, an offset or no
    zone; secrets of URL-safe or arbitrary Unicode text; sometimes ``order_type`` and unknown
    fields. With ``simulation=True`` ``timestamp`` and ``secret`` may be absent.

``to_json(payload, *, ensure_ascii=True) -> bytes``
    Encode such a dict (``json.dumps`` cannot write ``Decimal``). A ``RawJson(text)`` value is
    written verbatim, which is how hostile number spellings get into a body.

``encodings_of(payload) -> SearchStrategy[bytes]``
    Other byte encodings of the same order: key order, whitespace, ``\\u`` escapes, ``1`` vs
    ``1.0`` vs ``1.00`` vs ``1E0`` quantity, ``Z`` vs ``+00:00`` vs an equivalent offset vs a
    naive timestamp, case and padding of action, symbol and order_type, an explicit default
    ``order_type``, an extra unknown field. All of them parse to the same payload and the same
    replay fingerprint.

``hostile_bodies(simulation=False) -> SearchStrategy[bytes]``
    Bodies that must be refused with ``PayloadInvalid`` (400): NaN/Infinity, duplicate keys,
    deep nesting, huge integers, booleans or strings as quantity, wrong types and values of
    every known field, a non-object top level, an oversized body, invalid UTF-8, broken JSON
    and missing required fields (``timestamp``/``secret`` only when ``simulation`` is False).
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs
from hypothesis import strategies as st

from tradecore.orders import AlertAction, OrderType
from tradecore.testing.clock import EPOCH
from tradecore.webhook_payload import (
    MAX_JSON_DEPTH,
    MAX_QUANTITY,
    MAX_QUANTITY_DECIMALS,
    MAX_SECRET_CHARS,
    MAX_WEBHOOK_BODY_BYTES,
    SYMBOL_PATTERN,
    as_utc,
    canonical_quantity,
    canonical_symbol,
)

KNOWN_FIELDS = ("action", "symbol", "quantity", "order_type", "timestamp", "secret")
REAL_SYMBOLS = (
    "BTCUSDT",
    "ETHUSDT",
    "ES",
    "MES",
    "EURUSD",
    "AAPL",
    "ES1!",
    "BINANCE:BTCUSDT",
    "EUR/USD",
    "BRK.B",
    "NQ_F",
    "CL-2026",
)
_JSON_WHITESPACE = " \t\n\r"


@attrs.frozen
class RawJson:
    """A value that ``to_json`` writes verbatim (it need not be valid JSON)."""

    text: str


def to_json(payload: Mapping[str, Any], *, ensure_ascii: bool = True) -> bytes:
    """Compact JSON for a payload dict; ``Decimal`` as its exact ``str``, ``RawJson`` verbatim."""
    return _dump(payload, ensure_ascii).encode("utf-8", "surrogatepass")


def _dump(value: object, ensure_ascii: bool) -> str:
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        members = (
            f"{_dump(str(k), ensure_ascii)}:{_dump(v, ensure_ascii)}" for k, v in value.items()
        )
        return "{" + ",".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_dump(v, ensure_ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii)


# --- building blocks ---------------------------------------------------------------------------


def _recased(word: str) -> st.SearchStrategy[str]:
    """``word`` with each letter upper or lower case at random."""
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda flips: "".join(
            c.upper() if f else c.lower() for c, f in zip(word, flips, strict=True)
        )
    )


def _padded(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pad = st.text(alphabet=" \t", max_size=2)
    return st.tuples(pad, text, pad).map("".join)


def symbols() -> st.SearchStrategy[str]:
    """Canonical symbols: realistic tickers and anything the symbol pattern admits."""
    return st.one_of(st.sampled_from(REAL_SYMBOLS), st.from_regex(SYMBOL_PATTERN, fullmatch=True))


def quantities() -> st.SearchStrategy[Decimal]:
    """Positive quantities up to MAX_QUANTITY with at most MAX_QUANTITY_DECIMALS places."""

    def build(places: int) -> st.SearchStrategy[Decimal]:
        top = int(MAX_QUANTITY) * 10**places
        return st.integers(1, top).map(lambda n: Decimal(n).scaleb(-places))

    return st.integers(0, MAX_QUANTITY_DECIMALS).flatmap(build)


def timestamps(around: datetime = EPOCH, spread_s: int = 300) -> st.SearchStrategy[datetime]:
    """Aware UTC datetimes within ``spread_s`` seconds of ``around``, to the microsecond."""
    base = as_utc(around)
    span = spread_s * 1_000_000
    return st.integers(-span, span).map(lambda us: base + timedelta(microseconds=us))


_OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timedelta(minutes=m))


def _timestamp_text(ts: datetime) -> st.SearchStrategy[str]:
    """Equivalent ISO 8601 spellings of one instant."""
    utc = as_utc(ts)
    naive = utc.replace(tzinfo=None)

    def in_zone(offset: timedelta) -> str:
        return utc.astimezone(timezone(offset)).isoformat()

    spellings = [
        st.just(naive.isoformat() + "Z"),
        st.just(naive.isoformat()),
        st.just(utc.isoformat()),
        st.just(naive.isoformat(sep=" ", timespec="microseconds") + "Z"),
        _OFFSETS.map(in_zone),
    ]
    if naive.microsecond == 0:
        spellings.append(st.just(naive.strftime("%Y%m%dT%H%M%SZ")))
        spellings.append(st.just(naive.isoformat(timespec="milliseconds") + "+00:00"))
    return st.one_of(spellings)


def _secrets() -> st.SearchStrategy[str]:
    urlsafe = st.text(string.ascii_letters + string.digits + "-_", min_size=43, max_size=43)
    unicode = st.text(st.characters(codec="utf-8"), min_size=1, max_size=MAX_SECRET_CHARS)
    return st.one_of(urlsafe, unicode)


_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**18), 10**18), st.text(max_size=20)
)
_EXTRA_KEYS = st.text(max_size=12).filter(lambda k: k not in KNOWN_FIELDS)
_EXTRAS = st.dictionaries(
    _EXTRA_KEYS,
    st.recursive(_JSON_LEAVES, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=3,
)


# --- valid bodies ------------------------------------------------------------------------------


@st.composite
def valid_payloads(
    draw: st.DrawFn, simulation: bool = False, *, around: datetime = EPOCH, spread_s: int = 300
) -> dict[str, Any]:
    """A body (as a dict; encode it with ``to_json``) that parses; see the module docstring."""
    payload: dict[str, Any] = draw(_EXTRAS)
    payload["action"] = draw(_padded(st.sampled_from(list(AlertAction)).flatmap(_recased)))
    payload["symbol"] = draw(_padded(symbols().flatmap(_recased)))
    quantity = draw(quantities())
    integral = quantity == quantity.to_integral_value()
    payload["quantity"] = int(quantity) if integral and draw(st.booleans()) else quantity
    if draw(st.booleans()):
        payload["order_type"] = draw(_padded(st.sampled_from(list(OrderType)).flatmap(_recased)))
    if not simulation or draw(st.booleans()):
        payload["timestamp"] = draw(timestamps(around, spread_s).flatmap(_timestamp_text))
    if not simulation or draw(st.booleans()):
        payload["secret"] = draw(_secrets())
    keys = draw(st.permutations(list(payload)))
    return {key: payload[key] for key in keys}


# --- equivalent encodings ----------------------------------------------------------------------


def _escaped(text: str) -> st.SearchStrategy[str]:
    """JSON string literals for ``text``: raw UTF-8, ``\\u``-escaped, or every char escaped."""

    def escape_all(s: str) -> str:
        out = []
        for unit in s.encode("utf-16-be", "surrogatepass").hex(" ", 2).split():
            out.append("\\u" + unit)
        return '"' + "".join(out) + '"'

    return st.sampled_from(
        [
            json.dumps(text, ensure_ascii=False),
            json.dumps(text, ensure_ascii=True),
            escape_all(text),
        ]
    )


def _quantity_text(quantity: Decimal) -> st.SearchStrategy[str]:
    """Equivalent JSON number spellings: ``1``, ``1.0``, ``1.00``, ``1E0``, ``10e-1``..."""
    plain = canonical_quantity(quantity)
    whole, _, fraction = plain.partition(".")
    digits = (whole + fraction).lstrip("0") or "0"
    exponent = -len(fraction)

    def spelling(form: int, zeros: int, upper: bool) -> str:
        if form == 0:
            return plain
        if form == 1:
            return plain + ("" if fraction else ".") + "0" * max(zeros, 1)
        e = "E" if upper else "e"
        mantissa, exp = digits + "0" * zeros, exponent - zeros
        return f"{mantissa}{e}{'+' if exp >= 0 and upper else ''}{exp}"

    return st.builds(spelling, st.integers(0, 2), st.integers(0, 3), st.booleans())


def _whitespace() -> st.SearchStrategy[str]:
    return st.text(alphabet=_JSON_WHITESPACE, max_size=3)


@st.composite
def encodings_of(draw: st.DrawFn, payload: Mapping[str, Any]) -> bytes:
    """Another byte encoding of the order ``payload`` stands for; see the module docstring."""
    members: dict[str, str] = {}
    for key, value in payload.items():
        if key == "action":
            text = draw(_padded(_recased(value.strip().lower())))
            members[key] = draw(_escaped(text))
        elif key == "symbol":
            text = draw(_padded(_recased(canonical_symbol(value))))
            members[key] = draw(_escaped(text))
        elif key == "order_type":
            text = draw(_padded(_recased(value.strip().lower())))
            members[key] = draw(_escaped(text))
        elif key == "quantity":
            members[key] = draw(_quantity_text(Decimal(value)))
        elif key == "timestamp":
            instant = datetime.fromisoformat(value)
            members[key] = draw(_escaped(draw(_timestamp_text(instant))))
        elif key == "secret":
            members[key] = draw(_escaped(value))
        else:
            members[key] = _dump(value, draw(st.booleans()))
    if "order_type" not in members and draw(st.booleans()):
        members["order_type"] = json.dumps(draw(_padded(_recased("entry"))))
    if draw(st.booleans()):
        members.setdefault("comment", json.dumps(draw(st.text(max_size=10))))
    keys = draw(st.permutations(list(members)))
    ws = [draw(_whitespace()) for _ in range(4 * len(keys) + 2)]
    parts = [
        f"{ws[4 * i]}{json.dumps(key)}{ws[4 * i + 1]}:{ws[4 * i + 2]}{members[key]}{ws[4 * i + 3]}"
        for i, key in enumerate(keys)
    ]
    return (ws[-2] + "{" + ",".join(parts) + "}" + ws[-1]).encode("utf-8")


# --- hostile bodies ----------------------------------------------------------------------------

_NON_FINITE = st.sampled_from(["NaN", "Infinity", "-Infinity"])

_BAD_VALUES: dict[str, st.SearchStrategy[object]] = {
    "action": st.one_of(
        st.sampled_from(
            [None, 1, True, [], {}, "", "long", "buy!", "close", "b u y", "\uff22\uff35\uff39"]
        ),
        st.text(max_size=8).filter(lambda s: s.strip().lower() not in list(AlertAction)),
    ),
    "symbol": st.sampled_from(
        [
            None,
            42,
            True,
            [],
            {},
            "",
            "   ",
            "-ES",
            "BTC USDT",
            "ÄAPL",
            "\ufb01AT",
            "A" * 41,
            "ES\n1",
            "ES;DROP",
            "$SPX",
            "ES\x00",
        ]
    ),
    "quantity": st.one_of(
        st.sampled_from(
            [
                None,
                True,
                False,
                [],
                {},
                [1],
                "1",
                "1.5",
                "NaN",
                "",
                0,
                -1,
                Decimal("0.0"),
                Decimal("-0.5"),
                Decimal("1e-11"),
                Decimal("0.00000000001"),
                Decimal("1.00000000001"),
                MAX_QUANTITY + 1,
                Decimal("1E+10"),
                RawJson("-0"),
                RawJson("1e999999999"),
            ]
        ),
        st.integers(int(MAX_QUANTITY) + 1, 10**60),
    ),
    "order_type": st.sampled_from([None, 1, True, [], {}, "", "market", "limit", "entry exit"]),
    "timestamp": st.sampled_from(
        [
            None,
            0,
            1767623400,
            1.5,
            True,
            [],
            {},
            "",
            "NaN",
            "Infinity",
            "-Infinity",
            "now",
            "2026-13-01T00:00:00Z",
            "2026-01-05T25:00:00Z",
            "2026-01-05",
            "20260105",
            "9999-12-31T23:59:59-01:00",
            "0001-01-01T00:00:00+01:00",
            "2026-01-05T14:30:00+25:00",
            "2026-01-05T14:30:00Z" + " " * 60,
            "\uff12\uff10\uff12\uff16-01-05T14:30:00Z",
            "2026-01-05\u00a014:30:00",
        ]
    ),
    "secret": st.sampled_from(
        [
            None,
            0,
            1.5,
            True,
            [],
            {},
            ["s"],
            {"s": 1},
            "",
            "x" * (MAX_SECRET_CHARS + 1),
            RawJson('"\\ud800"'),
            RawJson('"ab\\udfffcd"'),
        ]
    ),
}


@st.composite
def _wrong_field(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    key = draw(st.sampled_from(sorted(_BAD_VALUES)))
    payload[key] = draw(_BAD_VALUES[key])
    return to_json(payload)


@st.composite
def _missing_field(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    required = ["action", "symbol", "quantity"] + ([] if simulation else ["timestamp", "secret"])
    del payload[draw(st.sampled_from(required))]
    return to_json(payload)


@st.composite
def _non_finite(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    key = draw(st.sampled_from(["quantity", "extra"]))
    constant = draw(_NON_FINITE)
    payload[key] = RawJson(constant) if key == "quantity" else RawJson(f'{{"x":[{constant}]}}')
    return to_json(payload)


@st.composite
def _duplicate_key(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    if draw(st.booleans()):
        body = to_json(payload).decode("utf-8", "surrogatepass")
        key = draw(st.sampled_from(sorted(payload)))
        duplicate = f"{json.dumps(key)}:{_dump(payload[key], True)}"
        return (body[:-1] + "," + duplicate + "}").encode("utf-8", "surrogatepass")
    key = draw(st.text(max_size=5))
    payload["meta"] = RawJson(f'{{"a":{{{json.dumps(key)}:1,{json.dumps(key)}:2}}}}')
    return to_json(payload)


@st.composite
def _deep_nesting(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    deep = st.integers(1500, 6000 if opener == "[" else 2000)  # past the recursion limit
    depth = draw(st.one_of(st.integers(MAX_JSON_DEPTH, MAX_JSON_DEPTH + 5), deep))
    payload["nested"] = RawJson(opener * depth + "1" + closer * depth)
    return to_json(payload)


@st.composite
def _huge_integer(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    digits = "9" * draw(st.integers(65, 5000))
    key = draw(st.sampled_from(["quantity", "big"]))
    payload[key] = RawJson(digits)
    return to_json(payload)


@st.composite
def _oversized(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    body = to_json(payload)
    padding = MAX_WEBHOOK_BODY_BYTES + 1 - len(body) + draw(st.integers(0, 1000))
    if draw(st.booleans()):
        return body + b" " * max(padding, 0)
    payload["note"] = "x" * max(padding, 1)
    return to_json(payload)


@st.composite
def _invalid_utf8(draw: st.DrawFn, simulation: bool) -> bytes:
    payload = draw(valid_payloads(simulation))
    bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"]))
    body = to_json(payload)
    at = body.index(b'"symbol":"') + len(b'"symbol":"')
    return body[:at] + bad + body[at:]


_NOT_JSON = st.sampled_from(
    [
        b"",
        b" ",
        b"{",
        b"}",
        b"{'action': 'buy'}",
        b'{"action":"buy",}',
        b'{"action" "buy"}',
        b"action=buy&symbol=ES",
        b'{"a":1} {"b":2}',
        b'{"a":01}',
        b'{"a":.5}',
        b'{"a":+1}',
        b'\xef\xbb\xbf{"action":"buy"}',
        b'{"a":"\x01"}',
        b'{"a":undefined}',
    ]
)
_NON_OBJECT = st.one_of(
    st.sampled_from([b"[]", b"null", b"true", b"1", b'"buy"', b"1.5"]),
    st.lists(st.integers(), max_size=3).map(lambda v: json.dumps(v).encode()),
)


@st.composite
def _non_object_payload(draw: st.DrawFn, simulation: bool) -> bytes:
    return b"[" + to_json(draw(valid_payloads(simulation))) + b"]"


@st.composite
def _truncated(draw: st.DrawFn, simulation: bool) -> bytes:
    body = to_json(draw(valid_payloads(simulation)))
    return body[: draw(st.integers(0, len(body) - 1))]


def hostile_bodies(simulation: bool = False) -> st.SearchStrategy[bytes]:
    """Bodies the parser must refuse in the given mode; see the module docstring."""
    return st.one_of(
        _wrong_field(simulation),
        _missing_field(simulation),
        _non_finite(simulation),
        _duplicate_key(simulation),
        _deep_nesting(simulation),
        _huge_integer(simulation),
        _oversized(simulation),
        _invalid_utf8(simulation),
        _truncated(simulation),
        _non_object_payload(simulation),
        _NOT_JSON,
        _NON_OBJECT,
    )
