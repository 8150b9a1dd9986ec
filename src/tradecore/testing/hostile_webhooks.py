"""Hypothesis strategies for hostile webhook bodies, for tradecore's tests and services built
on it (the valid ones are in ``tradecore.testing.valid_webhooks``).

``hostile_bodies(simulation=False) -> SearchStrategy[bytes]``
    Bodies that must be refused with ``PayloadInvalid`` (400): NaN/Infinity, duplicate keys,
    deep nesting, huge integers, booleans or strings as quantity, wrong types and values of
    every known field, a non-object top level, an oversized body, invalid UTF-8, broken JSON
    and missing required fields (``timestamp``/``secret`` only when ``simulation`` is False).
"""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import strategies as st

from tradecore.orders import AlertAction
from tradecore.testing.valid_webhooks import RawJson, json_text, to_json, valid_payloads
from tradecore.webhooks.payload import (
    MAX_JSON_DEPTH,
    MAX_QUANTITY,
    MAX_SECRET_CHARS,
    MAX_WEBHOOK_BODY_BYTES,
)

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
                "1e3",
                "+1.5",
                " 1",
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
        duplicate = f"{json.dumps(key)}:{json_text(payload[key], True)}"
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
