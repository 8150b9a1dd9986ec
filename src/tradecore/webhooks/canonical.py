"""The canonical forms of webhook fields: how a symbol, a quantity and a timestamp are stored,
compared and hashed. Two spellings of one value have one canonical form."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal


def canonical_symbol(symbol: str) -> str:
    """The symbol as stored and compared: surrounding whitespace removed, upper case."""
    return symbol.strip().upper()


def canonical_quantity(quantity: Decimal) -> str:
    """A plain decimal without exponent or trailing zeros: ``1``, ``0.5``, ``100``.

    Exact (no rounding to a context precision). Raises ValueError for NaN or infinity.
    """
    if not quantity.is_finite():
        raise ValueError("quantity must be finite")
    text = format(quantity, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def canonical_timestamp(ts: datetime) -> str:
    """UTC ISO 8601 with a ``Z``: ``2026-01-05T14:30:00Z`` (microseconds only when non-zero).

    A naive datetime is taken as UTC.
    """
    return as_utc(ts).replace(tzinfo=None).isoformat() + "Z"


def as_utc(ts: datetime) -> datetime:
    """``ts`` as an aware UTC datetime; a naive one is UTC already."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def decimal_places(quantity: Decimal) -> int:
    """How many decimal places ``quantity`` needs once trailing zeros are dropped.

    Raises ValueError for NaN or infinity.
    """
    _, digits, exponent = quantity.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError("quantity must be finite")
    significant = len(digits)
    while significant > 1 and digits[significant - 1] == 0:
        significant -= 1
    exponent += len(digits) - significant
    return max(0, -exponent)
