"""The rules of the trading-account fields a user sets: name, broker, testnet, webhook request
age, allowed symbols, symbol aliases and broker credentials, and the shape of an account id.

Pure functions of their arguments. A malformed value raises ``InvalidField``, whose message
names the rule and is safe to show: it never repeats the value (a credential may be in it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import attrs

from tradecore.instruments import resolve_symbol
from tradecore.webhooks.canonical import canonical_symbol
from tradecore.webhooks.payload import SYMBOL_PATTERN

MAX_NAME_CHARS = 100
MAX_BROKER_CHARS = 32
MAX_ID_CHARS = 64
MAX_CREDENTIAL_FIELDS = 20
MAX_CREDENTIAL_VALUE_CHARS = 4096
MAX_CREDENTIALS_BYTES = 16 * 1024
CREDENTIAL_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
DEFAULT_BROKER = "paper"
BROKER_UNSUPPORTED = "broker is not supported"


class InvalidField(ValueError):
    """A field is malformed; the message names the rule, never the value."""


def _invalid(reason: str) -> NoReturn:
    raise InvalidField(reason)


@attrs.frozen
class AccountRules:
    """Bounds of what a user may set: ``max_request_age`` (seconds, the webhook timestamp
    window and replay-key lifetime), the allowed-symbol list, and accounts per user."""

    min_request_age: int = attrs.field(default=5, validator=attrs.validators.gt(0))
    max_request_age: int = attrs.field(default=3600, validator=attrs.validators.gt(0))
    max_allowed_symbols: int = attrs.field(default=500, validator=attrs.validators.gt(0))
    max_accounts: int = attrs.field(default=50, validator=attrs.validators.gt(0))
    max_symbol_aliases: int = attrs.field(default=200, validator=attrs.validators.gt(0))


def account_name(value: object) -> str:
    """The name trimmed: 1 to ``MAX_NAME_CHARS`` printable characters."""
    if isinstance(value, str):
        name = value.strip()
        if 1 <= len(name) <= MAX_NAME_CHARS and name.isprintable():
            return name
    _invalid(f"name must be 1 to {MAX_NAME_CHARS} printable characters")


def broker_name(value: object) -> str:
    """The broker asked for: ``DEFAULT_BROKER`` for None, else a string of 1 to
    ``MAX_BROKER_CHARS`` characters (whether a broker of that name is listed is the caller's
    check; ``BROKER_UNSUPPORTED`` is the message for both)."""
    if value is None:
        return DEFAULT_BROKER
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_BROKER_CHARS:
        _invalid(BROKER_UNSUPPORTED)
    return value


def request_age(value: object, rules: AccountRules) -> int:
    """``max_request_age``: an integer (not a bool) from ``rules.min_request_age`` to
    ``rules.max_request_age`` inclusive."""
    low, high = rules.min_request_age, rules.max_request_age
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _invalid(f"max_request_age must be an integer from {low} to {high} seconds")
    return value


def symbol_list(value: object, rules: AccountRules) -> list[object]:
    """``allowed_symbols`` as sent: a list of at most ``rules.max_allowed_symbols`` items
    (read each with ``allowed_symbols``)."""
    limit = rules.max_allowed_symbols
    if not isinstance(value, list) or len(value) > limit:
        _invalid(f"allowed_symbols must be a list of at most {limit} symbols")
    return value


def allowed_symbols(
    items: list[object], listed: frozenset[str], symbol_map: Mapping[str, str]
) -> frozenset[str]:
    """The venue ids of ``items`` (each a symbol by the webhook's rules, resolved as a webhook
    symbol is: ``tradecore.instruments.resolve_symbol`` with the account's ``symbol_map``),
    each one of ``listed`` (the broker's); empty means every symbol. Checked item by item."""
    wanted: set[str] = set()
    for item in items:
        symbol = _symbol(item, "allowed_symbols holds something that is not a symbol")
        resolved = resolve_symbol(symbol, symbol_map)
        if resolved not in listed:
            _invalid("allowed_symbols holds a symbol the broker does not list")
        wanted.add(resolved)
    return frozenset(wanted)


def symbol_aliases(value: object, listed: frozenset[str], rules: AccountRules) -> dict[str, str]:
    """``symbol_map``: a JSON object of at most ``rules.max_symbol_aliases`` entries from a
    symbol an alert sends (``ES1!``) to one of ``listed`` (the venue's ids); both sides by the
    webhook's symbol rules, stored canonical (upper case)."""
    limit = rules.max_symbol_aliases
    if not isinstance(value, dict) or len(value) > limit:
        _invalid(f"symbol_map must be an object of at most {limit} aliases")
    aliases: dict[str, str] = {}
    for alias, target in value.items():
        key = _symbol(alias, "symbol_map holds an alias that is not a symbol")
        venue_id = _symbol(target, "symbol_map maps to something that is not a symbol")
        if venue_id not in listed:
            _invalid("symbol_map maps to a symbol the broker does not list")
        aliases[key] = venue_id
    return aliases


def use_testnet(value: object) -> bool:
    """``testnet``: a boolean (the venue's test or paper environment when true)."""
    if not isinstance(value, bool):
        _invalid("testnet must be true or false")
    return value


def _symbol(value: object, reason: str) -> str:
    symbol = canonical_symbol(value) if isinstance(value, str) else ""
    if not symbol.isascii() or SYMBOL_PATTERN.fullmatch(symbol) is None:
        _invalid(reason)
    return symbol


def credential_fields(value: object) -> dict[str, str]:
    """A credentials object: at most ``MAX_CREDENTIAL_FIELDS`` fields named like
    ``api_key`` (``CREDENTIAL_FIELD``), string values of valid Unicode text of at most
    ``MAX_CREDENTIAL_VALUE_CHARS`` characters."""
    if not isinstance(value, dict):
        _invalid("credentials must be a JSON object of strings")
    if len(value) > MAX_CREDENTIAL_FIELDS:
        _invalid(f"credentials hold at most {MAX_CREDENTIAL_FIELDS} fields")
    fields: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or CREDENTIAL_FIELD.fullmatch(key) is None:
            _invalid("credential field names are 1 to 64 of A-Z, a-z, 0-9, _ . - (letter first)")
        if not isinstance(item, str) or len(item) > MAX_CREDENTIAL_VALUE_CHARS:
            _invalid(f"credential values are strings of at most {MAX_CREDENTIAL_VALUE_CHARS}")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            _invalid("credential values must be valid Unicode text")
        fields[key] = item
    return fields


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        _invalid("credentials repeat a field")
    return document


def _reject_constant(_: str) -> NoReturn:
    _invalid("credentials must be a JSON object of strings")


def unsealed_credential_fields(plaintext: bytes) -> dict[str, str]:
    """The credentials object inside a sealed upload: at most ``MAX_CREDENTIALS_BYTES`` of
    UTF-8 JSON, strictly parsed (no repeated field, no NaN or Infinity), then
    ``credential_fields``."""
    if len(plaintext) > MAX_CREDENTIALS_BYTES:
        _invalid(f"credentials are at most {MAX_CREDENTIALS_BYTES} bytes of JSON")
    try:
        document = json.loads(
            plaintext.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_reject_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        _invalid("encrypted_credentials must hold a UTF-8 JSON object of strings")
    return credential_fields(document)


def encode_credentials(fields: Mapping[str, str]) -> bytes:
    """The stored plaintext of ``fields``: compact UTF-8 JSON with sorted keys."""
    return json.dumps(
        dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def requested_id(value: object) -> str | None:
    """``value`` when it can be an account id (a string of 1 to ``MAX_ID_CHARS``
    characters); None when it names no account."""
    if isinstance(value, str) and 1 <= len(value) <= MAX_ID_CHARS:
        return value
    return None
