"""Client order ids as each venue accepts them.

The core names a broker order ``{order-history id}-{role}`` (``reversal.client_order_id``):
a UUID and ``close``, ``entry`` or ``exit``, 42 characters. Binance and Bybit take at most 36
(Binance: ``[.A-Z:/a-z0-9_-]``; Bybit: letters, digits, ``-`` and ``_``), Alpaca 128. The venue id
is derived from the core's id alone, so every retry, recovery and host derives the same one and
the venue's own duplicate check backs ours:

* an id the venue accepts as it is stays as it is;
* ``UUID-role`` becomes the UUID's 32 hex digits and one letter for the role (``c`` close,
  ``e`` entry, ``x`` exit): 33 characters, still readable as the order-history id in the
  venue's order list;
* anything else becomes ``t`` and the first digits of its SHA-256 (a collision would take
  2**64 ids of one account).
"""

from __future__ import annotations

import hashlib
import re

_UUID_ROLE = re.compile(
    r"([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})-(\w+)"
)
ROLE_LETTERS = {"close": "c", "entry": "e", "exit": "x"}
VENUE_SAFE = re.compile(r"[A-Za-z0-9_-]+")


def venue_client_id(client_order_id: str, max_length: int) -> str:
    """The id sent to a venue that takes at most ``max_length`` characters of ``VENUE_SAFE``."""
    if len(client_order_id) <= max_length and VENUE_SAFE.fullmatch(client_order_id):
        return client_order_id
    match = _UUID_ROLE.fullmatch(client_order_id)
    if match is not None and max_length >= 33 and match.group(6) in ROLE_LETTERS:
        return "".join(match.groups()[:5]) + ROLE_LETTERS[match.group(6)]
    digest = hashlib.sha256(client_order_id.encode()).hexdigest()
    return "t" + digest[: max_length - 1]
