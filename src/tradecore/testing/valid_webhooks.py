"""Hypothesis strategies for valid webhook bodies, for tradecore's tests and services built
on it (the bodies to refuse are in ``tradecore.testing.hostile_webhooks``).

``valid_payloads(simulation=False, *, around=EPOCH, spread_s=300)``
    Dicts that ``parse_webhook_body`` accepts: every action, case and surrounding whitespace
    varied; TradingView-style symbols; quantities as ``int`` or ``Decimal`` (up to 10 places,
    up to 1e9); timestamps within ``spread_s`` of ``around`` written with ``Z``, an offset or no
    zone; secrets of URL-safe or arbitrary Unicode text; sometimes ``order_type`` and unknown
    fields. With ``simulation=True`` ``timestamp`` and ``secret`` may be absent.

``to_json(payload, *, ensure_ascii=True) -> bytes``
    Encode such a dict (``json.dumps`` cannot write ``Decimal``). A ``RawJson(text)`` value is
    written verbatim, which is how hostile number spellings get into a body. ``json_text``
    writes one value the same way.

``encodings_of(payload) -> SearchStrategy[bytes]``
    Other byte encodings of the same order: key order, whitespace, ``\\u`` escapes, ``1`` vs
    ``1.0`` vs ``1.00`` vs ``1E0`` quantity, ``Z`` vs ``+00:00`` vs an equivalent offset vs a
    naive timestamp, case and padding of action, symbol and order_type, an explicit default
    ``order_type``, an extra unknown field. All of them parse to the same payload and the same
    replay fingerprint.
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
from tradecore.webhooks.canonical import as_utc, canonical_quantity, canonical_symbol
from tradecore.webhooks.payload import (
    MAX_QUANTITY,
    MAX_QUANTITY_DECIMALS,
    MAX_SECRET_CHARS,
    SYMBOL_PATTERN,
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
    return json_text(payload, ensure_ascii).encode("utf-8", "surrogatepass")


def json_text(value: object, ensure_ascii: bool) -> str:
    """``value`` as ``to_json`` writes it, as text."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        members = (
            f"{json_text(str(k), ensure_ascii)}:{json_text(v, ensure_ascii)}"
            for k, v in value.items()
        )
        return "{" + ",".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(json_text(v, ensure_ascii) for v in value) + "]"
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
            members[key] = json_text(value, draw(st.booleans()))
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
