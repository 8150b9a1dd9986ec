"""JSON parameters written by orjson (``postgres/json_values.py``): every value the standard
library's writer stores is stored the same, every value it refuses is refused, and a real
Postgres holds the same ``jsonb`` either way."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tradecore_adapters.postgres import Pool
from tradecore_adapters.postgres.json_values import dumps, jsonb

# What psycopg's default writer (json.dumps) writes: text keys, any integer, finite floats.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@dataclasses.dataclass
class _Point:
    x: int


PAPER_DOCUMENTS = [
    {
        "name": "paper:acct-1:order:0f8e3b1c-entry",
        "body": {
            "client_order_id": "0f8e3b1c-entry",
            "symbol": "BTCUSDT",
            "side": "buy",
            "quantity": "0.01",
            "status": "filled",
            "average_price": "60000",
            "rejection": None,
            "reduce_only": False,
            "polls": 0,
        },
    },
    {"name": "paper:acct-1", "body": {"cash": "99400.00", "holdings": {}, "orders": {}}},
]


@given(json_values)
def test_a_value_json_writes_is_written_as_the_same_value(value: Any) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize(
    "value",
    [
        Decimal("1.5"),
        datetime(2026, 11, 27, tzinfo=UTC),
        _Point(1),
        {1, 2},
        object(),
        {"nested": [Decimal(1)]},
    ],
    ids=["decimal", "datetime", "dataclass", "set", "object", "nested-decimal"],
)
def test_a_value_json_refuses_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(value)
    with pytest.raises(TypeError):
        dumps(value)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "value",
    [
        PAPER_DOCUMENTS,
        {"prix": "1.5 €", "ordre": "n°7 — 買い", "escaped": 'quote " and \\ and \n'},
        {"big": 10**30, "small": -(2**63), "float": 0.1, "exp": 1e16, "nothing": None},
        [],
        {},
    ],
    ids=["paper-documents", "non-ascii", "numbers", "empty-list", "empty-object"],
)
async def test_postgres_stores_the_same_jsonb_as_psycopgs_own_writer(
    pg_pool: Pool, value: Any
) -> None:
    async with pg_pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT %s::jsonb = %s::jsonb, %s::jsonb::text",
            (jsonb(value), Jsonb(value), jsonb(value)),
        )
        same, stored = await cursor.fetchone() or (None, None)
    assert same is True
    assert json.loads(stored) == json.loads(json.dumps(value))
