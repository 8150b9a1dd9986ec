"""The webhook body: strict parsing and the rule of each known field.

``parse_webhook_body`` turns untrusted bytes into a ``WebhookPayload`` or a ``PayloadInvalid``
(the 400 ``webhook_payload_invalid`` answer); it never raises. What it refuses:

* a body over ``MAX_WEBHOOK_BODY_BYTES``, not UTF-8, not JSON, or whose top level is not an
  object;
* ``NaN``, ``Infinity`` and ``-Infinity`` anywhere, a duplicate key in any object, arrays and
  objects nested deeper than ``MAX_JSON_DEPTH``, an integer of more than ``MAX_INTEGER_DIGITS``
  digits (both fixed here, whatever the interpreter's recursion and digit limits);
* a known field of the wrong type or outside its rule (see the hooks below); ``timestamp`` or
  ``secret`` missing from a real (non-simulation) order.

Unknown fields are ignored and never applied. Floats are read as ``Decimal``, so ``0.1`` stays
exact; accepted fields come out in their canonical form (``tradecore.webhooks.canonical``).
No message ever repeats a value from the body: field names and rules only, so neither the
secret nor anything pasted into another field can leak into a response or the audit log.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from datetime import date, datetime
from decimal import Decimal
from typing import Any, NoReturn

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

from tradecore.orders import AlertAction, OrderType
from tradecore.webhooks.canonical import as_utc, canonical_quantity, decimal_places

MAX_WEBHOOK_BODY_BYTES = 16 * 1024
MAX_QUANTITY = Decimal("1e9")
MAX_QUANTITY_DECIMALS = 10
MAX_SECRET_CHARS = 256
MAX_TIMESTAMP_CHARS = 64
MAX_JSON_DEPTH = 32
MAX_INTEGER_DIGITS = 64

# TradingView tickers: ES1!, BINANCE:BTCUSDT, EUR/USD, BRK.B. Matched after strip + upper.
QUOTED_QUANTITY = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?")
"""A quantity sent as a string (a quoted TradingView placeholder, ``"0.5"``): a plain decimal,
ASCII digits only, no sign, no exponent, no blanks. It is the same number as ``0.5``."""
SYMBOL_PATTERN = re.compile(r"[A-Z0-9][A-Z0-9._\-/:!]{0,39}")


@attrs.frozen
class WebhookPayload:
    """A webhook order that passed the strict parse, with its fields in canonical form.

    ``symbol`` is stripped and upper-cased; ``quantity`` carries no exponent and no trailing
    zeros; ``timestamp`` is timezone-aware UTC. ``timestamp`` and ``secret`` are None only in
    simulation, where the body may omit them.
    """

    action: AlertAction
    symbol: str
    quantity: Decimal
    order_type: OrderType = OrderType.ENTRY
    timestamp: datetime | None = None
    secret: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class PayloadInvalid:
    """Why a body was refused: ``reason`` is one line, ``errors`` one message per fault.

    Messages name fields (``@ $.quantity``) and rules, never values from the body.
    """

    reason: str
    errors: tuple[str, ...]

    @classmethod
    def of(cls, errors: list[str] | tuple[str, ...]) -> PayloadInvalid:
        return cls(reason="Invalid webhook payload: " + "; ".join(errors), errors=tuple(errors))


def parse_webhook_body(body: bytes, *, simulation: bool) -> WebhookPayload | PayloadInvalid:
    """Parse a webhook body strictly; see the module docstring for what is refused.

    In simulation ``timestamp`` and ``secret`` may be omitted; when present they must still be
    well-typed.
    """
    if len(body) > MAX_WEBHOOK_BODY_BYTES:
        return PayloadInvalid.of([f"body larger than {MAX_WEBHOOK_BODY_BYTES} bytes"])
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return PayloadInvalid.of(["body is not UTF-8"])
    try:
        document = _DECODER.decode(text)
    except _StrictJsonError as e:
        return PayloadInvalid.of([str(e)])
    except json.JSONDecodeError as e:
        return PayloadInvalid.of(
            [f"body is not JSON ({e.msg} at line {e.lineno} column {e.colno})"]
        )
    except RecursionError:
        return PayloadInvalid.of([_TOO_DEEP])
    if not isinstance(document, dict):
        return PayloadInvalid.of(["body must be a JSON object"])
    if _depth(document) > MAX_JSON_DEPTH:
        return PayloadInvalid.of([_TOO_DEEP])
    return _structure(document, simulation)


def _structure(document: dict[str, Any], simulation: bool) -> WebhookPayload | PayloadInvalid:
    valid = _structure_valid(document, simulation)
    if valid is not None:
        return valid
    errors: list[str] = []
    payload: WebhookPayload | None = None
    try:
        payload = _converter.structure(document, WebhookPayload)
    except cattrs.ClassValidationError as e:
        errors.extend(cattrs.transform_error(e, format_exception=_describe))
    if not simulation:
        errors.extend(
            f"required field missing @ $.{name}"
            for name in _REAL_ORDER_FIELDS
            if name not in document
        )
    if errors or payload is None:
        return PayloadInvalid.of([_with_alias_hint(error, document) for error in errors])
    return payload


FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "symbol": ("ticker", "instrument", "pair", "market"),
    "action": ("side", "order_action", "direction"),
    "quantity": ("qty", "size", "amount", "contracts"),
}
"""Names other platforms use for our fields. A body that sends one instead of ours is told
which field was expected; only these fixed names are ever repeated, never a value."""


def _with_alias_hint(error: str, document: dict[str, Any]) -> str:
    """``error``, naming the alias the body used when a required field is missing."""
    for field, aliases in FIELD_ALIASES.items():
        if error == f"required field missing @ $.{field}":
            used = [alias for alias in aliases if alias in document]
            if used:
                return f"{error} (the body names '{used[0]}': send it as '{field}')"
    return error


def _structure_valid(document: dict[str, Any], simulation: bool) -> WebhookPayload | None:
    """The payload when every rule holds, else None (``_structure`` then lets cattrs name
    every fault). The same field hooks as the converter's, called directly: the common case,
    a valid body, costs no error bookkeeping."""
    if not all(name in document for name in _REQUIRED_FIELDS):
        return None
    if not simulation and not all(name in document for name in _REAL_ORDER_FIELDS):
        return None
    try:
        fields: dict[str, Any] = {
            name: hook(document[name], None) for name, hook in _HOOKS if name in document
        }
        return WebhookPayload(**fields)
    except (_FieldError, TypeError):
        return None


class _StrictJsonError(Exception):
    """JSON that the stdlib accepts and this parser does not."""


class _FieldError(ValueError):
    """A known field broke its rule; the message states the rule, never the value."""


_TOO_DEEP = f"JSON nested deeper than {MAX_JSON_DEPTH} levels"


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _StrictJsonError(f"integer with more than {MAX_INTEGER_DIGITS} digits")
    return int(text)


def _depth(document: object) -> int:
    """Nesting depth of arrays and objects (the top-level object is 1), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Iterable[object] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _reject_constant(name: str) -> NoReturn:
    raise _StrictJsonError(f"{name} is not a valid JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            named = f" '{key}'" if key in _FIELDS else ""
            raise _StrictJsonError(f"duplicate key{named} in a JSON object")
        obj[key] = value
    return obj


_DECODER = json.JSONDecoder(
    parse_float=Decimal,
    parse_int=_bounded_int,
    parse_constant=_reject_constant,
    object_pairs_hook=_unique_keys,
)
"""The strict decoder, built once (``json.loads`` with hooks builds one per call)."""


def _describe(exc: BaseException, _type: object) -> str:
    if isinstance(exc, _FieldError):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    return "invalid value"


def _action(value: object, _: object) -> AlertAction:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # the enum's own lookup by value
            return AlertAction(value.strip().lower())
    raise _FieldError("must be one of buy, sell, close_long, close_short")


def _order_type(value: object, _: object) -> OrderType:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return OrderType(value.strip().lower())
    raise _FieldError("must be entry or exit")


def _symbol(value: object, _: object) -> str:
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.isascii():
            symbol = stripped.upper()
            if SYMBOL_PATTERN.fullmatch(symbol):
                return symbol
    raise _FieldError(
        "must be 1 to 40 characters of A-Z, 0-9 and . _ - / : ! starting with a letter or digit"
    )


def _quantity(value: object, _: object) -> Decimal:
    if isinstance(value, str) and QUOTED_QUANTITY.fullmatch(value):
        value = Decimal(value)
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise _FieldError("must be a JSON number, or a string holding a plain decimal")
    quantity = Decimal(value)
    if not quantity.is_finite() or quantity <= 0 or quantity > MAX_QUANTITY:
        raise _FieldError(f"must be a positive number not above {MAX_QUANTITY:f}")
    if decimal_places(quantity) > MAX_QUANTITY_DECIMALS:
        raise _FieldError(f"must have at most {MAX_QUANTITY_DECIMALS} decimal places")
    return Decimal(canonical_quantity(quantity))


def _timestamp(value: object, _: object) -> datetime:
    rule = "must be an ISO 8601 date and time string, with Z or an offset (none means UTC)"
    if not isinstance(value, str) or not value.isascii() or len(value) > MAX_TIMESTAMP_CHARS:
        raise _FieldError(rule)
    try:
        date.fromisoformat(value)
    except ValueError:
        pass
    else:
        raise _FieldError(rule)  # a date without a time of day
    try:
        return as_utc(datetime.fromisoformat(value))
    except (ValueError, OverflowError):
        raise _FieldError(rule) from None


UNUSABLE_SECRET = ""
"""What a secret that cannot be one parses to (a number, a boolean, an object, an empty or
overlong string, text that is not Unicode): it matches no account's secret, so the request is
answered as a wrong secret (401, audited and alerted as a credential attack), not as a
malformed body that would escape the attack count."""


def _secret(value: object, _: object) -> str:
    if isinstance(value, str) and 1 <= len(value) <= MAX_SECRET_CHARS:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate from a \ud800 escape: not text
        else:
            return value
    return UNUSABLE_SECRET


_HOOKS: tuple[tuple[str, Callable[[object, object], object]], ...] = (
    ("action", _action),
    ("symbol", _symbol),
    ("quantity", _quantity),
    ("order_type", _order_type),
    ("timestamp", _timestamp),
    ("secret", _secret),
)
"""Each known field's rule: the converter's struct hooks and ``_structure_valid``'s."""
_FIELDS = tuple(name for name, _ in _HOOKS)
_REQUIRED_FIELDS = ("action", "symbol", "quantity")
_REAL_ORDER_FIELDS = ("timestamp", "secret")

_overrides: dict[str, Any] = {name: override(struct_hook=hook) for name, hook in _HOOKS}
_converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
_converter.register_structure_hook(
    WebhookPayload,
    make_dict_structure_fn(
        WebhookPayload,
        _converter,
        **_overrides,
    ),
)
