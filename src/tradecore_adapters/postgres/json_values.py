"""JSON parameters for Postgres, written by orjson.

psycopg writes a ``Jsonb`` parameter with the standard library's ``json.dumps``. In real mode
every paper order saves its account's documents with its outcome (``order_writes``), so the
worker host writes JSON for every order; orjson writes the same documents about eight times
faster (a paper order's two documents: 9.0 us with ``json``, 1.2 us with orjson; a batch of
twenty orders' 92 us against 12 us; docs/performance.md).

Contract: ``jsonb(value)`` stores what ``Jsonb(value)`` stored, for every value ``json.dumps``
writes, and refuses what it refuses (``TypeError``). Two differences of text are invisible
once stored, since ``jsonb`` keeps the value, not the text: orjson writes no spaces, and
non-ASCII text as UTF-8 instead of ``\\u`` escapes. Values orjson refuses (an integer beyond
64 bits, a ``Decimal``) or would write where ``json.dumps`` refuses (a ``datetime``, a
dataclass: passed through to the fallback) go to ``json.dumps``, which writes or refuses them
as before. One value is written where ``json.dumps`` wrote text Postgres refused: a float NaN
or infinity becomes ``null`` instead of a failed statement.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from psycopg.types.json import Jsonb

_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)


def dumps(value: Any) -> bytes | str:
    """``value`` as JSON text (module doc); raises ``TypeError`` for what JSON cannot hold."""
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value)


def jsonb(value: Any) -> Jsonb:
    """A ``jsonb`` parameter of ``value``, written by ``dumps``."""
    return Jsonb(value, dumps=dumps)
