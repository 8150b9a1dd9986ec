"""Queue payloads as compact JSON: OrderRequest, OrderResult and FillTask.

Decimals travel as strings (``str(Decimal)``, so ``1.50`` stays ``1.50``), datetimes as ISO
8601 in UTC, enums as their values. Decoding an encoding gives an equal value, and encoding is
deterministic, so re-encoding a decoded value gives the same text: the queue finds a stored
entry again by its text. A naive datetime cannot be encoded (ValueError).

The text is orjson's, which for these payloads (strings, integers, booleans, null; a float
only in an OrderResult's ``retry_after``) is character for character what the standard
library writes with compact separators and ``ensure_ascii=False``, so entries queued by a
process of an earlier version are found by their text too; orjson takes 0.5 us to encode an
OrderRequest where ``json.dumps`` takes 6.4. Only a float may be spelled differently
(``1e-05`` as ``0.00001``), and results are never looked up by their text.

An OrderRequest's ``broker_name``, ``credentials_ref``, ``log_request_id`` and ``reply_to`` are
left out while they are None, so a payload queued before the fields existed decodes (to None)
and re-encodes to its original text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import cattrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override

from tradecore.orders import OrderRequest, OrderResult
from tradecore.ports.messaging import FillTask

T = TypeVar("T")

_converter = cattrs.Converter()


def _unstructure_datetime(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} cannot be encoded")
    return value.astimezone(UTC).isoformat()


def _structure_datetime(value: Any, _: type) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"datetime {value!r} has no offset")
    return parsed.astimezone(UTC)


def _structure_decimal(value: Any, _: type) -> Decimal:
    if not isinstance(value, str):
        raise TypeError(f"a decimal travels as a string, got {type(value).__name__}")
    return Decimal(value)


_converter.register_unstructure_hook(Decimal, str)
_converter.register_structure_hook(Decimal, _structure_decimal)
_converter.register_unstructure_hook(datetime, _unstructure_datetime)
_converter.register_structure_hook(datetime, _structure_datetime)
_converter.register_unstructure_hook(
    OrderRequest,
    make_dict_unstructure_fn(
        OrderRequest,
        _converter,
        broker_name=override(omit_if_default=True),
        credentials_ref=override(omit_if_default=True),
        log_request_id=override(omit_if_default=True),
        reply_to=override(omit_if_default=True),
    ),
)


def _encode(value: object) -> str:
    return orjson.dumps(_converter.unstructure(value)).decode()


def _decode(raw: str | bytes, kind: type[T]) -> T:
    return _converter.structure(orjson.loads(raw), kind)


def encode_request(request: OrderRequest) -> str:
    return _encode(request)


def decode_request(raw: str | bytes) -> OrderRequest:
    """Raises a cattrs error or ValueError on a malformed payload."""
    return _decode(raw, OrderRequest)


def encode_result(result: OrderResult) -> str:
    return _encode(result)


def decode_result(raw: str | bytes) -> OrderResult:
    """Raises a cattrs error or ValueError on a malformed payload."""
    return _decode(raw, OrderResult)


def encode_task(task: FillTask) -> str:
    return _encode(task)


def decode_task(raw: str | bytes) -> FillTask:
    """Raises a cattrs error or ValueError on a malformed payload."""
    return _decode(raw, FillTask)


def task_from_data(data: object) -> FillTask:
    """A FillTask from its already parsed JSON form."""
    return _converter.structure(data, FillTask)
