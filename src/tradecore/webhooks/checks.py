"""The checks a parsed webhook request passes: the timestamp window (layer 2), the secret
(layer 3), the replay fingerprint and its lifetime (layer 4), and the account's symbol list.

Everything is a pure function of its arguments: the caller passes ``now`` (from its Clock),
never this module.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Set
from datetime import datetime, timedelta
from decimal import Decimal

from tradecore.orders import AlertAction
from tradecore.webhooks.canonical import (
    as_utc,
    canonical_quantity,
    canonical_symbol,
    canonical_timestamp,
)

FINGERPRINT_HEX_CHARS = 32
_MICROSECOND = timedelta(microseconds=1)
_LONGEST_WINDOW_S = int(timedelta.max.total_seconds())


def fingerprint_source(
    user_id: str,
    action: AlertAction,
    symbol: str,
    quantity: Decimal,
    timestamp: datetime | None,
    secret: str | None,
) -> str:
    """The string the fingerprint hashes: ``user_id:action:symbol:quantity:timestamp:secret``.

    Canonical forms: the action's value, the symbol as stored, the quantity as a plain decimal,
    the timestamp as UTC ISO 8601; a missing timestamp or secret (simulation) is the empty
    string.
    """
    return ":".join(
        (
            user_id,
            AlertAction(action).value,
            canonical_symbol(symbol),
            canonical_quantity(quantity),
            "" if timestamp is None else canonical_timestamp(timestamp),
            "" if secret is None else secret,
        )
    )


def replay_fingerprint(
    user_id: str,
    action: AlertAction,
    symbol: str,
    quantity: Decimal,
    timestamp: datetime | None,
    secret: str | None,
) -> str:
    """The specification's replay fingerprint: SHA-256 hex of ``fingerprint_source``, first 32.

    Every encoding of one order (key order, whitespace, ``1`` or ``1.00``, ``Z`` or an
    equivalent offset, case of action and symbol) gives the same fingerprint; a change to any
    one of the six parts gives another.
    """
    source = fingerprint_source(user_id, action, symbol, quantity, timestamp, secret)
    # surrogatepass: identical to UTF-8 for all real text, and never raises on a lone surrogate
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    return digest[:FINGERPRINT_HEX_CHARS]


def request_age_seconds(now: datetime, ts: datetime) -> float:
    """``now - ts`` in seconds: negative when ``ts`` lies in the future. Naive means UTC."""
    return (as_utc(now) - as_utc(ts)).total_seconds()


def timestamp_within_window(now: datetime, ts: datetime, max_age_s: int) -> bool:
    """Layer 2: ``abs(now - ts) <= max_age_s``, exact to the microsecond. Naive means UTC.

    The absolute value accepts a sender whose clock runs ahead. A negative ``max_age_s``
    admits nothing.
    """
    if max_age_s < 0:
        return False
    if max_age_s >= _LONGEST_WINDOW_S:
        return True
    return abs(as_utc(now) - as_utc(ts)) <= timedelta(seconds=max_age_s)


def replay_ttl_seconds(now: datetime, ts: datetime | None, max_age_s: int) -> int:
    """How long the replay key must live: ``max_age_s + max(0, ceil(ts - now))`` seconds.

    The key outlives the timestamp's own validity: a timestamp in the future stays inside the
    window until ``ts + max_age_s``, so it extends the TTL. With no timestamp (simulation) it
    is ``max_age_s``. Never below one second (a store cannot hold a key for zero seconds).
    """
    ahead = 0
    if ts is not None:
        ahead_us = (as_utc(ts) - as_utc(now)) // _MICROSECOND
        ahead = max(0, -(-ahead_us // 1_000_000))  # ceiling division, exact
    return max(1, max_age_s + ahead)


def hash_secret(secret: str) -> str:
    """SHA-256 hex of the UTF-8 bytes: how webhook tokens, secrets and API keys are stored.

    Raises UnicodeEncodeError (a ValueError) for a string with a lone surrogate.
    """
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(presented: object, stored_hash: str) -> bool:
    """Layer 3: whether ``presented`` hashes to ``stored_hash``, compared in constant time.

    Anything but a non-empty string (None, a number, a list, "") is a wrong secret; the
    function never raises. Non-ASCII strings are compared as their UTF-8 bytes.
    """
    if not isinstance(presented, str) or not presented or not isinstance(stored_hash, str):
        return False
    try:
        presented_hash = hash_secret(presented).encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(presented_hash, stored_hash.encode("utf-8", "surrogatepass"))


def symbol_allowed(symbol: str, allowed_symbols: Set[str], instruments: Set[str]) -> bool:
    """Whether the account may trade ``symbol``: it is in ``allowed_symbols``, or, when that
    set is empty, in the broker's ``instruments``. Compared in canonical form (case and
    surrounding whitespace do not matter).
    """
    wanted = canonical_symbol(symbol)
    pool = allowed_symbols or instruments
    return wanted in pool or any(canonical_symbol(s) == wanted for s in pool)
